"""Input that scales with the hosts (train/data/records.py, train/data/tf_pipeline.py,
train/input.py): each host reads only its share, every example once per epoch, a resume reads no
more than a fresh start, on random-access storage (ArrayRecord, image folders) and on TFRecord
files.

In-process on the tiny fake Fashion-MNIST (512 train examples, batch 32: 16 steps an epoch),
through `train.input.host_batches`, the stream that `python -m train.input` prints.
"""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from train import input as train_input
from train.data import input_order, tf_pipeline, records
from train_fixtures import (NUM_TRAIN, REPO, fashion_mnist_dir, tiny_config,
                            write_image_folder)

STEPS_PER_EPOCH = NUM_TRAIN // 32


@pytest.fixture(scope="module")
def tfrecord_dir(fake_fmnist, tmp_path_factory):
    """The fake Fashion-MNIST prepared as 16 TFRecord files of 32 train examples (the driver
    prepares ArrayRecord)."""
    data_dir = str(tmp_path_factory.mktemp("tfrecord"))
    with fashion_mnist_dir(fake_fmnist.source):
        tfds.builder("fashion_mnist_local", data_dir=data_dir).download_and_prepare(
            file_format="tfrecord", download_config=tfds.download.DownloadConfig(num_shards=16))
    return data_dir


def shown(config, hosts, host, start_step, steps):
    """`({step: ids}, read counts)` of `python -m train.input` for one host."""
    *batches, counts = train_input.host_batches(config, hosts, host, start_step, steps)
    return {batch["step"]: batch["ids"] for batch in batches}, counts


def test_offline_default_is_random_access(fake_fmnist, tfrecord_dir):
    builder = tf_pipeline.get_builder(tiny_config(fake_fmnist))
    assert records.Split(builder, "train").random_access
    assert not records.Split(tf_pipeline.get_builder(
        tiny_config(fake_fmnist, data_dir=tfrecord_dir)), "train").random_access


# What a host reads ahead of what it hands on varies with timing: at most a few chunks.
READ_AHEAD = 6 * records.READ_CHUNK


@pytest.mark.parametrize("start_step", [0, 3 * STEPS_PER_EPOCH - 5])
def test_random_access_hosts_read_their_share_of_the_same_batches(fake_fmnist, start_step):
    config = tiny_config(fake_fmnist)
    steps = 40  # 1,280 examples, 320 a host
    whole, _ = shown(config, 1, 0, start_step, steps)
    parts = [shown(config, 4, host, start_step, steps) for host in range(4)]
    for step, ids in whole.items():
        assert sum((part[step] for part, _ in parts), []) == ids, f"step {step}"
    for _, counts in parts:  # a quarter of the records (each host read them all before)
        assert steps * 8 <= counts["records_read"] <= steps * 8 + READ_AHEAD
        assert counts["records_read"] < 0.5 * steps * 32


def test_random_access_resume_reads_no_more_than_a_fresh_start(fake_fmnist):
    config = tiny_config(fake_fmnist)
    _, resumed = shown(config, 2, 1, 1_000_003, 2)  # 62,500 epochs in
    assert 32 <= resumed["records_read"] <= 32 + READ_AHEAD


@pytest.mark.parametrize("storage", ["array_record", "tfrecord", "folder"])
def test_every_example_once_per_epoch_across_hosts(fake_fmnist, tfrecord_dir, tmp_path, storage):
    if storage == "folder":
        root = str(tmp_path / "images")
        size = write_image_folder(root, np.random.default_rng(0), per_class=(8, 2))["train"]
        config = tiny_config(fake_fmnist, dataset=f"folder:{root}", batch_size=8)
    else:
        data_dir = tfrecord_dir if storage == "tfrecord" else fake_fmnist.data_dir
        size, config = NUM_TRAIN, tiny_config(fake_fmnist, data_dir=data_dir)
    steps = size // config.batch_size  # one epoch
    hosts = 2
    epochs = [[], []]
    for host in range(hosts):
        ids, _ = shown(config, hosts, host, 0, 2 * steps)
        for step, step_ids in ids.items():
            epochs[step // steps].extend(step_ids)
        if storage == "tfrecord":  # each host reads its own consecutive part
            start, stop = records.Split(tf_pipeline.get_builder(config), "train").part(
                hosts, host)
            assert all(start <= i < stop for step_ids in ids.values() for i in step_ids)
    for epoch in epochs:
        assert sorted(epoch) == list(range(size))
    assert epochs[0] != epochs[1]  # each epoch its own order


def test_tfrecord_hosts_read_whole_files(fake_fmnist, tfrecord_dir):
    """A TFRecord file is read from its start, so hosts split at file starts (32 records a file)
    where there are as many files as hosts; random-access storage splits evenly."""
    tfrecord = records.Split(tf_pipeline.get_builder(
        tiny_config(fake_fmnist, data_dir=tfrecord_dir)), "train")
    assert tfrecord.part_bounds(3) == [0, 160, 352, 512]
    assert tfrecord.part_bounds(32) == list(range(0, 513, 16))  # fewer files: record ranges
    array_record = records.Split(tf_pipeline.get_builder(tiny_config(fake_fmnist)), "train")
    assert array_record.part_bounds(3) == [0, 170, 341, 512]


def test_tfrecord_resume_sees_the_batches_of_an_uninterrupted_run(fake_fmnist, tfrecord_dir):
    # Each host's part: 8 files of 32; windows of 2 files (64 records), shuffled on their own.
    config = tiny_config(fake_fmnist, data_dir=tfrecord_dir, shuffle_buffer=64)
    uninterrupted, _ = shown(config, 2, 1, 0, 2 * STEPS_PER_EPOCH + 3)
    _, fresh = shown(config, 2, 1, 0, 2)
    for start in (5, STEPS_PER_EPOCH - 3, STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH + 1):
        resumed, counts = shown(config, 2, 1, start, 2)
        assert resumed == {step: uninterrupted[step] for step in (start, start + 1)}
        # It reads one window from its start, not the epoch up to the position.
        assert counts["records_read"] <= 2 * fresh["records_read"], start


def test_a_host_outside_the_host_count_and_a_split_too_small(fake_fmnist):
    config = tiny_config(fake_fmnist)
    builder = tf_pipeline.get_builder(config)
    split = records.Split(builder, "train[:40]")
    with pytest.raises(ValueError, match=r"Input host 4 does not exist: the hosts are 0 to 3"):
        input_order.check_host_share(split, 32, 4, 4)
    with pytest.raises(ValueError, match=r"does not divide over 3 hosts"):
        input_order.check_host_share(split, 32, 3, 0)
    with pytest.raises(ValueError, match=r"train\[:40\] has 40 examples, fewer than one global "
                                         r"batch of 64 \(16 on each of 4 hosts\)"):
        input_order.check_host_share(split, 64, 4, 3)


def test_input_command(fake_fmnist, tmp_path):
    command = [sys.executable, "-m", "train.input", "--config=configs/quickstart.py",
               f"--config.data_dir={fake_fmnist.data_dir}", "--config.batch_size=32",
               "--num_hosts=2", "--start_step=7", "--steps=2"]
    env = fake_fmnist.env()
    result = subprocess.run([*command, "--host=1"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line[:10] for line in lines[:2]] == ['{"step": 7', '{"step": 8']
    assert '"examples": 32' in lines[2] and '"records_read": ' in lines[2]
    result = subprocess.run([*command, "--host=2"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert "Error: --host=2: the hosts are 0 to 1 (--num_hosts=2)." in result.stderr
    assert "Traceback" not in result.stderr

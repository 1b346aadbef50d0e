"""The input pipeline without TensorFlow (train/data/grain_pipeline.py): Grain over the offline
default's arrays and over TFDS ArrayRecord files, preprocessed in NumPy.

Its contract is the tf.data pipeline's: each host reads only its share of every global batch,
the hosts' shares at a step make up the 1-host batch, every example once per epoch, a start at
any step equal to the same step of an uninterrupted stream, the eval split once across the
hosts. Its preprocessing equals TensorFlow's where it is deterministic (decoding, resizing,
evaluation). The last tests train with TensorFlow unimportable. TensorFlow is used here only to
compare with; those tests skip themselves in CI's environment without it.
"""

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from train.data import grain_pipeline
from train_fixtures import (NUM_TEST, NUM_TRAIN, REPO, WITHOUT_TENSORFLOW, fashion_mnist_dir, flags,
                            tiny_config)

HAVE_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
needs_tensorflow = pytest.mark.skipif(not HAVE_TENSORFLOW, reason="compares with TensorFlow")
BATCH = 32  # tiny_config's global batch: 16 steps an epoch of the 512 fake examples


@pytest.fixture(scope="module")
def fake(fake_fmnist):
    """The fake Fashion-MNIST's files as the offline default's source for the module."""
    with fashion_mnist_dir(fake_fmnist.source):
        yield fake_fmnist


def ids_of(config, hosts, host, start_step, steps, source=None):
    source = source or grain_pipeline.open_split(config, "train_split")
    batches = grain_pipeline.train_batches(source, config, start_step, hosts, host)
    return [batch["id"].tolist() for _, batch in zip(range(steps), batches)]


def image_bytes(image, kind):
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, kind)
    return buffer.getvalue()


# --- Preprocessing: NumPy against TensorFlow.


@needs_tensorflow
@pytest.mark.parametrize("size", [(28, 28), (32, 32), (224, 224), (20, 70), (10, 5)])
def test_resize_is_tensorflows_bilinear_resize(size):
    from keras_vit.preprocessing import resize

    image = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    # float32 rounding: 2e-3 of 255 levels is 8e-6 relative.
    np.testing.assert_allclose(grain_pipeline.resize(image, size), resize(image, size).numpy(),
                               atol=2e-3)
    batch = np.stack([image, image[::-1]])
    np.testing.assert_allclose(grain_pipeline.resize(batch, size)[1],
                               grain_pipeline.resize(image[::-1], size), atol=1e-4)


@needs_tensorflow
@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
def test_png_decodes_as_tensorflow_decodes_it(mode):
    import tensorflow as tf
    from PIL import Image

    from keras_vit.preprocessing import decode_image
    from train.data import tf_pipeline

    image = np.random.default_rng(1).integers(0, 256, (19, 23, 3), dtype=np.uint8)
    encoded = image_bytes(np.asarray(Image.fromarray(image).convert(mode)), "PNG")
    np.testing.assert_array_equal(grain_pipeline.decode(encoded),
                                  decode_image(tf.constant(encoded)).numpy())
    np.testing.assert_allclose(grain_pipeline.preprocess_eval([encoded], 32)[0],
                               tf_pipeline.preprocess_eval(tf.constant(encoded), 32).numpy(),
                               atol=1e-5)


def test_bytes_that_are_no_image_name_their_record():
    with pytest.raises(ValueError, match=r"Record 17 is not a readable image"):
        grain_pipeline.preprocess_eval([b"not an image"], 32, records=[17])


def test_augmentation_is_a_function_of_seed_and_position(fake):
    config = tiny_config(fake, crop_min_area=0.3, flip=True, image_size=28)
    image = np.random.default_rng(2).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    encoded = image_bytes(image, "PNG")
    first = grain_pipeline.preprocess_train([encoded] * 8, range(100, 108), config)
    again = grain_pipeline.preprocess_train([encoded] * 8, range(100, 108), config)
    np.testing.assert_array_equal(first, again)
    assert first.shape == (8, 28, 28, 3) and first.dtype == np.float32
    assert -1.0 <= first.min() and first.max() <= 1.0
    assert len({item.tobytes() for item in first}) == 8  # another crop at each position
    other_seed = grain_pipeline.preprocess_train([encoded] * 8, range(100, 108),
                                              tiny_config(fake, crop_min_area=0.3, flip=True,
                                                          image_size=28, seed=1))
    assert not np.array_equal(first, other_seed)


@needs_tensorflow
@pytest.mark.parametrize("start_step", [0, 3 * NUM_TRAIN // BATCH + 5])
def test_both_pipelines_read_the_same_examples_cropped_and_flipped_alike(fake, start_step):
    """One stream per seed: at step 0 and deep in the fourth epoch, host 1 of 2 gets the same
    records from Grain as from tf.data, the same labels, and the same crops and flips (the
    images equal to the bilinear resizes' float rounding)."""
    from train import input as inspector
    from train.data import tf_pipeline
    config = tiny_config(fake, crop_min_area=0.3, flip=True)
    source = grain_pipeline.open_split(config, "train_split")
    grain_batches = grain_pipeline.train_batches(source, config, start_step, 2, 1)
    tf_batches = tf_pipeline.process_input(config, 2, 1).train(start_step)
    tf_ids, _ = inspector._tf_data_ids(config, 2, 1, start_step, None)
    for step, grain_batch, tf_batch, ids in zip(range(3), grain_batches, tf_batches, tf_ids):
        assert grain_batch["id"].tolist() == ids.tolist(), step
        np.testing.assert_array_equal(grain_batch["label"], tf_batch["label"])
        np.testing.assert_allclose(grain_batch["image"], tf_batch["image"], atol=1e-4,
                                   err_msg=f"step {start_step + step}")


# --- The stream across hosts.


@pytest.mark.parametrize("start_step", [0, 3 * NUM_TRAIN // BATCH - 5])
def test_the_hosts_shares_make_up_the_one_host_batches(fake, start_step):
    config = tiny_config(fake)
    whole = ids_of(config, 1, 0, start_step, 10)
    for hosts in (2, 4):
        parts = [ids_of(config, hosts, host, start_step, 10) for host in range(hosts)]
        for step, ids in enumerate(whole):
            assert sum((part[step] for part in parts), []) == ids, (hosts, step)


def test_every_example_once_an_epoch_and_a_new_order_the_next(fake):
    config = tiny_config(fake)
    steps = NUM_TRAIN // BATCH
    ids = ids_of(config, 1, 0, 0, 2 * steps)
    first, second = sum(ids[:steps], []), sum(ids[steps:], [])
    assert sorted(first) == sorted(second) == list(range(NUM_TRAIN))
    assert first != second


def test_a_start_at_any_step_continues_the_same_stream(fake):
    config = tiny_config(fake, crop_min_area=0.5, flip=True)
    source = grain_pipeline.open_split(config, "train_split")
    full = list(zip(range(30), grain_pipeline.train_batches(source, config, 0, 2, 1)))
    resumed = grain_pipeline.train_batches(source, config, 21, 2, 1)
    for (step, expected), (_, batch) in zip(full[21:], zip(range(9), resumed)):
        for name in ("image", "label", "id"):
            np.testing.assert_array_equal(batch[name], expected[name], err_msg=f"{step} {name}")


def test_worker_processes_make_the_same_batches(fake):
    """config.input_workers: the batches made in 2 processes (Grain's mp_prefetch) are the ones
    made in threads, in the same order."""
    from absl import flags as absl_flags
    if not absl_flags.FLAGS.is_parsed():  # Grain reads its flags in the worker processes
        absl_flags.FLAGS.mark_as_parsed()
    config = tiny_config(fake, crop_min_area=0.5, flip=True)
    source = grain_pipeline.open_split(config, "train_split")
    threads = grain_pipeline.train_batches(source, config, 5, 2, 1)
    processes = iter(grain_pipeline.train_batches(source, config, 5, 2, 1, workers=2))
    try:
        for (_, expected), batch in zip(zip(range(6), threads), processes):
            for name in ("image", "label", "id"):
                np.testing.assert_array_equal(batch[name], expected[name])
    finally:
        processes.close()


def test_a_host_reads_only_its_share(fake):
    config = tiny_config(fake)
    for hosts in (1, 4):
        source = grain_pipeline.Counted(grain_pipeline.open_split(config, "train_split"))
        batches = grain_pipeline.train_batches(source, config, 0, hosts, hosts - 1, threads=2)
        for _, _ in zip(range(20), batches):
            pass
        share = BATCH // hosts
        # 20 batches, and what the 2 threads read ahead (a few batches); with 4 hosts a quarter.
        assert 20 * share <= source.records_read <= 26 * share, (hosts, source.records_read)


def test_evaluation_counts_every_example_once_across_hosts(fake):
    config = tiny_config(fake, eval_batch_size=24)
    source = grain_pipeline.open_split(config, "eval_split")
    seen, steps = [], set()
    for host in range(3):
        batches = list(grain_pipeline.eval_batches(source, config, 3, host))
        steps.add(len(batches))
        for batch in batches:
            assert batch["image"].shape == (8, 28, 28, 3)
            real = batch["mask"] == 1
            seen += batch["id"][real].tolist()
            assert (batch["id"][~real] == -1).all() and (batch["image"][~real] == 0).all()
    assert len(steps) == 1  # every host the same number of batches
    assert sorted(seen) == list(range(NUM_TEST))


def test_array_record_files_read_as_the_tf_data_pipeline_numbers_them(fake):
    """A TFDS dataset prepared as ArrayRecord (here the fake prepared by the fixture): the same
    record numbers and labels as train.data.records on tf.data."""
    if not HAVE_TENSORFLOW:
        pytest.skip("TFDS prepares the fake dataset with TensorFlow")
    import tensorflow_datasets as tfds
    config = tiny_config(fake)
    from train.data.sources import tfds_catalog
    source = tfds_catalog.ArrayRecords(
        tfds.builder("fashion_mnist_local", data_dir=config.data_dir), "train")
    assert len(source) == NUM_TRAIN and source.class_names[0] == "T-shirt/top"
    image, label, record = source[37]
    assert record == 37 and isinstance(image, bytes)
    from train.data import tf_pipeline, records
    split = records.Split(tf_pipeline.get_builder(config), "train")
    expected = next(split.read_range(37, 38).as_numpy_iterator())
    assert (expected["id"], expected["label"]) == (37, label)
    assert expected["image"] == image


def test_bad_hosts_and_small_splits_are_one_line_errors(fake):
    config = tiny_config(fake)
    source = grain_pipeline.open_split(config, "train_split")
    with pytest.raises(ValueError, match="hosts are 0 to 3"):
        grain_pipeline.train_batches(source, config, 0, 4, 4)
    with pytest.raises(ValueError, match="does not divide over 3 hosts"):
        grain_pipeline.train_batches(source, config, 0, 3, 0)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        grain_pipeline.train_batches(source, tiny_config(fake, batch_size=1024), 0, 1, 0)
    with pytest.raises(ValueError, match=r"config.train_split='nope'.*Unknown split"):
        grain_pipeline.open_split(tiny_config(fake, train_split="nope"), "train_split")


def test_missing_offline_files_say_how_to_install_them(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"apt-get install dataset-fashion-mnist"):
        grain_pipeline.open_split(tiny_config(fake), "train_split")


# --- Which pipeline a run takes.


def test_auto_takes_grain_on_jax_where_it_can_and_keeps_a_saved_runs_choice(fake, tmp_path):
    config = tiny_config(fake)
    assert grain_pipeline.choose(config, "jax") == "grain"
    assert grain_pipeline.choose(config, "jax", saved_choice="grain") == "grain"
    if HAVE_TENSORFLOW:  # (without it, tf.data is an error: the next test)
        assert grain_pipeline.choose(config, "tensorflow") == "tf.data"
        assert grain_pipeline.choose(config, "jax", saved_choice="tf.data") == "tf.data"
        from train.run import run_config

        older = tmp_path / "older_run"  # a run saved before Grain: its config lacks the field
        older.mkdir()
        (older / "config.json").write_text(json.dumps({"seed": 0}))
        assert run_config.saved(str(older))["input_pipeline"] == "tf.data"
        masked = tiny_config(fake, objective="masked_patch_prediction")
        assert grain_pipeline.choose(masked, "jax") == "tf.data"
    unprepared = tiny_config(fake, dataset="mnist", data_dir=str(tmp_path))
    assert "not prepared" in grain_pipeline.unavailable(unprepared, "jax")


def test_a_pipeline_that_cannot_be_used_is_named_with_the_fix(fake, monkeypatch):
    with pytest.raises(ValueError, match=r"'grain' cannot be used: .* JAX engine .*tf.data"):
        grain_pipeline.choose(tiny_config(fake, input_pipeline="grain"), "tensorflow")
    with pytest.raises(ValueError, match=r"'grain' cannot be used: .*masked_patch_prediction"):
        grain_pipeline.choose(tiny_config(fake, input_pipeline="grain",
                                       objective="masked_patch_prediction"), "jax")
    from train.console import cli
    monkeypatch.setattr(cli, "tensorflow_installed", lambda: False)
    with pytest.raises(ValueError, match=r"needs TensorFlow, which is not installed: pip "
                                         r"install tensorflow, or .*input_pipeline=grain"):
        grain_pipeline.choose(tiny_config(fake, input_pipeline="tf.data"), "jax")


# --- Training with no TensorFlow to import
# (train_fixtures.WITHOUT_TENSORFLOW).


@pytest.mark.processes
def test_the_jax_engine_trains_resumes_and_evaluates_without_tensorflow(fake, tmp_path):
    """Grain feeds the JAX engine with TensorFlow unimportable; resumed from its checkpoint of
    step 8, the run ends with the weights it ended with uninterrupted. (And the step compiles
    once: its first call takes the state laid out as it returns it.)"""
    run = dict(total_steps=12, steps_per_loop=4, checkpoint_every_steps=4, eval_every_steps=12,
               crop_min_area=0.5, flip=True, export=True)
    env = dict(fake.env(), KERAS_BACKEND="jax", JAX_LOG_COMPILES="1")

    def train(workdir, **overrides):
        command = [sys.executable, "-c", WITHOUT_TENSORFLOW,
                   *flags(fake, workdir, **{**run, **overrides})]
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stderr

    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    log = train(whole)
    assert "Final (step 12): eval accuracy" in log and "need TensorFlow" in log  # the export
    assert log.count("Finished XLA compilation of jit(_step)") == 1
    shutil.copytree(whole, parts)
    for newer in ("checkpoints/12", "export"):
        shutil.rmtree(os.path.join(parts, newer))
    assert "Resumed from" in train(parts)
    with open(os.path.join(whole, "config.json")) as handle:
        assert json.load(handle)["input_pipeline"] == "grain"
    import keras
    first = keras.saving.load_model(os.path.join(whole, "export", "model.keras"))
    second = keras.saving.load_model(os.path.join(parts, "export", "model.keras"))
    for a, b in zip(first.weights, second.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)

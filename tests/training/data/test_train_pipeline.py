"""tf.data input of the training driver (train/data/tf_pipeline.py, train/data/fashion_mnist.py).

Runs in-process on a tiny fake Fashion-MNIST (tests/train_fixtures.py): preprocessing (eager and
inside tf.data), the padded eval split, the resumable train stream, folder datasets and errors.
"""

import collections
import gzip
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from train.data import fashion_mnist, tf_pipeline
from train_fixtures import (IMAGE_MAGIC, LABEL_MAGIC, NUM_TEST, NUM_TRAIN, REPO, fake_images,
                            idx_bytes, png_bytes as _png, tiny_config, write_fake_fashion_mnist,
                            write_image_folder)


@pytest.fixture(scope="module")
def builder(fake_fmnist):
    return tf_pipeline.get_builder(tiny_config(fake_fmnist))


@pytest.fixture(scope="module")
def noise_png():
    rng = np.random.default_rng(0)
    return _png(rng.integers(0, 256, size=(28, 28, 1), dtype=np.uint8))


# Preprocessing.

def _train(encoded, seed, image_size=24, crop_min_area=0.05, flip=True):
    return tf_pipeline.preprocess_train(tf.constant(encoded), tf.constant(seed, tf.int64),
                                           image_size, crop_min_area, flip)


def test_preprocess_train_shape_dtype_range(noise_png):
    image = _train(noise_png, [0, 7])
    assert image.shape == (24, 24, 3) and image.dtype == tf.float32
    values = image.numpy()
    assert values.min() >= -1.0 and values.max() <= 1.0
    assert values.max() - values.min() > 1.0  # spread over the range, not squashed
    half = tf_pipeline.preprocess_train(tf.constant(noise_png), tf.constant([0, 7], tf.int64),
                                           24, 0.05, True, dtype=tf.bfloat16)
    assert half.dtype == tf.bfloat16


def test_preprocess_train_seeded(noise_png):
    first = _train(noise_png, [3, 11]).numpy()
    np.testing.assert_array_equal(first, _train(noise_png, [3, 11]).numpy())
    others = [_train(noise_png, [3, index]).numpy() for index in range(12, 16)]
    assert all(np.abs(first - other).max() > 0.1 for other in others)


def test_preprocess_grayscale_to_three_channels(noise_png):
    for image in (_train(noise_png, [1, 2]), tf_pipeline.preprocess_eval(noise_png, 28)):
        assert image.shape[-1] == 3
        values = image.numpy()
        np.testing.assert_array_equal(values[..., 0], values[..., 1])
        np.testing.assert_array_equal(values[..., 0], values[..., 2])


def test_preprocess_eval_exact_at_native_size(noise_png):
    pixels = tf.io.decode_png(noise_png).numpy().astype(np.float32)
    image = tf_pipeline.preprocess_eval(tf.constant(noise_png), 28)
    assert image.shape == (28, 28, 3) and image.dtype == tf.float32
    np.testing.assert_allclose(image.numpy()[..., 0], (pixels[..., 0] - 127.5) / 127.5, atol=1e-6)
    resized = tf_pipeline.preprocess_eval(tf.constant(noise_png), 40).numpy()
    assert resized.shape == (40, 40, 3) and resized.min() >= -1 and resized.max() <= 1


def test_preprocess_same_inside_tf_data(noise_png):
    rgb = _png(np.random.default_rng(1).integers(0, 256, size=(20, 30, 3), dtype=np.uint8))
    encoded = [noise_png, rgb]
    seeds = [[5, 0], [5, 1]]
    data = tf.data.Dataset.from_tensor_slices((encoded, tf.constant(seeds, tf.int64)))
    mapped = data.map(lambda image, seed: (
        tf_pipeline.preprocess_train(image, seed, 24, 0.05, True),
        tf_pipeline.preprocess_eval(image, 24)))
    for (train, evaluation), image, seed in zip(mapped, encoded, seeds):
        assert train.shape == (24, 24, 3) and evaluation.shape == (24, 24, 3)
        np.testing.assert_allclose(train.numpy(), _train(image, seed).numpy(), atol=1e-6)
        np.testing.assert_allclose(evaluation.numpy(),
                                   tf_pipeline.preprocess_eval(image, 24).numpy(), atol=1e-6)
    assert mapped.element_spec[0].shape == (24, 24, 3)  # static inside tf.data as well


# Evaluation split.

def _image_keys(images):
    """Hashable keys of [-1, 1] images made from uint8 grayscale at native size."""
    pixels = np.rint(np.asarray(images)[..., 0] * 127.5 + 127.5).astype(np.uint8)
    return [image.tobytes() for image in pixels]


def test_eval_counts_every_example_once(builder, fake_fmnist):
    config = tiny_config(fake_fmnist, eval_batch_size=32)
    dataset = tf_pipeline.eval_dataset_fn(builder, config)(tf.distribute.InputContext())
    assert dataset.element_spec["image"].shape == (32, 28, 28, 3)  # static batches
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == 4  # 100 examples -> 128 with padding
    masks = np.concatenate([batch["mask"] for batch in batches])
    assert masks.shape == (128,) and masks.sum() == NUM_TEST
    assert set(np.unique(masks)) == {0.0, 1.0}
    images = np.concatenate([batch["image"] for batch in batches])
    labels = np.concatenate([batch["label"] for batch in batches])
    real = masks == 1
    assert not images[~real].any()  # padding is blank
    source_images, source_labels = fake_images(NUM_TEST, seed=2)
    expected = collections.Counter(zip((image.tobytes() for image in source_images),
                                       source_labels.tolist()))
    found = collections.Counter(zip(_image_keys(images[real]), labels[real].tolist()))
    assert found == expected


def test_eval_split_over_two_replicas(builder, fake_fmnist):
    config = tiny_config(fake_fmnist, eval_batch_size=32)
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    dataset = tf_pipeline.eval_dataset_fn(builder, config)(context)
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == 8 and all(batch["image"].shape[0] == 16 for batch in batches)
    assert sum(batch["mask"].sum() for batch in batches) == NUM_TEST


def test_get_datasets_one_device(fake_fmnist):
    config = tiny_config(fake_fmnist, eval_batch_size=32)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    data = tf_pipeline.get_datasets(config, strategy)
    assert data.eval_examples == NUM_TEST
    assert sum(float(tf.reduce_sum(batch["mask"])) for batch in data.eval) == NUM_TEST
    batch = next(iter(data.train))
    assert batch["image"].shape == (32, 28, 28, 3) and batch["label"].dtype == tf.int32
    # One CPU replica reads the datasets themselves, not autotuned: a distributed dataset's
    # per-device pipeline, and autotuning, made deleting a consumed iterator wait for up to a
    # minute (see tf_pipeline.WITHOUT_AUTOTUNING).
    for dataset in (data.train, data.eval):
        assert isinstance(dataset, tf.data.Dataset)
        assert dataset.options().autotune.enabled is False


@pytest.mark.parametrize("global_seed", [0, 7])
def test_train_stream_ignores_a_global_seed(fake_fmnist, global_seed):
    """A caller's tf.random.set_seed changes nothing (with 0 it used to fail to build)."""
    config = tiny_config(fake_fmnist)
    builder = tf_pipeline.get_builder(config)

    def first_labels():
        (batch,), _ = _train_batches(builder, config, start_step=0, count=1)
        return batch["label"]

    expected = first_labels()
    tf.random.set_seed(global_seed)
    try:
        np.testing.assert_array_equal(first_labels(), expected)
    finally:
        tf.random.set_seed(None)


def test_get_datasets_several_devices_are_distributed(fake_fmnist):
    config = tiny_config(fake_fmnist, eval_batch_size=32)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    data = tf_pipeline.get_datasets(config, strategy)
    assert isinstance(data.train, tf.distribute.DistributedDataset)
    assert data.train.element_spec["image"].shape == (32, 28, 28, 3)


# Two CPU replicas need a process of their own: the CPU splits only before TensorFlow starts.
TWO_CPU_REPLICAS_READ_A_PIPELINE_EACH = """
import tensorflow as tf
from train.data import tf_pipeline
from train.engines import tf_strategy
tf_strategy.split_cpu(2)
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
contexts = []

def dataset_fn(context):
    contexts.append((context.input_pipeline_id, context.num_input_pipelines))
    return tf.data.Dataset.range(8).shard(context.num_input_pipelines,
                                          context.input_pipeline_id).batch(2)

batch = next(iter(tf_pipeline._distributed(mirrored, dataset_fn)))
print(sorted(contexts), [v.numpy().tolist() for v in mirrored.experimental_local_results(batch)])
"""


def test_two_cpu_replicas_read_a_pipeline_each():
    """Not one pipeline split by tf.distribute's per-device pipelines, which prefetch into device
    memory (CPUs have none) and autotune: deleting the train iterator at the end of a 2-replica
    run waited 18 to 30 s for their autotuning threads."""
    result = subprocess.run([sys.executable, "-c", TWO_CPU_REPLICAS_READ_A_PIPELINE_EACH],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "[(0, 2), (1, 2)] [[0, 2], [1, 3]]"


def test_split_expressions(fake_fmnist):
    """common.py documents train_split/eval_split as TFDS split expressions."""
    config = tiny_config(fake_fmnist, train_split="train[:50%]", eval_split="test[:40]",
                         eval_batch_size=32)
    builder = tf_pipeline.get_builder(config)
    assert builder.info.splits[config.train_split].num_examples == NUM_TRAIN // 2
    data = tf_pipeline.get_datasets(config, tf.distribute.OneDeviceStrategy("/cpu:0"),
                                       builder=builder)
    assert data.eval_examples == 40
    assert sum(float(tf.reduce_sum(batch["mask"])) for batch in data.eval) == 40


# The resumable train stream.

def _train_batches(builder, config, start_step, count, context=None):
    dataset = tf_pipeline.train_dataset_fn(builder, config, start_step=start_step)(
        context or tf.distribute.InputContext())
    return list(dataset.take(count).as_numpy_iterator()), dataset.element_spec


def test_train_stream_resumes_exactly(builder, fake_fmnist):
    config = tiny_config(fake_fmnist)  # batch 32: 16 steps per epoch of 512
    steps_per_epoch = NUM_TRAIN // config.batch_size
    stream, spec = _train_batches(builder, config, 0, 2 * steps_per_epoch + 2)
    assert spec["image"].shape == (32, 28, 28, 3) and spec["label"].shape == (32,)
    for start in (3, steps_per_epoch - 2, steps_per_epoch + 1, 2 * steps_per_epoch - 1):
        resumed, _ = _train_batches(builder, config, start, 3)
        for offset, batch in enumerate(resumed):
            np.testing.assert_array_equal(batch["image"], stream[start + offset]["image"],
                                          err_msg=f"start {start}, batch {offset}")
            np.testing.assert_array_equal(batch["label"], stream[start + offset]["label"])
    # Each epoch holds every example once, in a new order, with new augmentation.
    _, source_labels = fake_images(NUM_TRAIN, seed=1)
    for epoch in range(2):
        labels = np.concatenate([batch["label"] for batch in
                                 stream[epoch * steps_per_epoch:(epoch + 1) * steps_per_epoch]])
        assert sorted(labels.tolist()) == sorted(source_labels.tolist())
    assert any((stream[step]["label"] != stream[step + steps_per_epoch]["label"]).any()
               for step in range(3))
    # The same seed gives the same stream; another seed another one.
    again, _ = _train_batches(builder, config, 0, 2)
    np.testing.assert_array_equal(again[1]["image"], stream[1]["image"])
    other, _ = _train_batches(builder, tiny_config(fake_fmnist, seed=5), 0, 1)
    assert np.abs(other[0]["image"] - stream[0]["image"]).max() > 0.1


def test_train_stream_split_over_replicas(builder, fake_fmnist):
    """Two replicas get the two halves of each global batch of one replica, in order."""
    config = tiny_config(fake_fmnist)
    whole, _ = _train_batches(builder, config, 5, 2)
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    halves, spec = _train_batches(builder, config, 5, 4, context)
    assert spec["image"].shape == (16, 28, 28, 3)
    for step in range(2):
        for key in ("image", "label"):
            np.testing.assert_array_equal(
                np.concatenate([halves[2 * step][key], halves[2 * step + 1][key]]),
                whole[step][key])


def _two_hosts():
    """The input contexts of 2 hosts (input pipelines) with 1 replica each."""
    return [tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=host,
                                       num_replicas_in_sync=2) for host in range(2)]


def test_train_stream_split_over_two_hosts(builder, fake_fmnist):
    """The fake dataset is one file: sharding is by example. Host h gets half h of every
    global batch of the one-pipeline stream, so an epoch across both hosts is the whole split
    once, and the training does not depend on the number of hosts."""
    config = tiny_config(fake_fmnist)  # batch 32: 16 steps per epoch of 512
    steps_per_epoch = NUM_TRAIN // config.batch_size
    for start in (0, 3):
        whole, _ = _train_batches(builder, config, start, steps_per_epoch)
        hosts = [_train_batches(builder, config, start, steps_per_epoch, context)[0]
                 for context in _two_hosts()]
        for step in range(steps_per_epoch):
            for key in ("image", "label"):
                np.testing.assert_array_equal(
                    np.concatenate([hosts[0][step][key], hosts[1][step][key]]),
                    whole[step][key], err_msg=f"start {start}, step {step}")
    # One epoch from step 0, taken together: every training example exactly once.
    config = tiny_config(fake_fmnist, crop_min_area=1.0, flip=False)  # images as stored
    seen = collections.Counter()
    for context in _two_hosts():
        batches, spec = _train_batches(builder, config, 0, steps_per_epoch, context)
        assert spec["image"].shape == (16, 28, 28, 3)
        for batch in batches:
            seen.update(zip(_image_keys(batch["image"]), batch["label"].tolist()))
    source_images, source_labels = fake_images(NUM_TRAIN, seed=1)
    assert seen == collections.Counter(zip((image.tobytes() for image in source_images),
                                           source_labels.tolist()))


def test_eval_split_over_two_hosts_counts_every_example_once(builder, fake_fmnist):
    config = tiny_config(fake_fmnist, eval_batch_size=32)  # 100 examples: 4 global batches
    found, lengths = collections.Counter(), []
    for context in _two_hosts():
        batches = list(tf_pipeline.eval_dataset_fn(builder, config)(
            context).as_numpy_iterator())
        lengths.append(len(batches))
        assert all(batch["image"].shape == (16, 28, 28, 3) for batch in batches)
        for batch in batches:
            real = batch["mask"] == 1
            assert not batch["image"][~real].any()
            found.update(zip(_image_keys(batch["image"][real]), batch["label"][real].tolist()))
    assert lengths == [4, 4]  # in step: both hosts run the same number of eval steps
    source_images, source_labels = fake_images(NUM_TEST, seed=2)
    assert found == collections.Counter(zip((image.tobytes() for image in source_images),
                                            source_labels.tolist()))


# Folder datasets and errors.

def test_folder_dataset_pipeline(tmp_path, fake_fmnist):
    root = str(tmp_path / "images")
    counts = write_image_folder(root, np.random.default_rng(0))
    config = tiny_config(fake_fmnist, dataset=f"folder:{root}", image_size=16, batch_size=6,
                         eval_batch_size=4)
    builder = tf_pipeline.get_builder(config)
    assert builder.info.features["label"].num_classes == 3
    assert builder.info.splits[config.train_split].num_examples == counts["train"]
    data = tf_pipeline.get_datasets(config, tf.distribute.OneDeviceStrategy("/cpu:0"),
                                       builder=builder)
    assert data.eval_examples == counts["test"]
    batch = next(iter(data.train))
    assert batch["image"].shape == (6, 16, 16, 3)
    assert sum(float(tf.reduce_sum(batch["mask"])) for batch in data.eval) == counts["test"]


def test_unknown_dataset_is_a_clear_error(tmp_path, fake_fmnist):
    config = tiny_config(fake_fmnist, dataset="no_such_dataset_xyz",
                         data_dir=str(tmp_path / "tfds"))
    with pytest.raises(ValueError, match="no_such_dataset_xyz"):
        tf_pipeline.get_builder(config)


def test_missing_folder_is_a_clear_error(tmp_path, fake_fmnist):
    missing = str(tmp_path / "nowhere")
    config = tiny_config(fake_fmnist, dataset=f"folder:{missing}")
    with pytest.raises(ValueError, match="nowhere.*not a folder"):
        tf_pipeline.get_builder(config)


def test_missing_fashion_mnist_says_how_to_install(tmp_path, monkeypatch, fake_fmnist):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("FASHION_MNIST_DIR", str(empty))
    config = tiny_config(fake_fmnist, data_dir=str(tmp_path / "tfds"))
    with pytest.raises(FileNotFoundError) as error:
        tf_pipeline.get_builder(config)
    message = str(error.value)
    assert "apt-get install dataset-fashion-mnist" in message
    assert str(empty) in message and "FASHION_MNIST_DIR" in message


def test_read_idx(tmp_path):
    images, labels = fake_images(7, seed=3)
    path = str(tmp_path / "images.gz")
    with gzip.open(path, "wb") as handle:
        handle.write(idx_bytes(images, IMAGE_MAGIC))
    np.testing.assert_array_equal(fashion_mnist.read_idx(path, IMAGE_MAGIC), images)
    with pytest.raises(ValueError, match="magic"):
        fashion_mnist.read_idx(path, LABEL_MAGIC)  # an image file where labels are expected
    with gzip.open(path, "wb") as handle:
        handle.write(idx_bytes(images, IMAGE_MAGIC)[:-100])
    with pytest.raises(ValueError, match="truncated"):
        fashion_mnist.read_idx(path, IMAGE_MAGIC)
    with gzip.open(path, "wb") as handle:
        handle.write(b"\x00\x00")
    with pytest.raises(ValueError, match="not an IDX file"):
        fashion_mnist.read_idx(path, IMAGE_MAGIC)


def test_truncated_fashion_mnist_is_a_clear_error(tmp_path, monkeypatch, fake_fmnist):
    source = write_fake_fashion_mnist(str(tmp_path / "fmnist"), num_train=40, num_test=20)
    path = os.path.join(source, "train-images-idx3-ubyte.gz")
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    with gzip.open(path, "wb") as handle:
        handle.write(data[:len(data) // 2])
    monkeypatch.setenv("FASHION_MNIST_DIR", source)
    config = tiny_config(fake_fmnist, data_dir=str(tmp_path / "tfds"))
    with pytest.raises(ValueError, match="truncated") as error:
        tf_pipeline.get_builder(config)
    assert "train-images-idx3-ubyte.gz" in str(error.value)

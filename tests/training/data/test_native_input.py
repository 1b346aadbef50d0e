"""Native resolution in training (train/data/native_input.py, train/data/tf_native.py): the
native-aspect dataset, the tf.data stream of padded and packed batches (a pure function of
(seed, step), so a resume sees what an uninterrupted run sees), the config's checks, and 20
steps of configs/native_aspect.py on both engines, exported at native resolution (a wide and a
tall image in one request to its SavedModel)."""

import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from train.data import fashion_mnist, native_input, tf_pipeline  # noqa: E402
from train.run import config_checks, objectives  # noqa: E402
from train_fixtures import (NUM_TEST, NUM_TRAIN, REPO, fake_images,  # noqa: E402
                            fashion_mnist_dir, flags, read_metrics, tiny_config)

NATIVE = dict(dataset="fashion_mnist_native", model=dict(patch_size=4, classifier="map",
                                                         class_token=False),
              native_patches=49, native_min_patches=12, pack_sequence_length=98, pack_images=4,
              pack_sequences=12)


@pytest.fixture(scope="module")
def native_builder(fake_fmnist):
    with fashion_mnist_dir(fake_fmnist.source):
        return tf_pipeline.get_builder(tiny_config(fake_fmnist, **NATIVE, native="padded"))


def test_the_native_dataset_holds_each_image_at_its_own_drawn_size(native_builder):
    records = native_builder.as_data_source("train")
    images, labels = fake_images(NUM_TRAIN, seed=1)
    sizes = [fashion_mnist.native_size("train", index) for index in range(40)]
    for index in range(40):
        record = records[index]
        assert record["image"].shape == sizes[index] + (1,)
        np.testing.assert_array_equal(record["image"][..., 0],
                                      fashion_mnist.stretched(images[index], "train", index))
        assert record["label"] == labels[index]
    aspects = [height / width for height, width in sizes]
    assert min(aspects) < 0.6 and max(aspects) > 1.6  # wide and tall, not squares


def test_the_canvas_dataset_holds_each_item_undistorted_at_its_drawn_place(fake_fmnist):
    """`fashion_mnist_canvas`: each record is its `canvas_layout`'s canvas, black but for the
    item, a square of the drawn side that is the 28x28 image resized alike both ways (compared
    with TensorFlow's resize: a stretched item would differ), the same in both pipelines."""
    from train.data import sources

    images, labels = fake_images(NUM_TRAIN, seed=1)
    with fashion_mnist_dir(fake_fmnist.source):
        config = tiny_config(fake_fmnist, **{**NATIVE, "dataset": "fashion_mnist_canvas"},
                             native="padded")
        records = tf_pipeline.get_builder(config).as_data_source("train")
        grain = sources.of(config).grain_split("train")
    layouts = [fashion_mnist.canvas_layout("train", index) for index in range(40)]
    assert layouts == [fashion_mnist.canvas_layout("train", index) for index in range(40)]
    for index, (height, width, top, left, side) in enumerate(layouts):
        canvas = records[index]["image"][..., 0]
        assert canvas.shape == (height, width) and records[index]["label"] == labels[index]
        np.testing.assert_array_equal(grain[index][0][..., 0], canvas)
        item = tf.image.resize(images[index][..., None], (side, side), antialias=True)
        np.testing.assert_allclose(canvas[top:top + side, left:left + side],
                                   item.numpy()[..., 0], atol=1)  # rounding
        canvas[top:top + side, left:left + side] = 0
        assert not canvas.any()  # nothing but the item
    aspects = [height / width for height, width, *_ in layouts]
    assert min(aspects) < 0.6 and max(aspects) > 1.6  # wide and tall frames
    assert len({(top, left) for _, _, top, left, _ in layouts}) > 30  # placed, not centred
    # At a fixed aspect ratio (the study's columns): the same item, on a 6:1 canvas.
    height, width, top, left, side = fashion_mnist.canvas_layout("train", 5, 6.0)
    assert (side, round(height / width)) == (layouts[5][4], 6)
    np.testing.assert_array_equal(
        fashion_mnist.on_canvas(images[5], "train", 5, 6.0)[top:top + side, left:left + side],
        records[5]["image"][layouts[5][2]:layouts[5][2] + side,
                            layouts[5][3]:layouts[5][3] + side, 0])


def _batches(builder, config, start_step, count):
    plan = objectives.make(config, 10).native
    dataset = tf_pipeline.train_dataset_fn(builder, config, start_step=start_step,
                                           native=plan)(tf.distribute.InputContext())
    return list(dataset.take(count).as_numpy_iterator()), plan


def test_packed_batches_resume_exactly_and_hold_the_padded_batches_images(native_builder,
                                                                          fake_fmnist):
    packed_config = tiny_config(fake_fmnist, **NATIVE, native="packed")
    stream, plan = _batches(native_builder, packed_config, 0, 6)
    shapes = plan.train_shapes(packed_config.batch_size)
    assert {name: value.shape for name, value in stream[0].items()} == {
        name: shape for name, (shape, _) in shapes.items()}
    for start in (2, 4):
        resumed, _ = _batches(native_builder, packed_config, start, 2)
        for offset, batch in enumerate(resumed):
            for name, value in batch.items():
                np.testing.assert_array_equal(value, stream[start + offset][name], name)
    # The images of packed step s are those of padded step s, each in one slot or left out.
    padded, _ = _batches(native_builder, tiny_config(fake_fmnist, **NATIVE, native="padded"),
                         0, 6)
    useful, placed = 0, 0
    for packed_batch, padded_batch in zip(stream, padded):
        counts = padded_batch["pixel_attention_mask"].sum(axis=1)
        for row, slot in zip(*np.nonzero(packed_batch["label_weight"])):
            where = packed_batch["segment_ids"][row] == slot + 1
            patches = packed_batch["pixel_values"][row][where]
            match = [index for index in range(len(counts)) if counts[index] == len(patches)
                     and (padded_batch["pixel_values"][index, :counts[index]] == patches).all()]
            assert match, (row, slot)
            assert packed_batch["label"][row, slot] == padded_batch["label"][match[0]]
            rows, columns = packed_batch["spatial_shapes"][row, slot]
            assert (rows, columns) == tuple(padded_batch["spatial_shapes"][match[0]])
            placed += 1
        useful += (packed_batch["segment_ids"] > 0).sum()
    # Budgets drawn from 12 to 49 patches: 12 sequences of 98 hold most of 32 images.
    assert placed >= 0.9 * 6 * packed_config.batch_size
    assert useful / (6 * 12 * 98) > 0.7


def test_sizes_searched_a_chunk_at_a_time_give_each_image_its_own_arrays():
    """tf_native.sized (the budget search over a chunk of images at once, then each image cut)
    gives every image, bit for bit, what tf_native.example gives it alone: over a chunk
    boundary, with drawn and whole budgets and extra items kept."""
    from train.data import tf_native

    plan = native_input.Plan(mode="padded", patch_size=4, max_patches=49, min_patches=12,
                             sequence_length=98, images_per_sequence=4, sequences=12,
                             global_images=32)
    rng = np.random.default_rng(3)
    count = tf_native.SEARCH_CHUNK + 5
    images = [rng.integers(0, 256, (int(rng.integers(3, 90)), int(rng.integers(3, 90)), 3),
                           dtype=np.uint8) for _ in range(count)]
    budgets = rng.integers(plan.min_patches, plan.max_patches + 1, count).astype(np.int32)
    budgets[::7] = -1  # -1: the plan's whole budget (no budget given)

    def pending(index):
        image = tf.numpy_function(lambda i: images[i], [index], tf.uint8, stateful=False)
        image = tf.ensure_shape(image, [None, None, 3])
        budget = tf.gather(budgets, index)
        given = tf.where(budget < 0, plan.max_patches, budget)
        return tf_native.pending(image, index, plan, given, mask=tf.constant(1.0))

    found = list(tf_native.sized(tf.data.Dataset.range(count).map(pending), plan)
                 .as_numpy_iterator())
    assert len(found) == count
    for index, item in enumerate(found):
        budget = None if budgets[index] < 0 else int(budgets[index])
        alone = tf_native.example(tf.constant(images[index]), index, plan, budget)
        assert sorted(item) == sorted([*alone, "mask"]) and item["mask"] == 1.0
        for name, value in alone.items():
            np.testing.assert_array_equal(item[name], value.numpy(), f"{name} of {index}")


def _peak_memory_reset():
    """Resets this process's peak resident memory (Linux's VmHWM); skips where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError as error:
        pytest.skip(f"the peak memory cannot be reset here: {error}")


def _peak_memory():
    """This process's peak resident memory in bytes since it started or was reset."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024  # VmHWM is in kB


def test_a_chunk_of_a_wide_and_a_tall_image_holds_no_padded_pixels():
    """The budget search's chunk holds each image as it is: a 1x12,000 and a 12,000x1 image
    (36 kB each) padded to the largest would be a 12,000x12,000 chunk (864 MB). The chunk has
    no pixel array, the process's peak memory rises by far less than that, and both images get
    what tf_native.example gives each alone."""
    from train.data import tf_native

    plan = native_input.Plan(mode="padded", patch_size=4, max_patches=49, min_patches=49,
                             sequence_length=98, images_per_sequence=4, sequences=12,
                             global_images=32)
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, shape, dtype=np.uint8)
              for shape in [(1, 12_000, 3), (12_000, 1, 3), (30, 40, 3)]]

    def pending_stream(images):
        return tf.data.Dataset.from_generator(
            lambda: iter(images), output_signature=tf.TensorSpec([None, None, 3], tf.uint8)
        ).map(lambda image: tf_native.pending(image, 0, plan))

    spec = tf_native.searched(pending_stream(images), plan).element_spec
    assert all(len(component.shape) <= 2 for component in spec.values()), spec  # [chunk, ...]
    list(tf_native.sized(pending_stream(images[2:]), plan))  # traced and warm: not in the peak
    _peak_memory_reset()
    start = _peak_memory()
    found = list(tf_native.sized(pending_stream(images), plan).as_numpy_iterator())
    rise = _peak_memory() - start
    assert rise < 200 * 2**20, f"peak memory +{rise / 2**20:.0f} MB: the chunk was padded"
    for image, item in zip(images, found, strict=True):
        for name, value in tf_native.example(tf.constant(image), 0, plan).items():
            np.testing.assert_array_equal(item[name], value.numpy(), name)


def test_evaluation_sees_each_image_alone_at_the_whole_budget(native_builder, fake_fmnist):
    config = tiny_config(fake_fmnist, **NATIVE, native="packed")
    plan = objectives.make(config, 10).native
    dataset = tf_pipeline.eval_dataset_fn(native_builder, config, native=plan)(
        tf.distribute.InputContext())
    batches = list(dataset.as_numpy_iterator())
    assert sum(batch["mask"].sum() for batch in batches) == NUM_TEST  # each once
    first = batches[0]
    assert first["pixel_values"].shape == (config.eval_batch_size, 49, 48)
    sizes = [fashion_mnist.native_size("test", index) for index in range(3)]
    for index, (height, width) in enumerate(sizes):
        rows, columns = first["spatial_shapes"][index]
        assert rows * columns <= 49 and first["pixel_attention_mask"][index].sum() == rows * columns
        assert (rows > columns) == (height > width) or abs(height - width) <= 2


@pytest.mark.parametrize("overrides, field, message", [
    (dict(native="packed", model=dict(classifier="token", class_token=True)), "native",
     "can have no prefix tokens"),
    (dict(native="padded", image_size=32, model=dict(variant="R+Ti/16", patch_size=2)),
     "native", "ResNet stem"),
    (dict(native="padded", objective="masked_patch_prediction",
          model=dict(classifier="gap")), "objective", "trains classifiers"),
    (dict(native="padded", cutmix_alpha=1.0), "cutmix_alpha", "cuts no images"),
    (dict(native="padded", native_patches=16, native_min_patches=20), "native_min_patches",
     "is above config.native_patches=16"),
    (dict(native="packed", native_patches=49, pack_sequence_length=30),
     "pack_sequence_length", "is shorter than config.native_patches=49"),
    (dict(native="sideways"), "native", "must be one of"),
])
def test_a_native_config_that_cannot_run_is_refused_naming_the_field(fake_fmnist, overrides,
                                                                      field, message):
    fields = {**NATIVE, **overrides,
              "model": {**NATIVE["model"], **overrides.get("model", {})}}
    config = tiny_config(fake_fmnist, **fields)
    found = [problem for problem in config_checks.problems(config)
             if problem.startswith(f"config.{field}=")]
    assert found and message in found[0], config_checks.problems(config)


def test_a_square_config_has_no_native_plan():
    # (Grain's native batches: tests/training/data/test_grain_native.py.)
    assert native_input.plan(tiny_config(type("Data", (), {"data_dir": "/x"})()), 4, 49) is None


@pytest.mark.processes
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_20_packed_steps_train_and_export_on_both_engines(fake_fmnist, tmp_path, backend):
    workdir = str(tmp_path / "run")
    overrides = {**NATIVE, "model": {**NATIVE["model"], "hidden_size": 16},
                 "total_steps": 20, "steps_per_loop": 10, "checkpoint_every_steps": 10,
                 "eval_every_steps": 20, "export": True}
    command = [sys.executable, "-m", "train.main",
               *flags(fake_fmnist, workdir, "configs/native_aspect.py", **overrides)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=dict(fake_fmnist.env(), KERAS_BACKEND=backend))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "step 20/20" in result.stderr and "eval accuracy" in result.stderr
    export = os.path.join(workdir, "export")
    assert os.path.isfile(os.path.join(export, "model.keras"))
    _serves_a_wide_and_a_tall_image_in_one_request(export, NATIVE["native_patches"])


def _serves_a_wide_and_a_tall_image_in_one_request(export, budget):
    """The run's SavedModel and float32 TFLite file at native resolution: each image at its own
    aspect ratio within the run's budget, with the logits of `NaFlexViT` of its model.keras."""
    import keras

    from ai_edge_litert.interpreter import Interpreter
    from keras_vit import native

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((20, 90, 3),
                                                                         (70, 16, 3))]
    loaded = tf.saved_model.load(os.path.join(export, "saved_model", "1"))
    served = loaded.signatures["serving_default"](
        image_bytes=tf.constant([tf.io.encode_png(image).numpy() for image in images]))
    (wide_rows, wide_columns), (tall_rows, tall_columns) = served["spatial_shapes"].numpy()
    assert wide_columns > 2 * wide_rows and tall_rows > 2 * tall_columns
    arrays = native.prepare(images, patch_size=4, max_num_patches=budget)
    model = keras.models.load_model(os.path.join(export, "model.keras"))
    expected = np.asarray(native.NaFlexViT(model)(arrays))
    tolerance = 1e-5 * np.abs(expected).max()
    np.testing.assert_allclose(served["logits"], expected, atol=tolerance)
    runner = Interpreter(model_path=os.path.join(export, "model_float32.tflite")
                         ).get_signature_runner()
    np.testing.assert_allclose(runner(**arrays)["logits"], expected, atol=tolerance)


def test_grain_reads_the_native_dataset_stretched_as_tfds_does(fake_fmnist):
    """The square layout on JAX reads through Grain: its records are the TFDS dataset's."""
    from train.data.sources import offline

    images, labels = fake_images(NUM_TRAIN, seed=1)
    with fashion_mnist_dir(fake_fmnist.source):
        for split, first in (("train", 0), ("train[10:20]", 10)):
            records = offline.OfflineArrays(split, resample=fashion_mnist.stretched)
            image, label, _ = records[3]
            np.testing.assert_array_equal(
                image[..., 0], fashion_mnist.stretched(images[first + 3], "train", first + 3))
            assert label == labels[first + 3]


@pytest.mark.processes
@pytest.mark.parametrize("backend, where", [("tensorflow", "2 replicas"),
                                            ("jax", "2 devices of the batch axis")])
def test_packed_sequences_that_do_not_divide_over_the_devices_are_refused(fake_fmnist, tmp_path,
                                                                          backend, where):
    overrides = {**NATIVE, "pack_sequences": 11, "native": "packed"}
    command = [sys.executable, "-m", "train.main", "--cpu_devices=2",
               *flags(fake_fmnist, str(tmp_path / "run"), "configs/native_aspect.py",
                      **overrides)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env=dict(fake_fmnist.env(), KERAS_BACKEND=backend))
    assert result.returncode == 1
    assert f"Error: config.pack_sequences=11 is not divisible by the {where}." in result.stderr


@pytest.mark.processes
def test_packed_steps_on_a_sharded_mesh_with_remat_learn_as_on_one_device(fake_fmnist, tmp_path):
    """The JAX engine's packed steps fully sharded (FSDP) over 4 batch x 2 model devices, each
    block computed again in the backward pass, give one device's losses step by step."""
    losses = {}
    for name, extra, overrides in (
            ("one", (), {}),
            ("sharded", ("--cpu_devices=8",), {"fsdp": True, "model_parallel": 2,
                                               "remat": "blocks"})):
        workdir = str(tmp_path / name)
        fields = {**NATIVE, "native": "packed", "model": {**NATIVE["model"], "num_layers": 2},
                  "total_steps": 6, "steps_per_loop": 2, "eval_every_steps": 6,
                  "checkpoint_every_steps": 6, "eval_batch_size": 40, **overrides}
        command = [sys.executable, "-m", "train.main",
                   *flags(fake_fmnist, workdir, "configs/native_aspect.py", **fields), *extra]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                                env=dict(fake_fmnist.env(), KERAS_BACKEND="jax"))
        assert result.returncode == 0, result.stderr[-4000:]
        losses[name] = [record["loss"] for record in read_metrics(workdir) if "loss" in record]
    # The weights moved (the loss changes every loop), so equal losses are equal training.
    assert len(losses["one"]) == 3 and len(set(np.round(losses["one"], 5))) == 3, losses
    np.testing.assert_allclose(losses["sharded"], losses["one"], rtol=1e-4)

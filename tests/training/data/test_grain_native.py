"""Native resolution through the Grain pipeline (train/data/grain_native.py): tf.data's native
batches (train/data/tf_native.py) made in NumPy, without TensorFlow.

One stream per seed: at step 0 and deep in the fourth epoch, host 1 of 2 gets from Grain the
images tf.data gives it, with the same budgets, grids, packing, labels and weights (exactly)
and the same pixels but for float32 rounding (TensorFlow's antialiased resize against two matrix
products); evaluation alike. TensorFlow is used only to compare with: those tests skip
themselves in CI's environment without it. The rest (shapes, budgets, determinism, resume, the
hosts' shares, the JAX engine fed by Grain with TensorFlow unimportable) run without it.
"""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from keras_vit.native import image_size_for_budget
from train.data import grain_pipeline, native_input, stream
from train_fixtures import NUM_TEST, REPO, WITHOUT_TENSORFLOW, fashion_mnist_dir, flags, tiny_config

HAVE_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
needs_tensorflow = pytest.mark.skipif(not HAVE_TENSORFLOW, reason="compares with TensorFlow")

# test_native_input.py's tiny native run: 4-pixel patches, budgets drawn from 12 to 49 patches,
# 12 sequences of 98 patches for a global batch of 32 (16 steps an epoch of 512 images).
NATIVE = dict(dataset="fashion_mnist_native",
              model=dict(patch_size=4, classifier="map", class_token=False),
              native_patches=49, native_min_patches=12, pack_sequence_length=98, pack_images=4,
              pack_sequences=12)
LATER = 3 * 16 + 5  # a step in the fourth epoch
# TensorFlow's antialiased bilinear resize against grain_pipeline.resize(antialias=True), in
# grey levels (of 255): float32 rounding. Measured 0.0105 at worst over 300 random resizes of
# 1 to 400 pixels a side (2-core AMD EPYC, TensorFlow 2.21), 5e-4 on the batches below.
PIXEL_LEVELS = 0.02


@pytest.fixture(scope="module")
def fake(fake_fmnist):
    with fashion_mnist_dir(fake_fmnist.source):
        yield fake_fmnist


def native_config(fake, mode, **overrides):
    return tiny_config(fake, **{**NATIVE, "native": mode, **overrides})


def plan_of(config):
    # The engines' plan (train.run.objectives): the model's 7x7 learned grid at image_size 28.
    return native_input.plan(config, 4, 49)


def grain_train(config, start_step, steps, hosts=1, host=0):
    source = grain_pipeline.open_split(config, "train_split")
    batches = grain_pipeline.train_batches(source, config, start_step, hosts, host,
                                           native=plan_of(config))
    return [batch for _, batch in zip(range(steps), batches)]


def grain_eval(config, hosts, host):
    source = grain_pipeline.open_split(config, "eval_split")
    return list(grain_pipeline.eval_batches(source, config, hosts, host, native=plan_of(config)))


def assert_batches_equal(grain_batch, tf_batch, where):
    """Every array of tf.data's batch in Grain's (which adds `id`): the same dtype and shape,
    equal, the pixels within PIXEL_LEVELS."""
    assert set(grain_batch) - {"id"} == set(tf_batch), where
    for name, expected in tf_batch.items():
        found = grain_batch[name]
        assert (found.dtype, found.shape) == (expected.dtype, expected.shape), (where, name)
        if name == "pixel_values":
            np.testing.assert_allclose(found, expected, rtol=0, atol=PIXEL_LEVELS / 127.5,
                                       err_msg=f"{where} {name}")
        else:
            np.testing.assert_array_equal(found, expected, err_msg=f"{where} {name}")


# --- Against tf.data.


@needs_tensorflow
@pytest.mark.parametrize("size_in, size_out", [((37, 53), (20, 70)), ((97, 14), (44, 8)),
                                               ((14, 20), (64, 28)), ((28, 28), (28, 28)),
                                               ((400, 300), (9, 131))])
def test_the_antialiased_resize_is_tensorflows(size_in, size_out):
    import tensorflow as tf

    image = np.random.default_rng(0).integers(0, 256, size_in + (3,), dtype=np.uint8)
    expected = tf.image.resize(tf.cast(image, tf.float32), size_out, method="bilinear",
                               antialias=True).numpy()
    np.testing.assert_allclose(grain_pipeline.resize(image, size_out, antialias=True),
                               expected, rtol=0, atol=PIXEL_LEVELS)


@needs_tensorflow
@pytest.mark.parametrize("mode", ["padded", "packed"])
@pytest.mark.parametrize("start_step", [0, LATER])
def test_grain_makes_tf_datas_native_batches(fake, mode, start_step):
    """Host 1 of 2, images cropped and flipped: the same records in the same order, budgets,
    grids, masks, segments, coordinates and labels; pixels within PIXEL_LEVELS."""
    from train import input as inspector
    from train.data import tf_pipeline

    config = native_config(fake, mode, crop_min_area=0.5, flip=True)
    tf_batches = tf_pipeline.process_input(config, 2, 1).train(start_step,
                                                               native=plan_of(config))
    grain_batches = grain_train(config, start_step, 2, hosts=2, host=1)
    tf_ids, _ = inspector._tf_data_ids(config, 2, 1, start_step, None)
    padded = grain_train(native_config(fake, "padded", crop_min_area=0.5, flip=True),
                         start_step, 2, hosts=2, host=1)
    for step, grain_batch, tf_batch, ids in zip(range(2), grain_batches, tf_batches, tf_ids):
        where = f"{mode} step {start_step + step}"
        assert_batches_equal(grain_batch, tf_batch, where)
        assert padded[step]["id"].tolist() == ids.tolist(), where
        assert len(set(padded[step]["pixel_attention_mask"].sum(axis=1))) > 5  # drawn budgets


@needs_tensorflow
def test_grain_evaluates_as_tf_data_does(fake):
    """Host 2 of 3, the last batch padded: every image alone at the whole budget."""
    from train.data import tf_pipeline

    config = native_config(fake, "packed", eval_batch_size=24)
    tf_batches = list(tf_pipeline.process_input(config, 3, 2).eval(native=plan_of(config)))
    grain_batches = grain_eval(config, 3, 2)
    assert len(grain_batches) == len(tf_batches) == 5
    for step, (grain_batch, tf_batch) in enumerate(zip(grain_batches, tf_batches)):
        assert_batches_equal(grain_batch, tf_batch, f"eval step {step}")
    assert grain_batches[-1]["mask"].tolist() == [1.0] * 2 + [0.0] * 6


# --- Without TensorFlow.


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_batches_have_the_shapes_the_engine_compiles_for(fake, mode):
    config = native_config(fake, mode)
    plan = plan_of(config)
    for hosts in (1, 2):
        batch = grain_train(config, 0, 1, hosts=hosts, host=hosts - 1)[0]
        shapes = plan.train_shapes(config.batch_size // hosts)
        assert {name: (value.shape, value.dtype.name) for name, value in batch.items()
                if name != "id"} == {name: (shape, dtype) for name, (shape, dtype)
                                     in shapes.items()}
        ids_shape = shapes["label"][0]  # one per image, or one per slot
        assert batch["id"].shape == ids_shape and batch["id"].dtype == np.int64
    evaluation = grain_eval(config, 1, 0)[0]
    assert {name: value.shape for name, value in evaluation.items()} == {
        "pixel_values": (50, 49, 48), "pixel_attention_mask": (50, 49),
        "spatial_shapes": (50, 2), "label": (50,), "mask": (50,), "id": (50,)}


def test_each_image_gets_the_grid_of_its_drawn_budget(fake):
    """Uncropped, an image's grid is the budget search of its stored size within the budget
    `stream.budget_draws` gives its stream position."""
    from train.data import fashion_mnist

    config = native_config(fake, "padded")
    batch = grain_train(config, 2, 1)[0]
    positions = np.arange(2 * 32, 3 * 32)
    budgets = stream.budget_draws(positions, config.seed, 12, 49)
    for index, record in enumerate(batch["id"]):
        size = fashion_mnist.native_size("train", record)
        rows, columns = (side // 4 for side in image_size_for_budget(*size, 4, budgets[index]))
        assert batch["spatial_shapes"][index].tolist() == [rows, columns]
        assert batch["pixel_attention_mask"][index].sum() == rows * columns


def test_budgets_are_uniform_and_a_function_of_seed_and_position():
    budgets = stream.budget_draws(np.arange(38_000), seed=3, low=12, high=49)
    assert budgets.min() == 12 and budgets.max() == 49
    counts = np.bincount(budgets - 12)
    assert counts.min() > 850 and counts.max() < 1150  # 1,000 +- 32 each expected
    positions = np.array([5, 70_000, 3])
    alone = [stream.budget_draws([position], 3, 12, 49)[0] for position in positions]
    assert stream.budget_draws(positions, 3, 12, 49).tolist() == alone
    assert not np.array_equal(budgets[:100], stream.budget_draws(np.arange(100), 4, 12, 49))
    assert (stream.budget_draws(np.arange(10), 3, 49, 49) == 49).all()


def test_the_stream_is_a_function_of_the_seed_and_resumes_at_any_step(fake):
    config = native_config(fake, "packed", crop_min_area=0.5, flip=True)
    full = grain_train(config, 0, 7, hosts=2, host=1)
    resumed = grain_train(config, 5, 2, hosts=2, host=1)
    for step, batch in zip((5, 6), resumed):
        for name, value in batch.items():
            np.testing.assert_array_equal(value, full[step][name], f"step {step} {name}")
    other_seed = grain_train(native_config(fake, "packed", crop_min_area=0.5, flip=True,
                                           seed=1), 0, 1, hosts=2, host=1)[0]
    assert not np.array_equal(other_seed["id"], full[0]["id"])


def test_a_packed_share_holds_its_padded_shares_images(fake):
    """Packing only lays out a step's images: host 1 of 2 packs the images of its padded share
    into its 6 of the 12 sequences, each slot the padded image's patches, grid and label."""
    padded = grain_train(native_config(fake, "padded"), LATER, 1, hosts=2, host=1)[0]
    packed = grain_train(native_config(fake, "packed"), LATER, 1, hosts=2, host=1)[0]
    assert packed["segment_ids"].shape == (6, 98)
    where = {record: index for index, record in enumerate(padded["id"])}
    placed = packed["id"][packed["id"] >= 0]
    assert len(set(placed)) == len(placed) >= 0.8 * 16
    for row, slot in zip(*np.nonzero(packed["id"] >= 0)):
        index = where[packed["id"][row, slot]]
        count = padded["pixel_attention_mask"][index].sum()
        in_slot = packed["segment_ids"][row] == slot + 1
        np.testing.assert_array_equal(packed["pixel_values"][row][in_slot],
                                      padded["pixel_values"][index, :count])
        assert packed["spatial_shapes"][row, slot].tolist() == padded["spatial_shapes"][
            index].tolist()
        assert packed["label"][row, slot] == padded["label"][index]
    assert (packed["label_weight"] == (packed["id"] >= 0)).all()


def test_the_hosts_shares_make_up_the_one_host_batch(fake):
    config = native_config(fake, "padded")
    whole = grain_train(config, 1, 1)[0]
    parts = [grain_train(config, 1, 1, hosts=2, host=host)[0] for host in range(2)]
    for name, value in whole.items():
        np.testing.assert_array_equal(np.concatenate([part[name] for part in parts]), value,
                                      name)


def test_evaluation_counts_every_image_once_across_hosts(fake):
    config = native_config(fake, "padded", eval_batch_size=24)
    seen = []
    for host in range(3):
        for batch in grain_eval(config, 3, host):
            real = batch["mask"] == 1
            seen += batch["id"][real].tolist()
            assert (batch["pixel_attention_mask"][~real] == 0).all()
            assert (batch["pixel_attention_mask"][real].sum(axis=1) > 0).all()
    assert sorted(seen) == list(range(NUM_TEST))


def test_auto_takes_grain_for_native_runs_on_jax(fake):
    config = native_config(fake, "packed")
    assert grain_pipeline.unavailable(config, "jax") == ""
    assert grain_pipeline.choose(config, "jax") == "grain"


def test_packed_sequences_that_do_not_divide_over_the_hosts_are_refused(fake):
    config = native_config(fake, "packed", pack_sequences=9)
    source = grain_pipeline.open_split(config, "train_split")
    with pytest.raises(ValueError, match=r"config.pack_sequences=9 is not divisible by the 2 "
                                         r"hosts"):
        grain_pipeline.train_batches(source, config, 0, 2, 0, native=plan_of(config))


@pytest.mark.processes
def test_the_jax_engine_trains_packed_batches_from_grain_without_tensorflow(fake, tmp_path):
    """test_native_input.py's packed run of configs/native_aspect.py on the JAX engine, fed by
    Grain with TensorFlow unimportable: 4 steps, a checkpoint, an evaluation. The step compiles
    once: Grain's batches have the shapes and dtypes it was compiled for (`batch_shapes`)."""
    overrides = {**NATIVE, "model": {**NATIVE["model"], "hidden_size": 16},
                 "input_pipeline": "grain", "total_steps": 4, "steps_per_loop": 2,
                 "checkpoint_every_steps": 4, "eval_every_steps": 4, "export": False}
    command = [sys.executable, "-c", WITHOUT_TENSORFLOW,
               *flags(fake, str(tmp_path / "run"), "configs/native_aspect.py", **overrides)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env=dict(fake.env(), KERAS_BACKEND="jax", JAX_LOG_COMPILES="1"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "step 4/4" in result.stderr and "eval accuracy" in result.stderr
    assert result.stderr.count("Finished XLA compilation of jit(_step)") == 1

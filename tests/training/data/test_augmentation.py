"""AugReg and DeiT augmentation (train/data/augmentation.py, train/data/randaugment.py,
train/data/mixing.py): each operation against its definition, determinism for a seed, Mixup and
CutMix labels against the pixels mixed, the training stream with them (resume, hosts, static
shapes), the loss of mixed labels, and the config's presets and checks.
"""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from train.data import augmentation, grain_pipeline, tf_pipeline, mixing, randaugment
from train.run import config_checks
from train_fixtures import tiny_config


def _test_image(size=32):
    """A uint8 RGB image with every channel spread over part of the range, and edges."""
    rng = np.random.default_rng(0)
    rows, columns = np.mgrid[0:size, 0:size]
    image = np.stack([rows * 5 + 20, columns * 4 + 40, (rows + columns) * 2 + 10], -1)
    image = image + rng.integers(0, 30, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _op(name, magnitude=10.0, sign=1.0, seed=(1, 2)):
    operation = randaugment._operation(name, magnitude, tf.constant(sign),
                                       tf.constant(seed, tf.int64))
    return lambda image: operation(tf.constant(image)).numpy()


# RandAugment's operations against PIL (whose definitions the reference follows) or by hand.

def test_pixel_operations_match_their_definitions():
    image = _test_image()
    np.testing.assert_array_equal(_op("invert")(image), 255 - image)
    contrasted = _op("auto_contrast")(image).astype(int)
    assert contrasted.min() == 0 and contrasted.max() == 255
    # PIL builds a lookup table with its own rounding: a level at most.
    assert np.abs(contrasted - np.asarray(ImageOps.autocontrast(Image.fromarray(image)))).max() <= 1
    np.testing.assert_array_equal(_op("equalize")(image),
                                  np.asarray(ImageOps.equalize(Image.fromarray(image))))
    # Posterize to int(M/10 * 4) bits, at least 1 (the reference's shift by 8, which
    # TensorFlow clamps to 7) and at most 8 (all: from magnitude 20).
    np.testing.assert_array_equal(_op("posterize", 5.0)(image), image & 0b11000000)
    np.testing.assert_array_equal(_op("posterize", 0.0)(image), image & 0b10000000)
    np.testing.assert_array_equal(
        _op("posterize", 0.0)(image),
        tf.bitwise.left_shift(tf.bitwise.right_shift(image, 8), 8).numpy())  # the reference's
    np.testing.assert_array_equal(_op("posterize", 30.0)(image), image)
    # Solarize above int(M/10 * 256): magnitude 5 inverts the values from 128.
    np.testing.assert_array_equal(_op("solarize", 5.0)(image),
                                  np.where(image < 128, image, 255 - image))
    added = np.minimum(image.astype(int) + 55, 255)
    np.testing.assert_array_equal(_op("solarize_add", 5.0)(image),
                                  np.where(image < 128, added, image))


@pytest.mark.parametrize("name,enhance", [("color", ImageEnhance.Color),
                                          ("brightness", ImageEnhance.Brightness),
                                          ("contrast", ImageEnhance.Contrast)])
def test_blends_match_pil(name, enhance):
    image = _test_image()
    for magnitude in (2.0, 10.0, 20.0):
        factor = magnitude / 10 * 1.8 + 0.1
        expected = np.asarray(enhance(Image.fromarray(image)).enhance(factor)).astype(int)
        # PIL rounds its grayscale and its blend differently: a level of the degenerate
        # image, times what the blend makes of it, and one of the blend.
        tolerance = 1 + abs(1 - factor)
        assert np.abs(_op(name, magnitude)(image).astype(int) - expected).max() <= tolerance


def test_geometric_operations():
    image = _test_image()
    size = image.shape[0]
    # Translation by M/10 * 100/224 of the side, filled with 128 where the image left.
    shift = int(round(10 / 10 * 100 * size / 224))
    moved = _op("translate_x", 10.0, sign=1.0)(image)
    np.testing.assert_array_equal(moved[:, shift:], image[:, :-shift])
    assert (moved[:, :shift] == randaugment.FILL).all()
    moved = _op("translate_y", 10.0, sign=-1.0)(image)
    np.testing.assert_array_equal(moved[:-shift], image[shift:])
    # Rotation by 0 degrees and shear by 0 leave the image; 30 degrees moves most pixels.
    np.testing.assert_array_equal(_op("rotate", 0.0)(image), image)
    np.testing.assert_array_equal(_op("shear_x", 0.0)(image), image)
    rotated = _op("rotate", 10.0)(image)
    assert (rotated != image).mean() > 0.5 and (rotated == randaugment.FILL).any()
    sheared = _op("shear_y", 10.0, sign=-1.0)(image)
    np.testing.assert_array_equal(sheared[:, 0], image[:, 0])  # column 0 does not move
    assert (sheared[:, -1] != image[:, -1]).any()


def test_cutout_and_sharpness():
    image = _test_image(64)
    cut = _op("cutout", 10.0)(image)
    changed = (cut != image).any(-1)
    pad = int(40 * 64 / 224)
    assert (cut[changed] == randaugment.FILL).all()
    assert 0 < changed.sum() <= (2 * pad) ** 2
    sharp = _op("sharpness", 10.0)(image)
    np.testing.assert_array_equal(sharp[0], image[0])  # the border stays
    np.testing.assert_array_equal(_op("sharpness", 5.0)(image), image)  # factor 1: itself
    assert (sharp[1:-1, 1:-1] != image[1:-1, 1:-1]).any()


@pytest.mark.parametrize("magnitude", [0.0, 9.0, 20.0, 25.0, 30.0])
def test_rand_augment_compiles_at_every_magnitude(magnitude):
    """Inside a graph (as tf.data runs it) every operation is built, not only the one drawn."""
    augment = tf.function(lambda image, seed: randaugment.rand_augment(image, seed, 2,
                                                                      magnitude))
    image = tf.constant(_test_image(), tf.float32)
    out = augment(image, tf.constant([1, 3], tf.int64))
    assert out.shape == (32, 32, 3) and 0 <= out.numpy().min() and out.numpy().max() <= 255


def test_rand_augment_is_a_function_of_its_seed():
    image = tf.constant(_test_image(), tf.float32)
    first = randaugment.rand_augment(image, tf.constant([5, 9], tf.int64), 2, 15.0)
    again = randaugment.rand_augment(image, tf.constant([5, 9], tf.int64), 2, 15.0)
    assert first.shape == (32, 32, 3) and first.dtype == tf.float32
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    others = [randaugment.rand_augment(image, tf.constant([5, seed], tf.int64), 2, 15.0).numpy()
              for seed in range(10, 30)]
    changed = [np.abs(other - image.numpy()).max() > 0 for other in others]
    assert sum(changed) >= 15  # a few operations can leave an image (solarize at 15)
    assert len({other.tobytes() for other in others}) >= 15
    assert all(0 <= other.min() and other.max() <= 255 for other in others)


def test_random_erasing():
    image = tf.zeros((40, 40, 3))
    never = randaugment.random_erasing(image, tf.constant([1, 2], tf.int64), 0.0)
    np.testing.assert_array_equal(never.numpy(), image.numpy())
    areas = []
    for seed in range(20):
        erased = randaugment.random_erasing(image, tf.constant([1, seed], tf.int64), 1.0)
        again = randaugment.random_erasing(image, tf.constant([1, seed], tf.int64), 1.0)
        np.testing.assert_array_equal(erased.numpy(), again.numpy())
        box = (erased.numpy() != 0).any(-1)
        rows, columns = np.nonzero(box)
        # One rectangle, filled with noise.
        assert box[rows.min():rows.max() + 1, columns.min():columns.max() + 1].all()
        areas.append(box.mean())
    assert 0.015 <= min(areas) and max(areas) <= 1 / 3 + 0.03


# Mixup and CutMix.

def _mix(augmentation_, labels=(3, 7), seed=(4, 0), size=16):
    """Two constant images (0 and 1) mixed as one pair."""
    params = mixing.mix_params(mixing.pair_seed(seed[0], tf.constant(seed[1], tf.int64)), size,
                               size, augmentation_)
    images = tf.stack([tf.zeros((size, size, 3)), tf.ones((size, size, 3))])
    batch = mixing.mix_pairs({"image": images, "label": tf.constant(labels, tf.int32),
                              "mix_params": tf.stack([params, params])})
    return {name: value.numpy() for name, value in batch.items()}


@pytest.mark.parametrize("fields", [{"mixup_alpha": 0.8}, {"cutmix_alpha": 1.0},
                                    {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}])
def test_mixed_labels_match_the_pixels_mixed(fields):
    chosen = augmentation.Augmentation(**fields)
    cut = 0
    for position in range(0, 40, 2):
        batch = _mix(chosen, seed=(4, position))
        weights, images = batch["mix_weight"], batch["image"]
        np.testing.assert_array_equal(batch["mix_label"], [7, 3])
        # Image 0 (zeros) holds 1 - weight of image 1 (ones), and the reverse.
        assert images[0].mean() == pytest.approx(1 - weights[0], abs=1e-6)
        assert images[1].mean() == pytest.approx(weights[1], abs=1e-6)
        assert weights[0] == weights[1]  # the two images of a pair swap the same region
        assert 0.0 <= weights[0] <= 1.0
        is_cut = set(np.unique(images[0])) <= {0.0, 1.0} and weights[0] < 1.0
        cut += is_cut
        if "cutmix_alpha" not in fields:
            assert weights[0] >= 0.5 and not is_cut  # Mixup keeps the larger share
    if "cutmix_alpha" in fields and "mixup_alpha" in fields:
        assert 3 <= cut <= 17  # about half the pairs cut
    elif "cutmix_alpha" in fields:
        assert cut >= 17


def test_pair_mixing_is_a_function_of_the_seed_and_pair():
    chosen = augmentation.Augmentation(mixup_alpha=0.5, cutmix_alpha=1.0)
    first = _mix(chosen, seed=(4, 10))
    np.testing.assert_array_equal(first["image"], _mix(chosen, seed=(4, 11))["image"])
    others = {_mix(chosen, seed=(4, position))["mix_weight"][0] for position in range(12, 40, 2)}
    assert len(others) > 10
    assert _mix(chosen, seed=(5, 10))["mix_weight"][0] != first["mix_weight"][0]


# The training stream.

RECIPE = {"augment": "medium2", "cutmix_alpha": 1.0, "random_erasing": 0.25}


@pytest.fixture(scope="module")
def builder(fake_fmnist):
    return tf_pipeline.get_builder(tiny_config(fake_fmnist))


def _batches(builder, config, start_step=0, hosts=1, host=0, count=3):
    context = tf.distribute.InputContext(num_input_pipelines=hosts, input_pipeline_id=host,
                                         num_replicas_in_sync=hosts)
    dataset = tf_pipeline.train_dataset_fn(builder, config, start_step)(context)
    return dataset, [{name: value.numpy() for name, value in batch.items()}
                     for batch in dataset.take(count)]


def test_stream_with_augmentation_resumes_and_splits_over_hosts(fake_fmnist, builder):
    config = tiny_config(fake_fmnist, **RECIPE)
    dataset, batches = _batches(builder, config)
    spec = dataset.element_spec
    assert spec["image"].shape == (32, 28, 28, 3) and spec["mix_weight"].shape == (32,)
    assert spec["mix_label"].shape == (32,) and "mix_params" not in spec
    assert any((batch["mix_weight"] < 1).any() for batch in batches)
    # A resumed run: the same batches from step 2 on.
    _, resumed = _batches(builder, config, start_step=2, count=1)
    for name in batches[2]:
        np.testing.assert_array_equal(resumed[0][name], batches[2][name])
    # Two hosts: their halves of every batch are the one host's batch.
    halves = [_batches(builder, config, hosts=2, host=host)[1] for host in (0, 1)]
    for step, batch in enumerate(batches):
        for name in batch:
            np.testing.assert_array_equal(
                np.concatenate([halves[0][step][name], halves[1][step][name]]), batch[name])
    # Without augmentation the images differ, and the batches carry no mixing.
    _, plain = _batches(builder, tiny_config(fake_fmnist), count=1)
    assert set(plain[0]) == {"image", "label"}
    np.testing.assert_array_equal(plain[0]["label"], batches[0]["label"])
    assert np.abs(plain[0]["image"] - batches[0]["image"]).max() > 0.5


def test_odd_batch_per_replica_is_refused(fake_fmnist, builder):
    config = tiny_config(fake_fmnist, mixup_alpha=0.2, batch_size=30)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    with pytest.raises(ValueError, match="even batch per replica, not 15"):
        tf_pipeline.train_dataset_fn(builder, config)(context)
    with pytest.raises(ValueError, match="each replica's batch must be even, not 15"):
        config_checks.check(config, num_replicas=2)


def test_mixed_loss_is_the_cross_entropy_of_mixed_targets(fake_fmnist):
    import keras

    from train.run import objectives

    config = tiny_config(fake_fmnist, label_smoothing=0.1)
    objective = objectives.Classification(config, num_classes=10)
    logits = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    model = lambda images, training: keras.ops.convert_to_tensor(logits)  # noqa: E731
    batch = {"image": np.zeros((4, 2, 2, 3), np.float32), "label": np.array([1, 2, 3, 4]),
             "mix_label": np.array([2, 1, 4, 3]),
             "mix_weight": np.array([0.7, 0.7, 0.25, 0.25], np.float32)}
    losses, _, _ = objective.item_losses(model, batch, training=True)
    one_hot = np.eye(10)
    smooth = lambda labels: one_hot[labels] * 0.9 + 0.01  # noqa: E731
    weight = batch["mix_weight"][:, None]
    targets = weight * smooth(batch["label"]) + (1 - weight) * smooth(batch["mix_label"])
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(losses), -(targets * log_probs).sum(-1), rtol=1e-5)
    plain, _, _ = objective.item_losses(model, batch, training=False)  # evaluation: no mixing
    np.testing.assert_allclose(np.asarray(plain), -log_probs[np.arange(4), batch["label"]],
                               rtol=1e-5)


# The config.

def test_presets_and_fields():
    assert augmentation.of({"augment": "medium2"}) == augmentation.Augmentation(
        randaugment_layers=2, randaugment_magnitude=15.0, mixup_alpha=0.5)
    assert augmentation.of({"augment": "light1"}).randaugment_layers == 2
    assert not augmentation.of({"augment": "none"}).active
    assert not augmentation.of({}).active  # a run saved before these fields
    mine = augmentation.of({"augment": "strong2", "mixup_alpha": 0.0, "cutmix_alpha": 1.0,
                            "randaugment_magnitude": 9.0})
    assert (mine.randaugment_layers, mine.randaugment_magnitude, mine.mixup_alpha,
            mine.cutmix_alpha) == (2, 9.0, 0.0, 1.0)


def test_config_checks(fake_fmnist):
    with pytest.raises(ValueError, match=r"config.augment='heavy': must be one of 'none'"):
        config_checks.check(tiny_config(fake_fmnist, augment="heavy"))
    with pytest.raises(ValueError, match=r"config.randaugment_magnitude=31.0: must be"):
        config_checks.check(tiny_config(fake_fmnist, randaugment_magnitude=31.0))
    with pytest.raises(ValueError, match="config.layer_decay=1.5: must be in"):
        config_checks.check(tiny_config(fake_fmnist, layer_decay=1.5))
    with pytest.raises(ValueError, match="augmentation is for classification"):
        config_checks.check(tiny_config(fake_fmnist, augment="light2",
                                        objective="masked_patch_prediction"))
    with pytest.raises(ValueError, match="set config.randaugment_magnitude"):
        config_checks.check(tiny_config(fake_fmnist, randaugment_layers=2))
    config_checks.check(tiny_config(fake_fmnist, randaugment_layers=2,
                                    randaugment_magnitude=9.0))
    config_checks.check(tiny_config(fake_fmnist, **RECIPE), num_replicas=2)


def test_grain_leaves_augmentation_to_tf_data(fake_fmnist):
    config = tiny_config(fake_fmnist, augment="light1")
    assert "TensorFlow ops" in grain_pipeline.unavailable(config, "jax")
    assert grain_pipeline.choose(config, "jax") == "tf.data"
    assert grain_pipeline.choose(tiny_config(fake_fmnist), "jax") == "grain"

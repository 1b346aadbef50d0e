"""Masked patch prediction (paper section 4.6, appendix B.1.2): the corruption draw
(train/data/masking.py), the targets, the corruption of the tokens and the loss
(keras_vit/masked_patches.py), the config checks, and loading the exported encoder."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.weights import checkpoint
from keras_vit import masked_patches as mp
from train.run import config_checks
from train.data import masking

NUM_PATCHES = 49  # the offline default's 7x7 grid
DRAWS = 4000  # 196,000 patches: the standard error of a 50% share is 0.11 points


def _draws(num_patches=NUM_PATCHES, draws=DRAWS, rate=0.5, mask=0.8, random=0.1):
    seeds = tf.data.Dataset.range(draws).map(
        lambda index: tf.stack([tf.constant(7, tf.int64), index]))
    batches = seeds.map(lambda seed: masking.draw_corruption(seed, num_patches, rate, mask,
                                                             random)).batch(draws)
    corruption, source = next(iter(batches))
    return corruption.numpy(), source.numpy()


def test_corruption_shares_are_the_papers():
    corruption, _ = _draws()
    corrupted = corruption != mp.NOT_CORRUPTED
    assert corrupted.mean() == pytest.approx(0.5, abs=0.01)
    kinds = corruption[corrupted]
    assert (kinds == mp.MASKED).mean() == pytest.approx(0.8, abs=0.01)
    assert (kinds == mp.REPLACED).mean() == pytest.approx(0.1, abs=0.01)
    assert (kinds == mp.KEPT).mean() == pytest.approx(0.1, abs=0.01)
    # Each image has 24 or 25 of its 49 patches corrupted (0.5 * 49 rounded at random).
    assert set(corrupted.sum(axis=1)) == {24, 25}


def test_bert_rate_is_a_setting():
    corruption, _ = _draws(rate=0.15, draws=2000)
    assert (corruption != mp.NOT_CORRUPTED).mean() == pytest.approx(0.15, abs=0.01)


def test_random_replacements_come_from_other_patches_of_the_same_image():
    corruption, source = _draws()
    positions = np.broadcast_to(np.arange(NUM_PATCHES), source.shape)
    replaced = corruption == mp.REPLACED
    assert replaced.any()
    assert np.all(source[replaced] != positions[replaced])
    assert np.all((source >= 0) & (source < NUM_PATCHES))
    assert np.all(source[~replaced] == positions[~replaced])
    # Every other patch is a possible source: the shifts 1 .. 48 all occur, evenly.
    shifts = (source[replaced] - positions[replaced]) % NUM_PATCHES
    counts = np.bincount(shifts, minlength=NUM_PATCHES)
    assert counts[0] == 0 and counts[1:].min() > 0.5 * counts[1:].mean()


def test_the_draw_is_a_function_of_its_seed():
    seed = tf.constant([3, 11], tf.int64)
    first = masking.draw_corruption(seed, NUM_PATCHES, 0.5, 0.8, 0.1)
    again = masking.draw_corruption(seed, NUM_PATCHES, 0.5, 0.8, 0.1)
    other = masking.draw_corruption(tf.constant([3, 12], tf.int64), NUM_PATCHES, 0.5, 0.8, 0.1)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])


# Targets of hand-made patches. Pixels are 0..255 values, given to the functions scaled to the
# model's [-1, 1] as the input pipeline does.

def _scaled(pixels):
    return ((np.asarray(pixels, np.float32) - 127.5) / 127.5)[None]


def _level(value):  # the top 3 bits of a 0..255 value
    return int(value) // 32


def _color(r, g, b):
    return _level(r) * 64 + _level(g) * 8 + _level(b)


def test_mean_color_targets_by_hand():
    image = np.zeros((8, 8, 3), np.float32)
    image[:4, :4] = (200, 10, 100)  # patch 0: one colour -> levels (6, 0, 3)
    image[:4, 4:6] = (0, 0, 0)  # patch 1: half black, half white -> mean 127.5, level 3
    image[:4, 6:8] = (255, 255, 255)
    image[4:, :4] = (32, 64, 31)  # patch 2: on and just below level boundaries
    image[4:, 4:] = 255  # patch 3: the top colour
    image[4, 4] = (0, 0, 0)  # ... but one pixel of 16 black: mean 239.06 -> level 7
    targets = np.asarray(mp.mean_color_targets(_scaled(image), 4))
    expected = [_color(200, 10, 100), _color(127.5, 127.5, 127.5), _color(32, 64, 31),
                _color(239.06, 239.06, 239.06)]
    assert expected == [6 * 64 + 3, 3 * 64 + 3 * 8 + 3, 1 * 64 + 2 * 8 + 0, 511]
    np.testing.assert_array_equal(targets, [expected])


def test_downscaled_color_targets_by_hand():
    # One 8x8 patch: cells of 2x2 pixels, cell (row i, column j) has value 16 * (4i + j)
    # plus a pixel pattern that averages to it.
    image = np.zeros((8, 8, 3), np.float32)
    expected = []
    for i in range(4):
        for j in range(4):
            value = 16 * (4 * i + j)
            cell = np.array([[value - 8, value + 8], [value + 8, value - 8]], np.float32)
            image[2 * i:2 * i + 2, 2 * j:2 * j + 2] = np.clip(cell, 0, 255)[..., None]
            mean = np.clip(cell, 0, 255).mean()
            expected.append(_color(mean, mean, mean))
    targets = np.asarray(mp.downscaled_color_targets(_scaled(image), 8))
    assert targets.shape == (1, 1, 16)
    np.testing.assert_array_equal(targets[0, 0], expected)
    with pytest.raises(ValueError, match="multiple of 4 pixels, not 6"):
        mp.downscaled_color_targets(_scaled(np.zeros((12, 12, 3))), 6)


def _tiny_encoder(variant="Ti/16", image_size=16, **overrides):
    options = dict(patch_size=4, hidden_size=8, mlp_dim=16, num_heads=2, num_layers=1)
    options.update(overrides)
    return keras_vit.vit(variant, image_size=image_size, include_top=False, classifier="gap",
                         **options)


def test_hybrid_targets_cover_the_pixels_of_each_token():
    """R+Ti/16 with 1x1 patches of its stride-4 stem: each token is a 4x4-pixel patch."""
    encoder = _tiny_encoder("R+Ti/16", image_size=8, patch_size=1)
    model = mp.MaskedPatchPredictor(encoder)
    assert model.grid_size == (2, 2) and model.patch_pixels == 4
    image = np.zeros((8, 8, 3), np.float32)
    image[:4, 4:] = (100, 150, 250)
    image[4:, :4] = (40, 40, 40)
    targets = np.asarray(model.targets(_scaled(image)))
    np.testing.assert_array_equal(targets, [[0, _color(100, 150, 250), _color(40, 40, 40), 0]])
    pixels = mp.MaskedPatchPredictor(encoder, target="pixels").targets(_scaled(image))
    np.testing.assert_allclose(np.asarray(pixels)[0, 1].reshape(4, 4, 3),
                               _scaled(image)[0, :4, 4:], atol=1e-7)


def test_corrupt_tokens_masks_replaces_and_keeps():
    tokens = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    corruption = np.array([[mp.MASKED, mp.REPLACED, mp.KEPT, mp.NOT_CORRUPTED],
                           [mp.REPLACED, mp.NOT_CORRUPTED, mp.MASKED, mp.REPLACED]], np.int32)
    source = np.array([[0, 3, 2, 3], [2, 1, 2, 0]], np.int32)
    mask = np.array([-1.0, -2.0, -3.0], np.float32)
    out = np.asarray(mp.corrupt_tokens(tokens, corruption, source, mask))
    expected = tokens.copy()
    expected[0, 0] = mask
    expected[0, 1] = tokens[0, 3]
    expected[1, 0] = tokens[1, 2]  # the source's own token, before it was masked
    expected[1, 2] = mask
    expected[1, 3] = tokens[1, 0]
    np.testing.assert_array_equal(out, expected)


def _inputs(model, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.uniform(-1, 1, (batch,) + tuple(model.encoder.inputs[0].shape[1:]))
    corruption = rng.integers(0, 4, (batch, model.num_patches)).astype(np.int32)
    corruption[:, 0] = mp.NOT_CORRUPTED
    corruption[:, 1] = mp.MASKED
    source = np.tile(np.arange(model.num_patches, dtype=np.int32), (batch, 1))
    return {"images": images.astype(np.float32), "corruption": corruption, "source": source}


@pytest.mark.parametrize("target", mp.TARGETS)
def test_the_loss_ignores_uncorrupted_patches(target):
    model = mp.MaskedPatchPredictor(_tiny_encoder(), target=target)
    # A non-zero head, so that every patch's prediction differs.
    model.head.kernel.assign(np.random.default_rng(1).normal(
        size=model.head.kernel.shape).astype(np.float32))
    inputs = _inputs(model)
    predictions = model(inputs)
    targets = np.asarray(model.targets(inputs["images"]))
    loss, count = (float(v) for v in model.loss_sums(predictions, targets, inputs["corruption"]))
    assert count == float((inputs["corruption"] != mp.NOT_CORRUPTED).sum())
    changed = targets.copy()
    changed[:, 0] = (changed[:, 0] + 1) % (512 if target != "pixels" else 2)  # patch 0: clean
    same = float(model.loss_sums(predictions, changed, inputs["corruption"])[0])
    assert same == loss
    changed[:, 1] = (changed[:, 1] + 1) % (512 if target != "pixels" else 2)  # patch 1: masked
    assert float(model.loss_sums(predictions, changed, inputs["corruption"])[0]) != loss


@pytest.mark.parametrize("target,shape", [("mean_color", (16, 512)),
                                          ("downscaled_color", (16, 16, 512)),
                                          ("pixels", (16, 48))])
def test_prediction_shapes_and_a_zero_head_predicts_uniformly(target, shape):
    model = mp.MaskedPatchPredictor(_tiny_encoder(), target=target)  # 4x4 patches, 4x4 grid
    inputs = _inputs(model)
    predictions = np.asarray(model(inputs))
    assert predictions.shape == (2,) + shape
    loss, count = model.loss_sums(predictions, model.targets(inputs["images"]),
                                  inputs["corruption"])
    if target != "pixels":  # zero logits: the cross-entropy of a uniform guess, log(512)
        assert float(loss) / float(count) == pytest.approx(np.log(512), rel=1e-5)


def test_corruption_changes_the_predictions_and_leaves_the_encoder_as_it_was():
    encoder = _tiny_encoder()
    model = mp.MaskedPatchPredictor(encoder)
    model.head.kernel.assign(np.ones(model.head.kernel.shape, np.float32))
    inputs = _inputs(model)
    clean = dict(inputs, corruption=np.zeros_like(inputs["corruption"]))
    assert not np.allclose(model(inputs), model(clean))
    pooled = np.asarray(encoder(inputs["images"]))
    # The hook is gone after the call: the encoder alone computes what it did before.
    np.testing.assert_array_equal(np.asarray(encoder(inputs["images"])), pooled)
    assert model.patch_embed.token_transform is None
    # The pre-trained weights are the encoder's: one gradient step moves them.
    names = {v.path for v in encoder.trainable_variables}
    assert names <= {v.path for v in model.trainable_variables}


@pytest.mark.parametrize("change,error,words", [
    (dict(corruption=np.zeros((2, 17), np.int32), source=np.zeros((2, 17), np.int32)),
     ValueError, ["corruption must be [batch, 16]", "4x4 grid", "got shape (2, 17)",
                  "slot for the class token: give the 16 patches only"]),
    (dict(source=np.full((2, 16), 16, np.int32)), ValueError,
     ["source holds patch indices [16] outside 0..15"]),
    (dict(source=np.full((2, 16), -1, np.int32)), ValueError, ["patch indices [-1]"]),
    (dict(corruption=np.full((2, 16), 7, np.int32)), ValueError,
     ["corruption holds unknown codes [7]", "0 (not corrupted), 1 (masked)"]),
    (dict(corruption=np.zeros((2, 16), np.float32)), TypeError,
     ["corruption must hold integers", "float32"]),
    (dict(corruption=np.zeros((3, 16), np.int32)), ValueError,
     ["corruption has 3 rows for a batch of 2 images"]),
], ids=["class_token_slot", "source_too_large", "source_negative", "unknown_code", "floats",
        "batch"])
def test_corruption_inputs_are_checked(change, error, words):
    encoder = keras_vit.vit("Ti/16", image_size=16, include_top=False, patch_size=4,
                            hidden_size=8, mlp_dim=16, num_heads=2, num_layers=1)
    model = mp.MaskedPatchPredictor(encoder)  # 16 patches and a class token
    inputs = dict(_inputs(model), **change)
    with pytest.raises(error) as caught:
        model(inputs)
    for word in words:
        assert word in str(caught.value)
    # Eager TensorFlow tensors are checked as numpy arrays are.
    with pytest.raises(error):
        model({name: tf.constant(value) for name, value in inputs.items()})


def test_compiled_calls_check_shapes_not_values():
    """Inside tf.function (and XLA) the values are unknown: shapes are still checked, values
    are left to the caller (the training driver draws valid ones)."""
    model = mp.MaskedPatchPredictor(_tiny_encoder())
    inputs = _inputs(model)
    call = tf.function(lambda corruption, source: model(
        {"images": inputs["images"], "corruption": corruption, "source": source}))
    assert call(inputs["corruption"], inputs["source"]).shape == (2, 16, 512)
    with pytest.raises(ValueError, match="got shape"):
        call(np.zeros((2, 17), np.int32), np.zeros((2, 17), np.int32))


def test_a_class_token_model_predicts_from_its_patch_tokens_only():
    encoder = keras_vit.vit("Ti/16", image_size=16, include_top=False, patch_size=4,
                            hidden_size=8, mlp_dim=16, num_heads=2, num_layers=1)
    model = mp.MaskedPatchPredictor(encoder)
    assert model.num_prefix_tokens == 1
    assert np.asarray(model(_inputs(model))).shape == (2, 16, 512)


def test_mixed_bfloat16_predictions_are_float32_and_close_to_float32():
    encoder = _tiny_encoder(dtype="mixed_bfloat16")
    model = mp.MaskedPatchPredictor(encoder)
    full = mp.MaskedPatchPredictor(_tiny_encoder())
    full.set_weights(model.get_weights())
    full.head.kernel.assign(np.ones(full.head.kernel.shape, np.float32))
    model.head.kernel.assign(np.ones(model.head.kernel.shape, np.float32))
    inputs = _inputs(model)
    low, high = model(inputs), full(inputs)
    assert keras.backend.standardize_dtype(low.dtype) == "float32"
    np.testing.assert_allclose(np.asarray(low), np.asarray(high), atol=0.1)
    assert not np.allclose(np.asarray(high), 0)


def test_refuses_what_is_not_a_vit_encoder():
    inputs = keras.Input((8, 8, 3))
    with pytest.raises(ValueError, match="not a keras_vit ViT"):
        mp.MaskedPatchPredictor(keras.Model(inputs, keras.layers.Flatten()(inputs)))
    with pytest.raises(ValueError, match="target must be one of"):
        mp.MaskedPatchPredictor(_tiny_encoder(), target="colour")


def test_config_checks_for_masked_patch_prediction():
    from configs import mpp
    config = mpp.get_config()
    config_checks.check(config)
    config.mpp_mask_rate, config.mpp_random_rate = 0.8, 0.3
    with pytest.raises(ValueError, match="together at most 1"):
        config_checks.check(config)
    config = mpp.get_config()
    config.model.patch_size, config.mpp_target = 7, "downscaled_color"
    with pytest.raises(ValueError, match="multiple of 4 pixels, not 7"):
        config_checks.check(config)
    config = mpp.get_config()
    config.model.patch_size = 28
    with pytest.raises(ValueError, match="the image is one patch"):
        config_checks.check(config)
    config.mpp_random_rate = 0.0
    config_checks.check(config)
    config = mpp.get_config()
    config.model.dynamic_image_size = True
    with pytest.raises(ValueError, match="trains at one image size"):
        config_checks.check(config)


def test_the_paper_recipe_config():
    from configs import mpp
    config = mpp.get_config("model=B/16,dataset=imagenet2012")
    config_checks.check(config)
    assert (config.optimizer, config.learning_rate, config.warmup_steps, config.decay) == (
        "adam", 2e-4, 10_000, "cosine")
    assert (config.mpp_corruption_rate, config.mpp_mask_rate, config.mpp_random_rate) == (
        0.5, 0.8, 0.1)
    assert config.objective == "masked_patch_prediction" and config.model.classifier == "gap"


def test_an_exported_keras_encoder_loads_as_pretrained_weights(tmp_path):
    encoder = _tiny_encoder()
    path = str(tmp_path / "model.keras")
    encoder.save(path)
    arrays = checkpoint.read_weights(path)
    expected = checkpoint.model_arrays(encoder)
    assert sorted(arrays) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(arrays[key], expected[key])
    classifier = keras_vit.vit("Ti/16", image_size=16, num_classes=5, classifier="gap",
                               patch_size=4, hidden_size=8, mlp_dim=16, num_heads=2,
                               num_layers=1)
    report = checkpoint.load_npz(classifier, path)
    assert report["new_head"] == ["head/kernel", "head/bias"]
    np.testing.assert_allclose(classifier.get_layer("encoderblock_0").get_weights()[0],
                               encoder.get_layer("encoderblock_0").get_weights()[0])
    with pytest.raises(FileNotFoundError, match="No model file"):
        checkpoint.read_weights(str(tmp_path / "missing.keras"))
    (tmp_path / "bad.keras").write_bytes(b"not a zip")
    with pytest.raises(checkpoint.CheckpointError, match="not a loadable keras_vit"):
        checkpoint.read_weights(str(tmp_path / "bad.keras"))

"""Every option family (model_fixtures.OPTION_FAMILIES) through every tool that takes a model:
the `.keras` file in safe mode, the `.npz` checkpoint, LoRA (every head trains, the merged copy
computes the same), remat with fused attention, and a model of any image size: each gives the
model's own logits. (The exports are tests/library/deploy/test_export.py's, over the same families.) A new
family added there is tried by every tool here with no test written for it."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import lora
from keras_vit.weights import checkpoint
from model_fixtures import OPTION_FAMILIES, TINY_VIT, randomise

pytestmark = pytest.mark.usefixtures("fresh_session")

SIZE, PATCH = 32, 8


def model_of(fields, **changes):
    """The family's model with `changes`: spec fields, or how it runs (`remat=`, ...)."""
    return keras_vit.vit("Ti/16", image_size=SIZE, patch_size=PATCH, num_classes=5,
                         **{**TINY_VIT, **fields, **changes})


def images(size=SIZE, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (2, size, size, 3)).astype("float32")


def logits(model, x, training=False):
    return np.asarray(keras.ops.convert_to_numpy(model(x, training=training)), np.float64)


def assert_same(got, expected, what):
    scale = max(np.abs(expected).max(), 1e-6)
    assert np.abs(got - expected).max() <= 1e-5 * scale, what


def head_layers(model):
    """The classifier layers: `head` and a distillation token's `head_dist`."""
    return [layer for layer in model.layers if layer.name in ("head", "head_dist")]


@pytest.mark.parametrize("name", OPTION_FAMILIES)
def test_every_tool_gives_the_models_own_logits(name, tmp_path):
    fields = OPTION_FAMILIES[name]
    model = model_of(fields)
    randomise(model)
    x = images()
    expected = logits(model, x)

    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    assert_same(logits(loaded, x), expected, "the .keras file")

    checkpoint.save_npz(model, str(tmp_path / "model.npz"))
    from_npz = model_of(fields)
    checkpoint.load_npz(from_npz, str(tmp_path / "model.npz"))
    assert_same(logits(from_npz, x), expected, "the .npz checkpoint")

    # Remat and fused attention change how the model runs, never what it computes; in
    # training too (no dropout here), where remat applies.
    executed = model_of(fields, remat="blocks", attention_impl="fused")
    executed.set_weights(model.get_weights())
    assert_same(logits(executed, x), expected, "remat and fused attention")
    # A copy trains (BatchNorm's moving statistics change in training; conv_stem's).
    trained = model_of(fields)
    trained.set_weights(model.get_weights())
    assert_same(logits(executed, x, training=True), logits(trained, x, training=True),
                "remat and fused attention in training")

    any_size = model_of(fields, dynamic_image_size=True)
    any_size.set_weights(model.get_weights())
    assert_same(logits(any_size, x), expected, "a model of any image size, at its own size")
    assert logits(any_size, images(SIZE + PATCH)).shape == expected.shape

    adapted = model_of(fields)
    adapted.set_weights(model.get_weights())
    lora.enable(adapted, rank=2)
    trainable = {id(variable) for variable in adapted.trainable_weights}
    for layer in head_layers(adapted):
        assert all(id(variable) in trainable for variable in layer.weights), (
            f"{layer.name} is frozen under LoRA")
    assert_same(logits(lora.merged(adapted), x), logits(adapted, x), "LoRA's merged copy")

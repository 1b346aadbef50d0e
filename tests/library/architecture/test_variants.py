"""Pinned parameter and token counts of every released variant.

Each count comes from building the real model with `keras_vit.vit` at 224x224 with 1000 classes,
its weights created with their shapes and not filled (`shapes_only`): counts and shapes need no
values, and drawing H/14's 632M initial values took 8 of the test's 8.5 CPU seconds. Each model
is released before the next one (`del` + `keras.backend.clear_session()` + `gc.collect()`).
"""

import gc

import keras
import pytest

import keras_vit
from keras_vit.architecture.spec import parse_variant

pytestmark = pytest.mark.usefixtures("fresh_session")

# The original Flax model's counts (google-research/vision_transformer: vit_jax/models_vit.py,
# VisionTransformer, with the sizes of vit_jax/configs/models.py) at 224x224, 1000 classes,
# class token, no pre_logits; the paper's Table 1 (arXiv 2010.11929) rounds them to 86M (B),
# 307M (L) and 632M (H).
PINNED_PARAMS = {
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    # Derived, not counted: from the block formula 4D^2 + 2DM + 9D + M with
    # D=384, M=1536 -> 1,774,464 per block; 12 blocks + 32x32x3x384 patch embedding + bias
    # (1,180,032) + cls (384) + 50x384 positions (19,200) + encoder norm (768) + head (385,000).
    "S/32": 22_878_952,
    "B/8": 86_576_872,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
    "R+Ti/16": 6_337_704,
    "R26+S/32": 36_431_912,
    "R50+B/16": 98_659_112,
    "R50+L/32": 328_994_856,
    # Axial-ViT (appendix D.6): the GAP B model (no class token: 196 positions, 86,566,120)
    # plus a second set of 12 blocks of 7,087,872 (row and column blocks, each with an MLP).
    "Axial-B/16": 171_620_584,
    # B/32's 32x32x3x768 patch embedding, 49 positions: 88,222,696 + 12 x 7,087,872.
    "Axial-B/32": 173_277_160,
}

# Tokens (class token + grid) at 224x224: (224 / pixels per token)^2 + 1.
TOKENS_224 = {
    "Ti/16": 197,
    "S/16": 197,
    "S/32": 50,
    "B/8": 785,
    "B/16": 197,
    "B/32": 50,
    "L/16": 197,
    "L/32": 50,
    "H/14": 257,
    "R+Ti/16": 50,
    "R26+S/32": 50,
    "R50+B/16": 197,
    "R50+L/32": 50,
    "Axial-B/16": 196,  # no class token
    "Axial-B/32": 49,
}


def shapes_only():
    """Builds inside it create each weight with its shape and leave it without values (Keras
    fills deferred weights when a stateless scope ends, unless told not to)."""
    return keras.StatelessScope(initialize_variables=False)


HIDDEN = {"Ti": 192, "S": 384, "B": 768, "L": 1024, "H": 1280}


def _hidden(name):
    return HIDDEN[name.removeprefix("Axial-").split("+")[-1].split("/")[0]]


def _pos_embedding_shape(model):
    return tuple(model.get_layer("posembed_input").pos_embedding.shape)


def test_every_variant_has_a_pinned_count():
    names = set(keras_vit.VARIANT_NAMES)
    missing = names - set(PINNED_PARAMS)
    assert not missing, f"variants without a pinned parameter count: {sorted(missing)}"
    stale = set(PINNED_PARAMS) - names
    assert not stale, f"pinned counts for variants that no longer exist: {sorted(stale)}"
    missing_tokens = names - set(TOKENS_224)
    assert not missing_tokens, f"variants without a pinned token count: {sorted(missing_tokens)}"


@pytest.mark.parametrize("name", list(keras_vit.VARIANT_NAMES))
def test_parameter_and_token_count(name):
    assert name in PINNED_PARAMS, f"no pinned count for {name}"
    with shapes_only():
        model = keras_vit.vit(name)
    try:
        assert model.count_params() == PINNED_PARAMS[name]
        assert _pos_embedding_shape(model) == (1, TOKENS_224[name], _hidden(name))
        assert model.output_shape == (None, 1000)
    finally:
        del model
        keras.backend.clear_session(free_memory=False)
        gc.collect()  # release the GBs of a big model before the next one is built


def test_b16_encoder_block_matches_formula():
    # One encoder block has 4D^2 + 2DM + 9D + M parameters: 7,087,872 for B (D=768, M=3072).
    model = keras_vit.vit("B/16", num_layers=1)
    d, m = 768, 3072
    block = model.get_layer("encoderblock_0")
    assert block.count_params() == 4 * d * d + 2 * d * m + 9 * d + m == 7_087_872


@pytest.mark.parametrize(
    "kwargs, params, tokens",
    [
        ({"include_top": False}, 85_798_656, 197),
        ({"image_size": 384}, 86_859_496, 577),
        ({"num_classes": 10}, 85_806_346, 197),
    ],
    ids=["no_top", "384", "10_classes"],
)
def test_b16_checks(kwargs, params, tokens):
    with shapes_only():
        model = keras_vit.vit("B/16", **kwargs)
    assert model.count_params() == params
    assert _pos_embedding_shape(model) == (1, tokens, 768)


def test_b16_gap_has_no_class_token():
    with shapes_only():
        model = keras_vit.vit("B/16", classifier="gap")
    assert model.count_params() == 86_566_120
    assert _pos_embedding_shape(model) == (1, 196, 768)
    assert not any(isinstance(layer, keras_vit.layers.ClassToken) for layer in model.layers)


def test_b32_at_384_has_145_tokens():
    with shapes_only():
        model = keras_vit.vit("B/32", image_size=384)
    assert _pos_embedding_shape(model) == (1, 145, 768)


def _fingerprint(model):
    """Everything that fixes the architecture: weight paths and shapes, dropout, model name."""
    weights = [(w.path, tuple(w.shape)) for w in model.weights]
    return model.name, model.get_layer("dropout").rate, weights


@pytest.mark.parametrize("name", list(keras_vit.VARIANT_NAMES))
def test_builder_is_exported_and_builds_the_same_variant(name):
    function_name = keras_vit.VARIANT_NAMES[name]
    builder = getattr(keras_vit, function_name, None)
    assert callable(builder), f"keras_vit does not export {function_name}"
    assert builder.__name__ == function_name
    # One encoder block and the smallest image keep this cheap; the variant's own patch size,
    # width, heads, MLP size, ResNet and dropout are what is compared.
    small = {"num_layers": 1, "image_size": parse_variant(name).total_stride, "num_classes": 3}
    with shapes_only():
        from_builder = _fingerprint(builder(**small))
    keras.backend.clear_session(free_memory=False)
    with shapes_only():
        from_vit = _fingerprint(keras_vit.vit(name, **small))
    assert from_builder == from_vit
    expected_name = "vit_" + name.lower().replace("/", "").replace("+", "_").replace("-", "_")
    assert from_builder[0] == expected_name

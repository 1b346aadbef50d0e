"""LoRA on keras_vit models (keras_vit/lora.py): Keras' Dense.enable_lora on each encoder block's
attention and MLP kernels, everything else frozen but the head; the merged copy for export. The
driver's runs with --config.lora_rank are in tests/training/run/test_starting_point.py."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import lora
from model_fixtures import TINY_VIT, random_tiny_vit

pytestmark = pytest.mark.usefixtures("fresh_session")


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


tiny = random_tiny_vit


def pixels(count=4):
    return np.random.default_rng(0).uniform(-1, 1, (count, 32, 32, 3)).astype("float32")


def lora_parameters(spec, rank):
    """Hu et al.'s count: rank x (inputs + outputs) of each adapted kernel, 4 attention and 2
    MLP kernels a block."""
    hidden, mlp = spec.hidden_size, spec.mlp_dim
    return spec.num_layers * rank * (4 * 2 * hidden + 2 * (hidden + mlp))


def head_parameters(spec):
    """The classifier's weights: `head`, and `head_dist` beside it with a distillation token,
    on the pooled representation (`pre_logits`' output where the spec has one)."""
    inputs = spec.representation_size or spec.hidden_size
    return (1 + spec.distillation_token) * (inputs * spec.num_classes + spec.num_classes)


@pytest.mark.parametrize("fields", [{}, {"classifier": "map", "num_register_tokens": 2},
                                    {"classifier": "gap", "final_norm": "pooled",
                                     "layer_scale_init": 0.1},
                                    {"distillation_token": True}, {"representation_size": 16}],
                         ids=["token", "map", "gap", "distillation_token", "pre_logits"])
def test_only_the_adapters_and_the_head_train_and_the_model_starts_unchanged(fields):
    """Every head trains (a distillation token's `head_dist` too); the pre-logits layer, like
    the attention pooling, is the encoder's and stays frozen."""
    model = tiny(**fields)
    before = to_np(model(pixels()))
    lora.enable(model, rank=4)
    np.testing.assert_array_equal(to_np(model(pixels())), before)  # B starts at zero
    spec = model.spec
    trainable = sum(int(np.prod(variable.shape)) for variable in model.trainable_variables)
    assert trainable == lora_parameters(spec, 4) + head_parameters(spec)
    with_norms = tiny(**fields)
    lora.enable(with_norms, rank=4, train_norms=True)
    norms = sum(int(np.prod(v.shape)) for v in with_norms.trainable_variables) - trainable
    assert norms == 2 * spec.hidden_size * (2 * spec.num_layers + 1 + (fields.get(
        "classifier") == "map"))


def test_training_changes_the_adapters_and_the_head_alone_and_the_state_shrinks():
    model = tiny()
    base = {variable.path: to_np(variable) for variable in model.weights}
    lora.enable(model, rank=2, alpha=4.0)
    optimizer = keras.optimizers.AdamW(1e-2)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(pixels(8), np.arange(8) % 5, epochs=3, verbose=0)
    for variable in model.weights:
        if variable.path.startswith("head/") or lora.is_adapter(variable):
            continue
        np.testing.assert_array_equal(to_np(variable), base[variable.path], err_msg=variable.path)
    assert not np.array_equal(to_np(model.get_layer("head").kernel), base["head/kernel"])
    adapters = [variable for variable in model.weights if variable.name == "lora_kernel_b"]
    assert all(np.abs(to_np(variable)).max() > 0 for variable in adapters)
    # AdamW keeps two moments of each trained weight, nothing for the frozen ones.
    moments = sum(int(np.prod(v.shape)) for v in optimizer.variables if len(v.shape))
    assert moments == 2 * (lora_parameters(model.spec, 2) + 24 * 5 + 5)


def test_the_merged_copy_has_no_adapters_and_the_adapted_outputs():
    model = tiny()
    lora.enable(model, rank=3)
    for layer in lora.adapted_layers(model):  # as if trained
        layer.lora_kernel_b.assign(
            np.random.default_rng(1).normal(0, 0.2, layer.lora_kernel_b.shape))
    adapted = to_np(model(pixels()))
    plain = lora.merged(model)
    assert not lora.is_adapted(plain) and len(plain.weights) == len(tiny().weights)
    np.testing.assert_allclose(to_np(plain(pixels())), adapted, rtol=1e-5, atol=1e-5)
    assert lora.merged(plain) is plain


def test_files_of_an_adapted_model_hold_the_merged_weights(tmp_path):
    model = tiny()
    lora.enable(model, rank=3)
    for layer in lora.adapted_layers(model):
        for seed, variable in ((2, layer.lora_kernel_a), (3, layer.lora_kernel_b)):
            variable.assign(np.random.default_rng(seed).normal(0, 0.2, variable.shape))
    adapted = to_np(model(pixels()))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert not any("lora" in variable.path for variable in loaded.weights)
    np.testing.assert_allclose(to_np(loaded(pixels())), adapted, rtol=1e-5, atol=1e-5)
    keras_vit.weights.checkpoint.save_npz(model, str(tmp_path / "model.npz"))
    fresh = tiny()
    keras_vit.weights.checkpoint.load_npz(fresh, str(tmp_path / "model.npz"))
    np.testing.assert_allclose(to_np(fresh(pixels())), adapted, rtol=1e-5, atol=1e-5)
    # And an adapted model loads a plain checkpoint into its base weights, adapters untouched.
    again = tiny()
    lora.enable(again, rank=3)
    report = keras_vit.weights.checkpoint.load_npz(again, str(tmp_path / "model.npz"))
    assert not report["missing"]
    np.testing.assert_allclose(to_np(again(pixels())), adapted, rtol=1e-5, atol=1e-5)


def test_bad_ranks_and_a_second_enable_are_refused():
    for rank in (0, -1):
        with pytest.raises(ValueError, match="rank must be a positive integer, got"):
            lora.enable(tiny(), rank)
    for rank in (2.0, True, "4", None):
        with pytest.raises(TypeError, match="rank must be a positive integer, got"):
            lora.enable(tiny(), rank)
    model = lora.enable(tiny(), 2)
    with pytest.raises(ValueError, match="adapted already"):
        lora.enable(model, 2)


@pytest.mark.parametrize("alpha, error", [
    (0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), (float("nan"), ValueError),
    ("8", TypeError), (True, TypeError), ([8.0], TypeError)])
def test_a_bad_alpha_is_refused_naming_it(alpha, error):
    model = tiny()
    with pytest.raises(error, match=r"alpha must be a finite number > 0 or None, got"):
        lora.enable(model, 4, alpha=alpha)
    assert not lora.is_adapted(model)  # refused before any layer was adapted


def test_a_bad_train_norms_is_refused_naming_it():
    for value in ("yes", 1, None):
        with pytest.raises(TypeError, match="train_norms must be True or False, got"):
            lora.enable(tiny(), 4, train_norms=value)


def test_numpy_numbers_are_taken_as_python_ones():
    model = lora.enable(tiny(), np.int64(4), alpha=np.float32(8.0), train_norms=np.bool_(True))
    query = lora.adapted_layers(model)[0]
    assert query.lora_rank == 4 and type(query.lora_rank) is int
    assert query.lora_alpha == 8.0
    assert any("LayerNorm" in variable.path for variable in model.trainable_variables)


def test_a_rank_above_the_smallest_adapted_kernel_is_refused_naming_the_limit_and_layer():
    """TINY_VIT's narrowest adapted kernels are the attention's 24 x 24: a rank of 25 would
    make adapters larger than the kernels they adapt."""
    model = tiny()
    with pytest.raises(ValueError) as error:
        lora.enable(model, 25)
    message = str(error.value)
    for words in ("rank must be at most 24", "got 25",
                  "(encoderblock_0/MultiHeadDotProductAttention_1/", "24 x 24)"):
        assert words in message, message
    assert not lora.is_adapted(model)
    assert lora.is_adapted(lora.enable(tiny(), 24))


def test_the_relative_position_mlp_is_not_adapted():
    """Its kernels (2 x 16, 16 x heads) give positions, not features: frozen like the other
    position embeddings, and no limit on the rank of the attention's and MLP's adapters."""
    model = tiny(position_embedding="relative_mlp", relative_mlp_dim=16)
    assert not [layer for layer in lora.adapted_layers(model)
                if "relative_position" in layer.path]
    lora.enable(model, 8)
    assert not [variable for variable in model.trainable_variables
                if "relative_position" in variable.path]


@pytest.mark.parametrize("fields", [
    {}, {"mlp_dim": 16}, {"activation": "swiglu", "mlp_dim": 20},
    {"variant": "Axial-Ti/16", "classifier": "gap"},
    {"position_embedding": "relative_mlp", "relative_mlp_dim": 4}],
    ids=["plain", "narrow_mlp", "swiglu", "axial", "relative_mlp"])
def test_max_rank_of_a_spec_is_the_narrowest_adapted_kernels_side(fields):
    """What the run config's check reads of the spec alone is what `enable` finds in the
    built model's kernels."""
    model = keras_vit.vit(**{"variant": "Ti/16", **TINY_VIT, "image_size": 32, "patch_size": 8,
                             "num_classes": 5, **fields})
    narrowest = min(min(layer.kernel.shape) for layer in lora.adapted_layers(model))
    assert lora.max_rank(model.spec) == narrowest
    with pytest.raises(ValueError, match=f"rank must be at most {narrowest},"):
        lora.enable(model, narrowest + 1)
    lora.enable(model, narrowest)

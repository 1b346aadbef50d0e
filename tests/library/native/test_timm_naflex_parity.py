"""timm's NaFlexVit against timm 1.0.31 itself (PyTorch's CPU): tiny `naflexvit_*` models of
several configurations (learned position embeddings resized antialiased bicubic, and bilinear
as its SigLIP 2; registers; a class token with 'token' pooling; 'avg' with fc_norm; 'map' with
and without the prefix tokens and of its own heads and width; LayerScale, pre-norm and inner
norms) with random weights of order 1, saved as timm's hub files, load as a `NaFlexViT` with the
same logits and tokens on images of four aspect ratios at three budgets (the learned grid's,
more patches, fewer), fed as `keras_vit.native.prepare`'s arrays and as timm's dict; written
back, `timm.create_model("local-dir:...")` gives the same logits. A model built in keras_vit
(position embeddings for its class and register tokens, folded into them) and transformers'
SigLIP 2 are written for timm too. The per-image resize of the position embeddings equals
PyTorch's `F.interpolate(antialias=True, align_corners=False)` bicubic and bilinear, enlarging
and shrinking, square and not. Options timm has and keras_vit lacks are refused by name, before
anything is written. Skipped where PyTorch or timm is missing; CI runs it in its PyTorch
environment (see .ci/run)."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

import keras  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import native  # noqa: E402
from keras_vit.native import positions  # noqa: E402
from keras_vit.weights.torch_layouts import LayoutError  # noqa: E402
from model_fixtures import order_one  # noqa: E402

PATCH = 8
# Small sizes for every architecture; a 4x5 learned grid (20 patches), not square.
SIZES = dict(embed_dim=32, depth=2, num_heads=4, patch_size=PATCH, pos_embed_grid_size=(4, 5),
             num_classes=5)
RNG = np.random.default_rng(0)
IMAGES = [RNG.integers(0, 256, shape, dtype=np.uint8)
          for shape in ((32, 40, 3), (20, 90, 3), (90, 21, 3), (64, 40, 3))]
BUDGETS = (20, 33, 7)  # the learned grid's, more (enlarged), fewer (shrunk, antialiased)
# name -> (architecture, its options beyond SIZES): what each configuration shows.
CONFIGURATIONS = {
    # bicubic, 4 registers, LayerScale, 'avg' normed after pooling (fc_norm)
    "gap": ("naflexvit_base_patch16_gap", {}),
    # a class token pooled by 'token', 2 registers, the tokens normed
    "token": ("naflexvit_base_patch16_gap", dict(class_token=True, global_pool="token",
                                                 reg_tokens=2, fc_norm=False)),
    # attention pooling of the patches, 1 register, LayerScale
    "map": ("naflexvit_base_patch16_map", {}),
    # attention pooling of every token, of its own heads and MLP width, a class token
    "map_prefix": ("naflexvit_base_patch16_map", dict(
        class_token=True, pool_include_prefix=True, attn_pool_num_heads=2,
        attn_pool_mlp_ratio=3.0)),
    # SigLIP 2's: bilinear resize, tanh GELU, attention pooling
    "siglip_bilinear": ("naflexvit_base_patch16_siglip", {}),
    # a norm before the blocks (no patch bias), inner norms, no qkv bias, no LayerScale,
    # quick GELU, 'avg'
    "pre_norm_inner_norms": ("naflexvit_base_patch16_siglip", dict(
        pre_norm=True, scale_mlp_norm=True, scale_attn_inner_norm=True, qkv_bias=False,
        act_layer="quick_gelu", global_pool="avg", pos_embed_interp_mode="bicubic")),
}


def timm_inputs(arrays):
    """`prepare`'s arrays under timm's names: each patch's row and column, whether it is one."""
    valid = arrays["pixel_attention_mask"].astype(bool)
    coords = np.zeros(valid.shape + (2,), np.int64)
    for index, (rows, columns) in enumerate(arrays["spatial_shapes"]):
        grid = np.stack(np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij"), -1)
        coords[index, :rows * columns] = grid.reshape(-1, 2)
    return {"patches": arrays["pixel_values"], "patch_coord": coords, "patch_valid": valid}


def their_outputs(model, arrays):
    """timm's logits and its tokens (after the final norm, prefix tokens first)."""
    inputs = {name: torch.tensor(value) for name, value in timm_inputs(arrays).items()}
    with torch.no_grad():
        tokens = model.forward_features(inputs["patches"], patch_coord=inputs["patch_coord"],
                                        patch_valid=inputs["patch_valid"])["patches"]
        return model(inputs).numpy(), tokens.numpy()


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def assert_close(got, expected, what):
    assert got.shape == expected.shape, what
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), what


def saved_by_timm(architecture, options, directory):
    theirs = order_one(timm.create_model(architecture, pretrained=False, **SIZES, **options))
    from timm.models import _hub
    _hub.save_for_hf(theirs, str(directory), model_args={**SIZES, **options},
                     safe_serialization=True)
    return theirs


def back_in_timm(model, directory):
    keras_vit.save_pretrained(model, directory, format="timm")
    return timm.create_model("local-dir:" + os.fspath(directory), pretrained=True).eval()


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_a_timm_naflexvit_loads_and_writes_back_with_its_outputs(name, tmp_path):
    architecture, options = CONFIGURATIONS[name]
    theirs = saved_by_timm(architecture, options, tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert isinstance(ours, native.NaFlexViT)
    back = back_in_timm(ours, tmp_path / "ours")
    prefix = ours.spec.num_prefix_tokens
    for budget in BUDGETS:
        arrays = native.prepare(IMAGES, PATCH, budget)
        logits, tokens = their_outputs(theirs, arrays)
        assert_close(numpy(ours(arrays)), logits, f"{name}: logits, budget {budget}")
        assert_close(numpy(ours(timm_inputs(arrays))), logits, f"{name}: timm's names")
        valid = np.concatenate([np.ones((len(IMAGES), prefix), bool),
                                arrays["pixel_attention_mask"] == 1], axis=1)
        assert_close(numpy(ours.tokens(arrays)[0])[valid], tokens[valid], f"{name}: tokens")
        assert_close(their_outputs(back, arrays)[0], logits, f"{name}: written back, {budget}")


def test_a_keras_vit_model_is_written_for_timm(tmp_path):
    """A model built here, with position embeddings for its class and register tokens (which
    NaFlexVit's have not: they are added to the tokens), loads in timm with its outputs."""
    model = keras_vit.vit("Ti/16", image_size=(24, 40), patch_size=PATCH, hidden_size=32,
                          mlp_dim=48, num_heads=4, num_layers=2, num_classes=5,
                          classifier="token", num_register_tokens=2, activation="gelu",
                          position_embedding_interpolation="bicubic", layer_scale_init=1e-5)
    rng = np.random.default_rng(1)
    for weight in model.weights:
        scale = weight.path.endswith(("gamma", "scale"))
        weight.assign(rng.normal(float(scale), 0.1 if scale else 0.3, weight.shape))
    ours = native.NaFlexViT(model)
    theirs = back_in_timm(ours, tmp_path / "ours")
    for budget in BUDGETS:
        arrays = native.prepare(IMAGES, PATCH, budget)
        assert_close(their_outputs(theirs, arrays)[0], numpy(ours(arrays)), f"budget {budget}")


def test_siglip2_from_transformers_is_written_for_timm(tmp_path):
    """transformers' Siglip2VisionModel, read here, written as timm's NaFlexVit: timm's output
    is transformers' pooler_output (both resize bilinear)."""
    transformers = pytest.importorskip("transformers")
    siglip = order_one(transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_patches=16, patch_size=PATCH)))
    siglip.save_pretrained(tmp_path / "siglip")
    theirs = back_in_timm(keras_vit.from_pretrained(str(tmp_path / "siglip")), tmp_path / "timm")
    arrays = native.prepare(IMAGES, PATCH, 24)
    with torch.no_grad():
        pooled = siglip(pixel_values=torch.tensor(arrays["pixel_values"]),
                        pixel_attention_mask=torch.tensor(arrays["pixel_attention_mask"]),
                        spatial_shapes=torch.tensor(arrays["spatial_shapes"]).long()
                        ).pooler_output.numpy()
    assert_close(their_outputs(theirs, arrays)[0], pooled, "timm against transformers")


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_the_position_embeddings_are_resized_as_pytorch_does(mode):
    """Each patch's embedding, at its row and column of its image's grid, is PyTorch's
    antialiased resize of the whole table to that grid: enlarging, shrinking, both at once,
    square tables and not."""
    table_rng = np.random.default_rng(2)
    for grid in ((4, 4), (4, 7), (16, 16), (5, 3)):
        table = table_rng.normal(size=grid + (6,)).astype("float32")
        for rows, columns in ((1, 1), (2, 9), (3, 3), (7, 2), (16, 16), (30, 5), grid, (1, 40)):
            expected = torch.nn.functional.interpolate(
                torch.tensor(table).permute(2, 0, 1)[None], size=(rows, columns), mode=mode,
                align_corners=False, antialias=True)[0].permute(1, 2, 0).reshape(-1, 6)
            where = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
            where = [side.reshape(1, -1).astype("float32") for side in where]
            sizes = np.broadcast_to(np.float32([rows, columns]), (1, rows * columns, 2))
            got = positions.resized_learned(table, *where, sizes, mode)
            assert_close(numpy(got)[0], expected.numpy(), f"{grid} -> {(rows, columns)}")


@pytest.mark.parametrize("architecture, options, named", [
    ("naflexvit_base_patch16_par_gap", {}, "pos_embed_ar_preserving=True"),
    ("naflexvit_base_patch16_parfac_gap", {}, "pos_embed='factorized'"),
    ("naflexvit_base_patch16_gap", dict(pos_embed_interp_mode="nearest"),
     "pos_embed_interp_mode='nearest'"),
    ("naflexvit_base_patch16_gap", dict(pos_embed_antialias=False),
     "pos_embed_antialias=False"),
    ("naflexvit_base_patch16_gap", dict(global_pool="avgmax"), "global_pool='avgmax'"),
    ("naflexvit_base_patch16_gap", dict(qk_norm=True), "qk_norm=True"),
    ("naflexvit_base_patch16_gap", dict(patchify_channels_last=False),
     "patchify_channels_last=False"),
])
def test_a_timm_option_keras_vit_lacks_is_refused_by_name(architecture, options, named, tmp_path):
    saved_by_timm(architecture, options, tmp_path / "theirs")
    with pytest.raises(LayoutError, match=f"needs .*{named}"):
        keras_vit.from_pretrained(str(tmp_path / "theirs"))


@pytest.mark.parametrize("fields, named", [
    (dict(position_embedding="sincos_2d"), "position_embedding='sincos_2d'"),
    (dict(activation="swiglu"), "SwiGLU MLPs"),
    (dict(layer_norm_epsilon=1e-5), "LayerNorms of epsilon 1e-05"),
    (dict(norm_layer="rms_norm"), "norm_layer='rms_norm'"),
    (dict(qk_norm=True), "qk_norm or grouped-query attention"),
    (dict(num_kv_heads=1), "qk_norm or grouped-query attention"),
    (dict(attention_layer="differential"), "differential attention or parallel blocks"),
    (dict(parallel_blocks=True), "differential attention or parallel blocks"),
])
def test_a_naflex_model_timm_cannot_express_is_refused_before_writing(fields, named, tmp_path):
    model = keras_vit.vit("Ti/16", image_size=32, patch_size=PATCH, num_classes=5,
                          classifier="gap", class_token=False, **fields)
    with pytest.raises(LayoutError, match=f"cannot be written as timm's NaFlexVit.*{named}"):
        keras_vit.save_pretrained(native.NaFlexViT(model), tmp_path / "ours", format="timm")
    assert not list(tmp_path.iterdir())

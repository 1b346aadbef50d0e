"""Tests of `keras_vit.weights.checkpoint` and `keras_vit.weights.pretrained`: reading and writing
the original `.npz` checkpoints, all offline, with files the tests write themselves.

The expected key sets and shapes are written out by hand from the released files (e.g.
gs://vit_models/imagenet21k/ViT-B_16.npz, read by google-research/vision_transformer's
vit_jax/checkpoint.py `load`), and the
files "in the original layout" are produced by a mapping written here (not by
`keras_vit.weights.checkpoint.checkpoint_key`), so that these tests check the package against the
original format rather than against itself.
"""

import logging
import os
import pickle
import re
import sys
import zipfile

import numpy as np
import pytest


import keras  # noqa: E402

import keras_vit  # noqa: E402
import numpy_reference  # noqa: E402
from keras_vit.weights import checkpoint, pretrained  # noqa: E402
from keras_vit.weights.checkpoint import CheckpointError, load_npz, save_npz  # noqa: E402
# Importing model_fixtures also turns TF32 off on Ampere+ GPUs (float32 must mean float32).
from model_fixtures import TINY_VIT, assign_reference_weights, keras_forward  # noqa: E402
from train_fixtures import REPO  # noqa: E402

ATOL = 1e-5
POS_KEY = "Transformer/posembed_input/pos_embedding"
HEAD_KEYS = ("head/kernel", "head/bias")


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def small_vit(image_size=32, **kwargs):
    """A 2-layer ViT of width 24 (3 heads of 8) on 8x8 patches; 32x32 -> 4x4 grid."""
    config = dict(TINY_VIT, patch_size=8, num_classes=5)
    config.update(kwargs)
    return keras_vit.vit("B/16", image_size=image_size, **config)


def small_hybrid(**kwargs):
    """R26 (2, 2, 2, 2) stem + a 1-layer ViT of width 24; 64x64 -> 2x2 grid."""
    config = dict(TINY_VIT, image_size=64, num_layers=1, num_classes=5)
    config.update(kwargs)
    return keras_vit.vit("R26+S/32", **config)


def snapshot(model):
    """{variable path: numpy copy} of every weight."""
    return {v.path: np.array(keras.ops.convert_to_numpy(v.value)) for v in model.weights}


def value_of(model, path):
    for variable in model.weights:
        if variable.path == path:
            return np.array(keras.ops.convert_to_numpy(variable.value))
    raise KeyError(path)


def images_for(size, seed=0, batch=2):
    rng = np.random.default_rng(seed)
    height, width = (size, size) if isinstance(size, int) else size
    return rng.uniform(-1.0, 1.0, (batch, height, width, 3)).astype(np.float32)


def npz_shapes(path):
    """{key: (shape, dtype)} of an .npz, read from the .npy headers only (no data)."""
    shapes = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            assert info.filename.endswith(".npy"), info.filename
            with archive.open(info) as handle:
                version = np.lib.format.read_magic(handle)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(handle)
            shapes[info.filename[:-len(".npy")]] = (tuple(shape), np.dtype(dtype))
    return shapes


def read_arrays(path):
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


# Keras variable path -> key of the original (Flax) checkpoint, written independently of
# keras_vit.weights.checkpoint.checkpoint_key: every variable must match exactly one rule.
_ORIGINAL_NAMES = [
    (r"resnet_root/conv_root/kernel", "conv_root/kernel"),
    (r"resnet_root/gn_root/gamma", "gn_root/scale"),
    (r"resnet_root/gn_root/beta", "gn_root/bias"),
    (r"(block\d+/unit\d+/conv(?:1|2|3|_proj))/kernel", r"\1/kernel"),
    (r"(block\d+/unit\d+/gn(?:1|2|3|_proj))/gamma", r"\1/scale"),
    (r"(block\d+/unit\d+/gn(?:1|2|3|_proj))/beta", r"\1/bias"),
    (r"embedding/(kernel|bias)", r"embedding/\1"),
    (r"cls/cls", "cls"),
    (r"posembed_input/pos_embedding", POS_KEY),
    (r"(encoderblock_\d+/LayerNorm_[02])/gamma", r"Transformer/\1/scale"),
    (r"(encoderblock_\d+/LayerNorm_[02])/beta", r"Transformer/\1/bias"),
    (r"(encoderblock_\d+/MultiHeadDotProductAttention_1/(?:query|key|value|out)/(?:kernel|bias))",
     r"Transformer/\1"),
    (r"(encoderblock_\d+/MlpBlock_3/Dense_[01]/(?:kernel|bias))", r"Transformer/\1"),
    (r"encoder_norm/gamma", "Transformer/encoder_norm/scale"),
    (r"encoder_norm/beta", "Transformer/encoder_norm/bias"),
    (r"(pre_logits|head)/(kernel|bias)", r"\1/\2"),
]
_GROUP_NORM_KEY = re.compile(r"(^|/)gn(_root|_proj|1|2|3)/(scale|bias)$")


def original_key(keras_path):
    keys = [match.expand(template) for pattern, template in _ORIGINAL_NAMES
            for match in [re.fullmatch(pattern, keras_path)] if match]
    assert len(keys) == 1, f"{keras_path!r} maps to {keys}"
    return keys[0]


def original_layout(keras_weights, num_heads, group_norm_4d=False):
    """Keras-path weights -> {original key: float32 array in the original (Flax) layout}:
    attention q/k/v kernels (D, heads, D/heads), their biases (heads, D/heads), the output
    kernel (heads, D/heads, D); optionally GroupNorm parameters as (1, 1, 1, C) (old files)."""
    arrays = {}
    for path, value in keras_weights.items():
        key = original_key(path)
        value = np.asarray(value, np.float32)
        if "/MultiHeadDotProductAttention_1/" in key:
            hidden = value.shape[-1]
            head_dim = hidden // num_heads
            if key.endswith("/out/kernel"):
                value = value.reshape(num_heads, head_dim, hidden)
            elif key.endswith("/out/bias"):
                pass
            elif key.endswith("/kernel"):
                value = value.reshape(value.shape[0], num_heads, head_dim)
            else:
                value = value.reshape(num_heads, head_dim)
        elif group_norm_4d and _GROUP_NORM_KEY.search(key):
            value = value.reshape(1, 1, 1, -1)
        arrays[key] = value
    assert len(arrays) == len(keras_weights)
    return arrays


def write_npz(path, arrays):
    np.savez(path, **arrays)
    return path


def assert_same_weights(model, expected, skip=()):
    got = snapshot(model)
    for path, value in expected.items():
        if path in skip:
            continue
        np.testing.assert_array_equal(got[path], np.asarray(value, np.float32), err_msg=path)


# ----------------------------------------------------------------------------------------------
# Round trip save_npz -> load_npz
# ----------------------------------------------------------------------------------------------

ROUND_TRIP_CASES = {
    "token": (small_vit, {}, 32),
    "gap": (small_vit, dict(classifier="gap"), 32),
    "representation": (small_vit, dict(representation_size=16), 32),
    "hybrid": (small_hybrid, {}, 64),
}


@pytest.mark.parametrize("case", list(ROUND_TRIP_CASES))
def test_round_trip_gives_identical_outputs(case, tmp_path):
    build, kwargs, size = ROUND_TRIP_CASES[case]
    source = build(**kwargs)
    weights = assign_reference_weights(source, np.random.default_rng(1))
    images = images_for(size)
    want = keras_forward(source, images)
    path = tmp_path / "model.npz"
    assert save_npz(source, path) == str(path)

    target = build(**kwargs)
    assign_reference_weights(target, np.random.default_rng(2))
    assert np.max(np.abs(keras_forward(target, images) - want)) > 1e-3  # the load must matter
    report = load_npz(target, path)

    assert report["missing"] == report["unexpected"] == report["mismatched"] == []
    assert len(report["loaded"]) == len(target.weights)
    assert_same_weights(target, weights)
    np.testing.assert_array_equal(keras_forward(target, images), want)


# Files written by the current vit_jax code: Flax Linen numbers each sub-module class on its own,
# so a block holds LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0.
RELEASED_TO_LINEN = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
                     "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}


def linen_named(arrays, blocks=("encoderblock_0", "encoderblock_1")):
    """The arrays with the given blocks' layers renamed as the current vit_jax code names them."""
    renamed = {}
    for key, value in arrays.items():
        parts = key.split("/")
        if parts[0] == "Transformer" and parts[1] in blocks:
            parts[2] = RELEASED_TO_LINEN.get(parts[2], parts[2])
        renamed["/".join(parts)] = value
    return renamed


def test_file_of_the_current_vit_jax_code_loads_identically(tmp_path):
    source = small_vit()
    weights = assign_reference_weights(source, np.random.default_rng(3))
    images = images_for(32)
    want = keras_forward(source, images)
    released = checkpoint.read_npz(save_npz(source, tmp_path / "released.npz"))
    linen = linen_named(released)
    assert "Transformer/encoderblock_1/MlpBlock_0/Dense_1/kernel" in linen
    assert not any("MlpBlock_3" in key or "LayerNorm_2" in key for key in linen)
    np.savez(tmp_path / "linen.npz", **linen)

    target = small_vit()
    assign_reference_weights(target, np.random.default_rng(4))
    report = load_npz(target, tmp_path / "linen.npz")
    assert report["missing"] == report["unexpected"] == report["mismatched"] == []
    assert_same_weights(target, weights)
    np.testing.assert_array_equal(keras_forward(target, images), want)
    # Saving writes the released naming, whichever naming was read.
    again = checkpoint.read_npz(save_npz(target, tmp_path / "again.npz"))
    assert sorted(again) == sorted(released)


@pytest.mark.parametrize("mix", ["one block each", "both in one block"])
def test_file_mixing_the_two_namings_is_an_error(mix, tmp_path):
    released = checkpoint.model_arrays(small_vit())
    if mix == "one block each":
        mixed = linen_named(released, blocks=("encoderblock_0",))
    else:  # the MLP of block 0 twice, under both names: which one is meant is a guess
        prefix = "Transformer/encoderblock_0/"
        mixed = dict(released, **{
            key.replace("/MlpBlock_3/", "/MlpBlock_0/"): value
            for key, value in released.items() if key.startswith(prefix + "MlpBlock_3/")})
    np.savez(tmp_path / "mixed.npz", **mixed)
    target = small_vit()
    before = snapshot(target)
    for strict in (True, False):
        with pytest.raises(CheckpointError, match="both as the current vit_jax code .*MlpBlock_0"
                                                  ".* and as the released files do .*MlpBlock_3"):
            load_npz(target, tmp_path / "mixed.npz", strict=strict)
    assert_same_weights(target, before)


# ----------------------------------------------------------------------------------------------
# The saved key set and shapes of a released file (imagenet21k/ViT-B_16.npz)
# ----------------------------------------------------------------------------------------------

def expected_vit_b16_transformer(tokens=197, num_classes=1000):
    """ViT-B/16: D=768, 12 heads of 64, MLP 3072, 12 blocks (paper Table 1); the key names of
    vit_jax/models_vit.py as the released files spell them."""
    expected = {
        "cls": (1, 1, 768),
        "Transformer/posembed_input/pos_embedding": (1, tokens, 768),
        "Transformer/encoder_norm/scale": (768,),
        "Transformer/encoder_norm/bias": (768,),
        "head/kernel": (768, num_classes),
        "head/bias": (num_classes,),
    }
    for i in range(12):
        block = f"Transformer/encoderblock_{i}"
        attention = f"{block}/MultiHeadDotProductAttention_1"
        expected.update({
            f"{block}/LayerNorm_0/scale": (768,),
            f"{block}/LayerNorm_0/bias": (768,),
            f"{attention}/query/kernel": (768, 12, 64),
            f"{attention}/query/bias": (12, 64),
            f"{attention}/key/kernel": (768, 12, 64),
            f"{attention}/key/bias": (12, 64),
            f"{attention}/value/kernel": (768, 12, 64),
            f"{attention}/value/bias": (12, 64),
            f"{attention}/out/kernel": (12, 64, 768),
            f"{attention}/out/bias": (768,),
            f"{block}/LayerNorm_2/scale": (768,),
            f"{block}/LayerNorm_2/bias": (768,),
            f"{block}/MlpBlock_3/Dense_0/kernel": (768, 3072),
            f"{block}/MlpBlock_3/Dense_0/bias": (3072,),
            f"{block}/MlpBlock_3/Dense_1/kernel": (3072, 768),
            f"{block}/MlpBlock_3/Dense_1/bias": (768,),
        })
    return expected


def expected_r50_stem():
    """R50 of R50+ViT-B/16: root, then stages of (3, 4, 9) units of widths 64, 128, 256."""
    expected = {
        "conv_root/kernel": (7, 7, 3, 64),
        "gn_root/scale": (64,),
        "gn_root/bias": (64,),
    }
    in_channels = 64
    for stage, (units, width) in enumerate([(3, 64), (4, 128), (9, 256)], start=1):
        for unit in range(1, units + 1):
            prefix = f"block{stage}/unit{unit}"
            if unit == 1:
                expected.update({
                    f"{prefix}/conv_proj/kernel": (1, 1, in_channels, 4 * width),
                    f"{prefix}/gn_proj/scale": (4 * width,),
                    f"{prefix}/gn_proj/bias": (4 * width,),
                })
            expected.update({
                f"{prefix}/conv1/kernel": (1, 1, in_channels, width),
                f"{prefix}/gn1/scale": (width,),
                f"{prefix}/gn1/bias": (width,),
                f"{prefix}/conv2/kernel": (3, 3, width, width),
                f"{prefix}/gn2/scale": (width,),
                f"{prefix}/gn2/bias": (width,),
                f"{prefix}/conv3/kernel": (1, 1, width, 4 * width),
                f"{prefix}/gn3/scale": (4 * width,),
                f"{prefix}/gn3/bias": (4 * width,),
            })
            in_channels = 4 * width
    return expected


def check_saved_layout(model, path, expected, total_parameters):
    save_npz(model, path)
    shapes = npz_shapes(path)
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    assert not missing and not extra, f"missing {missing}, extra {extra}"
    wrong = {key: (shape, expected[key]) for key, (shape, _) in shapes.items()
             if shape != expected[key]}
    assert not wrong, f"shape (saved, expected): {wrong}"
    assert {dtype for _, dtype in shapes.values()} == {np.dtype("float32")}
    # The parameter count of the original model (see test_variants.PINNED_PARAMS).
    assert sum(int(np.prod(shape)) for shape, _ in shapes.values()) == total_parameters
    with np.load(path, allow_pickle=False) as archive:  # a plain numpy archive
        assert sorted(archive.files) == sorted(expected)


def test_saved_vit_b16_has_the_original_keys_and_shapes(tmp_path):
    expected = {
        "embedding/kernel": (16, 16, 3, 768),
        "embedding/bias": (768,),
        **expected_vit_b16_transformer(),
    }
    assert len(expected) == 4 + 12 * 16 + 2 + 2
    check_saved_layout(keras_vit.vit("B/16"), tmp_path / "b16.npz", expected, 86_567_656)


def test_saved_r50_vit_b16_has_the_original_keys_and_shapes(tmp_path):
    expected = {
        **expected_r50_stem(),
        "embedding/kernel": (1, 1, 1024, 768),
        "embedding/bias": (768,),
        **expected_vit_b16_transformer(),
    }
    # conv_proj/gn_proj only in the first unit of each stage.
    assert sorted(k for k in expected if "conv_proj" in k) == [
        "block1/unit1/conv_proj/kernel", "block2/unit1/conv_proj/kernel",
        "block3/unit1/conv_proj/kernel"]
    check_saved_layout(keras_vit.vit("R50+B/16"), tmp_path / "r50_b16.npz", expected,
                       98_659_112)


# ----------------------------------------------------------------------------------------------
# Files in the original layout against the numpy reference
# ----------------------------------------------------------------------------------------------

def test_original_layout_file_matches_numpy_reference_vit(tmp_path):
    template = small_vit()
    weights = assign_reference_weights(template, np.random.default_rng(11))
    arrays = original_layout(weights, num_heads=3)
    # The layout the test writes is the released files' one: q/k/v kernels (D, heads, D/heads).
    attention = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1"
    assert arrays[f"{attention}/query/kernel"].shape == (24, 3, 8)
    assert arrays[f"{attention}/value/bias"].shape == (3, 8)
    assert arrays[f"{attention}/out/kernel"].shape == (3, 8, 24)
    assert arrays[f"{attention}/out/bias"].shape == (24,)
    assert arrays["cls"].shape == (1, 1, 24)
    assert arrays["Transformer/encoderblock_0/LayerNorm_2/scale"].shape == (24,)
    path = write_npz(tmp_path / "original.npz", arrays)

    model = small_vit()
    assign_reference_weights(model, np.random.default_rng(12))
    images = images_for(32, seed=13)
    want = numpy_reference.vit_forward(weights, images, num_heads=3)
    assert np.std(want) > 0.1
    assert np.max(np.abs(keras_forward(model, images) - want)) > 1e-2
    load_npz(model, path)
    diff = np.max(np.abs(keras_forward(model, images) - want))
    assert diff <= ATOL, f"max |keras - numpy| = {diff:.3g}"


@pytest.fixture(scope="module")
def hybrid_original(tmp_path_factory):
    """(weights, path of the original-layout file, model loaded from it, images, reference)."""
    directory = tmp_path_factory.mktemp("hybrid")
    template = small_hybrid()
    weights = assign_reference_weights(template, np.random.default_rng(21))
    arrays = original_layout(weights, num_heads=3)
    assert arrays["gn_root/scale"].shape == (64,)
    assert arrays["block3/unit1/gn_proj/bias"].shape == (1024,)
    path = write_npz(directory / "hybrid.npz", arrays)
    model = small_hybrid()
    assign_reference_weights(model, np.random.default_rng(22))
    images = images_for(64, seed=23)
    want = numpy_reference.vit_forward(weights, images, num_heads=3)
    assert np.max(np.abs(keras_forward(model, images) - want)) > 1e-2
    load_npz(model, path)
    return weights, path, model, images, want


def test_original_layout_file_matches_numpy_reference_hybrid(hybrid_original):
    weights, _, model, images, want = hybrid_original
    assert np.std(want) > 0.1
    assert_same_weights(model, weights)
    diff = np.max(np.abs(keras_forward(model, images) - want))
    assert diff <= ATOL, f"max |keras - numpy| = {diff:.3g}"


def test_old_hybrid_file_with_4d_group_norm_loads_identically(hybrid_original, tmp_path):
    weights, _, loaded, images, _ = hybrid_original
    arrays = original_layout(weights, num_heads=3, group_norm_4d=True)
    reshaped = [key for key, value in arrays.items() if value.shape[:3] == (1, 1, 1)
                and value.ndim == 4 and "gn" in key]
    # gn_root (2) + per unit gn1..3 (6) + gn_proj in the 4 first units (2 each).
    assert len(reshaped) == 2 + 8 * 6 + 4 * 2
    assert arrays["block2/unit1/gn_proj/scale"].shape == (1, 1, 1, 512)
    path = write_npz(tmp_path / "old_hybrid.npz", arrays)

    model = small_hybrid()
    assign_reference_weights(model, np.random.default_rng(24))
    load_npz(model, path)
    expected = snapshot(loaded)
    got = snapshot(model)
    assert got.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
    np.testing.assert_array_equal(keras_forward(model, images), keras_forward(loaded, images))


# ----------------------------------------------------------------------------------------------
# Position-embedding resizing
# ----------------------------------------------------------------------------------------------

def ramp_grid(rows, columns, prefix_row=(7.0, -3.0, 2.5)):
    """Embeddings [1, 1 + rows*columns, 3]: channel 0 = column index, 1 = row index,
    2 = row * column; a class row in front."""
    r, c = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(columns, dtype=np.float64),
                       indexing="ij")
    grid = np.stack([c, r, r * c], axis=-1).reshape(rows * columns, 3)
    return np.concatenate([np.asarray([prefix_row]), grid])[None]


def test_resize_two_wide_grid_to_three_gives_half_weights():
    embeddings = ramp_grid(2, 2).astype(np.float32)
    resized = checkpoint.resize_position_embeddings(embeddings, (3, 3))
    assert resized.shape == (1, 10, 3)
    assert resized.dtype == np.float32
    np.testing.assert_array_equal(resized[0, 0], [7.0, -3.0, 2.5])  # class row kept
    grid = resized[0, 1:].reshape(3, 3, 3)
    np.testing.assert_allclose(grid[..., 0], [[0, 0.5, 1]] * 3, atol=1e-7)
    np.testing.assert_allclose(grid[..., 1], [[0] * 3, [0.5] * 3, [1] * 3], atol=1e-7)
    np.testing.assert_allclose(grid[..., 2], np.outer([0, 0.5, 1], [0, 0.5, 1]), atol=1e-7)


def test_resize_to_non_square_grid():
    resized = checkpoint.resize_position_embeddings(ramp_grid(2, 2), (3, 5))
    assert resized.shape == (1, 16, 3)
    np.testing.assert_array_equal(resized[0, 0], [7.0, -3.0, 2.5])
    grid = resized[0, 1:].reshape(3, 5, 3)
    columns, rows = [0, 0.25, 0.5, 0.75, 1], [0, 0.5, 1]
    np.testing.assert_allclose(grid[..., 0], np.broadcast_to(columns, (3, 5)), atol=1e-12)
    np.testing.assert_allclose(grid[..., 1], np.broadcast_to(np.c_[rows], (3, 5)), atol=1e-12)
    np.testing.assert_allclose(grid[..., 2], np.outer(rows, columns), atol=1e-12)


def test_resize_larger_grid_keeps_corners_and_is_bilinear():
    # 3x3 -> 5x4: new positions rows i*2/4, columns j*2/3 on the old index grid.
    resized = checkpoint.resize_position_embeddings(ramp_grid(3, 3), (5, 4))
    grid = resized[0, 1:].reshape(5, 4, 3)
    rows, columns = np.arange(5) * 2 / 4, np.arange(4) * 2 / 3
    np.testing.assert_allclose(grid[..., 0], np.broadcast_to(columns, (5, 4)), atol=1e-12)
    np.testing.assert_allclose(grid[..., 1], np.broadcast_to(np.c_[rows], (5, 4)), atol=1e-12)
    np.testing.assert_allclose(grid[..., 2], np.outer(rows, columns), atol=1e-12)


def test_resize_to_same_grid_is_identity():
    rng = np.random.default_rng(3)
    embeddings = rng.standard_normal((1, 17, 6)).astype(np.float32)
    np.testing.assert_array_equal(
        checkpoint.resize_position_embeddings(embeddings, (4, 4)), embeddings)
    gap = rng.standard_normal((1, 16, 6)).astype(np.float32)
    np.testing.assert_array_equal(
        checkpoint.resize_position_embeddings(gap, (4, 4), num_prefix_tokens=0), gap)
    # Documented: the leading 1 may be left out.
    np.testing.assert_array_equal(
        checkpoint.resize_position_embeddings(embeddings[0], (4, 4)), embeddings[0])


def test_resize_without_prefix_tokens():
    embeddings = ramp_grid(2, 2)[:, 1:]  # no class row: a GAP model's embeddings
    resized = checkpoint.resize_position_embeddings(embeddings, (3, 3), num_prefix_tokens=0)
    assert resized.shape == (1, 9, 3)
    np.testing.assert_allclose(resized[0].reshape(3, 3, 3)[..., 0], [[0, 0.5, 1]] * 3,
                               atol=1e-12)


def test_resize_non_square_source_needs_old_grid():
    embeddings = ramp_grid(2, 3)  # 1 + 6 rows: not a square grid
    with pytest.raises(ValueError, match="old_grid"):
        checkpoint.resize_position_embeddings(embeddings, (4, 4))
    resized = checkpoint.resize_position_embeddings(embeddings, (3, 5), old_grid=(2, 3))
    grid = resized[0, 1:].reshape(3, 5, 3)
    np.testing.assert_allclose(grid[..., 0], np.broadcast_to([0, 0.5, 1, 1.5, 2], (3, 5)),
                               atol=1e-12)
    np.testing.assert_allclose(grid[..., 1], np.broadcast_to(np.c_[[0, 0.5, 1]], (3, 5)),
                               atol=1e-12)


def bilinear_align_corners(grid, rows, columns):
    """Independent resize for the test: np.interp along each axis with aligned corners."""
    old_rows, old_columns, depth = grid.shape
    row_positions = np.linspace(0, old_rows - 1, rows)
    column_positions = np.linspace(0, old_columns - 1, columns)
    by_rows = np.stack([[np.interp(row_positions, np.arange(old_rows), grid[:, c, d])
                         for d in range(depth)] for c in range(old_columns)])  # [C, D, rows]
    by_rows = by_rows.transpose(2, 0, 1)  # [rows, old_columns, D]
    out = np.stack([[np.interp(column_positions, np.arange(old_columns), by_rows[r, :, d])
                     for d in range(depth)] for r in range(rows)])  # [rows, D, columns]
    return out.transpose(0, 2, 1)


def test_loading_224_checkpoint_into_384_model_resizes_position_embeddings(tmp_path):
    config = dict(TINY_VIT, num_layers=1)
    source = keras_vit.vit("B/16", image_size=224, **config)
    weights = assign_reference_weights(source, np.random.default_rng(31))
    path = tmp_path / "b16_224.npz"
    save_npz(source, path)

    model = keras_vit.vit("B/16", image_size=384, **config)
    assign_reference_weights(model, np.random.default_rng(32))
    report = load_npz(model, path)
    assert report["resized"] == [POS_KEY]

    original = weights["posembed_input/pos_embedding"]
    assert original.shape == (1, 197, 24)
    resized = value_of(model, "posembed_input/pos_embedding")
    assert resized.shape == (1, 577, 24)
    np.testing.assert_array_equal(resized[0, 0], original[0, 0].astype(np.float32))
    old_grid = original[0, 1:].reshape(14, 14, 24)
    new_grid = resized[0, 1:].reshape(24, 24, 24)
    for (i, j), (k, m) in [((0, 0), (0, 0)), ((0, 13), (0, 23)), ((13, 0), (23, 0)),
                           ((13, 13), (23, 23))]:
        np.testing.assert_allclose(new_grid[k, m], old_grid[i, j], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(new_grid, bilinear_align_corners(old_grid, 24, 24), atol=1e-6)
    # Everything else loaded as is.
    assert_same_weights(model, weights, skip={"posembed_input/pos_embedding"})
    logits = keras_forward(model, images_for(384, batch=1))
    assert logits.shape == (1, 1000) and np.all(np.isfinite(logits))


def test_loading_into_non_square_model_resizes_to_its_grid(tmp_path):
    source = small_vit()  # 4x4 grid
    weights = assign_reference_weights(source, np.random.default_rng(33))
    path = tmp_path / "square.npz"
    save_npz(source, path)
    model = small_vit(image_size=(32, 64))  # 4x8 grid
    load_npz(model, path)
    resized = value_of(model, "posembed_input/pos_embedding")
    assert resized.shape == (1, 33, 24)
    old_grid = weights["posembed_input/pos_embedding"][0, 1:].reshape(4, 4, 24)
    np.testing.assert_allclose(resized[0, 1:].reshape(4, 8, 24),
                               bilinear_align_corners(old_grid, 4, 8), atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Head policy
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    """(weights, path): a small 5-class class-token ViT with random weights."""
    source = small_vit()
    weights = assign_reference_weights(source, np.random.default_rng(41))
    path = tmp_path_factory.mktemp("token") / "token.npz"
    save_npz(source, path)
    return weights, path


def test_different_num_classes_starts_a_zero_head(token_file):
    weights, path = token_file
    model = small_vit(num_classes=7)
    assign_reference_weights(model, np.random.default_rng(42))
    report = load_npz(model, path)
    assert sorted(report["new_head"]) == sorted(HEAD_KEYS)
    np.testing.assert_array_equal(value_of(model, "head/kernel"), np.zeros((24, 7)))
    np.testing.assert_array_equal(value_of(model, "head/bias"), np.zeros(7))
    assert_same_weights(model, weights, skip=HEAD_KEYS)


def test_new_head_zeros_the_head_even_when_it_fits(token_file):
    weights, path = token_file
    model = small_vit()
    assign_reference_weights(model, np.random.default_rng(43))
    load_npz(model, path, new_head=True)
    np.testing.assert_array_equal(value_of(model, "head/kernel"), np.zeros((24, 5)))
    np.testing.assert_array_equal(value_of(model, "head/bias"), np.zeros(5))
    assert_same_weights(model, weights, skip=HEAD_KEYS)
    # Without new_head the same file's head is used.
    load_npz(model, path)
    assert_same_weights(model, weights)


def test_pre_logits_file_into_model_with_representation(tmp_path):
    source = small_vit(representation_size=16)
    weights = assign_reference_weights(source, np.random.default_rng(44))
    path = tmp_path / "pre_logits.npz"
    save_npz(source, path)
    assert npz_shapes(path)["pre_logits/kernel"][0] == (24, 16)

    model = small_vit(representation_size=16)
    assign_reference_weights(model, np.random.default_rng(45))
    load_npz(model, path)
    assert_same_weights(model, weights)  # pre_logits and head included
    images = images_for(32)
    np.testing.assert_allclose(
        keras_forward(model, images), numpy_reference.vit_forward(weights, images, num_heads=3),
        atol=ATOL)


def test_pre_logits_file_into_model_without_representation_is_dropped(tmp_path):
    source = small_vit(representation_size=16)
    weights = assign_reference_weights(source, np.random.default_rng(46))
    path = tmp_path / "pre_logits.npz"
    save_npz(source, path)

    model = small_vit()
    assign_reference_weights(model, np.random.default_rng(47))
    report = load_npz(model, path)  # strict: pre_logits is not an error
    assert report["unexpected"] == [] and report["missing"] == []
    assert not any("pre_logits" in v.path for v in model.weights)
    # The file's head (16, 5) follows pre_logits: a new head for the model's (24, 5).
    np.testing.assert_array_equal(value_of(model, "head/kernel"), np.zeros((24, 5)))
    np.testing.assert_array_equal(value_of(model, "head/bias"), np.zeros(5))
    assert_same_weights(model, weights, skip=HEAD_KEYS + ("pre_logits/kernel",
                                                          "pre_logits/bias"))


def test_dropping_pre_logits_also_drops_a_head_of_matching_shape(tmp_path):
    """With representation_size == hidden size (as in the real ImageNet-21k files, 768 for B)
    the file's head has the model's shape, but it was trained on tanh(pre_logits(x)), not on
    x: once pre_logits is dropped the head must start from zeros, not be reused."""
    source = small_vit(representation_size=24)
    weights = assign_reference_weights(source, np.random.default_rng(48))
    path = tmp_path / "pre_logits_24.npz"
    save_npz(source, path)

    model = small_vit()
    assign_reference_weights(model, np.random.default_rng(49))
    load_npz(model, path)
    np.testing.assert_array_equal(value_of(model, "head/kernel"), np.zeros((24, 5)))
    np.testing.assert_array_equal(value_of(model, "head/bias"), np.zeros(5))
    assert_same_weights(model, weights, skip=HEAD_KEYS + ("pre_logits/kernel",
                                                          "pre_logits/bias"))


def test_file_with_zero_head_like_imagenet21k_loads(tmp_path):
    source = small_vit(representation_size=24, num_classes=11)
    weights = assign_reference_weights(source, np.random.default_rng(50))
    for variable in source.weights:
        if variable.path in HEAD_KEYS:
            variable.assign(np.zeros(variable.shape, np.float32))
            weights[variable.path] = np.zeros(variable.shape)
    path = tmp_path / "zero_head.npz"
    save_npz(source, path)
    assert not np.any(read_arrays(path)["head/kernel"])

    for num_classes in (11, 5):
        model = small_vit(representation_size=24, num_classes=num_classes)
        assign_reference_weights(model, np.random.default_rng(51))
        report = load_npz(model, path)
        assert report["missing"] == report["unexpected"] == report["mismatched"] == []
        np.testing.assert_array_equal(value_of(model, "head/kernel"),
                                      np.zeros((24, num_classes)))
        np.testing.assert_array_equal(value_of(model, "head/bias"), np.zeros(num_classes))
        assert_same_weights(model, weights, skip=HEAD_KEYS)  # pre_logits used


def test_include_top_false_loads_a_file_with_a_head(token_file):
    weights, path = token_file
    model = small_vit(include_top=False)
    assign_reference_weights(model, np.random.default_rng(52))
    report = load_npz(model, path)
    assert report["missing"] == report["unexpected"] == report["mismatched"] == []
    assert_same_weights(model, weights, skip=HEAD_KEYS)
    images = images_for(32)
    want = numpy_reference.vit_forward(weights, images, num_heads=3, include_top=False)
    got = keras_forward(model, images)
    assert got.shape == (2, 24)
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_file_without_a_head_gives_a_zero_head(tmp_path):
    source = small_vit(include_top=False)
    weights = assign_reference_weights(source, np.random.default_rng(53))
    path = tmp_path / "no_head.npz"
    save_npz(source, path)
    assert not any(key.startswith("head/") for key in npz_shapes(path))
    model = small_vit()
    assign_reference_weights(model, np.random.default_rng(54))
    load_npz(model, path)
    np.testing.assert_array_equal(value_of(model, "head/kernel"), np.zeros((24, 5)))
    assert_same_weights(model, weights)


# ----------------------------------------------------------------------------------------------
# GAP files
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gap_file(tmp_path_factory):
    source = small_vit(classifier="gap")
    weights = assign_reference_weights(source, np.random.default_rng(61))
    path = tmp_path_factory.mktemp("gap") / "gap.npz"
    save_npz(source, path)
    return weights, path


def test_gap_file_has_no_class_token_and_loads_into_gap_model(gap_file):
    weights, path = gap_file
    shapes = npz_shapes(path)
    assert "cls" not in shapes
    assert shapes[POS_KEY][0] == (1, 16, 24)  # no class-token row
    model = small_vit(classifier="gap")
    assign_reference_weights(model, np.random.default_rng(62))
    load_npz(model, path)
    assert_same_weights(model, weights)
    images = images_for(32)
    np.testing.assert_allclose(
        keras_forward(model, images),
        numpy_reference.vit_forward(weights, images, num_heads=3, classifier="gap"),
        atol=ATOL)


def test_gap_file_resizes_without_a_class_row(gap_file):
    weights, path = gap_file
    model = small_vit(classifier="gap", image_size=48)  # 6x6 grid
    load_npz(model, path)
    resized = value_of(model, "posembed_input/pos_embedding")
    assert resized.shape == (1, 36, 24)
    old_grid = weights["posembed_input/pos_embedding"][0].reshape(4, 4, 24)
    np.testing.assert_allclose(resized[0].reshape(6, 6, 24),
                               bilinear_align_corners(old_grid, 6, 6), atol=1e-6)


def test_token_file_into_gap_model_is_an_error(token_file):
    _, path = token_file
    model = small_vit(classifier="gap")
    before = snapshot(model)
    with pytest.raises(CheckpointError, match="pos_embedding"):
        load_npz(model, path)
    assert_same_weights(model, before)


def test_gap_file_into_token_model_is_an_error(gap_file):
    _, path = gap_file
    model = small_vit()
    with pytest.raises(CheckpointError, match="cls"):
        load_npz(model, path)


# ----------------------------------------------------------------------------------------------
# Strict and non-strict loading
# ----------------------------------------------------------------------------------------------

MISSING = "Transformer/encoder_norm/bias"
UNEXPECTED = "Transformer/encoderblock_9/extra/kernel"
MISMATCHED = "embedding/bias"


@pytest.fixture()
def broken_file(token_file, tmp_path):
    """The token file with one key removed, one added and one of the wrong shape."""
    _, path = token_file
    arrays = read_arrays(path)
    del arrays[MISSING]
    arrays[UNEXPECTED] = np.ones((3, 3), np.float32)
    arrays[MISMATCHED] = np.ones((25,), np.float32)
    return arrays, write_npz(tmp_path / "broken.npz", arrays)


def test_strict_load_reports_all_problems_together_and_changes_nothing(broken_file):
    _, path = broken_file
    model = small_vit()
    assign_reference_weights(model, np.random.default_rng(71))
    before = snapshot(model)
    with pytest.raises(CheckpointError) as raised:
        load_npz(model, path)
    message = str(raised.value)
    for key in (MISSING, UNEXPECTED, MISMATCHED):
        assert key in message, f"{key} not named in: {message}"
    assert "missing" in message and "unexpected" in message
    assert "25" in message  # the mismatched shape is shown
    assert_same_weights(model, before)


def test_non_strict_load_loads_what_fits_and_logs_the_rest(broken_file, caplog):
    arrays, path = broken_file
    model = small_vit()
    assign_reference_weights(model, np.random.default_rng(72))
    before = snapshot(model)
    with caplog.at_level(logging.WARNING, logger="keras_vit.weights.checkpoint"):
        report = load_npz(model, path, strict=False)
    after = snapshot(model)
    query = "encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
    assert not np.array_equal(before[query], after[query])
    np.testing.assert_array_equal(
        after[query],
        arrays[f"Transformer/{query}"].reshape(24, 24))
    np.testing.assert_array_equal(after["embedding/kernel"], arrays["embedding/kernel"])
    np.testing.assert_array_equal(after["embedding/bias"], before["embedding/bias"])
    np.testing.assert_array_equal(after["encoder_norm/beta"], before["encoder_norm/beta"])
    np.testing.assert_array_equal(after["encoder_norm/gamma"],
                                  arrays["Transformer/encoder_norm/scale"])
    assert report["missing"] == [MISSING]
    assert report["unexpected"] == [UNEXPECTED]
    assert len(report["mismatched"]) == 1 and MISMATCHED in report["mismatched"][0]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings, "nothing was logged"
    text = "\n".join(r.getMessage() for r in warnings)
    for key in (MISSING, UNEXPECTED, MISMATCHED):
        assert key in text


def test_hybrid_file_into_plain_vit_is_an_error(hybrid_original):
    _, path, _, _, _ = hybrid_original
    model = small_vit(num_layers=1)
    before = snapshot(model)
    with pytest.raises(CheckpointError, match="conv_root/kernel"):
        load_npz(model, path)
    assert_same_weights(model, before)


# ----------------------------------------------------------------------------------------------
# Bad files
# ----------------------------------------------------------------------------------------------

_UNPICKLED = []


def _record_unpickling():
    _UNPICKLED.append(True)
    return "unpickled"


class _PickleBomb:
    def __reduce__(self):
        return (_record_unpickling, ())


def test_truncated_file_is_a_checkpoint_error(token_file, tmp_path):
    _, path = token_file
    data = path.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[:len(data) // 2])
    model = small_vit()
    before = snapshot(model)
    with pytest.raises(CheckpointError, match="truncated.npz"):
        load_npz(model, truncated)
    assert_same_weights(model, before)


def test_random_bytes_are_a_checkpoint_error(tmp_path):
    path = tmp_path / "noise.npz"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(CheckpointError):
        checkpoint.read_npz(path)
    with pytest.raises(CheckpointError):
        load_npz(small_vit(), path)


def test_single_array_npy_file_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "array.npy"
    np.save(path, np.ones((3, 4), np.float32))
    with pytest.raises(CheckpointError, match="single"):
        load_npz(small_vit(), path)


def test_npz_with_pickled_objects_is_refused_without_unpickling(token_file, tmp_path,
                                                                 monkeypatch):
    _, path = token_file
    arrays = read_arrays(path)
    bomb = tmp_path / "pickled.npz"
    np.savez(bomb, **arrays, payload=np.array([_PickleBomb()], dtype=object))
    _UNPICKLED.clear()

    def refuse(*args, **kwargs):
        raise AssertionError("the loader unpickled data")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    model = small_vit()
    before = snapshot(model)
    with pytest.raises(CheckpointError):
        load_npz(model, bomb)
    assert _UNPICKLED == []
    assert_same_weights(model, before)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_npz(small_vit(), tmp_path / "nothing_here.npz")


# ----------------------------------------------------------------------------------------------
# weights= in vit(), published names
# ----------------------------------------------------------------------------------------------

def _keras_home_at_import():
    try:
        from keras.src.backend.config import keras_home
        return keras_home()
    except ImportError:
        return os.path.join("~", ".keras")


def test_vit_weights_file_url_downloads_into_keras_home(token_file, tmp_path, monkeypatch):
    weights, path = token_file
    name = f"ckpt-{tmp_path.name}.npz"  # unique, so that cleaning up never hits a user file
    source = tmp_path / "source" / name
    source.parent.mkdir()
    source.write_bytes(path.read_bytes())
    home = tmp_path / "keras_home"
    home.mkdir()
    monkeypatch.setenv("KERAS_HOME", str(home))
    # Where the file would land if KERAS_HOME were ignored (cleaned up below).
    elsewhere = [os.path.join(base, "models", "keras_vit", name)
                 for base in (os.path.expanduser(_keras_home_at_import()),
                              os.path.join("/tmp", ".keras"))]
    existed = {p: os.path.exists(p) for p in elsewhere}
    try:
        model = small_vit(weights="file://" + str(source))
        cached = home / "models" / "keras_vit" / name
        assert cached.is_file(), (
            f"not cached under $KERAS_HOME; found at "
            f"{[p for p in elsewhere if os.path.exists(p)]}")
        assert cached.read_bytes() == source.read_bytes()
        assert_same_weights(model, weights)
    finally:
        for p, was_there in existed.items():
            if not was_there and os.path.exists(p):
                os.remove(p)


def test_vit_weights_file_url_loads_the_file(token_file, tmp_path, monkeypatch):
    """The file:// download path, with the cache directory passed explicitly."""
    weights, path = token_file
    (tmp_path / "cache").mkdir()  # keras.utils.get_file falls back to /tmp/.keras otherwise
    calls = []
    real_resolve = pretrained.resolve_weights

    def resolve(weights_arg, variant, cache_dir=None):
        calls.append((weights_arg, variant))
        return real_resolve(weights_arg, variant, cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(pretrained, "resolve_weights", resolve)
    model = small_vit(weights="file://" + str(path))
    assert calls == [("file://" + str(path), "B/16")]
    assert (tmp_path / "cache" / "models" / "keras_vit" / path.name).is_file()
    assert_same_weights(model, weights)


def test_vit_weights_plain_path(token_file):
    weights, path = token_file
    assert_same_weights(small_vit(weights=str(path)), weights)
    assert_same_weights(small_vit(weights=path), weights)


def test_vit_weights_nonexistent_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        small_vit(weights=str(tmp_path / "missing.npz"))


def test_published_urls():
    bucket = "https://storage.googleapis.com/vit_models/"
    cases = {
        ("imagenet21k", "B/16"): "imagenet21k/ViT-B_16.npz",
        ("imagenet21k", "R50+B/16"): "imagenet21k/R50+ViT-B_16.npz",
        ("imagenet21k", "H/14"): "imagenet21k/ViT-H_14.npz",
        ("imagenet21k", "B/8"): "imagenet21k/ViT-B_8.npz",
        ("imagenet21k+imagenet2012", "L/32"): "imagenet21k+imagenet2012/ViT-L_32.npz",
        ("imagenet21k+imagenet2012-224", "B/16"): "imagenet21k+imagenet2012/ViT-B_16-224.npz",
    }
    for (name, variant), relative in cases.items():
        assert pretrained.published_url(name, variant) == bucket + relative, (name, variant)


def test_published_url_errors_name_the_options():
    with pytest.raises(ValueError) as raised:
        pretrained.published_url("imagenet22k", "B/16")
    assert "imagenet21k" in str(raised.value)
    assert "imagenet21k+imagenet2012" in str(raised.value)
    with pytest.raises(ValueError) as raised:
        pretrained.published_url("imagenet21k", "Ti/16")  # never published in that set
    assert "B/16" in str(raised.value) and "R50+B/16" in str(raised.value)
    with pytest.raises(ValueError, match="B/16"):
        pretrained.published_url("imagenet21k+imagenet2012", "R50+B/16")


def test_vit_with_unpublished_variant_is_a_value_error():
    with pytest.raises(ValueError, match="B/16"):
        keras_vit.vit("Ti/16", image_size=32, **TINY_VIT, weights="imagenet21k")


def test_published_names_download_with_distinct_cache_names(monkeypatch, tmp_path):
    """imagenet21k/ViT-B_16.npz and imagenet21k+imagenet2012/ViT-B_16.npz must not share a
    cache entry (checked without network by replacing keras.utils.get_file)."""
    calls = []

    def fake_get_file(fname=None, origin=None, **kwargs):
        calls.append((fname, origin))
        return str(tmp_path / fname)

    monkeypatch.setattr(keras.utils, "get_file", fake_get_file)
    first = pretrained.resolve_weights("imagenet21k", "B/16")
    second = pretrained.resolve_weights("imagenet21k+imagenet2012", "B/16")
    bucket = "https://storage.googleapis.com/vit_models/"
    assert [origin for _, origin in calls] == [
        bucket + "imagenet21k/ViT-B_16.npz", bucket + "imagenet21k+imagenet2012/ViT-B_16.npz"]
    assert first != second
    assert all(fname.endswith("ViT-B_16.npz") and "/" not in fname for fname, _ in calls)


# ----------------------------------------------------------------------------------------------
# save_npz is atomic
# ----------------------------------------------------------------------------------------------

class _SimulatedFailure(Exception):
    pass


def _fail_in_savez(monkeypatch):
    """np.savez writes the start of a zip to its target, then fails."""
    def failing_savez(file, *args, **kwargs):
        start = b"PK\x03\x04" + b"\0" * 64
        if hasattr(file, "write"):
            file.write(start)
        else:
            with open(file, "wb") as handle:
                handle.write(start)
        raise _SimulatedFailure("disk full")

    monkeypatch.setattr(np, "savez", failing_savez)


def _fail_in_third_array(monkeypatch):
    """The archive is half written (two arrays) when writing the third one fails."""
    real = np.lib.format.write_array
    calls = []

    def failing_write_array(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise _SimulatedFailure("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", failing_write_array)


@pytest.mark.parametrize("failure", [_fail_in_savez, _fail_in_third_array])
@pytest.mark.parametrize("previous", [True, False])
def test_failed_save_leaves_previous_file_and_no_partial_file(failure, previous, tmp_path,
                                                              monkeypatch):
    model = small_vit(num_layers=1)
    assign_reference_weights(model, np.random.default_rng(81))
    path = tmp_path / "model.npz"
    if previous:
        save_npz(model, path)
        old = path.read_bytes()
        assign_reference_weights(model, np.random.default_rng(82))  # the next save would differ
    with monkeypatch.context() as patch:
        failure(patch)
        with pytest.raises(_SimulatedFailure):
            save_npz(model, path)
    # The previous file and the spec written beside it (save_npz) stay as they were.
    assert sorted(os.listdir(tmp_path)) == (["model.npz", "model.npz.json"] if previous else [])
    if previous:
        assert path.read_bytes() == old
        load_npz(small_vit(num_layers=1), path)  # still a valid checkpoint
    # And a save that does not fail replaces the file.
    save_npz(model, path)
    assert sorted(os.listdir(tmp_path)) == ["model.npz", "model.npz.json"]
    restored = small_vit(num_layers=1)
    load_npz(restored, path)
    assert_same_weights(restored, snapshot(model))


_SAVE_UNDER_FILE_SIZE_LIMIT = r"""
import resource, signal, sys
import keras_vit
from keras_vit.weights.checkpoint import save_npz
model = keras_vit.vit("B/16", image_size=32, patch_size=8, hidden_size=24, mlp_dim=48,
                      num_heads=3, num_layers=1, num_classes=5)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), hard))
try:
    save_npz(model, sys.argv[1])
except BaseException as error:
    print("SAVE FAILED:", type(error).__name__, error)
else:
    print("SAVED")
"""


def test_save_failing_while_writing_the_file_keeps_the_previous_file(tmp_path):
    """A real write failure on disk (the file-size limit is hit halfway through the file), in a
    child process: the previous checkpoint stays as it was and no partial file remains."""
    import subprocess

    model = small_vit(num_layers=1)
    assign_reference_weights(model, np.random.default_rng(83))
    path = tmp_path / "model.npz"
    save_npz(model, path)
    old = path.read_bytes()
    root = REPO
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    result = subprocess.run(
        [sys.executable, "-c", _SAVE_UNDER_FILE_SIZE_LIMIT, str(path), str(len(old) // 2)],
        capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert "SAVE FAILED" in result.stdout, (result.stdout, result.stderr[-2000:])
    assert sorted(os.listdir(tmp_path)) == ["model.npz", "model.npz.json"]
    assert path.read_bytes() == old

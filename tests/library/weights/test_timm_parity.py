"""keras_vit's resampling against timm's own (timm 1.0.31, PyTorch on the CPU): position
embeddings resampled bicubically (`resample_abs_pos_embed`), the patch-embedding kernel resized
with FlexiViT's pseudo-inverse (`resample_patch_embed`), and a timm ViT with `dynamic_img_size`
against a keras_vit model of any image size holding its weights. Skipped where timm is not
installed; CI runs it in its own environment (see .ci/run)."""

import keras
import numpy as np
import pytest

timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")
from timm.layers import resample_abs_pos_embed, resample_patch_embed  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.layers import resample  # noqa: E402
from keras_vit.weights import checkpoint, torch_layouts  # noqa: E402
from keras_vit import layers as vit_layers  # noqa: E402
from keras_vit.layers.position import _patch_coordinates  # noqa: E402

GRIDS = [(1, 3), (2, 2), (3, 5), (7, 7), (14, 14), (16, 9), (24, 24)]


def test_the_bicubic_matrix_is_pytorchs_antialiased_bicubic():
    """The weights timm's resampling uses: F.interpolate(mode="bicubic", antialias=True,
    align_corners=False) of each basis vector, in float64, growing and shrinking."""
    for old in (1, 2, 5, 14, 24):
        for new in (1, 3, 7, 14, 16, 37):
            basis = torch.eye(old, dtype=torch.float64).reshape(old, 1, 1, old)
            theirs = torch.nn.functional.interpolate(
                basis, size=(1, new), mode="bicubic", antialias=True, align_corners=False)
            np.testing.assert_allclose(resample.resize_matrix(old, new, "bicubic"),
                                       theirs[:, 0, 0, :].numpy().T, atol=1e-12)


@pytest.mark.parametrize("old", [(2, 2), (7, 5), (14, 14), (24, 24)])
def test_bicubic_position_embeddings_equal_timms(old):
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(1, 1 + old[0] * old[1], 8)).astype("float32")
    for new in GRIDS:
        ours = resample.resize_position_embeddings(embeddings, new, old_grid=old,
                                                   interpolation="bicubic")
        # timm resamples in float32 (ours in float64, then rounded).
        theirs = resample_abs_pos_embed(torch.tensor(embeddings), list(new),
                                        old_size=list(old)).numpy()
        np.testing.assert_allclose(ours, theirs, atol=1e-5)


def _timm_rope_in_half_layout(embedding, head_dim, interleaved):
    """timm's concatenated (sin, cos) rope table `[tokens, 2 * head_dim]` as (sin, cos) of
    the angles keras_vit rotates channel i and i + head_dim / 2 by."""
    sin, cos = np.split(embedding.numpy().astype("float64"), 2, axis=-1)
    pick = slice(0, None, 2) if interleaved else slice(0, head_dim // 2)
    return sin[:, pick], cos[:, pick]


@pytest.mark.parametrize("grid", [(4, 4), (3, 7), (14, 14)])
def test_rope_angles_equal_timms_cat_and_dinov3_embeddings(grid):
    """`rope_angles` against timm's `RotaryEmbeddingCat` (EVA-02, timm's RoPE ViTs; its
    interleaved pairs are keras_vit's channels i and i + head_dim / 2) and its
    `RotaryEmbeddingDinoV3` (half layout), at the grid of the weights and at another."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingDinoV3
    head_dim = 16
    cases = [
        ("axial", 10_000.0, None, RotaryEmbeddingCat(
            head_dim, in_pixels=False, feat_shape=list(grid), temperature=10_000.0), True),
        ("axial", 100.0, (5, 5), RotaryEmbeddingCat(
            head_dim, in_pixels=False, feat_shape=list(grid), ref_feat_shape=[5, 5],
            temperature=100.0), True),
        ("axial", 10_000.0, (5, 5), RotaryEmbeddingCat(  # Perception Encoder's offset
            head_dim, in_pixels=False, feat_shape=list(grid), ref_feat_shape=[5, 5],
            grid_offset=1.0), True),
        ("axial_normalized", 100.0, None, RotaryEmbeddingDinoV3(
            head_dim, temperature=100.0, feat_shape=list(grid)), False),
    ]
    for index, (kind, temperature, reference, theirs, interleaved) in enumerate(cases):
        offset = 1.0 if index == 2 else 0.0
        angles = vit_layers.rope_angles(kind, grid, head_dim, temperature, reference, offset)
        sin, cos = _timm_rope_in_half_layout(theirs.get_embed(), head_dim, interleaved)
        np.testing.assert_allclose(np.sin(angles), sin, atol=2e-5, err_msg=kind)
        np.testing.assert_allclose(np.cos(angles), cos, atol=2e-5, err_msg=kind)
        # The call-time (keras.ops, float32) angles of a model of any image size.
        dynamic = vit_layers.rope_angles(kind, grid, head_dim, temperature, reference, offset,
                                         xp=keras.ops)
        np.testing.assert_allclose(np.sin(keras.ops.convert_to_numpy(dynamic)), sin,
                                   atol=2e-5, err_msg=kind)


@pytest.mark.parametrize("grid", [(4, 4), (3, 7)])
def test_mixed_rope_angles_equal_timms(grid):
    """`MixedRopeFrequencies` against timm's `get_mixed_freqs` (RoPE-Mixed, with the 'xy' grid
    its pretrained models use: its x frequencies are keras_vit's column ones, y the row)."""
    from timm.layers.pos_embed_sincos import get_mixed_freqs, get_mixed_grid
    layer = vit_layers.MixedRopeFrequencies(num_heads=3, head_dim=16)
    layer.build()
    rows, columns = keras.ops.convert_to_numpy(layer.frequencies)
    t_x, t_y = get_mixed_grid(list(grid), grid_indexing="xy")
    theirs = get_mixed_freqs(torch.tensor(np.stack([columns, rows])), t_x, t_y)  # [3, N, 32]
    sin, _ = _timm_rope_in_half_layout(theirs.permute(1, 0, 2).reshape(-1, 32), 16, True)
    angles = keras.ops.convert_to_numpy(layer(_patch_coordinates(grid)))
    np.testing.assert_allclose(np.sin(angles).reshape(-1, 8), sin, atol=2e-5)


def test_relative_mlp_equals_timms_relposmlp():
    """`RelativePositionMlp` against timm's `RelPosMlp` ("cr" mode, its `vit_relpos_*`
    models') holding the same weights, with a class token, at two grids."""
    from timm.layers.pos_embed_rel import RelPosMlp
    for grid in ((4, 4), (3, 5)):
        theirs = RelPosMlp(grid, num_heads=3, hidden_dim=8, prefix_tokens=1).eval()
        ours = vit_layers.RelativePositionMlp(grid, num_heads=3, num_prefix_tokens=1,
                                              hidden_dim=8)
        ours.build()
        ours.fc1.kernel.assign(theirs.mlp.fc1.weight.detach().numpy().T)
        ours.fc1.bias.assign(theirs.mlp.fc1.bias.detach().numpy())
        ours.fc2.kernel.assign(theirs.mlp.fc2.weight.detach().numpy().T)
        ours.fc2.bias.assign(theirs.mlp.fc2.bias.detach().numpy())
        got = keras.ops.convert_to_numpy(ours(np.zeros((1, 3, 1, 8), "float32")))
        np.testing.assert_allclose(got, theirs.get_bias().detach().numpy(), atol=1e-6)


@pytest.mark.parametrize("old", [8, 14, 16, 32])
def test_the_patch_embedding_resize_equals_timms(old):
    kernel = np.random.default_rng(1).normal(size=(6, 3, old, old)).astype("float32")  # torch
    for new in (4, 8, 12, 16, 24, 32, 7):
        theirs = resample_patch_embed(torch.tensor(kernel), [new, new]).numpy()
        ours = resample.resize_patch_embedding(kernel.transpose(2, 3, 1, 0), new)
        ours = ours.transpose(3, 2, 0, 1)
        assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max(), (old, new)


def test_timm_weights_at_another_size_give_timms_outputs():
    """timm's ViT with dynamic_img_size (exact GELU, LayerNorm eps 1e-6, bicubic resampling)
    and keras_vit's of any size, with the same random weights of order 1, at the trained size
    and at sizes that are not square."""
    torch.manual_seed(0)
    theirs = timm.models.vision_transformer.VisionTransformer(
        img_size=64, patch_size=16, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0,
        num_classes=5, dynamic_img_size=True).eval()
    with torch.no_grad():
        for name, parameter in theirs.named_parameters():
            scale = 0.3 if "norm" not in name else 0.1
            parameter.copy_(torch.randn_like(parameter) * scale + ("norm" in name
                                                                   and "weight" in name))
    ours = keras_vit.vit("Ti/16", hidden_size=24, mlp_dim=48, num_heads=3, num_layers=2,
                         image_size=64, num_classes=5, activation="gelu",
                         dynamic_image_size=True, position_embedding_interpolation="bicubic")
    state = {name: value.detach().numpy() for name, value in theirs.state_dict().items()}
    checkpoint.load_npz(ours, torch_layouts.to_npz_arrays(state, ours.spec, "timm"))
    for size in ((64, 64), (48, 96), (112, 32)):
        x = np.random.default_rng(2).uniform(-1, 1, (2,) + size + (3,)).astype("float32")
        with torch.no_grad():
            expected = theirs(torch.tensor(x.transpose(0, 3, 1, 2))).numpy()
        actual = keras.ops.convert_to_numpy(ours(x))
        assert np.abs(expected).max() > 0.5  # activations of order 1: a wrong GELU would show
        assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max(), size

"""The public layers: standalone use in a user's functional model, .keras round trips with
safe_mode=True, numerics (LayerNorm epsilon, GELU, initialisers, DropPath, attention weights,
2-D position embeddings) and the ResNet pieces of the hybrids."""

import math

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import layers as L
from keras_vit.layers import normalization
from keras_vit.layers import resnet as R
import numpy_reference
from model_fixtures import randomise

pytestmark = pytest.mark.usefixtures("fresh_session")


def to_np(x):
    return keras.ops.convert_to_numpy(x)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_exact(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


# (id, factory of the layer, input shape without batch, expected output shape without batch)
LAYER_CASES = [
    ("PatchEmbed", lambda: L.PatchEmbed(4, 8), (8, 12, 3), (6, 8)),
    ("ClassToken", lambda: L.ClassToken(), (6, 8), (7, 8)),
    ("AddPositionEmbs_learned", lambda: L.AddPositionEmbs((2, 3), 1, kind="learned"),
     (7, 8), (7, 8)),
    ("AddPositionEmbs_learned_2d", lambda: L.AddPositionEmbs((2, 3), 1, kind="learned_2d"),
     (7, 8), (7, 8)),
    ("AddPositionEmbs_learned_2d_no_prefix",
     lambda: L.AddPositionEmbs((2, 3), 0, kind="learned_2d"), (6, 8), (6, 8)),
    ("AddPositionEmbs_none", lambda: L.AddPositionEmbs((2, 3), 1, kind="none"), (7, 8), (7, 8)),
    ("DropPath", lambda: L.DropPath(0.3, seed=3), (7, 8), (7, 8)),
    ("MultiHeadSelfAttention", lambda: L.MultiHeadSelfAttention(2, dropout=0.1), (7, 8), (7, 8)),
    ("MlpBlock", lambda: L.MlpBlock(16, dropout=0.1), (7, 8), (7, 8)),
    ("MlpBlock_exact_gelu", lambda: L.MlpBlock(16, activation="gelu"), (7, 8), (7, 8)),
    ("MlpBlock_quick_gelu", lambda: L.MlpBlock(16, activation="quick_gelu"), (7, 8), (7, 8)),
    ("MlpBlock_swiglu", lambda: L.MlpBlock(16, dropout=0.1, activation="swiglu"), (7, 8),
     (7, 8)),
    ("RegisterTokens", lambda: L.RegisterTokens(3), (6, 8), (9, 8)),
    ("LayerScale", lambda: L.LayerScale(1e-5), (7, 8), (7, 8)),
    ("AddPositionEmbs_patches_only", lambda: L.AddPositionEmbs((2, 3), 2, embed_prefix=False),
     (8, 8), (8, 8)),
    ("EncoderBlock_later_options", lambda: L.EncoderBlock(2, 16, qkv_bias=False,
                                                          layer_scale_init=0.1), (7, 8), (7, 8)),
    ("AttentionPooling", lambda: L.AttentionPooling(2, 16, num_prefix_tokens=1), (7, 8), (8,)),
    ("AttentionPooling_without_mlp", lambda: L.AttentionPooling(2, 0), (7, 8), (8,)),
    ("EncoderBlock_without_proj_bias", lambda: L.EncoderBlock(
        2, 16, qkv_bias=False, proj_bias=False, activation="swiglu"), (7, 8), (7, 8)),
    ("EncoderBlock", lambda: L.EncoderBlock(2, 16, dropout=0.1, attention_dropout=0.1,
                                            drop_path_rate=0.2), (7, 8), (7, 8)),
    ("RelativePositionBias_1d", lambda: L.RelativePositionBias((2, 3), 2, 1, kind="1d"),
     (2, 7, 4), (2, 7, 7)),
    ("RelativePositionBias_2d", lambda: L.RelativePositionBias((2, 3), 2, 0, kind="2d"),
     (2, 6, 4), (2, 6, 6)),
    ("MultiHeadSelfAttention_relative", lambda: L.MultiHeadSelfAttention(
        2, relative_position="1d", grid_size=(2, 3), num_prefix_tokens=1), (7, 8), (7, 8)),
    ("EncoderBlock_relative_2d", lambda: L.EncoderBlock(
        2, 16, relative_position="2d", grid_size=(2, 3), num_prefix_tokens=1), (7, 8), (7, 8)),
    ("AxialEncoderBlock_row", lambda: L.AxialEncoderBlock("row", (2, 3), num_heads=2,
                                                         mlp_dim=16, dropout=0.1), (6, 8), (6, 8)),
    ("AxialEncoderBlock_column", lambda: L.AxialEncoderBlock("column", (2, 3), num_heads=2,
                                                            mlp_dim=16), (6, 8), (6, 8)),
    ("TokenPooling_token", lambda: L.TokenPooling("token"), (7, 8), (8,)),
    ("TokenPooling_gap", lambda: L.TokenPooling("gap"), (7, 8), (8,)),
    ("StdConv2D", lambda: R.StdConv2D(8, 3, strides=2), (8, 8, 4), (4, 4, 8)),
    ("ResNetStem", lambda: R.ResNetStem(32), (16, 12, 3), (4, 3, 32)),
    ("BottleneckUnit_projection", lambda: R.BottleneckUnit(32, strides=2), (8, 8, 64),
     (4, 4, 128)),
    ("BottleneckUnit_identity", lambda: R.BottleneckUnit(32), (4, 4, 128), (4, 4, 128)),
    ("ResNetStage", lambda: R.ResNetStage(2, 32, first_stride=2), (8, 8, 64), (4, 4, 128)),
]


def _user_model(layer, input_shape):
    inputs = keras.Input(shape=input_shape)
    features = layer(inputs)
    outputs = keras.layers.Dense(3, name="user_dense")(features)
    return keras.Model(inputs, [features, outputs])


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_layer_in_functional_model_round_trips(case, tmp_path):
    _, factory, input_shape, output_shape = case
    layer = factory()
    model = _user_model(layer, input_shape)
    assert tuple(model.outputs[0].shape) == (None,) + output_shape
    randomise(model, scale=0.5)
    x = np.random.default_rng(2).normal(size=(2,) + input_shape).astype("float32")
    features, outputs = (to_np(t) for t in model(x, training=False))
    assert features.shape == (2,) + output_shape
    assert outputs.shape == (2,) + output_shape[:-1] + (3,)
    assert np.all(np.isfinite(features))

    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    loaded_layer = loaded.get_layer(layer.name)
    assert type(loaded_layer) is type(layer)
    assert loaded_layer.get_config() == layer.get_config()
    new_features, new_outputs = (to_np(t) for t in loaded(x, training=False))
    np.testing.assert_allclose(new_features, features, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(new_outputs, outputs, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Patches, class token, position embeddings, pooling


def test_patch_embed_is_a_row_major_linear_projection_of_patches():
    layer = L.PatchEmbed(2, 5)
    x = np.random.default_rng(0).normal(size=(2, 4, 6, 3)).astype("float32")
    layer.build(x.shape)
    randomise(layer, scale=0.5)
    kernel, bias = (to_np(w) for w in (layer.kernel, layer.bias))
    got = to_np(layer(x))
    assert got.shape == (2, 2 * 3, 5)
    for row in range(2):
        for column in range(3):
            patch = x[:, 2 * row:2 * row + 2, 2 * column:2 * column + 2, :]
            expected = np.einsum("bhwc,hwcd->bd", patch, kernel) + bias
            np.testing.assert_allclose(got[:, row * 3 + column], expected, rtol=1e-5, atol=1e-5)


def test_patch_embed_initialisers():
    layer = L.PatchEmbed(8, 256)
    layer.build((None, 16, 16, 3))
    kernel = to_np(layer.kernel)
    fan_in = 8 * 8 * 3
    assert kernel.shape == (8, 8, 3, 256)
    assert abs(kernel.std() - math.sqrt(1.0 / fan_in)) < 0.1 * math.sqrt(1.0 / fan_in)
    np.testing.assert_array_equal(to_np(layer.bias), 0.0)


def test_class_token_prepends_zero_initialised_cls():
    layer = L.ClassToken()
    x = np.random.default_rng(0).normal(size=(3, 4, 6)).astype("float32")
    out = to_np(layer(x))
    assert [w.name for w in layer.weights] == ["cls"]
    assert tuple(layer.cls.shape) == (1, 1, 6)
    np.testing.assert_array_equal(to_np(layer.cls), 0.0)
    cls = np.arange(6, dtype="float32").reshape(1, 1, 6)
    layer.cls.assign(cls)
    out = to_np(layer(x))
    assert out.shape == (3, 5, 6)
    np.testing.assert_array_equal(out[:, 0], np.broadcast_to(cls[0], (3, 6)))
    np.testing.assert_array_equal(out[:, 1:], x)


def test_learned_position_embedding_shape_and_initialiser():
    layer = L.AddPositionEmbs((8, 8), num_prefix_tokens=1, kind="learned")
    x = np.random.default_rng(0).normal(size=(2, 65, 64)).astype("float32")
    out = to_np(layer(x))
    pos = to_np(layer.pos_embedding)
    assert pos.shape == (1, 65, 64)
    assert [w.name for w in layer.weights] == ["pos_embedding"]
    assert abs(pos.mean()) < 0.002
    assert 0.018 < pos.std() < 0.022
    np.testing.assert_allclose(out, x + pos, rtol=1e-6, atol=1e-6)


def test_position_embedding_none_adds_nothing():
    layer = L.AddPositionEmbs((2, 3), num_prefix_tokens=1, kind="none")
    x = np.random.default_rng(0).normal(size=(2, 7, 8)).astype("float32")
    np.testing.assert_array_equal(to_np(layer(x)), x)
    assert layer.weights == []


def test_position_embedding_rejects_unknown_kind_and_wrong_token_count():
    with pytest.raises(ValueError, match="learned_2d"):
        L.AddPositionEmbs((2, 2), kind="sinusoidal")
    layer = L.AddPositionEmbs((2, 3), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="7 tokens"):
        layer(np.zeros((1, 10, 8), "float32"))


def test_learned_2d_position_embeddings_have_row_and_column_structure():
    rows, columns, hidden = 3, 4, 8
    layer = L.AddPositionEmbs((rows, columns), num_prefix_tokens=1, kind="learned_2d")
    zeros = np.zeros((1, 1 + rows * columns, hidden), "float32")
    layer.build(zeros.shape)
    assert tuple(layer.row_embedding.shape) == (rows, hidden // 2)
    assert tuple(layer.column_embedding.shape) == (columns, hidden // 2)
    assert tuple(layer.prefix_embedding.shape) == (1, hidden)
    pos = to_np(layer(zeros))[0]
    np.testing.assert_array_equal(pos[0], to_np(layer.prefix_embedding)[0])
    grid = pos[1:].reshape(rows, columns, hidden)  # tokens are row major
    half = hidden // 2
    for r in range(rows):
        for c in range(columns):
            np.testing.assert_array_equal(grid[r, c, :half], to_np(layer.row_embedding)[r])
            np.testing.assert_array_equal(grid[r, c, half:],
                                          to_np(layer.column_embedding)[c])
    # Same row -> same first half; different rows -> different first halves (and the same for
    # columns in the second half).
    assert np.all(grid[:, :, :half] == grid[:, :1, :half])
    assert np.all(grid[:, :, half:] == grid[:1, :, half:])
    assert not np.allclose(grid[0, 0, :half], grid[1, 0, :half])
    assert not np.allclose(grid[0, 0, half:], grid[0, 1, half:])
    assert 0.01 < to_np(layer.row_embedding).std() < 0.04


def test_learned_2d_needs_an_even_width():
    layer = L.AddPositionEmbs((2, 2), num_prefix_tokens=0, kind="learned_2d")
    with pytest.raises(ValueError, match="even"):
        layer(np.zeros((1, 4, 7), "float32"))


def _posemb_sincos_2d(h, w, width, temperature=10_000.0):
    """big_vision's `posemb_sincos_2d` (models/vit.py), transcribed to NumPy."""
    y, x = np.mgrid[:h, :w]
    omega = np.arange(width // 4) / (width // 4 - 1)
    omega = 1.0 / (temperature**omega)
    y = np.einsum("m,d->md", y.flatten(), omega)
    x = np.einsum("m,d->md", x.flatten(), omega)
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)


def test_sincos_2d_is_big_visions_and_leaves_the_prefix_alone():
    rows, columns, hidden = 3, 5, 16
    layer = L.AddPositionEmbs((rows, columns), num_prefix_tokens=2, kind="sincos_2d")
    x = np.random.default_rng(0).normal(size=(2, 2 + rows * columns, hidden)).astype("float32")
    out = to_np(layer(x))
    assert layer.weights == []  # fixed: nothing to train, load or save
    np.testing.assert_array_equal(out[:, :2], x[:, :2])
    np.testing.assert_allclose(out[:, 2:] - x[:, 2:],
                               np.broadcast_to(_posemb_sincos_2d(rows, columns, hidden),
                                               (2, rows * columns, hidden)), atol=1e-5)
    # For another grid (a model of any size) it is computed, not resampled.
    np.testing.assert_allclose(to_np(layer.embeddings((4, 2)))[0, 2:],
                               _posemb_sincos_2d(4, 2, hidden), atol=1e-5)


def test_sincos_2d_needs_a_width_of_four_quarters():
    layer = L.AddPositionEmbs((2, 2), num_prefix_tokens=0, kind="sincos_2d")
    with pytest.raises(ValueError, match="multiple of 4"):
        layer(np.zeros((1, 4, 10), "float32"))
    with pytest.raises(ValueError, match="sincos_2d embeddings need a hidden_size"):
        keras_vit.ViTConfig(position_embedding="sincos_2d", hidden_size=18, num_heads=2)
    with pytest.raises(ValueError, match="placement other than 'stem'"):
        keras_vit.ViTConfig(position_embedding="sincos_2d",
                            position_embedding_placement="every_layer")


@pytest.mark.parametrize("kind", ["axial", "axial_normalized", "mixed"])
def test_rope_logits_depend_on_the_patches_offset_and_leave_the_prefix_alone(kind):
    """With every patch's query the same vector and every key the same vector, the rotated
    logits differ only by the (row, column) offset of query and key: equal along each offset,
    different between offsets; the class token's logits are the unrotated product."""
    rows, columns, hidden, heads = 3, 4, 16, 2
    attention = L.MultiHeadSelfAttention(heads, grid_size=(rows, columns), num_prefix_tokens=1,
                                         rope=kind, attention_impl="explicit")
    tokens = 1 + rows * columns
    x = np.random.default_rng(3).normal(size=(1, tokens, hidden)).astype("float32")
    attention.build(x.shape)
    randomise(attention)
    for dense in (attention.query, attention.key):  # content-free: the biases alone
        dense.kernel.assign(np.zeros((hidden, hidden)))
    _, weights = attention(x, return_attention_scores=True)
    log_weights = np.log(to_np(weights)[0].astype("float64"))  # [heads, query, key]
    # Each patch query's logits minus its logit against its own key (offset zero).
    patches = log_weights[:, 1:, 1:]
    patch = patches - np.diagonal(patches, axis1=1, axis2=2)[..., None]
    row, column = np.divmod(np.arange(rows * columns), columns)
    by_offset = {}
    for q in range(rows * columns):
        for k in range(rows * columns):
            offset = (row[q] - row[k], column[q] - column[k])
            by_offset.setdefault(offset, []).append(patch[:, q, k])
    for values in by_offset.values():
        np.testing.assert_allclose(values, [values[0]] * len(values), atol=1e-4)
    assert np.ptp([values[0] for values in by_offset.values()]) > 0.1
    # The class token's query and key are not rotated: its logits against the patches are its
    # query against each patch's rotated key, relative to the plain product with its own key.
    scale = 1 / math.sqrt(hidden // heads)
    q = to_np(attention.query.bias).reshape(heads, -1)
    k = to_np(attention.key.bias).reshape(heads, -1)
    plain = np.einsum("hd,hd->h", q, k) * scale
    if kind == "mixed":  # learned: each head's angles from its row and column frequencies
        row_frequency, column_frequency = to_np(attention.rope_frequencies.frequencies)
        angles = (row[:, None, None] * row_frequency[None] +
                  column[:, None, None] * column_frequency[None])  # [patches, heads, half]
    else:
        angles = L.rope_angles(kind, (rows, columns), hidden // heads,
                               attention.rope_temperature)[:, None, :]
    np.testing.assert_allclose(log_weights[:, 0, 1:] - log_weights[:, 0, :1],
                               _cls_against_rotated_keys(angles, q, k) - plain[:, None],
                               atol=1e-4)


def test_mixed_rope_starts_as_heo_et_al():
    """RoPE-Mixed's initial frequencies: per head one random turn, pair k's (row, column)
    frequency of length temperature^(-(k mod head_dim/4)/(head_dim/4)), at the turn's angle
    for the first quarter of the pairs and a quarter turn on for the rest."""
    layer = L.MixedRopeFrequencies(num_heads=4, head_dim=16, temperature=10.0)
    layer.build()
    rows, columns = to_np(layer.frequencies)  # [heads, 8] each
    quarter = 4
    lengths = np.hypot(rows, columns)
    np.testing.assert_allclose(lengths, np.tile(10.0 ** -(np.arange(quarter) / quarter), 2)[None]
                               .repeat(4, 0), rtol=1e-5)
    turn = np.arctan2(rows[:, :quarter], columns[:, :quarter])  # one angle per head
    np.testing.assert_allclose(turn, turn[:, :1].repeat(quarter, 1), atol=1e-5)
    quarter_on = np.arctan2(rows[:, quarter:], columns[:, quarter:])
    np.testing.assert_allclose(np.cos(quarter_on - turn), 0.0, atol=1e-5)
    assert np.ptp(turn[:, 0]) > 0  # different heads, different turns


def _cls_against_rotated_keys(angles, q, k):
    """The class token's (unrotated) query against each patch's key rotated by `angles`
    `[patches, heads or 1, head_dim / 2]`, the rotation written out per pair of channels
    (i, i + head_dim / 2)."""
    heads, head_dim = q.shape
    half = head_dim // 2
    logits = np.zeros((heads, len(angles)))
    for token, angle in enumerate(angles):
        rotated = k.copy()
        rotated[:, :half] = k[:, :half] * np.cos(angle) - k[:, half:] * np.sin(angle)
        rotated[:, half:] = k[:, half:] * np.cos(angle) + k[:, :half] * np.sin(angle)
        logits[:, token] = np.einsum("hd,hd->h", q, rotated) / math.sqrt(head_dim)
    return logits


def test_rope_rules_name_the_fix():
    with pytest.raises(ValueError, match="multiple of 4"):
        keras_vit.ViTConfig(rope="axial", hidden_size=18, num_heads=3)
    with pytest.raises(ValueError, match="already make the attention relative"):
        keras_vit.ViTConfig(rope="axial", position_embedding="relative")
    with pytest.raises(ValueError, match="Axial-ViT"):
        keras_vit.ViTConfig(variant="Axial-B/16", rope="axial")
    with pytest.raises(ValueError, match="set rope too"):
        keras_vit.ViTConfig(rope_temperature=100.0)
    with pytest.raises(ValueError, match="rope='axial' only"):
        keras_vit.ViTConfig(rope="axial_normalized", rope_reference_grid=(16, 16))
    with pytest.raises(ValueError, match="shifts patch indices"):
        keras_vit.ViTConfig(rope="axial_normalized", rope_grid_offset=1)
    assert keras_vit.ViTConfig(rope_grid_offset=0).rope_grid_offset == 0.0  # none: allowed
    with pytest.raises(ValueError, match="must be None or one of"):
        keras_vit.ViTConfig(rope="2d")
    spec = keras_vit.ViTConfig(rope="axial_normalized")
    assert spec.rope_temperature == 100.0  # the kind's default, recorded
    assert keras_vit.ViTConfig.from_dict(spec.to_dict()) == spec


def test_attention_pooling_without_mlp_is_the_attentions_output_alone():
    """mlp_dim 0 (AIMv2's head): softmax(q k^T / sqrt(d)) v per head, through `out`; no
    LayerNorm or MLP weights. Explicit and fused alike."""
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    pool = L.AttentionPooling(2, 0)
    pool.build(x.shape)
    randomise(pool, scale=1.0)
    assert sorted(v.path.split("/", 1)[1] for v in pool.weights) == sorted(
        [f"{name}/{kind}" for name in ("query", "key", "value", "out")
         for kind in ("kernel", "bias")] + ["probe"])
    w = {v.path.split("/", 1)[1]: to_np(v).astype("float64") for v in pool.weights}

    def project(t, name):
        return numpy_reference.dense(t, w[f"{name}/kernel"], w[f"{name}/bias"]).reshape(
            t.shape[0], -1, 2, 4)

    q, k, v = project(w["probe"], "query"), project(x, "key"), project(x, "value")
    heads = [numpy_reference.softmax(q[:, :, h] @ k[:, :, h].transpose(0, 2, 1) / 2.0)
             @ v[:, :, h] for h in range(2)]
    expected = numpy_reference.dense(np.concatenate(heads, -1), w["out/kernel"],
                                     w["out/bias"])[:, 0]
    for impl in ("explicit", "fused"):
        pool.attention_impl = impl
        np.testing.assert_allclose(to_np(pool(x.astype("float32"))), expected, rtol=1e-5,
                                   atol=1e-5)


def test_token_pooling():
    x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype("float32")
    np.testing.assert_array_equal(to_np(L.TokenPooling("token")(x)), x[:, 0])
    np.testing.assert_allclose(to_np(L.TokenPooling("gap")(x)), x.mean(axis=1), atol=1e-6)
    with pytest.raises(ValueError, match="'token' or 'gap'"):
        L.TokenPooling("max")


# ---------------------------------------------------------------------------------------------
# MLP, GELU, LayerNorm epsilon, attention


def _mlp_by_hand(x, layer, approximate):
    w0, b0 = (to_np(w).astype("float64") for w in layer.dense_0.weights)
    w1, b1 = (to_np(w).astype("float64") for w in layer.dense_1.weights)
    h = x.astype("float64") @ w0 + b0
    h = _gelu_tanh(h) if approximate else _gelu_exact(h)
    return h @ w1 + b1


@pytest.mark.parametrize("approximate", [True, False])
def test_mlp_block_matches_hand_computation(approximate):
    layer = L.MlpBlock(32, approximate_gelu=approximate)
    x = np.random.default_rng(0).normal(scale=2.0, size=(4, 3, 8)).astype("float32")
    layer.build(x.shape)
    randomise(layer, scale=1.0)
    got = to_np(layer(x))
    np.testing.assert_allclose(got, _mlp_by_hand(x, layer, approximate), rtol=1e-4, atol=1e-4)
    # The two GELUs differ by up to ~1e-3 per unit: make sure the test can tell them apart.
    other = _mlp_by_hand(x, layer, not approximate)
    assert np.abs(got - other).max() > 1e-3


def test_inner_norms_normalise_the_hidden_units_and_the_heads():
    """NormFormer's LayerNorms as EVA-02 has them (timm's scale_mlp, scale_attn_inner): on the
    MLP's activated hidden units before Dense_1, and on the concatenated heads before `out`."""
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float64")
    mlp = L.MlpBlock(12, activation="gelu", inner_norm_epsilon=1e-5)
    mlp.build(x.shape)
    randomise(mlp, scale=1.0)
    w = {f"m/{v.path.split('/', 1)[1]}": to_np(v).astype("float64") for v in mlp.weights}
    hidden = numpy_reference.gelu_exact(numpy_reference.dense(x, w["m/Dense_0/kernel"],
                                                              w["m/Dense_0/bias"]))
    hidden = numpy_reference.layer_norm(hidden, w["m/inner_norm/gamma"], w["m/inner_norm/beta"],
                                        eps=1e-5)
    expected = numpy_reference.dense(hidden, w["m/Dense_1/kernel"], w["m/Dense_1/bias"])
    np.testing.assert_allclose(to_np(mlp(x.astype("float32"))), expected, atol=1e-4)
    attention = L.MultiHeadSelfAttention(2, inner_norm_epsilon=1e-6)
    attention.build(x.shape)
    randomise(attention, scale=1.0)
    w = {f"a/{v.path.split('/', 1)[1]}": to_np(v).astype("float64") for v in attention.weights}
    out_kernel, out_bias = w["a/out/kernel"], w["a/out/bias"]
    norm = (w["a/inner_norm/gamma"], w["a/inner_norm/beta"])
    # The plain attention with `out` as the identity gives the concatenated heads.
    w["a/out/kernel"], w["a/out/bias"] = np.eye(8), np.zeros(8)
    heads = numpy_reference.multi_head_self_attention(x, w, "a", 2)
    expected = numpy_reference.dense(numpy_reference.layer_norm(heads, *norm), out_kernel,
                                     out_bias)
    for impl in ("explicit", "fused"):
        attention.attention_impl = impl
        np.testing.assert_allclose(to_np(attention(x.astype("float32"))), expected, atol=1e-4)


def test_rms_norm_scales_by_the_root_mean_square_without_centring_in_float32():
    """RMSNorm (timm's RmsNorm): x / sqrt(mean(x^2) + eps) * gamma, no mean taken out and no
    bias; a LayerNorm of the same input differs (the test can tell them apart)."""
    x = np.random.default_rng(0).normal(1.5, 2.0, size=(2, 5, 8))
    norm = L.RMSNorm(1e-5)
    norm.build(x.shape)
    randomise(norm, scale=1.0)
    assert [v.path.split("/")[-1] for v in norm.weights] == ["gamma"]
    gamma = to_np(norm.gamma).astype("float64")
    expected = numpy_reference.rms_norm(x, gamma, eps=1e-5)
    np.testing.assert_allclose(to_np(norm(x.astype("float32"))), expected, rtol=1e-5, atol=1e-5)
    assert np.abs(numpy_reference.layer_norm(x, gamma, 0.0) - expected).max() > 0.1
    half = L.make_norm("rms_norm", 1e-6, dtype="mixed_bfloat16")
    half.build(x.shape)
    out = half(x.astype("float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    np.testing.assert_allclose(to_np(keras.ops.cast(out, "float32")),
                               numpy_reference.rms_norm(x, 1.0, eps=1e-6), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="norm_layer must be one of"):
        L.make_norm("batch_norm", 1e-6)


def _grouped_attention_reference(x, w, num_heads, num_kv_heads, qk_norm_eps):
    """Grouped-query attention with per-head RMS norms of queries and keys, written out per
    head: query head h reads key and value head h // (num_heads / num_kv_heads) (timm's
    AttentionRope); the 1/sqrt(head_dim) scale after the norms."""
    b, n, d = x.shape
    head_dim = d // num_heads
    group = num_heads // num_kv_heads

    def project(name, heads):
        y = numpy_reference.dense(x, w[f"a/{name}/kernel"], w[f"a/{name}/bias"])
        return y.reshape(b, n, heads, head_dim)

    q, k, v = project("query", num_heads), project("key", num_kv_heads), project("value",
                                                                              num_kv_heads)
    if qk_norm_eps is not None:
        q = numpy_reference.rms_norm(q, w["a/query_norm/gamma"], qk_norm_eps)
        k = numpy_reference.rms_norm(k, w["a/key_norm/gamma"], qk_norm_eps)
    heads = []
    for h in range(num_heads):
        logits = q[:, :, h] @ k[:, :, h // group].transpose(0, 2, 1) / math.sqrt(head_dim)
        heads.append(numpy_reference.softmax(logits) @ v[:, :, h // group])
    return numpy_reference.dense(np.concatenate(heads, axis=-1), w["a/out/kernel"],
                                 w["a/out/bias"])


@pytest.mark.parametrize("num_kv_heads, qk_norm", [(2, True), (1, False), (4, True)],
                         ids=["grouped_qk_norm", "multi_query", "qk_norm"])
def test_grouped_query_attention_with_qk_norm_matches_a_per_head_reference(num_kv_heads,
                                                                             qk_norm):
    """Fewer key and value heads (narrower projections), each shared by a group of query
    heads, and RMS norms of each head's queries and keys: explicit and fused alike."""
    x = np.random.default_rng(2).normal(size=(2, 5, 16))
    attention = L.MultiHeadSelfAttention(4, num_kv_heads=num_kv_heads, norm_layer="rms_norm",
                                         qk_norm_epsilon=1e-6 if qk_norm else None)
    attention.build(x.shape)
    randomise(attention, scale=1.0)
    assert tuple(attention.key.kernel.shape) == (16, num_kv_heads * 4)
    w = {f"a/{v.path.split('/', 1)[1]}": to_np(v).astype("float64") for v in attention.weights}
    expected = _grouped_attention_reference(x, w, 4, num_kv_heads, 1e-6 if qk_norm else None)
    for impl in ("explicit", "fused"):
        attention.attention_impl = impl
        np.testing.assert_allclose(to_np(attention(x.astype("float32"))), expected,
                                   rtol=1e-4, atol=1e-4)
    # The groups matter: key heads in another order give other outputs.
    if 1 < num_kv_heads < 4:
        kernel = to_np(attention.key.kernel).reshape(16, num_kv_heads, 4)
        attention.key.kernel.assign(kernel[:, ::-1].reshape(16, -1))
        assert np.abs(to_np(attention(x.astype("float32"))) - expected).max() > 1e-3
    _, weights = attention(x.astype("float32"), return_attention_scores=True)
    assert tuple(weights.shape) == (2, 4, 5, 5)


def test_grouped_attention_refuses_kv_heads_that_do_not_divide_the_heads():
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        L.MultiHeadSelfAttention(4, num_kv_heads=3)
    with pytest.raises(ValueError, match="rope 'mixed'"):
        L.MultiHeadSelfAttention(4, num_kv_heads=2, rope="mixed", grid_size=(2, 2))


def _differential_attention_reference(x, w, num_heads, lambda_init, mask=None):
    """Differential attention written out per head (Ye et al. 2024, equation 1 and section
    2.1): head h's query and key halves [:half], [half:] give two softmax maps of scale
    1/sqrt(half); their difference, the second times lambda, weighs the head's values; each
    head's output RMS-normed (epsilon 1e-5) and times 1 - lambda_init."""
    b, n, d = x.shape
    head_dim = d // num_heads
    half = head_dim // 2
    q, k, v = (numpy_reference.dense(x, w[f"a/{name}/kernel"], w[f"a/{name}/bias"]).reshape(
        b, n, num_heads, head_dim) for name in ("query", "key", "value"))
    lam = (np.exp(np.sum(w["a/lambda_q1"] * w["a/lambda_k1"]))
           - np.exp(np.sum(w["a/lambda_q2"] * w["a/lambda_k2"])) + lambda_init)
    heads = []
    for h in range(num_heads):
        maps = []
        for part in (slice(0, half), slice(half, head_dim)):
            logits = q[:, :, h, part] @ k[:, :, h, part].transpose(0, 2, 1) / math.sqrt(half)
            if mask is not None:
                logits = np.where(mask[:, None, :], logits, -1e9)
            maps.append(numpy_reference.softmax(logits))
        out = (maps[0] - lam * maps[1]) @ v[:, :, h]
        heads.append(numpy_reference.rms_norm(out, w["a/sub_norm/gamma"], 1e-5)
                     * (1 - lambda_init))
    return numpy_reference.dense(np.concatenate(heads, axis=-1), w["a/out/kernel"],
                                 w["a/out/bias"])


def test_differential_attention_matches_a_per_head_reference():
    """Explicit and fused alike, with and without a mask of the keys; the weights returned are
    each head's difference of maps (rows summing to 1 - lambda)."""
    x = np.random.default_rng(2).normal(size=(2, 5, 16))
    attention = L.MultiHeadSelfAttention(2, differential_lambda_init=0.3)
    attention.build(x.shape)
    randomise(attention, scale=0.5)
    assert [tuple(v.shape) for v in attention.lambdas] == [(4,)] * 4
    w = {f"a/{v.path.split('/', 1)[1]}": to_np(v).astype("float64") for v in attention.weights}
    mask = np.array([[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]], bool)
    for keys in (None, mask):
        expected = _differential_attention_reference(x, w, 2, 0.3, keys)
        for impl in ("explicit", "fused"):
            attention.attention_impl = impl
            got = attention(x.astype("float32"), attention_mask=keys)
            np.testing.assert_allclose(to_np(got), expected, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{impl}, mask {keys is not None}")
    # Softmax attention of the same weights differs: the test can tell them apart.
    plain = _grouped_attention_reference(x, w, 2, 2, None)
    assert np.abs(plain - expected).max() > 1e-2
    _, weights = attention(x.astype("float32"), return_attention_scores=True)
    lam = float(np.exp(np.sum(w["a/lambda_q1"] * w["a/lambda_k1"]))
                - np.exp(np.sum(w["a/lambda_q2"] * w["a/lambda_k2"])) + 0.3)
    np.testing.assert_allclose(to_np(weights).sum(-1), 1 - lam, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="heads of 5 channels .* must be even"):
        L.MultiHeadSelfAttention(2, differential_lambda_init=0.3).build((1, 3, 10))
    with pytest.raises(ValueError, match="takes no rope, relative_position or num_kv_heads"):
        L.MultiHeadSelfAttention(2, num_kv_heads=1, differential_lambda_init=0.3)


def test_a_parallel_block_adds_attention_and_mlp_of_one_norm():
    """x + LayerScale(MSA(LN(x)) + MLP(LN(x))) (ViT-22B's parallel block), against the block's
    own layers composed by hand; one norm and one LayerScale."""
    x = np.random.default_rng(3).normal(size=(2, 5, 16)).astype("float32")
    block = L.EncoderBlock(2, 24, activation="gelu", layer_scale_init=0.5, parallel=True)
    block.build(x.shape)
    randomise(block, scale=0.5)
    assert block.norm_2 is None and block.layer_scales[1] is None
    normed = block.norm_0(x)
    expected = x + to_np(block.layer_scales[0](block.attention(normed) + block.mlp(normed)))
    np.testing.assert_allclose(to_np(block(x)), expected, rtol=1e-5, atol=1e-5)
    sequential = x + to_np(block.layer_scales[0](block.attention(normed)))
    assert np.abs(to_np(block(x)) - sequential).max() > 1e-2
    with pytest.raises(ValueError, match="takes no residual_post_norm"):
        L.EncoderBlock(2, 24, parallel=True, residual_post_norm=True)


def test_mlp_block_trains_its_gelu_in_float32_under_a_16_bit_policy():
    """Training: bfloat16 matmuls, GELU in float32 (faster on TensorFlow's CPU kernels, and more
    accurate). Inference: GELU in bfloat16, which TensorFlow fuses into the matmul before it."""
    ops = keras.ops
    layer = L.MlpBlock(64, dtype="mixed_bfloat16")
    x = np.random.default_rng(0).normal(scale=2.0, size=(2, 5, 16)).astype("float32")
    layer.build(x.shape)
    randomise(layer, scale=1.0)
    hidden = layer.dense_0(x.reshape(-1, 16))
    in_float32 = ops.cast(ops.gelu(ops.cast(hidden, "float32")), "bfloat16")
    expected = {True: to_np(layer.dense_1(in_float32)).astype("float32").reshape(x.shape),
                False: to_np(layer.dense_1(ops.gelu(hidden))).astype("float32").reshape(x.shape)}
    assert np.abs(expected[True] - expected[False]).max() > 0  # the test can tell them apart
    for training in (True, False):
        got = to_np(layer(x, training=training)).astype("float32")
        np.testing.assert_array_equal(got, expected[training], err_msg=f"training={training}")


def test_gelu_is_approximate_by_default():
    assert L.MlpBlock(8).activation == "gelu_tanh"
    block = L.EncoderBlock(2, 8)
    assert block.activation == "gelu_tanh"
    block.build((None, 3, 4))
    assert block.mlp.activation == "gelu_tanh"
    model = keras_vit.vit("B/16", image_size=16, patch_size=8, hidden_size=8, mlp_dim=16,
                          num_heads=2, num_layers=2, num_classes=2)
    for index in range(2):
        assert model.get_layer(f"encoderblock_{index}").mlp.activation == "gelu_tanh"
    # Layers and specs saved before `activation` existed say approximate_gelu.
    assert L.MlpBlock.from_config({"mlp_dim": 8, "approximate_gelu": False}).activation == "gelu"
    assert keras_vit.vit("B/16", image_size=16, patch_size=8, num_layers=1,
                         approximate_gelu=False).spec.activation == "gelu"


def test_quick_gelu_is_clips():
    layer = L.MlpBlock(16, activation="quick_gelu")
    x = np.random.default_rng(0).normal(scale=2.0, size=(2, 3, 8)).astype("float32")
    layer.build(x.shape)
    randomise(layer, scale=1.0)
    w0, b0 = (to_np(w).astype("float64") for w in layer.dense_0.weights)
    w1, b1 = (to_np(w).astype("float64") for w in layer.dense_1.weights)
    h = x.astype("float64") @ w0 + b0
    expected = (h / (1 + np.exp(-1.702 * h))) @ w1 + b1
    np.testing.assert_allclose(to_np(layer(x)), expected, rtol=1e-4, atol=1e-4)


def test_swiglu_is_a_silu_gate_on_a_second_projection():
    """SwiGLU (Shazeer, 2020; timm's `SwiGLU`): silu(x W_g + b_g) * (x W + b), then W_1."""
    layer = L.MlpBlock(16, activation="swiglu")
    x = np.random.default_rng(1).normal(scale=2.0, size=(2, 3, 8)).astype("float32")
    layer.build(x.shape)
    randomise(layer, scale=1.0)
    (w0, b0), (wg, bg), (w1, b1) = ([to_np(w).astype("float64") for w in dense.weights]
                                    for dense in (layer.dense_0, layer.gate, layer.dense_1))
    gate = x.astype("float64") @ wg + bg
    expected = (gate / (1 + np.exp(-gate)) * (x @ w0 + b0)) @ w1 + b1
    np.testing.assert_allclose(to_np(layer(x)), expected, rtol=1e-4, atol=1e-4)
    assert sorted({w.path.split("/")[-2] for w in layer.weights}) == ["Dense_0", "Dense_1",
                                                                      "Gate_0"]


def test_mlp_initialisers():
    layer = L.MlpBlock(512)
    layer.build((None, 3, 128))
    for dense, (fan_in, fan_out) in ((layer.dense_0, (128, 512)), (layer.dense_1, (512, 128))):
        kernel, bias = (to_np(w) for w in dense.weights)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        assert np.abs(kernel).max() <= limit
        assert np.abs(kernel).max() > 0.95 * limit
        assert 0.5e-6 < bias.std() < 1.5e-6, bias.std()


def _all_sublayers(layer):
    return list(layer._flatten_layers(include_self=True, recursive=True))


def test_layer_norm_epsilon_is_1e_6_everywhere():
    model = keras_vit.vit("B/16", image_size=16, patch_size=8, hidden_size=8, mlp_dim=16,
                          num_heads=2, num_layers=2, num_classes=2)
    norms = [l for l in _all_sublayers(model) if isinstance(l, keras.layers.LayerNormalization)]
    assert len(norms) == 2 * 2 + 1  # two per block + encoder_norm
    assert all(n.epsilon == 1e-6 for n in norms), [n.epsilon for n in norms]
    # Numerically: a token with variance 1e-4 is normalised with eps 1e-6, not Keras' 1e-3.
    block = model.get_layer("encoderblock_0")
    x = np.array([[[0.01, -0.01] * 4]], "float32")
    got = to_np(block.norm_0(x))
    np.testing.assert_allclose(got, x / math.sqrt(1e-4 + 1e-6), rtol=1e-4)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_layer_norm_fused_kernel_path_equals_the_two_pass_form(monkeypatch, policy, affine):
    """The backends in FUSED_LAYER_NORM_BACKENDS (torch) take keras.ops.layer_normalization;
    forced on this backend too, it gives the two-pass form's values."""
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(2, 5, 16)).astype("float32")
    layer = L.LayerNorm(center=affine, scale=affine, dtype=policy)
    layer.build(x.shape)
    randomise(layer, scale=0.5)
    two_pass = to_np(layer(x)).astype("float32")
    monkeypatch.setattr(normalization, "FUSED_LAYER_NORM_BACKENDS", (keras.backend.backend(),))
    fused = to_np(layer(x)).astype("float32")
    tolerance = 1e-5 if policy == "float32" else 1e-2
    np.testing.assert_allclose(fused, two_pass, atol=tolerance)
    mean, std = x.mean(-1, keepdims=True), x.std(-1, keepdims=True)
    if not affine:  # and both are the normalisation itself
        np.testing.assert_allclose(fused, (x - mean) / np.sqrt(std**2 + 1e-6), atol=tolerance)


def test_attention_initialisers():
    hidden = 64
    layer = L.MultiHeadSelfAttention(4)
    layer.build((None, 5, hidden))
    limit = math.sqrt(6.0 / (2 * hidden))
    for dense in (layer.query, layer.key, layer.value, layer.out):
        kernel, bias = (to_np(w) for w in dense.weights)
        assert kernel.shape == (hidden, hidden)
        assert np.abs(kernel).max() <= limit
        assert np.abs(kernel).max() > 0.95 * limit
        assert abs(kernel.std() - limit / math.sqrt(3)) < 0.05 * limit
        np.testing.assert_array_equal(bias, 0.0)


def test_attention_rejects_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="divisible by num_heads=3"):
        L.MultiHeadSelfAttention(3)(np.zeros((1, 2, 8), "float32"))


def test_encoder_block_attention_scores_are_a_softmax():
    block = L.EncoderBlock(num_heads=2, mlp_dim=16)
    x = np.random.default_rng(0).normal(size=(3, 5, 8)).astype("float32")
    block.build(x.shape)
    randomise(block, scale=0.5)
    out, scores = block(x, return_attention_scores=True)
    out, scores = to_np(out), to_np(scores)
    assert out.shape == (3, 5, 8)
    assert scores.shape == (3, 2, 5, 5)
    assert np.all(scores >= 0)
    np.testing.assert_allclose(scores.sum(axis=-1), 1.0, atol=1e-5)
    assert scores.std() > 1e-3  # not uniform: the weights depend on the tokens
    np.testing.assert_allclose(to_np(block(x)), out, rtol=1e-6, atol=1e-6)


def test_encoder_block_returns_attention_scores_in_a_functional_model():
    inputs = keras.Input(shape=(5, 8))
    block = L.EncoderBlock(num_heads=2, mlp_dim=16)
    result = block(inputs, return_attention_scores=True)
    assert isinstance(result, (tuple, list)) and len(result) == 2
    out, scores = result
    assert tuple(out.shape) == (None, 5, 8)
    assert tuple(scores.shape) == (None, 2, 5, 5)


def test_encoder_block_is_pre_norm_residual():
    # With the attention output and MLP output projections zeroed, the block is the identity.
    block = L.EncoderBlock(num_heads=2, mlp_dim=16)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    block.build(x.shape)
    randomise(block, scale=0.5)
    for dense in (block.attention.out, block.mlp.dense_1):
        for w in dense.weights:
            w.assign(np.zeros(w.shape, "float32"))
    np.testing.assert_allclose(to_np(block(x)), x, rtol=1e-6, atol=1e-6)


def test_residual_post_norm_norms_each_branch_before_adding_it():
    """timm's ResPostBlock (Swin V2's res-post-norm): x + LN(MSA(x)), then + LN(MLP(.)), with
    the pre-norm block's weights."""
    block = L.EncoderBlock(num_heads=2, mlp_dim=16, activation="gelu", residual_post_norm=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    block.build(x.shape)
    randomise(block, scale=0.5)
    w = {f"b/{v.path.split('/', 1)[1]}": to_np(v).astype("float64") for v in block.weights}
    ref = numpy_reference
    attention = ref.multi_head_self_attention(x, w, "b/MultiHeadDotProductAttention_1", 2)
    y = x + ref.layer_norm(attention, w["b/LayerNorm_0/gamma"], w["b/LayerNorm_0/beta"])
    mlp = ref.mlp_block(y, w, "b/MlpBlock_3", approximate_gelu=False)
    expected = y + ref.layer_norm(mlp, w["b/LayerNorm_2/gamma"], w["b/LayerNorm_2/beta"])
    np.testing.assert_allclose(to_np(block(x.astype("float32"))), expected, atol=1e-4)
    pre = L.EncoderBlock(num_heads=2, mlp_dim=16, activation="gelu")
    pre.build(x.shape)
    pre.set_weights(block.get_weights())
    assert np.abs(to_np(pre(x.astype("float32"))) - expected).max() > 0.1


# ---------------------------------------------------------------------------------------------
# DropPath


def test_drop_path_is_identity_at_inference():
    layer = L.DropPath(0.5, seed=1)
    x = np.random.default_rng(0).normal(size=(8, 3, 4)).astype("float32")
    np.testing.assert_array_equal(to_np(layer(x)), x)
    np.testing.assert_array_equal(to_np(layer(x, training=False)), x)
    np.testing.assert_array_equal(to_np(L.DropPath(0.0)(x, training=True)), x)


@pytest.mark.parametrize("rate", [0.25, 0.5])
def test_drop_path_drops_whole_samples_and_rescales(rate):
    layer = L.DropPath(rate, seed=7)
    x = np.ones((2000, 3, 4), "float32")
    out = to_np(layer(x, training=True))
    per_sample = out.reshape(2000, -1)
    # Each sample is either entirely dropped or entirely kept and scaled by 1 / (1 - rate).
    kept = np.all(per_sample == np.float32(1.0 / (1.0 - rate)), axis=1)
    dropped = np.all(per_sample == 0.0, axis=1)
    assert np.all(kept | dropped)
    assert abs(dropped.mean() - rate) < 0.05
    assert abs(out.mean() - 1.0) < 0.1
    # A second call draws a new mask.
    again = to_np(layer(x, training=True)).reshape(2000, -1)
    assert not np.array_equal(again, per_sample)


def test_drop_path_rejects_bad_rates():
    for rate in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            L.DropPath(rate)


# ---------------------------------------------------------------------------------------------
# ResNet pieces


@pytest.mark.parametrize("kernel_scale", [2.0, 0.01])
def test_std_conv_standardises_the_kernel_per_output_channel(kernel_scale):
    layer = R.StdConv2D(6, 1)
    x = np.random.default_rng(0).normal(size=(2, 3, 3, 5)).astype("float32")
    layer.build(x.shape)
    kernel = np.random.default_rng(1).normal(loc=0.3, scale=kernel_scale, size=(1, 1, 5, 6))
    kernel = kernel.astype("float32")
    layer.kernel.assign(kernel)
    w = kernel.reshape(5, 6).astype("float64")
    # (w - mean) / (std + 1e-5) with the population std over the spatial and input axes. With
    # the small kernel the epsilon's placement matters (sqrt(var + eps) would be 5% off).
    standardised = (w - w.mean(axis=0)) / (w.std(axis=0) + 1e-5)
    expected = np.einsum("bhwc,cd->bhwd", x, standardised)
    np.testing.assert_allclose(to_np(layer(x)), expected, rtol=1e-4, atol=1e-4)
    # Nearly invariant to an affine change of each output channel's kernel.
    layer.kernel.assign(kernel * 3.0 + 1.0)
    np.testing.assert_allclose(to_np(layer(x)), expected, rtol=1e-2, atol=1e-2)
    assert layer.use_bias is False and layer.padding == "same"


def test_timm_numerics_standardise_by_the_variance_and_norm_groups_with_its_epsilon():
    """`numerics="timm"` (timm's ResNetV2: StdConv2dSame(eps=1e-8), GroupNormAct(eps=1e-5)):
    (w - mean) / sqrt(var + 1e-8); and every GroupNorm of the stem and units at 1e-5. The
    small kernel tells the two standardisations apart."""
    layer = R.StdConv2D(6, 1, numerics="timm")
    x = np.random.default_rng(0).normal(size=(2, 3, 3, 5)).astype("float32")
    layer.build(x.shape)
    kernel = np.random.default_rng(1).normal(loc=0.0, scale=0.0003, size=(1, 1, 5, 6))
    layer.kernel.assign(kernel.astype("float32"))
    w = kernel.astype("float32").astype("float64").reshape(5, 6)
    ours = np.einsum("bhwc,cd->bhwd", x, (w - w.mean(0)) / np.sqrt(w.var(0) + 1e-8))
    original = np.einsum("bhwc,cd->bhwd", x, (w - w.mean(0)) / (w.std(0) + 1e-5))
    np.testing.assert_allclose(to_np(layer(x)), ours, rtol=1e-4, atol=1e-4)
    assert np.abs(ours - original).max() > 0.05
    model = keras_vit.vit("R+Ti/16", image_size=32, num_layers=1, resnet_numerics="timm")
    epsilons = {layer.epsilon for layer in model.get_layer("resnet_root")._flatten_layers()
                if isinstance(layer, R.GroupNorm)}
    assert epsilons == {1e-5}
    assert R.StdConv2D.from_config(layer.get_config()).numerics == "timm"
    # The timm layout (which imports no Keras) checks timm's hybrids against the same numbers.
    from keras_vit.weights.torch_layouts import timm_hybrid
    epsilon, _, group_norm_epsilon = R.NUMERICS["timm"]
    assert timm_hybrid.TIMM_RESNET_EPSILONS == (epsilon, group_norm_epsilon)


def test_resnet_stem_structure():
    stem = R.ResNetStem(32)
    x = np.random.default_rng(0).normal(size=(2, 32, 24, 3)).astype("float32")
    out = to_np(stem(x))
    assert out.shape == (2, 8, 6, 32)
    assert np.all(out >= 0)  # ReLU
    assert isinstance(stem.conv_root, R.StdConv2D)
    assert stem.conv_root.kernel_size == (7, 7) and stem.conv_root.strides == (2, 2)
    assert stem.gn_root.groups == 32 and stem.gn_root.epsilon == 1e-6
    with pytest.raises(ValueError, match="3 channels"):
        stem(np.zeros((1, 32, 24, 1), "float32"))


@pytest.mark.parametrize("channels", [64, 256])  # 2 and 8 channels in each of 32 groups
def test_group_norm_matches_the_reference_and_keras_group_normalization(channels):
    rng = np.random.default_rng(0)
    # Each channel with its own offset and scale: a group's mean and variance differ from
    # its channels' own, so normalising per channel instead of per group would fail.
    x = (rng.normal(size=(3, 5, 7, channels)) * rng.uniform(0.5, 4, channels)
         + rng.normal(size=channels) * 3).astype("float32")
    gamma, beta = rng.normal(size=(2, channels)).astype("float32")
    ours = R.GroupNorm(groups=32, epsilon=1e-6)
    theirs = keras.layers.GroupNormalization(groups=32, epsilon=1e-6)
    for layer in (ours, theirs):
        layer.build(x.shape)
        layer.set_weights([gamma, beta])
    expected = numpy_reference.group_norm(x.astype("float64"), gamma, beta)
    np.testing.assert_allclose(to_np(ours(x)), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_np(ours(x)), to_np(theirs(x)), rtol=1e-5, atol=1e-5)
    # Training takes Keras' own computation.
    np.testing.assert_allclose(to_np(ours(x, training=True)), expected, rtol=1e-5, atol=1e-5)
    half = R.GroupNorm(groups=32, epsilon=1e-6, dtype="mixed_bfloat16")
    half.build(x.shape)
    half.set_weights([gamma, beta])
    output = half(x)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    np.testing.assert_allclose(to_np(keras.ops.cast(output, "float32")), expected,
                               rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow gradients")
def test_group_norm_inference_gradients_equal_keras_group_normalization():
    """Gradients through the inference computation (attribution maps take them) with respect
    to the input and both weights, against Keras' layer."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = tf.constant((rng.normal(size=(2, 4, 6, 64)) + rng.normal(size=64)).astype("float32"))
    gamma, beta = rng.normal(size=(2, 64)).astype("float32")
    grads = []
    for layer in (R.GroupNorm(groups=32, epsilon=1e-6),
                  keras.layers.GroupNormalization(groups=32, epsilon=1e-6)):
        layer.build(x.shape)
        layer.set_weights([gamma, beta])
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.sin(3.0 * layer(x, training=False)))
        grads.append(tape.gradient(loss, [x, layer.gamma, layer.beta]))
    for ours, theirs in zip(*grads):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="inspects a TF graph")
def test_group_norm_graph_has_no_5d_tensor():
    """Keras' layer reshapes maps to [N, H, W, groups, C / groups], which LiteRT runs slowly;
    every tensor of ours has at most the input's 4 dimensions."""
    import tensorflow as tf

    layer = R.GroupNorm(groups=32, epsilon=1e-6)
    graph = tf.function(layer).get_concrete_function(
        tf.TensorSpec([None, 16, 16, 64], tf.float32)).graph
    ranks = [(op.type, output.shape.rank) for op in graph.get_operations()
             for output in op.outputs if output.shape.rank is not None]
    assert ranks and max(rank for _, rank in ranks) == 4, ranks


def test_resnet_stem_is_conv_groupnorm_relu_then_max_pool():
    """The stem pools before its ReLU (cheaper): the same values as the original's ReLU then
    pool, and on TensorFlow the same gradients, in training (custom gradient) and not."""
    stem = R.ResNetStem(32)
    x = np.random.default_rng(0).normal(size=(2, 15, 16, 3)).astype("float32")
    stem(x)
    randomise(stem)
    normed = to_np(stem.gn_root(stem.conv_root(x)))
    expected = numpy_reference.max_pool_same(np.maximum(normed, 0.0), 3, 2)
    np.testing.assert_array_equal(to_np(stem(x)), expected)
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    def gradients(forward):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(forward(tf.constant(x))))
        return tape.gradient(loss, stem.trainable_variables)

    def relu_then_pool(images, training):
        normed = stem.gn_root(stem.conv_root(images), training=training)
        return tf.nn.max_pool2d(tf.nn.relu(normed), 3, 2, "SAME")

    for training in (True, False):  # training takes the pool with the custom gradient
        original = gradients(lambda images, training=training: relu_then_pool(images, training))
        ours = gradients(lambda images, training=training: stem(images, training=training))
        for mine, theirs in zip(ours, original):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def _max_pool_3x3_stride_2_gradient(x, upstream):
    """By hand: each window's gradient goes to the first input, row-major, holding its max."""
    top = numpy_reference.same_padding(x.shape[1], 3, 2)[0]
    left = numpy_reference.same_padding(x.shape[2], 3, 2)[0]
    grad = np.zeros_like(x)
    for b, i, j, c in np.ndindex(*upstream.shape):
        rows = [r for r in range(2 * i - top, 2 * i - top + 3) if 0 <= r < x.shape[1]]
        columns = [q for q in range(2 * j - left, 2 * j - left + 3) if 0 <= q < x.shape[2]]
        window = [(r, q) for r in rows for q in columns]
        r, q = max(window, key=lambda p: (x[b, p[0], p[1], c], -window.index(p)))
        grad[b, r, q, c] += upstream[b, i, j, c]
    return grad


def _vjp(fn, x, upstream, jit=False):
    """fn's vector-Jacobian product at x on the current backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=jit, autograph=False)
        def pullback(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            return tape.gradient(y, x, output_gradients=tf.constant(upstream))
        return pullback(tf.constant(x)).numpy()
    if backend == "jax":
        import jax
        _, pullback = jax.vjp(fn, jax.numpy.asarray(x))
        if jit:
            pullback = jax.jit(pullback)
        return np.asarray(pullback(jax.numpy.asarray(upstream))[0])
    if backend == "torch":
        import torch
        x = torch.tensor(x, requires_grad=True)
        fn(x).backward(torch.tensor(upstream))
        return x.grad.cpu().numpy()
    pytest.skip(f"no gradient helper for the {backend} backend")


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("shape", [(2, 16, 16, 3), (2, 15, 17, 2), (1, 1, 2, 1)])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_max_pool_3x3_stride_2_values_and_gradient(shape, ties, jit):
    """The stem's max-pool: the values of a "same" 3x3/2 max-pool, and its custom gradient
    sends each window's gradient to the first input (row-major) holding the maximum. Integer
    gradients keep the sums of overlapping windows exact."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=shape).astype("float32")
    if ties:
        x = np.round(x)  # many equal values per window
    expected = numpy_reference.max_pool_same(x, 3, 2)
    np.testing.assert_array_equal(to_np(R.max_pool_3x3_stride_2(x)), expected)
    upstream = rng.integers(1, 100, size=expected.shape).astype("float32")
    np.testing.assert_array_equal(_vjp(R.max_pool_3x3_stride_2, x, upstream, jit),
                                  _max_pool_3x3_stride_2_gradient(x, upstream))


def test_resnet_stem_pools_with_the_custom_gradient_only_in_training(monkeypatch):
    """Training takes the pool with the custom gradient; inference the plain op, which the
    TFLite export can freeze (tests/library/deploy/test_export.py::test_tflite_hybrid)."""
    calls = []
    pool = R.max_pool_3x3_stride_2
    monkeypatch.setattr(R, "max_pool_3x3_stride_2", lambda x: calls.append(x.shape) or pool(x))
    stem = R.ResNetStem(32)
    x = np.random.default_rng(0).normal(size=(2, 16, 16, 3)).astype("float32")
    inference = to_np(stem(x))
    assert calls == []
    # The same values; GroupNorm computes them by another route in training (float rounding).
    np.testing.assert_allclose(to_np(stem(x, training=True)), inference, rtol=1e-5, atol=1e-6)
    assert len(calls) == 1


def test_bottleneck_unit_initialisation_and_structure():
    unit = R.BottleneckUnit(32)
    x = np.random.default_rng(0).normal(size=(2, 4, 4, 128)).astype("float32")
    out = to_np(unit(x))
    assert not unit.needs_projection
    # gn3's scale starts at zero, so at initialisation the unit is relu(residual).
    np.testing.assert_array_equal(to_np(unit.gn3.gamma), 0.0)
    np.testing.assert_array_equal(to_np(unit.gn1.gamma), 1.0)
    np.testing.assert_allclose(out, np.maximum(x, 0.0), atol=1e-6)
    for gn in (unit.gn1, unit.gn2, unit.gn3):
        assert gn.groups == 32 and gn.epsilon == 1e-6
    assert unit.conv2.kernel_size == (3, 3)

    strided = R.BottleneckUnit(32, strides=2)
    out = to_np(strided(np.ones((1, 8, 8, 64), "float32")))
    assert strided.needs_projection
    assert out.shape == (1, 4, 4, 128)
    assert strided.conv2.strides == (2, 2) and strided.conv_proj.strides == (2, 2)
    assert strided.conv1.strides == (1, 1)


def test_resnet_stage_units():
    stage = R.ResNetStage(3, 32, first_stride=2)
    out = stage(np.ones((1, 8, 8, 64), "float32"))
    assert tuple(out.shape) == (1, 4, 4, 128)
    assert [u.name for u in stage.units] == ["unit1", "unit2", "unit3"]
    assert [u.strides for u in stage.units] == [2, 1, 1]
    assert [u.needs_projection for u in stage.units] == [True, False, False]

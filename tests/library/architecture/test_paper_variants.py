"""The paper's other architectures (appendix D.4 and D.6): relative position embeddings, the
every-layer placements of learned position embeddings, and Axial-ViT. Each is checked against a
loop or a NumPy reference written from the paper's description, then as a whole model: .keras
round trips in safe mode, XLA, mixed_bfloat16 and attention_model()."""

import keras
import numpy as np
import numpy_reference as ref
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import layers as L
from model_fixtures import randomise

pytestmark = pytest.mark.usefixtures("fresh_session")

SMALL = dict(image_size=32, patch_size=8, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=3,
             num_classes=5)  # a 4x4 grid of patches


def to_np(x):
    return keras.ops.convert_to_numpy(x)


def weights_by_path(layer):
    return {variable.path: to_np(variable) for variable in layer.weights}


# ---------------------------------------------------------------------------------------------
# Relative position embeddings (D.4)


def loop_relative_bias(queries, tables, coordinates, prefix):
    """The bias by the definition: for every (query, key) pair, the query dotted with the
    embedding of their offset along each axis; pairs with a prefix token use the extra last
    row of each table."""
    batch, heads, tokens, _ = queries.shape
    bias = np.zeros((batch, heads, tokens, tokens))
    for q in range(tokens):
        for k in range(tokens):
            for table, coordinate in zip(tables, coordinates):
                positions = (len(table) - (1 if prefix else 0) + 1) // 2
                if q < prefix or k < prefix:
                    row = len(table) - 1
                else:
                    row = coordinate[q - prefix] - coordinate[k - prefix] + positions - 1
                for h in range(heads):
                    bias[:, h, q, k] += queries[:, h, q] @ table[row, h]
    return bias


def test_relative_bias_of_three_patches_and_a_class_token_matches_the_loop():
    layer = L.RelativePositionBias((1, 3), num_heads=2, num_prefix_tokens=1, kind="1d")
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(2, 2, 4, 5)).astype("float32")  # 1 class token + 3 patches
    layer.build(queries.shape)
    table = rng.normal(size=(6, 2, 5)).astype("float32")  # offsets -2..2, then the class token
    layer.tables[0].assign(table)
    got = to_np(layer(queries))
    expected = loop_relative_bias(queries, [table], [np.arange(3)], prefix=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # By hand for one entry: patch 2 attending to patch 0 has offset +2, the table's last
    # offset row (index 4); the class token's pairs use row 5.
    np.testing.assert_allclose(got[1, 0, 3, 1], queries[1, 0, 3] @ table[4, 0], rtol=1e-5)
    np.testing.assert_allclose(got[1, 1, 2, 0], queries[1, 1, 2] @ table[5, 1], rtol=1e-5)
    np.testing.assert_allclose(got[1, 1, 0, 3], queries[1, 1, 0] @ table[5, 1], rtol=1e-5)


def test_relative_2d_bias_sums_row_and_column_offsets():
    layer = L.RelativePositionBias((2, 3), num_heads=2, num_prefix_tokens=0, kind="2d")
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(1, 2, 6, 4)).astype("float32")
    layer.build(queries.shape)
    assert [tuple(t.shape) for t in layer.tables] == [(3, 2, 4), (5, 2, 4)]  # no prefix row
    tables = [rng.normal(size=tuple(t.shape)).astype("float32") for t in layer.tables]
    for variable, value in zip(layer.tables, tables):
        variable.assign(value)
    rows, columns = np.divmod(np.arange(6), 3)
    expected = loop_relative_bias(queries, tables, [rows, columns], prefix=0)
    np.testing.assert_allclose(to_np(layer(queries)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, grid", [("1d", (2, 3)), ("2d", (3, 3))])
def test_with_zero_content_weights_attention_depends_only_on_the_offset(kind, grid):
    attention = L.MultiHeadSelfAttention(2, relative_position=kind, grid_size=grid,
                                         num_prefix_tokens=1)
    patches = grid[0] * grid[1]
    x = np.random.default_rng(2).normal(size=(1, patches + 1, 8)).astype("float32")
    attention.build(x.shape)
    randomise(attention)
    # Zero content: every key is 0 and every query is the same vector (its bias), so the
    # logits come from the relative embeddings alone.
    attention.key.kernel.assign(np.zeros((8, 8)))
    attention.key.bias.assign(np.zeros(8))
    attention.query.kernel.assign(np.zeros((8, 8)))
    _, weights = attention(x, return_attention_scores=True)
    log_weights = np.log(to_np(weights)[0, :, 1:, 1:])  # [heads, patch query, patch key]
    # Within a row of the softmax, logit differences are log-weight differences.
    relative = log_weights - log_weights[:, :, :1]
    rows, columns = np.divmod(np.arange(patches), grid[1])
    offsets = {}
    for q in range(patches):
        for k in range(patches):
            if kind == "1d":
                offset = (q - k, q - 0)
            else:
                offset = (rows[q] - rows[k], columns[q] - columns[k], rows[q], columns[q])
            offsets.setdefault(offset, []).append(relative[:, q, k])
    for offset, values in offsets.items():  # equal along every diagonal...
        np.testing.assert_allclose(values, [values[0]] * len(values), rtol=1e-4, atol=1e-5)
    assert np.ptp(relative) > 0.1  # ...but not constant: the offsets matter


def test_relative_mlp_logits_are_the_mlp_of_each_log_spaced_offset():
    """`RelativePositionMlp` against its definition written out pair by pair: the (row,
    column) offset of query and key patches, sign(d) log(1 + |d|), through ReLU(x W1 + b1) W2
    + b2; zero for pairs with the class token. At the weights' grid and at another."""
    layer = L.RelativePositionMlp((3, 4), num_heads=2, num_prefix_tokens=1, hidden_dim=6)
    layer.build()
    randomise(layer, scale=1.0)
    w1, b1, w2, b2 = (to_np(v).astype("float64") for v in
                      (layer.fc1.kernel, layer.fc1.bias, layer.fc2.kernel, layer.fc2.bias))
    queries = np.zeros((1, 2, 1, 4), "float32")
    for rows, columns in ((3, 4), (2, 5)):
        grid = None if (rows, columns) == (3, 4) else np.zeros((1, rows, columns, 4), "float32")
        got = to_np(layer(queries, grid=grid))[0]
        patches = rows * columns
        expected = np.zeros((2, patches + 1, patches + 1))
        for q in range(patches):
            for k in range(patches):
                d = np.array([q // columns - k // columns, q % columns - k % columns], float)
                x = np.sign(d) * np.log1p(np.abs(d))
                expected[:, 1 + q, 1 + k] = np.maximum(x @ w1 + b1, 0) @ w2 + b2
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert np.ptp(expected[:, 1:, 1:]) > 0.1


def test_relative_attention_matches_the_numpy_reference():
    attention = L.MultiHeadSelfAttention(2, relative_position="1d", grid_size=(2, 2),
                                         num_prefix_tokens=1, name="attention")
    x = np.random.default_rng(3).normal(size=(2, 5, 8)).astype("float32")
    attention.build(x.shape)
    randomise(attention)
    w = weights_by_path(attention)
    table = w["attention/relative_position/offset_embedding"]
    bias = lambda q: loop_relative_bias(q, [table], [np.arange(4)], prefix=1)  # noqa: E731
    expected = ref.multi_head_self_attention(x, w, "attention", 2, logit_bias=bias)
    np.testing.assert_allclose(to_np(attention(x)), expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Axial attention (D.6)


@pytest.mark.parametrize("axis", ["row", "column"])
def test_axial_block_equals_full_attention_masked_to_its_row_or_column(axis):
    rows, columns = 3, 4
    block = L.AxialEncoderBlock(axis, (rows, columns), num_heads=2, mlp_dim=12,
                                name="encoderblock_0_" + axis)
    x = np.random.default_rng(4).normal(size=(2, rows * columns, 8)).astype("float32")
    block.build(x.shape)
    randomise(block)
    row, column = np.divmod(np.arange(rows * columns), columns)
    line = row if axis == "row" else column
    mask = np.where(line[:, None] == line[None, :], 0.0, -1e9)
    expected = ref.encoder_block(x, weights_by_path(block), block.name, 2,
                                 logit_bias=lambda q: mask)
    output, weights = block(x, return_attention_scores=True)
    np.testing.assert_allclose(to_np(output), expected, rtol=1e-4, atol=1e-4)
    # The weights come back as the full matrix: zero across lines, rows summing to 1.
    weights = to_np(weights)
    assert weights.shape == (2, 2, 12, 12)
    assert np.all(weights[..., mask < 0] == 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(to_np(block(x)), to_np(output))


def test_axial_vit_alternates_row_and_column_blocks_without_a_class_token():
    model = keras_vit.vit("Axial-B/16", **SMALL)
    blocks = [layer for layer in model.layers if isinstance(layer, L.EncoderBlock)]
    assert [(b.name, b.axis, b.grid_size) for b in blocks] == [
        (f"encoderblock_{i}_{axis}", axis, (4, 4)) for i in range(3) for axis in L.AXES]
    assert model.get_layer("pool").classifier == "gap"
    assert not any(isinstance(layer, L.ClassToken) for layer in model.layers)
    # Twice the blocks of the ViT with the same settings and a GAP head, nothing else.
    vit = keras_vit.vit("B/16", classifier="gap", **SMALL)
    block_params = vit.get_layer("encoderblock_0").count_params()
    assert model.count_params() == vit.count_params() + SMALL["num_layers"] * block_params


def test_axial_names_parse_for_every_plain_variant():
    for name in ("Axial-Ti/16", "Axial-S/32", "Axial-B/16", "Axial-B/32", "Axial-H/14"):
        config = keras_vit.parse_variant(name)
        assert config.axial and config.variant == name and config.resnet_units is None
        assert config.patch_size == keras_vit.parse_variant(name[len("Axial-"):]).patch_size
    for name in ("Axial-R+Ti/16", "Axial-B/15", "axial-B/16"):
        with pytest.raises(ValueError, match="Axial-"):
            keras_vit.parse_variant(name)


# ---------------------------------------------------------------------------------------------
# Placements of learned position embeddings (D.4, Table 8)


def added_before_each_block(model, x):
    """What is added to the tokens between block i-1's output and block i's input."""
    blocks = [layer for layer in model.layers if isinstance(layer, L.EncoderBlock)]
    probe = keras.Model(model.input, [b.input for b in blocks] + [b.output for b in blocks])
    tensors = [to_np(t) for t in probe(x)]
    inputs, outputs = tensors[:len(blocks)], tensors[len(blocks):]
    return [inputs[i] - outputs[i - 1] for i in range(1, len(blocks))]


@pytest.mark.parametrize("kind", ["learned", "learned_2d"])
def test_every_layer_shared_adds_one_tensor_and_every_layer_different_ones(kind):
    x = np.random.default_rng(5).uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")
    shared = keras_vit.vit("B/16", position_embedding=kind,
                           position_embedding_placement="every_layer_shared", **SMALL)
    randomise(shared)
    stem = to_np(shared.get_layer("posembed_input").embeddings())
    for added in added_before_each_block(shared, x):
        np.testing.assert_allclose(added, np.broadcast_to(stem, added.shape), atol=1e-5)

    separate = keras_vit.vit("B/16", position_embedding=kind,
                             position_embedding_placement="every_layer", **SMALL)
    randomise(separate)
    added = added_before_each_block(separate, x)
    for index, tensor in enumerate(added, start=1):
        own = to_np(separate.get_layer(f"posembed_{index}").embeddings())
        np.testing.assert_allclose(tensor, np.broadcast_to(own, tensor.shape), atol=1e-5)
    assert np.abs(added[0] - added[1]).max() > 0.1

    stem_only = keras_vit.vit("B/16", position_embedding=kind, **SMALL)
    assert all(np.abs(t).max() < 1e-6 for t in added_before_each_block(stem_only, x))


def test_parameter_counts_follow_from_the_shapes():
    d, layers, grid, heads = SMALL["hidden_size"], SMALL["num_layers"], 16, SMALL["num_heads"]
    count = lambda **kwargs: keras_vit.vit("B/16", **SMALL, **kwargs).count_params()  # noqa
    base = count()
    learned = (grid + 1) * d  # one D-vector per token, class token included
    learned_2d = 4 * d // 2 + 4 * d // 2 + d  # rows, columns, class token
    assert count(position_embedding="none") == base - learned
    assert count(position_embedding_placement="every_layer") == base + (layers - 1) * learned
    assert count(position_embedding_placement="every_layer_shared") == base
    assert (count(position_embedding="learned_2d", position_embedding_placement="every_layer")
            == base - learned + layers * learned_2d)
    # Relative: per block, (2 * 16 - 1) offsets + 1 class-token row, each heads x head_dim.
    assert count(position_embedding="relative") == base - learned + layers * (2 * grid) * d
    # 2-D: (2 * 4 - 1) row offsets and as many column offsets, each + 1 class-token row.
    assert count(position_embedding="relative_2d") == base - learned + layers * 2 * 8 * d
    assert heads * (d // heads) == d


@pytest.mark.parametrize("kwargs, message", [
    (dict(position_embedding="none", position_embedding_placement="every_layer"),
     "needs position_embedding 'learned' or 'learned_2d'"),
    (dict(position_embedding="relative", position_embedding_placement="every_layer_shared"),
     "placement 'stem'"),
    (dict(position_embedding_placement="everywhere"), "position_embedding_placement='everywhere': must be one of"),
    (dict(position_embedding="rotary"), "position_embedding='rotary': must be one of"),
    (dict(variant="Axial-B/16", classifier="token"), "classifier='gap'"),
    (dict(variant="Axial-B/16", position_embedding="relative"), "takes no relative"),
])
def test_clear_errors_for_combinations_that_make_no_sense(kwargs, message):
    variant = kwargs.pop("variant", "B/16")
    with pytest.raises(ValueError, match=message):
        keras_vit.vit(variant, **SMALL, **kwargs)


# ---------------------------------------------------------------------------------------------
# Every new variant as a whole model


VARIANTS = {
    "relative": ("B/16", dict(position_embedding="relative")),
    "relative_2d_gap": ("B/16", dict(position_embedding="relative_2d", classifier="gap")),
    "every_layer_2d": ("B/16", dict(position_embedding="learned_2d",
                                    position_embedding_placement="every_layer")),
    "every_layer_shared": ("B/16", dict(position_embedding_placement="every_layer_shared")),
    "axial": ("Axial-B/16", {}),
    "sincos_2d": ("B/16", dict(position_embedding="sincos_2d")),
    # The later options, several to a model (each model is compiled, saved and run 5 ways).
    "dinov3_like": ("B/16", dict(rope="axial_normalized", position_embedding="none",
                                 num_register_tokens=1, layer_scale_init=1.0, classifier="gap",
                                 class_token=True)),
    "eva02_like": ("B/16", dict(classifier="gap", class_token=True, final_norm="pooled",
                                activation="swiglu", mlp_inner_norm=True,
                                attention_inner_norm=True, rope="axial", rope_grid_offset=1.0,
                                rope_reference_grid=(2, 2))),
    "rope_mixed_post_norm_map": ("B/16", dict(rope="mixed", residual_post_norm=True,
                                              classifier="map", class_token=True,
                                              map_num_heads=1, map_mlp_dim=8,
                                              map_include_prefix=True)),
    "relative_mlp_token_gap": ("B/16", dict(position_embedding="relative_mlp",
                                            relative_mlp_dim=16, classifier="token_gap",
                                            num_register_tokens=1)),
    "hybrid_timm_numerics": ("R+Ti/16", dict(resnet_numerics="timm", patch_size=2)),
}


def build(case, **kwargs):
    variant, options = VARIANTS[case]
    return keras_vit.vit(variant, **{**SMALL, **options}, **kwargs)


def images(batch=2, seed=6):
    return np.random.default_rng(seed).uniform(-1, 1, size=(batch, 32, 32, 3)).astype("float32")


@pytest.mark.parametrize("case", list(VARIANTS))
def test_round_trips_in_safe_mode_and_compiles_with_xla(case, tmp_path):
    model = build(case)
    randomise(model, scale=0.2)
    x = images()
    expected = to_np(model(x))
    assert np.abs(expected).max() > 1e-2
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras", safe_mode=True)
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in model.layers]
    np.testing.assert_allclose(to_np(loaded(x)), expected, rtol=1e-6, atol=1e-6)
    forward = tf.function(lambda t: model(t, training=False), jit_compile=True)
    np.testing.assert_allclose(to_np(forward(tf.constant(x))), expected, rtol=1e-4, atol=1e-4)
    assert "HloModule" in forward.experimental_get_compiler_ir(tf.constant(x))(stage="hlo")


@pytest.mark.parametrize("case", list(VARIANTS))
def test_mixed_bfloat16_gives_float32_outputs_close_to_float32(case):
    reference = build(case)
    randomise(reference, scale=0.1)
    mixed = build(case, dtype="mixed_bfloat16")
    mixed.set_weights(reference.get_weights())
    x = images(batch=3)
    expected, got = to_np(reference(x)), mixed(x)
    assert got.dtype == "float32"
    scale = np.abs(expected).max()
    np.testing.assert_allclose(to_np(got), expected, atol=0.05 * scale + 1e-3)


@pytest.mark.parametrize("case", list(VARIANTS))
def test_attention_model_returns_every_block_and_leaves_the_model_alone(case):
    model = build(case)
    randomise(model, scale=0.2)
    x = images()
    before = to_np(model(x))
    maps = keras_vit.attention_model(model)(x)
    blocks = 2 * SMALL["num_layers"] if case == "axial" else SMALL["num_layers"]
    tokens = 16 + model.spec.num_prefix_tokens
    assert len(maps) == blocks
    for scores in maps:
        assert to_np(scores).shape == (2, 2, tokens, tokens)
        np.testing.assert_allclose(to_np(scores).sum(-1), 1.0, atol=1e-5)
    # The last block's maps equal the block's own, run on its real input.
    last = [layer for layer in model.layers if isinstance(layer, L.EncoderBlock)][-1]
    last_input = keras.Model(model.input, last.input)(x)
    _, own = last(last_input, return_attention_scores=True)
    np.testing.assert_allclose(to_np(maps[-1]), to_np(own), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(to_np(model(x)), before)
    assert all(block.attention_recorder is None for block in model.layers
               if isinstance(block, L.EncoderBlock))


@pytest.mark.parametrize("case", ["relative", "every_layer_2d", "axial"])
def test_npz_round_trip_keeps_the_outputs(case, tmp_path):
    model = build(case)
    randomise(model, scale=0.2)
    keras_vit.weights.checkpoint.save_npz(model, tmp_path / "w.npz")
    with np.load(tmp_path / "w.npz", allow_pickle=False) as archive:
        assert all(key.startswith(("Transformer/", "embedding/", "cls", "head/"))
                   for key in archive.files), archive.files
    again = build(case)
    keras_vit.weights.checkpoint.load_npz(again, str(tmp_path / "w.npz"))
    x = images()
    np.testing.assert_array_equal(to_np(again(x)), to_np(model(x)))

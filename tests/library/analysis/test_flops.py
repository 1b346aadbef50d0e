"""keras_vit.analysis.flops, checked two independent ways: against TensorFlow's own FLOP count of
the traced graph, and against formulas written from the paper's shapes.

TensorFlow's profiler registers FLOP statistics (2 per multiply-add) for Conv2D, MatMul and
BatchMatMul/V2/V3, the ops every convolution, dense layer and attention matmul of keras_vit
lowers to; it also counts elementwise ops, which `forward_flops` leaves out by convention, so
the comparison keeps those three op types only. It has no statistics for Einsum: the graphs
are checked to hold none, so nothing goes uncounted on either side.
"""

import keras
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.analysis import flops

# Tiny transformers: the count depends on the shapes only, so small widths test every formula.
TINY = dict(hidden_size=16, mlp_dim=24, num_heads=2, num_layers=2, num_classes=5)
COUNTED_OPS = ("Conv2D", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def tensorflow_flops(model):
    """FLOPs of the Conv2D and (Batch)MatMul ops in the traced batch-1 graph of `model`."""
    profiler = tf.compat.v1.profiler  # the graph profiler, public under compat.v1
    spec = tf.TensorSpec((1,) + tuple(model.input_shape[1:]), tf.float32)
    graph = tf.function(lambda images: model(images, training=False)).get_concrete_function(
        spec).graph
    op_types = {node.type for node in graph.get_operations()}
    assert "Einsum" not in op_types, "TensorFlow's profiler does not count Einsum"
    assert op_types & set(COUNTED_OPS), "no matmul in the graph: nothing to compare"
    builder = profiler.ProfileOptionBuilder
    options = (builder(builder.float_operation())
               .with_accounted_types([f"^{op}$" for op in COUNTED_OPS])
               .with_empty_output()
               .build())
    return profiler.profile(graph, options=options).total_float_ops


def tiny_image_size(variant):
    """A 2x3 patch grid: rows != columns, so row and column attention cost different amounts."""
    stride = keras_vit.parse_variant(variant).total_stride
    return (2 * stride, 3 * stride)


@pytest.mark.parametrize("variant", list(keras_vit.VARIANT_NAMES))  # a new variant is tested too
def test_every_variant_matches_tensorflows_count(variant):
    model = keras_vit.vit(variant, image_size=tiny_image_size(variant), **TINY)
    assert flops.forward_flops(model) == tensorflow_flops(model)


@pytest.mark.parametrize("options", [
    dict(classifier="gap", include_top=False),
    dict(representation_size=12),
    dict(position_embedding="relative"),
    dict(position_embedding="relative_2d", classifier="gap"),
    dict(position_embedding="learned_2d", position_embedding_placement="every_layer"),
    dict(classifier="map", num_register_tokens=2),  # attention pooling of the patches only
    dict(num_register_tokens=3, layer_scale_init=0.1, qkv_bias=False, pre_norm=True),
    dict(classifier="gap", final_norm="pooled", prefix_position_embeddings=False,
         num_register_tokens=1),
    dict(distillation_token=True),  # DeiT's two heads
    dict(activation="swiglu", classifier="map"),  # the gates, the pooling's too
    # Sapiens2's: narrower key and value projections in the second block, RMS and qk norms
    dict(num_kv_heads=(2, 1), qk_norm=True, norm_layer="rms_norm"),
    # AIMv2's: the patch tokens' norm, no biases, attention pooling without its MLP
    dict(patch_norm=True, proj_bias=False, qkv_bias=False, classifier="map", map_mlp_dim=0,
         activation="swiglu", norm_layer="rms_norm"),
    # timm's vit_srelpos_*: one relative-position MLP for every block, counted once
    dict(position_embedding="relative_mlp", relative_mlp_dim=8, relative_mlp_shared=True),
    dict(conv_stem=True),  # MobileCLIP's convolutions (their BatchNorms are element-wise)
    # Differential attention: twice the heads of half the channels (the same matmuls), the
    # difference of the maps before one weighted sum; parallel blocks: the same layers.
    dict(attention_layer="differential", qk_norm=True),
    dict(attention_layer="differential", parallel_blocks=True, layer_scale_init=0.1),
], ids=str)
def test_model_options_match_tensorflows_count(options):
    model = keras_vit.vit("Ti/16", image_size=(32, 48), **{**TINY, **options})
    assert flops.forward_flops(model) == tensorflow_flops(model)


# --- formulas from the paper's shapes (in multiply-adds; FLOPs are twice that) ------------------


def transformer_block_macs(tokens, hidden, mlp):
    # q, k, v and out projections; q k^T and (weights) v over all token pairs; the MLP.
    return 4 * tokens * hidden**2 + 2 * tokens**2 * hidden + 2 * tokens * hidden * mlp


def test_vit_b16_at_224_is_the_published_17_6_gmacs():
    model = keras_vit.vit("B/16")
    patches, tokens, hidden, mlp = 196, 197, 768, 3072
    macs = (patches * 16 * 16 * 3 * hidden  # the patch embedding E
            + 12 * transformer_block_macs(tokens, hidden, mlp)
            + hidden * 1000)  # the head
    assert flops.forward_flops(model) == 2 * macs == 35_127_656_448
    # fvcore, DeiT and timm report ViT-B/16 (86M parameters, 224) as "17.6 GFLOPs": their
    # unit is the multiply-add.
    assert round(flops.forward_flops(model) / 2e9, 1) == 17.6


def test_small_vit_with_pre_logits_by_hand():
    model = keras_vit.vit("Ti/16", image_size=(32, 64), representation_size=12, **TINY)
    patches = 2 * 4
    macs = (patches * 16 * 16 * 3 * 16 + 2 * transformer_block_macs(patches + 1, 16, 24)
            + 16 * 12 + 12 * 5)
    assert flops.forward_flops(model) == 2 * macs


def test_grouped_query_attention_projects_keys_and_values_to_fewer_heads_by_hand():
    """num_kv_heads: the key and value projections are kv_heads * head_dim wide; every query
    head still attends to every token (its group's keys and values)."""
    fields = dict(TINY, num_heads=4, num_layers=1)
    model = keras_vit.vit("Ti/16", image_size=(32, 64), num_kv_heads=1, **fields)
    plain = keras_vit.vit("Ti/16", image_size=(32, 64), **fields)
    tokens, head_dim = 2 * 4 + 1, 16 // 4
    saved = 2 * tokens * 16 * (16 - head_dim)  # keys and values: 16 -> 4 outputs each
    assert flops.forward_flops(plain) - flops.forward_flops(model) == 2 * saved
    assert flops.forward_flops(plain) == 2 * ((tokens - 1) * 16 * 16 * 3 * 16
                                              + transformer_block_macs(tokens, 16, 24) + 16 * 5)


def test_hybrid_stem_by_hand():
    # R+Ti/16: 7x7/2 root conv (64 channels) and a stride-2 max-pool, then 8x8 patches of the
    # stride-4 feature map: a 64x96 image has a 16x24 feature map and a 2x3 grid.
    model = keras_vit.vit("R+Ti/16", image_size=(64, 96), **TINY)
    root = 32 * 48 * 7 * 7 * 3 * 64
    embed = 6 * 8 * 8 * 64 * 16
    macs = root + embed + 2 * transformer_block_macs(7, 16, 24) + 16 * 5
    assert flops.forward_flops(model) == 2 * macs


def test_conv_stem_by_hand():
    # MobileCLIP's stem at width 16: a 4x4/4 convolution to 4 channels (an 8x12 map of a
    # 32x48 image), a 2x2/2 one (4x6), then 2x2 patches of that map to 16 (a 2x3 grid).
    model = keras_vit.vit("Ti/16", image_size=(32, 48), conv_stem=True, **TINY)
    stem = 8 * 12 * 4 * 4 * 3 * 4 + 4 * 6 * 2 * 2 * 4 * 4
    embed = 6 * 2 * 2 * 4 * 16
    macs = stem + embed + 2 * transformer_block_macs(7, 16, 24) + 16 * 5
    assert flops.forward_flops(model) == 2 * macs


def test_axial_blocks_attend_within_rows_then_columns_by_hand():
    # A 2x3 grid, no class token. Row attention: 2 rows of 3 tokens; column: 3 columns of 2.
    model = keras_vit.vit("Axial-Ti/16", image_size=(32, 48), **TINY)
    rows, columns, hidden, mlp = 2, 3, 16, 24
    tokens = rows * columns
    dense = 4 * tokens * hidden**2 + 2 * tokens * hidden * mlp  # the same in both blocks
    row = dense + 2 * rows * columns**2 * hidden
    column = dense + 2 * columns * rows**2 * hidden
    macs = tokens * 16 * 16 * 3 * hidden + 2 * (row + column) + hidden * 5
    assert flops.forward_flops(model) == 2 * macs


def test_relative_positions_add_a_query_matmul_per_offset_by_hand():
    # "relative": one table of 2 * 6 - 1 patch offsets plus one row for the class token; each
    # of the 7 queries meets every row of it (head_dim per head, so hidden over the heads).
    options = dict(image_size=(32, 48), **TINY)
    plain = flops.forward_flops(keras_vit.vit("Ti/16", **options))
    relative = keras_vit.vit("Ti/16", position_embedding="relative", **options)
    per_block = 7 * (2 * 6 - 1 + 1) * 16
    assert flops.forward_flops(relative) - plain == 2 * 2 * per_block
    # "relative_2d": tables of 2 * 2 - 1 row and 2 * 3 - 1 column offsets, each + 1.
    relative_2d = keras_vit.vit("Ti/16", position_embedding="relative_2d", **options)
    per_block = 7 * ((2 * 2 - 1 + 1) + (2 * 3 - 1 + 1)) * 16
    assert flops.forward_flops(relative_2d) - plain == 2 * 2 * per_block


def test_training_flops_is_three_forward_passes():
    model = keras_vit.vit("Ti/16", image_size=32, **TINY)
    assert flops.training_flops(model) == 3 * flops.forward_flops(model)


# --- errors --------------------------------------------------------------------------------------


def test_not_a_model_is_a_type_error():
    with pytest.raises(TypeError, match="keras.Model built by keras_vit.vit"):
        flops.forward_flops("B/16")


def test_a_model_without_patch_embedding_is_refused():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    with pytest.raises(ValueError, match="no keras_vit PatchEmbed"):
        flops.forward_flops(model)


def test_an_unknown_layer_is_named():
    # A model that reuses keras_vit's patch embedding but adds a layer the count cannot price.
    images = keras.Input((32, 32, 3))
    tokens = keras_vit.layers.PatchEmbed(16, 8, name="embedding")(images)
    model = keras.Model(images, keras.layers.BatchNormalization(name="bn_tokens")(tokens))
    with pytest.raises(ValueError, match="'bn_tokens'.*BatchNormalization"):
        flops.forward_flops(model)


def test_a_shared_relative_mlp_is_counted_once():
    """The MLP on each of the (2 rows - 1)(2 columns - 1) offsets, 2 -> 8 -> 2 heads: once for a
    model whose blocks share it, once per block otherwise."""
    fields = dict(TINY, image_size=(32, 48), position_embedding="relative_mlp",
                  relative_mlp_dim=8, num_layers=3)
    each = flops.forward_flops(keras_vit.vit("Ti/16", **fields))
    shared = flops.forward_flops(keras_vit.vit("Ti/16", relative_mlp_shared=True, **fields))
    assert each - shared == 2 * (3 * 5) * 2 * (2 * 8 + 8 * 2)

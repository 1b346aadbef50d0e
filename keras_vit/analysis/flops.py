"""FLOPs of one image's forward pass through a model built by `keras_vit.vit()`.

    from keras_vit.analysis import flops
    flops.forward_flops(keras_vit.vit("B/16"))   # 35_127_656_448: 35.1 GFLOPs

Convention: a multiply-add is 2 FLOPs, as in TensorFlow's profiler. Tables made with fvcore
(DeiT, timm, many papers) count multiply-adds and call them FLOPs: their "17.6 GFLOPs" for
ViT-B/16 at 224 is 17.6 G multiply-adds, 35.1 GFLOPs here.

What is counted: the convolutions (patch embedding, the hybrids' ResNet, MobileCLIP's
conv_stem), the dense layers
(attention projections, MLP, pre_logits, head) and the attention matmuls (queries x keys,
weights x values, and queries x offset embeddings with relative positions). Elementwise ops
(rotary embeddings' rotations among them: 3 FLOPs per channel of each query and key, 0.03% of
a B/16), norms, softmax, pooling and the weight standardisation of the ResNet kernels are not: by
TensorFlow's count they add 0.4% to ViT-B/16 and 0.7% to R50+B/16 (they cost memory traffic
more than arithmetic).

The count is read from the layers' static shapes and configuration; nothing runs and no
TensorFlow is needed, so it works on every Keras backend.
"""

import math

import keras

from keras_vit import layers as vit_layers
from keras_vit.layers import resnet

# Layers whose cost is elementwise (or nothing), by the convention above.
_FREE = (
    keras.layers.InputLayer,
    keras.layers.Dropout,
    keras.layers.LayerNormalization,  # keras_vit's LayerNorm too
    vit_layers.ClassToken,
    vit_layers.RegisterTokens,
    vit_layers.AddPositionEmbs,
    vit_layers.TokenPooling,
    keras.layers.Average,  # DeiT's two heads' mean
)


def _conv(conv, input_shape):
    """A `keras.layers.Conv2D` (or `StdConv2D`) on `input_shape`: (FLOPs, output shape)."""
    output_shape = conv.compute_output_shape(input_shape)
    # The kernel is [kh, kw, input channels per group, filters]: one multiply-add per kernel
    # entry at every output position.
    return 2 * math.prod(output_shape[1:3]) * math.prod(conv.kernel.shape), output_shape


def _dense(dense, positions):
    """A `keras.layers.Dense` applied at `positions` positions (tokens, or 1 per image)."""
    return 2 * positions * math.prod(dense.kernel.shape)


def _resnet_stem(stem, input_shape):
    flops, _ = _conv(stem.conv_root, input_shape)
    return flops  # the max-pool that follows is a comparison, not a multiply-add


def _bottleneck(unit, input_shape):
    flops = 0
    if unit.needs_projection:
        flops += _conv(unit.conv_proj, input_shape)[0]
    shape = input_shape
    for conv in (unit.conv1, unit.conv2, unit.conv3):
        conv_flops, shape = _conv(conv, shape)
        flops += conv_flops
    return flops


def _resnet_stage(stage, input_shape):
    flops, shape = 0, input_shape
    for unit in stage.units:
        flops += _bottleneck(unit, shape)
        shape = unit.compute_output_shape(shape)
    return flops


def _conv_stem(stem, input_shape):
    flops, shape = 0, input_shape  # its BatchNorms and GELUs are element-wise
    for conv in stem.convs:
        conv_flops, shape = _conv(conv, shape)
        flops += conv_flops
    return flops


def _patch_embed(embed, input_shape):
    # The patch projection is a convolution with stride = kernel = patch size.
    patch = embed.patch_size
    patches = (input_shape[1] // patch) * (input_shape[2] // patch)
    return 2 * patches * math.prod(embed.kernel.shape)


def _self_attention(attention, input_shape):
    """`MultiHeadSelfAttention` on `[sequences, length, D]`: every sequence attends within
    itself (one sequence per image in ViT; one per row or column in Axial-ViT)."""
    sequences, length, hidden = input_shape
    tokens = sequences * length
    projections = sum(_dense(dense, tokens) for dense in
                      (attention.query, attention.key, attention.value, attention.out))
    # Per sequence and head, queries x keys^T and weights x values are each
    # length^2 * head_dim multiply-adds; over the heads, length^2 * D.
    matmuls = 2 * (2 * sequences * length**2 * hidden)
    return projections + matmuls + _relative_position(attention.relative, tokens)


def _relative_position(relative, tokens):
    """`RelativePositionBias`: each query against every row of each offset table.

    A table is `[offsets, heads, head_dim]`; per head, `[tokens, head_dim] x [head_dim,
    offsets]`. Picking each pair's logit out of the result is a gather, not counted.
    `RelativePositionMlp`: its two dense layers on every offset of the grid.
    """
    if relative is None:
        return 0
    if isinstance(relative, vit_layers.RelativePositionMlp):  # its MLP on every offset
        rows, columns = relative.grid_size
        return (2 * rows - 1) * (2 * columns - 1) * (_dense(relative.fc1, 1)
                                                     + _dense(relative.fc2, 1))
    return sum(2 * tokens * math.prod(table.shape) for table in relative.tables)


def _encoder_block(block, input_shape):
    tokens = input_shape[1]
    # The block says how it lays the tokens out for attention: the whole sequence for a ViT
    # block, `[rows, columns, D]` or `[columns, rows, D]` per image for an axial block.
    attention_shape = block.attention_input_shape((1,) + tuple(input_shape[1:]))
    return _self_attention(block.attention, attention_shape) + _mlp(block.mlp, tokens)


def _mlp(mlp, tokens):
    """An `MlpBlock` on `tokens` tokens: its projections (SwiGLU's gate too); the activation
    and the gating are element-wise."""
    gate = 0 if mlp.gate is None else _dense(mlp.gate, tokens)
    return _dense(mlp.dense_0, tokens) + gate + _dense(mlp.dense_1, tokens)


def _attention_pooling(pool, input_shape):
    """`AttentionPooling`: one query (the projected probe) attends to the patch tokens; its
    MLP runs on that one vector."""
    tokens = input_shape[1] - pool.num_prefix_tokens
    projections = (_dense(pool.query, 1) + _dense(pool.key, tokens) + _dense(pool.value, tokens)
                   + _dense(pool.out, 1))
    matmuls = 2 * (2 * tokens * input_shape[-1])  # query x keys, weights x values
    return projections + matmuls + (0 if pool.mlp is None else _mlp(pool.mlp, 1))


def _top_dense(dense, input_shape):
    return _dense(dense, math.prod(input_shape[1:-1]))


# By isinstance, so AxialEncoderBlock counts as the EncoderBlock it is.
_COUNTERS = (
    (resnet.ResNetStem, _resnet_stem),
    (resnet.ResNetStage, _resnet_stage),
    (vit_layers.ConvStem, _conv_stem),
    (vit_layers.PatchEmbed, _patch_embed),
    (vit_layers.EncoderBlock, _encoder_block),
    (vit_layers.AttentionPooling, _attention_pooling),
    # the blocks' shared relative-position MLP (relative_mlp_shared): once, not per block
    (vit_layers.RelativePositionMlp, lambda mlp, input_shape: _relative_position(mlp, None)),
    (keras.layers.Dense, _top_dense),
)


def _layer_flops(model, layer):
    if isinstance(layer, _FREE):
        return 0
    for kind, counter in _COUNTERS:
        if isinstance(layer, kind):
            break
    else:
        raise ValueError(
            f"forward_flops counts models built by keras_vit.vit(); layer {layer.name!r} of "
            f"model {model.name!r} is a {type(layer).__name__}, which it does not know.")
    try:
        inputs = layer.input  # the tokens first (blocks may take a shared relative bias too)
        input_shape = tuple((inputs[0] if isinstance(inputs, (list, tuple)) else inputs).shape)
    except (AttributeError, ValueError) as error:  # a subclassed model, or a shared layer
        raise ValueError(
            f"forward_flops needs the functional model that keras_vit.vit() returns; the input "
            f"shape of layer {layer.name!r} of model {model.name!r} is not known ({error}).") \
            from error
    if any(side is None for side in input_shape[1:]):
        raise ValueError(
            f"forward_flops needs static shapes; layer {layer.name!r} of model {model.name!r} "
            f"takes inputs of shape {input_shape}. Build the model for one image size.")
    return counter(layer, input_shape)


def forward_flops(model):
    """FLOPs (2 per multiply-add) of one image's forward pass through `model`.

    Args:
        model: a model built by `keras_vit.vit()` (or a named builder): a plain ViT, a ResNet
            hybrid, Axial-ViT, with any classifier, head, `include_top` or relative position
            embeddings.

    Returns:
        An int: convolutions, dense layers and attention matmuls (see the module docstring).

    Raises:
        TypeError: `model` is not a `keras.Model`.
        ValueError: `model` is not a keras_vit ViT (a layer this count does not know, or no
            patch embedding), or its input size is not static.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"forward_flops takes a keras.Model built by keras_vit.vit(), got "
            f"{type(model).__name__}.")
    if not any(isinstance(layer, vit_layers.PatchEmbed) for layer in model.layers):
        raise ValueError(
            f"Model {model.name!r} has no keras_vit PatchEmbed layer; forward_flops counts "
            f"models built by keras_vit.vit().")
    return int(sum(_layer_flops(model, layer) for layer in model.layers))


def training_flops(model):
    """FLOPs of one image's training step: `3 * forward_flops(model)`.

    The usual estimate (e.g. Kaplan et al. 2020, "6N FLOPs per token"): the backward pass
    costs about twice the forward, one matmul for the gradients of the activations and one
    for those of the weights. It leaves out the optimizer update (per weight, not per image).
    """
    return 3 * forward_flops(model)

"""Builds a ViT (or a ResNet+ViT hybrid) as a Keras functional model, from the variant table.

The model is a plain chain of named layers, in the order of the original:
[hybrid ResNet] -> embedding -> cls -> posembed_input -> dropout -> encoderblock_{i} ->
encoder_norm -> pool -> [pre_logits] -> head.
"""

import keras

from keras_vit import checkpoint, pretrained, resnet
from keras_vit import layers as vit_layers
from keras_vit.variants import parse_variant

CLASSIFIERS = ("token", "gap")
_OVERRIDABLE = ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")


def _image_size_pair(image_size):
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    if (len(image_size) != 2 or not all(isinstance(s, int) and s > 0 for s in image_size)):
        raise ValueError(f"image_size must be a positive int or (height, width), got {image_size!r}.")
    return tuple(image_size)


def _check_config(config, image_size, classifier, representation_size):
    if classifier not in CLASSIFIERS:
        raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}.")
    for field in _OVERRIDABLE:
        value = getattr(config, field)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{field} must be a positive integer, got {value!r}.")
    if config.hidden_size % config.num_heads:
        raise ValueError(
            f"hidden_size {config.hidden_size} is not divisible by num_heads "
            f"{config.num_heads}; choose num_heads among the divisors of {config.hidden_size}."
        )
    stride = config.total_stride
    for side, value in zip(("height", "width"), image_size):
        if value % stride:
            nearest = max(stride, round(value / stride) * stride)
            raise ValueError(
                f"Image {side} {value} is not divisible by {stride}, the pixels per patch of "
                f"{config.name} (patch size {config.patch_size}"
                + (f" on a ResNet of stride {config.resnet_stride}" if config.is_hybrid else "")
                + f"); use a multiple of {stride} such as {nearest}."
            )
    if representation_size is not None and representation_size <= 0:
        raise ValueError(f"representation_size must be positive or None, got {representation_size}.")


def _head_dtype(policy):
    """The head runs in float32 under mixed policies so that outputs are float32."""
    policy = keras.dtype_policies.get(policy)
    return "float32" if policy.compute_dtype != policy.variable_dtype else policy


def vit(
    variant="B/16",
    *,
    image_size=224,
    num_classes=1000,
    include_top=True,
    classifier="token",
    representation_size=None,
    dropout=None,
    attention_dropout=0.0,
    drop_path_rate=0.0,
    position_embedding="learned",
    approximate_gelu=True,
    weights=None,
    dtype=None,
    name=None,
    **overrides,
):
    """Builds a Vision Transformer.

    Args:
        variant: a name from `keras_vit.VARIANT_NAMES`, e.g. "B/16", "L/32", "R50+B/16".
        image_size: int or `(height, width)`; multiples of the variant's pixels per patch.
        num_classes: classes of the head (zero-initialised, as the paper's transfer recipe).
        include_top: if False the model returns the pooled representation `[batch, D]`
            (or `[batch, representation_size]`) instead of logits.
        classifier: "token" (the class token) or "gap" (global average of the tokens, no
            class token).
        representation_size: width of the tanh "pre_logits" layer before the head (the
            pre-training head); None for none.
        dropout: dropout rate; None takes the upstream configuration's (0.1 for L/16, H/14).
        attention_dropout: dropout on the attention weights.
        drop_path_rate: stochastic depth, rising linearly from 0 at the first block to this
            rate at the last.
        position_embedding: "learned" (1-D, the default), "learned_2d" or "none".
        approximate_gelu: tanh-approximate GELU as the original (True) or exact (False).
        weights: None (random initialisation), or an original `.npz` checkpoint to load:
            a published name (see `keras_vit.pretrained.PUBLISHED`, e.g. "imagenet21k"), a
            local path, an https/file URL or a gs:// path. Position embeddings are resized
            to `image_size`; the head starts from zeros when `num_classes` differs from the
            checkpoint's.
        dtype: a Keras dtype policy such as "float32" or "mixed_bfloat16"; None takes the
            global policy. Outputs are float32 under mixed policies.
        name: model name; defaults to e.g. "vit_b16".
        **overrides: any of `patch_size`, `hidden_size`, `mlp_dim`, `num_heads`, `num_layers`
            to change the variant's architecture (for small custom models).

    Returns:
        A `keras.Model` mapping images `[batch, height, width, 3]` scaled to [-1, 1]
        (see `keras_vit.preprocess_inputs`) to logits `[batch, num_classes]`.
    """
    config = parse_variant(variant)
    unknown = set(overrides) - set(_OVERRIDABLE)
    if unknown:
        raise TypeError(
            f"vit() got unexpected arguments {sorted(unknown)}; the variant fields that can be "
            f"overridden are {list(_OVERRIDABLE)}."
        )
    if overrides:
        config = config.__class__(**{**config.__dict__, **overrides})
    image_size = _image_size_pair(image_size)
    _check_config(config, image_size, classifier, representation_size)
    if position_embedding not in vit_layers.POSITION_EMBEDDINGS:
        raise ValueError(
            f"position_embedding must be one of {vit_layers.POSITION_EMBEDDINGS}, "
            f"got {position_embedding!r}."
        )
    if dropout is None:
        dropout = config.dropout
    policy = keras.dtype_policies.get(dtype or keras.config.dtype_policy())

    images = keras.Input(shape=image_size + (3,), name="images")
    x = images
    if config.is_hybrid:
        x = resnet.ResNetStem(64, name="resnet_root", dtype=policy)(x)
        for index, units in enumerate(config.resnet_units):
            x = resnet.ResNetStage(units, 64 * 2**index, first_stride=1 if index == 0 else 2,
                                   name=f"block{index + 1}", dtype=policy)(x)
    x = vit_layers.PatchEmbed(config.patch_size, config.hidden_size, name="embedding",
                              dtype=policy)(x)
    grid = tuple(side // config.total_stride for side in image_size)
    if classifier == "token":
        x = vit_layers.ClassToken(name="cls", dtype=policy)(x)
    x = vit_layers.AddPositionEmbs(grid, num_prefix_tokens=int(classifier == "token"),
                                   kind=position_embedding, name="posembed_input",
                                   dtype=policy)(x)
    x = keras.layers.Dropout(dropout, name="dropout", dtype=policy)(x)
    for index in range(config.num_layers):
        rate = drop_path_rate * index / max(config.num_layers - 1, 1)
        x = vit_layers.EncoderBlock(
            config.num_heads, config.mlp_dim, dropout=dropout,
            attention_dropout=attention_dropout, drop_path_rate=rate,
            approximate_gelu=approximate_gelu, name=f"encoderblock_{index}", dtype=policy)(x)
    x = vit_layers.LayerNorm(name="encoder_norm", dtype=policy)(x)
    head_dtype = _head_dtype(policy)
    x = vit_layers.TokenPooling(classifier, name="pool", dtype=head_dtype)(x)
    if representation_size is not None:
        x = keras.layers.Dense(representation_size, activation="tanh", name="pre_logits",
                               kernel_initializer="lecun_normal", dtype=head_dtype)(x)
    if include_top:
        x = keras.layers.Dense(num_classes, name="head", kernel_initializer="zeros",
                               dtype=head_dtype)(x)
    if name is None:
        name = "vit_" + config.name.lower().replace("/", "").replace("+", "_")
    model = keras.Model(images, x, name=name)
    if weights is not None:
        checkpoint.load_npz(model, pretrained.resolve_weights(weights, config.name))
    return model


class _AttentionModel(keras.Model):
    """Runs a ViT's layers in order and returns the attention weights of every block."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.vit_model = model
        self.blocks = [layer for layer in model.layers
                       if isinstance(layer, vit_layers.EncoderBlock)]
        if not self.blocks:
            raise ValueError(f"Model {model.name!r} has no EncoderBlock layers.")

    def call(self, images):
        x, weights = images, []
        for layer in self.vit_model.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            if not isinstance(layer, vit_layers.EncoderBlock):
                x = layer(x)
                continue
            x, attention = layer(x, return_attention_scores=True)
            weights.append(attention)
            if len(weights) == len(self.blocks):
                break  # nothing after the last block is needed
        return weights


def attention_model(model):
    """Returns a model that maps the same images to the attention weights of every block.

    The new model shares the layers (and so the weights) of `model`, a model built by `vit()`.
    Its output is a list with one `[batch, heads, tokens, tokens]` tensor per encoder block.
    The default forward pass of `model` is untouched and computes no extra output.
    """
    return _AttentionModel(model, name=f"{model.name}_attention")

"""Builds a ViT (or a ResNet+ViT hybrid, or an Axial-ViT) as a Keras functional model, from the
variant table.

The model is a plain chain of named layers, in the order of the original:
[hybrid ResNet] -> embedding -> cls -> posembed_input -> dropout -> encoderblock_{i} ->
encoder_norm -> pool -> [pre_logits] -> head. The paper's variants change only the middle:
`posembed_{i}` before block i (or `posembed_input` again) with the every-layer placements,
relative position logits inside each block's attention, and `encoderblock_{i}_row`,
`encoderblock_{i}_column` for Axial-ViT.
"""

import numbers
import os

import keras
from keras import ops

from keras_vit import checkpoint, pretrained, resnet
from keras_vit import layers as vit_layers
from keras_vit.variants import (
    OVERRIDABLE_FIELDS,
    _describe,
    check_bool,
    check_choice,
    check_int,
    check_rate,
    parse_variant,
)

CLASSIFIERS = vit_layers.CLASSIFIERS
# Appendix D.4: the absolute kinds (added to tokens) and the relative kinds (in the attention).
POSITION_EMBEDDINGS = vit_layers.POSITION_EMBEDDINGS + ("relative", "relative_2d")
# Only embeddings added to the tokens can be added again before every block.
LEARNED_POSITION_EMBEDDINGS = ("learned", "learned_2d")
PLACEMENTS = ("stem", "every_layer", "every_layer_shared")


def _image_size_pair(image_size):
    """`image_size` as `(height, width)` of Python ints: an int (also a numpy integer) or a
    sequence of two (a tuple, a list, a numpy array)."""
    valid = "a positive integer or (height, width) of two positive integers"
    if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool):
        image_size = (image_size, image_size)
    elif isinstance(image_size, (str, bytes)) or not hasattr(image_size, "__len__"):
        raise TypeError(f"image_size must be {valid}, got {_describe(image_size)}.")
    if len(image_size) != 2:
        raise ValueError(f"image_size must be {valid}, got {image_size!r}.")
    pair = []
    for side, value in zip(("height", "width"), image_size):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"image_size must be {valid}; its {side} is {_describe(value)} "
                            f"in {image_size!r}.")
        if value <= 0:
            raise ValueError(f"image_size must be {valid}; its {side} is {value!r} in "
                             f"{image_size!r}.")
        pair.append(int(value))
    return tuple(pair)


def _check_position_arguments(config, classifier, position_embedding, placement):
    if placement != "stem" and position_embedding not in LEARNED_POSITION_EMBEDDINGS:
        raise ValueError(
            f"position_embedding_placement={placement!r} adds learned embeddings before every "
            f"block; it needs position_embedding "
            f"{' or '.join(map(repr, LEARNED_POSITION_EMBEDDINGS))}, got "
            f"{position_embedding!r} (use placement 'stem').")
    if config.axial and classifier != "gap":
        raise ValueError(
            f"{config.name} has no class token: its tokens stay a 2-D grid of patches. Use "
            f"classifier='gap' (the default for Axial variants), got {classifier!r}.")
    if config.axial and position_embedding.startswith("relative"):
        raise ValueError(f"{config.name} does not take relative position embeddings; use "
                         "'learned', 'learned_2d' or 'none'.")


def _check_config(config, image_size, position_embedding):
    for field in OVERRIDABLE_FIELDS:
        check_int(field, getattr(config, field))
    if config.hidden_size % config.num_heads:
        raise ValueError(
            f"hidden_size {config.hidden_size} is not divisible by num_heads "
            f"{config.num_heads}; choose num_heads among the divisors of {config.hidden_size}."
        )
    if position_embedding == "learned_2d" and config.hidden_size % 2:
        raise ValueError(
            f"position_embedding='learned_2d' needs an even hidden_size (half for rows, half "
            f"for columns), got hidden_size={config.hidden_size}.")
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


def _check_weights(weights):
    if weights is not None and not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            "weights must be None, a published name (one of "
            f"{sorted(pretrained.PUBLISHED)}), a file path, a URL or a gs:// path, "
            f"got {_describe(weights)}.")


def _dtype_policy(dtype):
    try:
        return keras.dtype_policies.get(dtype or keras.config.dtype_policy())
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"dtype must be None or a Keras dtype policy such as 'float32', 'bfloat16' or "
            f"'mixed_bfloat16', got {dtype!r} ({error}).") from error


def _head_dtype(policy):
    """The head runs in float32 under mixed policies so that outputs are float32."""
    policy = keras.dtype_policies.get(policy)
    return "float32" if policy.compute_dtype != policy.variable_dtype else policy


def _check_images(model, images):
    """Refuses images whose dtype the model would silently misread, before any op runs.

    Keras casts a functional model's inputs to the Input's float32 before any layer sees them,
    so uint8 pixels 0..255 would run as floats 0..255 instead of [-1, 1] and give confident
    wrong answers. Integer (and bool and string) images are therefore refused here, where the
    caller's dtype is still visible. Float images are taken as they are: the model cannot tell
    0..255 floats from [-1, 1] cheaply, so scaling them is the caller's precondition.
    """
    images = keras.tree.flatten(images)
    if len(images) != 1 or not hasattr(images[0], "dtype"):
        return  # nested Python lists and other structures: Keras' own conversion decides
    try:
        dtype = keras.backend.standardize_dtype(images[0].dtype)
    except (ValueError, TypeError, AttributeError):
        dtype = str(images[0].dtype)
    if "float" in dtype:
        return
    advice = (" Scale uint8 pixels 0..255 with keras_vit.preprocess_inputs(images), which "
              "returns float32 in [-1, 1]." if "int" in dtype else "")
    raise TypeError(
        f"Model {model.name!r} takes float images scaled to [-1, 1], got images of dtype "
        f"{dtype}.{advice}")


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(keras.Model):
    """The functional `keras.Model` that `vit()` returns, with input checks at the boundary.

    - Images of an integer, bool or string dtype raise a `TypeError` that points at
      `keras_vit.preprocess_inputs` (Keras would silently cast uint8 pixels 0..255 to float
      and the model would run on an input range it was never trained for). Float images must
      be scaled to [-1, 1]; the model cannot tell 0..255 floats apart cheaply and does not try.
    - A batch of 0 images returns an empty `[0, ...]` output (of the model's output shape and
      dtype) from a direct call and from `predict`, without running the layers (TensorFlow's
      CPU convolution mishandles an empty batch).

    The checks are Python checks on static dtypes and shapes: they cost nothing per step once
    traced. Everything else is a plain functional model (`.keras` saving, `clone_model`,
    `keras.Model` APIs).
    """

    def _empty_output(self, images):
        batch = getattr(images, "shape", None)
        if batch is None or len(batch) == 0 or batch[0] != 0:
            return None
        output = self.outputs[0]
        return ops.zeros((0,) + tuple(output.shape[1:]), dtype=output.dtype)

    def call(self, inputs, training=None, mask=None, **kwargs):
        _check_images(self, inputs)
        flat = keras.tree.flatten(inputs)
        empty = self._empty_output(flat[0]) if len(flat) == 1 else None
        if empty is not None:
            return empty
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def predict(self, x, *args, **kwargs):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            _check_images(self, x)
            empty = self._empty_output(x)
            if empty is not None:  # Keras' predict loop fails on 0 samples
                return keras.ops.convert_to_numpy(empty)
        return super().predict(x, *args, **kwargs)


def vit(
    variant="B/16",
    *,
    image_size=224,
    num_classes=1000,
    include_top=True,
    classifier=None,
    representation_size=None,
    dropout=None,
    attention_dropout=0.0,
    drop_path_rate=0.0,
    position_embedding="learned",
    position_embedding_placement="stem",
    approximate_gelu=True,
    weights=None,
    dtype=None,
    name=None,
    **overrides,
):
    """Builds a Vision Transformer.

    Args:
        variant: a name from `keras_vit.VARIANT_NAMES`, e.g. "B/16", "L/32", "R50+B/16", or
            "Axial-" before a plain ViT name ("Axial-B/16": Axial-ViT, appendix D.6).
        image_size: int or `(height, width)`; multiples of the variant's pixels per patch.
        num_classes: classes of the head (zero-initialised, as the paper's transfer recipe).
        include_top: if False the model returns the pooled representation `[batch, D]`
            (or `[batch, representation_size]`) instead of logits.
        classifier: "token" (the class token) or "gap" (global average of the tokens, no
            class token); None takes "token", or "gap" for Axial variants (their tokens stay
            a 2-D grid, so they have no class token).
        representation_size: width of the tanh "pre_logits" layer before the head (the
            pre-training head); None for none.
        dropout: dropout rate; None takes the upstream configuration's (0.1 for L/16, H/14).
        attention_dropout: dropout on the attention weights.
        drop_path_rate: stochastic depth, rising linearly from 0 at the first block to this
            rate at the last.
        position_embedding: the kinds of appendix D.4: "learned" (1-D, the default),
            "learned_2d" (row and column halves), "none", or relative: "relative" (a learned
            embedding per offset along the flattened patch sequence, giving attention logits
            in every block) or "relative_2d" (row and column offsets, summed).
        position_embedding_placement: where the learned kinds are added (Table 8): "stem"
            (once, before the encoder; the default), "every_layer" (a separate embedding
            before every block) or "every_layer_shared" (one embedding before every block).
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
    unknown = set(overrides) - set(OVERRIDABLE_FIELDS)
    if unknown:
        raise TypeError(
            f"vit() got unexpected arguments {sorted(unknown)}; the variant fields that can be "
            f"overridden are {list(OVERRIDABLE_FIELDS)}."
        )
    # Every argument is checked here, before any TensorFlow op runs.
    overrides = {field: check_int(field, value) for field, value in overrides.items()}
    if overrides:
        config = config.__class__(**{**config.__dict__, **overrides})
    image_size = _image_size_pair(image_size)
    num_classes = check_int("num_classes", num_classes)
    include_top = check_bool("include_top", include_top)
    if classifier is None:
        classifier = "gap" if config.axial else "token"
    classifier = check_choice("classifier", classifier, CLASSIFIERS)
    representation_size = check_int("representation_size", representation_size,
                                    allow_none=True)
    dropout = check_rate("dropout", dropout, allow_none=True)
    attention_dropout = check_rate("attention_dropout", attention_dropout)
    drop_path_rate = check_rate("drop_path_rate", drop_path_rate)
    position_embedding = check_choice("position_embedding", position_embedding,
                                      POSITION_EMBEDDINGS)
    placement = check_choice("position_embedding_placement", position_embedding_placement,
                             PLACEMENTS)
    approximate_gelu = check_bool("approximate_gelu", approximate_gelu)
    _check_weights(weights)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be None or a string, got {_describe(name)}.")
    _check_position_arguments(config, classifier, position_embedding, placement)
    _check_config(config, image_size, position_embedding)
    if dropout is None:
        dropout = config.dropout
    policy = _dtype_policy(dtype)

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
    prefix = int(classifier == "token")
    if prefix:
        x = vit_layers.ClassToken(name="cls", dtype=policy)(x)
    relative = {"relative": "1d", "relative_2d": "2d"}.get(position_embedding)

    def position_layer(name):
        kind = "none" if relative else position_embedding
        return vit_layers.AddPositionEmbs(grid, num_prefix_tokens=prefix, kind=kind, name=name,
                                          dtype=policy)

    # The stem's embedding (also the first block's with the every_layer placements) keeps the
    # checkpoints' name; the analysis tools read the token layout from it.
    stem_position = position_layer("posembed_input")
    x = stem_position(x)
    x = keras.layers.Dropout(dropout, name="dropout", dtype=policy)(x)
    block_options = dict(dropout=dropout, attention_dropout=attention_dropout,
                         approximate_gelu=approximate_gelu, dtype=policy)
    for index in range(config.num_layers):
        if index and placement == "every_layer":
            x = position_layer(f"posembed_{index}")(x)
        elif index and placement == "every_layer_shared":
            x = stem_position(x)
        rate = drop_path_rate * index / max(config.num_layers - 1, 1)
        if config.axial:  # appendix D.6: a row block, then a column block, each with an MLP
            for axis in vit_layers.AXES:
                x = vit_layers.AxialEncoderBlock(
                    axis, grid, num_heads=config.num_heads, mlp_dim=config.mlp_dim,
                    drop_path_rate=rate, name=f"encoderblock_{index}_{axis}",
                    **block_options)(x)
            continue
        x = vit_layers.EncoderBlock(
            config.num_heads, config.mlp_dim, drop_path_rate=rate, relative_position=relative,
            grid_size=grid if relative else None, num_prefix_tokens=prefix,
            name=f"encoderblock_{index}", **block_options)(x)
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
        name = "vit_" + config.name.lower().replace("/", "").replace("+", "_").replace("-", "_")
    model = ViTModel(images, x, name=name)
    if weights is not None:
        checkpoint.load_npz(model, pretrained.resolve_weights(weights, config.name))
    return model


class _AttentionModel(keras.Model):
    """Runs a ViT and returns the attention weights of every block, in the order they run."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.vit_model = model
        self.blocks = [layer for layer in model.layers
                       if isinstance(layer, vit_layers.EncoderBlock)]
        if not self.blocks:
            raise ValueError(f"Model {model.name!r} has no EncoderBlock layers.")

    def call(self, images):
        _check_images(self.vit_model, images)
        weights = []
        # Each block hands its weights to the recorder while the model runs as built (with
        # any shared or repeated layers), then forgets it.
        for block in self.blocks:
            block.attention_recorder = weights.append
        try:
            self.vit_model(images)
        finally:
            for block in self.blocks:
                block.attention_recorder = None
        return weights


def attention_model(model):
    """Returns a model that maps the same images to the attention weights of every block.

    The new model shares the layers (and so the weights) of `model`, a model built by `vit()`.
    Its output is a list with one `[batch, heads, tokens, tokens]` tensor per encoder block
    (two per layer for Axial-ViT: rows, then columns, each as the equivalent full matrix).
    The default forward pass of `model` is untouched and computes no extra output.
    """
    return _AttentionModel(model, name=f"{model.name}_attention")

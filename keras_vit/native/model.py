"""A ViT at native resolution: `NaFlexViT(model)` runs the layers (and weights) of a keras_vit
model on images at their own aspect ratios, each a grid of patches within a budget (SigLIP 2's
NaFlex: Tschannen et al., "SigLIP 2", 2025; transformers' `Siglip2VisionModel`), as timm
builds its `NaFlexVit` from classic ViT weights.

Its input is what `keras_vit.native.prepare` (or transformers' `Siglip2ImageProcessor`) makes:
a dict of `pixel_values` `[batch, length, P * P * 3]`, `pixel_attention_mask` `[batch, length]`
and `spatial_shapes` `[batch, 2]`; or the same under timm's names (its NaFlex collator's):
`patches`, `patch_valid` `[batch, length]` and `patch_coord` `[batch, length, 2]` (each patch's
row and column; an image's grid is one more than its patches' largest row and column). The patch
embedding is the model's convolution applied to each flattened patch; the learned position
embeddings are resized to each image's grid as the model's `position_embedding_interpolation`
says (antialiased bilinear, as SigLIP 2; antialiased bicubic, as timm's `NaFlexVit`); padding
keys are masked in every attention and left out of every pooling. All shapes are static in
`length`, so one compiled program serves every mix of sizes in a batch.
"""

import dataclasses

import keras
from keras import ops

from keras_vit.architecture.variants import _describe
from keras_vit.layers import position as position_layers
from keras_vit.native import positions

INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
# Several images in one sequence (NaViT): the slot of each patch (0 for padding, 1 for the
# first image...), its row and column in its image, and each slot's grid.
PACKED_INPUTS = ("pixel_values", "segment_ids", "patch_coords", "spatial_shapes")
# timm's names (NaFlexVit's dict, its NaFlex collator's): the patches, whether each is one, and
# its row and column in its image.
TIMM_INPUTS = ("patches", "patch_valid", "patch_coord")


@dataclasses.dataclass
class Layout:
    """Where each patch of a batch is: `rows`, `columns` `[batch, length]` in its image,
    `sizes` `[batch, length, 2]` the rows and columns of its image; the keys each token
    attends to (`attention_mask`, prefix tokens included), the tokens of an image
    (`token_mask`) and what each pooled output pools (`pool_mask`: `[batch, tokens]`, or
    `[batch, slots, tokens]` for packed images)."""

    rows: object
    columns: object
    sizes: object
    attention_mask: object
    token_mask: object
    pool_mask: object


def _padded_layout(inputs, prefix):
    """One image per sequence, its patches first, padding after (transformers' arrays)."""
    pixels, mask, shapes = (inputs[name] for name in INPUTS)
    if tuple(mask.shape) != tuple(pixels.shape[:2]) or tuple(shapes.shape[1:]) != (2,):
        raise ValueError(f"pixel_attention_mask must be [batch, length] and spatial_shapes "
                         f"[batch, 2] for pixel_values {tuple(pixels.shape)}; got "
                         f"{tuple(mask.shape)} and {tuple(shapes.shape)}.")
    length = pixels.shape[1]
    rows, columns, _ = positions.patch_positions(shapes, length)
    sizes = ops.broadcast_to(ops.cast(shapes, "float32")[:, None, :], (ops.shape(rows)[0],
                                                                        length, 2))
    mask = ops.cast(mask, "bool")
    mask = ops.concatenate([ops.ones((ops.shape(mask)[0], prefix), "bool"), mask], axis=1)
    return Layout(rows, columns, sizes, mask, mask, mask)


def _timm_layout(inputs, prefix):
    """One image per sequence under timm's names: each image's grid is one more than its valid
    patches' largest row and column (as timm's NaFlexVit computes it)."""
    pixels, valid, coords = (inputs[name] for name in TIMM_INPUTS)
    if (tuple(valid.shape) != tuple(pixels.shape[:2])
            or tuple(coords.shape) != tuple(pixels.shape[:2]) + (2,)):
        raise ValueError(f"patch_valid must be [batch, length] and patch_coord [batch, length, "
                         f"2] for patches {tuple(pixels.shape)}; got {tuple(valid.shape)} and "
                         f"{tuple(coords.shape)}.")
    valid = ops.cast(valid, "bool")
    coords = ops.where(valid[..., None], ops.cast(coords, "float32"), 0.0)
    sizes = ops.max(coords, axis=1, keepdims=True) + 1.0
    sizes = ops.broadcast_to(sizes, tuple(ops.shape(coords)))
    mask = ops.concatenate([ops.ones((ops.shape(valid)[0], prefix), "bool"), valid], axis=1)
    return Layout(coords[..., 0], coords[..., 1], sizes, mask, mask, mask)


def _pixels(inputs):
    """The patches of `inputs`, under transformers' name or timm's."""
    return inputs["pixel_values"] if "pixel_values" in inputs else inputs["patches"]


def _packed_layout(model, inputs):
    """Several images per sequence: each attends to its own patches, pools its own."""
    pixels, segments, coords, shapes = (inputs[name] for name in PACKED_INPUTS)
    if model.spec.num_prefix_tokens:
        raise ValueError(f"Model {model.name!r} has prefix tokens (class token, registers or "
                         "a distillation token), one set per sequence: packed images need a "
                         "model without them (classifier 'gap' or 'map', class_token=False), "
                         "as NaViT's.")
    if (tuple(segments.shape) != tuple(pixels.shape[:2])
            or tuple(coords.shape) != tuple(pixels.shape[:2]) + (2,)
            or len(shapes.shape) != 3 or shapes.shape[-1] != 2):
        raise ValueError(f"Packed images take segment_ids [batch, length], patch_coords "
                         f"[batch, length, 2] and spatial_shapes [batch, slots, 2] for "
                         f"pixel_values {tuple(pixels.shape)}; got {tuple(segments.shape)}, "
                         f"{tuple(coords.shape)} and {tuple(shapes.shape)}.")
    segments = ops.cast(segments, "int32")
    coords = ops.cast(coords, "float32")
    slot = ops.maximum(segments - 1, 0)  # padding reads slot 0's size (and is masked)
    index = ops.broadcast_to(slot[..., None], tuple(ops.shape(slot)) + (2,))
    sizes = ops.take_along_axis(ops.cast(shapes, "float32"), index, axis=1)
    valid = segments > 0
    same = ops.equal(segments[:, :, None], segments[:, None, :])
    attention = ops.logical_and(same, valid[:, None, :])
    slots = ops.arange(1, shapes.shape[1] + 1, dtype="int32")
    pool = ops.equal(segments[:, None, :], slots[None, :, None])
    return Layout(coords[..., 0], coords[..., 1], sizes, attention, valid, pool)


def unsupported(spec):
    """What of `spec` a NaFlex model cannot run, in words, or None."""
    if spec.is_hybrid:
        return "a ResNet stem (a hybrid sees whole images, not patches)"
    if spec.conv_stem:  # NaFlex embeds a patch by one projection; BatchNorm would see padding
        return "MobileCLIP's convolutional stem (conv_stem)"
    if spec.axial:
        return "Axial-ViT's row and column blocks"
    if spec.position_embedding not in ("learned", "sincos_2d", "none"):
        return f"position_embedding={spec.position_embedding!r}"
    if spec.position_embedding_placement != "stem":
        return f"position_embedding_placement={spec.position_embedding_placement!r}"
    if spec.rope is not None:
        return f"rope={spec.rope!r}"
    return None


@keras.saving.register_keras_serializable(package="keras_vit")
class NaFlexViT(keras.Model):
    """The model `vit` (a `keras_vit` model, built with `keras_vit.vit` or loaded) on NaFlex
    inputs (module docstring), sharing its weights: training one trains the other.

    `call(inputs)` returns what `vit` returns (logits, or pooled features without a head);
    `representation(inputs)` what its head reads (`keras_vit.analysis.feature_model`'s output
    for the classic model); `tokens(inputs)` the encoder's tokens `[batch, prefix + length, D]`
    (after the final norm where the model norms its tokens) and the mask of those that are
    tokens of the image; `layout(inputs)` where each patch is (`Layout`).
    Refuses, naming it, a model whose architecture needs whole square grids: a hybrid,
    Axial-ViT, relative or rotary positions, position embeddings in every block."""

    def __init__(self, vit, **kwargs):
        spec = getattr(vit, "spec", None)
        if spec is None:
            raise TypeError(f"NaFlexViT takes a keras_vit model (keras_vit.vit, from_pretrained "
                            f"or a loaded .keras file), got {_describe(vit)}.")
        problem = unsupported(spec)
        if problem:
            raise ValueError(f"Model {vit.name!r} cannot run at native resolution: it has "
                             f"{problem}. NaFlex runs ViTs whose patches are embedded one by "
                             "one with learned, sincos_2d or no position embeddings at the "
                             "stem.")
        kwargs.setdefault("name", f"{vit.name}_naflex")
        super().__init__(**kwargs)
        self.vit = vit
        self.spec = spec
        self.built = True  # its weights are the built model's

    def _layer(self, name):
        try:
            return self.vit.get_layer(name)
        except ValueError:
            return None

    def layout(self, inputs):
        """`Layout` of `inputs`: one image per sequence (transformers' arrays, or timm's) or
        several packed (`segment_ids`), each checked at the boundary."""
        kinds = (INPUTS, PACKED_INPUTS, TIMM_INPUTS)
        if not isinstance(inputs, dict) or not any(set(kind) <= set(inputs) for kind in kinds):
            got = sorted(inputs) if isinstance(inputs, dict) else _describe(inputs)
            raise ValueError(f"Model {self.name!r} takes a dict of {', '.join(INPUTS)} "
                             f"(keras_vit.native.prepare makes it), or of packed images "
                             f"{', '.join(PACKED_INPUTS)} (keras_vit.native.pack), or timm's "
                             f"{', '.join(TIMM_INPUTS)}, got {got}.")
        pixels, name = _pixels(inputs), "pixel_values" if "pixel_values" in inputs else "patches"
        width = self.spec.patch_size ** 2 * 3
        if len(pixels.shape) != 3 or pixels.shape[-1] not in (None, width):
            raise ValueError(f"{name} must be [batch, length, {width}] (patches of "
                             f"{self.spec.patch_size}x{self.spec.patch_size}x3), got shape "
                             f"{tuple(pixels.shape)}.")
        if set(PACKED_INPUTS) <= set(inputs):
            return _packed_layout(self, inputs)
        if set(INPUTS) <= set(inputs):
            return _padded_layout(inputs, self.spec.num_prefix_tokens)
        return _timm_layout(inputs, self.spec.num_prefix_tokens)

    def _embedded(self, pixels, layout):
        """The patches through the model's patch embedding, with their position embeddings."""
        spec, dtype = self.spec, self.compute_dtype
        embedding = self.vit.get_layer("embedding")
        kernel = ops.reshape(embedding.kernel, (-1, spec.hidden_size))
        x = ops.matmul(ops.cast(pixels, dtype), ops.cast(kernel, dtype))
        x = ops.add(x, ops.cast(embedding.bias, dtype))
        if self._layer("patch_norm") is not None:  # before the positions, as the classic model
            x = self._layer("patch_norm")(x)
        position = self.vit.get_layer("posembed_input")
        if spec.position_embedding == "learned":
            prefix = position.num_embedded_prefix
            table = ops.reshape(position.pos_embedding[0, prefix:], spec.grid_size + (-1,))
            x = x + ops.cast(positions.resized_learned(
                table, layout.rows, layout.columns, layout.sizes,
                spec.position_embedding_interpolation), dtype)
        elif spec.position_embedding == "sincos_2d":
            x = x + ops.cast(position_layers.sincos_at(layout.rows, layout.columns,
                                                       spec.hidden_size), dtype)
        return x

    def _with_prefix(self, x):
        """The prefix tokens in the model's order (registers, distillation token, class token,
        each joining at the front) with their position embeddings."""
        spec = self.spec
        prefix = ops.zeros((ops.shape(x)[0], 0, x.shape[-1]), x.dtype)
        for name in ("reg", "dist", "cls"):
            layer = self._layer(name)
            if layer is not None:
                prefix = layer(prefix)
        position = self.vit.get_layer("posembed_input")
        if spec.position_embedding == "learned" and position.num_embedded_prefix:
            prefix = prefix + ops.cast(
                position.pos_embedding[:, :position.num_embedded_prefix], x.dtype)
        return ops.concatenate([prefix, x], axis=1)

    def _encoded(self, inputs, training):
        """`(tokens, layout)`: the encoder's tokens and where each patch is."""
        layout = self.layout(inputs)
        x = self._with_prefix(self._embedded(_pixels(inputs), layout))
        x = self.vit.get_layer("dropout")(x, training=training)
        for layer in self.vit.layers:
            if layer.name == "pre_norm" or layer.name == "encoder_norm":
                x = layer(x)
            elif layer.name.startswith("encoderblock_"):
                x = layer(x, training=training, attention_mask=layout.attention_mask)
        return x, layout

    def tokens(self, inputs, training=False):
        """`(tokens, mask)`: the encoder's tokens `[batch, prefix + length, D]` and which of
        them are an image's (`[batch, prefix + length]`, True for the prefix)."""
        x, layout = self._encoded(inputs, training)
        return x, layout.token_mask

    def representation(self, inputs, training=False):
        """What the head reads, `[batch, D]` (`[batch, slots, D]` for packed images): the
        pooled tokens after `fc_norm` and `pre_logits` where the model has them; a
        distillation-token model's class token. The classic model's is
        `keras_vit.analysis.feature_model`'s output (the paper's few-shot features)."""
        return self._represented(*self._encoded(inputs, training))

    def _represented(self, x, layout):
        layer = self._layer
        pool = layer("MAPHead_0") or layer("pool")  # a distillation model's "pool": its class
        x = pool(x, token_mask=layout.pool_mask)     # token (the mask is for "gap", "map")
        for name in ("fc_norm", "pre_logits"):
            if layer(name) is not None:
                x = layer(name)(x)
        return x

    def call(self, inputs, training=False):
        x, layout = self._encoded(inputs, training)
        layer = self._layer
        if self.spec.distillation_token:
            heads = [layer(name) for name in ("head", "head_dist")] if layer("head") else None
            pooled = [layer(name)(x) for name in ("pool", "pool_dist")]
            if heads:
                pooled = [head(token) for head, token in zip(heads, pooled)]
            return layer("head_mean")(pooled)
        x = self._represented(x, layout)
        return x if layer("head") is None else layer("head")(x)

    # What each weight is to a trainer: the classic model's answers (its weights are these).
    def layer_indices(self, variables):
        return self.vit.layer_indices(variables)

    @property
    def num_blocks(self):
        return self.vit.num_blocks

    @property
    def decays(self):
        return self.vit.decays

    @property
    def get_layout_map(self):
        return self.vit.get_layout_map

    # How it runs (attention kernel, remat) is its blocks', which are the classic model's:
    # `keras_vit.set_execution` of either says so for both.
    @property
    def execution(self):
        return getattr(self.vit, "execution", None)

    @execution.setter
    def execution(self, value):
        self.vit.execution = value

    def get_config(self):
        return {"name": self.name, "vit": keras.saving.serialize_keras_object(self.vit)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        vit = keras.saving.deserialize_keras_object(config.pop("vit"),
                                                    custom_objects=custom_objects)
        return cls(vit, **config)

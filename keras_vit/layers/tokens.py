"""Images to tokens and the learned tokens put before them: the patches' projection
(`PatchEmbed`, after MobileCLIP's `ConvStem` where the model has one, with `PadToMultiple` for
sizes the patches do not divide), then the class,
distillation and register tokens."""

import keras
from keras import ops

from keras_vit.layers.shapes import _check_rank


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbed(keras.layers.Layer):
    """Cuts images into non-overlapping square patches and projects each to `hidden_size`.

    The projection is the paper's E (a convolution with stride = kernel = patch size).

    Args:
        patch_size: side of the square patches in pixels.
        hidden_size: width D of each token.
        flatten: True returns the tokens as a sequence; False keeps them as the patch grid
            (what models of any image size pass on, so that later layers know the grid).
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Input: images `[batch, height, width, channels]`, height and width multiples of
    `patch_size`. Output: tokens `[batch, (height // p) * (width // p), hidden_size]`, row major
    (`[batch, height // p, width // p, hidden_size]` with `flatten=False`).
    """

    def __init__(self, patch_size, hidden_size, flatten=True, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = int(patch_size)
        self.hidden_size = int(hidden_size)
        self.flatten = bool(flatten)
        # While a MaskedPatchPredictor runs the model: a function applied to the tokens (it
        # corrupts some of them), then forgotten.
        self.token_transform = None

    def build(self, input_shape):
        _check_rank(self, input_shape, 4, "images [batch, height, width, channels]")
        height, width, channels = input_shape[1:]
        for side, value in (("height", height), ("width", width)):
            if value is not None and value % self.patch_size:
                raise ValueError(
                    f"Image {side} {value} is not divisible by the patch size {self.patch_size}; "
                    f"use a multiple of {self.patch_size}, e.g. "
                    f"{value // self.patch_size * self.patch_size or self.patch_size}."
                )
        if channels is None:
            raise ValueError("PatchEmbed needs a known number of input channels.")
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.patch_size, self.patch_size, channels, self.hidden_size),
            initializer="lecun_normal",
        )
        self.bias = self.add_weight(name="bias", shape=(self.hidden_size,), initializer="zeros")
        self.channels = channels

    def call(self, images):
        if images.shape[-1] not in (self.channels, None):
            raise ValueError(
                f"Expected images with {self.channels} channels (last axis), "
                f"got shape {tuple(images.shape)}."
            )
        patches = ops.conv(images, self.kernel, strides=self.patch_size, padding="valid")
        patches = ops.add(patches, self.bias)  # a BiasAdd that fuses with the conv on TF
        if self.flatten or self.token_transform is not None:
            tokens = ops.reshape(patches, (ops.shape(patches)[0], -1, self.hidden_size))
            if self.token_transform is not None:
                tokens = self.token_transform(tokens)
            if self.flatten:
                return tokens
            return ops.reshape(tokens, ops.shape(patches))
        return patches

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        rows, columns = (None if side is None else side // self.patch_size
                         for side in (height, width))
        if not self.flatten:
            return (batch, rows, columns, self.hidden_size)
        tokens = None if rows is None or columns is None else rows * columns
        return (batch, tokens, self.hidden_size)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size,
                "hidden_size": self.hidden_size, "flatten": self.flatten}


@keras.saving.register_keras_serializable(package="keras_vit")
class ConvStem(keras.layers.Layer):
    """MobileCLIP's convolutional stem before the patch embedding (Vasu et al., "MobileCLIP",
    2024; timm's `ConvStem` in `vit_base_mci_224`): a convolution of kernel = stride
    `patch_size // 4`, then one of 2, each without bias, to `channels` channels, each followed
    by BatchNorm (`bn_0`, `bn_1`) and exact GELU. A `PatchEmbed` of 2x2 patches makes the
    tokens of its output, so a token sees its own `patch_size` pixels alone.

    BatchNorm as PyTorch's (epsilon 1e-5, momentum 0.1 there, 0.9 in Keras' terms): moving
    statistics at inference, the batch's in training (updating the moving ones).

    Args:
        patch_size: pixels per token along each side, a multiple of 4.
        channels: of both convolutions (MobileCLIP's: hidden_size / 4).
    """

    def __init__(self, patch_size, channels, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = int(patch_size)
        self.channels = int(channels)
        if self.patch_size % 4 or self.patch_size < 4:
            raise ValueError(f"ConvStem's patch_size must be a multiple of 4, got {patch_size}.")

    def build(self, input_shape):
        _check_rank(self, input_shape, 4, "images [batch, height, width, channels]")
        self.convs, self.norms = [], []
        shape = tuple(input_shape)
        for index, step in enumerate((self.patch_size // 4, 2)):
            conv = keras.layers.Conv2D(self.channels, step, strides=step, use_bias=False,
                                       name=f"conv_{index}", dtype=self.dtype_policy)
            norm = keras.layers.BatchNormalization(epsilon=1e-5, momentum=0.9,
                                                   name=f"bn_{index}", dtype=self.dtype_policy)
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)
            self.convs.append(conv)
            self.norms.append(norm)

    def call(self, images, training=None):
        x = images
        for conv, norm in zip(self.convs, self.norms):
            x = norm(conv(x), training=training)
            # Exact GELU through erf: TensorFlow's own form uses Erfc, which ONNX has not.
            x = 0.5 * x * (1.0 + ops.erf(x * 0.7071067811865476))
        return x

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        step = self.patch_size // 2
        return (batch, *(None if side is None else side // step for side in (height, width)),
                self.channels)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size,
                "channels": self.channels}


@keras.saving.register_keras_serializable(package="keras_vit")
class PadToMultiple(keras.layers.Layer):
    """Pads images at the bottom and right with zeros to a multiple of `multiple` pixels, so
    that a model of any image size takes sizes its patches do not divide (timm's
    `dynamic_img_pad`). Zeros are mid-grey in [-1, 1] pixels.

    Args:
        multiple: pixels per token along each side (the patch size times a hybrid's stride).
    """

    def __init__(self, multiple, **kwargs):
        super().__init__(**kwargs)
        self.multiple = int(multiple)

    def call(self, images):
        shape = ops.shape(images)
        pads = [(-shape[axis]) % self.multiple for axis in (1, 2)]
        return ops.pad(images, ((0, 0), (0, pads[0]), (0, pads[1]), (0, 0)))

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        height, width = (None if side is None else -(-side // self.multiple) * self.multiple
                         for side in (height, width))
        return (batch, height, width, channels)

    def get_config(self):
        return {**super().get_config(), "multiple": self.multiple}


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends the learned class token (initialised to zeros) to a token sequence.

    Input: `[batch, tokens, D]`. Output: `[batch, tokens + 1, D]`. The weight is named `cls`
    like the original's.
    """

    token_name = "cls"

    def token_initializer(self):
        return "zeros"

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        self.token = self.add_weight(name=self.token_name, shape=(1, 1, input_shape[-1]),
                                     initializer=self.token_initializer())

    @property
    def cls(self):  # the name it had before DistillationToken shared the code
        return self.token

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        token = ops.broadcast_to(ops.cast(self.token, tokens.dtype),
                                 (batch, 1, tokens.shape[-1]))
        return ops.concatenate([token, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        # Not a no-op: Keras refuses to serialise a layer built with a non-basic argument (a
        # DTypePolicy object, as mixed precision passes) unless the class overrides get_config.
        return super().get_config()


@keras.saving.register_keras_serializable(package="keras_vit")
class DistillationToken(ClassToken):
    """Prepends DeiT's distillation token (Touvron et al., 2021), a second learned token that a
    head of its own reads; the class token is prepended after it, so it comes first (as timm
    and transformers order them). The weight is named `dist`, initialised as DeiT's (truncated
    normal, standard deviation 0.02)."""

    token_name = "dist"

    def token_initializer(self):
        # Made when built, so that it draws from the seed keras.utils.set_random_seed set.
        return keras.initializers.TruncatedNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="keras_vit")
class RegisterTokens(keras.layers.Layer):
    """Prepends `count` learned register tokens to a token sequence (Darcet et al., "Vision
    Transformers Need Registers", 2024): extra tokens that attention may use and no output
    reads. A class token, if any, is prepended after them, so it comes first (as timm).

    Input: `[batch, tokens, D]`. Output: `[batch, count + tokens, D]`; weight `registers`
    `(1, count, D)`, initialised as timm's (normal, standard deviation 1e-6).
    """

    def __init__(self, count, **kwargs):
        super().__init__(**kwargs)
        self.count = int(count)

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        self.registers = self.add_weight(
            name="registers", shape=(1, self.count, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=1e-6))

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        registers = ops.broadcast_to(ops.cast(self.registers, tokens.dtype),
                                     (batch, self.count, tokens.shape[-1]))
        return ops.concatenate([registers, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + self.count
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        return {**super().get_config(), "count": self.count}

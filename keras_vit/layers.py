"""The Vision Transformer's layers, written with `keras.ops` so they run on any Keras backend.

Reading order follows the model: patches, class token, position embeddings, then the encoder
block (attention + MLP). Weights are named after the original checkpoint tree so that loading a
released `.npz` file is a mechanical map.
"""

import functools
import math

import keras
import numpy as np
from keras import ops

from keras_vit import resample
from keras_vit.execution import ATTENTION_IMPLS
from keras_vit.spec import ACTIVATIONS, CLASSIFIERS, LAYER_NORM_EPSILON
from keras_vit.spec import ROPE_TEMPERATURES


def _xavier_uniform_flat(fan_in, fan_out):
    """Xavier-uniform on the flattened (fan_in, fan_out) matrix, for any kernel shape."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


def _attention_output_spec(layer, x, return_attention_scores):
    """Symbolic outputs of a layer that returns tokens and optionally attention weights."""
    output = keras.KerasTensor(x.shape, dtype=layer.compute_dtype)
    if not return_attention_scores:
        return output
    tokens = x.shape[1]
    scores = keras.KerasTensor((x.shape[0], layer.num_heads, tokens, tokens),
                               dtype=layer.compute_dtype)
    return output, scores


def grid_sides(grid):
    """`(rows, columns)` of a patch grid `[batch, rows, columns, D]` (what `PatchEmbed` returns
    with `flatten=False`): Python ints where the shape is static, scalar tensors where the
    graph learns them only when it runs (a SavedModel of any image size)."""
    static = grid.shape[1:3]
    dynamic = ops.shape(grid)
    return tuple(int(side) if isinstance(side, (int, np.integer)) else dynamic[axis + 1]
                 for axis, side in enumerate(static))


def _is_static(sides, expected):
    return all(isinstance(side, int) for side in sides) and tuple(sides) == tuple(expected)


def _check_rank(layer, shape, rank, what):
    if len(shape) != rank:
        raise ValueError(
            f"{layer.__class__.__name__} '{layer.name}' expects {what} of rank {rank}, "
            f"got shape {tuple(shape)}."
        )


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


POSITION_EMBEDDINGS = ("learned", "learned_2d", "none", "sincos_2d")


def sincos_2d(rows, columns, width, temperature=10_000.0):
    """Fixed 2-D position embeddings of a `rows` x `columns` patch grid, `[rows * columns,
    width]` in row-major order: for each of width / 4 frequencies from 1 to 1 / temperature
    (geometric), the sine and the cosine of the column index, then of the row index
    (big_vision's `posemb_sincos_2d`, as MAE's)."""
    quarter = width // 4
    omega = 1.0 / temperature ** (ops.arange(quarter, dtype="float32") / (quarter - 1))
    row = ops.broadcast_to(ops.arange(rows, dtype="float32")[:, None], (rows, columns))
    column = ops.broadcast_to(ops.arange(columns, dtype="float32")[None, :], (rows, columns))
    row = ops.reshape(row, (-1, 1)) * omega[None]
    column = ops.reshape(column, (-1, 1)) * omega[None]
    return ops.concatenate([ops.sin(column), ops.cos(column), ops.sin(row), ops.cos(row)],
                           axis=1)


def rope_angles(kind, sides, head_dim, temperature, reference_grid=None, grid_offset=0.0,
                xp=np):
    """Rotary embeddings' angles of a `rows` x `columns` patch grid, `[rows * columns,
    head_dim / 2]` in row-major order: for each of head_dim / 4 geometric frequencies, the
    patch's row coordinate times it, then its column coordinate times it (see
    `ViTConfig.rope`). Channel i of a query or key rotates with channel i + head_dim / 2 by
    angle i. In `xp`: NumPy (float64, for a grid known when the model is built) or
    `keras.ops` (float32, for the grid of the input at call time)."""
    rows, columns = sides
    quarter = head_dim // 4
    dtype = "float32" if xp is ops else "float64"
    frequencies = xp.arange(quarter, dtype=dtype) / quarter
    frequencies = 1.0 / xp.power(float(temperature), frequencies)

    def coordinates(count, reference):
        index = xp.arange(count, dtype=dtype)
        count = ops.cast(count, dtype) if xp is ops else float(count)
        if kind == "axial_normalized":  # the patch centres, scaled to [-1, 1]
            return 2.0 * (index + 0.5) / count - 1.0
        index = index + grid_offset
        return index if reference is None else index / count * reference

    if kind == "axial_normalized":
        frequencies = 2.0 * math.pi * frequencies
    reference = reference_grid or (None, None)
    row = coordinates(rows, reference[0])[:, None] * frequencies[None]  # [rows, quarter]
    column = coordinates(columns, reference[1])[:, None] * frequencies[None]
    row = xp.broadcast_to(row[:, None, :], (rows, columns, quarter))
    column = xp.broadcast_to(column[None, :, :], (rows, columns, quarter))
    return xp.reshape(xp.concatenate([row, column], axis=-1), (-1, 2 * quarter))


@keras.saving.register_keras_serializable(package="keras_vit")
class MixedRopeFrequencies(keras.layers.Layer):
    """RoPE-Mixed's learned frequencies (Heo et al., "Rotary Position Embedding for Vision
    Transformer", 2024): weight `frequencies` `[2, heads, head_dim / 2]`, each pair of channels'
    frequency along the rows and along the columns, initialised as theirs (magnitudes
    temperature^(-k/(head_dim/4)), turned by a random angle per head). A float32 layer under
    any policy: angles of tens of radians need its precision.

    `call(coordinates)`: the patches' (row, column) indices `[patches, 2]` to their angles
    `[patches, heads, head_dim / 2]`, row times the row frequency plus column times the column
    one.
    """

    def __init__(self, num_heads, head_dim, temperature=10.0, **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        self.num_heads, self.head_dim = int(num_heads), int(head_dim)
        self.temperature = float(temperature)

    def build(self, input_shape=None):
        self.frequencies = self.add_weight(
            name="frequencies", shape=(2, self.num_heads, self.head_dim // 2),
            initializer=self._initial_frequencies)

    def _initial_frequencies(self, shape, dtype=None):
        quarter = self.head_dim // 4
        magnitude = ops.convert_to_tensor(
            1.0 / self.temperature ** (np.arange(quarter) / quarter), "float32")
        turn = keras.random.uniform((self.num_heads, 1), 0.0, 2.0 * math.pi)
        rows = ops.concatenate([magnitude * ops.sin(turn), magnitude * ops.cos(turn)], axis=-1)
        columns = ops.concatenate([magnitude * ops.cos(turn), -magnitude * ops.sin(turn)],
                                  axis=-1)
        return ops.cast(ops.stack([rows, columns]), dtype or "float32")

    def call(self, coordinates):
        return (coordinates[:, 0, None, None] * self.frequencies[0][None]
                + coordinates[:, 1, None, None] * self.frequencies[1][None])

    def compute_output_shape(self, coordinates_shape):
        return (coordinates_shape[0], self.num_heads, self.head_dim // 2)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "head_dim": self.head_dim,
                "temperature": self.temperature}


def _patch_coordinates(sides):
    """The (row, column) index of each patch of a grid of `sides`, `[rows * columns, 2]`
    float32 in row-major order (NumPy where the sides are known, else `keras.ops`)."""
    rows, columns = sides
    xp = np if all(isinstance(side, int) for side in sides) else ops
    row = xp.repeat(xp.arange(rows, dtype="float32"), columns)
    column = xp.tile(xp.arange(columns, dtype="float32"), [rows])
    return xp.stack([row, column], axis=1)


def rotate(x, cos, sin):
    """`x` `[..., head_dim]` rotated by the angles whose cosines and sines are `cos` and `sin`
    `[..., head_dim / 2]`: channel i with channel i + head_dim / 2."""
    first, second = ops.split(x, 2, axis=-1)
    return ops.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbs(keras.layers.Layer):
    """Adds position embeddings to a sequence of `prefix` tokens followed by a grid of patches.

    Args:
        grid_size: `(rows, columns)` of the patch grid.
        num_prefix_tokens: tokens before the grid (the class token and register tokens).
        kind: the paper's choices (appendix D.4):
            "learned": one learned D-vector per position, including the prefix tokens, weight
                `pos_embedding` of shape `(1, prefix + rows * columns, D)` as in the checkpoints;
            "learned_2d": learned row and column embeddings of size D/2 each, concatenated
                (`row_embedding`, `column_embedding`), plus `prefix_embedding` for prefix tokens;
            "none": nothing is added;
            "sincos_2d": fixed sines and cosines of each patch's row and column (`sincos_2d`),
                no weights, nothing for the prefix tokens; computed for any grid, so it is
                never resampled.
        interpolation: how the embeddings are resampled for another grid, "bilinear" (the
            original code's) or "bicubic" (timm's); see `keras_vit.resample`.
        embed_prefix: False to add embeddings to the patches only (timm's `no_embed_class`):
            the weights have no rows for the prefix tokens, which pass unchanged.
        **kwargs: base `Layer` arguments.

    `call(tokens, grid=None)`: with `grid`, the patch grid `[batch, rows, columns, D]` of these
    tokens, the embeddings are resampled from `grid_size` to its size at call time (a model of
    any image size); without it the tokens must be of `grid_size`.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, kind="learned",
                 interpolation="bilinear", embed_prefix=True, **kwargs):
        # The embeddings are read in their own (float32) dtype and resampled in it; the sum
        # with the tokens is in theirs.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        if kind not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"Unknown position embedding {kind!r}; expected one of {POSITION_EMBEDDINGS}."
            )
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.kind = kind
        self.interpolation = resample.check_interpolation(interpolation)
        self.embed_prefix = bool(embed_prefix)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    @property
    def num_embedded_prefix(self):
        """Rows of the weights for prefix tokens: all of them, or none (`embed_prefix=False`)."""
        return self.num_prefix_tokens if self.embed_prefix else 0

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        hidden = self.hidden_size = input_shape[-1]
        init = keras.initializers.RandomNormal(stddev=0.02)
        if self.kind == "sincos_2d" and (hidden % 4 or hidden < 8):
            raise ValueError(f"sincos_2d position embeddings need a width that is a multiple of "
                             f"4, at least 8, got {hidden}.")
        if self.kind == "learned":
            rows = self.num_embedded_prefix + self.grid_size[0] * self.grid_size[1]
            self.pos_embedding = self.add_weight(
                name="pos_embedding", shape=(1, rows, hidden), initializer=init)
        elif self.kind == "learned_2d":
            if hidden % 2:
                raise ValueError(f"learned_2d position embeddings need an even width, got {hidden}.")
            rows, columns = self.grid_size
            self.row_embedding = self.add_weight(
                name="row_embedding", shape=(rows, hidden // 2), initializer=init)
            self.column_embedding = self.add_weight(
                name="column_embedding", shape=(columns, hidden // 2), initializer=init)
            if self.num_embedded_prefix:
                self.prefix_embedding = self.add_weight(
                    name="prefix_embedding", shape=(self.num_embedded_prefix, hidden),
                    initializer=init)

    def embeddings(self, sides=None):
        """The `[1, tokens, D]` embeddings this layer adds (None for "none"), for its own grid
        or resampled to `sides` = (rows, columns)."""
        if self.kind == "none":
            return None
        sides = self.grid_size if sides is None else sides
        same = _is_static(sides, self.grid_size)
        rows, columns = sides
        prefix = self.num_embedded_prefix
        if self.kind == "sincos_2d":
            grid = sincos_2d(rows, columns, self.hidden_size)
            return ops.pad(grid, [(prefix, 0), (0, 0)])[None]  # nothing for the prefix
        if self.kind == "learned":
            if same:
                return self.pos_embedding
            grid = ops.reshape(self.pos_embedding[0, prefix:], self.grid_size + (-1,))
            grid = resample.resample_grid(grid, sides, self.interpolation, xp=ops)
            grid = ops.reshape(grid, (rows * columns, grid.shape[-1]))
            return ops.concatenate([self.pos_embedding[0, :prefix], grid], axis=0)[None]
        row_table, column_table = self.row_embedding, self.column_embedding
        if not same:
            row_table = resample.resample_axis(row_table, rows, 0, self.interpolation, xp=ops)
            column_table = resample.resample_axis(column_table, columns, 0, self.interpolation,
                                                  xp=ops)
        half = self.row_embedding.shape[-1]
        row = ops.broadcast_to(row_table[:, None, :], (rows, columns, half))
        column = ops.broadcast_to(column_table[None, :, :], (rows, columns, half))
        grid = ops.reshape(ops.concatenate([row, column], axis=-1), (rows * columns, 2 * half))
        if prefix:
            grid = ops.concatenate([self.prefix_embedding, grid], axis=0)
        return grid[None]

    def call(self, tokens, grid=None):
        if grid is None and tokens.shape[1] is not None and tokens.shape[1] != self.num_tokens:
            raise ValueError(
                f"Position embeddings were built for {self.num_tokens} tokens "
                f"({self.num_prefix_tokens} prefix + {self.grid_size[0]}x{self.grid_size[1]} "
                f"grid) but got {tokens.shape[1]}. Build the model for this image size, or "
                "with dynamic_image_size=True."
            )
        embeddings = self.embeddings(None if grid is None else grid_sides(grid))
        if embeddings is None:
            return tokens
        embeddings = ops.cast(embeddings, tokens.dtype)
        if self.num_prefix_tokens and not self.embed_prefix:
            # The prefix tokens pass unchanged (timm adds the embeddings before they join).
            prefix = self.num_prefix_tokens
            return ops.concatenate([tokens[:, :prefix], tokens[:, prefix:] + embeddings],
                                   axis=1)
        return tokens + embeddings

    def compute_output_spec(self, tokens, grid=None):
        return keras.KerasTensor(tokens.shape, dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens, "kind": self.kind,
                "interpolation": self.interpolation, "embed_prefix": self.embed_prefix}


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops the whole residual branch of a sample with probability `rate`.

    Kept samples are scaled by `1 / (1 - rate)`, so inference needs no change.

    Args:
        rate: probability of dropping a sample's branch during training.
        seed: optional integer seed.
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"DropPath rate must be in [0, 1), got {rate}.")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if rate > 0 else None

    def call(self, inputs, training=False):
        if not training or self.rate == 0.0:
            return inputs
        keep = 1.0 - self.rate
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        noise = keras.random.uniform(shape, seed=self.seed_generator, dtype=inputs.dtype)
        mask = ops.cast(noise < keep, inputs.dtype)
        return inputs * mask / ops.cast(keep, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


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


RELATIVE_POSITIONS = ("1d", "2d")


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionMlp(keras.layers.Layer):
    """Attention logits from the patches' offsets through a small MLP (Liu et al.'s Swin
    Transformer V2, 2022, continuous position bias; timm's `RelPosMlp` in its "cr" mode, as its
    `vit_relpos_*` models): each (row, column) offset between two patches, as
    sign(d) log(1 + |d|), goes through Dense(hidden, ReLU) and Dense(heads); the logit of a
    query and key is their offset's output, 0 for pairs with a prefix token. No dropout in its
    hidden layer (timm drops 12.5% there in training). Float32 inside, any image size.

    `call(queries, grid=None)`: queries `[batch, heads, tokens, head_dim]` (their dtype only),
    `grid` as in `RelativePositionBias`; returns logits `[1, heads, tokens, tokens]`. Weights:
    `fc1`, `fc2` (kernel and bias each).
    """

    def __init__(self, grid_size, num_heads, num_prefix_tokens=0, hidden_dim=128, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_heads = int(num_heads)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.hidden_dim = int(hidden_dim)

    def build(self, queries_shape=None):
        self.fc1 = keras.layers.Dense(self.hidden_dim, activation="relu", name="fc1",
                                      dtype="float32")
        self.fc2 = keras.layers.Dense(self.num_heads, name="fc2", dtype="float32")
        self.fc1.build((None, 2))
        self.fc2.build((None, self.hidden_dim))

    @staticmethod
    def offsets(sides, xp=np):
        """(every (row, column) offset of a grid of `sides`, sign(d) log(1 + |d|),
        `[(2 rows - 1) * (2 columns - 1), 2]`; for each pair of patches, row-major, the row of
        their offset `[patches, patches]`)."""
        rows, columns = sides
        row_offsets = xp.arange(-(rows - 1), rows, dtype="float32")
        column_offsets = xp.arange(-(columns - 1), columns, dtype="float32")
        table = xp.stack([
            xp.reshape(xp.broadcast_to(row_offsets[:, None], (2 * rows - 1, 2 * columns - 1)),
                       (-1,)),
            xp.reshape(xp.broadcast_to(column_offsets[None], (2 * rows - 1, 2 * columns - 1)),
                       (-1,))], axis=1)
        table = xp.sign(table) * xp.log1p(xp.abs(table))
        patch = _patch_coordinates(sides)  # each patch's (row, column), as exact floats
        patch = ops.cast(patch, "int32") if xp is ops else patch.astype("int32")
        row, column = patch[:, 0], patch[:, 1]
        index = ((row[:, None] - row[None] + rows - 1) * (2 * columns - 1)
                 + column[:, None] - column[None] + columns - 1)
        return table, index

    def call(self, queries, grid=None):
        sides = self.grid_size if grid is None else grid_sides(grid)
        xp = np if all(isinstance(side, int) for side in sides) else ops
        table, index = self.offsets(sides, xp)
        logits = self.fc2(self.fc1(ops.convert_to_tensor(table, "float32")))  # [offsets, heads]
        patches = ops.shape(index)[0] if xp is ops else index.shape[0]
        bias = ops.take(logits, ops.reshape(index, (-1,)), axis=0)
        bias = ops.transpose(ops.reshape(bias, (patches, patches, self.num_heads)), (2, 0, 1))
        prefix = self.num_prefix_tokens
        bias = ops.pad(bias, ((0, 0), (prefix, 0), (prefix, 0)))
        return ops.cast(bias[None], queries.dtype)

    def compute_output_shape(self, queries_shape, grid_shape=None):
        return (1, self.num_heads, queries_shape[2], queries_shape[2])

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_heads": self.num_heads, "num_prefix_tokens": self.num_prefix_tokens,
                "hidden_dim": self.hidden_dim}


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionBias(keras.layers.Layer):
    """Attention logits from relative positions (paper appendix D.4).

    Every (query, key) pair of patches has an offset: `p_q - p_k` along the flattened patch
    sequence ("1d"), or the row offset and the column offset ("2d", their two logits summed).
    Each offset has a learned embedding per head. A second attention, of the queries against
    these embeddings as keys, gives logits `q . r[p_q - p_k]` that the attention adds to its
    content logits before the softmax. Pairs with a prefix (class) token, which has no
    position, use one more learned embedding of their own per axis.

    Args:
        grid_size: `(rows, columns)` of the patch grid.
        num_heads: attention heads.
        num_prefix_tokens: tokens before the grid (1 with a class token, else 0).
        kind: "1d" (one table of `2 * rows * columns - 1` offsets) or "2d" (tables of
            `2 * rows - 1` row offsets and `2 * columns - 1` column offsets).
        interpolation: how the tables are resampled along their offsets for another grid
            ("bilinear" or "bicubic", see `keras_vit.resample`); the prefix row is kept.
        **kwargs: base `Layer` arguments.

    `call(queries, grid=None)`: with `grid`, the patch grid `[batch, rows, columns, D]`, the
    offsets are those of its size (a model of any image size).

    Input: queries `[batch, heads, tokens, head_dim]`. Output: logits
    `[batch, heads, tokens, tokens]`. Weights: `offset_embedding` ("1d"), or
    `row_offset_embedding` and `column_offset_embedding` ("2d"), each
    `[offsets (+1 with prefix tokens), heads, head_dim]`.
    """

    def __init__(self, grid_size, num_heads, num_prefix_tokens=1, kind="1d",
                 interpolation="bilinear", **kwargs):
        kwargs.setdefault("autocast", False)  # tables resampled in float32, then cast
        super().__init__(**kwargs)
        if kind not in RELATIVE_POSITIONS:
            raise ValueError(f"Unknown relative position kind {kind!r}; expected one of "
                             f"{RELATIVE_POSITIONS}.")
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_heads = int(num_heads)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.kind = kind
        self.interpolation = resample.check_interpolation(interpolation)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def _axes(self, sides, xp=np):
        """(coordinate of every patch along each axis, positions on the axis), for a grid of
        `sides` = (rows, columns), in `xp` (NumPy, or `keras.ops` for sides known at run time).
        """
        rows, columns = sides
        index = xp.arange(rows * columns)
        if self.kind == "1d":
            return [(index, rows * columns)]
        return [(index // columns, rows), (index % columns, columns)]

    def offset_indices(self, sides=None, xp=np):
        """Per axis, `[tokens, tokens]` rows into its table: `c_q - c_k + n - 1` between
        patches, and the last row, `2n - 1`, for pairs with a prefix token."""
        indices = []
        prefix = self.num_prefix_tokens
        for coordinate, positions in self._axes(sides or self.grid_size, xp):
            index = coordinate[:, None] - coordinate[None, :] + positions - 1
            index = xp.pad(index, ((prefix, 0), (prefix, 0)),
                           constant_values=2 * positions - 1)
            indices.append(xp.cast(index, "int32") if xp is ops else index.astype("int32"))
        return indices

    def build(self, queries_shape):
        _check_rank(self, queries_shape, 4, "queries [batch, heads, tokens, head_dim]")
        if queries_shape[1] != self.num_heads or queries_shape[2] not in (None, self.num_tokens):
            raise ValueError(
                f"RelativePositionBias '{self.name}' was set up for {self.num_heads} heads and "
                f"{self.num_tokens} tokens ({self.num_prefix_tokens} prefix + "
                f"{self.grid_size[0]}x{self.grid_size[1]} grid), got queries of shape "
                f"{tuple(queries_shape)}.")
        head_dim = queries_shape[-1]
        init = keras.initializers.RandomNormal(stddev=0.02)
        extra = int(self.num_prefix_tokens > 0)
        names = (["offset_embedding"] if self.kind == "1d"
                 else ["row_offset_embedding", "column_offset_embedding"])
        self.tables = [
            self.add_weight(name=name, shape=(2 * positions - 1 + extra, self.num_heads,
                                              head_dim), initializer=init)
            for name, (_, positions) in zip(names, self._axes(self.grid_size))
        ]

    def call(self, queries, grid=None):
        sides = self.grid_size if grid is None else grid_sides(grid)
        # Constant indices for the grid of the weights (or any static grid); computed in the
        # graph only where the grid is known when it runs.
        static = all(isinstance(side, int) for side in sides)
        xp = np if static else ops
        tables = [ops.convert_to_tensor(table) for table in self.tables]
        if not _is_static(sides, self.grid_size):
            tables = [resample.resize_offset_table(table, positions, self.num_prefix_tokens > 0,
                                                   self.interpolation, xp=ops)
                      for table, (_, positions) in zip(tables, self._axes(sides, xp))]
        tables = [ops.cast(table, queries.dtype) for table in tables]
        batch = ops.shape(queries)[0]
        tokens = self.num_prefix_tokens + sides[0] * sides[1]
        bias = None
        for table, index in zip(tables, self.offset_indices(sides, xp)):
            size = table.shape[0] if table.shape[0] is not None else ops.shape(table)[0]
            keys = ops.transpose(table, (1, 2, 0))  # [heads, dim, size]
            logits = ops.matmul(queries, keys)  # [batch, heads, tokens, size]: every offset
            # Pick, for query q and key k, the logit of their offset: one gather on the
            # flattened (query, offset) axis with indices q * size + index[q, k].
            logits = ops.reshape(logits, (batch, self.num_heads, tokens * size))
            flat = index + xp.arange(tokens, dtype="int32")[:, None] * size
            picked = ops.take(logits, flat, axis=2)
            bias = picked if bias is None else bias + picked
        return bias

    def compute_output_shape(self, queries_shape, grid_shape=None):
        tokens = self.num_tokens if grid_shape is None else queries_shape[2]
        return (queries_shape[0], self.num_heads, tokens, tokens)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_heads": self.num_heads, "num_prefix_tokens": self.num_prefix_tokens,
                "kind": self.kind, "interpolation": self.interpolation}


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head scaled dot-product self-attention, as in the paper's equations 5 to 8.

    Weights: `query`, `key`, `value` and `out` dense layers on the flattened `(D, D)` shape
    (the checkpoints store them as `(D, heads, D/heads)`; loading reshapes). The call fuses the
    query, key and value projections into one matmul.

    Args:
        num_heads: attention heads; must divide the input width.
        dropout: dropout on the attention weights.
        relative_position: None, or "1d" / "2d" to add relative position logits (appendix
            D.4) from a `RelativePositionBias` sub-layer named `relative_position`, or "mlp"
            for a `RelativePositionMlp` of `relative_mlp_dim` hidden units.
        grid_size: `(rows, columns)` of the patch grid; needed with `relative_position`.
        num_prefix_tokens: tokens before the grid; used with `relative_position`.
        interpolation: how the relative tables are resampled for another grid.
        qkv_bias: biases in the query, key and value projections (the original has them).
        rope, rope_temperature, rope_reference_grid, rope_grid_offset: rotary embeddings of
            the patches' queries and keys (None: none, the original), see `ViTConfig.rope`;
            with `grid_size` and `num_prefix_tokens`.
        inner_norm_epsilon: None, or the epsilon of a LayerNorm (`inner_norm`) of the heads'
            concatenated outputs before the output projection (`ViTConfig.attention_inner_norm`).
        attention_impl: "fused" (`keras.ops.dot_product_attention`, relative logits as its
            bias), "explicit" (logits, softmax, weighted sum) or "auto" (fused where that is
            faster: PyTorch, JAX's GPUs and TPUs); the weights, when returned, and dropout on
            them in training always take the explicit path. How the layer runs, not what it
            computes: left out of its config (`keras_vit.execution`).
        **kwargs: base `Layer` arguments.

    `call(x, training, return_attention_scores=False, grid=None)` returns `[batch, tokens, D]`,
    and with `return_attention_scores=True` also the weights `[batch, heads, tokens, tokens]`;
    `grid` (the patch grid of these tokens) tells relative and rotary positions the grid at
    call time.
    """

    def __init__(self, num_heads, dropout=0.0, relative_position=None, grid_size=None,
                 num_prefix_tokens=0, interpolation="bilinear", qkv_bias=True,
                 attention_impl="auto", rope=None, rope_temperature=None,
                 rope_reference_grid=None, rope_grid_offset=0.0, inner_norm_epsilon=None,
                 relative_mlp_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.qkv_bias = bool(qkv_bias)
        self.dropout = float(dropout)
        self.attention_impl = _attention_impl(attention_impl)
        if (relative_position is not None or rope is not None) and grid_size is None:
            raise ValueError("relative_position and rope need the grid_size (rows, columns) "
                             "of the patch grid.")
        if rope is not None and rope not in ROPE_TEMPERATURES:
            raise ValueError(f"Unknown rope {rope!r}; expected None or one of "
                             f"{tuple(ROPE_TEMPERATURES)}.")
        self.rope = rope
        self.rope_temperature = (None if rope is None else
                                 float(rope_temperature or ROPE_TEMPERATURES[rope]))
        self.rope_reference_grid = (None if rope_reference_grid is None
                                    else tuple(int(g) for g in rope_reference_grid))
        self.rope_grid_offset = float(rope_grid_offset)
        self.relative_mlp_dim = None if relative_mlp_dim is None else int(relative_mlp_dim)
        self.inner_norm_epsilon = (None if inner_norm_epsilon is None
                                   else float(inner_norm_epsilon))
        self.relative_position = relative_position
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = resample.check_interpolation(interpolation)

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        hidden = input_shape[-1]
        if hidden % self.num_heads:
            raise ValueError(
                f"Hidden size {hidden} is not divisible by num_heads={self.num_heads}; "
                f"choose num_heads among the divisors of {hidden}."
            )
        self.head_dim = hidden // self.num_heads
        kernel_init = _xavier_uniform_flat(hidden, hidden)

        def dense(name, use_bias=True):
            layer = keras.layers.Dense(hidden, kernel_initializer=kernel_init, name=name,
                                       use_bias=use_bias, dtype=self.dtype_policy)
            layer.build(input_shape)
            return layer

        self.query, self.key, self.value = (
            dense(n, self.qkv_bias) for n in ("query", "key", "value"))
        self.out = dense("out")
        self.inner_norm = None
        if self.inner_norm_epsilon is not None:
            self.inner_norm = LayerNorm(self.inner_norm_epsilon, name="inner_norm",
                                        dtype=self.dtype_policy)
            self.inner_norm.build(input_shape)
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.rope_frequencies = None
        if self.rope == "mixed":
            self.rope_frequencies = MixedRopeFrequencies(
                self.num_heads, self.head_dim, self.rope_temperature, name="rope")
            self.rope_frequencies.build()
        self.relative = None
        if self.relative_position == "mlp":
            self.relative = RelativePositionMlp(
                self.grid_size, self.num_heads, self.num_prefix_tokens,
                hidden_dim=self.relative_mlp_dim, name="relative_position",
                dtype=self.dtype_policy)
            self.relative.build()
        elif self.relative_position is not None:
            self.relative = RelativePositionBias(
                self.grid_size, self.num_heads, self.num_prefix_tokens,
                kind=self.relative_position, interpolation=self.interpolation,
                name="relative_position", dtype=self.dtype_policy)
            self.relative.build((input_shape[0], self.num_heads, input_shape[1], self.head_dim))

    def call(self, x, training=False, return_attention_scores=False, grid=None):
        batch, tokens, hidden = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        heads, head_dim = self.num_heads, self.head_dim
        # One (D, 3D) matmul on 2-D rows instead of three, with the 1/sqrt(head_dim) scale of
        # the queries folded into their kernel and bias: fewer passes over the activations.
        scale = 1.0 / math.sqrt(head_dim)
        kernel = ops.concatenate(
            [self.query.kernel * scale, self.key.kernel, self.value.kernel], axis=1)
        qkv = ops.matmul(ops.reshape(x, (-1, hidden)), ops.cast(kernel, x.dtype))
        if self.qkv_bias:
            bias = ops.concatenate([self.query.bias * scale, self.key.bias, self.value.bias],
                                   axis=0)
            qkv = ops.add(qkv, ops.cast(bias, x.dtype))  # ops.add: a BiasAdd that fuses on TF
        qkv = ops.reshape(qkv, (batch, tokens, 3, heads, head_dim))
        if self.rope is not None:
            qkv = self._rotated(qkv, grid)
        if _fused(self.attention_impl, self.dropout, training, return_attention_scores):
            attended = self._fused_attention(qkv, grid, training)
            return ops.reshape(self._project(attended), (batch, tokens, hidden))
        qkv = ops.transpose(qkv, (2, 0, 3, 1, 4))  # [3, batch, heads, tokens, head_dim]
        # Unstacked, not indexed: each slice's gradient would be a zero-filled copy of all of
        # qkv, summed (S/16 trains 1.17x faster without XLA this way; the same with XLA).
        query, key, value = ops.unstack(qkv, 3, axis=0)
        logits = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2)))
        if self.relative is not None:  # the (scaled) queries against the offset embeddings
            logits = logits + self.relative(query, grid=grid)
        # Softmax in the compute dtype, as the original. TensorFlow's CPU kernel accumulates
        # bfloat16 in float32: its output equals a float32 softmax rounded to bfloat16.
        weights = ops.softmax(logits, axis=-1)
        attended = ops.matmul(self.attention_dropout(weights, training=training), value)
        attended = ops.reshape(ops.transpose(attended, (0, 2, 1, 3)), (-1, hidden))
        output = ops.reshape(self._project(attended), (batch, tokens, hidden))
        if return_attention_scores:
            return output, weights
        return output

    def _project(self, attended):
        """The heads' concatenated outputs `[batch * tokens, D]` through the output
        projection (after `inner_norm`, if any)."""
        if self.inner_norm is not None:
            attended = self.inner_norm(attended)
        return self.out(attended)

    def _rotated(self, qkv, grid):
        """`qkv` `[batch, tokens, 3, heads, head_dim]` with the patches' queries and keys
        rotated by their rows and columns; the prefix tokens keep theirs (angle 0)."""
        sides = self.grid_size if grid is None else grid_sides(grid)
        if self.rope_frequencies is not None:  # learned: [patches, heads, head_dim / 2]
            xp = ops
            angles = self.rope_frequencies(_patch_coordinates(sides))
        else:  # fixed: [patches, 1, head_dim / 2], constants where the grid is known
            xp = np if all(isinstance(side, int) for side in sides) else ops
            angles = rope_angles(self.rope, sides, self.head_dim, self.rope_temperature,
                                 self.rope_reference_grid, self.rope_grid_offset, xp=xp)
            angles = angles[:, None, :]
        angles = xp.pad(angles, ((self.num_prefix_tokens, 0), (0, 0), (0, 0)))
        cos = ops.cast(xp.cos(angles), qkv.dtype)  # [tokens, heads or 1, head_dim / 2]
        sin = ops.cast(xp.sin(angles), qkv.dtype)
        query, key, value = ops.unstack(qkv, 3, axis=2)
        return ops.stack([rotate(query, cos, sin), rotate(key, cos, sin), value], axis=2)

    def _fused_attention(self, qkv, grid, training):
        """`[batch * tokens, D]` attended values of `qkv` `[batch, tokens, 3, heads,
        head_dim]` (queries scaled) by `keras.ops.dot_product_attention`, which never returns
        the score matrix (and on GPUs and TPUs, on JAX, never forms it whole)."""
        query, key, value = ops.unstack(qkv, 3, axis=2)  # [batch, tokens, heads, head_dim]
        bias = None
        if self.relative is not None:  # the relative logits, [batch, heads, tokens, tokens]
            bias = self.relative(ops.transpose(query, (0, 2, 1, 3)), grid=grid)
        tokens = query.shape[1]
        if bias is None and training and tokens and tokens % 2 and odd_lengths_refused():
            attended = _padded_to_even(query, key, value)
        else:  # with a bias, XLA's kernel: Keras' TPU kernel (splash attention) takes none
            attended = ops.dot_product_attention(
                query, key, value, bias=bias, scale=1.0,
                flash_attention=False if bias is not None else None)
        return ops.reshape(attended, (-1, qkv.shape[-1] * self.num_heads))

    def compute_output_spec(self, x, training=False, return_attention_scores=False, grid=None):
        return _attention_output_spec(self, x, return_attention_scores)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "dropout": self.dropout,
                "relative_position": self.relative_position, "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens,
                "interpolation": self.interpolation, "qkv_bias": self.qkv_bias,
                "rope": self.rope,
                "rope_temperature": self.rope_temperature,
                "rope_reference_grid": self.rope_reference_grid,
                "rope_grid_offset": self.rope_grid_offset,
                "inner_norm_epsilon": self.inner_norm_epsilon,
                "relative_mlp_dim": self.relative_mlp_dim}


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """Multiplies its input by a learned per-channel `scale` that starts at `init_value`
    (Touvron et al., "Going deeper with Image Transformers", 2021; timm's `LayerScale`)."""

    def __init__(self, init_value, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale", shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.init_value))

    def call(self, x):
        return x * ops.cast(self.scale, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}


def _activation(activation, approximate_gelu=None):
    """The MLP activation's name, also from `approximate_gelu` (a bool, what layers saved
    before `activation` existed have instead)."""
    if approximate_gelu is not None:
        implied = "gelu_tanh" if approximate_gelu else "gelu"
        if activation not in ("gelu_tanh", implied):  # "gelu_tanh": activation's default
            raise ValueError(f"approximate_gelu={approximate_gelu} and activation="
                             f"{activation!r} disagree; give activation alone.")
        activation = implied
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}.")
    return activation


class _SeedStream:
    """Seeds for a random layer from one seed tensor and a stream number, drawn in turn with no
    state to update: the k-th draw is `seed + (stream, k)` (`EncoderBlock._rematerialized`)."""

    def __init__(self, seed, stream):
        self.seed, self.stream, self.drawn = seed, stream, 0

    def next(self, ordered=True):
        del ordered
        self.drawn += 1
        return ops.add(self.seed, ops.convert_to_tensor([self.stream, self.drawn],
                                                        dtype=self.seed.dtype))


def _attention_impl(value):
    if value not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {value!r}.")
    return value


def _fused(attention_impl, dropout, training, return_attention_scores):
    """Whether attention runs fused (`keras.ops.dot_product_attention`): as `attention_impl`
    says, "auto" meaning where a fused kernel is faster (`fused_by_default`); never where the
    weights are returned or dropped out."""
    if return_attention_scores or (training and dropout):
        return False
    if attention_impl == "auto":
        return fused_by_default()
    return attention_impl == "fused"


@functools.cache
def fused_by_default():
    """What attention_impl="auto" means in this process: fused on PyTorch (its
    `scaled_dot_product_attention` beat the explicit ops on CPU too: B/16 inference 4.73 against
    4.42 images/s, 2-core AMD EPYC) and on JAX's GPUs and TPUs (cuDNN flash and Pallas splash
    attention), explicit on JAX's CPU (XLA's reference attention: 10.62 against 11.14 images/s,
    same CPU) and on TensorFlow (no fused kernel; Keras' einsum form of it is slower)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() != "cpu"
    return backend == "torch"


@functools.cache
def odd_lengths_refused():
    """Whether the fused kernel cannot be trained on an odd number of tokens: cuDNN's flash
    attention, Keras' kernel on JAX's GPUs. JAX's gradient rule for it refuses odd lengths
    whenever there is a bias, and counts an absent one as present (jax 0.11,
    `_dot_product_attention_fwd_rule`), so ViT's 197 tokens fall back to XLA's attention, or,
    under remat in `lax.scan`, where Keras' fallback cannot catch the refusal, end the step."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    return jax.default_backend() == "gpu"


def _padded_to_even(query, key, value):
    """Fused attention over one more (zero) token that no query attends to, cut off again: an
    even length, which cuDNN's flash attention trains, for the price of one token."""
    tokens = query.shape[1]
    padded = [ops.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0))) for x in (query, key, value)]
    keep = np.ones((1, 1, tokens + 1, tokens + 1), bool)
    keep[..., tokens] = False  # no query sees the padding key
    attended = ops.dot_product_attention(*padded, mask=keep, scale=1.0)
    return attended[:, :tokens]


@keras.saving.register_keras_serializable(package="keras_vit")
class MlpBlock(keras.layers.Layer):
    """Dense(mlp_dim) -> GELU -> Dropout -> Dense(D) -> Dropout (weights `Dense_0`, `Dense_1`);
    with SwiGLU, SiLU(Gate_0(x)) * Dense_0(x) in place of GELU(Dense_0(x)).

    Args:
        mlp_dim: hidden size of the MLP.
        dropout: dropout rate after each dense layer.
        activation: "gelu_tanh" (the original's tanh-approximate GELU), "gelu" (exact),
            "quick_gelu" (OpenAI CLIP's x * sigmoid(1.702 x)) or "swiglu" (a gated SiLU with a
            second input projection, `Gate_0`, as timm's `SwiGLU`: `fc1_g`, `fc1_x`).
        inner_norm_epsilon: None, or the epsilon of a LayerNorm (`inner_norm`) of the hidden
            units before `Dense_1` (`ViTConfig.mlp_inner_norm`).
        approximate_gelu: what layers saved before `activation` have instead: True for
            "gelu_tanh", False for "gelu".
        **kwargs: base `Layer` arguments.
    """

    def __init__(self, mlp_dim, dropout=0.0, activation="gelu_tanh", approximate_gelu=None,
                 inner_norm_epsilon=None, **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = int(mlp_dim)
        self.inner_norm_epsilon = (None if inner_norm_epsilon is None
                                   else float(inner_norm_epsilon))
        self.dropout = float(dropout)
        self.activation = _activation(activation, approximate_gelu)

    def build(self, input_shape):
        hidden = input_shape[-1]
        bias_init = keras.initializers.RandomNormal(stddev=1e-6)
        self.dense_0 = keras.layers.Dense(
            self.mlp_dim, kernel_initializer="glorot_uniform", bias_initializer=bias_init,
            name="Dense_0", dtype=self.dtype_policy)
        self.dense_1 = keras.layers.Dense(
            hidden, kernel_initializer="glorot_uniform", bias_initializer=bias_init,
            name="Dense_1", dtype=self.dtype_policy)
        self.dense_0.build(input_shape)
        self.gate = None
        if self.activation == "swiglu":  # apart from Dense_0, so that both shard alike
            self.gate = keras.layers.Dense(
                self.mlp_dim, kernel_initializer="glorot_uniform", bias_initializer=bias_init,
                name="Gate_0", dtype=self.dtype_policy)
            self.gate.build(input_shape)
        hidden_shape = tuple(input_shape[:-1]) + (self.mlp_dim,)
        self.dense_1.build(hidden_shape)
        self.inner_norm = None
        if self.inner_norm_epsilon is not None:
            self.inner_norm = LayerNorm(self.inner_norm_epsilon, name="inner_norm",
                                        dtype=self.dtype_policy)
            self.inner_norm.build(hidden_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def call(self, x, training=False):
        shape = ops.shape(x)
        x = ops.reshape(x, (-1, x.shape[-1]))  # 2-D matmuls are the fastest on CPU
        if self.gate is not None:
            # SiLU as x * sigmoid(x): TensorFlow's silu op has a custom gradient that a
            # SavedModel cannot hold.
            gate = self.gate(x)
            x = gate * ops.sigmoid(gate) * self.dense_0(x)
        else:
            x = self._gelu(self.dense_0(x), training)
        x = self.dropout_layer(x, training=training)
        if self.inner_norm is not None:
            x = self.inner_norm(x)
        x = self.dropout_layer(self.dense_1(x), training=training)
        return ops.reshape(x, shape)

    def _gelu(self, x, training):
        if training and self.compute_dtype != "float32":
            # Training under a 16-bit policy: GELU in float32, which is also the more accurate.
            # TensorFlow's CPU kernels run its element-wise ops and their gradients faster in
            # float32 than in bfloat16 (ViT-S/16's bfloat16 training step: 1.09x keras-hub's
            # with it, 0.99x without; benchmarks/train_step.py). Not in inference, where
            # TensorFlow fuses the bfloat16 GELU into the matmul before it and a cast between
            # them would prevent that.
            return ops.cast(self._activate(ops.cast(x, "float32")), self.compute_dtype)
        return self._activate(x)

    def _activate(self, x):
        if self.activation == "quick_gelu":
            return x * ops.sigmoid(1.702 * x)
        return ops.gelu(x, approximate=self.activation == "gelu_tanh")

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {**super().get_config(), "mlp_dim": self.mlp_dim, "dropout": self.dropout,
                  "activation": self.activation}
        if self.inner_norm_epsilon is not None:  # files of other models unchanged
            config["inner_norm_epsilon"] = self.inner_norm_epsilon
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class EncoderBlock(keras.layers.Layer):
    """One pre-norm transformer block (paper equations 2 and 3):

        x = x + DropPath(Dropout(MSA(LN(x))))
        x = x + DropPath(MLP(LN(x)))

    Sub-layers are named as in the checkpoints: `LayerNorm_0`, `MultiHeadDotProductAttention_1`,
    `LayerNorm_2`, `MlpBlock_3`.

    Args:
        num_heads: attention heads.
        mlp_dim: hidden size of the MLP.
        dropout: dropout after the attention and inside the MLP.
        attention_dropout: dropout on the attention weights.
        drop_path_rate: stochastic-depth rate of this block.
        activation, approximate_gelu: the MLP's activation, see `MlpBlock`.
        layer_norm_epsilon: of the two LayerNorms (the original's 1e-6).
        relative_position, grid_size, num_prefix_tokens, interpolation, relative_mlp_dim:
            relative position logits in the attention, see `MultiHeadSelfAttention` (None:
            none, the original).
        qkv_bias: biases in the query, key and value projections.
        rope, rope_temperature, rope_reference_grid, rope_grid_offset: rotary embeddings in
            the attention, see `MultiHeadSelfAttention` (None: none, the original).
        mlp_inner_norm, attention_inner_norm: LayerNorms inside the MLP and the attention
            (`ViTConfig.mlp_inner_norm`, `attention_inner_norm`).
        residual_post_norm: True to norm each branch's output (x + LN(branch(x))) instead of
            its input (`ViTConfig.residual_post_norm`).
        attention_impl: how the attention is computed, see `MultiHeadSelfAttention`.
        remat: True to keep, in training, only the block's input for the backward pass,
            which computes the block again (see `_rematerialized`). This and `attention_impl`
            are how the block runs, left out of its config (`keras_vit.execution`).
        layer_scale_init: None (the original), or LayerScale's initial value: each residual
            branch is multiplied by a learned per-channel scale (`layer_scale_0` after the
            attention, `layer_scale_1` after the MLP).
        **kwargs: base `Layer` arguments.

    `call(x, training, return_attention_scores=False, grid=None)`: with
    `return_attention_scores=True` returns `(x, attention_weights)` with weights
    `[batch, heads, tokens, tokens]`. `grid`, the patch grid `[batch, rows, columns, D]` of the
    tokens, gives relative positions (and Axial-ViT) the grid at call time.
    """

    def __init__(self, num_heads, mlp_dim, dropout=0.0, attention_dropout=0.0,
                 drop_path_rate=0.0, activation="gelu_tanh", relative_position=None,
                 grid_size=None, num_prefix_tokens=0, layer_norm_epsilon=LAYER_NORM_EPSILON,
                 interpolation="bilinear", qkv_bias=True, layer_scale_init=None,
                 approximate_gelu=None, attention_impl="auto", remat=False, rope=None,
                 rope_temperature=None, rope_reference_grid=None, rope_grid_offset=0.0,
                 mlp_inner_norm=False, attention_inner_norm=False, relative_mlp_dim=None,
                 residual_post_norm=False, **kwargs):
        super().__init__(**kwargs)
        self.residual_post_norm = bool(residual_post_norm)
        self.relative_mlp_dim = None if relative_mlp_dim is None else int(relative_mlp_dim)
        self.rope_options = {"rope": rope, "rope_temperature": rope_temperature,
                             "rope_reference_grid": rope_reference_grid,
                             "rope_grid_offset": rope_grid_offset}
        self.mlp_inner_norm = bool(mlp_inner_norm)
        self.attention_inner_norm = bool(attention_inner_norm)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.attention_impl = _attention_impl(attention_impl)
        self.remat = bool(remat)
        self.dropout = float(dropout)
        self.attention_dropout = float(attention_dropout)
        self.drop_path_rate = float(drop_path_rate)
        self.activation = _activation(activation, approximate_gelu)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.relative_position = relative_position
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = resample.check_interpolation(interpolation)
        self.qkv_bias = bool(qkv_bias)
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        # While attention_model() runs the model: a function that takes each call's weights.
        self.attention_recorder = None

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        policy = self.dtype_policy
        self.norm_0 = LayerNorm(self.layer_norm_epsilon, name="LayerNorm_0", dtype=policy)
        self.attention = MultiHeadSelfAttention(
            self.num_heads, dropout=self.attention_dropout,
            relative_position=self.relative_position, grid_size=self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens, interpolation=self.interpolation,
            qkv_bias=self.qkv_bias, attention_impl=self.attention_impl, **self.rope_options,
            inner_norm_epsilon=self.layer_norm_epsilon if self.attention_inner_norm else None,
            relative_mlp_dim=self.relative_mlp_dim,
            name="MultiHeadDotProductAttention_1", dtype=policy)
        self.norm_2 = LayerNorm(self.layer_norm_epsilon, name="LayerNorm_2", dtype=policy)
        self.mlp = MlpBlock(self.mlp_dim, dropout=self.dropout, activation=self.activation,
                            inner_norm_epsilon=(self.layer_norm_epsilon if self.mlp_inner_norm
                                                else None),
                            name="MlpBlock_3", dtype=policy)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=policy)
        self.drop_path = DropPath(self.drop_path_rate, dtype=policy)
        self.layer_scales = [None, None]
        if self.layer_scale_init is not None:
            self.layer_scales = [LayerScale(self.layer_scale_init, name=f"layer_scale_{index}",
                                            dtype=policy) for index in range(2)]
            for layer in self.layer_scales:
                layer.build(input_shape)
        for layer in (self.norm_0, self.norm_2, self.mlp):
            layer.build(input_shape)
        self.attention.build(self.attention_input_shape(input_shape))

    def attention_input_shape(self, input_shape):
        """The shape the attention sees (the token sequence here; rows or columns in axial)."""
        return input_shape

    def attend(self, x, training, return_attention_scores, grid):
        """Self-attention over the (normalised) tokens `x` of the patch grid `grid`."""
        return self.attention(x, training=training,
                              return_attention_scores=return_attention_scores, grid=grid)

    def call(self, x, training=False, return_attention_scores=False, grid=None):
        # Remat serves a backward pass, so only training: an inference graph (an export's
        # SavedModel or TFLite file) must not carry its custom gradient.
        if (self.remat and training and not return_attention_scores
                and self.attention_recorder is None):
            return self._rematerialized(x, training, grid)
        return self._forward(x, training, return_attention_scores, grid)

    def _rematerialized(self, x, training, grid):
        """The block through `keras.remat`, so that the backward pass computes its activations
        again instead of keeping them. Keras' own `RematScope` cannot do this here: the block's
        random layers would update their seed generators inside the recomputed function (on
        JAX a tracer that escapes it, on TensorFlow other masks the second time). So in
        training one seed is drawn outside, and each random layer draws from it without state,
        the same in the forward pass and in its recomputation."""
        random = [layer for layer in (self.attention.attention_dropout, self.dropout_layer,
                                      self.mlp.dropout_layer, self.drop_path)
                  if training and getattr(layer, "seed_generator", None) is not None]
        seed = random[0].seed_generator.next() if random else None

        def forward(tokens):
            for stream, layer in enumerate(random, 1):  # (an attribute of the generator, not
                layer.seed_generator.next = _SeedStream(seed, stream).next  # of the layer)
            try:
                return self._forward(tokens, training, False, grid)
            finally:
                for layer in random:
                    del layer.seed_generator.next

        return keras.remat(forward)(x)

    def _forward(self, x, training, return_attention_scores, grid):
        record = self.attention_recorder is not None
        post_norm = self.residual_post_norm  # x + LN(branch(x)), not x + branch(LN(x))
        attended = self.attend(x if post_norm else self.norm_0(x), training,
                               return_attention_scores or record, grid)
        if return_attention_scores or record:
            attended, weights = attended
            if record:
                self.attention_recorder(weights)
        attended = self.dropout_layer(attended, training=training)
        if post_norm:
            attended = self.norm_0(attended)
        x = x + self.drop_path(self._scaled(0, attended), training=training)
        if post_norm:
            mlp = self.norm_2(self.mlp(x, training=training))
        else:
            mlp = self.mlp(self.norm_2(x), training=training)
        x = x + self.drop_path(self._scaled(1, mlp), training=training)
        if return_attention_scores:
            return x, weights
        return x

    def _scaled(self, branch, x):
        layer = self.layer_scales[branch]
        return x if layer is None else layer(x)

    def compute_output_spec(self, x, training=False, return_attention_scores=False, grid=None):
        return _attention_output_spec(self, x, return_attention_scores)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "dropout": self.dropout, "attention_dropout": self.attention_dropout,
                "drop_path_rate": self.drop_path_rate, "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "relative_position": self.relative_position, "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens,
                "interpolation": self.interpolation, "qkv_bias": self.qkv_bias,
                "layer_scale_init": self.layer_scale_init, **self.rope_options,
                "mlp_inner_norm": self.mlp_inner_norm,
                "attention_inner_norm": self.attention_inner_norm,
                "relative_mlp_dim": self.relative_mlp_dim,
                "residual_post_norm": self.residual_post_norm}


AXES = ("row", "column")


@keras.saving.register_keras_serializable(package="keras_vit")
class AxialEncoderBlock(EncoderBlock):
    """An Axial-ViT block (paper appendix D.6): an `EncoderBlock` whose self-attention runs
    along one axis of the patch grid, within each row (`axis="row"`) or within each column
    (`axis="column"`), followed by its own MLP. Axial-ViT replaces every ViT block by a row
    block and a column block.

    Args:
        axis: "row" or "column".
        grid_size: `(rows, columns)` of the patch grid; the tokens are that grid, flattened
            row major, with no class token.
        **kwargs: the arguments of `EncoderBlock` (relative positions excepted).

    With `return_attention_scores=True` the weights are returned as the equivalent full
    `[batch, heads, tokens, tokens]` matrix (zero between tokens of different rows, resp.
    columns), so attention rollout and attention distance apply unchanged.
    """

    def __init__(self, axis, grid_size, **kwargs):
        if kwargs.get("relative_position") is not None:
            raise ValueError("AxialEncoderBlock does not take relative_position.")
        kwargs.pop("num_prefix_tokens", None)
        super().__init__(grid_size=grid_size, num_prefix_tokens=0, **kwargs)
        if axis not in AXES:
            raise ValueError(f"axis must be one of {AXES}, got {axis!r}.")
        self.axis = axis

    def attention_input_shape(self, input_shape):
        rows, columns = self.grid_size
        if input_shape[1] not in (None, rows * columns):
            raise ValueError(
                f"AxialEncoderBlock '{self.name}' was set up for a {rows}x{columns} grid "
                f"({rows * columns} tokens, no class token), got {input_shape[1]} tokens.")
        lines, length = (rows, columns) if self.axis == "row" else (columns, rows)
        batch = None if input_shape[0] is None else input_shape[0] * lines
        return (batch, length, input_shape[-1])

    def attend(self, x, training, return_attention_scores, grid):
        rows, columns = self.grid_size if grid is None else grid_sides(grid)
        batch, hidden = ops.shape(x)[0], x.shape[-1]
        cells = ops.reshape(x, (batch, rows, columns, hidden))
        if self.axis == "column":
            cells = ops.transpose(cells, (0, 2, 1, 3))
        lines, length = (rows, columns) if self.axis == "row" else (columns, rows)
        attended = self.attention(ops.reshape(cells, (-1, length, hidden)), training=training,
                                  return_attention_scores=return_attention_scores)
        if return_attention_scores:
            attended, weights = attended
        attended = ops.reshape(attended, (batch, lines, length, hidden))
        if self.axis == "column":
            attended = ops.transpose(attended, (0, 2, 1, 3))
        attended = ops.reshape(attended, (batch, rows * columns, hidden))
        if not return_attention_scores:
            return attended
        return attended, self._full_weights(weights, batch, (rows, columns))

    def _full_weights(self, weights, batch, sides):
        """`[batch * lines, heads, length, length]` as `[batch, heads, tokens, tokens]`."""
        rows, columns = sides
        lines, length = (rows, columns) if self.axis == "row" else (columns, rows)
        weights = ops.reshape(weights, (batch, lines, self.num_heads, length, length))
        same_line = ops.eye(lines, dtype=weights.dtype)
        if self.axis == "row":  # [b, row, h, col, col'] x [row, row'] -> [b, h, row, col, row', col']
            full = ops.einsum("brhcd,rs->bhrcsd", weights, same_line)
        else:  # [b, col, h, row, row'] x [col, col'] -> [b, h, row, col, row', col']
            full = ops.einsum("bchrs,cd->bhrcsd", weights, same_line)
        tokens = rows * columns
        return ops.reshape(full, (batch, self.num_heads, tokens, tokens))

    def get_config(self):
        config = super().get_config()
        for key in ("relative_position", "num_prefix_tokens"):
            config.pop(key)
        return {**config, "axis": self.axis}


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPooling(keras.layers.Layer):
    """Multihead attention pooling, "map" (Zhai et al., "Scaling Vision Transformers", 2022;
    big_vision's `MAPHead`, timm's `AttentionPoolLatent`): a learned query, `probe`, attends to
    the patch tokens; a LayerNorm and an MLP follow, with a residual connection.

    Args:
        num_heads: attention heads.
        mlp_dim: hidden size of the MLP.
        num_prefix_tokens: tokens before the patches (class, registers), not attended to.
        layer_norm_epsilon, activation, attention_impl: as the encoder blocks'.

    `[batch, tokens, D]` -> `[batch, D]`. Weights `probe` `(1, 1, D)`, `query`, `key`, `value`,
    `out` (D, D), `LayerNorm_0`, `MlpBlock_0`.
    """

    def __init__(self, num_heads, mlp_dim, num_prefix_tokens=0,
                 layer_norm_epsilon=LAYER_NORM_EPSILON, activation="gelu_tanh",
                 attention_impl="auto", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.attention_impl = _attention_impl(attention_impl)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation = _activation(activation)

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        hidden = input_shape[-1]
        self.head_dim = hidden // self.num_heads
        policy = self.dtype_policy
        self.probe = self.add_weight(name="probe", shape=(1, 1, hidden),
                                     initializer=keras.initializers.GlorotUniform())
        self.query, self.key, self.value, self.out = (
            keras.layers.Dense(hidden, kernel_initializer=_xavier_uniform_flat(hidden, hidden),
                               name=name, dtype=policy)
            for name in ("query", "key", "value", "out"))
        for layer in (self.query, self.key, self.value, self.out):
            layer.build(input_shape)
        self.norm = LayerNorm(self.layer_norm_epsilon, name="LayerNorm_0", dtype=policy)
        self.mlp = MlpBlock(self.mlp_dim, activation=self.activation, name="MlpBlock_0",
                            dtype=policy)
        self.norm.build((None, 1, hidden))
        self.mlp.build((None, 1, hidden))

    def call(self, tokens):
        tokens = tokens[:, self.num_prefix_tokens:]
        batch, hidden = ops.shape(tokens)[0], tokens.shape[-1]
        heads, head_dim = self.num_heads, self.head_dim

        def split_heads(x):  # [b, n, D] -> [b, n, heads, head_dim]
            return ops.reshape(x, (ops.shape(x)[0], -1, heads, head_dim))

        probe = ops.cast(self.probe, tokens.dtype)
        if _fused(self.attention_impl, 0.0, False, False):  # a query per image, as keys
            probe = ops.broadcast_to(probe, (batch, 1, hidden))
        query = split_heads(self.query(probe))
        query = query * ops.cast(1.0 / math.sqrt(head_dim), query.dtype)
        keys, values = split_heads(self.key(tokens)), split_heads(self.value(tokens))
        if _fused(self.attention_impl, 0.0, False, False):
            pooled = ops.dot_product_attention(query, keys, values, scale=1.0)
        else:
            query, keys, values = (ops.transpose(x, (0, 2, 1, 3)) for x in (query, keys, values))
            weights = ops.softmax(ops.matmul(query, ops.transpose(keys, (0, 1, 3, 2))), axis=-1)
            pooled = ops.transpose(ops.matmul(weights, values), (0, 2, 1, 3))
        pooled = self.out(ops.reshape(pooled, (batch, 1, hidden)))  # pooled: [b, 1, heads, d]
        pooled = pooled + self.mlp(self.norm(pooled))
        return pooled[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "num_prefix_tokens": self.num_prefix_tokens,
                "layer_norm_epsilon": self.layer_norm_epsilon, "activation": self.activation}


POOLINGS = tuple(kind for kind in CLASSIFIERS if kind != "map")


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Reduces `[batch, tokens, D]` to `[batch, D]`: one token ("token": the class token, or
    the token at `token_index`, 1 for DeiT's distillation token), the mean of the patch
    tokens ("gap"), or both side by side, `[batch, 2 D]` ("token_gap", DINOv2's).

    Args:
        classifier: "token", "gap" or "token_gap".
        num_prefix_tokens: tokens before the patches (register tokens), left out of the mean.
        token_index: the token "token" reads.
    """

    def __init__(self, classifier="token", num_prefix_tokens=0, token_index=0, **kwargs):
        super().__init__(**kwargs)
        if classifier not in POOLINGS:
            raise ValueError(f"classifier must be {' or '.join(map(repr, POOLINGS))}, got "
                             f"{classifier!r} (attention pooling is AttentionPooling).")
        self.classifier = classifier
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.token_index = int(token_index)

    def call(self, tokens):
        if self.classifier == "token":
            return tokens[:, self.token_index]
        patches = tokens
        if self.num_prefix_tokens:  # registers (no slice otherwise: the same graph as before)
            patches = tokens[:, self.num_prefix_tokens:]
        mean = ops.mean(patches, axis=1)
        if self.classifier == "token_gap":
            return ops.concatenate([tokens[:, self.token_index], mean], axis=-1)
        return mean

    def compute_output_shape(self, input_shape):
        width = input_shape[-1] * (2 if self.classifier == "token_gap" else 1)
        return (input_shape[0], width)

    def get_config(self):
        config = {**super().get_config(), "classifier": self.classifier,
                  "num_prefix_tokens": self.num_prefix_tokens}
        if self.token_index:  # files of other models unchanged
            config["token_index"] = self.token_index
        return config

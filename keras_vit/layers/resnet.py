"""The ResNet-v2 ("BiT") front of the hybrid models: weight-standardised convolutions,
GroupNorm(32 groups), a stem and bottleneck stages. Names follow the original checkpoints
(`conv_root`, `gn_root`, `block{s}/unit{u}/conv1`, ...)."""

import keras
from keras import ops

GROUP_NORM_EPSILON = 1e-6
WEIGHT_STANDARDIZATION_EPSILON = 1e-5
# How the ResNet normalises (`ViTConfig.resnet_numerics`) -> (the weight standardisation's
# epsilon and whether it is added to the variance, not the standard deviation; GroupNorm's
# epsilon): the original code's, or timm's ResNetV2 (StdConv2dSame(eps=1e-8), GroupNormAct).
NUMERICS = {"original": (WEIGHT_STANDARDIZATION_EPSILON, False, GROUP_NORM_EPSILON),
            "timm": (1e-8, True, 1e-5)}


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """A `Conv2D` whose kernel is standardised per output channel at every call:
    `(w - mean) / (std + 1e-5)` over the spatial and input axes (no bias by default); with
    `numerics="timm"`, `(w - mean) / sqrt(var + 1e-8)` as timm's `StdConv2dSame`.

    Takes the arguments of `keras.layers.Conv2D`; padding defaults to "same".
    """

    def __init__(self, filters, kernel_size, strides=1, padding="same", use_bias=False,
                 numerics="original", **kwargs):
        super().__init__(filters, kernel_size, strides=strides, padding=padding,
                         use_bias=use_bias, **kwargs)
        self.numerics = _checked_numerics(numerics)

    def convolution_op(self, inputs, kernel):
        # Standardise in at least float32, also when the policy computes in bfloat16.
        input_dtype = keras.backend.standardize_dtype(inputs.dtype)
        precise = "float64" if input_dtype == "float64" else "float32"
        kernel = ops.cast(kernel, precise)
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        epsilon, of_variance, _ = NUMERICS[self.numerics]
        if of_variance:  # timm's: batch_norm's (w - mean) * rsqrt(var + eps)
            variance = ops.var(kernel, axis=(0, 1, 2), keepdims=True)
            kernel = (kernel - mean) * ops.rsqrt(variance + epsilon)
        else:  # the original's, a division (the trained runs' numbers to the last bit)
            kernel = (kernel - mean) / (ops.std(kernel, axis=(0, 1, 2), keepdims=True) + epsilon)
        kernel = ops.cast(kernel, inputs.dtype)
        return super().convolution_op(inputs, kernel)

    def get_config(self):
        config = super().get_config()
        if self.numerics != "original":  # files of the original's numerics unchanged
            config["numerics"] = self.numerics
        return config


def _checked_numerics(numerics):
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {tuple(NUMERICS)}, got {numerics!r}.")
    return numerics


def _strided_shape(input_shape, stride, channels):
    """Output shape of a "same"-padded op with `stride` on NHWC input: ceil(side / stride)."""
    batch, height, width, _ = input_shape
    shrink = [None if side is None else -(-side // stride) for side in (height, width)]
    return (batch, *shrink, channels)


@keras.saving.register_keras_serializable(package="keras_vit")
class GroupNorm(keras.layers.GroupNormalization):
    """`keras.layers.GroupNormalization` over channels-last maps (the same arguments, weights
    and outputs) that infers without a 5-D tensor: each channel's statistics over the spatial
    axes, then averaged within its group on the small [N, 1, 1, C] tensor.

    Keras' layer reshapes the map to [N, H, W, groups, C / groups] and reduces over three of
    its axes, which LiteRT (XNNPack) runs slowly: this way the quickstart model's float32
    TFLite file answers one image 1.2x and batches 1.55x as fast, and R26+S/32's at 224px 1.27x
    and 1.3x (benchmarks/export_accuracy.py, export_latency.py). Groups hold equally many
    channels, so the mean of the channel means is the group mean. Statistics are in float32
    also under a 16-bit policy, and the variance is two-pass, as in Keras.
    """

    def call(self, inputs, training=None):
        if training:
            # XLA trains the quickstart model 2 to 5% faster with Keras' form
            # (benchmarks/train_step.py --quickstart); both compute the same values.
            return super().call(inputs)
        x = ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        spatial = tuple(range(1, len(x.shape) - 1))
        centred = x - self._group_average(ops.mean(x, axis=spatial, keepdims=True))
        variance = self._group_average(
            ops.mean(ops.square(centred), axis=spatial, keepdims=True))
        scale = ops.rsqrt(variance + self.epsilon)
        if self.scale:
            scale = scale * ops.cast(self.gamma, x.dtype)
        outputs = centred * scale
        if self.center:
            outputs = outputs + ops.cast(self.beta, x.dtype)
        return ops.cast(outputs, self.compute_dtype)

    def _group_average(self, channel_values):
        """[N, 1, .., 1, C] per-channel values -> each channel holds its group's average."""
        shape = channel_values.shape
        per_group = shape[-1] // self.groups
        grouped = ops.reshape(channel_values, (-1, self.groups, per_group))
        averages = ops.mean(grouped, axis=-1, keepdims=True)
        # Broadcast back by a product with ones: a static shape (no SHAPE ops in TFLite).
        spread = averages * ops.ones((per_group,), channel_values.dtype)
        return ops.reshape(spread, (-1, *shape[1:]))


def _group_norm(name, policy, numerics, zero_scale=False):
    return GroupNorm(groups=32, epsilon=NUMERICS[numerics][2], name=name, dtype=policy,
                     gamma_initializer="zeros" if zero_scale else "ones")


def _same_padding_stride_2(size):
    """Output size and (before, after) padding of a "same" 3-wide window with stride 2."""
    out = -(-size // 2)
    total = max(2 * (out - 1) + 3 - size, 0)
    return out, (total // 2, total - total // 2)


def _add_at_stride_2(parts, axis):
    """The transpose of taking `x[k::2]` (k = 0, 1, 2, n items each) along `axis`: a map of
    2n + 1 items where `parts[k][i]` lands at 2i + k (overlapping parts add)."""
    def pad(x, before, after):
        widths = [[0, 0]] * 4
        widths[axis] = [before, after]
        return ops.pad(x, widths)

    even = pad(parts[0], 0, 1) + pad(parts[2], 1, 0)
    odd = pad(parts[1], 0, 1)
    interleaved = ops.stack([even, odd], axis=axis + 1)
    shape = list(even.shape)
    shape[axis] *= 2
    merged = ops.reshape(interleaved, [-1 if side is None else side for side in shape])
    index = [slice(None)] * 4
    index[axis] = slice(0, shape[axis] - 1)
    return merged[tuple(index)]


@ops.custom_gradient
def max_pool_3x3_stride_2(x):
    """3x3 max-pooling with stride 2 and "same" padding on NHWC maps, with a gradient that
    XLA compiles well: it sends each window's gradient to the first (row-major) input that
    holds its maximum, as TensorFlow's MaxPoolGrad does, using 9 strided views of the input.
    XLA's own gradient of max-pooling (select-and-scatter) runs on CPU as a variadic
    reduce-window and a scatter, a quarter of the quickstart model's training step; with this
    one the step runs 1.16x as fast (benchmarks/train_step.py --quickstart)."""
    y = ops.max_pool(x, pool_size=3, strides=2, padding="same")

    def grad(*args, upstream=None):
        upstream = args[0] if upstream is None else upstream
        _, height, width, _ = x.shape
        out_height, rows = _same_padding_stride_2(height)
        out_width, columns = _same_padding_stride_2(width)
        padded = ops.pad(x, [[0, 0], rows, columns, [0, 0]], constant_values=float("-inf"))
        views = [padded[:, dy:dy + 2 * out_height:2, dx:dx + 2 * out_width:2, :]
                 for dy in range(3) for dx in range(3)]
        first = ops.full_like(y, 9, dtype="int8")  # 9: no maximum seen yet
        for position in reversed(range(9)):
            first = ops.where(ops.equal(views[position], y), ops.cast(position, "int8"), first)
        zero = ops.zeros_like(upstream)
        shares = [ops.where(ops.equal(first, position), upstream, zero) for position in range(9)]
        by_column = [_add_at_stride_2(shares[dx::3], axis=1) for dx in range(3)]
        full = _add_at_stride_2(by_column, axis=2)
        return full[:, rows[0]:rows[0] + height, columns[0]:columns[0] + width, :]

    return y, grad


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """Root of the ResNet: 7x7/2 StdConv (`conv_root`) -> GroupNorm (`gn_root`) -> ReLU ->
    3x3/2 max-pool. Downsamples by 4.

    Args:
        width: output channels (64 in every released hybrid).
        numerics: "original" or "timm", see `ViTConfig.resnet_numerics`.
    """

    def __init__(self, width=64, numerics="original", **kwargs):
        super().__init__(**kwargs)
        self.width = int(width)
        self.numerics = _checked_numerics(numerics)

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(f"ResNetStem expects images of rank 4, got shape {tuple(input_shape)}.")
        self.conv_root = StdConv2D(self.width, 7, strides=2, name="conv_root",
                                   numerics=self.numerics, dtype=self.dtype_policy)
        self.gn_root = _group_norm("gn_root", self.dtype_policy, self.numerics)
        self.conv_root.build(input_shape)
        self.gn_root.build(self.conv_root.compute_output_shape(input_shape))
        self.input_channels = input_shape[-1]

    def call(self, images, training=None):
        if images.shape[-1] not in (self.input_channels, None):
            raise ValueError(
                f"Expected images with {self.input_channels} channels (last axis), "
                f"got shape {tuple(images.shape)}."
            )
        x = self.gn_root(self.conv_root(images))
        # ReLU after the pool, not before: the same values and gradients (both are monotonic),
        # on a 4x smaller map (5 to 7% faster forward and backward under XLA).
        # Training takes the pool whose gradient XLA compiles well. Inference keeps the plain
        # op, with the same values: the TFLite export saves the model's function with its
        # weights frozen into constants, and that cannot hold a custom gradient that reads the
        # forward input ("Found invalid capture ... when saving custom gradients").
        if training and None not in x.shape[1:3]:
            x = max_pool_3x3_stride_2(x)
        else:
            x = ops.max_pool(x, pool_size=3, strides=2, padding="same")
        x = ops.relu(x)
        # Max-pooling skips NaN (TensorFlow's kernel takes the max of the other values, and
        # -FLT_MAX when all are NaN), so a NaN image would leave the stem finite and get
        # finite logits. Keep NaN: images with a non-finite pixel give NaN features. One
        # reduction over the pixels and a select on the 4x smaller feature map: negligible
        # next to the 7x7 convolution.
        finite = ops.all(ops.isfinite(images), axis=(1, 2, 3), keepdims=True)
        return ops.where(finite, x, ops.cast(float("nan"), x.dtype))

    def compute_output_shape(self, input_shape):
        return _strided_shape(input_shape, 4, self.width)

    def get_config(self):
        return {**super().get_config(), "width": self.width, **_numerics_config(self)}


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """ResNet-v2 bottleneck as in the original hybrid: 1x1 -> 3x3 (strided) -> 1x1 (4x width),
    GroupNorm after each (the last one's scale starts at zero), ReLU, and
    `relu(residual + y)`; a projection (`conv_proj`, `gn_proj`) when the shape changes.

    Args:
        features: width of the bottleneck; the output has `4 * features` channels.
        strides: stride of the 3x3 convolution and of the projection.
        numerics: "original" or "timm", see `ViTConfig.resnet_numerics`.
    """

    def __init__(self, features, strides=1, numerics="original", **kwargs):
        super().__init__(**kwargs)
        self.features = int(features)
        self.strides = int(strides)
        self.numerics = _checked_numerics(numerics)

    def build(self, input_shape):
        input_shape = tuple(input_shape)  # a list when Keras rebuilds a loaded model
        policy, numerics = self.dtype_policy, self.numerics
        out = 4 * self.features
        self.needs_projection = input_shape[-1] != out or self.strides != 1
        if self.needs_projection:
            self.conv_proj = StdConv2D(out, 1, strides=self.strides, name="conv_proj",
                                       numerics=numerics, dtype=policy)
            self.gn_proj = _group_norm("gn_proj", policy, numerics)
        self.conv1 = StdConv2D(self.features, 1, name="conv1", numerics=numerics, dtype=policy)
        self.gn1 = _group_norm("gn1", policy, numerics)
        self.conv2 = StdConv2D(self.features, 3, strides=self.strides, name="conv2",
                               numerics=numerics, dtype=policy)
        self.gn2 = _group_norm("gn2", policy, numerics)
        self.conv3 = StdConv2D(out, 1, name="conv3", numerics=numerics, dtype=policy)
        self.gn3 = _group_norm("gn3", policy, numerics, zero_scale=True)
        # Build in call order so each weight exists before the first call.
        shape = input_shape
        strided = self.compute_output_shape(input_shape)
        if self.needs_projection:
            self.conv_proj.build(shape)
            self.gn_proj.build(strided)
        self.conv1.build(shape)
        self.gn1.build(shape[:-1] + (self.features,))
        self.conv2.build(shape[:-1] + (self.features,))
        self.gn2.build(strided[:-1] + (self.features,))
        self.conv3.build(strided[:-1] + (self.features,))
        self.gn3.build(strided)

    def call(self, x):
        residual = x
        if self.needs_projection:
            residual = self.gn_proj(self.conv_proj(x))
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        return _strided_shape(input_shape, self.strides, 4 * self.features)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "strides": self.strides,
                **_numerics_config(self)}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStage(keras.layers.Layer):
    """`num_units` bottleneck units named `unit1`, `unit2`, ...; the first carries the stride.

    Args:
        num_units: bottleneck units in the stage.
        features: bottleneck width (output channels are `4 * features`).
        first_stride: stride of the first unit (1 for the first stage, 2 after).
        numerics: "original" or "timm", see `ViTConfig.resnet_numerics`.
    """

    def __init__(self, num_units, features, first_stride=1, numerics="original", **kwargs):
        super().__init__(**kwargs)
        self.num_units = int(num_units)
        self.features = int(features)
        self.first_stride = int(first_stride)
        self.numerics = _checked_numerics(numerics)

    def build(self, input_shape):
        self.units = []
        shape = input_shape
        for index in range(self.num_units):
            unit = BottleneckUnit(self.features, self.first_stride if index == 0 else 1,
                                  numerics=self.numerics, name=f"unit{index + 1}",
                                  dtype=self.dtype_policy)
            unit.build(shape)
            shape = unit.compute_output_shape(shape)
            self.units.append(unit)

    def call(self, x):
        for unit in self.units:
            x = unit(x)
        return x

    def compute_output_shape(self, input_shape):
        return _strided_shape(input_shape, self.first_stride, 4 * self.features)

    def get_config(self):
        return {**super().get_config(), "num_units": self.num_units, "features": self.features,
                "first_stride": self.first_stride, **_numerics_config(self)}


def _numerics_config(layer):
    """`numerics` for a layer's config where it is not the original's (older files unchanged)."""
    return {} if layer.numerics == "original" else {"numerics": layer.numerics}

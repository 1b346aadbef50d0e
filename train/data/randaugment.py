"""RandAugment and random erasing of one training image, as stateless TensorFlow ops: the same
seed gives the same image, so the training stream stays a pure function of (seed, step).

RandAugment ("RandAugment: Practical automated data augmentation with a reduced search space",
Cubuk et al., 2020) as AugReg trained with it: the 16 operations and magnitude scale of the
TPU reference (tensorflow/tpu, `models/official/efficientnet/autoaugment.py`, which
google-research/big_vision forks as `pp/archive/autoaugment.py`). Each of `layers` rounds
applies one operation picked uniformly, always (the reference draws a probability and ignores
it), at the fixed `magnitude` M: rotation M/10 * 30 degrees, shear M/10 * 0.3, colour, contrast,
brightness and sharpness factors M/10 * 1.8 + 0.1, posterize to int(M/10 * 4) bits, solarize
above int(M/10 * 256), and so on, each sign random. As in the reference, posterize and solarize
grow weaker with M (magnitude 0 keeps one bit of each value and solarizes every pixel), and
magnitude 0 still equalizes, inverts and auto-contrasts: AugReg's light1 level is RandAugment at
0. The reference's translations (100 pixels) and cutout (40 pixels) are for 224-pixel images;
here they are the same fraction of the image's size. The contrast operation blends with the
grayscale image's mean (the reference used a histogram sum that is not the mean).

Why not Keras' `RandAugment` and `RandomErasing` layers (Keras 3.15): their random draws come
from a `SeedGenerator` whose state advances with every call, so batch k depends on how many
batches came before (a resumed run would see other images), and a seed tensor per example is
rejected on the TensorFlow backend; Keras' RandAugment also draws each operation's strength
uniformly up to its factor, one-sided, with one choice of operations per batch, not AugReg's
fixed magnitude per image.
"""

import math

import tensorflow as tf

MAX_LEVEL = 10.0  # the reference's magnitude scale: magnitude 10 is its "full" strength
REFERENCE_SIZE = 224  # the image size of the reference's pixel constants below
TRANSLATE_PIXELS = 100  # at REFERENCE_SIZE
CUTOUT_PIXELS = 40  # half the side of the cutout square, at REFERENCE_SIZE
FILL = 128  # what geometric operations and cutout leave where the image was

OPERATIONS = ("auto_contrast", "equalize", "invert", "rotate", "posterize", "solarize", "color",
              "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x",
              "translate_y", "cutout", "solarize_add")


def rand_augment(image, seed, layers, magnitude):
    """`layers` RandAugment operations on `image` (float32 [height, width, 3] in 0..255, as
    the resize leaves it), drawn from `seed` (shape-[2] int); returns float32 in 0..255."""
    image = tf.ensure_shape(image, (image.shape[0], image.shape[1], 3))
    pixels = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    for seed in tf.unstack(tf.random.experimental.stateless_split(seed, layers)):
        choice_seed, sign_seed, where_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3))
        choice = tf.random.stateless_uniform([], choice_seed, 0, len(OPERATIONS), tf.int32)
        sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, -1.0, 1.0)
        branches = [_operation(name, magnitude, sign, where_seed) for name in OPERATIONS]
        pixels = tf.switch_case(choice, [lambda op=op: op(pixels) for op in branches])
        pixels = tf.ensure_shape(pixels, image.shape)
    return tf.cast(pixels, tf.float32)


def _operation(name, magnitude, sign, seed):
    """`fn(uint8 image) -> uint8 image` of operation `name` at `magnitude`; `sign` (+-1) for
    the operations whose direction is random, `seed` for where cutout falls."""
    level = magnitude / MAX_LEVEL
    factor = level * 1.8 + 0.1
    if name == "auto_contrast":
        return _auto_contrast
    if name == "equalize":
        return _equalize
    if name == "invert":
        return lambda image: 255 - image
    if name == "rotate":
        return lambda image: _rotate(image, sign * level * 30.0)
    if name == "posterize":
        # The reference shifts by 8 - bits: TensorFlow clamps a shift of 8 to 7 (1 bit kept),
        # and bits above 8 (magnitudes from 22.5) would be a negative shift (all bits kept).
        return lambda image: _posterize(image, min(max(int(level * 4), 1), 8))
    if name == "solarize":
        return lambda image: _solarize(image, int(level * 256))
    if name == "solarize_add":
        return lambda image: _solarize_add(image, int(level * 110))
    if name == "color":
        return lambda image: _blend(_grayscale(image), image, factor)
    if name == "contrast":
        return lambda image: _blend(tf.fill(tf.shape(image), tf.reduce_mean(
            tf.cast(_grayscale(image), tf.float32))), image, factor)
    if name == "brightness":
        return lambda image: _blend(tf.zeros_like(image, tf.float32), image, factor)
    if name == "sharpness":
        return lambda image: _blend(_smoothed(image), image, factor)
    if name == "shear_x":
        return lambda image: _affine(image, [1.0, sign * level * 0.3, 0.0, 0.0, 1.0, 0.0])
    if name == "shear_y":
        return lambda image: _affine(image, [1.0, 0.0, 0.0, sign * level * 0.3, 1.0, 0.0])
    if name == "translate_x":
        return lambda image: _affine(image, [1.0, 0.0, -sign * _pixels(
            level * TRANSLATE_PIXELS, image.shape[1]), 0.0, 1.0, 0.0])
    if name == "translate_y":
        return lambda image: _affine(image, [1.0, 0.0, 0.0, 0.0, 1.0, -sign * _pixels(
            level * TRANSLATE_PIXELS, image.shape[0])])
    if name == "cutout":
        return lambda image: _cutout(image, level * CUTOUT_PIXELS, seed)
    raise AssertionError(name)


def _pixels(reference_pixels, size):
    """`reference_pixels` at REFERENCE_SIZE, as pixels of an image side of `size`."""
    return reference_pixels * size / REFERENCE_SIZE


def _blend(degenerate, image, factor):
    """degenerate + factor * (image - degenerate), clipped to 0..255 (the reference's blend:
    factor 0 is the degenerate image, 1 the image, above 1 extrapolates)."""
    degenerate = tf.cast(degenerate, tf.float32)
    blended = degenerate + factor * (tf.cast(image, tf.float32) - degenerate)
    return tf.cast(tf.clip_by_value(blended, 0.0, 255.0), tf.uint8)


def _grayscale(image):
    return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))


def _auto_contrast(image):
    """Each channel stretched to 0..255 (one of a single level is left as it is)."""
    pixels = tf.cast(image, tf.float32)
    low = tf.reduce_min(pixels, axis=[0, 1])
    high = tf.reduce_max(pixels, axis=[0, 1])
    scale = tf.where(high > low, 255.0 / tf.maximum(high - low, 1.0), 1.0)
    offset = tf.where(high > low, -low * scale, 0.0)
    return tf.cast(tf.clip_by_value(pixels * scale + offset, 0.0, 255.0), tf.uint8)


def _equalize(image):
    """Each channel's histogram equalized, by the reference's lookup table."""
    channels = []
    for channel in tf.unstack(image, axis=-1):
        histogram = tf.histogram_fixed_width(tf.cast(channel, tf.int32), [0, 255], nbins=256)
        nonzero = tf.boolean_mask(histogram, histogram > 0)
        step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255
        lookup = (tf.cumsum(histogram) + step // 2) // tf.maximum(step, 1)
        lookup = tf.clip_by_value(tf.concat([[0], lookup[:-1]], 0), 0, 255)
        equalized = tf.gather(lookup, tf.cast(channel, tf.int32))
        channels.append(tf.where(step > 0, tf.cast(equalized, tf.uint8), channel))
    return tf.stack(channels, axis=-1)


def _posterize(image, bits):
    """The `bits` (1 to 8) high bits of each value kept."""
    return tf.bitwise.bitwise_and(image, tf.constant((255 << (8 - bits)) & 255, tf.uint8))


def _solarize(image, threshold):
    return tf.where(tf.cast(image, tf.int32) < threshold, image, 255 - image)


def _solarize_add(image, addition, threshold=128):
    added = tf.cast(tf.clip_by_value(tf.cast(image, tf.int32) + addition, 0, 255), tf.uint8)
    return tf.where(image < threshold, added, image)


def _smoothed(image):
    """The reference's sharpness degenerate: a 3x3 smoothing inside, the border unchanged."""
    kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
    pixels = tf.cast(image, tf.float32)[None]
    inner = tf.nn.depthwise_conv2d(pixels, kernel, [1, 1, 1, 1], "VALID")[0]
    inner = tf.floor(tf.clip_by_value(inner, 0.0, 255.0))  # the reference's cast to uint8
    padded = tf.pad(inner, [[1, 1], [1, 1], [0, 0]])
    border = tf.pad(tf.ones_like(inner), [[1, 1], [1, 1], [0, 0]]) < 0.5
    return tf.where(border, pixels[0], padded)


def _affine(image, transform):
    """`image` under the projective transform [a0, a1, a2, b0, b1, b2] (output pixel (x, y)
    reads input (a0 x + a1 y + a2, b0 x + b1 y + b2)), nearest pixel, FILL outside."""
    transform = tf.reshape(tf.cast(tf.stack(transform + [0.0, 0.0]), tf.float32), [1, 8])
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform, output_shape=tf.shape(image)[:2],
        fill_value=float(FILL), interpolation="NEAREST", fill_mode="CONSTANT")[0]


def _rotate(image, degrees):
    """`image` rotated by `degrees` about its centre."""
    angle = degrees * math.pi / 180.0
    height, width = float(image.shape[0] - 1), float(image.shape[1] - 1)
    cos, sin = tf.cos(angle), tf.sin(angle)
    x_offset = (width - (cos * width - sin * height)) / 2.0
    y_offset = (height - (sin * width + cos * height)) / 2.0
    return _affine(image, [cos, -sin, x_offset, sin, cos, y_offset])


def _cutout(image, reference_pad, seed):
    """A square of side 2 x pad (clipped at the edges) at a random centre set to FILL."""
    height, width = image.shape[0], image.shape[1]
    pad = int(_pixels(reference_pad, min(height, width)))
    centre = random_point(seed, height, width)
    inside = box_mask(height, width, centre[0] - pad, centre[1] - pad, centre[0] + pad,
                      centre[1] + pad)
    return tf.where(inside[:, :, None], tf.constant(FILL, tf.uint8), image)


def box_mask(height, width, top, left, bottom, right):
    """True at rows [top, bottom) x columns [left, right) of a height x width image (int32
    bounds, scalars or [..., 1, 1] for a batch of boxes): [..., height, width]."""
    rows, columns = tf.range(height)[:, None], tf.range(width)[None, :]
    return (rows >= top) & (rows < bottom) & (columns >= left) & (columns < right)


def random_point(seed, height, width):
    """A pixel (row, column), int32, uniform over a height x width image."""
    point = tf.random.stateless_uniform([2], seed) * tf.constant([height, width], tf.float32)
    return tf.minimum(tf.cast(point, tf.int32), tf.constant([height - 1, width - 1]))


def random_erasing(image, seed, probability):
    """With `probability`, a random box of `image` (float [height, width, 3] in the model's
    range) replaced by standard normal noise per pixel, as DeiT trains (timm's RandomErasing,
    mode "pixel": area 2% to 1/3 of the image, aspect ratio 0.3 to 1/0.3 log-uniform, ten
    tries to fit, else nothing)."""
    height, width = image.shape[0], image.shape[1]
    apply_seed, box_seed, noise_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    tries = 10
    draws = tf.random.stateless_uniform([tries, 4], box_seed)
    area = (0.02 + draws[:, 0] * (1 / 3 - 0.02)) * height * width
    aspect = tf.exp(math.log(0.3) + draws[:, 1] * (math.log(1 / 0.3) - math.log(0.3)))
    box_height = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
    box_width = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
    fits = (box_height < height) & (box_width < width)
    first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
    box_height, box_width = box_height[first], box_width[first]
    top = tf.cast(draws[first, 2] * tf.cast(height - box_height + 1, tf.float32), tf.int32)
    left = tf.cast(draws[first, 3] * tf.cast(width - box_width + 1, tf.float32), tf.int32)
    inside = box_mask(height, width, top, left, top + box_height, left + box_width)
    erase = (tf.random.stateless_uniform([], apply_seed) < probability) & tf.reduce_any(fits)
    noise = tf.random.stateless_normal(tf.shape(image), noise_seed, dtype=image.dtype)
    return tf.where(erase & inside[:, :, None], noise, image)

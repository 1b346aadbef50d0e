"""The model's input preprocessing, one owner for training, evaluation, analysis and serving.

`scale_pixels` is the original's input scaling, pixels in [0, 255] to [-1, 1]; `decode_image`,
`resize` and `decode_and_resize` turn encoded image files into pixels at the model's size, as an
`EvalPreprocessing` says (keras_vit's own: bilinear, straight to the size; a checkpoint from
timm or transformers: its interpolation and centre crop, which `ViTModel.preprocessing`
carries). `prepare_images` does all of it for a model. The input pipeline (train/), the exported
SavedModel and TFLite files (keras_vit.deploy.export) and the analysis tools all call these, so what
a model is trained on and what it is served cannot drift apart. The decoding and resizing use
TensorFlow (imported when called); `scale_pixels` and `preprocess_inputs` work on every Keras
backend.
"""

import dataclasses
import math
import numbers

import keras
import numpy as np
from keras import ops


def _dtype_name(images):
    try:
        return keras.backend.standardize_dtype(images.dtype)
    except (ValueError, TypeError, AttributeError):
        return str(images.dtype)


def scale_pixels(pixels):
    """Float pixels in [0, 255] to [-1, 1], as the original: (x - 127.5) / 127.5.

    Plain arithmetic, so it takes numpy arrays and tensors of any backend, eagerly and in
    graphs; the caller casts integer pixels to a float dtype first."""
    # A multiplication, not a division: TensorFlow's graph optimizer rewrites a division by a
    # constant into a multiplication by its reciprocal (1 ulp apart for most pixels), so only
    # this form gives bit-identical inputs eagerly, in tf.data, in a tf.function and in the
    # exported SavedModel.
    return (pixels - 127.5) * (1 / 127.5)


def decode_image(encoded):
    """PNG/JPEG/GIF/BMP bytes to uint8 RGB [height, width, 3] (grayscale repeated to 3
    channels, alpha dropped, the first frame of a GIF); a TensorFlow op, for tf.data and
    tf.function too."""
    import tensorflow as tf

    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # tf.image.resize's, that checkpoints use
CROP_MODES = ("squash", "center")  # timm's names


@dataclasses.dataclass(frozen=True)
class EvalPreprocessing:
    """How an image is resized to a model's size for evaluation and serving: keras_vit's own by
    default, or what a checkpoint's library does to its evaluation images (timm's
    `pretrained_cfg`, transformers' `preprocessor_config.json`), as `from_pretrained` sets it.

    Attributes:
        interpolation: "bilinear", "bicubic" or "nearest".
        crop_fraction: in (0, 1], timm's `crop_pct`: the image is resized to
            floor(size / crop_fraction), then its centre cropped to the size.
        crop_mode: "squash" resizes each side to its target, the aspect ratio not kept (with
            crop_fraction 1.0: straight to the size, keras_vit's own and transformers'
            ViTImageProcessor); "center" keeps the aspect ratio, the shorter side (relative to
            the target) to its target, as timm's default.
        antialias: filter when downscaling, as PIL does (timm and transformers resize with PIL;
            TensorFlow's filter matches PIL's to within a unit of 0..255); keras_vit's own
            models train and serve without.
    """

    interpolation: str = "bilinear"
    crop_fraction: float = 1.0
    crop_mode: str = "squash"
    antialias: bool = False

    def __post_init__(self):
        problems = []
        if self.interpolation not in INTERPOLATIONS:
            problems.append(f"interpolation={self.interpolation!r}: must be one of "
                            f"{INTERPOLATIONS}")
        fraction = self.crop_fraction
        if (isinstance(fraction, bool) or not isinstance(fraction, numbers.Real)
                or not 0 < fraction <= 1):  # NaN fails too
            problems.append(f"crop_fraction={fraction!r}: must be a number in (0, 1], the "
                            "fraction of the resized image kept (timm's crop_pct)")
        else:
            object.__setattr__(self, "crop_fraction", float(fraction))
        if self.crop_mode not in CROP_MODES:
            problems.append(f"crop_mode={self.crop_mode!r}: must be one of {CROP_MODES}")
        if not isinstance(self.antialias, (bool, np.bool_)):
            problems.append(f"antialias={self.antialias!r}: must be True or False")
        else:
            object.__setattr__(self, "antialias", bool(self.antialias))
        if problems:
            raise ValueError("Invalid EvalPreprocessing: " + "; ".join(problems) + ".")

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields):
        """The preprocessing that `to_dict()` wrote (a JSON object)."""
        names = [field.name for field in dataclasses.fields(cls)]
        if not isinstance(fields, dict) or set(fields) - set(names):
            raise ValueError(f"An EvalPreprocessing is read from a dict of {names}, got "
                             f"{fields!r}.")
        return cls(**fields)


def _crop_box(image_size, size, preprocessing, xp=np):
    """([resized height, width], [top, left] of the centre crop) as float64 scalars: timm 1.0's
    `transforms_imagenet_eval` arithmetic with torchvision's rounding, in float64 as Python
    does it, so that the sizes equal timm's. `xp` is numpy for Python numbers, or `_tf_numpy()`
    for the sizes of images in a TensorFlow graph: one arithmetic for both, which the tests
    compare with timm's."""
    height, width = (xp.asarray(image_size[axis], dtype=xp.float64) for axis in (0, 1))
    scale = [math.floor(side / preprocessing.crop_fraction) for side in size]
    target = [xp.asarray(side, dtype=xp.float64) for side in scale]
    if preprocessing.crop_mode == "squash":
        resized = target
    elif scale[0] == scale[1]:  # torchvision's Resize(int): shorter side to it, longer truncated
        longer = xp.floor(xp.divide(target[0] * xp.maximum(height, width),
                                    xp.minimum(height, width)))
        portrait = width <= height
        resized = [xp.where(portrait, longer, target[0]), xp.where(portrait, target[1], longer)]
    else:  # timm's ResizeKeepRatio: the side nearer its target to it, the other rounded
        ratio = xp.minimum(xp.divide(height, target[0]), xp.divide(width, target[1]))
        resized = [xp.round(xp.divide(height, ratio)), xp.round(xp.divide(width, ratio))]
    offsets = [xp.round((new - side) / 2) for new, side in zip(resized, size)]  # CenterCrop's
    return resized, offsets


def _tf_numpy():
    """The numpy functions `_crop_box` uses, on TensorFlow tensors."""
    import types

    import tensorflow as tf

    # TensorFlow's graph optimizer turns a division by a constant into a multiplication by its
    # reciprocal (640 / 14 one ulp off, and a size one pixel off); it leaves DivNoNan alone.
    return types.SimpleNamespace(
        float64=tf.float64, asarray=lambda value, dtype: tf.cast(value, dtype),
        divide=tf.math.divide_no_nan, floor=tf.math.floor, maximum=tf.maximum,
        minimum=tf.minimum, where=tf.where, round=tf.round)  # half to even, as Python's


def resize(images, size, preprocessing=None):
    """Pixels ([height, width, 3] or a batch of one size, any numeric dtype) to float32 still in
    0..255 at `size` (height, width), as `preprocessing` (an `EvalPreprocessing`) says; by
    default resized bilinearly straight to the size."""
    import tensorflow as tf

    preprocessing = EvalPreprocessing() if preprocessing is None else preprocessing
    if not isinstance(preprocessing, EvalPreprocessing):
        raise TypeError(f"preprocessing must be a keras_vit.EvalPreprocessing or None, got "
                        f"{type(preprocessing).__name__}.")
    images = tf.cast(images, tf.float32)
    crop = preprocessing.crop_mode != "squash" or preprocessing.crop_fraction != 1.0
    resized, offsets = size, None
    if crop:
        box = _crop_box(tf.shape(images)[-3:-1], size, preprocessing, xp=_tf_numpy())
        # Each cast before the stack: tf.image.resize reads a size stacked from float64
        # constants through the cast, and fails.
        resized, offsets = (tf.stack([tf.cast(value, tf.int32) for value in values])
                            for values in box)
    images = tf.image.resize(images, resized, method=preprocessing.interpolation,
                             antialias=preprocessing.antialias)
    if preprocessing.interpolation == "bicubic":  # overshoots; PIL's uint8 pixels cannot
        images = tf.clip_by_value(images, 0.0, 255.0)
    if crop:
        images = tf.image.crop_to_bounding_box(images, offsets[0], offsets[1], *size)
    return images


def decode_and_resize(encoded, size, preprocessing=None):
    """An encoded image file to float32 pixels in 0..255 at `size` (height, width), resized as
    `resize`."""
    return resize(decode_image(encoded), size, preprocessing)


def decode_and_resize_files(encoded, size, preprocessing=None):
    """A 1-D string tensor of encoded files to float32 pixels `[N, height, width, 3]` in 0..255:
    each file decoded and resized on its own (`decode_and_resize`), so files of any sizes
    stack into one batch."""
    import tensorflow as tf

    return tf.map_fn(lambda file: decode_and_resize(file, size, preprocessing), encoded,
                     fn_output_signature=tf.TensorSpec(tuple(size) + (3,), tf.float32))


def model_image_size(model):
    """The (height, width) images are resized to for `model`: its input's, or for a model of
    any size the size of its position embeddings' grid (its spec's `image_size`)."""
    spec = getattr(model, "spec", None)
    if spec is not None and spec.dynamic_image_size:
        return spec.image_size
    shape = model.input_shape
    if len(shape) != 4 or shape[-1] != 3 or None in shape[1:3]:
        raise ValueError(f"Expected a model of images [batch, height, width, 3], got input "
                         f"shape {shape}.")
    return shape[1], shape[2]


def prepare_images(model, images):
    """Images as `model`'s weights expect them: decoded if encoded, resized (and cropped) to
    the model's size as `model.preprocessing` says, scaled to [-1, 1].

        logits = model(keras_vit.prepare_images(model, [open("cat.jpg", "rb").read()]))

    Args:
        model: a model built by keras_vit (any Keras model of images: resized bilinearly).
        images: encoded image files (JPEG/PNG/GIF/BMP): one `bytes`, a list of them or a
            string tensor; or pixels in 0..255 (uint8 or float), `[height, width, 3]` or a
            batch `[N, height, width, 3]` of one size, of any size.

    Returns float32 `[height, width, 3]` for one image, `[N, height, width, 3]` for several: a
    tensor of the Keras backend, or a TensorFlow tensor inside `tf.data` or a `tf.function`.
    """
    import tensorflow as tf

    size = model_image_size(model)
    preprocessing = getattr(model, "preprocessing", None)
    images = _images_tensor(images)
    if images.dtype == tf.string:
        if images.shape.rank not in (0, 1):
            raise ValueError(f"prepare_images takes one encoded file or a list of them, got a "
                             f"string tensor of shape {tuple(images.shape)}.")
        if not tf.executing_eagerly():  # in tf.data or a tf.function
            pixels = (decode_and_resize(images, size, preprocessing) if images.shape.rank == 0
                      else decode_and_resize_files(images, size, preprocessing))
        elif images.shape.rank == 0:
            pixels = _decoded(images, "the file", size, preprocessing)
        else:  # one at a time, so that a file that does not decode is named
            pixels = tf.stack([_decoded(item, f"item {index}", size, preprocessing)
                               for index, item in enumerate(tf.unstack(images))])
    else:
        if images.shape.rank not in (3, 4) or images.shape[-1] != 3:
            raise ValueError(f"prepare_images takes RGB pixels [height, width, 3] or "
                             f"[N, height, width, 3], got shape {tuple(images.shape)}.")
        pixels = resize(images, size, preprocessing)
    pixels = scale_pixels(pixels)
    if tf.executing_eagerly() and keras.backend.backend() != "tensorflow":
        return ops.convert_to_tensor(pixels.numpy())
    return pixels


def _decoded(file, name, size, preprocessing):
    """`decode_and_resize` of one encoded file (eager), or a ValueError naming it (`name`) by
    its size and first bytes when it does not decode."""
    import tensorflow as tf

    try:
        return decode_and_resize(file, size, preprocessing)
    except tf.errors.InvalidArgumentError:
        data = file.numpy()
        raise ValueError(f"prepare_images: {name} ({len(data)} bytes, starting {data[:16]!r}) "
                         "is not an image TensorFlow decodes (JPEG, PNG, GIF, BMP or WebP); "
                         "pass the bytes of an image file.") from None


def _images_tensor(images):
    """`images` as a TensorFlow tensor: strings for encoded files, else numbers."""
    import tensorflow as tf

    if isinstance(images, str):
        raise TypeError("prepare_images takes the image file's bytes, got a str; read the "
                        "file first: open(path, 'rb').read().")
    if isinstance(images, (list, tuple)):
        for index, item in enumerate(images):
            if isinstance(item, str):
                raise TypeError(f"prepare_images takes the image files' bytes, but item {index} "
                                f"is a str ({item[:80]!r}); read the files first: "
                                "[open(path, 'rb').read() for path in paths].")
    if isinstance(images, bytes) or (isinstance(images, (list, tuple)) and images
                                     and all(isinstance(item, bytes) for item in images)):
        return tf.constant(images)  # not through numpy, whose bytes lose trailing zeros
    try:
        tensor = tf.convert_to_tensor(images if tf.is_tensor(images) else np.asarray(images))
    except (ValueError, TypeError):  # images of several sizes, other objects
        tensor = None
    if tensor is None or not (tensor.dtype == tf.string or tensor.dtype.is_integer
                              or tensor.dtype.is_floating):
        got = type(images).__name__ if tensor is None else f"dtype {tensor.dtype.name}"
        raise TypeError(f"prepare_images takes encoded image files (bytes) or numeric pixels "
                        f"0..255 of one size, got {got}; prepare images of several sizes one "
                        "at a time, or as encoded files.")
    return tensor


def preprocess_inputs(images):
    """Scales RGB images with values in [0, 255] (uint8 or float) to float32 in [-1, 1].

    Takes `[height, width, 3]` or `[batch, height, width, 3]` of an integer or float dtype;
    works on numpy arrays and on tensors, eagerly and inside `tf.data` or `tf.function`.
    Other dtypes (strings such as encoded JPEG bytes, bools, objects) raise a `TypeError`
    naming the dtype; a wrong shape raises a `ValueError`. Images already in [-1, 1] are not
    detected: preprocess once.
    """
    if not hasattr(images, "dtype"):
        try:
            images = np.asarray(images)
        except ValueError as error:  # ragged nested lists
            raise TypeError(
                "preprocess_inputs expects numeric RGB images (uint8 or float pixels 0..255), "
                f"got {type(images).__name__} that is not an array: {error}") from error
    dtype = _dtype_name(images)
    if not (dtype.startswith(("int", "uint")) or "float" in dtype):
        raise TypeError(
            f"preprocess_inputs expects numeric RGB images (an integer dtype such as uint8, or "
            f"a float dtype) with pixels 0..255, got dtype {dtype}"
            + (" (decode encoded images first, e.g. tf.io.decode_image)."
               if dtype in ("string", "str", "bytes") or dtype.startswith(("<U", "|S", "<S"))
               else "."))
    images = ops.convert_to_tensor(images)
    rank = len(images.shape)
    if rank not in (3, 4) or images.shape[-1] not in (3, None):
        raise ValueError(
            "preprocess_inputs expects RGB images [height, width, 3] or "
            f"[batch, height, width, 3], got shape {tuple(images.shape)}."
        )
    return scale_pixels(ops.cast(images, "float32"))

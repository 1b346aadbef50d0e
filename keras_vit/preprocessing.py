"""The model's input preprocessing, one owner for training, evaluation, analysis and serving.

`scale_pixels` is the original's input scaling, pixels in [0, 255] to [-1, 1]; `decode_image`,
`resize` and `decode_and_resize` turn encoded image files into pixels at the model's size. The
input pipeline (train/), the exported SavedModel and TFLite files (keras_vit.export) and the
analysis tools all call these, so what a model is trained on and what it is served cannot drift
apart. The decoding and resizing use TensorFlow (imported when called); `scale_pixels` and
`preprocess_inputs` work on every Keras backend.
"""

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


def resize(images, size):
    """Pixels ([height, width, 3] or a batch, any numeric dtype) resized bilinearly to `size`
    (height, width), as float32 still in 0..255."""
    import tensorflow as tf

    return tf.image.resize(tf.cast(images, tf.float32), size, method="bilinear")


def decode_and_resize(encoded, size):
    """An encoded image file to float32 pixels in 0..255 at `size` (height, width)."""
    return resize(decode_image(encoded), size)


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

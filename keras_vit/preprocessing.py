"""Input scaling of the original: pixels in [0, 255] mapped to [-1, 1] by (x - 127.5) / 127.5."""

import keras
import numpy as np
from keras import ops


def _dtype_name(images):
    try:
        return keras.backend.standardize_dtype(images.dtype)
    except (ValueError, TypeError, AttributeError):
        return str(images.dtype)


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
    return (ops.cast(images, "float32") - 127.5) / 127.5

"""Input scaling of the original: pixels in [0, 255] mapped to [-1, 1] by (x - 127.5) / 127.5."""

from keras import ops


def preprocess_inputs(images):
    """Scales RGB images with values in [0, 255] (uint8 or float) to float32 in [-1, 1].

    Takes `[height, width, 3]` or `[batch, height, width, 3]`; works on numpy arrays and on
    tensors, eagerly and inside `tf.data` or `tf.function`.
    """
    images = ops.convert_to_tensor(images)
    rank = len(images.shape)
    if rank not in (3, 4) or images.shape[-1] not in (3, None):
        raise ValueError(
            "preprocess_inputs expects RGB images [height, width, 3] or "
            f"[batch, height, width, 3], got shape {tuple(images.shape)}."
        )
    return (ops.cast(images, "float32") - 127.5) / 127.5

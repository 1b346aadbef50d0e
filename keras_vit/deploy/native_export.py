"""Export at native resolution: a SavedModel whose `serving_default` takes encoded images of any
shapes in one request and runs each at its own aspect ratio within a budget of patches (SigLIP
2's NaFlex), and a TFLite model that takes the NaFlex arrays at that fixed budget.

    export_saved_model(model, "/models/vit", max_num_patches=256)   # keras_vit.deploy.export
    export_tflite(model, "vit.tflite", max_num_patches=256)

The arrays are `keras_vit.native.prepare`'s (transformers' `Siglip2ImageProcessor`'s), and each
image's size is `keras_vit.native.image_size_for_budget`'s: a SavedModel request gives the
logits that `NaFlexViT(model)(native.prepare(images, P, max_num_patches))` gives in Python.
The public entry points are `keras_vit.deploy.export`'s, with `max_num_patches` set.
"""

import numpy as np

from keras_vit.architecture.variants import _describe, check_int

INPUT_NAMES = ("pixel_values", "pixel_attention_mask", "spatial_shapes")


def naflex_model(model, max_num_patches):
    """`(naflex, patch_size)`: `model` (a keras_vit model, or a `NaFlexViT` of one) as a
    `NaFlexViT`, once `max_num_patches` is a positive integer and the model can run at native
    resolution (ValueError naming what it lacks)."""
    from keras_vit.native import NaFlexViT

    check_int("max_num_patches", max_num_patches)
    naflex = model if isinstance(model, NaFlexViT) else None
    if naflex is None:
        if getattr(model, "spec", None) is None:
            raise TypeError(f"max_num_patches exports a keras_vit model (or a NaFlexViT of "
                            f"one) at native resolution, got {_describe(model)}.")
        naflex = NaFlexViT(model)  # refuses, naming it, what cannot run at native resolution
    return naflex, naflex.spec.patch_size


def patch_inputs(images, patch_size, max_num_patches):
    """The NaFlex arrays (`INPUT_NAMES`) of a 1-D string tensor of encoded files, or of float
    pixels `[N, H, W, 3]` in 0..255: each image decoded at its own size and cut by
    `keras_vit.native.image_patches_tf` within the budget, padded to `max_num_patches`."""
    import tensorflow as tf

    from keras_vit.native import image_patches_tf
    from keras_vit.preprocessing import decode_image

    encoded = images.dtype == tf.string
    width = patch_size * patch_size * 3

    def one(image):
        pixels = decode_image(image) if encoded else image
        patches, grid = image_patches_tf(pixels, patch_size, max_num_patches)
        count = tf.shape(patches)[0]
        patches = tf.pad(patches, [[0, max_num_patches - count], [0, 0]])
        return (tf.ensure_shape(patches, [max_num_patches, width]),
                tf.sequence_mask(count, max_num_patches, tf.int32), grid)

    signature = (tf.TensorSpec([max_num_patches, width], tf.float32),
                 tf.TensorSpec([max_num_patches], tf.int32), tf.TensorSpec([2], tf.int32))
    return dict(zip(INPUT_NAMES, tf.map_fn(one, images, fn_output_signature=signature)))


def checked_patch_inputs(values, mask, shapes, max_num_patches):
    """The arrays a client made itself (transformers' processor, `native.prepare`), once they
    hold what the model expects; else an INVALID_ARGUMENT error (TF Serving's answer for a failed
    assertion) saying what was wrong: each image at least one patch, its patches within the
    budget and marked in the mask, pixels scaled to [-1, 1]."""
    import tensorflow as tf

    patches = shapes[:, 0] * shapes[:, 1]
    grids = tf.debugging.Assert(
        tf.reduce_all((tf.reduce_min(shapes, axis=1) > 0) & (patches <= max_num_patches)),
        [f"spatial_shapes must hold each image's rows and columns of patches, each at least 1, "
         f"at most {max_num_patches} patches in all; got", shapes], summarize=16,
        name="check_spatial_shapes")
    with tf.control_dependencies([grids]):
        counted = tf.reduce_sum(mask, axis=1)
    masks = tf.debugging.Assert(
        tf.reduce_all(tf.equal(counted, patches))
        & tf.reduce_all(tf.equal(mask, tf.sequence_mask(counted, max_num_patches, tf.int32))),
        ["pixel_attention_mask must be 1 for the rows x columns patches of each image, first, "
         "and 0 after them; got counts", counted, "for spatial_shapes", shapes], summarize=16,
        name="check_mask")
    low, high = tf.reduce_min(values), tf.reduce_max(values)
    scaled = tf.debugging.Assert(
        tf.math.is_finite(low) & tf.math.is_finite(high) & (low >= -1.001) & (high <= 1.001),
        ["pixel_values must be patches scaled to [-1, 1] (keras_vit.native.prepare, or "
         "transformers' Siglip2ImageProcessor), not pixels in 0..255; got min", low, "max",
         high], name="check_pixel_values")
    with tf.control_dependencies([masks, scaled]):
        return {"pixel_values": tf.identity(values), "pixel_attention_mask": tf.identity(mask),
                "spatial_shapes": tf.identity(shapes)}


def patch_signature(patch_size, max_num_patches):
    """The TensorSpecs of the NaFlex arrays at a fixed budget, named as `INPUT_NAMES`."""
    import tensorflow as tf

    return [tf.TensorSpec([None, max_num_patches, patch_size * patch_size * 3], tf.float32,
                          name="pixel_values"),
            tf.TensorSpec([None, max_num_patches], tf.int32, name="pixel_attention_mask"),
            tf.TensorSpec([None, 2], tf.int32, name="spatial_shapes")]


def representative_samples(images, patch_size, max_num_patches):
    """int8 calibration data for a native TFLite model: a generator function of the NaFlex
    arrays of one image each (`keras_vit.native.prepare`), from `images`, a list of uint8
    `[height, width, 3]` images of any sizes (each wrong one named by `prepare`)."""
    from keras_vit import native

    if isinstance(images, np.ndarray) and images.ndim == 4:
        images = list(images)
    if not isinstance(images, (list, tuple)) or not images:
        raise TypeError(f"representative_data of a native model must be a non-empty list of "
                        f"uint8 images [height, width, 3] of any sizes, got {_describe(images)}.")
    arrays = native.prepare(images, patch_size, max_num_patches)

    def samples():
        for index in range(len(images)):
            yield {name: arrays[name][index:index + 1] for name in INPUT_NAMES}

    return samples

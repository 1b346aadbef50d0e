"""`config.native` in the tf.data pipeline (train.data.native_input says what each mode is):
each image cut into the patches of its own aspect ratio within its budget
(`keras_vit.native.image_patches_tf`), one per sequence, and for "packed" a batch's images
packed into sequences by `keras_vit.native.pack_patches` (NumPy, through `tf.numpy_function`:
one packer for both pipelines)."""

import numpy as np
import tensorflow as tf

from keras_vit import native

# Folded into an example's seed for its drawn budget (config.native_min_patches), so that
# the crop and flip stay what they were.
BUDGET_SEED_SALT = 0x4E4146
PACKED = ("pixel_values", "segment_ids", "patch_coords", "spatial_shapes", "label",
          "label_weight")


def drawn_budget(seed, plan):
    """The image's budget of patches: the plan's, or drawn from [min_patches, max_patches]
    by the example's `seed` (a shape-[2] int tensor)."""
    if plan.min_patches == plan.max_patches:
        return plan.max_patches
    return tf.random.stateless_uniform(
        [], tf.random.experimental.stateless_fold_in(seed, BUDGET_SEED_SALT),
        minval=plan.min_patches, maxval=plan.max_patches + 1, dtype=tf.int32)


def example(image, label, plan, budget=None):
    """One image (uint8 `[height, width, 3]`) as the model's padded arrays: `pixel_values`
    `[max_patches, P * P * 3]`, `pixel_attention_mask`, `spatial_shapes` and its `label`."""
    patches, grid = native.image_patches_tf(image, plan.patch_size,
                                            plan.max_patches if budget is None else budget)
    count = tf.shape(patches)[0]
    patches = tf.pad(patches, [[0, plan.max_patches - count], [0, 0]])
    return {"pixel_values": tf.ensure_shape(patches, [plan.max_patches, plan.patch_width]),
            "pixel_attention_mask": tf.cast(tf.range(plan.max_patches) < count, tf.int32),
            "spatial_shapes": tf.ensure_shape(grid, [2]), "label": tf.cast(label, tf.int32)}


def blank(plan):
    """An evaluation example of no image (`mask` 0): the padding of the last batch."""
    return {"pixel_values": tf.zeros([plan.max_patches, plan.patch_width]),
            "pixel_attention_mask": tf.zeros([plan.max_patches], tf.int32),
            "spatial_shapes": tf.zeros([2], tf.int32), "label": tf.constant(0, tf.int32)}


def packed(batch, plan):
    """A batch of `example`s packed into the plan's share of sequences (`plan.train_shapes`):
    each slot's label, and a `label_weight` of 0 for an empty slot."""
    images = batch["label"].shape[0]
    shapes = plan.train_shapes(images)
    sequences = shapes["pixel_values"][0][0]

    def pack(values, grids, labels):
        arrays = native.pack_patches(list(values), grids, plan.sequence_length,
                                     plan.images_per_sequence, sequences)
        index = arrays.pop("image_index")
        arrays["label"] = np.where(index >= 0, labels[np.maximum(index, 0)], 0).astype(np.int32)
        arrays["label_weight"] = (index >= 0).astype(np.float32)
        return [arrays[name] for name in PACKED]

    outputs = tf.numpy_function(pack, [batch["pixel_values"], batch["spatial_shapes"],
                                       batch["label"]],
                                [tf.as_dtype(shapes[name][1]) for name in PACKED],
                                stateful=False)
    return {name: tf.ensure_shape(output, shapes[name][0])
            for name, output in zip(PACKED, outputs)}

"""`config.native` in the tf.data pipeline (train.data.native_input says what each mode is):
each image cut into the patches of its own aspect ratio within its budget
(`keras_vit.native.image_patches_tf`), one per sequence, and for "packed" a batch's images
packed into sequences by `native_input.packed_arrays` (NumPy, through `tf.numpy_function`:
one packer for both pipelines; train.data.grain_native is the Grain pipeline's side)."""

import tensorflow as tf

from keras_vit import native
from . import native_input, records, stream
from .native_input import PACKED


def with_budgets(examples, seed, plan):
    """`(position, example)` pairs with each example's budget of patches added as
    `example["budget"]`, drawn from [min_patches, max_patches] by `stream.budget_draws` of
    (seed, position) a chunk at a time, the Grain pipeline's numbers; unchanged where every
    image takes the whole budget."""
    if plan.min_patches == plan.max_patches:
        return examples

    def draw(positions, chunk):
        budgets = tf.numpy_function(
            lambda positions: stream.budget_draws(positions, seed, plan.min_patches,
                                                  plan.max_patches).astype("int32"),
            [positions], tf.int32, stateful=False)
        return positions, dict(chunk, budget=tf.ensure_shape(budgets, positions.shape))

    return examples.batch(records.READ_CHUNK).map(draw).unbatch()


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
        arrays = native_input.packed_arrays(values, grids, labels, plan, sequences)
        return [arrays[name] for name in PACKED]

    outputs = tf.numpy_function(pack, [batch["pixel_values"], batch["spatial_shapes"],
                                       batch["label"]],
                                [tf.as_dtype(shapes[name][1]) for name in PACKED],
                                stateful=False)
    return {name: tf.ensure_shape(output, shapes[name][0])
            for name, output in zip(PACKED, outputs)}

"""`config.native` in the tf.data pipeline (train.data.native_input says what each mode is):
each image cut into the patches of its own aspect ratio within its budget
(`keras_vit.native.image_patches_tf`, its budget search run over a chunk of images at once:
`sized`), one per sequence, and for "packed" a batch's images
packed into sequences by `native_input.packed_arrays` (NumPy, through `tf.numpy_function`:
one packer for both pipelines; train.data.grain_native is the Grain pipeline's side)."""

import tensorflow as tf

from keras_vit import native
from keras_vit.native import processor
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


# Images whose budget searches run as one: the search's 24 float64 steps are some 300
# TensorFlow ops, whose cost is per op, not per element. Searched one image at a time they took
# a third of the padded pipeline's CPU time (585 against 397 us an image, 2 loaded AMD EPYC
# cores). A chunk holds its images' own pixels (`_held`), at most 64 decoded images.
SEARCH_CHUNK = 64
# What `pending` gives (and `sized`'s search adds) beside the caller's own items.
PENDING = ("image", "shape", "label", "budget", "size")
_ANY_IMAGE = (-1, -1, 3)  # a TensorList's element shape: uint8 [height, width, 3]


def pending(image, label, plan, budget=None, **extra):
    """One image (uint8 `[height, width, 3]`, `_held`) and its `label` (and `extra` items,
    kept) waiting for `sized` to find its size within its `budget` (default the plan's whole
    budget)."""
    budget = plan.max_patches if budget is None else budget
    return dict(extra, image=_held(image), shape=tf.shape(image)[:2], label=label,
                budget=tf.cast(budget, tf.int32))


def _held(image):
    """`image` as a scalar (a TensorList of it, tf.variant) that batches as a reference to its
    own buffer: a chunk of images of any shapes, none padded (padded to the largest, a chunk of
    64 photos took gigabytes) nor copied (serialized to a string instead, a 12-MP photo took
    +45% CPU time)."""
    empty = tf.raw_ops.EmptyTensorList(element_shape=tf.constant(_ANY_IMAGE),
                                       max_num_elements=1, element_dtype=tf.uint8)
    return tf.raw_ops.TensorListPushBack(input_handle=empty, tensor=image)


def _unheld(held):
    """The image `_held` holds."""
    image = tf.raw_ops.TensorListGetItem(input_handle=held, index=0,
                                         element_shape=tf.constant(_ANY_IMAGE),
                                         element_dtype=tf.uint8)
    return tf.ensure_shape(image, [None, None, 3])


def searched(examples, plan):
    """`pending` examples in chunks of `SEARCH_CHUNK`, with each image's size for its budget
    (`size`) found for the whole chunk at once (`image_sizes_for_budget_tf` on vectors: the same
    float64 steps, so the same sizes). The images stay `_held`: a chunk has no pixel array."""
    def search(chunk):
        heights, widths = native.image_sizes_for_budget_tf(
            chunk["shape"][:, 0], chunk["shape"][:, 1], plan.patch_size, chunk["budget"])
        return dict(chunk, size=tf.stack([heights, widths], axis=1))

    return examples.batch(SEARCH_CHUNK).map(search, num_parallel_calls=tf.data.AUTOTUNE,
                                            deterministic=True)


def sized(examples, plan):
    """`pending` examples as `example`'s arrays (their extra items kept): each image's size
    for its budget `searched` a chunk of images at a time, then each image resized and cut
    alone."""
    def cut(item):
        extra = {name: value for name, value in item.items() if name not in PENDING}
        size = item["size"]
        patches, grid = processor.resized_patches_tf(_unheld(item["image"]), size[0], size[1],
                                                     plan.patch_size)
        return dict(extra, **_padded(patches, grid, item["label"], plan))

    return searched(examples, plan).unbatch().map(cut, num_parallel_calls=tf.data.AUTOTUNE,
                                                  deterministic=True)


def example(image, label, plan, budget=None):
    """One image (uint8 `[height, width, 3]`) as the model's padded arrays: `pixel_values`
    `[max_patches, P * P * 3]`, `pixel_attention_mask`, `spatial_shapes` and its `label`
    (`sized` makes the same for many images)."""
    patches, grid = native.image_patches_tf(image, plan.patch_size,
                                            plan.max_patches if budget is None else budget)
    return _padded(patches, grid, label, plan)


def _padded(patches, grid, label, plan):
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

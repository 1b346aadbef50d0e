"""`config.native` in the Grain pipeline: the arrays of train.data.tf_native in NumPy, without
TensorFlow (train.data.native_input says what each mode is).

The stream is tf.data's: the same images at every (seed, step), cropped and flipped alike, each
with the same budget of patches (`stream.budget_draws`), so the same grid
(`keras_vit.native.image_size_for_budget`, the search tf.data runs in TensorFlow ops), and a
packed batch placed by the same packer (`native_input.packed_arrays`). The pixels are
TensorFlow's antialiased bilinear resize (`tf.image.resize(..., antialias=True)`) as two matrix
products (`grain_pipeline.resize`): float32 rounding apart (tests/training/data/
test_grain_native.py measures them).
"""

import numpy as np

from keras_vit.native import processor
from keras_vit.preprocessing import scale_pixels
from . import grain_pipeline, native_input, stream


def image_arrays(image, plan, budget=None):
    """One image (uint8 `[height, width, 3]`) within `budget` patches (default the plan's
    whole budget) as tf_native.example's arrays: `pixel_values` `[max_patches, P * P * 3]`,
    `pixel_attention_mask` and `spatial_shapes`."""
    budget = plan.max_patches if budget is None else int(budget)
    size = processor.image_size_for_budget(*image.shape[:2], plan.patch_size, budget)
    pixels = scale_pixels(grain_pipeline.resize(image, size, antialias=True))
    patches = processor.patchify(pixels, plan.patch_size)
    values = np.zeros((plan.max_patches, plan.patch_width), np.float32)
    values[:len(patches)] = patches
    return {"pixel_values": values,
            "pixel_attention_mask": (np.arange(plan.max_patches) < len(patches)).astype(np.int32),
            "spatial_shapes": np.array(size, np.int32) // plan.patch_size}


def blank(plan):
    """The arrays of no image: the padding of the last evaluation batch."""
    return {"pixel_values": np.zeros((plan.max_patches, plan.patch_width), np.float32),
            "pixel_attention_mask": np.zeros(plan.max_patches, np.int32),
            "spatial_shapes": np.zeros(2, np.int32)}


def _stacked(examples):
    return {name: np.stack([item[name] for item in examples]) for name in examples[0]}


def train_batch(images, labels, ids, positions, config, plan):
    """A host's share of a training batch (encoded images or arrays read at stream
    `positions`, with their `labels` and record `ids`): tf.data's native batch
    (`plan.train_shapes`) and `id`, the record of each image ("padded": `[images]`) or of each
    slot ("packed": `[sequences, slots]`, -1 for an empty slot)."""
    images, flips = grain_pipeline.cropped(images, positions, config, ids)
    budgets = stream.budget_draws(positions, config.seed, plan.min_patches, plan.max_patches)
    batch = _stacked([image_arrays(image[:, ::-1] if flip else image, plan, budget)
                      for image, flip, budget in zip(images, flips, budgets)])
    batch["label"] = np.array(labels, np.int32)
    ids = np.array(ids, np.int64)
    if plan.mode == "padded":
        return dict(batch, id=ids)
    sequences = plan.train_shapes(len(ids))["pixel_values"][0][0]  # this host's share
    arrays = native_input.packed_arrays(batch["pixel_values"], batch["spatial_shapes"],
                                        batch["label"], plan, sequences)
    index = arrays["image_index"]
    return dict({name: arrays[name] for name in native_input.PACKED},
                id=np.where(index >= 0, ids[np.maximum(index, 0)], -1))


def eval_images(images, ids, plan, padding):
    """The native arrays of a share of an evaluation batch: each image (encoded or an array;
    record `ids` name a bad one) alone at the whole budget, then `padding` blank examples."""
    examples = [image_arrays(grain_pipeline.decode(image, record), plan)
                for image, record in zip(images, ids)]
    return _stacked(examples + [blank(plan)] * padding)

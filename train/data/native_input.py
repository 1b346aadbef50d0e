"""Images at their own aspect ratios (keras_vit.native, NaFlex) in the input pipelines, as
`config.native` asks: "none" (every image resized to the square `config.image_size`), "padded"
(each image within a budget of `config.native_patches` patches at its own aspect ratio, one per
sequence) or "packed" (several such images in each sequence: NaViT, Dehghani et al., "Patch n'
Pack", 2023).

A step still takes `config.batch_size` images, so the stream of images, its order, its
augmentation and a resume are those of the square pipeline; packing only changes how a batch's
images lie in the model's sequences: `config.pack_sequences` sequences of
`config.pack_sequence_length` patches, at most `config.pack_images` images each, filled in order
(first fit). An image that fits no sequence of its batch is left out of the step's loss (its
weight 0). `config.native_min_patches` below `native_patches` draws each training image's budget
from that range (NaViT's and FlexiViT's resolution sampling), from the image's seed; evaluation
images take the whole budget, one per sequence.
"""

import dataclasses

import numpy as np

MODES = ("none", "padded", "packed")
# A packed batch's arrays, in the order tf_native's `tf.numpy_function` returns them.
PACKED = ("pixel_values", "segment_ids", "patch_coords", "spatial_shapes", "label",
          "label_weight")

RULES = {
    "native": ("choice", MODES),
    "native_patches": ("int", (0, None)),  # 0: the model's own grid, (image_size / patch)^2
    "native_min_patches": ("int", (0, None)),  # 0: native_patches (no resolution sampling)
    "pack_sequence_length": ("int", (0, None)),  # 0: 4 x native_patches
    "pack_images": ("int", (1, None)),
    "pack_sequences": ("int", (0, None)),  # 0: the padding's tokens, batch_size x patches / length
}
FIELDS = tuple(RULES)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a run's images become the model's sequences (`plan(config, patch_size,
    grid_patches)`)."""

    mode: str  # "padded" or "packed"
    patch_size: int
    max_patches: int
    min_patches: int
    sequence_length: int  # packed: patches per sequence
    images_per_sequence: int  # packed: slots per sequence
    sequences: int  # packed: sequences per global step
    global_images: int  # images per global step (config.batch_size)

    @property
    def patch_width(self):
        return self.patch_size * self.patch_size * 3

    def train_shapes(self, images):
        """`{name: (shape, dtype)}` of a training batch of `images` images (a share of a
        global batch: its sequences are the same share of `sequences`)."""
        if self.mode == "padded":
            return padded_shapes(images, self.max_patches, self.patch_width)
        share = self.sequences * images // self.global_images
        slots = (share, self.images_per_sequence)
        return {"pixel_values": ((share, self.sequence_length, self.patch_width), "float32"),
                "segment_ids": ((share, self.sequence_length), "int32"),
                "patch_coords": ((share, self.sequence_length, 2), "int32"),
                "spatial_shapes": (slots + (2,), "int32"),
                "label": (slots, "int32"), "label_weight": (slots, "float32")}


def packed_arrays(patches, grids, labels, plan, sequences):
    """A batch's images packed into `sequences` sequences of the `plan`, first fit, by
    `keras_vit.native.pack_patches` (the one packer of both pipelines): `patches` `[images,
    max_patches, P * P * 3]` (each image's padded), their `grids` `[images, 2]` and `labels`
    `[images]` to the arrays of `PACKED` and `image_index` (which image each slot holds, -1
    none); an empty slot's label is 0 and its `label_weight` 0."""
    from keras_vit import native

    arrays = native.pack_patches(list(patches), grids, plan.sequence_length,
                                 plan.images_per_sequence, sequences)
    index = arrays["image_index"]
    arrays["label"] = np.where(index >= 0, np.asarray(labels)[np.maximum(index, 0)],
                               0).astype(np.int32)
    arrays["label_weight"] = (index >= 0).astype(np.float32)
    return arrays


def padded_shapes(images, patches, width):
    """`{name: (shape, dtype)}` of a batch of `images` images, one per sequence of `patches`."""
    return {"pixel_values": ((images, patches, width), "float32"),
            "pixel_attention_mask": ((images, patches), "int32"),
            "spatial_shapes": ((images, 2), "int32"), "label": ((images,), "int32")}


def plan(config, patch_size, grid_patches):
    """The `Plan` of `config` for a model of `patch_size`-pixel patches on a learned grid of
    `grid_patches`, or None for config.native "none"."""
    if config.native == "none":
        return None
    max_patches = config.native_patches or grid_patches
    length = config.pack_sequence_length or 4 * max_patches
    sequences = config.pack_sequences or max(1, config.batch_size * max_patches // length)
    return Plan(mode=config.native, patch_size=patch_size, max_patches=max_patches,
                min_patches=config.native_min_patches or max_patches, sequence_length=length,
                images_per_sequence=config.pack_images, sequences=sequences,
                global_images=config.batch_size)


def check(config, report, spec):
    """Adds to `report` (train.run.config_checks) what native resolution needs of the other
    fields and of the model `spec`."""
    if not report.ok("native") or config.native == "none":
        return
    from keras_vit.native.model import unsupported

    problem = unsupported(spec)
    if problem:
        report.add("native", f"config.native={config.native!r}",
                   f"runs models whose patches are embedded one by one at the stem, but the "
                   f"model has {problem}")
    if config.native == "packed" and spec.num_prefix_tokens:
        report.add("native", f"config.native={config.native!r}",
                   "packs several images in a sequence, so the model can have no prefix tokens "
                   "(one set per sequence): set config.model.class_token=False with "
                   "classifier 'gap' or 'map', and no registers or distillation token")
    for field, bad, why in (
            ("objective", config.objective != "classification", "trains classifiers"),
            ("distill", config.distill != "none", "has no teacher input yet"),
            ("mixup_alpha", bool(config.get("mixup_alpha")), "mixes no images"),
            ("cutmix_alpha", bool(config.cutmix_alpha), "cuts no images"),
            ("randaugment_layers", bool(config.get("randaugment_layers")),
             "runs no RandAugment"),
            ("augment", config.augment != "none", "takes no AugReg level (RandAugment, Mixup)"),
            ("random_erasing", bool(config.random_erasing), "erases no boxes")):
        if bad and report.ok(field):
            report.add(field, f"config.{field}={config[field]!r}",
                       f"config.native={config.native!r} {why}: leave config.{field} at its "
                       "default or set config.native='none'")
    _check_budgets(config, report)


def _check_budgets(config, report):
    if not report.ok("native_patches", "native_min_patches", "pack_sequence_length"):
        return
    most = config.native_patches
    if most and config.native_min_patches > most:
        report.add("native_min_patches", f"config.native_min_patches="
                   f"{config.native_min_patches}", f"is above config.native_patches={most}: "
                   "each image's budget is drawn from [native_min_patches, native_patches]")
    if config.native == "packed" and most and config.pack_sequence_length and (
            config.pack_sequence_length < most):
        report.add("pack_sequence_length", f"config.pack_sequence_length="
                   f"{config.pack_sequence_length}", f"is shorter than config.native_patches="
                   f"{most}: an image of the whole budget would fit no sequence")

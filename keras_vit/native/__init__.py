"""Native resolution: images at their own aspect ratios within a budget of patches (NaFlex).

    arrays = keras_vit.native.prepare(images, patch_size=16, max_num_patches=256)
    naflex = keras_vit.native.NaFlexViT(model)   # the same weights
    features = naflex(arrays)
    packed = keras_vit.native.pack(images, 16, 256, sequence_length=1024, max_images=8)
    per_slot = naflex(packed)                    # [sequences, 8, ...]: one per packed image

`processor` turns images of any sizes into the arrays (`image_size_for_budget` is the resize
both libraries agree on), `positions` places each patch, `model` runs a keras_vit model on them.
"""

from keras_vit.native.model import NaFlexViT
from keras_vit.native.processor import (image_patches, image_patches_tf, image_size_for_budget,
                                        image_sizes_for_budget_tf, pack, pack_patches, prepare)

__all__ = ["NaFlexViT", "image_patches", "image_patches_tf", "image_size_for_budget",
           "image_sizes_for_budget_tf", "pack", "pack_patches", "prepare"]

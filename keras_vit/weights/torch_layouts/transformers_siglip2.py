"""transformers' SigLIP 2 vision tower (Tschannen et al., "SigLIP 2", 2025): `Siglip2VisionModel`
and the `vision_model.` of a whole `Siglip2Model`, the NaFlex models that see each image at its
own aspect ratio (`keras_vit.native.NaFlexViT`).

Its weights are SigLIP's (`transformers_siglip`) but for two things: the patch embedding is a
Linear of each flattened (P, P, C) patch, not a convolution, and the config gives the learned
grid as `num_patches` (a square), not an image size. So reading turns the files into
`SiglipVisionModel`'s, and writing turns those back.
"""

import math

import numpy as np

from keras_vit.weights.torch_layouts import transformers_common
from keras_vit.weights.torch_layouts.common import LayoutError, tensor
from keras_vit.weights.torch_layouts.family import Family

CLASSES = {"Siglip2VisionModel": ""}
MODEL_TYPES = {"siglip2_vision_model": "Siglip2VisionModel", "siglip2": "Siglip2Model"}
_PATCHES = "embeddings.patch_embedding.weight"


def _grid_side(num_patches):
    side = math.isqrt(int(num_patches))
    if side * side != num_patches:
        raise LayoutError(f"config.json has num_patches {num_patches}, not a square: SigLIP 2 "
                          "keeps a square grid of position embeddings.")
    return side


def as_siglip(config, state):
    """`(config, state)` of a `Siglip2VisionModel` as `SiglipVisionModel`'s: the image size of
    its grid of `num_patches`, the patch Linear `[D, P * P * C]` as a convolution `[D, C, P,
    P]`."""
    patch = config.get("patch_size", 16)
    side = _grid_side(config.get("num_patches", 256))
    linear = np.asarray(tensor(state, _PATCHES, "transformers"))
    if linear.ndim != 2 or linear.shape[1] % (patch * patch):
        raise LayoutError(f"{_PATCHES} has shape {linear.shape}; SigLIP 2's is [hidden, "
                          f"{patch}*{patch}*channels] for patch_size {patch}.")
    conv = linear.reshape(linear.shape[0], patch, patch, -1).transpose(0, 3, 1, 2)
    config = {**config, "model_type": "siglip_vision_model",
              "architectures": ["SiglipVisionModel"], "image_size": side * patch}
    config.pop("num_patches", None)
    return config, {**state, _PATCHES: conv}


def from_siglip(config, state):
    """The inverse of `as_siglip`: `SiglipVisionModel`'s files as `Siglip2VisionModel`'s."""
    patch, image_size = config["patch_size"], config.pop("image_size")
    config = {**config, "model_type": "siglip2_vision_model",
              "architectures": ["Siglip2VisionModel"],
              "num_patches": (image_size // patch) ** 2}
    conv = state[_PATCHES]
    linear = np.ascontiguousarray(conv.transpose(0, 2, 3, 1).reshape(conv.shape[0], -1))
    return config, {**state, _PATCHES: linear}


def processor_config(config):
    """transformers' `Siglip2ImageProcessor` for a `Siglip2VisionModel` config: each image
    resized (bilinear) within a budget of as many patches as the learned grid has, scaled to
    [-1, 1], as `keras_vit.native.prepare` does."""
    return {"image_processor_type": "Siglip2ImageProcessor", "patch_size": config["patch_size"],
            "max_num_patches": config["num_patches"], "do_resize": True, "resample": 2,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def vision_tower(config, state, projection):
    """A SigLIP 2 model's files (a whole `Siglip2Model`'s vision tower first) as SigLIP's."""
    if config.get("model_type") == "siglip2":
        config, state = transformers_common.vision_model(config, state, "Siglip2VisionModel")
    if config.get("model_type") != "siglip2_vision_model":
        return None
    return as_siglip(config, state)


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of SigLIP 2's vision `config.json` (read as SigLIP's)."""
    return transformers_common.siglip_spec(*as_siglip(config, state))


FAMILY = Family(name="SigLIP 2", library="transformers", classes=CLASSES, model_types=MODEL_TYPES,
                vision_tower=vision_tower, spec_from_config=spec_from_config, native=True)

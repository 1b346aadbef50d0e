"""The ViT weight layouts of PyTorch's two libraries, Hugging Face transformers
(`transformers_layout`) and timm (`timm_layout`, its Eva class in `eva_layout`), as maps to
and from the original `.npz` layout (`keras_vit.checkpoint`), and their `config.json` to and
from a `ViTConfig`; what they share is in `common` (and timm's classes' in `timm_common`).
Pure NumPy: no torch is needed to read or write them.
"""

from keras_vit.torch_layouts import transformers_layout, timm_layout
from keras_vit.torch_layouts.common import LayoutError
from keras_vit.torch_layouts.timm_common import timm_architectures
from keras_vit.torch_layouts.timm_layout import TIMM_CLASSES, spec_from_timm, timm_config
from keras_vit.torch_layouts.transformers_layout import ARCHITECTURES as TRANSFORMERS_ARCHITECTURES
from keras_vit.torch_layouts.transformers_layout import (spec_from_transformers,
                                                         transformers_config, vision_tower)

__all__ = ["FORMATS", "LayoutError", "TIMM_CLASSES", "TRANSFORMERS_ARCHITECTURES", "detect",
           "from_npz_arrays", "spec_from_timm", "spec_from_transformers", "timm_architectures",
           "timm_config", "to_npz_arrays", "transformers_config", "vision_tower"]

FORMATS = ("transformers", "timm")


def detect(config):
    """"transformers" or "timm": which library wrote this `config.json`."""
    if config.get("model_type") in transformers_layout.MODEL_TYPES:
        return "transformers"
    if "architecture" in config:
        return "timm"
    model_type = config.get("model_type") or config.get("architectures")
    raise LayoutError(
        f"config.json is neither transformers' ViT, DeiT, DINOv2, DINOv3, CLIP, SigLIP, ViT-MSN "
        f"nor ViT-MAE (model_type "
        f"{', '.join(repr(name) for name in transformers_layout.MODEL_TYPES)}) nor timm's (an "
        f"'architecture' field); it describes {model_type!r}. keras_vit reads those, and the "
        "original .npz checkpoints.")


def to_npz_arrays(state, spec, layout, config=None):
    """Their state dict (name -> array) as the `.npz` layout `checkpoint.load_npz` reads.
    Every tensor must be used and every expected one present: a LayoutError names the rest.
    `config`, the checkpoint's config.json, says how timm's Eva lays out RoPE's channels
    (None: as keras_vit does)."""
    if _library(layout) is timm_layout:
        return timm_layout.to_npz_arrays(state, spec, config)
    return transformers_layout.to_npz_arrays(state, spec)


def from_npz_arrays(arrays, spec, layout):
    """The `.npz` layout (`checkpoint.model_arrays`) as their state dict."""
    return _library(layout).from_npz_arrays(arrays, spec)


def _library(layout):
    if layout not in FORMATS:
        raise ValueError(f"layout must be one of {FORMATS}, got {layout!r}.")
    return timm_layout if layout == "timm" else transformers_layout

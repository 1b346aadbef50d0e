"""keras_vit: the Vision Transformer (Dosovitskiy et al., 2021) for Keras 3.

    import keras_vit
    model = keras_vit.ViT_B16()                      # 224x224, 1000 classes
    model = keras_vit.vit("R50+B/16", num_classes=37)
    spec = keras_vit.ViTConfig.from_variant("S/16", image_size=384)   # the same, as data
    keras_vit.set_execution(model, remat="blocks")   # how it runs, not what it computes

`import keras_vit` loads the architecture spec, the layers and the model (and registers the
layers for `keras.models.load_model`); the tools load on first use (PEP 562): `analysis`,
`checkpoint`, `export`, `fileio`, `flops`, `hub` (`from_pretrained`, `save_pretrained`),
`lora`, `npz_architecture`, `plotting`, `pretrained`, `resample`, `serving`.
"""

import importlib

from keras_vit import layers, masked_patches, resnet  # noqa: F401  (registered for loading)
from keras_vit.builders import *  # noqa: F401,F403  (ViT_B16, ...: one per VARIANT_NAMES)
from keras_vit.execution import Execution, set_execution
from keras_vit.masked_patches import MaskedPatchPredictor
from keras_vit.intermediates import attention_model, features
from keras_vit.model import distillation_heads, vit
from keras_vit.preprocessing import EvalPreprocessing, prepare_images, preprocess_inputs
from keras_vit.spec import ViTConfig, parse_variant
from keras_vit.variants import VARIANT_NAMES

__version__ = "0.1.0"

_LAZY_MODULES = ("analysis", "checkpoint", "export", "fileio", "flops", "hub", "lora",
                 "npz_architecture", "plotting", "pretrained", "resample", "serving")
_LAZY_FUNCTIONS = {"from_pretrained": "hub", "save_pretrained": "hub"}  # name -> its module


def __getattr__(name):
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_FUNCTIONS:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_FUNCTIONS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_FUNCTIONS))

"""keras_vit: the Vision Transformer (Dosovitskiy et al., 2021) for Keras 3.

    import keras_vit
    model = keras_vit.ViT_B16()                      # 224x224, 1000 classes
    model = keras_vit.vit("R50+B/16", num_classes=37)
    spec = keras_vit.ViTConfig.from_variant("S/16", image_size=384)   # the same, as data
    keras_vit.set_execution(model, remat="blocks")   # how it runs, not what it computes

`import keras_vit` loads the architecture, the layers and the model (and registers the layers for
`keras.models.load_model`); the rest loads on first use (PEP 562). The package's rooms:
`architecture` (the spec, its rules, the variants, how a model runs), `layers`, the model
(`model`, `intermediates`, `masked_patches`, `lora`, `scanned_blocks`, `preprocessing`),
`weights` (`.npz` checkpoints, published names, transformers' and timm's files), `deploy`
(the SavedModel, TFLite, serving), `native` (images at their own aspect ratios, NaFlex) and
`analysis` (what a model attends to, its figures, its
FLOPs). The paths from before the rooms (`keras_vit.checkpoint`, `keras_vit.export`, ...) are
the same modules under their old names (`keras_vit.imports`).
"""

import importlib

from keras_vit import imports

imports.install()  # before anything imports an old path

from keras_vit import layers, masked_patches  # noqa: E402,F401  (registered for loading)
from keras_vit.builders import *  # noqa: E402,F401,F403  (ViT_B16, ...)
from keras_vit.architecture.execution import Execution, set_execution  # noqa: E402
from keras_vit.architecture.spec import ViTConfig, parse_variant  # noqa: E402
from keras_vit.architecture.variants import VARIANT_NAMES  # noqa: E402
from keras_vit.intermediates import attention_model, features  # noqa: E402
from keras_vit.masked_patches import MaskedPatchPredictor  # noqa: E402
from keras_vit.model import distillation_heads  # noqa: E402
from keras_vit.preprocessing import (EvalPreprocessing, prepare_images,  # noqa: E402
                                     preprocess_inputs)

__version__ = "0.1.0"

# The rooms and modules that load on first use, and the old paths (`imports.MOVED`).
_LAZY_MODULES = ("analysis", "architecture", "deploy", "fileio", "lora", "native", "weights",
                 *imports.MOVED)
_LAZY_FUNCTIONS = {"from_pretrained": "weights.hub", "save_pretrained": "weights.hub"}


def __getattr__(name):
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_FUNCTIONS:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_FUNCTIONS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_FUNCTIONS))

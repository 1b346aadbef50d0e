"""keras_vit: the Vision Transformer (Dosovitskiy et al., 2021) for Keras 3.

    import keras_vit
    model = keras_vit.ViT_B16()                      # 224x224, 1000 classes
    model = keras_vit.vit("R50+B/16", num_classes=37)
"""

from keras_vit import (analysis, checkpoint, export, flops, layers, masked_patches, plotting,
                       pretrained, resnet, serving)
from keras_vit.builders import *  # noqa: F401,F403  (ViT_B16, ...: one per VARIANT_NAMES)
from keras_vit.masked_patches import MaskedPatchPredictor
from keras_vit.model import attention_model, vit
from keras_vit.preprocessing import preprocess_inputs
from keras_vit.variants import VARIANT_NAMES, parse_variant

__version__ = "0.1.0"

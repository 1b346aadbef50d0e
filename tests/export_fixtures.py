"""Shared by the export and serving tests: a tiny ViT whose outputs are not trivial, and its
Keras logits on 0..255 pixels (what an exported model must reproduce)."""

import numpy as np

import keras_vit
from model_fixtures import TINY_VIT, randomise

NUM_CLASSES = 7
SIZE = 32


def tiny_vit(seed=0, num_classes=NUM_CLASSES):
    """A 2-block ViT on 32x32 images with every variable set to N(0, 0.3) noise (the head is
    zero-initialised, which would make every output trivial)."""
    model = keras_vit.vit("B/16", image_size=SIZE, patch_size=8, num_classes=num_classes,
                          **TINY_VIT)
    randomise(model, seed=seed, scale=0.3)
    return model


def keras_logits(model, pixels):
    """The Keras model's logits on pixels in 0..255 (array or tensor) at the model's size."""
    pixels = np.asarray(pixels, np.float32)
    return np.asarray(model((pixels - 127.5) / 127.5, training=False), np.float64)


# The start of the server scripts the serving tests run in a subprocess: like TF Serving, the
# server must load the SavedModel without keras_vit (or train) to import.
WITHOUT_KERAS_VIT = r'''
import importlib.abc, sys


class NoKerasVit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("keras_vit", "train"):
            raise ImportError(f"the server must not import {name}")
        return None


sys.meta_path.insert(0, NoKerasVit())
'''

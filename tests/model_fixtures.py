"""Shared by the model tests: the tiny ViT's size, `randomise` and `random_tiny_vit`."""

import numpy as np

# Width 24 (3 heads of 8), MLP 48, 2 blocks: small enough for fast tests, with several heads
# and blocks. Tests add image_size, patch_size and num_classes, or override num_layers.
TINY_VIT = dict(hidden_size=24, mlp_dim=48, num_heads=3, num_layers=2)


def randomise(layer, seed=1, scale=0.3):
    """Gives every weight of `layer` (or model) N(0, scale) values, so that zero initialisations
    (head, class token, the last GroupNorm of a unit) cannot hide bugs."""
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.normal(0.0, scale, size=tuple(variable.shape)).astype(variable.dtype))


def random_tiny_vit(**fields):
    """A TINY_VIT classifier of 32 px in 8-pixel patches and 5 classes (`fields` change any
    of that), its weights random (`randomise`)."""
    import keras_vit

    model = keras_vit.vit("Ti/16", **{**TINY_VIT, "image_size": 32, "patch_size": 8,
                                      "num_classes": 5, **fields})
    randomise(model)
    return model

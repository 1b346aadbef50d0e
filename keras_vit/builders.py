"""The one-line builders: `vit(variant, weights=..., **fields)`, and one per entry of
`keras_vit.VARIANT_NAMES`: `ViT_B16(**kwargs)` is `vit("B/16", **kwargs)`. Plain functions, so
that a reader, an IDE and a type checker find them; `tests/library/architecture/test_spec.py`
checks that they and the table name the same variants. Parameter counts are at 224x224 with 1000
classes (pinned by `tests/library/architecture/test_variants.py`).
"""

import os

from keras_vit.architecture.variants import _describe
from keras_vit.model import build


def vit(variant="B/16", *, weights=None, dtype=None, name=None, attention_impl="auto",
        remat="none", **fields):
    """Builds a Vision Transformer from a variant name or a `keras_vit.ViTConfig`.

        keras_vit.vit("B/16", num_classes=10, image_size=384)
        keras_vit.vit(keras_vit.ViTConfig.from_variant("R50+B/16"), weights="imagenet21k")

    Args:
        variant: a name from `keras_vit.VARIANT_NAMES` ("B/16", "L/32", "R50+B/16", or
            "Axial-" before a plain ViT name), or a `ViTConfig`.
        weights: None (random initialisation), or an original `.npz` checkpoint to load:
            a published name (see `keras_vit.weights.pretrained.PUBLISHED`, e.g.
            "imagenet21k"), a local path, an https/file URL or a gs:// path. Position
            embeddings are resized to `image_size`; the head starts from zeros when
            `num_classes` differs from the checkpoint's.
        dtype: a Keras dtype policy such as "float32" or "mixed_bfloat16"; None takes the
            global policy. Outputs are float32 under mixed policies.
        name: model name; defaults to e.g. "vit_b16".
        attention_impl, remat: how the model runs (`keras_vit.Execution`: fused or
            explicit attention, rematerialised blocks in training), not what it computes: the
            model's `execution`, which `keras_vit.set_execution` changes later and its files
            do not hold.
        **fields: any field of `keras_vit.ViTConfig` (each described there), changing the
            spec, e.g. `image_size=384, num_classes=10`. Every value is checked, and every
            problem reported at once, before any layer is built. A `patch_size` other than
            the checkpoint's resizes its patch-embedding kernel (FlexiViT's pseudo-inverse
            resize).

    Returns:
        A `keras.Model` mapping images `[batch, height, width, 3]` scaled to [-1, 1]
        (see `keras_vit.preprocess_inputs`; of `image_size`, or of any size with
        `dynamic_image_size=True`) to logits `[batch, num_classes]` (or the pooled
        representation with `include_top=False`); its `spec` is the `ViTConfig` it was built
        from.
    """
    _check_weights(weights)  # with the other arguments, before any layer is built
    model = build(variant, dtype=dtype, name=name, attention_impl=attention_impl, remat=remat,
                  **fields)
    if weights is not None:  # (the weights' modules load on first use)
        from keras_vit.weights import checkpoint, pretrained

        checkpoint.load_npz(model, pretrained.resolve_weights(weights, model.spec.variant))
    return model


def _check_weights(weights):
    if weights is not None and not isinstance(weights, (str, os.PathLike)):
        from keras_vit.weights import pretrained

        raise TypeError(
            "weights must be None, a published name (one of "
            f"{sorted(pretrained.PUBLISHED)}), a file path, a URL or a gs:// path, "
            f"got {_describe(weights)}.")


def ViT_Ti16(**kwargs):
    """ViT Ti/16 (5,717,416 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("Ti/16", **kwargs)


def ViT_S16(**kwargs):
    """ViT S/16 (22,050,664 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("S/16", **kwargs)


def ViT_S32(**kwargs):
    """ViT S/32 (22,878,952 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("S/32", **kwargs)


def ViT_B8(**kwargs):
    """ViT B/8 (86,576,872 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("B/8", **kwargs)


def ViT_B16(**kwargs):
    """ViT B/16 (86,567,656 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("B/16", **kwargs)


def ViT_B32(**kwargs):
    """ViT B/32 (88,224,232 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("B/32", **kwargs)


def ViT_L16(**kwargs):
    """ViT L/16 (304,326,632 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("L/16", **kwargs)


def ViT_L32(**kwargs):
    """ViT L/32 (306,535,400 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("L/32", **kwargs)


def ViT_H14(**kwargs):
    """ViT H/14 (632,045,800 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("H/14", **kwargs)


def R_ViT_Ti16(**kwargs):
    """ViT R+Ti/16 (6,337,704 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("R+Ti/16", **kwargs)


def R26_ViT_S32(**kwargs):
    """ViT R26+S/32 (36,431,912 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("R26+S/32", **kwargs)


def R50_ViT_B16(**kwargs):
    """ViT R50+B/16 (98,659,112 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("R50+B/16", **kwargs)


def R50_ViT_L32(**kwargs):
    """ViT R50+L/32 (328,994,856 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("R50+L/32", **kwargs)


def Axial_ViT_B16(**kwargs):
    """ViT Axial-B/16 (171,620,584 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("Axial-B/16", **kwargs)


def Axial_ViT_B32(**kwargs):
    """ViT Axial-B/32 (173,277,160 parameters); keyword arguments as `keras_vit.vit`."""
    return vit("Axial-B/32", **kwargs)


# What `from keras_vit.builders import *` (keras_vit's own namespace) takes.
__all__ = [
    "vit",
    "ViT_Ti16",
    "ViT_S16",
    "ViT_S32",
    "ViT_B8",
    "ViT_B16",
    "ViT_B32",
    "ViT_L16",
    "ViT_L32",
    "ViT_H14",
    "R_ViT_Ti16",
    "R26_ViT_S32",
    "R50_ViT_B16",
    "R50_ViT_L32",
    "Axial_ViT_B16",
    "Axial_ViT_B32",
]

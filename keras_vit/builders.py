"""One builder per entry of `keras_vit.VARIANT_NAMES`: `ViT_B16(**kwargs)` is
`vit("B/16", **kwargs)`. Plain functions, so that a reader, an IDE and a type checker find them;
`tests/test_variants.py` checks that they and the table name the same variants. Parameter counts
are at 224x224 with 1000 classes (pinned by that test file).
"""

from keras_vit.model import vit


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


__all__ = [
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

"""One builder function per released variant, e.g. `ViT_B16(**kwargs) == vit("B/16", **kwargs)`."""

from keras_vit.model import vit


def _builder(variant, function_name):
    def build(*args, **kwargs):
        if args:
            raise TypeError(
                f"{function_name}() takes keyword arguments only (e.g. image_size=224, "
                f"num_classes=10), got {len(args)} positional: {args!r}.")
        return vit(variant, **kwargs)

    build.__name__ = build.__qualname__ = function_name
    build.__doc__ = f"Builds ViT {variant}; takes the keyword arguments of `keras_vit.vit`."
    return build


ViT_Ti16 = _builder("Ti/16", "ViT_Ti16")
ViT_S16 = _builder("S/16", "ViT_S16")
ViT_S32 = _builder("S/32", "ViT_S32")
ViT_B8 = _builder("B/8", "ViT_B8")
ViT_B16 = _builder("B/16", "ViT_B16")
ViT_B32 = _builder("B/32", "ViT_B32")
ViT_L16 = _builder("L/16", "ViT_L16")
ViT_L32 = _builder("L/32", "ViT_L32")
ViT_H14 = _builder("H/14", "ViT_H14")
R_ViT_Ti16 = _builder("R+Ti/16", "R_ViT_Ti16")
R26_ViT_S32 = _builder("R26+S/32", "R26_ViT_S32")
R50_ViT_B16 = _builder("R50+B/16", "R50_ViT_B16")
R50_ViT_L32 = _builder("R50+L/32", "R50_ViT_L32")
Axial_ViT_B16 = _builder("Axial-B/16", "Axial_ViT_B16")
Axial_ViT_B32 = _builder("Axial-B/32", "Axial_ViT_B32")

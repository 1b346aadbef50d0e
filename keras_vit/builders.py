"""One builder function per entry of `VARIANT_NAMES`, e.g. `ViT_B16(**kwargs) == vit("B/16",
**kwargs)`. Made from the table, so a variant added there gets its builder (and its place in
`keras_vit`) with no second list to keep in step."""

from keras_vit.model import vit
from keras_vit.variants import VARIANT_NAMES


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


__all__ = list(VARIANT_NAMES.values())  # ViT_Ti16, ..., Axial_ViT_B32
globals().update({name: _builder(variant, name) for variant, name in VARIANT_NAMES.items()})

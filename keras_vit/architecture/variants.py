"""The table of ViT variants and the parser for names such as "B/16", "R50+B/16" or "Axial-B/16".

Variants are data: a transformer size from `TRANSFORMER_SIZES`, a patch size, for the hybrids a
ResNet from `RESNET_STAGES`, and for Axial-ViT (paper appendix D.6) the "Axial-" prefix.
`variant_table_row` decodes a name; `keras_vit.ViTConfig.from_variant` (or `parse_variant`) makes
it a full spec.
Pure Python, like the spec: no Keras.
"""

import math
import numbers
import re

# name: (hidden_size, mlp_dim, num_heads, num_layers)
TRANSFORMER_SIZES = {
    "Ti": (192, 768, 3, 12),
    "S": (384, 1536, 6, 12),
    "B": (768, 3072, 12, 12),
    "L": (1024, 4096, 16, 24),
    "H": (1280, 5120, 16, 32),
}
# Dropout of the upstream configurations; every other variant uses none.
UPSTREAM_DROPOUT = {"L/16": 0.1, "H/14": 0.1}

# ResNet prefix: (units per stage, patch size on the ResNet feature map or None for "1"). A
# "<prefix>+<size>" entry replaces the prefix's for that transformer size.
RESNET_STAGES = {
    "R": ((), 8),  # stem only, 8x8 patches of the stride-4 feature map
    "R26": ((2, 2, 2, 2), None),
    "R50": ((3, 4, 9), None),  # stage 4 removed, its blocks moved into stage 3 (R50+B/16)
    "R50+L": ((3, 4, 6, 3), None),  # R50+L/32 keeps the four standard stages of ResNet-50
}
# The fields of a variant that `vit()` (and a training config) may override.
OVERRIDABLE_FIELDS = ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")

# Every name the package builds, with the name of its builder function.
VARIANT_NAMES = {
    "Ti/16": "ViT_Ti16",
    "S/16": "ViT_S16",
    "S/32": "ViT_S32",
    "B/8": "ViT_B8",
    "B/16": "ViT_B16",
    "B/32": "ViT_B32",
    "L/16": "ViT_L16",
    "L/32": "ViT_L32",
    "H/14": "ViT_H14",
    "R+Ti/16": "R_ViT_Ti16",
    "R26+S/32": "R26_ViT_S32",
    "R50+B/16": "R50_ViT_B16",
    "R50+L/32": "R50_ViT_L32",
    # Axial-ViT (appendix D.6): the paper's two. "Axial-" also goes before any plain ViT name.
    "Axial-B/16": "Axial_ViT_B16",
    "Axial-B/32": "Axial_ViT_B32",
}
AXIAL_PREFIX = "Axial-"

# "Axial-" (optional), a ResNet prefix and "+" (optional), a transformer size, "/", a patch size.
_NAME_PATTERN = re.compile(r"^(Axial-)?(?:(R\d*)\+)?(%s)/(\d+)$" % "|".join(TRANSFORMER_SIZES))


def _describe(value):
    """`224.0 (float)`: the value and its type, for error messages."""
    return f"{value!r} ({type(value).__name__})"


def check_int(name, value, minimum=1, allow_none=False):
    """Returns `value` as a Python int after checking it is an integer >= `minimum`.

    Accepts Python and numpy integers (`np.int64(224)`); refuses bools, floats (also `224.0`)
    and strings with a `TypeError`, and values below `minimum` with a `ValueError`, each naming
    the argument and the value.
    """
    if value is None and allow_none:
        return None
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if allow_none:
        what += " or None"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {what}, got {_describe(value)}.")
    if value < minimum:
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    return int(value)


def check_rate(name, value, allow_none=False):
    """Returns `value` as a float after checking it is a real number in [0, 1)."""
    if value is None and allow_none:
        return None
    what = "a rate in [0, 1)" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {_describe(value)}.")
    if not 0.0 <= value < 1.0:  # also refuses NaN
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    return float(value)


def check_positive_number(name, value, allow_none=False):
    """Returns `value` as a float after checking it is a finite real number > 0 (Python or
    numpy); a `TypeError` for another type (a string, a bool), a `ValueError` for zero, a
    negative number, inf or NaN, each naming the argument and the value."""
    if value is None and allow_none:
        return None
    what = "a finite number > 0" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {_describe(value)}.")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    return float(value)


def check_choice(name, value, choices):
    """Returns `value` after checking it is one of the strings `choices`."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {tuple(choices)}, got {_describe(value)}.")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")
    return value


def check_bool(name, value):
    """Returns `value` as a bool after checking it is a Python or numpy bool."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise TypeError(f"{name} must be True or False, got {_describe(value)}.")
    return bool(value)


def variant_table_row(name):
    """What the tables say of a variant name such as "B/16" or "R50+B/16": a dict of its
    canonical `name`, the `OVERRIDABLE_FIELDS`, the upstream `dropout`, `resnet_units` (None
    for a plain ViT) and `axial`.

    Raises a `TypeError` for a non-string and a `ValueError` for an unknown name, each saying
    what is required and listing the valid names.
    """
    valid = (f"valid names: {', '.join(VARIANT_NAMES)}, and {AXIAL_PREFIX!r} before any plain "
             "ViT name (e.g. 'Axial-S/16')")
    if not isinstance(name, str):
        raise TypeError(f"must be a variant name such as 'B/16'; {valid}")
    name = name.strip()
    match = _NAME_PATTERN.match(name)
    plain = name.removeprefix(AXIAL_PREFIX)
    known = name in VARIANT_NAMES or (
        name.startswith(AXIAL_PREFIX) and plain in VARIANT_NAMES and "+" not in plain)
    if match is None or not known:
        raise ValueError(f"is not a ViT variant; {valid}")
    axial, resnet, size, patch = (match.group(1) is not None, match.group(2), match.group(3),
                                  int(match.group(4)))
    hidden, mlp, heads, layers = TRANSFORMER_SIZES[size]
    resnet_units = None
    if resnet is not None:
        resnet_units, hybrid_patch = RESNET_STAGES.get(f"{resnet}+{size}",
                                                       RESNET_STAGES[resnet])
        patch = hybrid_patch or 1
    return dict(name=name, patch_size=patch, hidden_size=hidden, mlp_dim=mlp, num_heads=heads,
                num_layers=layers, dropout=UPSTREAM_DROPOUT.get(plain, 0.0),
                resnet_units=resnet_units, axial=axial)

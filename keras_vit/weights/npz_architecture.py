"""The architecture of an original ViT `.npz` checkpoint, read from its tensors.

The files of the JAX release (github.com/google-research/vision_transformer:
`vit_jax/models_vit.py` builds the model they hold, `vit_jax/models_resnet.py` the hybrids'
ResNet) are arrays by Flax path and nothing else: `keras_vit.weights.checkpoint.save_npz` writes a
`ViTConfig` beside its own files, the paper's have none. Their names and shapes say the
architecture:

    embedding/kernel                    (p, p, C, D)  patch size p, width D; C is 3, or for a
                                                      hybrid the ResNet's output channels (and
                                                      p counts pixels of its feature map)
    Transformer/encoderblock_{i}/...    one set per block (either naming of their layers)
      MultiHeadDotProductAttention_1/query/kernel  (D, heads, D / heads)
      MlpBlock_3/Dense_0/kernel         (D, mlp_dim)
    Transformer/posembed_input/pos_embedding  (1, [1 +] rows * cols, D): a square grid assumed
    cls                                 present: classifier "token"; absent: "gap"
    pre_logits/kernel                   (D, representation_size); absent: none
    head/kernel                         (width, num_classes); absent: include_top=False
    conv_root/kernel, block{s}/unit{u}/...  a hybrid's ResNet stem and units per stage

What no tensor says is the original's: `models_vit.py` uses Flax's `nn.gelu` (tanh-approximate)
and `nn.LayerNorm` (epsilon 1e-6), and resizes position embeddings bilinearly.

    spec = spec_from_npz(keras_vit.weights.checkpoint.read_npz(path), path)

`keras_vit.from_pretrained(path)` does this for an `.npz` with no spec beside it.
"""

import logging
import math
import os
import re

from keras_vit.weights import checkpoint

from keras_vit.architecture import variants
from keras_vit.architecture.spec import ViTConfig

logger = logging.getLogger(__name__)

_BLOCK = "Transformer/encoderblock_{}/"
_QUERY = "MultiHeadDotProductAttention_1/query/kernel"
_MLP_IN = "MlpBlock_3/Dense_0/kernel"
_POSITIONS = "Transformer/posembed_input/pos_embedding"
_BLOCK_INDEX = re.compile(r"^Transformer/encoderblock_(\d+)/")
# A hybrid's ResNet units (models_resnet.py's ResidualUnit); load_npz checks their shapes.
_RESNET_UNIT = re.compile(r"^block(\d+)/unit(\d+)/"
                          r"(?:(?:conv[123]|conv_proj)/kernel|(?:gn[123]|gn_proj)/(?:scale|bias))$")
# Every name the original model has (models_vit.py), the hybrids' ResNet included.
_ORIGINAL_KEY = re.compile(
    r"^(?:(?:embedding|pre_logits|head)/(?:kernel|bias)|cls|conv_root/kernel|gn_root/(?:scale|bias)"
    r"|Transformer/(?:posembed_input/pos_embedding|encoder_norm/(?:scale|bias))"
    r"|Transformer/encoderblock_\d+/(?:LayerNorm_[02]/(?:scale|bias)"
    r"|MultiHeadDotProductAttention_1/(?:query|key|value|out)/(?:kernel|bias)"
    r"|MlpBlock_3/Dense_[01]/(?:kernel|bias)))$")
# The stem's channels: models_vit.py's 64 * width_factor, which is 1 in every released hybrid
# and in keras_vit's (model.py).
_RESNET_WIDTH = 64


def spec_from_npz(arrays, path="the arrays given"):
    """The `ViTConfig` of the original checkpoint `arrays` (as `checkpoint.read_npz` reads
    them) from its tensors' names and shapes, logged in one INFO line (`describe`). `path`
    names the file in that line (its base name) and in errors.

    Raises `CheckpointError` naming the file, what is missing or odd, and the fix, for
    arrays it cannot read an architecture from (no patch embedding, no blocks, a grid that is
    not square, tensors another model has).
    """
    is_path = isinstance(path, (str, os.PathLike))
    name = os.fspath(path) if is_path else path
    arrays = checkpoint._released_layout(arrays, name)
    foreign = sorted(key for key in arrays
                     if not (_ORIGINAL_KEY.match(key) or _RESNET_UNIT.match(key)))
    if foreign:  # first: they explain whatever else looks odd
        raise _unreadable(name, f"tensors the original ViT does not have: {_listed(foreign)}")
    patch, hidden = _patch_embedding(arrays, name)
    first = _BLOCK.format(0)
    sizes = dict(patch_size=patch, hidden_size=hidden,
                 mlp_dim=_axis(arrays, first + _MLP_IN, 1, 2, name),
                 num_heads=_axis(arrays, first + _QUERY, 1, 3, name),
                 num_layers=_num_layers(arrays, name))
    token = "cls" in arrays  # models_vit.py adds the class token only for classifier "token"
    grid = _grid(arrays, int(token), name)
    representation_size = _axis(arrays, "pre_logits/kernel", 1, 2, name, optional=True)
    num_classes = _axis(arrays, "head/kernel", 1, 2, name, optional=True)
    resnet_units = _resnet_units(arrays, name)
    variant = _variant_name(sizes, resnet_units, name)
    expected = _expected_shapes(sizes, token, grid, resnet_units, representation_size,
                                num_classes)
    _check_shapes(arrays, expected, resnet_units is not None, name)
    stride = 1 if resnet_units is None else 4 * 2 ** max(len(resnet_units) - 1, 0)
    try:
        spec = ViTConfig(
            variant=variant, **sizes,
            image_size=grid * patch * stride, classifier="token" if token else "gap",
            representation_size=representation_size, include_top=num_classes is not None,
            **({} if num_classes is None else {"num_classes": num_classes}),
            # What no tensor says: the original's numerics and resampling.
            activation="gelu_tanh", layer_norm_epsilon=1e-6,
            position_embedding_interpolation="bilinear")
    except (TypeError, ValueError) as error:  # e.g. sizes of 0
        raise _unreadable(name, f"its sizes make no ViT ({error})") from None
    logger.info("%s", describe(spec, os.path.basename(name) if is_path else name))
    return spec


def describe(spec, name):
    """The one line `spec_from_npz` logs, e.g. "Inferred ViT-B/16 from ViT-B_16.npz: 224 px
    images (14x14 patches), token classifier, pre-logits 768, 21843 classes"."""
    row = variants.variant_table_row(spec.variant)
    changed = ", ".join(f"{field} {getattr(spec, field)}" for field in variants.OVERRIDABLE_FIELDS
                        if getattr(spec, field) != row[field])
    rows, cols = spec.grid_size
    return (f"Inferred ViT-{spec.variant}{f' ({changed})' if changed else ''} from {name}: "
            f"{spec.image_size[0]} px images ({rows}x{cols} patches), {spec.classifier} "
            "classifier, " + (f"pre-logits {spec.representation_size}, "
                              if spec.representation_size else "no pre-logits, ")
            + (f"{spec.num_classes} classes" if spec.include_top else "no head"))


def _unreadable(name, what):
    """The error for a file whose architecture cannot be read: `what`, and the two fixes."""
    return checkpoint.CheckpointError(
        f"Cannot read the architecture of {name} from its tensors: {what}. Either write its "
        "spec beside it (keras_vit.weights.checkpoint.save_npz(model, path) from a model of its "
        "architecture), or build that model with keras_vit.vit(variant, ...) and load the file "
        "with keras_vit.weights.checkpoint.load_npz(model, path) (or weights=path).")


def _axis(arrays, key, axis, ndim, name, optional=False):
    """The size of `arrays[key]` along `axis`, after checking it has `ndim` axes; None for an
    absent `optional` key."""
    if key not in arrays:
        if optional:
            return None
        raise _unreadable(name, f"it has no {key}")
    shape = arrays[key].shape
    if len(shape) != ndim:
        raise _unreadable(name, f"{key} has shape {shape}, where the original has {ndim} axes")
    return int(shape[axis])


def _patch_embedding(arrays, name):
    """(patch size, width) from the patch embedding's kernel (p, p, C, D)."""
    if "embedding/kernel" not in arrays:
        raise _unreadable(name, "it has no embedding/kernel (the patch embedding, which says "
                          "the patch size and the width); it may not be a ViT checkpoint")
    shape = arrays["embedding/kernel"].shape
    if len(shape) != 4 or shape[0] != shape[1]:
        raise _unreadable(name, f"embedding/kernel has shape {shape}, not square patches "
                          "(p, p, channels, width)")
    return int(shape[0]), int(shape[3])


def _num_layers(arrays, name):
    """The number of encoder blocks: one more than the highest block index (a missing block
    below it shows as missing tensors in `_check_shapes`)."""
    indices = {int(match.group(1)) for match in map(_BLOCK_INDEX.match, arrays) if match}
    if not indices:
        raise _unreadable(name, "it has no Transformer/encoderblock_{i} tensors (the encoder "
                          "blocks)")
    return max(indices) + 1


def _grid(arrays, prefix, name):
    """The side of the square patch grid the position embeddings (1, prefix + side^2, D) hold."""
    length = _axis(arrays, _POSITIONS, 1, 3, name)
    patches = length - prefix
    side = math.isqrt(max(patches, 0))
    if patches <= 0 or side * side != patches:
        tokens = " after the class token's row" if prefix else ""
        raise _unreadable(
            name, f"{_POSITIONS} holds {patches} patch positions{tokens}, not a square grid, so "
            "the image size (height, width) is unknown")
    return side


def _resnet_units(arrays, name):
    """Units per stage of a hybrid's ResNet (`()` for the stem alone), None for a plain ViT."""
    if "conv_root/kernel" not in arrays:
        return None
    units = {}
    for match in map(_RESNET_UNIT.match, arrays):
        if match:
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    missing = sorted(set(range(1, max(units, default=0) + 1)) - set(units))
    if missing:
        raise _unreadable(name, f"its ResNet has no stage block{missing[0]} but later ones")
    return tuple(units[stage] for stage in sorted(units))


def _resnet_channels(resnet_units):
    """Channels of the ResNet's output: the stem's, or 4x the last stage's bottleneck width
    (each stage doubles it)."""
    if not resnet_units:
        return _RESNET_WIDTH
    return 4 * _RESNET_WIDTH * 2 ** (len(resnet_units) - 1)


def _expected_shapes(sizes, token, grid, resnet_units, representation_size, num_classes):
    """{key: shape} of every tensor but the ResNet units' in the original layout of a model of
    these sizes (attention stored per head, as `checkpoint._checkpoint_shape` says)."""
    hidden, heads, mlp = sizes["hidden_size"], sizes["num_heads"], sizes["mlp_dim"]
    patch, head_dim = sizes["patch_size"], hidden // max(heads, 1)
    channels = 3 if resnet_units is None else _resnet_channels(resnet_units)
    shapes = {"embedding/kernel": (patch, patch, channels, hidden), "embedding/bias": (hidden,),
              _POSITIONS: (1, int(token) + grid * grid, hidden),
              "Transformer/encoder_norm/scale": (hidden,),
              "Transformer/encoder_norm/bias": (hidden,)}
    if token:
        shapes["cls"] = (1, 1, hidden)
    if resnet_units is not None:
        shapes.update({"conv_root/kernel": (7, 7, 3, _RESNET_WIDTH),
                       "gn_root/scale": (_RESNET_WIDTH,), "gn_root/bias": (_RESNET_WIDTH,)})
    for index in range(sizes["num_layers"]):
        shapes.update(_block_shapes(_BLOCK.format(index), hidden, heads, head_dim, mlp))
    width = hidden
    if representation_size is not None:
        shapes.update({"pre_logits/kernel": (hidden, representation_size),
                       "pre_logits/bias": (representation_size,)})
        width = representation_size
    if num_classes is not None:
        shapes.update({"head/kernel": (width, num_classes), "head/bias": (num_classes,)})
    return shapes


def _block_shapes(block, hidden, heads, head_dim, mlp):
    """{key: shape} of one encoder block's tensors, `block` their prefix."""
    shapes = {}
    for norm in ("LayerNorm_0", "LayerNorm_2"):
        shapes.update({f"{block}{norm}/scale": (hidden,), f"{block}{norm}/bias": (hidden,)})
    attention = f"{block}MultiHeadDotProductAttention_1/"
    for projection in ("query", "key", "value"):
        shapes.update({f"{attention}{projection}/kernel": (hidden, heads, head_dim),
                       f"{attention}{projection}/bias": (heads, head_dim)})
    mlp_block = f"{block}MlpBlock_3/"
    shapes.update({f"{attention}out/kernel": (heads, head_dim, hidden),
                   f"{attention}out/bias": (hidden,),
                   f"{mlp_block}Dense_0/kernel": (hidden, mlp), f"{mlp_block}Dense_0/bias": (mlp,),
                   f"{mlp_block}Dense_1/kernel": (mlp, hidden),
                   f"{mlp_block}Dense_1/bias": (hidden,)})
    return shapes


def _check_shapes(arrays, expected, hybrid, name):
    """Raises `_unreadable` unless `arrays` are exactly the `expected` tensors (and, for a
    `hybrid`, ResNet units): a tensor missing, of another shape, or of another model
    (registers, another head, another ResNet) would build a model the file does not fit."""
    problems = []
    missing = sorted(set(expected) - set(arrays))
    if missing:
        problems.append(f"missing {_listed(missing)}")
    mismatched = [f"{key} {tuple(arrays[key].shape)} (expected {shape})"
                  for key, shape in expected.items()
                  if key in arrays and _squeezed(arrays[key].shape, key) != shape]
    if mismatched:
        problems.append(f"shapes that do not fit the others: {_listed(mismatched)}")
    unknown = sorted(key for key in set(arrays) - set(expected)
                     if not (hybrid and _RESNET_UNIT.match(key)))
    if unknown:
        problems.append(f"tensors the original ViT does not have: {_listed(unknown)}")
    if problems:
        raise _unreadable(name, "; ".join(problems))


def _squeezed(shape, key):
    """GroupNorm parameters of old hybrid files are stored as (1, 1, 1, C)."""
    if key.startswith("gn_root/") and len(shape) == 4 and shape[:3] == (1, 1, 1):
        return shape[3:]
    return tuple(shape)


def _listed(items, limit=5):
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more"
                                       if len(items) > limit else "")


def _variant_name(sizes, resnet_units, name):
    """The table's name of a variant with this ResNet (None: none) whose sizes match most of
    `sizes` (all of them when one does; ties: the table's order). The spec sets every size,
    so the name only names the model and the log line."""
    candidates = []
    for variant in variants.VARIANT_NAMES:
        row = variants.variant_table_row(variant)
        if row["resnet_units"] == resnet_units and not row["axial"]:
            matching = sum(row[field] == value for field, value in sizes.items())
            candidates.append((-matching, len(candidates), variant))
    if not candidates:
        hybrids = ", ".join(f"{variant} {variants.variant_table_row(variant)['resnet_units']}"
                            for variant in variants.VARIANT_NAMES if "+" in variant)
        raise _unreadable(name, f"its ResNet has {resnet_units} units per stage, and "
                          f"keras_vit's hybrids have {hybrids}")
    return min(candidates)[2]

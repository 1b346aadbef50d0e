"""What timm's ViT classes' checkpoints share: the table of its architectures and their
arguments, the sizes a state dict shows, the packing of a gated MLP, the `config.json`
keras_vit writes, the ratios its arguments take, and the choice of an architecture by its
LayerNorm epsilon."""

import functools
import json
import logging
import math
import os

from keras_vit.torch_layouts.common import LayoutError, tensor

logger = logging.getLogger(__name__)

# A packed SwiGLU (GluMlp's fc1: the gate's rows, then the value's: Eva's and VisionTransformer's
# SwiGLUPacked), as its unpacked names.
GLU_PACKED = ((r".*\.mlp", ".fc1.", ("fc1_g", "fc1_x")),)
# DINOv2's head, which none of timm's ViT classes has: their global_pool (timm.layers'
# global_pool_nlc, and attention pooling) takes one of these.
TOKEN_GAP = ("classifier='token_gap' (DINOv2's head on the class token beside the patch tokens' "
             "mean: timm's global_pool is 'token', 'avg', 'avgmax', 'max' or 'map'). Nothing was "
             "written. Save it with keras_vit.checkpoint.save_npz or model.save(...keras), or, "
             "for a model of learned position embeddings with LayerScale, with "
             "format='transformers' (its Dinov2ForImageClassification)")


@functools.cache
def timm_architectures():
    """timm's `vit_*`, `deit*` and `eva02*` architectures: name -> {"class", "args"}, the
    arguments each entry point passes beyond `VisionTransformer`'s defaults (for Eva's, marked
    `"defaults": "Eva"`, beyond `Eva`'s) (written by
    benchmarks/timm_coverage.py --write_table from timm itself). A checkpoint's `config.json`
    names its architecture but does not repeat these."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                        "timm_architectures.json")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["architectures"]


def sizes(state):
    """(width, patch size, blocks) of a timm ViT's weights: its patch kernel and block names."""
    kernel = tensor(state, "patch_embed.proj.weight", "timm")
    layers = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    return kernel.shape[0], kernel.shape[-1], layers


def whole_patches(image_size, patch, architecture):
    """timm's image size, less what its patch convolution drops (timm's SigLIP at 384 with
    14-pixel patches sees 378x378)."""
    sides = [image_size] * 2 if isinstance(image_size, int) else list(image_size)
    whole = [side // patch * patch for side in sides]
    if whole != sides:
        logger.warning(
            "timm's %s takes %sx%s images and its %d-pixel patches leave the last %s pixels "
            "unread; the keras_vit model takes %sx%s (crop those pixels away for timm's "
            "outputs).", architecture, *sides, patch,
            "x".join(str(a - b) for a, b in zip(sides, whole)), *whole)
    return whole


def config_file(spec, preprocessing, args, architecture):
    """timm's `config.json` of a model of `spec` built by `architecture` with `args` (its
    model_args), `preprocessing`'s resize and crop in its pretrained_cfg."""
    height, width = spec.image_size
    num_classes = spec.num_classes if spec.include_top else 0
    return {
        "architecture": architecture,
        "num_classes": num_classes, "num_features": spec.hidden_size,
        "global_pool": args["global_pool"], "model_args": args,
        "pretrained_cfg": {
            "input_size": [3, height, width], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
            "interpolation": preprocessing.interpolation,
            "crop_pct": preprocessing.crop_fraction, "crop_mode": preprocessing.crop_mode,
            "num_classes": num_classes},
    }


def mlp_ratio(spec):
    """timm's mlp_ratio r for mlp_dim: its blocks make int(width * r) units."""
    return ratio(spec.hidden_size, spec.mlp_dim)


def ratio(width, units):
    """The ratio r for which timm's int(width * r) is `units`."""
    ratio = units / width
    while int(width * ratio) < units:  # a quotient rounded down
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def architecture_of_epsilon(epsilon, fitting, what, none=None):
    """The first name in `fitting`, the (name, LayerNorm epsilon) of each architecture of timm's
    that fits the model apart from the epsilon, whose epsilon is `epsilon` (model_args cannot set
    one). Otherwise a LayoutError: `none` where nothing fits, else the epsilons that `what` (those
    architectures, in words) have."""
    epsilons = set()
    for name, value in fitting:
        if value == epsilon:
            return name
        epsilons.add(value)
    if none and not epsilons:
        raise LayoutError(none)
    raise LayoutError(
        f"{what} have LayerNorms of epsilon "
        f"{' or '.join(f'{value:g}' for value in sorted(epsilons, reverse=True))}, the model "
        f"{epsilon}; timm's model_args cannot name another.")

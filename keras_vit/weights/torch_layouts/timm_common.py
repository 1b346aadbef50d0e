"""What timm's ViT classes' checkpoints share: the table of its architectures and their
arguments, the sizes a state dict shows, its weights' names (VisionTransformer's, which Eva's
are read as) and packed tensors, the `config.json` keras_vit writes, the ratios its arguments
take, the choice of an architecture by its LayerNorm epsilon, and the arguments of its
VisionTransformer class, which its hybrids share (`timm_vit`, `timm_hybrid`).

timm's `VisionTransformer` fuses the query, key and value (`blocks.N.attn.qkv`, [3D, D]).
Linear weights are (out, in), the patch convolution (D, C, p, p). Its later ViTs add register
tokens (`reg_token`), a norm before the blocks (`norm_pre`, with no patch bias), LayerScale
(`blocks.N.ls1.gamma`, `ls2.gamma`) and a norm after pooling (`fc_norm`); which of these an
architecture has is in `timm_architectures.json`, which also records the arguments of its
other classes' architectures.
"""

import functools
import json
import logging
import math
import os
import re

import numpy as np

from keras_vit.architecture.spec import ACTIVATIONS
from keras_vit.weights.torch_layouts import common
from keras_vit.weights.torch_layouts.common import LayoutError, check_grid, sized_spec, tensor

logger = logging.getLogger(__name__)

# Tensors every timm class keeps packed (`common.unpacked`).
_PACKED = ((r".*attn", ".qkv.", ("q", "k", "v")),  # the blocks' attention
           # the attention pooling's (its q apart: it projects the probe)
           (r".*attn_pool", ".kv.", ("k", "v")))
# A packed SwiGLU (GluMlp's fc1: the gate's rows, then the value's: Eva's and VisionTransformer's
# SwiGLUPacked), as its unpacked names.
GLU_PACKED = ((r".*\.mlp", ".fc1.", ("fc1_g", "fc1_x")),)
# DINOv2's head, which none of timm's ViT classes has: their global_pool (timm.layers'
# global_pool_nlc, and attention pooling) takes one of these.
TOKEN_GAP = ("classifier='token_gap' (DINOv2's head on the class token beside the patch tokens' "
             "mean: timm's global_pool is 'token', 'avg', 'avgmax', 'max' or 'map'). Nothing was "
             "written. Save it with keras_vit.weights.checkpoint.save_npz or "
             "model.save(...keras), or, for a model of learned position embeddings with "
             "LayerScale, with format='transformers' (its Dinov2ForImageClassification)")


@functools.cache
def timm_architectures():
    """timm's `vit_*`, `deit*`, `eva02*` and `naflexvit_*` architectures: name -> {"class",
    "args"}, the arguments each entry point passes beyond `VisionTransformer`'s defaults (for
    Eva's, marked `"defaults": "Eva"`, beyond `Eva`'s; for NaFlexVit's, `"defaults":
    "NaFlexVitCfg"`, the fields of its config beyond that dataclass's defaults) (written by
    benchmarks/timm_coverage.py --write_table from timm itself). A checkpoint's `config.json`
    names its architecture but does not repeat these."""
    path = os.path.join(os.path.dirname(__file__), "timm_architectures.json")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["architectures"]


# MobileCLIP's ConvStem (timm_hybrid): its last convolution is the patch embedding.
CONV_STEM_PROJECTION = "patch_embed.backbone.2.conv"


def sizes(state):
    """(width, patch size, blocks) of a timm ViT's weights: its patch kernel and block names;
    with MobileCLIP's ConvStem, its last kernel's width and the product of its kernels' sides
    (each its stride)."""
    if "patch_embed.proj.weight" not in state and CONV_STEM_PROJECTION + ".weight" in state:
        kernel = state[CONV_STEM_PROJECTION + ".weight"]
        patch = math.prod(state[f"patch_embed.backbone.{index}.conv.weight"].shape[-1]
                          for index in range(3))
    else:
        kernel = tensor(state, "patch_embed.proj.weight", "timm")
        patch = kernel.shape[-1]
    layers = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    return kernel.shape[0], patch, layers


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


def architecture_entry(config):
    """(architecture, its entry in `timm_architectures`) of timm's `config.json`, or a
    LayoutError for an architecture keras_vit does not know."""
    architecture = config["architecture"].split(".")[0]
    entry = timm_architectures().get(architecture)
    if entry is None:  # its options (heads, activation, epsilon...) would be guesses
        raise LayoutError(
            f"timm architecture {architecture!r} is not one keras_vit knows (timm 1.0.31's "
            "vit_*, deit*, eva02* and naflexvit_* architectures, "
            "keras_vit/weights/torch_layouts/timm_architectures.json).")
    return architecture, entry


def timm_args(config, defaults):
    """(architecture, arguments): the arguments timm builds the checkpoint's model with (its
    class's `defaults`, its architecture's, then the config's `model_args`, as
    `timm.create_model` does), a LayerNorm's or an RmsNorm's epsilon as `layer_norm_epsilon`
    (with `rms_norm=True` for the second)."""
    architecture, entry = architecture_entry(config)
    pretrained = config.get("pretrained_cfg") or {}
    merged = {**defaults, "img_size": pretrained.get("input_size", [3, 224, 224])[1:],
              **entry["args"], **(config.get("model_args") or {})}
    if "global_pool" in config:  # timm writes the model's pooling beside model_args
        merged["global_pool"] = config["global_pool"]
    norm = merged.pop("norm_layer")
    if isinstance(norm, dict) and "layer_norm" in norm:
        merged["layer_norm_epsilon"] = norm["layer_norm"]
    elif isinstance(norm, dict) and "rms_norm" in norm:  # Eva's RmsNorm (Sapiens2)
        merged["layer_norm_epsilon"] = norm["rms_norm"]
        merged["rms_norm"] = True
    else:
        merged["norm_layer"] = norm
    return architecture, merged


def check_missing(architecture, missing, timm_class=None):
    """A LayoutError naming `missing`, what of the arguments of timm's `architecture` (of
    `timm_class`, where said) keras_vit has no option for."""
    if missing:
        named = f" (timm's {timm_class})" if timm_class else ""
        raise LayoutError(f"timm architecture {architecture!r}{named} needs "
                          f"{', '.join(missing)}, which keras_vit has no option for yet.")


# Every class's weights in VisionTransformer's names -------------------------------------------


def weight_pairs(spec, backbone=()):
    """Every (`.npz` key, their key, kind) of a model of `spec` in timm's class for it, with a
    hybrid's `backbone` pairs, its Eva's names as its VisionTransformer's (`eva_names`)."""
    projection = CONV_STEM_PROJECTION if spec.conv_stem else "patch_embed.proj"
    stem = [("embedding/kernel", projection + ".weight", "conv")]
    if spec.position_embedding == "learned":  # Eva's RoPE models may have none
        stem.append((common.POSITIONS, "pos_embed", "copy"))
    if not spec.pre_norm:  # timm's patch embedding has no bias before a pre-norm
        stem.append(("embedding/bias", projection + ".bias", "copy"))
    if spec.class_token:  # Eva's GAP models may have one too
        stem.append(("cls", "cls_token", "copy"))
    if spec.distillation_token:
        stem.append(("dist", "dist_token", "copy"))
    if spec.num_register_tokens:
        stem.append(("reg/registers", "reg_token", "copy"))
    if spec.pre_norm:
        stem += common.norm_pairs("pre_norm", "norm_pre", spec)
    names = {"query": "attn.q", "key": "attn.k", "value": "attn.v", "out": "attn.proj",
             "norm_0": "norm1", "norm_2": "norm2", "fc_0": "mlp.fc1", "fc_1": "mlp.fc2",
             "scale_0": "ls1.gamma", "scale_1": "ls2.gamma",
             # Eva's NormFormer LayerNorms (scale_attn_inner, scale_mlp);
             # VisionTransformerRelPos's relative-position MLP
             "attention_norm": "attn.norm", "mlp_norm": "mlp.norm",
             "relative_fc_0": "attn.rel_pos.mlp.fc1", "relative_fc_1": "attn.rel_pos.mlp.fc2",
             # Eva's norms of each head's queries and keys (qk_norm)
             "query_norm": "attn.q_norm", "key_norm": "attn.k_norm",
             # DiffAttention's (and the parallel blocks', as `parallel_names` reads them)
             "sub_norm": "attn.sub_norm", **{name: "attn." + name for name in common.LAMBDAS}}
    if spec.activation == "swiglu":  # GluMlp's packed fc1 unpacked (`to_arrays`)
        names.update(fc_0="mlp.fc1_x", gate="mlp.fc1_g")
    pairs = stem + list(backbone) + common.encoder_pairs(spec, "blocks.{}.", names)
    if spec.rope == "mixed":  # Eva's rope.freqs[:, index]
        pairs += [(common.ATTENTION.format(index) + "rope/frequencies", f"rope.freqs.{index}",
                   "copy") for index in range(spec.num_layers)]
    if spec.final_norm == "tokens":
        pairs += common.norm_pairs("Transformer/encoder_norm", "norm", spec)
    elif spec.final_norm == "pooled":
        pairs += common.norm_pairs("fc_norm", "fc_norm", spec)
    if spec.classifier == "map":  # AttentionPoolLatent (its kv split as qkv is)
        pairs += common.attention_pool_pairs("attn_pool.", "latent", ("q", "k", "v", "proj"),
                                             "norm", spec)
    if spec.include_top:
        pairs += common.dense_pairs("head", "head")
        if spec.distillation_token:
            pairs += common.dense_pairs("head_dist", "head_dist")
    return pairs


def eva_names(state, spec):
    """timm's Eva names as its VisionTransformer's: LayerScale's `gamma_1`, `gamma_2` as
    `ls1.gamma`, `ls2.gamma`; the split `q_proj`, `k_proj`, `v_proj` as `q`, `k`, `v`;
    EvaAttention's `q_bias`, `v_bias` as q's and v's biases, with the key's bias it keeps as a
    zero buffer (not in its files) as zeros; RoPE-Mixed's `rope.freqs` [2, depth, heads,
    head_dim / 2] as each block's `rope.freqs.N`. (A packed SwiGLU's `fc1` is unpacked before,
    as VisionTransformer's.)"""
    if spec.rope == "mixed" and "rope.freqs" in state:
        state = dict(state)
        frequencies = state.pop("rope.freqs")
        state.update({f"rope.freqs.{index}": frequencies[:, index]
                      for index in range(frequencies.shape[1])})
    renamed = {}
    for key, value in state.items():
        key = re.sub(r"\.gamma_([12])$", r".ls\1.gamma", key)
        key = re.sub(r"\.attn\.([qkv])_proj\.", r".attn.\1.", key)
        renamed[re.sub(r"\.attn\.([qv])_bias$", r".attn.\1.bias", key)] = value
    for key in list(renamed):
        match = re.fullmatch(r"(.*\.attn)\.q\.bias", key)
        if match and match[1] + ".k.bias" not in renamed:
            renamed[match[1] + ".k.bias"] = np.zeros_like(renamed[key])
    return renamed


# A parallel block's names (ParallelScalingBlock, DiffParallelScalingBlock) -> its Block's.
_PARALLEL_NAMES = {"in_norm": "norm1", "q_norm": "attn.q_norm", "k_norm": "attn.k_norm",
                   "sub_norm": "attn.sub_norm", "attn_out_proj": "attn.proj",
                   "mlp_out_proj": "mlp.fc2", "ls.gamma": "ls1.gamma",
                   **{name: "attn." + name for name in common.LAMBDAS}}


def _renamed(state, index, names):
    """`state` with block `index`'s keys `blocks.{index}.{old}...` as `...{new}...`."""
    block, renamed = f"blocks.{index}.", {}
    for key, value in state.items():
        rest = key[len(block):] if key.startswith(block) else None
        for old, new in names.items():
            if rest is not None and (rest == old or rest.startswith(old + ".")):
                key = block + new + rest[len(old):]
                break
        renamed[key] = value
    return renamed


def parallel_names(state, spec):
    """timm's parallel blocks' weights as its Block's names: `in_norm` as `norm1`; the fused
    input projection `in_proj` [mlp + 3 D, D] as the MLP's `mlp.fc1` (its rows first, its bias
    the `mlp_bias` beside a bias-free in_proj) and the attention's packed `attn.qkv`; the
    output projections `attn_out_proj`, `mlp_out_proj` as `attn.proj`, `mlp.fc2`, or
    DiffParallelScalingBlock's one `out_proj` [D, D + mlp] over both branches, concatenated,
    as its columns of each (its bias the attention's, the MLP's zero: the same sum); one
    LayerScale `ls` as `ls1`; the attention's norms and lambdas under `attn.`."""
    if not spec.parallel_blocks:
        return state
    state = dict(state)
    for index in range(spec.num_layers):
        block = f"blocks.{index}."
        for kind in ("weight", "bias"):
            packed = state.pop(f"{block}in_proj.{kind}", None)
            if packed is not None:
                state[f"{block}mlp.fc1.{kind}"], state[f"{block}attn.qkv.{kind}"] = np.split(
                    packed, [packed.shape[0] - 3 * spec.hidden_size])
        if block + "mlp_bias" in state:
            state[block + "mlp.fc1.bias"] = state.pop(block + "mlp_bias")
        if block + "out_proj.weight" in state:
            weight = state.pop(block + "out_proj.weight")
            state[block + "attn.proj.weight"], state[block + "mlp.fc2.weight"] = np.split(
                weight, [spec.hidden_size], axis=1)
            bias = state.pop(block + "out_proj.bias")
            state[block + "attn.proj.bias"], state[block + "mlp.fc2.bias"] = (
                bias, np.zeros_like(bias))
        state = _renamed(state, index, _PARALLEL_NAMES)
    return state


def parallel_state(state, spec):
    """The inverse of `parallel_names` (after the attention's q, k, v are packed as qkv):
    DiffParallelScalingBlock's out_proj with the two biases summed."""
    if not spec.parallel_blocks:
        return state
    names = {new: old for old, new in _PARALLEL_NAMES.items()
             if not (spec.differential and old.endswith("out_proj"))}
    state = dict(state)
    for index in range(spec.num_layers):
        block = f"blocks.{index}."
        state[block + "in_proj.weight"] = np.concatenate(
            [state.pop(block + "mlp.fc1.weight"), state.pop(block + "attn.qkv.weight")])
        bias = state.pop(block + "mlp.fc1.bias")
        if block + "attn.qkv.bias" in state:
            state[block + "in_proj.bias"] = np.concatenate([bias,
                                                            state.pop(block + "attn.qkv.bias")])
        else:  # timm's mlp_bias, beside an in_proj without bias
            state[block + "mlp_bias"] = bias
        if spec.differential:
            state[block + "out_proj.weight"] = np.concatenate(
                [state.pop(block + "attn.proj.weight"), state.pop(block + "mlp.fc2.weight")],
                axis=1)
            state[block + "out_proj.bias"] = (state.pop(block + "attn.proj.bias")
                                              + state.pop(block + "mlp.fc2.bias"))
        state = _renamed(state, index, names)
    return state


def to_arrays(state, spec, pairs):
    """timm's state dict (name -> array) as the `.npz` layout through `pairs`
    (`common.to_arrays`): parallel blocks' weights as its Block's (`parallel_names`), its
    packed tensors split, and Eva's names read as VisionTransformer's whatever the class (an
    Eva without RoPE, inner norms or Eva's pooling is written as a VisionTransformer)."""
    packings = _PACKED + (GLU_PACKED if spec.activation == "swiglu" else ())
    state = common.unpacked(parallel_names(state, spec), packings)
    return common.to_arrays(eva_names(state, spec), pairs, spec, "timm")


def from_arrays(arrays, spec, pairs, renamed=None):
    """The `.npz` layout as timm's state dict through `pairs`: a pre-norm's patch bias (timm
    has none) folded into the position embeddings, the state `renamed` (state -> state: Eva's
    names) or a SwiGLU packed as VisionTransformer's GluMlp, and the attention's packed."""
    if spec.pre_norm:
        arrays = common.fold_patch_bias(arrays, spec)
    state = common.from_arrays(arrays, pairs, spec, "timm")
    if renamed:
        state = renamed(state)
    elif spec.activation == "swiglu":
        state = common.packed(state, GLU_PACKED)
    return parallel_state(common.packed(state, _PACKED), spec)


# VisionTransformer's arguments (its plain ViTs' and its hybrids') ------------------------------

# timm's VisionTransformer arguments that keras_vit has options for, with timm's defaults
# (timm 1.0.31); any other argument an architecture sets is an option keras_vit lacks.
VIT_DEFAULTS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 1000,
    "global_pool": "token", "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0,
    "qkv_bias": True, "init_values": None, "class_token": True, "no_embed_class": False,
    "reg_tokens": 0, "pre_norm": False, "final_norm": True, "fc_norm": None,
    "dynamic_img_size": False, "dynamic_img_pad": False, "act_layer": "gelu",
    "norm_layer": {"layer_norm": 1e-6}, "drop_rate": 0.0, "pos_drop_rate": 0.0,
    "proj_drop_rate": 0.0, "attn_drop_rate": 0.0, "drop_path_rate": 0.0,
    "block_fn": None, "mlp_layer": None,  # None: timm's Block and Mlp
    "attn_layer": "attn"}  # timm's Attention ("diff": DiffAttention)
# timm's block_fn keras_vit maps, as timm_architectures.json records it: ResPostBlock
# (x + LN(branch(x)): residual_post_norm), the parallel blocks (parallel_blocks) -> whether
# their attention is differential. Its mlp_layer: DINOv2 giant's SwiGLUPacked (`is_glu`).
RES_POST_BLOCK = "<ResPostBlock>"
PARALLEL_BLOCKS = {"<ParallelScalingBlock>": False, "<DiffParallelScalingBlock>": True}
# attn_layer's values (timm's ATTN_LAYERS) -> keras_vit's attention_layer, in the blocks that
# take one (Block, ResPostBlock; the parallel blocks' own attention ignores it).
_ATTENTION_LAYERS = {"": "softmax", "attn": "softmax", "diff": "differential"}
_SILU = ("<SiLU>", "silu", "swish")  # act_layer as a class, or get_act_layer's names
# norm_layer is read as layer_norm_epsilon where it is a LayerNorm; any other is missing.
_OPTIONS = set(VIT_DEFAULTS) - {"norm_layer"} | {"layer_norm_epsilon"}
_POOLS = {"token": "token", "avg": "gap", "map": "map"}  # timm's global_pool -> classifier


def missing(args, distilled=False):
    """What of VisionTransformer's `args` keras_vit has no option for, in timm's words."""
    missing = [f"{name}={value!r}" for name, value in sorted(args.items())
               if name not in _OPTIONS]
    if args["block_fn"] not in (None, RES_POST_BLOCK, *PARALLEL_BLOCKS):
        missing.append(f"block_fn={args['block_fn']!r}")
    if args["attn_layer"] not in _ATTENTION_LAYERS:
        missing.append(f"attn_layer={args['attn_layer']!r}")
    glu = is_glu(args["mlp_layer"])
    if args["block_fn"] in PARALLEL_BLOCKS and (args["mlp_layer"] is not None
                                                or args["act_layer"] == "swiglu"):
        missing.append(f"block_fn={args['block_fn']!r} with mlp_layer={args['mlp_layer']!r} "
                       "(a parallel block's MLP is its fused projection and act_layer)")
    if args["mlp_layer"] is not None and not glu:
        missing.append(f"mlp_layer={args['mlp_layer']!r}")
    if glu and args["act_layer"] not in _SILU:
        missing.append(f"mlp_layer=GluMlp with act_layer={args['act_layer']!r} (keras_vit's "
                       "gated MLP is SwiGLU: SiLU)")
    elif not glu and (args["act_layer"] not in ACTIVATIONS
                      or args["act_layer"] == "swiglu"):  # timm's names are the spec's
        missing.append(f"act_layer={args['act_layer']!r}")
    if glu and args["global_pool"] == "map":
        missing.append("global_pool='map' with a SwiGLU MLP (timm's attention pooling has a "
                       "plain MLP of act_layer, keras_vit's the blocks' SwiGLU)")
    if args["global_pool"] not in _POOLS:
        missing.append(f"global_pool={args['global_pool']!r}")
    elif args["global_pool"] == "token" and not args["class_token"]:
        missing.append(f"global_pool={args['global_pool']!r} with class_token="
                       f"{args['class_token']}")
    if args["in_chans"] != 3:
        missing.append(f"in_chans={args['in_chans']}")
    if distilled:
        missing += _distilled_missing(args)
    return missing


def is_glu(mlp_layer):
    """Whether timm's `mlp_layer` (as the table records it) is a GluMlp whose fc1 holds the
    gate's rows first, as DINOv2 giant's SwiGLUPacked (gate_last=False)."""
    return (isinstance(mlp_layer, dict) and mlp_layer.get("partial") == "GluMlp"
            and mlp_layer.get("gate_last") is False)


def _distilled_missing(args):
    """What timm's VisionTransformerDistilled accepts but keras_vit's distillation token does
    not: its heads read the normed class and distillation tokens (its forward skips fc_norm
    and places no registers), which have position embeddings (with no_embed_class its
    forward fails: it still makes their rows)."""
    wrong = {"global_pool": args["global_pool"] != "token", "reg_tokens": args["reg_tokens"] != 0,
             "fc_norm": bool(args["fc_norm"]), "final_norm": not args["final_norm"],
             "no_embed_class": bool(args["no_embed_class"])}
    return [f"{name}={args[name]!r} with a distillation token"
            for name, problem in wrong.items() if problem]


def spec_from_vision_transformer(architecture, args, config, state, distilled, stride=1,
                                 **fields):
    """The `ViTConfig` of timm's VisionTransformer (VisionTransformerDistilled where
    `distilled`) of `args`, with the sizes the weights `state` show; a hybrid's patches are
    cut from its ResNet's map, `stride` pixels a step, and its `fields` name that ResNet."""
    check_missing(architecture, missing(args, distilled))
    hidden, patch, layers = sizes(state)
    pixels = patch * stride
    glu = is_glu(args["mlp_layer"])  # GluMlp's fc1: the gate's rows and the value's
    parallel = args["block_fn"] in PARALLEL_BLOCKS
    if parallel:  # in_proj: the MLP's rows, then the query's, key's and value's
        mlp = tensor(state, "blocks.0.in_proj.weight", "timm").shape[0] - 3 * hidden
    else:
        mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0] // (2 if glu else 1)
    differential = (PARALLEL_BLOCKS[args["block_fn"]] if parallel
                    else _ATTENTION_LAYERS[args["attn_layer"]] == "differential")
    post_norm = args["block_fn"] == RES_POST_BLOCK  # its init_values only start its norms
    prefix_tokens = int(bool(args["class_token"])) + int(distilled) + args["reg_tokens"]
    check_grid(tensor(state, "pos_embed", "timm"), args["img_size"], pixels,
               0 if args["no_embed_class"] else prefix_tokens, "img_size")
    gap = args["global_pool"] == "avg"
    fc_norm = gap if args["fc_norm"] is None else args["fc_norm"]  # timm's rule
    final_norm = "none" if not args["final_norm"] else "pooled" if fc_norm else "tokens"
    num_classes = config.get("num_classes", args["num_classes"])
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch, **fields,
                      image_size=whole_patches(args["img_size"], pixels, architecture),
                      include_top=num_classes > 0, num_classes=max(num_classes, 1),
                      classifier=_POOLS[args["global_pool"]],
                      class_token=bool(args["class_token"]),  # GAP and MAP leave it out
                      activation="swiglu" if glu else args["act_layer"],
                      layer_norm_epsilon=args["layer_norm_epsilon"],
                      qkv_bias=args["qkv_bias"],
                      layer_scale_init=None if post_norm else args["init_values"],
                      residual_post_norm=post_norm, parallel_blocks=parallel,
                      attention_layer="differential" if differential else "softmax",
                      num_register_tokens=args["reg_tokens"],
                      prefix_position_embeddings=not args["no_embed_class"],
                      pre_norm=args["pre_norm"], final_norm=final_norm,
                      distillation_token=distilled,
                      dynamic_image_size=args["dynamic_img_size"],
                      dynamic_image_pad=args["dynamic_img_pad"],
                      position_embedding_interpolation="bicubic")  # as timm resamples


def vision_transformer_class(spec):
    """timm's class of a VisionTransformer model of `spec`: VisionTransformerDistilled takes
    the same arguments and adds DeiT's distillation token."""
    return "VisionTransformerDistilled" if spec.distillation_token else "VisionTransformer"


def vision_transformer_config(spec, preprocessing, architecture_of, check=None):
    """timm's VisionTransformer `config.json` for a model of `spec` (a LayoutError for what it
    cannot express, and for what `check(spec)` refuses): its sizes and options in
    `model_args`, on the architecture `architecture_of(spec)` chooses, (name, its arguments),
    which writes only the options that differ from its own (timm's model_args cannot name a
    stem, a block or an MLP class, nor a LayerNorm's epsilon)."""
    timm_class = vision_transformer_class(spec)
    common.check_expressible(f"This model is written as timm's {timm_class}",
                             [(spec.classifier == "token_gap", TOKEN_GAP)])
    if check:
        check(spec)
    common.check_plain(spec, f"timm's {timm_class}", swiglu=True, hybrid=spec.is_hybrid)
    swiglu = spec.activation == "swiglu"
    if swiglu and spec.classifier == "map":
        raise LayoutError("timm's attention pooling has a plain MLP of the model's act_layer "
                          "(SiLU for its SwiGLU ViTs), where keras_vit's has the blocks' SwiGLU: "
                          "save a SwiGLU model with another classifier.")
    if spec.representation_size is not None:
        raise LayoutError("timm's VisionTransformer has no tanh pre_logits layer; save a model "
                          "without representation_size.")
    if spec.distillation_token and not spec.prefix_position_embeddings:
        raise LayoutError("timm's VisionTransformerDistilled makes position embeddings for the "
                          "class and distillation tokens even with no_embed_class (its forward "
                          "then fails): save a model with prefix_position_embeddings=True.")
    height, width = spec.image_size
    pool = {classifier: pool for pool, classifier in _POOLS.items()}[spec.classifier]
    args = {"img_size": [height, width], "patch_size": spec.patch_size,
            "embed_dim": spec.hidden_size, "depth": spec.num_layers,
            "num_heads": spec.num_heads,
            # GluMlp's fc1 holds the gate's units and the value's: int(width * ratio) of both
            "mlp_ratio": (ratio(spec.hidden_size, 2 * spec.mlp_dim) if swiglu
                          else spec.mlp_dim / spec.hidden_size),
            "class_token": bool(spec.class_token), "global_pool": pool,
            "fc_norm": spec.final_norm == "pooled",
            "act_layer": "silu" if swiglu else spec.activation}
    later = {"final_norm": spec.final_norm != "none", "qkv_bias": spec.qkv_bias,
             "init_values": spec.layer_scale_init, "reg_tokens": spec.num_register_tokens,
             "no_embed_class": not spec.prefix_position_embeddings, "pre_norm": spec.pre_norm,
             "dynamic_img_size": spec.dynamic_image_size,
             "dynamic_img_pad": spec.dynamic_image_pad,
             # Block's attention (a parallel block's is its class's: block_fn)
             "attn_layer": ("diff" if spec.differential and not spec.parallel_blocks
                            else "attn")}
    architecture, chosen = architecture_of(spec)
    chosen = {**chosen, "attn_layer": "diff" if chosen["attn_layer"] == "diff" else "attn"}
    args.update({name: value for name, value in later.items() if value != chosen[name]})
    return config_file(spec, preprocessing, args, architecture)

"""timm's ViT weight layouts (its `VisionTransformer`, `VisionTransformerDistilled`, the
ViT-ResNet hybrids, `VisionTransformerRelPos` and `Eva`), as maps to and from the original
`.npz` layout (`keras_vit.checkpoint`), and their `config.json` to and from a `ViTConfig`.
Pure NumPy: no torch is needed to read or write them.

timm's `VisionTransformer` fuses the query, key and value (`blocks.N.attn.qkv`, [3D, D]).
Linear weights are (out, in), the patch convolution (D, C, p, p). Its later ViTs add register
tokens (`reg_token`), a norm before the blocks (`norm_pre`, with no patch bias), LayerScale
(`blocks.N.ls1.gamma`, `ls2.gamma`) and a norm after pooling (`fc_norm`); which of these an
architecture has is in `timm_architectures.json`, which also records the arguments of the
architectures of its `Eva` class (EVA-02, DINOv3, the RoPE ViTs) and its
`VisionTransformerRelPos`.
"""

import functools
import json
import logging
import math
import os
import re

import numpy as np

from keras_vit.spec import ACTIVATIONS
from keras_vit.torch_layouts import common
from keras_vit.torch_layouts.common import LayoutError, check_grid, sized_spec, tensor

logger = logging.getLogger(__name__)

# timm's model classes keras_vit reads -> whether it has DeiT's distillation token;
# VisionTransformerDistilled takes VisionTransformer's arguments, Eva its own (`_EVA_DEFAULTS`).
TIMM_CLASSES = {"VisionTransformer": False, "VisionTransformerDistilled": True, "Eva": False,
                "VisionTransformerRelPos": False}
# timm's VisionTransformer arguments that keras_vit has options for, with timm's defaults
# (timm 1.0.31); any other argument an architecture sets is an option keras_vit lacks.
_TIMM_DEFAULTS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 1000,
    "global_pool": "token", "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0,
    "qkv_bias": True, "init_values": None, "class_token": True, "no_embed_class": False,
    "reg_tokens": 0, "pre_norm": False, "final_norm": True, "fc_norm": None,
    "dynamic_img_size": False, "dynamic_img_pad": False, "act_layer": "gelu",
    "norm_layer": {"layer_norm": 1e-6}, "drop_rate": 0.0, "pos_drop_rate": 0.0,
    "proj_drop_rate": 0.0, "attn_drop_rate": 0.0, "drop_path_rate": 0.0,
    "block_fn": None, "mlp_layer": None}  # None: timm's Block and Mlp
# timm's block_fn and mlp_layer keras_vit maps, as timm_architectures.json records them:
# ResPostBlock (x + LN(branch(x)): residual_post_norm) and DINOv2 giant's SwiGLUPacked (GluMlp,
# its fc1 the gate's rows, then the value's; SiLU from the model's act_layer, which the block
# passes over the partial's).
_RES_POST_BLOCK = "<ResPostBlock>"
_SILU = ("<SiLU>", "silu", "swish")  # act_layer as a class, or get_act_layer's names
# norm_layer is read as layer_norm_epsilon where it is a LayerNorm; any other is missing.
_TIMM_OPTIONS = set(_TIMM_DEFAULTS) - {"norm_layer"} | {"layer_norm_epsilon"}
_TIMM_POOLS = {"token": "token", "avg": "gap", "map": "map"}  # timm's global_pool -> classifier
# timm's ViT-ResNet hybrids (vision_transformer_hybrid.py: a VisionTransformer whose
# embed_layer is HybridEmbed on a ResNetV2, `_resnetv2`): the units of each stage of its
# backbone -> keras_vit's variant with that ResNet (the checkpoint's sizes override the rest),
# and the architectures written for each, familiar names first.
_TIMM_HYBRIDS = {(): "R+Ti/16", (2, 2, 2, 2): "R26+S/32", (3, 4, 9): "R50+B/16",
                 (3, 4, 6, 3): "R50+L/32"}
_TIMM_HYBRID_ARCHITECTURES = {(): "vit_tiny_r_s16_p8_224", (2, 2, 2, 2): "vit_small_r26_s32_224",
                              (3, 4, 9): "vit_base_r50_s16_224",
                              (3, 4, 6, 3): "vit_large_r50_s32_224"}
# Its numerics, keras_vit's resnet_numerics="timm" (keras_vit.resnet.NUMERICS, not imported:
# this module needs no Keras): the weight standardisation's and GroupNorm's epsilons.
TIMM_RESNET_EPSILONS = (1e-8, 1e-5)
# Tensors timm keeps packed (`common.unpacked`).
_PACKED = ((r".*attn", ".qkv.", ("q", "k", "v")),  # the blocks' attention
           # the attention pooling's (its q apart: it projects the probe)
           (r".*attn_pool", ".kv.", ("k", "v")))
# timm's Eva RoPE layout (interleaved, rows and columns swapped: grid_indexing 'xy') that
# timm_config writes for each of keras_vit's kinds: its pretrained EVA-02's and DINOv3's.
_EVA_WRITTEN_ROPE = {"axial": (True, False), "axial_normalized": (False, False),
                     "mixed": (True, True)}  # RoPE-Mixed: naver's pretrained 'xy' grid
# Eva's packed SwiGLU (GluMlp's fc1: the gate's rows, then the value's), as its unpacked names.
_EVA_PACKED = ((r".*\.mlp", ".fc1.", ("fc1_g", "fc1_x")),)


def weight_pairs(spec):
    """Every (`.npz` key, their key, kind) of a model of `spec` in timm's class for it, its
    Eva's names as its VisionTransformer's (`_eva_names`)."""
    stem = [("embedding/kernel", "patch_embed.proj.weight", "conv")]
    if spec.position_embedding == "learned":  # Eva's RoPE models may have none
        stem.append((common.POSITIONS, "pos_embed", "copy"))
    if not spec.pre_norm:  # timm's patch embedding has no bias before a pre-norm
        stem.append(("embedding/bias", "patch_embed.proj.bias", "copy"))
    if spec.class_token:  # Eva's GAP models may have one too
        stem.append(("cls", "cls_token", "copy"))
    if spec.distillation_token:
        stem.append(("dist", "dist_token", "copy"))
    if spec.num_register_tokens:
        stem.append(("reg/registers", "reg_token", "copy"))
    if spec.pre_norm:
        stem += common.norm_pairs("pre_norm", "norm_pre")
    if spec.is_hybrid:
        stem += _resnet_pairs(spec)
    names = {"query": "attn.q", "key": "attn.k", "value": "attn.v", "out": "attn.proj",
             "norm_0": "norm1", "norm_2": "norm2", "fc_0": "mlp.fc1", "fc_1": "mlp.fc2",
             "scale_0": "ls1.gamma", "scale_1": "ls2.gamma",
             # Eva's NormFormer LayerNorms (scale_attn_inner, scale_mlp);
             # VisionTransformerRelPos's relative-position MLP
             "attention_norm": "attn.norm", "mlp_norm": "mlp.norm",
             "relative_fc_0": "attn.rel_pos.mlp.fc1", "relative_fc_1": "attn.rel_pos.mlp.fc2"}
    if spec.activation == "swiglu":  # Eva's, its packed GluMlp unpacked (`_eva_names`)
        names.update(fc_0="mlp.fc1_x", gate="mlp.fc1_g")
    pairs = stem + common.encoder_pairs(spec, "blocks.{}.", names)
    if spec.rope == "mixed":  # Eva's rope.freqs[:, index]
        pairs += [(common.ATTENTION.format(index) + "rope/frequencies", f"rope.freqs.{index}",
                   "copy") for index in range(spec.num_layers)]
    if spec.final_norm == "tokens":
        pairs += common.norm_pairs("Transformer/encoder_norm", "norm")
    elif spec.final_norm == "pooled":
        pairs += common.norm_pairs("fc_norm", "fc_norm")
    if spec.classifier == "map":  # AttentionPoolLatent (its kv split as qkv is)
        pairs += common.attention_pool_pairs("attn_pool.", "latent", ("q", "k", "v", "proj"),
                                             "norm")
    if spec.include_top:
        pairs += common.dense_pairs("head", "head")
        if spec.distillation_token:
            pairs += common.dense_pairs("head_dist", "head_dist")
    return pairs


def to_npz_arrays(state, spec, config=None):
    """timm's state dict (name -> array) of a model of `spec` as the `.npz` layout
    `checkpoint.load_npz` reads (`common.to_arrays`). `config`, the checkpoint's config.json,
    says how timm's Eva lays out RoPE's channels (None: as keras_vit does)."""
    state = _eva_names(common.unpacked(state, _PACKED), spec)
    arrays = common.to_arrays(state, weight_pairs(spec), spec, "timm")
    if spec.rope:
        arrays = _permuted_rope(arrays, spec, *_timm_rope_layout(config))
    return arrays


def from_npz_arrays(arrays, spec):
    """The `.npz` layout (`checkpoint.model_arrays`) as timm's state dict."""
    if spec.pre_norm:
        arrays = common.fold_patch_bias(arrays, spec)
    if spec.rope:
        arrays = _permuted_rope(arrays, spec, *_EVA_WRITTEN_ROPE[spec.rope], inverse=True)
    state = common.from_arrays(arrays, weight_pairs(spec), spec, "timm")
    if _is_eva(spec):
        state = _eva_state(state, spec, _eva_attention(arrays, spec))
    elif spec.activation == "swiglu":  # VisionTransformer's GluMlp
        state = common.packed(state, _EVA_PACKED)
    return common.packed(state, _PACKED)


def _resnet_pairs(spec):
    """The ResNet of a hybrid as timm's ResNetV2 names it under `patch_embed.backbone.`: its
    stem `stem.conv`, `stem.norm` (R+Ti/16's stem alone: `conv`, `norm`), and in stage s,
    block u, `conv1..3`, `norm1..3` and the first block's `downsample.conv`, `.norm` (the
    original's `block{s+1}/unit{u+1}/conv1..3`, `gn1..3`, `conv_proj`, `gn_proj`). Its final
    `norm` is an Identity (preact=False), without weights."""
    backbone = "patch_embed.backbone."
    stem = backbone + ("stem." if spec.resnet_units else "")

    def conv_norm(ours, conv, norm, theirs):
        return ([(f"{ours}{conv}/kernel", f"{theirs[0]}.weight", "conv")]
                + common.norm_pairs(ours + norm, theirs[1]))

    pairs = conv_norm("", "conv_root", "gn_root", (stem + "conv", stem + "norm"))
    for stage, units in enumerate(spec.resnet_units):
        for unit in range(units):
            ours = f"block{stage + 1}/unit{unit + 1}/"
            theirs = f"{backbone}stages.{stage}.blocks.{unit}."
            if unit == 0:  # the projection of the shortcut
                pairs += conv_norm(ours, "conv_proj", "gn_proj",
                                   (theirs + "downsample.conv", theirs + "downsample.norm"))
            for index in (1, 2, 3):
                pairs += conv_norm(ours, f"conv{index}", f"gn{index}",
                                   (f"{theirs}conv{index}", f"{theirs}norm{index}"))
    return pairs


def _rope_channels(head_dim, interleaved, xy):
    """For each channel of a head's query or key in keras_vit's layout (channel i turns with
    i + head_dim / 2 by angle i; angles: the row's bands, then the column's), timm's channel
    that turns by the same angle in the same role. timm's interleaved layout turns channels 2j
    and 2j + 1 by its angle j; with grid_indexing 'xy' its angles are the column's bands
    first. Queries and keys permuted alike keep every product q.k, so the attention is the
    same; values are not turned, nor permuted."""
    half, quarter = head_dim // 2, head_dim // 4
    angles = np.arange(half)
    if xy:  # keras_vit's row band j is timm's angle j + quarter, its column band j - quarter
        angles = (angles + quarter) % half
    if interleaved:
        return np.concatenate([2 * angles, 2 * angles + 1])
    return np.concatenate([angles, angles + half])


def _permuted_rope(arrays, spec, interleaved, xy, inverse=False):
    """The arrays with each head's query and key channels from timm's RoPE layout to keras_vit's
    (`inverse`: back). RoPE-Mixed ("mixed") has a frequency of each axis for every pair of
    channels: its pairs keep their order (timm's pair j, channels 2j and 2j + 1, is keras_vit's
    pair j, channels j and j + head_dim / 2), and its frequencies [x, y] are keras_vit's
    [row, column] with grid_indexing 'ij' (x multiplies the first index, the row), [column, row]
    with 'xy'."""
    arrays = dict(arrays)
    if spec.rope == "mixed":
        if xy:  # the rows of each block's frequencies swapped, which is its own inverse
            for index in range(spec.num_layers):
                key = common.ATTENTION.format(index) + "rope/frequencies"
                arrays[key] = arrays[key][::-1]
        xy = False
    if not (interleaved or xy):
        return arrays
    order = _rope_channels(spec.hidden_size // spec.num_heads, interleaved, xy)
    if inverse:
        order = np.argsort(order)
    for index in range(spec.num_layers):
        for name in ("query/kernel", "query/bias", "key/kernel", "key/bias"):
            key = common.ATTENTION.format(index) + name
            if key in arrays:  # kernels [D, heads, head_dim], biases [heads, head_dim]
                arrays[key] = arrays[key][..., order]
    return arrays


def _timm_rope_layout(config):
    """(interleaved, xy) of the RoPE of timm's checkpoint of `config` (None: keras_vit's)."""
    if config is None:
        return False, False
    args = _timm_args(config)[1]
    return not args.get("rope_rotate_half", True), args.get("rope_grid_indexing") == "xy"


def _eva_names(state, spec):
    """timm's Eva names as its VisionTransformer's: LayerScale's `gamma_1`, `gamma_2` as
    `ls1.gamma`, `ls2.gamma`; the split `q_proj`, `k_proj`, `v_proj` as `q`, `k`, `v`;
    EvaAttention's `q_bias`, `v_bias` as q's and v's biases, with the key's bias it keeps as a
    zero buffer (not in its files) as zeros; a packed SwiGLU's `fc1` as `fc1_g`, `fc1_x`;
    RoPE-Mixed's `rope.freqs` [2, depth, heads, head_dim / 2] as each block's
    `rope.freqs.N`."""
    if spec.activation == "swiglu":
        state = common.unpacked(state, _EVA_PACKED)
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


def _eva_attention(arrays, spec):
    """timm's Eva attention for the model's weights: EvaAttention ("eva": query and value
    biases, the key's zero), or AttentionRope ("rope": all three) for a non-zero key bias."""
    return "rope" if common.key_bias(arrays, spec) else "eva"


def _eva_state(state, spec, attention):
    """The inverse of `_eva_names`, for Eva's `attention` (`_eva_attention`); SwiGLU packed
    as GluMlp unless timm builds it unpacked (SwiGLU, for scale_mlp)."""
    renamed = {}
    if spec.rope == "mixed":
        state = dict(state)
        state["rope.freqs"] = np.stack([state.pop(f"rope.freqs.{index}")
                                        for index in range(spec.num_layers)], axis=1)
    for key, value in state.items():
        key = re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", key)
        if attention == "eva":  # EvaAttention: the key's bias is a zero buffer
            if key.endswith(".attn.k.bias"):
                continue
            key = re.sub(r"\.attn\.([qv])\.bias$", r".attn.\1_bias", key)
        renamed[key] = value
    if spec.activation == "swiglu" and not spec.mlp_inner_norm:
        return common.packed(renamed, _EVA_PACKED)
    return renamed


def _is_eva(spec):
    """Whether timm's files of a model of `spec` are its Eva's: RoPE, NormFormer's inner
    LayerNorms (scale_attn_inner, scale_mlp), which its VisionTransformer has not mapped, or
    Eva's attention pooling (`common.eva_pooling`)."""
    return bool(spec.rope or spec.mlp_inner_norm or spec.attention_inner_norm
                or common.eva_pooling(spec))


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


def _timm_args(config):
    """(architecture, arguments, class): the arguments timm builds the checkpoint's model
    with (its class's defaults, `VisionTransformer`'s or `Eva`'s, its architecture's, then the
    config's `model_args`, as `timm.create_model` does), and that class."""
    architecture = config["architecture"].split(".")[0]
    entry = timm_architectures().get(architecture)
    args = dict(config.get("model_args") or {})
    if entry is None:  # its options (heads, activation, epsilon...) would be guesses
        raise LayoutError(
            f"timm architecture {architecture!r} is not one keras_vit knows (timm 1.0.31's "
            "vit_*, deit* and eva02* architectures, keras_vit/timm_architectures.json).")
    if entry["class"] not in TIMM_CLASSES:
        raise LayoutError(
            f"timm architecture {architecture!r} is timm's {entry['class']}, not its "
            "VisionTransformer: keras_vit reads the VisionTransformer family (and DeiT's "
            "VisionTransformerDistilled, and Eva).")
    pretrained = config.get("pretrained_cfg") or {}
    defaults = {"Eva": _EVA_DEFAULTS, "VisionTransformerRelPos": _RELPOS_DEFAULTS}.get(
        entry.get("defaults"), _TIMM_DEFAULTS)
    merged = {**defaults, "img_size": pretrained.get("input_size", [3, 224, 224])[1:],
              **entry["args"], **args}
    if "global_pool" in config:  # timm writes the model's pooling beside model_args
        merged["global_pool"] = config["global_pool"]
    norm = merged.pop("norm_layer")
    if isinstance(norm, dict) and "layer_norm" in norm:
        merged["layer_norm_epsilon"] = norm["layer_norm"]
    else:
        merged["norm_layer"] = norm
    return architecture, merged, entry["class"]


def _timm_missing(args, distilled=False):
    """What keras_vit has no option for, in timm's words."""
    missing = [f"{name}={value!r}" for name, value in sorted(args.items())
               if name not in _TIMM_OPTIONS]
    if args["block_fn"] not in (None, _RES_POST_BLOCK):
        missing.append(f"block_fn={args['block_fn']!r}")
    glu = _is_glu(args["mlp_layer"])
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
    if args["global_pool"] not in _TIMM_POOLS:
        missing.append(f"global_pool={args['global_pool']!r}")
    elif args["global_pool"] == "token" and not args["class_token"]:
        missing.append(f"global_pool={args['global_pool']!r} with class_token="
                       f"{args['class_token']}")
    if args["in_chans"] != 3:
        missing.append(f"in_chans={args['in_chans']}")
    if distilled:
        missing += _distilled_missing(args)
    return missing


def _is_glu(mlp_layer):
    """Whether timm's `mlp_layer` (as the table records it) is a GluMlp whose fc1 holds the
    gate's rows first, as DINOv2 giant's SwiGLUPacked (gate_last=False)."""
    return (isinstance(mlp_layer, dict) and mlp_layer.get("partial") == "GluMlp"
            and mlp_layer.get("gate_last") is False)


def _timm_hybrid(architecture, args):
    """The units per stage of the ResNet of timm's hybrid `architecture` (None for one with
    timm's PatchEmbed), its embed_layer and padding_same taken out of `args`; a LayoutError
    for a stem keras_vit has not got, saying why."""
    embed = args.pop("embed_layer", None)
    padding_same = args.pop("padding_same", True)
    if embed is None:
        if padding_same is not True:
            args["padding_same"] = padding_same  # named by _timm_missing
        return None
    backbone = embed.get("hybrid_embed", {}).get("backbone", {}) if isinstance(embed,
                                                                               dict) else {}
    timm_numerics = TIMM_RESNET_EPSILONS
    problems = [problem for bad, problem in (
        (backbone.get("class") == "ConvStem",
         "MobileCLIP's convolutional stem (ConvStem: 3x3 convolutions with BatchNorm and a "
         "patch projection of their own, no ResNet), which keras_vit has no stem for"),
        (not backbone.get("class", "").startswith("ResNetV2"),
         f"an embed_layer {embed!r} that is not HybridEmbed on timm's ResNetV2"),
        (not padding_same or backbone.get("conv") == "StdConv2d",
         "padding_same=False (StdConv2d and a max pooling padded symmetrically, where "
         "keras_vit's ResNet pads as TensorFlow's 'same', as timm's StdConv2dSame does)"),
        (set(embed.get("hybrid_embed", {}) if isinstance(embed, dict) else ()) - {"backbone"},
         f"HybridEmbed options {embed!r}"),
        (tuple(backbone.get("layers", ())) not in _TIMM_HYBRIDS,
         f"a ResNetV2 of {backbone.get('layers')} units per stage (keras_vit's hybrids: "
         f"{', '.join(str(list(units)) for units in _TIMM_HYBRIDS)})"),
        (backbone.get("block", "Bottleneck") != "Bottleneck"
         or backbone.get("final_norm", "Identity") != "Identity",
         "a pre-activation ResNetV2 (preact=True)"),
        (backbone.get("conv") in ("StdConv2dSame", "StdConv2d") and (
            (backbone.get("conv_eps"), backbone.get("norm_eps")) != timm_numerics),
         f"weight standardisation epsilon {backbone.get('conv_eps')} and GroupNorm epsilon "
         f"{backbone.get('norm_eps')} (keras_vit's resnet_numerics='timm': "
         f"{timm_numerics[0]:g}, {timm_numerics[1]:g})"))
        if bad]
    if problems:
        raise LayoutError(f"timm architecture {architecture!r} is a hybrid of "
                          f"{problems[0]}, which keras_vit has no option for yet.")
    return tuple(backbone["layers"])


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


def spec_from_timm(config, state):
    """The `ViTConfig` of timm's `config.json`, with the sizes the weights `state` show."""
    architecture, args, timm_class = _timm_args(config)
    if timm_class == "Eva":
        return _spec_from_eva(architecture, args, config, state)
    if timm_class == "VisionTransformerRelPos":
        return _spec_from_relpos(architecture, args, config, state)
    distilled = TIMM_CLASSES[timm_class]
    hybrid = _timm_hybrid(architecture, args)  # None, or the ResNet's units per stage
    missing = _timm_missing(args, distilled)
    if missing:
        raise LayoutError(f"timm architecture {architecture!r} needs {', '.join(missing)}, "
                          "which keras_vit has no option for yet.")
    hidden, patch, layers = _timm_sizes(state)
    # A hybrid's patches are cut from the ResNet's map: pixels per patch, its stride times.
    pixels = patch * (1 if hybrid is None else 4 * 2 ** max(len(hybrid) - 1, 0))
    glu = _is_glu(args["mlp_layer"])  # GluMlp's fc1: the gate's rows and the value's
    mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0] // (2 if glu else 1)
    post_norm = args["block_fn"] == _RES_POST_BLOCK  # its init_values only start its norms
    prefix_tokens = int(bool(args["class_token"])) + int(distilled) + args["reg_tokens"]
    check_grid(tensor(state, "pos_embed", "timm"), args["img_size"], pixels,
               0 if args["no_embed_class"] else prefix_tokens, "img_size")
    hybrid_fields = {} if hybrid is None else dict(variant=_TIMM_HYBRIDS[hybrid],
                                                   resnet_numerics="timm")
    gap = args["global_pool"] == "avg"
    fc_norm = gap if args["fc_norm"] is None else args["fc_norm"]  # timm's rule
    final_norm = "none" if not args["final_norm"] else "pooled" if fc_norm else "tokens"
    num_classes = config.get("num_classes", args["num_classes"])
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch, **hybrid_fields,
                      image_size=_whole_patches(args["img_size"], pixels, architecture),
                      include_top=num_classes > 0, num_classes=max(num_classes, 1),
                      classifier=_TIMM_POOLS[args["global_pool"]],
                      class_token=bool(args["class_token"]),  # GAP and MAP leave it out
                      activation="swiglu" if glu else args["act_layer"],
                      layer_norm_epsilon=args["layer_norm_epsilon"],
                      qkv_bias=args["qkv_bias"],
                      layer_scale_init=None if post_norm else args["init_values"],
                      residual_post_norm=post_norm,
                      num_register_tokens=args["reg_tokens"],
                      prefix_position_embeddings=not args["no_embed_class"],
                      pre_norm=args["pre_norm"], final_norm=final_norm,
                      distillation_token=distilled,
                      dynamic_image_size=args["dynamic_img_size"],
                      dynamic_image_pad=args["dynamic_img_pad"],
                      position_embedding_interpolation="bicubic")  # as timm resamples


# timm's VisionTransformerRelPos arguments (timm 1.0.31's defaults; its norm_layer None is a
# LayerNorm of epsilon 1e-6, its act_layer None the exact GELU), and those that change nothing
# at inference.
_RELPOS_DEFAULTS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 1000, "global_pool": "avg",
    "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0, "qkv_bias": True,
    "qk_norm": False, "init_values": 1e-6, "class_token": False, "fc_norm": False,
    "rel_pos_type": "mlp", "rel_pos_dim": None, "shared_rel_pos": False,
    "embed_layer": "<PatchEmbed>", "norm_layer": {"layer_norm": 1e-6}, "act_layer": None,
    "block_fn": "<RelPosBlock>"}
_RELPOS_IGNORED = {"drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
                   "weight_init", "fix_init"}
_RELPOS_HIDDEN = 128  # RelPosMlp's hidden_dim where rel_pos_dim is None
# Its blocks -> an architecture of them (model_args cannot name a block class): pre-norm with
# LayerScale, or post-norm (`_rpn`, residual_post_norm; its init_values only start the norms).
_RELPOS_BLOCKS = {"<RelPosBlock>": "vit_relpos_base_patch16_224",
                  "<ResPostRelPosBlock>": "vit_relpos_medium_patch16_rpn_224"}


def _relpos_missing(args):
    """What of timm's VisionTransformerRelPos `args` keras_vit has no option for, with why."""
    pool = args["global_pool"]
    problems = [why for bad, why in (
        (args.get("shared_rel_pos"), "shared_rel_pos=True (one relative-position MLP shared by "
                                     "all blocks, vit_srelpos_*, where keras_vit's blocks have "
                                     "one each)"),
        (args["block_fn"] not in _RELPOS_BLOCKS, f"block_fn={args['block_fn']!r}"),
        (args["rel_pos_type"] != "mlp",
         f"rel_pos_type={args['rel_pos_type']!r} (keras_vit's relative_mlp is RelPosMlp in its "
         "default 'cr' mode, rel_pos_type 'mlp')"),
        (args["qk_norm"], "qk_norm=True (norms of each head's queries and keys)"),
        (pool not in ("avg", "token"), f"global_pool={pool!r}"),
        (args["embed_layer"] != "<PatchEmbed>", f"embed_layer={args['embed_layer']!r}"),
        (args["act_layer"] not in (None, "gelu"), f"act_layer={args['act_layer']!r}"),
        (args["in_chans"] != 3, f"in_chans={args['in_chans']}"),
        ("norm_layer" in args, f"norm_layer={args.get('norm_layer')!r}"))
        if bad]
    return problems + [f"{name}={value!r}" for name, value in sorted(args.items())
                       if name not in _RELPOS_DEFAULTS and name not in _RELPOS_IGNORED
                       and name != "layer_norm_epsilon"]


def _timm_sizes(state):
    """(width, patch size, blocks) of a timm ViT's weights: its patch kernel and block names."""
    kernel = tensor(state, "patch_embed.proj.weight", "timm")
    layers = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    return kernel.shape[0], kernel.shape[-1], layers


def _spec_from_relpos(architecture, args, config, state):
    """The `ViTConfig` of timm's VisionTransformerRelPos (its `vit_relpos_*`): no position
    embeddings, a relative-position MLP in every block (position_embedding "relative_mlp"),
    LayerScale (or post-norm blocks), GAP (with or without a class token) or the class
    token."""
    missing = _relpos_missing(args)
    if missing:
        raise LayoutError(f"timm architecture {architecture!r} (timm's VisionTransformerRelPos) "
                          f"needs {', '.join(missing)}, which keras_vit has no option for yet.")
    hidden, patch, layers = _timm_sizes(state)
    mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0]
    relative = tensor(state, "blocks.0.attn.rel_pos.mlp.fc1.weight", "timm").shape[0]
    num_classes = config.get("num_classes", args["num_classes"])
    post_norm = args["block_fn"] == "<ResPostRelPosBlock>"
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch,
                      image_size=_whole_patches(args["img_size"], patch, architecture),
                      include_top=num_classes > 0, num_classes=max(num_classes, 1),
                      classifier="token" if args["global_pool"] == "token" else "gap",
                      class_token=bool(args["class_token"]), activation="gelu",
                      layer_norm_epsilon=args["layer_norm_epsilon"], qkv_bias=args["qkv_bias"],
                      layer_scale_init=None if post_norm else args["init_values"] or None,
                      residual_post_norm=post_norm,
                      position_embedding="relative_mlp", relative_mlp_dim=int(relative),
                      final_norm="pooled" if args["fc_norm"] else "tokens")


# timm's Eva arguments (timm 1.0.31's defaults): those keras_vit maps, those it cannot, and
# the rest, which change nothing at inference.
_EVA_DEFAULTS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 1000, "global_pool": "avg",
    "embed_dim": 768, "depth": 12, "num_heads": 12, "num_kv_heads": None, "qkv_bias": True,
    "qkv_fused": True, "qk_norm": False, "mlp_ratio": 4.0, "swiglu_mlp": False,
    "swiglu_align_to": 0, "scale_mlp": False, "scale_attn_inner": False, "attn_type": "eva",
    "norm_layer": {"layer_norm": 1e-6}, "init_values": None, "attn_only_layer_scale": False,
    "class_token": True, "num_reg_tokens": 0, "no_embed_class": False, "use_abs_pos_emb": True,
    "use_rot_pos_emb": False, "rope_type": "cat", "rope_grid_offset": 0.0,
    "rope_grid_indexing": "ij", "rope_temperature": 10000.0, "rope_rotate_half": False,
    "rope_mrope_section": None, "use_post_norm": False, "use_pre_transformer_norm": False,
    "use_post_transformer_norm": None, "use_fc_norm": None, "attn_pool_num_heads": None,
    "attn_pool_mlp_ratio": None, "dynamic_img_size": False, "dynamic_img_pad": False,
    "ref_feat_shape": None}
# Training only (dropout, stochastic depth, RoPE's coordinate augmentation) or initialisation.
_EVA_IGNORED = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate",
                "attn_drop_rate", "drop_path_rate", "rope_shift_coords", "rope_jitter_coords",
                "rope_rescale_coords", "head_init_scale"}
# timm's Eva RoPE kinds -> keras_vit's.
_EVA_ROPES = {"cat": "axial", "dinov3": "axial_normalized", "mixed": "mixed"}


def _eva_missing(args):
    """What of timm's Eva `args` keras_vit has no option for, in timm's words, with why."""
    heads = args["num_kv_heads"]
    problems = {
        "norm_layer": ("norm_layer" in args, f"norm_layer={args.get('norm_layer')!r} (keras_vit's "
                                             "norms are LayerNorms; RmsNorm is not one)"),
        "qk_norm": (args["qk_norm"], "qk_norm=True (norms of each head's queries and keys)"),
        "num_kv_heads": (heads is not None and set(np.ravel(heads)) != {args["num_heads"]},
                         "num_kv_heads (grouped-query attention: fewer key and value heads)"),
        "attn_only_layer_scale": (args["attn_only_layer_scale"] and args["init_values"]
                                  is not None, "attn_only_layer_scale=True (LayerScale on the "
                                               "attention alone)"),
        "attn_type": (args["attn_type"] not in ("eva", "rope"),
                      f"attn_type={args['attn_type']!r}"),
        "in_chans": (args["in_chans"] != 3, f"in_chans={args['in_chans']}"),
    }
    if args["use_rot_pos_emb"]:
        kind = args["rope_type"]
        problems.update({
            "rope_type": (kind not in _EVA_ROPES, f"rope_type={kind!r}"),
            "rope_grid_offset": (kind == "dinov3" and args["rope_grid_offset"] != 0,
                                 f"rope_grid_offset={args['rope_grid_offset']!r} with "
                                 "rope_type='dinov3' (keras_vit offsets the indices of 'cat' "
                                 "RoPE only)"),
            "rope_rotate_half": (kind == "mixed" and args["rope_rotate_half"],
                                 "rope_rotate_half=True with rope_type='mixed' (RoPE-Mixed's "
                                 "channels are interleaved)")})
    pool, token = args["global_pool"], args["class_token"]
    fc_norm, norm = _eva_norms(args)
    problems.update({
        "global_pool": (pool not in ("token", "avg", "map") or (pool == "token" and not token),
                        f"global_pool={pool!r} with class_token={token}"),
        # Eva's AttentionPoolLatent is VisionTransformer's (one latent, no position
        # embeddings, no q/k norms) over every token, prefix ones too (map_include_prefix),
        # of attn_pool_num_heads heads and an exact-GELU MLP of attn_pool_mlp_ratio.
        "attn_pool": (pool == "map" and args["swiglu_mlp"],
                      "global_pool='map' with swiglu_mlp=True (Eva's attention pooling has an "
                      "exact-GELU MLP, keras_vit's the blocks' SwiGLU)"),
        "use_fc_norm": (fc_norm and norm, "both a norm of the tokens and one of the pooled "
                                          "vector (use_fc_norm with use_post_transformer_norm)")})
    missing = [why for bad, why in problems.values() if bad]
    return missing + [f"{name}={value!r}" for name, value in sorted(args.items())
                      if name not in _EVA_DEFAULTS and name not in _EVA_IGNORED
                      and name != "layer_norm_epsilon"]


def _eva_norms(args):
    """(fc_norm, norm): whether timm's Eva norms the pooled vector, and the tokens (its rule)."""
    fc_norm = (args["global_pool"] == "avg" if args["use_fc_norm"] is None
               else bool(args["use_fc_norm"]))
    norm = (not fc_norm if args["use_post_transformer_norm"] is None
            else bool(args["use_post_transformer_norm"]))
    return fc_norm, norm


def _spec_from_eva(architecture, args, config, state):
    """The `ViTConfig` of timm's Eva (EVA-02, its RoPE ViTs, DINOv3...)."""
    missing = _eva_missing(args)
    if missing:
        raise LayoutError(f"timm architecture {architecture!r} (timm's Eva) needs "
                          f"{', '.join(missing)}, which keras_vit has no option for yet.")
    hidden, patch, layers = _timm_sizes(state)
    swiglu = args["swiglu_mlp"]
    if swiglu and "blocks.0.mlp.fc1_g.weight" in state:  # SwiGLU's unpacked (aligned) rows
        mlp = state["blocks.0.mlp.fc1_g.weight"].shape[0]
    else:  # GluMlp packs the gate's rows and the value's
        mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0] // (2 if swiglu else 1)
    prefix_tokens = int(bool(args["class_token"])) + args["num_reg_tokens"]
    if args["use_abs_pos_emb"]:
        check_grid(tensor(state, "pos_embed", "timm"), args["img_size"], patch,
                   0 if args["no_embed_class"] else prefix_tokens, "img_size")
    fc_norm, norm = _eva_norms(args)
    pool = args["global_pool"]
    attention_pool = {}
    if pool == "map":  # AttentionPoolLatent over every token: int(width * ratio) MLP units
        ratio = args["attn_pool_mlp_ratio"]
        attention_pool = dict(map_num_heads=args["attn_pool_num_heads"],
                              map_mlp_dim=int(hidden * ratio) if ratio else None,
                              map_include_prefix=True)
    post_norm = bool(args["use_post_norm"])  # EvaBlockPostNorm ignores init_values
    rope = _EVA_ROPES[args["rope_type"]] if args["use_rot_pos_emb"] else None
    reference = args["ref_feat_shape"] if rope == "axial" else None
    num_classes = config.get("num_classes", args["num_classes"])
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch,
                      image_size=_whole_patches(args["img_size"], patch, architecture),
                      include_top=num_classes > 0, num_classes=max(num_classes, 1),
                      classifier={"token": "token", "map": "map"}.get(pool, "gap"),
                      class_token=bool(args["class_token"]),  # GAP leaves it out (DINOv3, EVA-02)
                      **attention_pool,
                      activation="swiglu" if swiglu else "gelu",  # Eva's Mlp: exact GELU
                      layer_norm_epsilon=args["layer_norm_epsilon"],
                      qkv_bias=args["qkv_bias"],
                      layer_scale_init=None if post_norm else args["init_values"],
                      residual_post_norm=post_norm,
                      num_register_tokens=args["num_reg_tokens"],
                      position_embedding="learned" if args["use_abs_pos_emb"] else "none",
                      prefix_position_embeddings=not (args["use_abs_pos_emb"]
                                                      and args["no_embed_class"]),
                      pre_norm=args["use_pre_transformer_norm"],
                      final_norm="pooled" if fc_norm else "tokens" if norm else "none",
                      rope=rope, rope_temperature=float(args["rope_temperature"]) if rope else None,
                      rope_reference_grid=([reference] * 2 if isinstance(reference, int)
                                           else reference),
                      rope_grid_offset=float(args["rope_grid_offset"]) if rope == "axial" else 0.0,
                      mlp_inner_norm=bool(args["scale_mlp"]),
                      attention_inner_norm=bool(args["scale_attn_inner"]),
                      dynamic_image_size=args["dynamic_img_size"],
                      dynamic_image_pad=args["dynamic_img_pad"],
                      position_embedding_interpolation="bicubic")  # as timm resamples


def _whole_patches(image_size, patch, architecture):
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


def timm_config(spec, preprocessing, arrays=None):
    """timm's `config.json` (what `timm.create_model("local-dir:DIR", pretrained=True)` reads)
    for a model of `spec`: its sizes and options in `model_args`, on an architecture whose
    LayerNorm epsilon is the model's (timm's model_args cannot name one), and in
    `pretrained_cfg` the resize and crop of `preprocessing` (the model's
    `keras_vit.EvalPreprocessing`). A model with DeiT's distillation token is timm's
    VisionTransformerDistilled, which takes the same arguments; one with RoPE is timm's Eva,
    whose attention depends on the weights, `arrays` (`_eva_attention`), as is one with
    NormFormer's inner LayerNorms (timm's scale_attn_inner, scale_mlp)."""
    if _is_eva(spec):
        return _eva_config(spec, preprocessing, arrays)
    if spec.position_embedding == "relative_mlp":
        return _relpos_config(spec, preprocessing)
    timm_class = next(name for name, distilled in TIMM_CLASSES.items()
                      if distilled == spec.distillation_token)
    if spec.is_hybrid:
        _check_timm_hybrid(spec)
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
    pool = {classifier: pool for pool, classifier in _TIMM_POOLS.items()}[spec.classifier]
    args = {"img_size": [height, width], "patch_size": spec.patch_size,
            "embed_dim": spec.hidden_size, "depth": spec.num_layers,
            "num_heads": spec.num_heads,
            # GluMlp's fc1 holds the gate's units and the value's: int(width * ratio) of both
            "mlp_ratio": (_ratio(spec.hidden_size, 2 * spec.mlp_dim) if swiglu
                          else spec.mlp_dim / spec.hidden_size),
            "class_token": bool(spec.class_token), "global_pool": pool,
            "fc_norm": spec.final_norm == "pooled",
            "act_layer": "silu" if swiglu else spec.activation}
    later = {"final_norm": spec.final_norm != "none", "qkv_bias": spec.qkv_bias,
             "init_values": spec.layer_scale_init, "reg_tokens": spec.num_register_tokens,
             "no_embed_class": not spec.prefix_position_embeddings, "pre_norm": spec.pre_norm,
             "dynamic_img_size": spec.dynamic_image_size,
             "dynamic_img_pad": spec.dynamic_image_pad}
    # timm's model_args cannot name a stem, a block or an MLP class: an architecture of them
    # is chosen, and only the options that differ from its own are written (a config any timm
    # with them reads).
    if spec.is_hybrid:
        architecture = _timm_hybrid_architecture(spec)
        chosen = {**_TIMM_DEFAULTS, **timm_architectures()[architecture].get("args", {})}
    else:
        architecture, chosen = _timm_architecture_of_epsilon(
            spec.layer_norm_epsilon, timm_class,
            block_fn=_RES_POST_BLOCK if spec.residual_post_norm else None, glu=swiglu)
    args.update({name: value for name, value in later.items() if value != chosen[name]})
    return _timm_config_file(spec, preprocessing, args, architecture)


def _check_timm_hybrid(spec):
    """A LayoutError for a hybrid timm cannot build: its ResNetV2 hard-codes timm's numerics,
    and it has no distilled hybrid."""
    if spec.residual_post_norm or spec.activation == "swiglu":
        raise LayoutError("timm's hybrids have pre-norm blocks and GELU MLPs: save a hybrid "
                          "without residual_post_norm or SwiGLU.")
    if spec.resnet_numerics != "timm":
        raise LayoutError(
            f"timm's ResNetV2 hard-codes its numerics (weights standardised by sqrt(var + "
            f"1e-8), GroupNorm epsilon 1e-5; StdConv2dSame, GroupNormAct), and this "
            f"{spec.variant} has resnet_numerics={spec.resnet_numerics!r} (the original's, "
            "which timm's logits would not match): build it with resnet_numerics='timm' to "
            "write it for timm, or save it with keras_vit.checkpoint.save_npz.")
    if spec.distillation_token or spec.axial:
        raise LayoutError("timm's hybrids are VisionTransformers: it has no hybrid with a "
                          "distillation token or axial blocks.")


def _timm_hybrid_architecture(spec):
    """timm's hybrid architecture with the model's ResNet (its entry point builds the
    backbone; model_args set the rest) and LayerNorm epsilon."""
    table, epsilons = timm_architectures(), set()
    units = tuple(spec.resnet_units)
    for name in [_TIMM_HYBRID_ARCHITECTURES[units], *sorted(table)]:
        entry = table.get(name, {})
        args = {**_TIMM_DEFAULTS, **entry.get("args", {})}
        if entry.get("class") != "VisionTransformer" or "embed_layer" not in args:
            continue
        try:
            if _timm_hybrid(name, args) != units:
                continue
        except LayoutError:
            continue
        norm = args.pop("norm_layer")
        if (not isinstance(norm, dict) or "layer_norm" not in norm
                or _timm_missing({**args, "layer_norm_epsilon": norm["layer_norm"]})):
            continue
        if norm["layer_norm"] == spec.layer_norm_epsilon:
            return name
        epsilons.add(norm["layer_norm"])
    raise LayoutError(
        f"timm's hybrids of this ResNet ({spec.variant}) have LayerNorms of epsilon "
        f"{' or '.join(f'{value:g}' for value in sorted(epsilons, reverse=True))}, the model "
        f"{spec.layer_norm_epsilon}; timm's model_args cannot name another.")


def _relpos_config(spec, preprocessing):
    """timm's VisionTransformerRelPos `config.json` for a model of position_embedding
    "relative_mlp" (its RelPosMlp in every block): every argument in `model_args`."""
    problems = [problem for bad, problem in (
        (spec.is_hybrid or spec.axial, f"ResNet stem or axial blocks ({spec.variant})"),
        (spec.position_embedding_placement != "stem",
         f"position embeddings placed {spec.position_embedding_placement!r}"),
        (spec.distillation_token, "distillation token"),
        (spec.num_register_tokens, "register tokens"),
        (spec.pre_norm, "norm before the blocks (pre_norm)"),
        (spec.final_norm == "none", "model without a final norm (final_norm='none')"),
        (spec.classifier not in ("token", "gap"), f"classifier={spec.classifier!r}"),
        (spec.activation != "gelu", f"activation={spec.activation!r} (its MLPs are exact "
                                    "GELU)"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.rope or spec.mlp_inner_norm or spec.attention_inner_norm,
         "RoPE or inner LayerNorms"),
        (spec.dynamic_image_size or spec.dynamic_image_pad,
         "dynamic image size (its relative positions are made for one grid)"),
        (spec.layer_norm_epsilon != _RELPOS_DEFAULTS["norm_layer"]["layer_norm"],
         f"LayerNorm epsilon {spec.layer_norm_epsilon} (its are 1e-6; timm's model_args "
         "cannot name another)"))
        if bad]
    if problems:
        raise LayoutError(f"A model of position_embedding='relative_mlp' is written as timm's "
                          f"VisionTransformerRelPos, which has no {'; no '.join(problems)}.")
    height, width = spec.image_size
    args = {"img_size": [height, width], "patch_size": spec.patch_size,
            "embed_dim": spec.hidden_size, "depth": spec.num_layers,
            "num_heads": spec.num_heads, "mlp_ratio": _mlp_ratio(spec),
            "qkv_bias": spec.qkv_bias, "init_values": spec.layer_scale_init,
            "class_token": spec.class_token,
            "global_pool": "token" if spec.classifier == "token" else "avg",
            "fc_norm": spec.final_norm == "pooled", "rel_pos_type": "mlp",
            "rel_pos_dim": spec.relative_mlp_dim or _RELPOS_HIDDEN, "shared_rel_pos": False}
    block = "<ResPostRelPosBlock>" if spec.residual_post_norm else "<RelPosBlock>"
    return _timm_config_file(spec, preprocessing, args, _RELPOS_BLOCKS[block])


def _timm_config_file(spec, preprocessing, args, architecture):
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


def _eva_config(spec, preprocessing, arrays):
    """timm's Eva `config.json` for a model with RoPE, inner LayerNorms or Eva's attention
    pooling (`_is_eva`): every Eva argument in `model_args` (so that none of the
    architecture's own applies), RoPE laid out as `_EVA_WRITTEN_ROPE` says."""
    problems = [problem for bad, problem in (
        (spec.is_hybrid or spec.axial, f"ResNet stem or axial blocks ({spec.variant})"),
        (spec.position_embedding not in ("learned", "none"),
         f"position_embedding={spec.position_embedding!r}"),
        (spec.position_embedding_placement != "stem",
         f"position embeddings added in every block ({spec.position_embedding_placement!r})"),
        (spec.distillation_token, "distillation token"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.classifier == "map" and spec.activation != "gelu",
         f"attention pooling with activation={spec.activation!r} (its pooling's MLP is exact "
         "GELU whatever the blocks')"),
        (spec.classifier == "map" and spec.num_prefix_tokens and not spec.map_include_prefix,
         "attention pooling that leaves the class and register tokens out (its attends to "
         "every token: map_include_prefix=True)"),
        (spec.activation not in ("gelu", "swiglu"), f"activation={spec.activation!r} (its MLPs "
                                                    "are exact GELU or SwiGLU)"),
        (spec.pre_norm and spec.position_embedding == "none",
         "pre_norm without position embeddings (its patch embedding then has no bias, which "
         "keras_vit folds into the position embeddings)"))
        if bad]
    if problems:
        raise LayoutError(f"A model with RoPE, inner LayerNorms or Eva's attention pooling is "
                          f"written as timm's Eva, which has no {'; no '.join(problems)}.")
    height, width = spec.image_size
    interleaved, xy = _EVA_WRITTEN_ROPE.get(spec.rope, (False, False))
    fc_norm = spec.final_norm == "pooled"
    args = {name: value for name, value in _EVA_DEFAULTS.items()
            if name not in ("norm_layer", "num_classes")}
    args.update({
        "img_size": [height, width], "patch_size": spec.patch_size,
        "global_pool": {"token": "token", "map": "map"}.get(spec.classifier, "avg"),
        "embed_dim": spec.hidden_size, "depth": spec.num_layers, "num_heads": spec.num_heads,
        "qkv_bias": spec.qkv_bias, "attn_type": _eva_attention(arrays, spec),
        "mlp_ratio": _mlp_ratio(spec), "swiglu_mlp": spec.activation == "swiglu",
        "init_values": spec.layer_scale_init, "class_token": spec.class_token,
        "num_reg_tokens": spec.num_register_tokens,
        "no_embed_class": not spec.prefix_position_embeddings,
        "use_abs_pos_emb": spec.position_embedding == "learned",
        "use_rot_pos_emb": bool(spec.rope),
        "rope_type": {kind: name for name, kind in _EVA_ROPES.items()}.get(spec.rope, "cat"),
        "rope_temperature": spec.rope_temperature or _EVA_DEFAULTS["rope_temperature"],
        "rope_rotate_half": not interleaved, "rope_grid_indexing": "xy" if xy else "ij",
        "rope_grid_offset": spec.rope_grid_offset,
        "ref_feat_shape": list(spec.rope_reference_grid) if spec.rope_reference_grid else None,
        "scale_mlp": spec.mlp_inner_norm, "scale_attn_inner": spec.attention_inner_norm,
        "use_post_norm": spec.residual_post_norm,
        "use_pre_transformer_norm": spec.pre_norm, "use_fc_norm": fc_norm,
        "use_post_transformer_norm": spec.final_norm == "tokens",
        "dynamic_img_size": spec.dynamic_image_size, "dynamic_img_pad": spec.dynamic_image_pad})
    if spec.classifier == "map":  # AttentionPoolLatent: its heads, int(width * ratio) units
        args.update(attn_pool_num_heads=spec.map_num_heads or spec.num_heads,
                    attn_pool_mlp_ratio=_ratio(spec.hidden_size,
                                               spec.map_mlp_dim or spec.mlp_dim))
    return _timm_config_file(spec, preprocessing, args,
                             _eva_architecture_of_epsilon(spec.layer_norm_epsilon))


def _mlp_ratio(spec):
    """timm's mlp_ratio r for mlp_dim: its blocks make int(width * r) units."""
    return _ratio(spec.hidden_size, spec.mlp_dim)


def _ratio(width, units):
    """The ratio r for which timm's int(width * r) is `units`."""
    ratio = units / width
    while int(width * ratio) < units:  # a quotient rounded down
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def _eva_architecture_of_epsilon(epsilon):
    """An Eva architecture of timm's whose LayerNorms have this epsilon, and every other
    argument one `_eva_config` writes."""
    epsilons, table = set(), timm_architectures()
    # The familiar names first: EVA-02 B/14 (epsilon 1e-6), DINOv3 B/16 (1e-5).
    for name in ["eva02_base_patch14_224", "vit_base_patch16_dinov3", *sorted(table)]:
        entry = table.get(name, {"args": {}})
        norm = entry["args"].get("norm_layer", _EVA_DEFAULTS["norm_layer"])
        if (entry.get("defaults") != "Eva" or not isinstance(norm, dict)
                or "layer_norm" not in norm or set(entry["args"]) - set(_EVA_DEFAULTS)):
            continue
        if norm["layer_norm"] == epsilon:
            return name
        epsilons.add(norm["layer_norm"])
    raise LayoutError(
        f"timm's Eva architectures have LayerNorms of epsilon "
        f"{' or '.join(f'{value:g}' for value in sorted(epsilons, reverse=True))}, the model "
        f"{epsilon}; timm's model_args cannot name another.")


def _timm_architecture_of_epsilon(epsilon, timm_class="VisionTransformer", block_fn=None,
                                  glu=False):
    """(name, its arguments): an architecture of timm's `timm_class` whose options keras_vit
    maps (all of which model_args override), whose LayerNorms have this epsilon, whose blocks
    are `block_fn` (None: timm's Block) and whose MLPs are GluMlp (`glu`) or not: model_args
    can name neither a norm's epsilon nor a class."""
    table = timm_architectures()
    distilled = TIMM_CLASSES[timm_class]
    # The familiar names first: ViT-B/16 (epsilon 1e-6), its CLIP form (1e-5), DeiT-B (1e-6).
    familiar = ["vit_base_patch16_224", "vit_base_patch16_clip_224",
                "deit_base_distilled_patch16_224"]
    epsilons = set()
    for name in [*familiar, *sorted(table)]:
        entry = table.get(name, {})
        if entry.get("class") != timm_class:
            continue
        args = {**_TIMM_DEFAULTS, **entry["args"]}
        norm = args.pop("norm_layer")
        if (not isinstance(norm, dict) or "layer_norm" not in norm
                or _timm_missing({**args, "layer_norm_epsilon": norm["layer_norm"]}, distilled)
                or args["block_fn"] != block_fn or _is_glu(args["mlp_layer"]) != glu):
            continue
        if norm["layer_norm"] == epsilon:
            return name, args
        epsilons.add(norm["layer_norm"])
    kind = " and ".join(what for what, wanted in (
        ("ResPostBlock blocks (residual_post_norm)", block_fn == _RES_POST_BLOCK),
        ("SwiGLU MLPs (SwiGLUPacked)", glu)) if wanted)
    if not epsilons:
        raise LayoutError(f"No {timm_class} architecture of timm's has {kind}, and its "
                          "model_args cannot name a block or an MLP class.")
    raise LayoutError(
        f"timm's {timm_class} architectures{' of ' + kind if kind else ''} have LayerNorms of "
        f"epsilon {' or '.join(f'{value:g}' for value in sorted(epsilons, reverse=True))}, the "
        f"model {epsilon}; timm's model_args cannot name another.")

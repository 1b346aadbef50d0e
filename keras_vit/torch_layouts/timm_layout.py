"""timm's ViT weight layouts (its `VisionTransformer`, `VisionTransformerDistilled`, the
ViT-ResNet hybrids and `VisionTransformerRelPos`; its `Eva` through `eva_layout`), as maps to
and from the original `.npz` layout (`keras_vit.checkpoint`), and their `config.json` to and
from a `ViTConfig`. Pure NumPy: no torch is needed to read or write them.

timm's `VisionTransformer` fuses the query, key and value (`blocks.N.attn.qkv`, [3D, D]).
Linear weights are (out, in), the patch convolution (D, C, p, p). Its later ViTs add register
tokens (`reg_token`), a norm before the blocks (`norm_pre`, with no patch bias), LayerScale
(`blocks.N.ls1.gamma`, `ls2.gamma`) and a norm after pooling (`fc_norm`); which of these an
architecture has is in `timm_architectures.json` (`timm_common`), which also records the
arguments of its `Eva` class's architectures (`eva_layout`) and its `VisionTransformerRelPos`'s.
"""

from keras_vit.spec import ACTIVATIONS
from keras_vit.torch_layouts import common, eva_layout, timm_common
from keras_vit.torch_layouts.common import LayoutError, check_grid, sized_spec, tensor

# timm's model classes keras_vit reads -> whether it has DeiT's distillation token;
# VisionTransformerDistilled takes VisionTransformer's arguments, Eva its own
# (`eva_layout.DEFAULTS`).
TIMM_CLASSES = {"VisionTransformer": False, "VisionTransformerDistilled": True, "Eva": False,
                "VisionTransformerRelPos": False}
# timm's VisionTransformer arguments that keras_vit has options for, with timm's defaults
# (timm 1.0.31); any other argument an architecture sets is an option keras_vit lacks.
_DEFAULTS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 1000,
    "global_pool": "token", "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0,
    "qkv_bias": True, "init_values": None, "class_token": True, "no_embed_class": False,
    "reg_tokens": 0, "pre_norm": False, "final_norm": True, "fc_norm": None,
    "dynamic_img_size": False, "dynamic_img_pad": False, "act_layer": "gelu",
    "norm_layer": {"layer_norm": 1e-6}, "drop_rate": 0.0, "pos_drop_rate": 0.0,
    "proj_drop_rate": 0.0, "attn_drop_rate": 0.0, "drop_path_rate": 0.0,
    "block_fn": None, "mlp_layer": None}  # None: timm's Block and Mlp
# timm's block_fn keras_vit maps, as timm_architectures.json records it: ResPostBlock
# (x + LN(branch(x)): residual_post_norm). Its mlp_layer: DINOv2 giant's SwiGLUPacked (`_is_glu`).
_RES_POST_BLOCK = "<ResPostBlock>"
_SILU = ("<SiLU>", "silu", "swish")  # act_layer as a class, or get_act_layer's names
# norm_layer is read as layer_norm_epsilon where it is a LayerNorm; any other is missing.
_OPTIONS = set(_DEFAULTS) - {"norm_layer"} | {"layer_norm_epsilon"}
_POOLS = {"token": "token", "avg": "gap", "map": "map"}  # timm's global_pool -> classifier
# timm's ViT-ResNet hybrids (vision_transformer_hybrid.py: a VisionTransformer whose
# embed_layer is HybridEmbed on a ResNetV2, `_resnetv2`): the units of each stage of its
# backbone -> keras_vit's variant with that ResNet (the checkpoint's sizes override the rest),
# and the architectures written for each, familiar names first.
_HYBRIDS = {(): "R+Ti/16", (2, 2, 2, 2): "R26+S/32", (3, 4, 9): "R50+B/16",
            (3, 4, 6, 3): "R50+L/32"}
_HYBRID_ARCHITECTURES = {(): "vit_tiny_r_s16_p8_224", (2, 2, 2, 2): "vit_small_r26_s32_224",
                         (3, 4, 9): "vit_base_r50_s16_224",
                         (3, 4, 6, 3): "vit_large_r50_s32_224"}
# Its numerics, keras_vit's resnet_numerics="timm" (keras_vit.resnet.NUMERICS, not imported:
# this module needs no Keras): the weight standardisation's and GroupNorm's epsilons.
TIMM_RESNET_EPSILONS = (1e-8, 1e-5)
# Tensors timm keeps packed (`common.unpacked`).
_PACKED = ((r".*attn", ".qkv.", ("q", "k", "v")),  # the blocks' attention
           # the attention pooling's (its q apart: it projects the probe)
           (r".*attn_pool", ".kv.", ("k", "v")))


def weight_pairs(spec):
    """Every (`.npz` key, their key, kind) of a model of `spec` in timm's class for it, its
    Eva's names as its VisionTransformer's (`eva_layout.eva_names`)."""
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
    if spec.activation == "swiglu":  # GluMlp's packed fc1 unpacked (`to_npz_arrays`)
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
    packings = _PACKED + (timm_common.GLU_PACKED if spec.activation == "swiglu" else ())
    state = eva_layout.eva_names(common.unpacked(state, packings), spec)
    arrays = common.to_arrays(state, weight_pairs(spec), spec, "timm")
    if spec.rope:
        arrays = eva_layout.permuted_rope(arrays, spec, *_timm_rope_layout(config))
    return arrays


def from_npz_arrays(arrays, spec):
    """The `.npz` layout (`checkpoint.model_arrays`) as timm's state dict."""
    if spec.pre_norm:
        arrays = common.fold_patch_bias(arrays, spec)
    if spec.rope:
        arrays = eva_layout.permuted_rope(arrays, spec, *eva_layout.WRITTEN_ROPE[spec.rope],
                                          inverse=True)
    state = common.from_arrays(arrays, weight_pairs(spec), spec, "timm")
    if eva_layout.is_eva(spec):
        state = eva_layout.eva_state(state, spec, eva_layout.eva_attention(arrays, spec))
    elif spec.activation == "swiglu":  # VisionTransformer's GluMlp
        state = common.packed(state, timm_common.GLU_PACKED)
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


def _timm_rope_layout(config):
    """(interleaved, xy) of the RoPE of timm's checkpoint of `config` (None: keras_vit's)."""
    if config is None:
        return False, False
    args = _timm_args(config)[1]
    return not args.get("rope_rotate_half", True), args.get("rope_grid_indexing") == "xy"


def _timm_args(config):
    """(architecture, arguments, class): the arguments timm builds the checkpoint's model
    with (its class's defaults, `VisionTransformer`'s or `Eva`'s, its architecture's, then the
    config's `model_args`, as `timm.create_model` does), and that class."""
    architecture = config["architecture"].split(".")[0]
    entry = timm_common.timm_architectures().get(architecture)
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
    defaults = {"Eva": eva_layout.DEFAULTS, "VisionTransformerRelPos": _RELPOS_DEFAULTS}.get(
        entry.get("defaults"), _DEFAULTS)
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
               if name not in _OPTIONS]
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
        (tuple(backbone.get("layers", ())) not in _HYBRIDS,
         f"a ResNetV2 of {backbone.get('layers')} units per stage (keras_vit's hybrids: "
         f"{', '.join(str(list(units)) for units in _HYBRIDS)})"),
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
        return eva_layout.spec_from_eva(architecture, args, config, state)
    if timm_class == "VisionTransformerRelPos":
        return _spec_from_relpos(architecture, args, config, state)
    distilled = TIMM_CLASSES[timm_class]
    hybrid = _timm_hybrid(architecture, args)  # None, or the ResNet's units per stage
    missing = _timm_missing(args, distilled)
    if missing:
        raise LayoutError(f"timm architecture {architecture!r} needs {', '.join(missing)}, "
                          "which keras_vit has no option for yet.")
    hidden, patch, layers = timm_common.sizes(state)
    # A hybrid's patches are cut from the ResNet's map: pixels per patch, its stride times.
    pixels = patch * (1 if hybrid is None else 4 * 2 ** max(len(hybrid) - 1, 0))
    glu = _is_glu(args["mlp_layer"])  # GluMlp's fc1: the gate's rows and the value's
    mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0] // (2 if glu else 1)
    post_norm = args["block_fn"] == _RES_POST_BLOCK  # its init_values only start its norms
    prefix_tokens = int(bool(args["class_token"])) + int(distilled) + args["reg_tokens"]
    check_grid(tensor(state, "pos_embed", "timm"), args["img_size"], pixels,
               0 if args["no_embed_class"] else prefix_tokens, "img_size")
    hybrid_fields = {} if hybrid is None else dict(variant=_HYBRIDS[hybrid],
                                                   resnet_numerics="timm")
    gap = args["global_pool"] == "avg"
    fc_norm = gap if args["fc_norm"] is None else args["fc_norm"]  # timm's rule
    final_norm = "none" if not args["final_norm"] else "pooled" if fc_norm else "tokens"
    num_classes = config.get("num_classes", args["num_classes"])
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch, **hybrid_fields,
                      image_size=timm_common.whole_patches(args["img_size"], pixels, architecture),
                      include_top=num_classes > 0, num_classes=max(num_classes, 1),
                      classifier=_POOLS[args["global_pool"]],
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


def _spec_from_relpos(architecture, args, config, state):
    """The `ViTConfig` of timm's VisionTransformerRelPos (its `vit_relpos_*`): no position
    embeddings, a relative-position MLP in every block (position_embedding "relative_mlp"),
    LayerScale (or post-norm blocks), GAP (with or without a class token) or the class
    token."""
    missing = _relpos_missing(args)
    if missing:
        raise LayoutError(f"timm architecture {architecture!r} (timm's VisionTransformerRelPos) "
                          f"needs {', '.join(missing)}, which keras_vit has no option for yet.")
    hidden, patch, layers = timm_common.sizes(state)
    mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0]
    relative = tensor(state, "blocks.0.attn.rel_pos.mlp.fc1.weight", "timm").shape[0]
    num_classes = config.get("num_classes", args["num_classes"])
    post_norm = args["block_fn"] == "<ResPostRelPosBlock>"
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch,
                      image_size=timm_common.whole_patches(args["img_size"], patch, architecture),
                      include_top=num_classes > 0, num_classes=max(num_classes, 1),
                      classifier="token" if args["global_pool"] == "token" else "gap",
                      class_token=bool(args["class_token"]), activation="gelu",
                      layer_norm_epsilon=args["layer_norm_epsilon"], qkv_bias=args["qkv_bias"],
                      layer_scale_init=None if post_norm else args["init_values"] or None,
                      residual_post_norm=post_norm,
                      position_embedding="relative_mlp", relative_mlp_dim=int(relative),
                      final_norm="pooled" if args["fc_norm"] else "tokens")


def timm_config(spec, preprocessing, arrays=None):
    """timm's `config.json` (what `timm.create_model("local-dir:DIR", pretrained=True)` reads)
    for a model of `spec`: its sizes and options in `model_args`, on an architecture whose
    LayerNorm epsilon is the model's (timm's model_args cannot name one), and in
    `pretrained_cfg` the resize and crop of `preprocessing` (the model's
    `keras_vit.EvalPreprocessing`). A model with DeiT's distillation token is timm's
    VisionTransformerDistilled, which takes the same arguments; one with RoPE is timm's Eva,
    whose attention depends on the weights, `arrays` (`eva_layout.eva_attention`), as is one
    with NormFormer's inner LayerNorms (timm's scale_attn_inner, scale_mlp)."""
    if eva_layout.is_eva(spec):
        return eva_layout.eva_config(spec, preprocessing, arrays)
    if spec.position_embedding == "relative_mlp":
        return _relpos_config(spec, preprocessing)
    timm_class = next(name for name, distilled in TIMM_CLASSES.items()
                      if distilled == spec.distillation_token)
    common.check_expressible(f"This model is written as timm's {timm_class}",
                             [(spec.classifier == "token_gap", timm_common.TOKEN_GAP)])
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
    pool = {classifier: pool for pool, classifier in _POOLS.items()}[spec.classifier]
    args = {"img_size": [height, width], "patch_size": spec.patch_size,
            "embed_dim": spec.hidden_size, "depth": spec.num_layers,
            "num_heads": spec.num_heads,
            # GluMlp's fc1 holds the gate's units and the value's: int(width * ratio) of both
            "mlp_ratio": (timm_common.ratio(spec.hidden_size, 2 * spec.mlp_dim) if swiglu
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
        chosen = {**_DEFAULTS,
                  **timm_common.timm_architectures()[architecture].get("args", {})}
    else:
        architecture, chosen = _timm_architecture_of_epsilon(
            spec.layer_norm_epsilon, timm_class,
            block_fn=_RES_POST_BLOCK if spec.residual_post_norm else None, glu=swiglu)
    args.update({name: value for name, value in later.items() if value != chosen[name]})
    return timm_common.config_file(spec, preprocessing, args, architecture)


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
    table = timm_common.timm_architectures()
    units = tuple(spec.resnet_units)

    def fitting():
        for name in [_HYBRID_ARCHITECTURES[units], *sorted(table)]:
            entry = table.get(name, {})
            args = {**_DEFAULTS, **entry.get("args", {})}
            if entry.get("class") != "VisionTransformer" or "embed_layer" not in args:
                continue
            try:
                if _timm_hybrid(name, args) != units:
                    continue
            except LayoutError:
                continue
            norm = args.pop("norm_layer")
            if (isinstance(norm, dict) and "layer_norm" in norm
                    and not _timm_missing({**args, "layer_norm_epsilon": norm["layer_norm"]})):
                yield name, norm["layer_norm"]

    return timm_common.architecture_of_epsilon(
        spec.layer_norm_epsilon, fitting(), f"timm's hybrids of this ResNet ({spec.variant})")


def _relpos_config(spec, preprocessing):
    """timm's VisionTransformerRelPos `config.json` for a model of position_embedding
    "relative_mlp" (its RelPosMlp in every block): every argument in `model_args`."""
    lacking = (
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
    common.check_expressible(
        "A model of position_embedding='relative_mlp' is written as timm's "
        "VisionTransformerRelPos", lacking)
    height, width = spec.image_size
    args = {"img_size": [height, width], "patch_size": spec.patch_size,
            "embed_dim": spec.hidden_size, "depth": spec.num_layers,
            "num_heads": spec.num_heads, "mlp_ratio": timm_common.mlp_ratio(spec),
            "qkv_bias": spec.qkv_bias, "init_values": spec.layer_scale_init,
            "class_token": spec.class_token,
            "global_pool": "token" if spec.classifier == "token" else "avg",
            "fc_norm": spec.final_norm == "pooled", "rel_pos_type": "mlp",
            "rel_pos_dim": spec.relative_mlp_dim or _RELPOS_HIDDEN, "shared_rel_pos": False}
    block = "<ResPostRelPosBlock>" if spec.residual_post_norm else "<RelPosBlock>"
    return timm_common.config_file(spec, preprocessing, args, _RELPOS_BLOCKS[block])


def _timm_architecture_of_epsilon(epsilon, timm_class="VisionTransformer", block_fn=None,
                                  glu=False):
    """(name, its arguments): an architecture of timm's `timm_class` whose options keras_vit
    maps (all of which model_args override), whose LayerNorms have this epsilon, whose blocks
    are `block_fn` (None: timm's Block) and whose MLPs are GluMlp (`glu`) or not: model_args
    can name neither a norm's epsilon nor a class."""
    table = timm_common.timm_architectures()
    distilled = TIMM_CLASSES[timm_class]

    def arguments(name):
        args = {**_DEFAULTS, **table[name]["args"]}
        return args, args.pop("norm_layer")

    def fitting():
        # The familiar names first: ViT-B/16 (epsilon 1e-6), its CLIP form (1e-5), DeiT-B (1e-6).
        familiar = ["vit_base_patch16_224", "vit_base_patch16_clip_224",
                    "deit_base_distilled_patch16_224"]
        for name in [*familiar, *sorted(table)]:
            if table.get(name, {}).get("class") != timm_class:
                continue
            args, norm = arguments(name)
            if (isinstance(norm, dict) and "layer_norm" in norm
                    and not _timm_missing({**args, "layer_norm_epsilon": norm["layer_norm"]},
                                          distilled)
                    and args["block_fn"] == block_fn and _is_glu(args["mlp_layer"]) == glu):
                yield name, norm["layer_norm"]

    kind = " and ".join(what for what, wanted in (
        ("ResPostBlock blocks (residual_post_norm)", block_fn == _RES_POST_BLOCK),
        ("SwiGLU MLPs (SwiGLUPacked)", glu)) if wanted)
    name = timm_common.architecture_of_epsilon(
        epsilon, fitting(), f"timm's {timm_class} architectures{' of ' + kind if kind else ''}",
        none=f"No {timm_class} architecture of timm's has {kind}, and its model_args cannot "
             "name a block or an MLP class.")
    return name, arguments(name)[0]

"""timm's `NaFlexVit` (its `naflexvit_*` architectures, SigLIP 2's NaFlex towers among them): the
ViT that takes each image at its own aspect ratio as a sequence of patches, read as and written
from a `keras_vit.native.NaFlexViT`. Pure NumPy.

Its blocks, norms, attention pooling and head are VisionTransformer's, under the same names
(`timm_common.weight_pairs`); its stem (`embeds.`) is not: a Linear of each flattened (P, P, C)
patch (`embeds.proj`, [D, P * P * C]) where VisionTransformer has a convolution, a learned grid
`embeds.pos_embed` [1, rows, columns, D] for the patches alone, resized to each image's grid
(antialiased bicubic by default, or bilinear, on half-pixel centres), and class and register
tokens (`embeds.cls_token`, `embeds.reg_token`) without position embeddings. Reading renames the
stem as VisionTransformer's and maps the rest as `timm_common` does; writing does the reverse.

Its arguments are the fields of its `NaFlexVitCfg` (an architecture's, then config.json's
`model_args`); those keras_vit has no option for are refused by name (`_missing`).
"""

import numpy as np

from keras_vit.weights.torch_layouts import common, timm_common
from keras_vit.weights.torch_layouts.common import LayoutError, sized_spec, tensor
from keras_vit.weights.torch_layouts.family import Family

# timm 1.0.31's NaFlexVitCfg defaults and NaFlexVit's own arguments (in_chans, num_classes,
# img_size): what an architecture and model_args leave unset.
DEFAULTS = {
    "patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0,
    "scale_mlp_norm": False, "num_kv_heads": None, "qkv_bias": True, "qk_norm": False,
    "proj_bias": True, "attn_drop_rate": 0.0, "scale_attn_inner_norm": False,
    "use_key_only_attn_mask": False, "init_values": None, "drop_rate": 0.0,
    "pos_drop_rate": 0.0, "patch_drop_rate": 0.0, "proj_drop_rate": 0.0, "drop_path_rate": 0.0,
    "class_token": False, "reg_tokens": 0, "pos_embed": "learned",
    "pos_embed_grid_size": [16, 16], "pos_embed_interp_mode": "bicubic",
    "pos_embed_ar_preserving": False, "pos_embed_antialias": True,
    "pos_embed_align_corners": False, "pos_embed_use_grid_sample": False, "rope_type": "",
    "rope_temperature": 10000.0, "rope_ref_feat_shape": None, "rope_grid_offset": 0.0,
    "rope_grid_indexing": "ij", "rope_rotate_half": False, "rope_shift_coords": None,
    "rope_jitter_coords": None, "rope_rescale_coords": None, "rope_mrope_section": None,
    "dynamic_img_pad": False, "patchify_channels_last": True, "pre_norm": False,
    "final_norm": True, "fc_norm": None, "global_pool": "map", "pool_include_prefix": False,
    "attn_pool_num_heads": None, "attn_pool_mlp_ratio": None, "weight_init": "",
    "fix_init": True, "embed_proj_type": "linear", "input_norm_layer": None,
    "embed_norm_layer": None, "norm_layer": None, "act_layer": None, "block_fn": None,
    "mlp_layer": None, "attn_layer": None, "attn_type": "standard", "attn_gated": False,
    "swiglu_mlp": False, "swiglu_align_to": 0, "qkv_fused": True,
    "attn_only_layer_scale": False, "enable_patch_interpolator": False,
    "in_chans": 3, "num_classes": 1000, "img_size": None}
# Arguments that must keep these values (any of them), with what keras_vit lacks otherwise.
_REQUIRED = {
    "num_kv_heads": ((None,), "grouped-query attention: fewer key and value heads"),
    "qk_norm": ((False,), "norms of each head's queries and keys"),
    "proj_bias": ((True,), "projections without biases"),
    "pos_embed": (("learned", "none", ""), "factorized position embeddings (a table per axis)"),
    "pos_embed_interp_mode": (("bicubic", "bilinear"), "keras_vit resizes them antialiased "
                                                       "bicubic or bilinear"),
    "pos_embed_ar_preserving": ((False,), "position embeddings resized to a square of the "
                                          "longer side, then cropped"),
    "pos_embed_antialias": ((True,), "position embeddings resized without antialiasing"),
    "pos_embed_align_corners": ((False,), "position embeddings resized with the corners "
                                          "aligned"),
    "pos_embed_use_grid_sample": ((False,), "position embeddings sampled by grid_sample"),
    "rope_type": (("", "none"), "rotary position embeddings in NaFlex models"),
    "patchify_channels_last": ((True,), "patches flattened (C, P, P): keras_vit's are "
                                        "(P, P, C)"),
    "embed_proj_type": (("linear",), "a convolutional patch embedding, which takes whole "
                                     "images, not patches"),
    "input_norm_layer": ((None,), "a norm of each patch before its embedding"),
    "embed_norm_layer": ((None,), "a norm after the patch embedding"),
    "norm_layer": ((None, "layernorm"), "norms other than timm's LayerNorm (epsilon 1e-6)"),
    "act_layer": ((None, "gelu", "gelu_tanh", "quick_gelu"), "keras_vit's MLPs are GELU, tanh "
                                                             "GELU or quick GELU"),
    "block_fn": ((None,), "blocks other than timm's Block"),
    "mlp_layer": ((None,), "MLPs other than timm's Mlp"),
    "attn_layer": ((None,), "attention other than timm's Attention"),
    "attn_type": (("standard",), "Eva's attention blocks"),
    "attn_gated": ((False,), "gated attention"),
    "swiglu_mlp": ((False,), "SwiGLU MLPs in Eva's blocks"),
    "attn_only_layer_scale": ((False,), "LayerScale on the attention alone"),
    "global_pool": (("token", "avg", "map"), "keras_vit pools the class token, the mean or "
                                                "attention: 'token', 'avg' or 'map'"),
    "in_chans": ((3,), "keras_vit takes RGB images"),
}
# Arguments that change nothing NaFlexViT computes at inference: dropout, initialisation, the
# attention mask's form (the same outputs for every real patch), whole-image padding and patch
# resizing (patches of other sizes), and RoPE's settings where there is no RoPE.
_IGNORED = {"attn_drop_rate", "drop_rate", "pos_drop_rate", "patch_drop_rate",
            "proj_drop_rate", "drop_path_rate", "weight_init", "fix_init",
            "use_key_only_attn_mask", "dynamic_img_pad", "enable_patch_interpolator",
            "swiglu_align_to", "qkv_fused", "rope_temperature", "rope_ref_feat_shape",
            "rope_grid_offset", "rope_grid_indexing", "rope_rotate_half", "rope_shift_coords",
            "rope_jitter_coords", "rope_rescale_coords", "rope_mrope_section"}
# Their stem's names -> VisionTransformer's (the patch Linear and the position grid reshaped).
_STEM = {"embeds.proj.bias": "patch_embed.proj.bias", "embeds.cls_token": "cls_token",
         "embeds.reg_token": "reg_token"}
_PATCHES, _POSITIONS = "embeds.proj.weight", "embeds.pos_embed"
EPSILON = 1e-6  # timm.layers.LayerNorm's, NaFlexVit's norms
POOLS = {"token": "token", "avg": "gap", "map": "map"}  # its global_pool -> classifier


def naflex_args(config):
    """(architecture, arguments): what timm builds the checkpoint's NaFlexVit with, the
    `NaFlexVitCfg` defaults overlaid with its architecture's fields and then config.json's
    `model_args` (and its `global_pool`), as `timm.create_model` does: it drops the arguments
    of value None, which leave the architecture's."""
    architecture, entry = timm_common.architecture_entry(config)
    given = {**(config.get("model_args") or {}), "global_pool": config.get("global_pool")}
    return architecture, {**DEFAULTS, **entry["args"],
                          **{name: value for name, value in given.items() if value is not None}}


def _missing(args):
    """What of NaFlexVit's `args` keras_vit has no option for, in timm's words, with why."""
    missing = [f"{name}={args[name]!r} ({why})" for name, (allowed, why) in _REQUIRED.items()
               if not any(args[name] == value and type(args[name]) is type(value)
                          for value in allowed)]
    patch = args["patch_size"]
    if not isinstance(patch, int) and (len(patch) != 2 or patch[0] != patch[1]):
        missing.append(f"patch_size={patch!r} (keras_vit's patches are square)")
    prefix = bool(args["class_token"]) or bool(args["reg_tokens"])
    if args["pool_include_prefix"] and args["global_pool"] == "avg" and prefix:
        missing.append("pool_include_prefix=True with global_pool='avg' (keras_vit's mean "
                       "leaves the class and register tokens out)")
    if args["global_pool"] == "token" and not args["class_token"]:
        missing.append("global_pool='token' with class_token=False")
    return missing + [f"{name}={value!r}" for name, value in sorted(args.items())
                      if name not in DEFAULTS]


def _grid(args, patch):
    """(rows, columns) of the learned grid config.json describes: `pos_embed_grid_size`, else
    the image size in patches."""
    grid, size = args["pos_embed_grid_size"], args["img_size"]
    if grid is None and size is not None:
        sides = [size] * 2 if isinstance(size, int) else list(size)
        grid = [side // patch for side in sides]
    return tuple(grid or DEFAULTS["pos_embed_grid_size"])


def _learned_grid(state, args, patch):
    """(rows, columns) of the learned position embeddings, a LayoutError where config.json
    says another grid."""
    table = np.asarray(tensor(state, _POSITIONS, "timm"))
    if table.ndim != 4 or table.shape[0] != 1:
        raise LayoutError(f"{_POSITIONS} has shape {table.shape}; NaFlexVit's is [1, rows, "
                          "columns, width].")
    grid = tuple(table.shape[1:3])
    if grid != _grid(args, patch):
        raise LayoutError(
            f"config.json says a {'x'.join(map(str, _grid(args, patch)))} grid of position "
            f"embeddings (pos_embed_grid_size, or img_size in patches), but model.safetensors "
            f"holds {grid[0]}x{grid[1]}: the two files contradict each other. Use the "
            "config.json written with these weights.")
    return grid


def _pooling(args, state, hidden, mlp):
    """The spec's fields of timm's pooling: the attention pooling's heads, MLP units (in its
    weights) and whether it attends to the prefix tokens too."""
    if args["global_pool"] != "map":
        return {}
    units = tensor(state, "attn_pool.mlp.fc1.weight", "timm").shape[0]
    return dict(map_num_heads=args["attn_pool_num_heads"],
                map_mlp_dim=None if units == mlp else units,
                map_include_prefix=bool(args["pool_include_prefix"]))


def spec_from_config(config, state, timm_class):
    """The `ViTConfig` of timm's NaFlexVit `config.json`, with the sizes the weights `state`
    show, or a LayoutError naming every argument keras_vit has no option for."""
    architecture, args = naflex_args(config)
    timm_common.check_missing(architecture, _missing(args), timm_class)
    patch = args["patch_size"] if isinstance(args["patch_size"], int) else args["patch_size"][0]
    linear = tensor(state, _PATCHES, "timm")
    if len(linear.shape) != 2 or linear.shape[1] != patch * patch * 3:
        raise LayoutError(f"{_PATCHES} has shape {tuple(linear.shape)}; NaFlexVit's is "
                          f"[width, {patch}*{patch}*3] for patch_size {patch}.")
    hidden = linear.shape[0]
    layers = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0]
    learned = args["pos_embed"] == "learned"
    rows, columns = _learned_grid(state, args, patch) if learned else _grid(args, patch)
    fc_norm = args["global_pool"] == "avg" if args["fc_norm"] is None else bool(args["fc_norm"])
    num_classes = config.get("num_classes", args["num_classes"])
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch,
                      image_size=[rows * patch, columns * patch],
                      include_top=num_classes > 0, num_classes=max(num_classes, 1),
                      classifier=POOLS[args["global_pool"]],
                      class_token=bool(args["class_token"]),
                      **_pooling(args, state, hidden, mlp),
                      activation=args["act_layer"] or "gelu",  # timm's nn.GELU: exact
                      layer_norm_epsilon=EPSILON, qkv_bias=bool(args["qkv_bias"]),
                      layer_scale_init=args["init_values"] or None,  # 0: timm has none
                      num_register_tokens=args["reg_tokens"],
                      position_embedding="learned" if learned else "none",
                      prefix_position_embeddings=not learned,  # none for the prefix tokens
                      pre_norm=bool(args["pre_norm"]),
                      final_norm=("none" if not args["final_norm"] else
                                  "pooled" if fc_norm else "tokens"),
                      mlp_inner_norm=bool(args["scale_mlp_norm"]),
                      attention_inner_norm=bool(args["scale_attn_inner_norm"]),
                      position_embedding_interpolation=args["pos_embed_interp_mode"])


# Weights ---------------------------------------------------------------------------------------


def as_vision_transformer(state, spec):
    """NaFlexVit's state dict in VisionTransformer's names: the patch Linear [D, P * P * C] as
    a convolution [D, C, P, P], the position grid [1, rows, columns, D] as rows [1, N, D]."""
    state = dict(state)
    patch = spec.patch_size
    linear = np.asarray(tensor(state, _PATCHES, "timm"))
    del state[_PATCHES]
    state["patch_embed.proj.weight"] = linear.reshape(
        linear.shape[0], patch, patch, -1).transpose(0, 3, 1, 2)
    if _POSITIONS in state:
        table = np.asarray(state.pop(_POSITIONS))
        state["pos_embed"] = table.reshape(1, -1, table.shape[-1])
    for theirs, ours in _STEM.items():
        if theirs in state:
            state[ours] = state.pop(theirs)
    return state


def as_naflex(state, spec):
    """The inverse of `as_vision_transformer`."""
    state = dict(state)
    conv = state.pop("patch_embed.proj.weight")
    state[_PATCHES] = np.ascontiguousarray(conv.transpose(0, 2, 3, 1).reshape(conv.shape[0], -1))
    if "pos_embed" in state:
        rows, columns = spec.grid_size
        state[_POSITIONS] = np.ascontiguousarray(
            state.pop("pos_embed").reshape(1, rows, columns, -1))
    for theirs, ours in _STEM.items():
        if ours in state:
            state[theirs] = state.pop(ours)
    return state


def to_arrays(state, spec, config=None):
    """NaFlexVit's state dict as the `.npz` layout (its stem renamed, then
    `timm_common.to_arrays`)."""
    return timm_common.to_arrays(as_vision_transformer(state, spec), spec,
                                 timm_common.weight_pairs(spec))


def fold_prefix_positions(arrays, spec):
    """`(arrays, spec)` with the position embeddings of the class and register tokens added to
    the tokens themselves, for NaFlexVit, whose prefix tokens have none. Exact: each is a
    constant added to its token whatever the image."""
    if not (spec.position_embedding == "learned" and spec.prefix_position_embeddings
            and spec.num_prefix_tokens):
        return arrays, spec
    arrays = dict(arrays)
    table = arrays[common.POSITIONS]
    start = 0
    for key, count in (("cls", int(spec.class_token)), ("reg/registers",
                                                         spec.num_register_tokens)):
        if count:
            arrays[key] = (arrays[key] + table[:, start:start + count]).astype(arrays[key].dtype)
            start += count
    arrays[common.POSITIONS] = table[:, start:]
    return arrays, spec.replace(prefix_position_embeddings=False)


def from_arrays(arrays, spec):
    """The `.npz` layout as NaFlexVit's state dict: the prefix tokens' position embeddings
    folded into them (`fold_prefix_positions`), a pre-norm's patch bias into the position
    embeddings (`timm_common.from_arrays`), then the stem renamed (`as_naflex`)."""
    arrays, spec = fold_prefix_positions(arrays, spec)
    state = timm_common.from_arrays(arrays, spec, timm_common.weight_pairs(spec))
    return as_naflex(state, spec)


# config.json -----------------------------------------------------------------------------------


def check_writable(spec, what="This model"):
    """A LayoutError naming what of the model of `spec` (`what`, in words) timm's NaFlexVit
    cannot express."""
    lacking = (
        (spec.is_hybrid or spec.axial, f"ResNet stem or axial blocks ({spec.variant})"),
        (spec.position_embedding not in ("learned", "none"),
         f"position_embedding={spec.position_embedding!r} (NaFlexVit's are learned, or "
         "none)"),
        (spec.position_embedding_placement != "stem",
         f"position embeddings added in every block ({spec.position_embedding_placement!r})"),
        (spec.rope, f"rotary position embeddings (rope={spec.rope!r})"),
        (spec.distillation_token, "distillation token"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.classifier == "token_gap", "classifier='token_gap' (DINOv2's head; its "
                                         "global_pool is 'token', 'avg' or 'map' here)"),
        (spec.activation == "swiglu", "SwiGLU MLPs (activation='swiglu': NaFlexVit builds them "
                                      "as Eva's blocks, which keras_vit does not write yet)"),
        (spec.residual_post_norm, "post-norm blocks (residual_post_norm)"),
        (spec.norm_layer != "layer_norm", f"norm_layer={spec.norm_layer!r} (its norms are "
                                          "LayerNorms)"),
        (spec.qk_norm or spec.grouped_query,
         "qk_norm or grouped-query attention (num_kv_heads: keras_vit writes them as Eva's)"),
        (spec.differential or spec.parallel_blocks,
         "differential attention or parallel blocks (its blocks are timm's Block of "
         "Attention; keras_vit writes them as its VisionTransformer)"),
        (spec.layer_norm_epsilon != EPSILON,
         f"LayerNorms of epsilon {spec.layer_norm_epsilon} (NaFlexVit's are {EPSILON}, and "
         "its model_args cannot name another)"),
        (spec.pre_norm and spec.position_embedding == "none",
         "pre_norm without position embeddings (its patch embedding then has no bias, which "
         "keras_vit folds into the position embeddings)"))
    common.check_expressible(f"{what} cannot be written as timm's NaFlexVit", lacking)


def model_args(spec):
    """Every NaFlexVit argument keras_vit maps, for a model of `spec`."""
    pool = {classifier: pool for pool, classifier in POOLS.items()}[spec.classifier]
    attention = spec.classifier == "map"
    return {
        "patch_size": spec.patch_size, "embed_dim": spec.hidden_size, "depth": spec.num_layers,
        "num_heads": spec.num_heads, "mlp_ratio": timm_common.mlp_ratio(spec),
        "qkv_bias": spec.qkv_bias,
        # timm has LayerScale for a truthy init_values only (the weights set the scales)
        "init_values": (spec.layer_scale_init or 1e-5) if spec.layer_scale_init is not None
        else None,
        "class_token": bool(spec.class_token), "reg_tokens": spec.num_register_tokens,
        "pos_embed": "learned" if spec.position_embedding == "learned" else "none",
        "pos_embed_grid_size": list(spec.grid_size),
        "pos_embed_interp_mode": spec.position_embedding_interpolation,
        "pre_norm": spec.pre_norm, "final_norm": spec.final_norm != "none",
        "fc_norm": spec.final_norm == "pooled", "global_pool": pool,
        "pool_include_prefix": attention and spec.map_include_prefix,
        "attn_pool_num_heads": spec.map_num_heads if attention else None,
        "attn_pool_mlp_ratio": (timm_common.ratio(spec.hidden_size, spec.map_mlp_dim)
                                if attention and spec.map_mlp_dim not in (None, spec.mlp_dim)
                                else None),
        "act_layer": spec.activation, "scale_mlp_norm": spec.mlp_inner_norm,
        "scale_attn_inner_norm": spec.attention_inner_norm}


def _resolved(architecture):
    """The arguments timm builds `architecture` with, without model_args."""
    return {**DEFAULTS, **timm_common.timm_architectures()[architecture]["args"]}


def _closest_architecture(args):
    """The NaFlexVit architecture (of those keras_vit reads whole) from whose own arguments
    `args` differ least, so that config.json's model_args stay short. Its arguments must be
    None where `args` are: `timm.create_model` drops model_args of value None (a model without
    LayerScale is written on one of the architectures without it)."""
    table = timm_common.timm_architectures()
    fitting = [name for name in sorted(table) if table[name]["class"] == "NaFlexVit"
               and not _missing(_resolved(name))
               and all(_resolved(name)[key] is None for key, value in args.items()
                       if value is None)]
    return min(fitting, key=lambda name: sum(
        _resolved(name)[key] != value for key, value in args.items()))


def config_for(spec, preprocessing, arrays=None):
    """timm's NaFlexVit `config.json` (what `timm.create_model("local-dir:DIR",
    pretrained=True)` reads) for a `NaFlexViT` of `spec`: on the architecture closest to it,
    `model_args` holding every argument that differs from that architecture's, and in
    `pretrained_cfg` the resize and crop of `preprocessing`; a LayoutError for what NaFlexVit
    cannot express, before anything is written."""
    check_writable(spec)
    args = model_args(spec)
    architecture = _closest_architecture(args)
    own = _resolved(architecture)
    written = {name: value for name, value in args.items() if own[name] != value}
    written["global_pool"] = args["global_pool"]  # timm_common.config_file writes it beside
    return timm_common.config_file(spec, preprocessing, written, architecture)


FAMILY = Family(name="NaFlexVit", library="timm", classes={"NaFlexVit": False},
                spec_from_config=spec_from_config, config_for=config_for,
                weight_pairs=timm_common.weight_pairs, to_arrays=to_arrays,
                from_arrays=from_arrays, native=True)

"""timm's `Eva` class (EVA-02, DINOv3, the RoPE ViTs, Perception Encoder...): its arguments
as a `ViTConfig` and back, its weights' names as its VisionTransformer's (read by
`timm_common.eva_names`, written by `eva_state`), and the channels of its rotary position
embeddings in keras_vit's order. Pure NumPy.

Eva names LayerScale `gamma_1`, `gamma_2`, may split the query, key and value (`q_proj`,
`k_proj`, `v_proj`) and keep the key's bias as a zero buffer (`q_bias`, `v_bias`); its SwiGLU
is packed (GluMlp's `fc1`) or not (`fc1_g`, `fc1_x`), and RoPE-Mixed's learned frequencies are
one tensor, `rope.freqs` [2, depth, heads, head_dim / 2].
"""

import re

import numpy as np

from keras_vit.weights.torch_layouts import common, timm_common
from keras_vit.weights.torch_layouts.common import check_grid, sized_spec, tensor
from keras_vit.weights.torch_layouts.family import Family

# timm's Eva arguments (timm 1.0.31's defaults): those keras_vit maps, those it cannot, and
# the rest, which change nothing at inference.
DEFAULTS = {
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
_IGNORED = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate",
            "attn_drop_rate", "drop_path_rate", "rope_shift_coords", "rope_jitter_coords",
            "rope_rescale_coords", "head_init_scale"}
# timm's Eva RoPE kinds -> keras_vit's.
_ROPES = {"cat": "axial", "dinov3": "axial_normalized", "mixed": "mixed"}
# timm's Eva RoPE layout (interleaved, rows and columns swapped: grid_indexing 'xy') that
# config_for writes for each of keras_vit's kinds: its pretrained EVA-02's and DINOv3's.
WRITTEN_ROPE = {"axial": (True, False), "axial_normalized": (False, False),
                "mixed": (True, True)}  # RoPE-Mixed: naver's pretrained 'xy' grid


def is_eva(spec):
    """Whether timm's files of a model of `spec` are its Eva's: RoPE, NormFormer's inner
    LayerNorms (scale_attn_inner, scale_mlp), which its VisionTransformer has not mapped,
    Eva's attention pooling (`common.eva_pooling`), or Sapiens2's RmsNorm, qk_norm and
    grouped-query attention."""
    return bool(spec.rope or spec.mlp_inner_norm or spec.attention_inner_norm
                or common.eva_pooling(spec) or spec.norm_layer != "layer_norm"
                or spec.qk_norm or spec.grouped_query)


def _kv_heads(heads, num_heads, depth):
    """timm's num_kv_heads (None, an int, or one per block) as `ViTConfig.num_kv_heads`: None
    where every block has all its heads, an int where all blocks have the same."""
    per_block = [num_heads if h is None else int(h)
                 for h in (heads if isinstance(heads, (list, tuple)) else [heads] * depth)]
    if set(per_block) == {num_heads}:
        return None
    return per_block[0] if len(set(per_block)) == 1 else tuple(per_block)


def _missing(args):
    """What of timm's Eva `args` keras_vit has no option for, in timm's words, with why."""
    problems = {
        "norm_layer": ("norm_layer" in args, f"norm_layer={args.get('norm_layer')!r} (keras_vit's "
                                             "norms are LayerNorms or RmsNorms of a set "
                                             "epsilon)"),
        "attn_type": (args["attn_type"] not in ("eva", "rope"),
                      f"attn_type={args['attn_type']!r}"),
        "in_chans": (args["in_chans"] != 3, f"in_chans={args['in_chans']}"),
    }
    if args["use_rot_pos_emb"]:
        kind = args["rope_type"]
        problems.update({
            "rope_type": (kind not in _ROPES, f"rope_type={kind!r}"),
            "rope_grid_offset": (kind == "dinov3" and args["rope_grid_offset"] != 0,
                                 f"rope_grid_offset={args['rope_grid_offset']!r} with "
                                 "rope_type='dinov3' (keras_vit offsets the indices of 'cat' "
                                 "RoPE only)"),
            "rope_rotate_half": (kind == "mixed" and args["rope_rotate_half"],
                                 "rope_rotate_half=True with rope_type='mixed' (RoPE-Mixed's "
                                 "channels are interleaved)")})
    pool, token = args["global_pool"], args["class_token"]
    fc_norm, norm = _norms(args)
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
                      if name not in DEFAULTS and name not in _IGNORED
                      and name not in ("layer_norm_epsilon", "rms_norm")]


def _norms(args):
    """(fc_norm, norm): whether timm's Eva norms the pooled vector, and the tokens (its rule)."""
    fc_norm = (args["global_pool"] == "avg" if args["use_fc_norm"] is None
               else bool(args["use_fc_norm"]))
    norm = (not fc_norm if args["use_post_transformer_norm"] is None
            else bool(args["use_post_transformer_norm"]))
    return fc_norm, norm


def spec_from_config(config, state, timm_class):
    """The `ViTConfig` of timm's Eva `config.json` (EVA-02, its RoPE ViTs, DINOv3...), with
    the sizes the weights `state` show."""
    architecture, args = timm_common.timm_args(config, DEFAULTS)
    timm_common.check_missing(architecture, _missing(args), "Eva")
    hidden, patch, layers = timm_common.sizes(state)
    swiglu = args["swiglu_mlp"]
    if swiglu and "blocks.0.mlp.fc1_g.weight" in state:  # SwiGLU's unpacked (aligned) rows
        mlp = state["blocks.0.mlp.fc1_g.weight"].shape[0]
    else:  # GluMlp packs the gate's rows and the value's
        mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0] // (2 if swiglu else 1)
    prefix_tokens = int(bool(args["class_token"])) + args["num_reg_tokens"]
    if args["use_abs_pos_emb"]:
        check_grid(tensor(state, "pos_embed", "timm"), args["img_size"], patch,
                   0 if args["no_embed_class"] else prefix_tokens, "img_size")
    fc_norm, norm = _norms(args)
    pool = args["global_pool"]
    attention_pool = {}
    if pool == "map":  # AttentionPoolLatent over every token: int(width * ratio) MLP units
        ratio = args["attn_pool_mlp_ratio"]
        attention_pool = dict(map_num_heads=args["attn_pool_num_heads"],
                              map_mlp_dim=int(hidden * ratio) if ratio else None,
                              map_include_prefix=True)
    post_norm = bool(args["use_post_norm"])  # EvaBlockPostNorm ignores init_values
    rope = _ROPES[args["rope_type"]] if args["use_rot_pos_emb"] else None
    reference = args["ref_feat_shape"] if rope == "axial" else None
    num_classes = config.get("num_classes", args["num_classes"])
    # LayerScale on the attention alone (Sapiens2's attn_only_layer_scale) is LayerScale on
    # both branches with the MLP's at 1 (`to_arrays` gives it those ones).
    return sized_spec(hidden, mlp, args["num_heads"], layers, patch,
                      norm_layer="rms_norm" if args.get("rms_norm") else "layer_norm",
                      qk_norm=bool(args["qk_norm"]),
                      num_kv_heads=_kv_heads(args["num_kv_heads"], args["num_heads"], layers),
                      image_size=timm_common.whole_patches(args["img_size"], patch, architecture),
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


def config_for(spec, preprocessing, arrays):
    """timm's Eva `config.json` for a model with RoPE, inner LayerNorms or Eva's attention
    pooling (`is_eva`): every Eva argument in `model_args` (so that none of the
    architecture's own applies), RoPE laid out as `WRITTEN_ROPE` says."""
    lacking = (
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
         "keras_vit folds into the position embeddings)"),
        (spec.residual_post_norm and (spec.qk_norm or spec.grouped_query),
         "post-norm blocks with qk_norm or num_kv_heads (its EvaBlockPostNorm has neither)"),
        (spec.differential or spec.parallel_blocks,
         "differential attention or parallel blocks (timm's VisionTransformer has them: "
         "DiffAttention, ParallelScalingBlock, DiffParallelScalingBlock; keras_vit writes "
         "them there with LayerNorms, without qk_norm, num_kv_heads, RoPE or inner norms)"),
        (spec.classifier == "token_gap", timm_common.TOKEN_GAP))  # last: it says the way round
    common.check_expressible(
        "A model with RoPE, inner LayerNorms or Eva's attention pooling is written as timm's "
        "Eva", lacking)
    height, width = spec.image_size
    interleaved, xy = WRITTEN_ROPE.get(spec.rope, (False, False))
    fc_norm = spec.final_norm == "pooled"
    grouped = spec.grouped_query  # AttentionRope with q, k, v apart
    args = {name: value for name, value in DEFAULTS.items()
            if name not in ("norm_layer", "num_classes")}
    args.update({
        "img_size": [height, width], "patch_size": spec.patch_size,
        "global_pool": {"token": "token", "map": "map"}.get(spec.classifier, "avg"),
        "embed_dim": spec.hidden_size, "depth": spec.num_layers, "num_heads": spec.num_heads,
        "qkv_bias": spec.qkv_bias, "attn_type": eva_attention(arrays, spec),
        "qk_norm": spec.qk_norm, "qkv_fused": not grouped,
        "num_kv_heads": ([spec.kv_heads(index) for index in range(spec.num_layers)]
                         if grouped else None),
        "mlp_ratio": timm_common.mlp_ratio(spec), "swiglu_mlp": spec.activation == "swiglu",
        "init_values": spec.layer_scale_init, "class_token": spec.class_token,
        "num_reg_tokens": spec.num_register_tokens,
        "no_embed_class": not spec.prefix_position_embeddings,
        "use_abs_pos_emb": spec.position_embedding == "learned",
        "use_rot_pos_emb": bool(spec.rope),
        "rope_type": {kind: name for name, kind in _ROPES.items()}.get(spec.rope, "cat"),
        "rope_temperature": spec.rope_temperature or DEFAULTS["rope_temperature"],
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
                    attn_pool_mlp_ratio=timm_common.ratio(spec.hidden_size,
                                                          spec.map_mlp_dim or spec.mlp_dim))
    return timm_common.config_file(spec, preprocessing, args,
                                   _architecture_of_epsilon(spec.layer_norm_epsilon,
                                                            spec.norm_layer))


def _architecture_of_epsilon(epsilon, kind="layer_norm"):
    """An Eva architecture of timm's whose norms are of `kind` ("layer_norm", or "rms_norm":
    Sapiens2's) and this epsilon, and every other argument one `config_for` writes (or one
    that changes nothing at inference)."""
    table = timm_common.timm_architectures()

    def fitting():  # the familiar names first: EVA-02 B/14 (epsilon 1e-6), DINOv3 B/16 (1e-5)
        for name in ["eva02_base_patch14_224", "vit_base_patch16_dinov3", *sorted(table)]:
            entry = table.get(name, {"args": {}})
            norm = entry["args"].get("norm_layer", DEFAULTS["norm_layer"])
            if (entry.get("defaults") == "Eva" and isinstance(norm, dict) and kind in norm
                    and not set(entry["args"]) - set(DEFAULTS) - _IGNORED):
                yield name, norm[kind]

    what = "timm's Eva architectures" + (" of RmsNorms" if kind == "rms_norm" else "")
    return timm_common.architecture_of_epsilon(epsilon, fitting(), what)


def eva_attention(arrays, spec):
    """timm's Eva attention for the model's weights: EvaAttention ("eva": query and value
    biases, the key's zero), or AttentionRope ("rope": all three) for a non-zero key bias or
    grouped-query attention (EvaAttention has neither)."""
    return "rope" if spec.grouped_query or common.key_bias(arrays, spec) else "eva"


def eva_state(state, spec, attention):
    """The inverse of `timm_common.eva_names`, for Eva's `attention` (`eva_attention`); SwiGLU
    packed as GluMlp unless timm builds it unpacked (SwiGLU, for scale_mlp)."""
    renamed = {}
    if spec.rope == "mixed":
        state = dict(state)
        state["rope.freqs"] = np.stack([state.pop(f"rope.freqs.{index}")
                                        for index in range(spec.num_layers)], axis=1)
    grouped = spec.grouped_query  # AttentionRope's q_proj, k_proj, v_proj
    for key, value in state.items():
        key = re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", key)
        if grouped:
            key = re.sub(r"\.attn\.([qkv])\.", r".attn.\1_proj.", key)
        if attention == "eva":  # EvaAttention: the key's bias is a zero buffer
            if key.endswith(".attn.k.bias"):
                continue
            key = re.sub(r"\.attn\.([qv])\.bias$", r".attn.\1_bias", key)
        renamed[key] = value
    if spec.activation == "swiglu" and not spec.mlp_inner_norm:
        return common.packed(renamed, timm_common.GLU_PACKED)
    return renamed


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


def permuted_rope(arrays, spec, interleaved, xy, inverse=False):
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
        # qk_norm's scales and biases [head_dim] go with their channels (its mean and
        # variance over a head's channels are the same in any order).
        for name in ("query/kernel", "query/bias", "key/kernel", "key/bias",
                     "query_norm/scale", "query_norm/bias", "key_norm/scale", "key_norm/bias"):
            key = common.ATTENTION.format(index) + name
            if key in arrays:  # kernels [D, heads, head_dim], biases [heads, head_dim]
                arrays[key] = arrays[key][..., order]
    return arrays


def _rope_layout(config):
    """(interleaved, xy) of the RoPE of timm's checkpoint of `config` (None: keras_vit's)."""
    if config is None:
        return False, False
    args = timm_common.timm_args(config, DEFAULTS)[1]
    return not args.get("rope_rotate_half", True), args.get("rope_grid_indexing") == "xy"


def _attention_only_layer_scale(config):
    """Whether timm's Eva of `config` has LayerScale on its attention branch alone."""
    args = timm_common.timm_args(config, DEFAULTS)[1]
    return bool(args["attn_only_layer_scale"] and args["init_values"] is not None
                and not args["use_post_norm"])


def to_arrays(state, spec, config=None):
    """Eva's state dict as the `.npz` layout (`timm_common.to_arrays`), RoPE's channels in
    keras_vit's order from the layout `config`, the checkpoint's config.json, says (None: as
    keras_vit does)."""
    if config is not None and _attention_only_layer_scale(config):
        state = dict(state)  # the MLP's LayerScale at 1: the same outputs
        for index in range(spec.num_layers):
            gamma = state[f"blocks.{index}.gamma_1"]
            state[f"blocks.{index}.gamma_2"] = np.ones_like(gamma)
    arrays = timm_common.to_arrays(state, spec, timm_common.weight_pairs(spec))
    if spec.rope:
        arrays = permuted_rope(arrays, spec, *_rope_layout(config))
    return arrays


def from_arrays(arrays, spec):
    """The `.npz` layout as Eva's state dict, RoPE laid out as `WRITTEN_ROPE` says."""
    if spec.rope:
        arrays = permuted_rope(arrays, spec, *WRITTEN_ROPE[spec.rope], inverse=True)
    attention = eva_attention(arrays, spec)
    return timm_common.from_arrays(arrays, spec, timm_common.weight_pairs(spec),
                                   renamed=lambda state: eva_state(state, spec, attention))


FAMILY = Family(name="Eva", library="timm", classes={"Eva": False},
                spec_from_config=spec_from_config, writes=is_eva, config_for=config_for,
                weight_pairs=timm_common.weight_pairs, to_arrays=to_arrays,
                from_arrays=from_arrays)

"""timm's `VisionTransformerRelPos` (its `vit_relpos_*`): no position embeddings, a
relative-position MLP in every block (`blocks.N.attn.rel_pos.mlp.fc1`, `fc2`: keras_vit's
position_embedding "relative_mlp"), or one that every block shares (`shared_rel_pos.mlp.fc1`,
`fc2`, its `vit_srelpos_*`: relative_mlp_shared), LayerScale (or post-norm blocks), GAP (with or
without a class token) or the class token; VisionTransformer's names otherwise
(`timm_common`)."""

from keras_vit.weights.torch_layouts import common, timm_common
from keras_vit.weights.torch_layouts.common import sized_spec, tensor
from keras_vit.weights.torch_layouts.family import Family

# timm's VisionTransformerRelPos arguments (timm 1.0.31's defaults; its norm_layer None is a
# LayerNorm of epsilon 1e-6, its act_layer None the exact GELU), and those that change nothing
# at inference.
_DEFAULTS = {
    "img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 1000, "global_pool": "avg",
    "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0, "qkv_bias": True,
    "qk_norm": False, "init_values": 1e-6, "class_token": False, "fc_norm": False,
    "rel_pos_type": "mlp", "rel_pos_dim": None, "shared_rel_pos": False,
    "embed_layer": "<PatchEmbed>", "norm_layer": {"layer_norm": 1e-6}, "act_layer": None,
    "block_fn": "<RelPosBlock>"}
_IGNORED = {"drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
            "weight_init", "fix_init"}
_HIDDEN = 128  # RelPosMlp's hidden_dim where rel_pos_dim is None
_SHARED_MLP = "shared_rel_pos.mlp."  # the RelPosMlp every block shares (shared_rel_pos=True)
# Its blocks -> an architecture of them (model_args cannot name a block class): pre-norm with
# LayerScale, or post-norm (`_rpn`, residual_post_norm; its init_values only start the norms).
_BLOCKS = {"<RelPosBlock>": "vit_relpos_base_patch16_224",
           "<ResPostRelPosBlock>": "vit_relpos_medium_patch16_rpn_224"}


def _missing(args):
    """What of timm's VisionTransformerRelPos `args` keras_vit has no option for, with why."""
    pool = args["global_pool"]
    problems = [why for bad, why in (
        (args["block_fn"] not in _BLOCKS, f"block_fn={args['block_fn']!r}"),
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
                       if name not in _DEFAULTS and name not in _IGNORED
                       and name != "layer_norm_epsilon"]


def spec_from_config(config, state, timm_class):
    """The `ViTConfig` of timm's VisionTransformerRelPos `config.json`, with the sizes the
    weights `state` show."""
    architecture, args = timm_common.timm_args(config, _DEFAULTS)
    timm_common.check_missing(architecture, _missing(args), "VisionTransformerRelPos")
    hidden, patch, layers = timm_common.sizes(state)
    mlp = tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0]
    shared = bool(args["shared_rel_pos"])  # one RelPosMlp of the model, not one per block
    relative = tensor(state, _SHARED_MLP + "fc1.weight" if shared
                      else "blocks.0.attn.rel_pos.mlp.fc1.weight", "timm").shape[0]
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
                      relative_mlp_shared=shared,
                      final_norm="pooled" if args["fc_norm"] else "tokens")


def config_for(spec, preprocessing, arrays=None):
    """timm's VisionTransformerRelPos `config.json` for a model of position_embedding
    "relative_mlp" (its RelPosMlp in every block, or one shared: `shared_rel_pos`): every
    argument in `model_args`."""
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
        (spec.parallel_blocks, "parallel blocks (parallel_blocks: its blocks are "
                               "RelPosBlock or ResPostRelPosBlock)"),
        (spec.dynamic_image_size or spec.dynamic_image_pad,
         "dynamic image size (its relative positions are made for one grid)"),
        (spec.layer_norm_epsilon != _DEFAULTS["norm_layer"]["layer_norm"],
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
            "rel_pos_dim": spec.relative_mlp_dim or _HIDDEN,
            "shared_rel_pos": spec.relative_mlp_shared}
    block = "<ResPostRelPosBlock>" if spec.residual_post_norm else "<RelPosBlock>"
    return timm_common.config_file(spec, preprocessing, args, _BLOCKS[block])


def weight_pairs(spec):
    """VisionTransformer's pairs (`timm_common.weight_pairs`: a RelPosMlp in every block), and
    the shared RelPosMlp's."""
    pairs = timm_common.weight_pairs(spec)
    if spec.relative_mlp_shared:
        for index in (1, 2):
            pairs += common.dense_pairs(f"Transformer/relative_position/fc{index}",
                                        f"{_SHARED_MLP}fc{index}")
    return pairs


FAMILY = Family(name="VisionTransformerRelPos", library="timm",
                classes={"VisionTransformerRelPos": False}, spec_from_config=spec_from_config,
                writes=lambda spec: spec.position_embedding == "relative_mlp",
                config_for=config_for, weight_pairs=weight_pairs)

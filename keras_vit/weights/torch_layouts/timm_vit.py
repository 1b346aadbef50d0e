"""timm's `VisionTransformer` and DeiT's `VisionTransformerDistilled` (its `vit_*` and `deit*`
architectures but the hybrids, `timm_hybrid`): its arguments and weights' names are in
`timm_common`. It writes every model no other timm family claims, refusing what
VisionTransformer cannot express."""

from keras_vit.weights.torch_layouts import timm_common
from keras_vit.weights.torch_layouts.family import Family

# Its classes -> whether they have DeiT's distillation token; VisionTransformerDistilled takes
# VisionTransformer's arguments.
CLASSES = {"VisionTransformer": False, "VisionTransformerDistilled": True}


def spec_from_config(config, state, timm_class):
    """The `ViTConfig` of timm's `config.json`, with the sizes the weights `state` show."""
    architecture, args = timm_common.timm_args(config, timm_common.VIT_DEFAULTS)
    if args.get("embed_layer") is None:  # timm's PatchEmbed (`timm_hybrid` reads the others)
        args.pop("embed_layer", None)
    if args.get("padding_same", True) is True:  # a hybrid's stem option, else named missing
        args.pop("padding_same", None)
    return timm_common.spec_from_vision_transformer(architecture, args, config, state,
                                                    CLASSES[timm_class])


def config_for(spec, preprocessing, arrays=None):
    """timm's `config.json` (what `timm.create_model("local-dir:DIR", pretrained=True)` reads)
    for a model of `spec`: its sizes and options in `model_args`, on an architecture whose
    LayerNorm epsilon is the model's (timm's model_args cannot name one), and in
    `pretrained_cfg` the resize and crop of `preprocessing` (the model's
    `keras_vit.EvalPreprocessing`). A model with DeiT's distillation token is timm's
    VisionTransformerDistilled, which takes the same arguments."""
    return timm_common.vision_transformer_config(spec, preprocessing, lambda spec: (
        _architecture_of_epsilon(
            spec.layer_norm_epsilon, timm_common.vision_transformer_class(spec),
            block_fn=_block_fn(spec), glu=spec.activation == "swiglu")))


def _block_fn(spec):
    """timm's block class of the model's blocks, as the table records it (None: its Block)."""
    if spec.parallel_blocks:  # ParallelScalingBlock, or DiffParallelScalingBlock
        return next(name for name, differential in timm_common.PARALLEL_BLOCKS.items()
                    if differential == spec.differential)
    return timm_common.RES_POST_BLOCK if spec.residual_post_norm else None


def _architecture_of_epsilon(epsilon, timm_class="VisionTransformer", block_fn=None,
                             glu=False):
    """(name, its arguments): an architecture of timm's `timm_class` whose options keras_vit
    maps (all of which model_args override), whose LayerNorms have this epsilon, whose blocks
    are `block_fn` (None: timm's Block) and whose MLPs are GluMlp (`glu`) or not: model_args
    can name neither a norm's epsilon nor a class."""
    table = timm_common.timm_architectures()
    distilled = CLASSES[timm_class]

    def arguments(name):
        args = {**timm_common.VIT_DEFAULTS, **table[name]["args"]}
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
                    and not timm_common.missing({**args, "layer_norm_epsilon": norm["layer_norm"]},
                                                distilled)
                    and args["block_fn"] == block_fn
                    and timm_common.is_glu(args["mlp_layer"]) == glu):
                yield name, norm["layer_norm"]

    kind = " and ".join(what for what, wanted in (
        ("ResPostBlock blocks (residual_post_norm)", block_fn == timm_common.RES_POST_BLOCK),
        (f"{block_fn} blocks (parallel_blocks)", block_fn in timm_common.PARALLEL_BLOCKS),
        ("SwiGLU MLPs (SwiGLUPacked)", glu)) if wanted)
    name = timm_common.architecture_of_epsilon(
        epsilon, fitting(), f"timm's {timm_class} architectures{' of ' + kind if kind else ''}",
        none=f"No {timm_class} architecture of timm's has {kind}, and its model_args cannot "
             "name a block or an MLP class.")
    return name, arguments(name)[0]


FAMILY = Family(name="VisionTransformer", library="timm", classes=CLASSES,
                spec_from_config=spec_from_config,
                writes=lambda spec: True,  # the last resort: it refuses what it cannot express
                config_for=config_for, weight_pairs=timm_common.weight_pairs)

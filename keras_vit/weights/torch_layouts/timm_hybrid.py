"""timm's ViT-ResNet hybrids (vision_transformer_hybrid.py: a `VisionTransformer` whose
embed_layer is HybridEmbed on a ResNetV2, `_resnetv2`), and MobileCLIP's ViT-B/16 (Vasu et al.,
2024: HybridEmbed on a `ConvStem`, timm's `vit_base_mci_224`, keras_vit's `conv_stem`):
VisionTransformer's arguments and weights (`timm_common`) with the backbone's under
`patch_embed.backbone.`."""

from keras_vit.weights.torch_layouts import common, timm_common
from keras_vit.weights.torch_layouts.common import LayoutError
from keras_vit.weights.torch_layouts.family import Family

# The units of each stage of its backbone -> keras_vit's variant with that ResNet (the
# checkpoint's sizes override the rest), and the architectures written for each, familiar names
# first.
_HYBRIDS = {(): "R+Ti/16", (2, 2, 2, 2): "R26+S/32", (3, 4, 9): "R50+B/16",
            (3, 4, 6, 3): "R50+L/32"}
_HYBRID_ARCHITECTURES = {(): "vit_tiny_r_s16_p8_224", (2, 2, 2, 2): "vit_small_r26_s32_224",
                         (3, 4, 9): "vit_base_r50_s16_224",
                         (3, 4, 6, 3): "vit_large_r50_s32_224"}
# Its numerics, keras_vit's resnet_numerics="timm" (keras_vit.layers.resnet.NUMERICS, not imported:
# this module needs no Keras): the weight standardisation's and GroupNorm's epsilons.
TIMM_RESNET_EPSILONS = (1e-8, 1e-5)
# MobileCLIP's architecture, whose entry point builds its ConvStem for width 768 (whatever
# embed_dim says) and 16-pixel tokens; keras_vit's conv_stem is that stem at any such sizes.
MCI_ARCHITECTURE = "vit_base_mci_224"
MCI_SIZES = (768, 16)


def _conv_stem(architecture, args):
    """Whether timm's `architecture` is a HybridEmbed on MobileCLIP's ConvStem (then its
    embed_layer is taken out of `args`); a LayoutError for a ConvStem that is not keras_vit's
    conv_stem, saying how."""
    embed = args.get("embed_layer")
    hybrid = embed.get("hybrid_embed", {}) if isinstance(embed, dict) else {}
    stem = hybrid.get("backbone", {})
    if stem.get("class") != "ConvStem":
        return False
    kernels, channels = stem.get("kernel_size", []), stem.get("channels", [])
    problems = [problem for bad, problem in (
        (len(kernels) != 3 or kernels[1:] != [2, 2] or stem.get("stride") != kernels
         or any(stem.get("padding", [None])),
         f"kernels {kernels}, strides {stem.get('stride')} and paddings "
         f"{stem.get('padding')} (keras_vit's conv_stem: [p/4, 2, 2], the same, 0)"),
        (len(channels) != 3 or channels[0] != channels[1] or 4 * channels[0] != channels[2],
         f"channels {channels} (keras_vit's conv_stem: [D/4, D/4, D])"),
        ((stem.get("norm"), stem.get("norm_eps")) != ("BatchNormAct2d", 1e-5),
         f"norm {stem.get('norm')} of epsilon {stem.get('norm_eps')} (keras_vit's conv_stem: "
         "BatchNorm, 1e-5)"),
        ((stem.get("act"), stem.get("act_approximate")) != ("GELU", "none"),
         f"activation {stem.get('act')} (keras_vit's conv_stem: exact GELU)"),
        (set(hybrid) - {"backbone", "proj"} or hybrid.get("proj", True),
         f"HybridEmbed options {hybrid!r} (a projection after the stem)")) if bad]
    if problems:
        raise LayoutError(f"timm architecture {architecture!r} has a ConvStem of "
                          f"{problems[0]}, which keras_vit has no option for yet.")
    args.pop("embed_layer")
    args.pop("patch_size")  # 1: tokens of the stem's map, whose stride is keras_vit's patch
    return True


def spec_from_config(config, state, timm_class):
    """The `ViTConfig` of timm's hybrid `config.json`: the variant of its ResNet, timm's
    numerics, and the sizes the weights `state` show."""
    architecture, args = timm_common.timm_args(config, timm_common.VIT_DEFAULTS)
    if _conv_stem(architecture, args):  # the stem's strides are the patch (timm_common.sizes)
        return timm_common.spec_from_vision_transformer(architecture, args, config, state,
                                                        distilled=False, conv_stem=True)
    units = _units(architecture, args)
    # Its patches are cut from the ResNet's map: pixels per patch, its stride times.
    return timm_common.spec_from_vision_transformer(
        architecture, args, config, state, distilled=False,
        stride=4 * 2 ** max(len(units) - 1, 0), variant=_HYBRIDS[units], resnet_numerics="timm")


def _units(architecture, args):
    """The units per stage of the ResNet of timm's hybrid `architecture`, its embed_layer and
    padding_same taken out of `args`; a LayoutError for a stem keras_vit has not got, saying
    why."""
    embed = args.pop("embed_layer")
    padding_same = args.pop("padding_same", True)
    backbone = embed.get("hybrid_embed", {}).get("backbone", {}) if isinstance(embed,
                                                                               dict) else {}
    problems = [problem for bad, problem in (
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
            (backbone.get("conv_eps"), backbone.get("norm_eps")) != TIMM_RESNET_EPSILONS),
         f"weight standardisation epsilon {backbone.get('conv_eps')} and GroupNorm epsilon "
         f"{backbone.get('norm_eps')} (keras_vit's resnet_numerics='timm': "
         f"{TIMM_RESNET_EPSILONS[0]:g}, {TIMM_RESNET_EPSILONS[1]:g})"))
        if bad]
    if problems:
        raise LayoutError(f"timm architecture {architecture!r} is a hybrid of "
                          f"{problems[0]}, which keras_vit has no option for yet.")
    return tuple(backbone["layers"])


def config_for(spec, preprocessing, arrays=None):
    """timm's `config.json` for a hybrid: the architecture of its ResNet (or MobileCLIP's for
    a conv_stem) and LayerNorm epsilon (`timm_common.vision_transformer_config`), or a
    LayoutError for one timm cannot build (`_check`)."""
    config = timm_common.vision_transformer_config(spec, preprocessing, _architecture, _check)
    if spec.conv_stem:  # tokens of the stem's map, one a step
        config["model_args"]["patch_size"] = 1
    return config


def _check(spec):
    """A LayoutError for a hybrid timm cannot build: its ResNetV2 hard-codes timm's numerics,
    its ConvStem MobileCLIP's sizes, and it has no distilled hybrid."""
    if spec.conv_stem and (spec.hidden_size, spec.patch_size) != MCI_SIZES:
        raise LayoutError(
            f"timm's {MCI_ARCHITECTURE} builds its ConvStem for width {MCI_SIZES[0]} and "
            f"{MCI_SIZES[1]}-pixel patches whatever its model_args say, and this model has "
            f"hidden_size {spec.hidden_size}, patch_size {spec.patch_size}: save it with "
            "keras_vit.weights.checkpoint.save_npz or model.save(...keras).")
    if spec.residual_post_norm or spec.parallel_blocks or spec.activation == "swiglu":
        raise LayoutError("timm's hybrids have pre-norm blocks and GELU MLPs: save a hybrid "
                          "without residual_post_norm, parallel_blocks or SwiGLU.")
    if spec.is_hybrid and spec.resnet_numerics != "timm":
        raise LayoutError(
            f"timm's ResNetV2 hard-codes its numerics (weights standardised by sqrt(var + "
            f"1e-8), GroupNorm epsilon 1e-5; StdConv2dSame, GroupNormAct), and this "
            f"{spec.variant} has resnet_numerics={spec.resnet_numerics!r} (the original's, "
            "which timm's logits would not match): build it with resnet_numerics='timm' to "
            "write it for timm, or save it with keras_vit.weights.checkpoint.save_npz.")
    if spec.distillation_token or spec.axial:
        raise LayoutError("timm's hybrids are VisionTransformers: it has no hybrid with a "
                          "distillation token or axial blocks.")


def _architecture(spec):
    """(name, its arguments): timm's hybrid architecture with the model's ResNet (its entry
    point builds the backbone; model_args set the rest) and LayerNorm epsilon."""
    table = timm_common.timm_architectures()
    if spec.conv_stem:
        args = {**timm_common.VIT_DEFAULTS, **table[MCI_ARCHITECTURE].get("args", {})}
        timm_common.architecture_of_epsilon(
            spec.layer_norm_epsilon, [(MCI_ARCHITECTURE, args["norm_layer"]["layer_norm"])],
            f"timm's {MCI_ARCHITECTURE}")
        return MCI_ARCHITECTURE, args
    units = tuple(spec.resnet_units)

    def fitting():
        for name in [_HYBRID_ARCHITECTURES[units], *sorted(table)]:
            entry = table.get(name, {})
            args = {**timm_common.VIT_DEFAULTS, **entry.get("args", {})}
            if entry.get("class") != "VisionTransformer" or "embed_layer" not in args:
                continue
            try:
                if _units(name, args) != units:
                    continue
            except LayoutError:
                continue
            norm = args.pop("norm_layer")
            if (isinstance(norm, dict) and "layer_norm" in norm
                    and not timm_common.missing({**args,
                                                 "layer_norm_epsilon": norm["layer_norm"]})):
                yield name, norm["layer_norm"]

    name = timm_common.architecture_of_epsilon(
        spec.layer_norm_epsilon, fitting(), f"timm's hybrids of this ResNet ({spec.variant})")
    return name, {**timm_common.VIT_DEFAULTS, **table[name].get("args", {})}


def weight_pairs(spec):
    """VisionTransformer's, and the ResNet as timm's ResNetV2 names it under
    `patch_embed.backbone.`: its stem `stem.conv`, `stem.norm` (R+Ti/16's stem alone: `conv`,
    `norm`), and in stage s, block u, `conv1..3`, `norm1..3` and the first block's
    `downsample.conv`, `.norm` (the original's `block{s+1}/unit{u+1}/conv1..3`, `gn1..3`,
    `conv_proj`, `gn_proj`). Its final `norm` is an Identity (preact=False), without weights."""
    backbone = "patch_embed.backbone."
    if spec.conv_stem:
        return timm_common.weight_pairs(spec, backbone=_conv_stem_pairs(backbone))
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
    return timm_common.weight_pairs(spec, backbone=pairs)


def _conv_stem_pairs(backbone):
    """MobileCLIP's ConvStem as timm names it: `0.conv`, `0.bn` and `1.conv`, `1.bn` (its
    BatchNorms' running statistics too); its last convolution, `2.conv`, is the patch
    embedding (`timm_common.weight_pairs`, `CONV_STEM_PROJECTION`)."""
    pairs = []
    for index in range(2):
        ours, theirs = f"conv_stem/bn_{index}/", f"{backbone}{index}.bn."
        pairs += [(f"conv_stem/conv_{index}/kernel", f"{backbone}{index}.conv.weight", "conv"),
                  (ours + "scale", theirs + "weight", "copy"),
                  (ours + "bias", theirs + "bias", "copy"),
                  (ours + "moving_mean", theirs + "running_mean", "copy"),
                  (ours + "moving_variance", theirs + "running_var", "copy")]
    return pairs


def to_arrays(state, spec, config=None):
    """timm's state as the `.npz` layout (`timm_common.to_arrays`), without its BatchNorms'
    `num_batches_tracked`: a count of training steps, unused with a set momentum (PyTorch
    starts it at 0 where a file has none)."""
    state = {key: value for key, value in state.items()
             if not key.endswith(".num_batches_tracked")}
    return timm_common.to_arrays(state, spec, weight_pairs(spec))


FAMILY = Family(name="ViT-ResNet hybrid", library="timm", classes={"VisionTransformer": False},
                reads=lambda args: args.get("embed_layer") is not None,
                spec_from_config=spec_from_config,
                writes=lambda spec: spec.is_hybrid or spec.conv_stem,
                config_for=config_for, weight_pairs=weight_pairs, to_arrays=to_arrays)

"""The ViT weight layouts of PyTorch's two libraries, Hugging Face transformers and timm, as
maps to and from the original `.npz` layout (`keras_vit.weights.checkpoint`), and their
`config.json` to and from a `ViTConfig`. Pure NumPy: no torch is needed to read or write them.

Each checkpoint family (transformers' DINOv2, timm's Eva...) is one module with a `FAMILY`
(`family.Family`: which classes it reads, which models it writes, their config.json and
weights); the registry below lists them, and the functions here hand each file or model to its
family. What families share is in `common` (and `transformers_common`, `timm_common`).
"""

from keras_vit.weights.torch_layouts import (common, timm_common, timm_eva, timm_hybrid,
                                             timm_naflex, timm_relpos, timm_vit,
                                             transformers_aimv2, transformers_clip,
                                             transformers_deit, transformers_dinov2,
                                             transformers_dinov3, transformers_ijepa,
                                             transformers_mae, transformers_metaclip2,
                                             transformers_msn, transformers_siglip,
                                             transformers_siglip2, transformers_vit)
from keras_vit.weights.torch_layouts.common import LayoutError
from keras_vit.weights.torch_layouts.timm_common import timm_architectures

__all__ = ["FAMILIES", "FORMATS", "LayoutError", "TIMM_CLASSES", "TRANSFORMERS_ARCHITECTURES",
           "detect", "from_npz_arrays", "is_native", "spec_from_timm", "spec_from_transformers",
           "timm_architectures", "timm_config", "to_npz_arrays", "transformers_config",
           "vision_tower"]

# The registry: each library's families, from the most general to the most specific. A
# config.json or a model goes to the last family that claims it, so each library's plain ViT,
# first, writes every model no later family claims (and refuses what it cannot express);
# messages list the classes in this order.
FAMILIES = {
    "transformers": (transformers_vit.FAMILY, transformers_deit.FAMILY,
                     transformers_dinov2.FAMILY, transformers_clip.FAMILY,
                     transformers_siglip.FAMILY, transformers_msn.FAMILY,
                     transformers_mae.FAMILY, transformers_dinov3.FAMILY,
                     transformers_siglip2.FAMILY, transformers_ijepa.FAMILY,
                     transformers_metaclip2.FAMILY, transformers_aimv2.FAMILY),
    "timm": (timm_vit.FAMILY, timm_hybrid.FAMILY, timm_relpos.FAMILY, timm_eva.FAMILY,
             timm_naflex.FAMILY),
}
FORMATS = tuple(FAMILIES)

# transformers' architectures keras_vit reads -> the prefix of their encoder's weights.
TRANSFORMERS_ARCHITECTURES = {name: prefix for family in FAMILIES["transformers"]
                              for name, prefix in family.classes.items()}
# timm's model classes keras_vit reads -> whether it has DeiT's distillation token.
TIMM_CLASSES = {name: distilled for family in FAMILIES["timm"]
                for name, distilled in family.classes.items()}
# transformers' model types keras_vit reads -> the class of a config that names none.
_MODEL_TYPES = {model_type: name for family in FAMILIES["transformers"]
                for model_type, name in family.model_types.items()}
# transformers' classes keras_vit knows but has no model of -> why.
_REFUSED = {name: why for family in FAMILIES["transformers"]
            for name, why in family.refuses.items()}


def _claiming(families, claims):
    """The last of `families` for which `claims(family)` holds, or None."""
    return next((family for family in reversed(families) if claims(family)), None)


def detect(config):
    """"transformers" or "timm": which library wrote this `config.json`."""
    if config.get("model_type") in _MODEL_TYPES:
        return "transformers"
    if "architecture" in config:
        return "timm"
    model_type = config.get("model_type") or config.get("architectures")
    *names, last = (family.name for family in FAMILIES["transformers"])
    raise LayoutError(
        f"config.json is neither transformers' {', '.join(names)} nor {last} (model_type "
        f"{', '.join(repr(name) for name in _MODEL_TYPES)}) nor timm's (an "
        f"'architecture' field); it describes {model_type!r}. keras_vit reads those, and the "
        "original .npz checkpoints.")


def is_native(config):
    """Whether `config.json` is a NaFlex model's (transformers' SigLIP 2, timm's NaFlexVit),
    which loads as a `keras_vit.native.NaFlexViT`."""
    natives = [family for families in FAMILIES.values() for family in families
               if family.native]
    if "architecture" in config:  # timm's
        name = str(config["architecture"]).split(".")[0]
        timm_class = timm_architectures().get(name, {}).get("class")
        return any(timm_class in family.classes for family in natives)
    return any(config.get("model_type") in family.model_types for family in natives)


def vision_tower(config, state, projection=False):
    """`(config, state)` of the part keras_vit reads of a larger model's files: the vision
    tower of a CLIPModel's, MetaClip2Model's or SiglipModel's (its `vision_config`, its
    `vision_model.` weights without the prefix), the text tower and the contrastive parameters
    dropped with a log line; with `projection`, a CLIPModel's (MetaClip2Model's) tower and its
    `visual_projection` as CLIPVisionModelWithProjection's (MetaClip2...) files; of a
    ViTMAEForPreTraining, its encoder as ViTMAEModel's (the decoder dropped with a log line);
    ViTMSNForImageClassification's with its blocks under `vit.`; an
    IJepaForImageClassification without a classifier as its IJepaModel; other files as they
    are."""
    for family in reversed(FAMILIES["transformers"]):
        part = family.vision_tower and family.vision_tower(config, state, projection)
        if part:
            return part
    return config, state


def spec_from_transformers(config, state):
    """The `ViTConfig` of a `config.json` of one of transformers' families (a whole
    CLIPModel's or SiglipModel's through `vision_tower` first), with the weights `state`
    saying what the config does not (whether a `ViTModel` has its pooler, how many classes
    DeiT's heads have...)."""
    if config.get("num_channels", 3) != 3:
        raise LayoutError(f"num_channels {config['num_channels']}: keras_vit takes RGB images.")
    default = _MODEL_TYPES.get(config.get("model_type"), "ViTModel")
    architecture = (config.get("architectures") or [default])[0]
    if architecture in _REFUSED:
        raise LayoutError(f"transformers' {architecture} has no keras_vit equivalent yet: "
                          f"{_REFUSED[architecture]}.")
    family = _claiming(FAMILIES["transformers"], lambda family: architecture in family.classes)
    if family is None:
        raise LayoutError(f"architecture {architecture!r}: keras_vit reads "
                          f"{', '.join(TRANSFORMERS_ARCHITECTURES)}.")
    return family.spec_from_config(config, state, architecture)


def spec_from_timm(config, state):
    """The `ViTConfig` of timm's `config.json`, with the sizes the weights `state` show."""
    architecture, entry = timm_common.architecture_entry(config)
    args = {**entry["args"], **(config.get("model_args") or {})}
    family = _claiming(FAMILIES["timm"], lambda family: (entry["class"] in family.classes
                                                         and family.reads(args)))
    if family is None:
        raise LayoutError(
            f"timm architecture {architecture!r} is timm's {entry['class']}, not its "
            "VisionTransformer: keras_vit reads the VisionTransformer family (and DeiT's "
            "VisionTransformerDistilled, Eva and NaFlexVit).")
    return family.spec_from_config(config, state, entry["class"])


def _writer(spec, layout, native=False):
    """The family of `layout`, a library's name, that writes a model of `spec`; with `native`,
    its NaFlex family (a `keras_vit.native.NaFlexViT` of that spec)."""
    if layout not in FORMATS:
        raise ValueError(f"layout must be one of {FORMATS}, got {layout!r}.")
    if native:
        family = _claiming(FAMILIES[layout], lambda family: family.native and family.config_for)
        if family is None:
            raise LayoutError(f"No {layout} family writes NaFlex models itself (transformers' "
                              "SigLIP 2 is written as SigLIP, then renamed: "
                              "keras_vit.save_pretrained does both).")
    else:
        family = _claiming(FAMILIES[layout], lambda family: family.writes(spec))
    if family is not transformers_aimv2.FAMILY:  # AIMv2's options are its alone
        transformers_aimv2.refuse_options(spec, f"{layout}'s {family.name}")
    if spec.relative_mlp_shared and family is not timm_relpos.FAMILY:
        raise LayoutError(f"{layout}'s {family.name} has no relative-position MLP shared by "
                          "every block (relative_mlp_shared): timm's VisionTransformerRelPos "
                          "alone has it (shared_rel_pos); save this model with format='timm'.")
    if spec.conv_stem and family is not timm_hybrid.FAMILY:  # as is MobileCLIP's stem timm's
        raise LayoutError(f"{layout}'s {family.name} has no convolutional stem (conv_stem, "
                          "MobileCLIP's): save this model with format='timm' (its "
                          f"{timm_hybrid.MCI_ARCHITECTURE}).")
    return family


def transformers_config(spec, arrays=None):
    """transformers' `config.json` for a model of `spec`, by the transformers family that
    writes it (its ViT, or its DeiT with a teacher for a model with DeiT's distillation token,
    its DINOv2 for one with LayerScale, its CLIPVisionModel or SiglipVisionModel for one of
    their options, its IJepaModel for GAP without a class token, its DINOv3ViTModel for one
    with RoPE, whose key bias, in the weights
    `arrays`, says its key_bias); a LayoutError for what they cannot express."""
    timms = [problem for bad, problem in (
        (spec.residual_post_norm, "post-norm blocks (residual_post_norm, timm's ResPostBlock)"),
        (common.eva_pooling(spec), "an attention pooling of its own heads or MLP width, or "
                                   "over the class and register tokens (map_num_heads, "
                                   "map_mlp_dim, map_include_prefix: timm's Eva)"),
        (spec.differential, "differential attention (attention_layer='differential': timm's "
                            "DiffAttention)"),
        (spec.parallel_blocks, "parallel blocks (parallel_blocks: timm's "
                               "ParallelScalingBlock)")) if bad]
    if timms:  # none of transformers' classes has them
        raise LayoutError(f"transformers' ViT classes have no {'; no '.join(timms)}: save this "
                          "model with format='timm'.")
    return _writer(spec, "transformers").config_for(spec, None, arrays)


def timm_config(spec, preprocessing, arrays=None, native=False):
    """timm's `config.json` (what `timm.create_model("local-dir:DIR", pretrained=True)` reads)
    for a model of `spec`, by the timm family that writes it: its sizes and options in
    `model_args`, and in `pretrained_cfg` the resize and crop of `preprocessing` (the model's
    `keras_vit.EvalPreprocessing`). A model with RoPE is timm's Eva, whose attention depends on
    the weights, `arrays` (`timm_eva.eva_attention`), as is one with NormFormer's inner
    LayerNorms (timm's scale_attn_inner, scale_mlp); with `native`, a `NaFlexViT` of `spec`
    is timm's NaFlexVit."""
    return _writer(spec, "timm", native).config_for(spec, preprocessing, arrays)


def to_npz_arrays(state, spec, layout, config=None):
    """Their state dict (name -> array) as the `.npz` layout `checkpoint.load_npz` reads.
    Every tensor must be used and every expected one present: a LayoutError names the rest.
    `config`, the checkpoint's config.json, says how timm's Eva lays out RoPE's channels
    (None: as keras_vit does), and whether the weights are timm's NaFlexVit's (SigLIP 2's are
    SigLIP's by then: `vision_tower`)."""
    native = layout == "timm" and config is not None and is_native(config)
    return _writer(spec, layout, native).to_npz_arrays(state, spec, config)


def from_npz_arrays(arrays, spec, layout, native=False):
    """The `.npz` layout (`checkpoint.model_arrays`) as their state dict; with `native`, a
    `NaFlexViT`'s as the NaFlex class of `layout` (timm's NaFlexVit)."""
    return _writer(spec, layout, native).from_npz_arrays(arrays, spec)

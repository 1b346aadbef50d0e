"""The ViT weight layouts of PyTorch's two libraries, Hugging Face transformers and timm, as maps
to and from the original `.npz` layout (`keras_vit.checkpoint`), and their `config.json` to and
from a `ViTConfig`. Pure NumPy: no torch is needed to read or write them.

transformers' `ViTModel` / `ViTForImageClassification` files keep separate query, key and value
Linear layers under `vit.encoder.layer.N.attention.attention.*` (no `vit.` prefix for a saved
`ViTModel`, which may add `pooler.dense`, the original's tanh `pre_logits`); timm's
`VisionTransformer` fuses them (`blocks.N.attn.qkv`, [3D, D]). Linear weights are
(out, in) in both, the patch convolution (D, C, p, p). timm's later ViTs add register tokens
(`reg_token`), a norm before the blocks (`norm_pre`, with no patch bias), LayerScale
(`blocks.N.ls1.gamma`, `ls2.gamma`) and a norm after pooling (`fc_norm`); which of these an
architecture has is in `timm_architectures.json`.

DeiT's distilled models (Touvron et al., "Training data-efficient image transformers &
distillation through attention", 2021) add a distillation token after the class token, its
own position-embedding row and a second head on it: timm's `VisionTransformerDistilled`
(`dist_token`, `head_dist`) and transformers' `DeiTForImageClassificationWithTeacher`
(`deit.embeddings.distillation_token`, `cls_classifier`, `distillation_classifier`), whose
outputs are the mean of the two heads' logits, as keras_vit's `distillation_token=True`.

DINOv2 (Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision", 2023) and
its registers form (Darcet et al., "Vision Transformers Need Registers", 2024) are
transformers' `Dinov2Model` / `Dinov2WithRegistersModel`: ViT's attention names, with
LayerScale (`layer_scale1.lambda1`), `norm1`, `norm2`, `mlp.fc1`, `mlp.fc2`, a `mask_token`
used only for masked image modelling, and for registers `embeddings.register_tokens` after the
class token, which have no position-embedding rows (the class token has one). Their
`Dinov2ForImageClassification` / `Dinov2WithRegistersForImageClassification` hold that model
under `dinov2.` / `dinov2_with_registers.` and a `classifier` on the final LayerNorm's class
token concatenated with the mean of the patch tokens, registers left out (keras_vit's
classifier "token_gap").

The vision towers of CLIP (Radford et al., "Learning Transferable Visual Models From Natural
Language Supervision", 2021) and SigLIP (Zhai et al., "Sigmoid Loss for Language Image
Pre-Training", 2023) are transformers' `CLIPVisionModel` and `SiglipVisionModel` (and the
`vision_model.` of `CLIPModel` / `SiglipModel`, `vision_tower`): `encoder.layers.N` with
`self_attn.{q,k,v,out}_proj`, `layer_norm1`, `layer_norm2`, `mlp.fc1`, `mlp.fc2`, position
embeddings as an nn.Embedding (tokens, D). CLIP has a class token `class_embedding` (D,), a
patch convolution without bias, `pre_layrnorm` and `post_layernorm` on the pooled class token;
SigLIP no class token, `post_layernorm` on every token and attention pooling, `head` (a torch
nn.MultiheadAttention with a packed `in_proj_weight`). `CLIPVisionModelWithProjection` holds
CLIP's tower under `vision_model.` and `visual_projection` (a Linear without bias to the joint
embedding, its `image_embeds`): keras_vit's head, with a zero bias.

ViT-MSN (Assran et al., "Masked Siamese Networks for Label-Efficient Learning", 2022) and
ViT-MAE's encoder (He et al., "Masked Autoencoders Are Scalable Vision Learners", 2022) are
ViT's layout without its pooler: transformers' `ViTMSNModel`, `ViTMSNForImageClassification`
(`vit.`, `classifier` on the normed class token), `ViTMAEModel` and the `vit.` of
`ViTMAEForPreTraining` (its `decoder.` left out, `vision_tower`). MAE's fixed 2-D sin-cos
position embeddings are saved with the weights (class token row zero) and load as learned ones,
exactly; keras_vit's "sincos_2d" uses other frequencies (big_vision's) and no class row.
"""

import functools
import json
import logging
import math
import os
import re

import numpy as np

from keras_vit import variants
from keras_vit.spec import ACTIVATIONS, DEFAULTS, ViTConfig

logger = logging.getLogger(__name__)

FORMATS = ("transformers", "timm")
# transformers' architectures keras_vit reads -> the prefix of their encoder's weights.
TRANSFORMERS_ARCHITECTURES = {"ViTForImageClassification": "vit.", "ViTModel": "",
                              "DeiTForImageClassificationWithTeacher": "deit.",
                              "Dinov2Model": "", "Dinov2WithRegistersModel": "",
                              "Dinov2ForImageClassification": "dinov2.",
                              "Dinov2WithRegistersForImageClassification":
                                  "dinov2_with_registers.",
                              "CLIPVisionModel": "", "SiglipVisionModel": "",
                              "CLIPVisionModelWithProjection": "vision_model.",
                              "ViTMSNModel": "", "ViTMSNForImageClassification": "vit.",
                              "ViTMAEModel": "", "DINOv3ViTModel": ""}
# transformers' model types keras_vit reads -> the class of a config that names none.
_TRANSFORMERS_MODEL_TYPES = {"vit": "ViTModel", "deit": "DeiTModel", "dinov2": "Dinov2Model",
                             "dinov2_with_registers": "Dinov2WithRegistersModel",
                             "clip_vision_model": "CLIPVisionModel",
                             "siglip_vision_model": "SiglipVisionModel",
                             "clip": "CLIPModel", "siglip": "SiglipModel",
                             "vit_msn": "ViTMSNModel", "vit_mae": "ViTMAEModel",
                             "dinov3_vit": "DINOv3ViTModel"}
# transformers' classes that classify from the final LayerNorm's class token, as keras_vit.
_TRANSFORMERS_CLASSIFIERS = ("ViTForImageClassification", "ViTMSNForImageClassification")
# Image-text models whose vision tower loads (`vision_tower`): model_type -> tower's class.
_TOWERS = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}
_TOWER_FAMILIES = {"CLIPVisionModel": "clip", "SiglipVisionModel": "siglip",
                   # CLIP's tower with visual_projection (a Linear without bias) as the head
                   "CLIPVisionModelWithProjection": "clip"}
# DINOv2's classes -> whether they classify: their classifier reads the final LayerNorm's class
# token concatenated with the mean of the patch tokens (registers left out), classifier
# "token_gap".
_DINOV2_ARCHITECTURES = {"Dinov2Model": False, "Dinov2WithRegistersModel": False,
                         "Dinov2ForImageClassification": True,
                         "Dinov2WithRegistersForImageClassification": True}
# transformers' DeiT classes keras_vit has no model of, with why.
_TRANSFORMERS_REFUSED = {
    "DeiTForImageClassification": "it classifies from the class token alone while its "
                                  "distillation token still attends, where keras_vit's distilled "
                                  "models average a head on each token",
    "DeiTModel": "its pooler reads the class token alone, where keras_vit's distilled models "
                 "without a head average the class and distillation tokens",
}
# timm's model classes keras_vit reads -> whether it has DeiT's distillation token;
# VisionTransformerDistilled takes VisionTransformer's arguments, Eva its own (`_EVA_DEFAULTS`).
TIMM_CLASSES = {"VisionTransformer": False, "VisionTransformerDistilled": True, "Eva": False,
                "VisionTransformerRelPos": False}
# transformers' hidden_act -> the spec's activation (the tanh GELU is the original's).
_TRANSFORMERS_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                             "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
                             "quick_gelu": "quick_gelu"}
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
_SWIGLU_PACKED = {"partial": "GluMlp", "act_layer": "<SiLU>", "gate_last": False}
_SILU = ("<SiLU>", "silu", "swish")  # act_layer as a class, or get_act_layer's names
# norm_layer is read as layer_norm_epsilon where it is a LayerNorm; any other is missing.
_TIMM_OPTIONS = set(_TIMM_DEFAULTS) - {"norm_layer"} | {"layer_norm_epsilon"}
_TIMM_POOLS = {"token": "token", "avg": "gap", "map": "map"}  # timm's global_pool -> classifier
# Spec options transformers' ViT does not have (timm's VisionTransformer has them all).
_LATER_OPTIONS = ("layer_scale_init", "num_register_tokens", "prefix_position_embeddings",
                  "pre_norm", "final_norm")
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
_TIMM_RESNET_EPSILONS = (1e-8, 1e-5)


class LayoutError(ValueError):
    """A config or a set of weights this module cannot map, with the reason and the fix."""


def _transforms(heads):
    """kind -> (to the `.npz` layout, back to PyTorch's)."""
    return {
        "copy": (lambda v: v, lambda v: v),
        "linear": (lambda v: v.T, lambda v: v.T),
        "conv": (lambda v: v.transpose(2, 3, 1, 0), lambda v: v.transpose(3, 2, 0, 1)),
        # q, k, v: Linear (D, D) -> kernel (D, heads, D / heads); bias (heads, D / heads).
        "heads_in": (lambda v: v.T.reshape(v.shape[1], heads, -1),
                     lambda v: v.reshape(v.shape[0], -1).T),
        "heads_bias": (lambda v: v.reshape(heads, -1), lambda v: v.reshape(-1)),
        # the output projection: Linear (D, D) -> kernel (heads, D / heads, D).
        "heads_out": (lambda v: v.T.reshape(heads, -1, v.shape[0]),
                      lambda v: v.reshape(-1, v.shape[-1]).T),
        # CLIP's class token (D,) and an nn.Embedding's position rows (tokens, D).
        "vector_token": (lambda v: v.reshape(1, 1, -1), lambda v: v.reshape(-1)),
        "rows": (lambda v: v[None], lambda v: v[0]),
    }


def _block_pairs(index, theirs, spec):
    """(`.npz` key, their key, kind) of one encoder block, with `theirs` naming their layers."""
    ours = f"Transformer/encoderblock_{index}/"
    attention = ours + "MultiHeadDotProductAttention_1/"
    pairs = []
    for name in ("query", "key", "value"):
        pairs.append((attention + f"{name}/kernel", theirs[name] + ".weight", "heads_in"))
        if spec.qkv_bias:
            pairs.append((attention + f"{name}/bias", theirs[name] + ".bias", "heads_bias"))
    pairs += [(attention + "out/kernel", theirs["out"] + ".weight", "heads_out"),
              (attention + "out/bias", theirs["out"] + ".bias", "copy")]
    for ours_name, their_name in (("LayerNorm_0", "norm_0"), ("LayerNorm_2", "norm_2")):
        pairs += [(ours + f"{ours_name}/scale", theirs[their_name] + ".weight", "copy"),
                  (ours + f"{ours_name}/bias", theirs[their_name] + ".bias", "copy")]
    mlp = (("Dense_0", "fc_0"), ("Dense_1", "fc_1"))
    if spec.activation == "swiglu":  # the gate: a second input projection
        mlp += (("Gate_0", "gate"),)
    for ours_name, their_name in mlp:
        pairs += [(ours + f"MlpBlock_3/{ours_name}/kernel", theirs[their_name] + ".weight",
                   "linear"),
                  (ours + f"MlpBlock_3/{ours_name}/bias", theirs[their_name] + ".bias", "copy")]
    if spec.position_embedding == "relative_mlp" and "relative_fc_0" in theirs:
        # timm's VisionTransformerRelPos: RelPosMlp's fc1 (2 -> hidden), fc2 (hidden -> heads)
        for index in range(2):
            ours_name = attention + f"relative_position/fc{index + 1}/"
            pairs += [(ours_name + "kernel", theirs[f"relative_fc_{index}"] + ".weight",
                       "linear"),
                      (ours_name + "bias", theirs[f"relative_fc_{index}"] + ".bias", "copy")]
    if spec.layer_scale_init is not None:  # timm's and DINOv2's LayerScale (not ViT's)
        pairs += [(ours + f"layer_scale_{branch}/scale", theirs[f"scale_{branch}"], "copy")
                  for branch in range(2)]
    for inner, ours_name, their_name in (
            (spec.attention_inner_norm, attention + "inner_norm", "attention_norm"),
            (spec.mlp_inner_norm, ours + "MlpBlock_3/inner_norm", "mlp_norm")):
        if inner and their_name not in theirs:  # timm's Eva alone has them
            raise LayoutError("Only timm's Eva has LayerNorms inside the attention or the MLP "
                              "(attention_inner_norm, mlp_inner_norm: its scale_attn_inner, "
                              "scale_mlp); save this model with format='timm'.")
        if inner:
            pairs += [(ours_name + "/scale", theirs[their_name] + ".weight", "copy"),
                      (ours_name + "/bias", theirs[their_name] + ".bias", "copy")]
    return pairs


def _pairs(spec, layout, prefix=""):
    """Every (`.npz` key, their key, kind) of a model of `spec` in `layout`."""
    family = _tower_family(spec) if layout == "transformers" else None
    if family:
        return _tower_pairs(spec, family, prefix)
    if layout == "transformers" and spec.rope:
        return _dinov3_pairs(spec, prefix)
    if layout == "transformers":
        stem = [("embedding/kernel", "embeddings.patch_embeddings.projection.weight", "conv"),
                ("embedding/bias", "embeddings.patch_embeddings.projection.bias", "copy"),
                ("cls", "embeddings.cls_token", "copy"),
                ("Transformer/posembed_input/pos_embedding", "embeddings.position_embeddings",
                 "copy")]
        if spec.distillation_token:
            stem.append(("dist", "embeddings.distillation_token", "copy"))
        if spec.num_register_tokens:
            stem.append(("reg/registers", "embeddings.register_tokens", "copy"))
        norm = "layernorm"
        block = "encoder.layer.{}."
        names = {"query": "attention.attention.query", "key": "attention.attention.key",
                 "value": "attention.attention.value", "out": "attention.output.dense",
                 "norm_0": "layernorm_before", "norm_2": "layernorm_after",
                 "fc_0": "intermediate.dense", "fc_1": "output.dense"}
        if _is_dinov2(spec):
            names.update(norm_0="norm1", norm_2="norm2", fc_0="mlp.fc1", fc_1="mlp.fc2",
                         scale_0="layer_scale1.lambda1", scale_1="layer_scale2.lambda1")
            if spec.activation == "swiglu":  # `weights_in` unpacked (`_TRANSFORMERS_PACKED`)
                names.update(fc_0="mlp.weights_in.up", gate="mlp.weights_in.gate",
                             fc_1="mlp.weights_out")
        heads = ([("head", "cls_classifier"), ("head_dist", "distillation_classifier")]
                 if spec.distillation_token else [("head", "classifier")])
    else:
        stem = [("embedding/kernel", "patch_embed.proj.weight", "conv")]
        if spec.position_embedding == "learned":  # Eva's RoPE models may have none
            stem.append(("Transformer/posembed_input/pos_embedding", "pos_embed", "copy"))
        if not spec.pre_norm:  # timm's patch embedding has no bias before a pre-norm
            stem.append(("embedding/bias", "patch_embed.proj.bias", "copy"))
        if spec.class_token:  # Eva's GAP models may have one too
            stem.append(("cls", "cls_token", "copy"))
        if spec.distillation_token:
            stem.append(("dist", "dist_token", "copy"))
        if spec.num_register_tokens:
            stem.append(("reg/registers", "reg_token", "copy"))
        if spec.pre_norm:
            stem += [("pre_norm/scale", "norm_pre.weight", "copy"),
                     ("pre_norm/bias", "norm_pre.bias", "copy")]
        norm = "norm"
        block = "blocks.{}."
        names = {"query": "attn.q", "key": "attn.k", "value": "attn.v", "out": "attn.proj",
                 "norm_0": "norm1", "norm_2": "norm2", "fc_0": "mlp.fc1", "fc_1": "mlp.fc2",
                 "scale_0": "ls1.gamma", "scale_1": "ls2.gamma"}
        if spec.activation == "swiglu":  # Eva's, its packed GluMlp unpacked (`_eva_names`)
            names.update(fc_0="mlp.fc1_x", gate="mlp.fc1_g")
        # Eva's NormFormer LayerNorms (scale_attn_inner, scale_mlp); VisionTransformerRelPos's
        # relative-position MLP
        names.update(attention_norm="attn.norm", mlp_norm="mlp.norm",
                     relative_fc_0="attn.rel_pos.mlp.fc1", relative_fc_1="attn.rel_pos.mlp.fc2")
        heads = [("head", "head")] + ([("head_dist", "head_dist")] if spec.distillation_token
                                      else [])
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    if layout == "timm" and spec.is_hybrid:
        pairs += _timm_resnet_pairs(spec)
    for index in range(spec.num_layers):
        theirs = {key: prefix + block.format(index) + value for key, value in names.items()}
        pairs += _block_pairs(index, theirs, spec)
        if spec.rope == "mixed" and layout == "timm":  # Eva's rope.freqs[:, index]
            pairs.append((_ATTENTION.format(index) + "rope/frequencies",
                          f"{prefix}rope.freqs.{index}", "copy"))
    if spec.final_norm == "tokens":
        pairs += [("Transformer/encoder_norm/scale", prefix + norm + ".weight", "copy"),
                  ("Transformer/encoder_norm/bias", prefix + norm + ".bias", "copy")]
    elif spec.final_norm == "pooled":
        pairs += [("fc_norm/scale", "fc_norm.weight", "copy"),
                  ("fc_norm/bias", "fc_norm.bias", "copy")]
    if spec.classifier == "map":  # timm's AttentionPoolLatent (kv split as qkv is)
        pairs += _map_pairs(prefix)
    if layout == "transformers" and spec.representation_size is not None:
        pairs += [("pre_logits/kernel", "pooler.dense.weight", "linear"),
                  ("pre_logits/bias", "pooler.dense.bias", "copy")]
    if spec.include_top:  # the heads are outside transformers' encoder: no prefix
        for ours, theirs in heads:
            pairs += [(ours + "/kernel", theirs + ".weight", "linear"),
                      (ours + "/bias", theirs + ".bias", "copy")]
    return pairs


def _timm_resnet_pairs(spec):
    """The ResNet of a hybrid as timm's ResNetV2 names it under `patch_embed.backbone.`: its
    stem `stem.conv`, `stem.norm` (R+Ti/16's stem alone: `conv`, `norm`), and in stage s,
    block u, `conv1..3`, `norm1..3` and the first block's `downsample.conv`, `.norm` (the
    original's `block{s+1}/unit{u+1}/conv1..3`, `gn1..3`, `conv_proj`, `gn_proj`). Its final
    `norm` is an Identity (preact=False), without weights."""
    backbone = "patch_embed.backbone."
    stem = backbone + ("stem." if spec.resnet_units else "")

    def conv_norm(ours, conv, norm, theirs):
        return [(f"{ours}{conv}/kernel", f"{theirs[0]}.weight", "conv"),
                (f"{ours}{norm}/scale", f"{theirs[1]}.weight", "copy"),
                (f"{ours}{norm}/bias", f"{theirs[1]}.bias", "copy")]

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


def _map_pairs(prefix):
    ours, theirs = "MAPHead_0/", prefix + "attn_pool."
    pairs = [(ours + "probe", theirs + "latent", "copy")]
    for name, their_name in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "proj"),
                             ("MlpBlock_0/Dense_0", "mlp.fc1"), ("MlpBlock_0/Dense_1", "mlp.fc2")):
        pairs += [(ours + name + "/kernel", theirs + their_name + ".weight", "linear"),
                  (ours + name + "/bias", theirs + their_name + ".bias", "copy")]
    return pairs + [(ours + "LayerNorm_0/scale", theirs + "norm.weight", "copy"),
                    (ours + "LayerNorm_0/bias", theirs + "norm.bias", "copy")]


def _dinov3_pairs(spec, prefix):
    """transformers' DINOv3ViTModel: no position embeddings (RoPE), LayerScale, `layer.N.` as
    its files have it (in memory `model.layer.N.`: `_dinov3_names`)."""
    stem = [("embedding/kernel", "embeddings.patch_embeddings.weight", "conv"),
            ("embedding/bias", "embeddings.patch_embeddings.bias", "copy"),
            ("cls", "embeddings.cls_token", "copy")]
    if spec.num_register_tokens:
        stem.append(("reg/registers", "embeddings.register_tokens", "copy"))
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    names = {"query": "attention.q_proj", "key": "attention.k_proj",
             "value": "attention.v_proj", "out": "attention.o_proj", "norm_0": "norm1",
             "norm_2": "norm2", "fc_0": "mlp.up_proj", "fc_1": "mlp.down_proj",
             "gate": "mlp.gate_proj", "scale_0": "layer_scale1.lambda1",
             "scale_1": "layer_scale2.lambda1"}
    for index in range(spec.num_layers):
        block = f"{prefix}layer.{index}."
        pairs += _block_pairs(index, {key: block + value for key, value in names.items()}, spec)
    return pairs + [("Transformer/encoder_norm/scale", prefix + "norm.weight", "copy"),
                    ("Transformer/encoder_norm/bias", prefix + "norm.bias", "copy")]


def _tower_pairs(spec, family, prefix):
    """CLIP's and SigLIP's vision towers (`_tower_family`)."""
    stem = [("embedding/kernel", "embeddings.patch_embedding.weight", "conv"),
            (_POSITIONS, "embeddings.position_embedding.weight", "rows")]
    if family == "clip":  # no patch bias: to_npz_arrays adds a zero one
        stem += [("cls", "embeddings.class_embedding", "vector_token"),
                 ("pre_norm/scale", "pre_layrnorm.weight", "copy"),
                 ("pre_norm/bias", "pre_layrnorm.bias", "copy")]
    else:
        stem.append(("embedding/bias", "embeddings.patch_embedding.bias", "copy"))
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    names = {"query": "self_attn.q_proj", "key": "self_attn.k_proj", "value": "self_attn.v_proj",
             "out": "self_attn.out_proj", "norm_0": "layer_norm1", "norm_2": "layer_norm2",
             "fc_0": "mlp.fc1", "fc_1": "mlp.fc2"}
    for index in range(spec.num_layers):
        block = f"{prefix}encoder.layers.{index}."
        pairs += _block_pairs(index, {key: block + value for key, value in names.items()}, spec)
    norm = "fc_norm" if family == "clip" else "Transformer/encoder_norm"
    pairs += [(f"{norm}/scale", prefix + "post_layernorm.weight", "copy"),
              (f"{norm}/bias", prefix + "post_layernorm.bias", "copy")]
    if family == "clip" and spec.include_top:  # outside vision_model.; no bias (a zero one)
        pairs.append(("head/kernel", "visual_projection.weight", "linear"))
    if family == "siglip":  # the packed in_proj unpacked (`_TRANSFORMERS_PACKED`)
        ours, theirs = "MAPHead_0/", prefix + "head."
        pairs.append((ours + "probe", theirs + "probe", "copy"))
        for name, their_name in (("query", "attention.in_proj.q"), ("key", "attention.in_proj.k"),
                                 ("value", "attention.in_proj.v"), ("out", "attention.out_proj"),
                                 ("MlpBlock_0/Dense_0", "mlp.fc1"),
                                 ("MlpBlock_0/Dense_1", "mlp.fc2")):
            pairs += [(ours + name + "/kernel", theirs + their_name + ".weight", "linear"),
                      (ours + name + "/bias", theirs + their_name + ".bias", "copy")]
        pairs += [(ours + "LayerNorm_0/scale", theirs + "layernorm.weight", "copy"),
                  (ours + "LayerNorm_0/bias", theirs + "layernorm.bias", "copy")]
    return pairs


def _tower_family(spec):
    """"clip" or "siglip" for a model whose options only their vision towers have (a
    pre-norm and a norm of the pooled class token; attention pooling of normed tokens), else
    None. transformers_config refuses what else such a model has that they lack."""
    plain = spec.layer_scale_init is None and not spec.distillation_token and not spec.rope
    if plain and spec.pre_norm and spec.classifier == "token" and spec.final_norm == "pooled":
        return "clip"
    if plain and not spec.pre_norm and spec.classifier == "map" and spec.final_norm == "tokens":
        return "siglip"
    return None


# Tensors torch keeps packed along their first axis, unpacked here into the parts `_pairs`
# names, `{base}.{part}.{kind}`: (base's pattern, what joins base and kind in the packed key,
# the parts in their order).
_TIMM_PACKED = ((r".*attn", ".qkv.", ("q", "k", "v")),  # the blocks' attention
                # the attention pooling's (its q apart: it projects the probe)
                (r".*attn_pool", ".kv.", ("k", "v")))
_TRANSFORMERS_PACKED = ((r".*head\.attention\.in_proj", "_", ("q", "k", "v")),  # SigLIP's pool
                        (r".*\.mlp\.weights_in", ".", ("gate", "up")))  # DINOv2's SwiGLU


def _unpacked(state, packings):
    """`state` with each tensor packed as one of `packings` says split into its parts."""
    split = dict(state)
    for base, joiner, parts in packings:
        pattern = re.compile(rf"({base}){re.escape(joiner)}(weight|bias)$")
        for key, value in state.items():
            match = pattern.fullmatch(key)
            if match:
                del split[key]
                for part, name in zip(np.split(value, len(parts), axis=0), parts):
                    split[f"{match[1]}.{name}.{match[2]}"] = part
    return split


def _packed(state, packings):
    """The inverse of `_unpacked`: the parts concatenated in their order."""
    packed = dict(state)
    for base, joiner, parts in packings:
        first = re.compile(rf"({base})\.{parts[0]}\.(weight|bias)$")
        for key in state:
            match = first.fullmatch(key)
            names = match and [f"{match[1]}.{name}.{match[2]}" for name in parts]
            if names and all(name in packed for name in names):
                packed[f"{match[1]}{joiner}{match[2]}"] = np.concatenate(
                    [packed.pop(name) for name in names])
    return packed


def vision_tower(config, state, projection=False):
    """`(config, state)` of the vision tower of a CLIPModel's or SiglipModel's files (its
    `vision_config`, its `vision_model.` weights without the prefix), the text tower and the
    contrastive parameters dropped with a log line; with `projection`, a CLIPModel's tower and
    its `visual_projection` as CLIPVisionModelWithProjection's files; of a
    ViTMAEForPreTraining, its encoder as ViTMAEModel's (the decoder dropped with a log line);
    ViTMSNForImageClassification's with its blocks under `vit.`; other files as they are."""
    architecture = (config.get("architectures") or [None])[0]
    if architecture == "ViTMAEForPreTraining":
        return _mae_encoder(config, state)
    if architecture == "ViTMSNForImageClassification":
        return config, _msn_classifier_names(state)
    tower = _TOWERS.get(config.get("model_type"))
    if tower is None:
        return config, state
    if projection and tower == "CLIPVisionModel":
        return _clip_tower_with_projection(config, state)
    vision = {key[len("vision_model."):]: value for key, value in state.items()
              if key.startswith("vision_model.")}
    dropped = sorted(key for key in state if not key.startswith("vision_model."))
    if not vision:
        _tensor(state, "vision_model.embeddings.patch_embedding.weight", "transformers")
    groups = sorted({key.split(".")[0] for key in dropped})
    logger.info("Loaded the vision tower (vision_model.) of transformers' %s and left out %s: "
                "keras_vit's model is the image encoder alone%s.",
                (config.get("architectures") or [config["model_type"]])[0], ", ".join(groups),
                " (visual_projection, CLIP's projection to the joint embedding, is left out "
                "too: the output is the tower's pooler_output)"
                if "visual_projection" in groups else "")
    vision_config = {**(config.get("vision_config") or {}), "architectures": [tower],
                     "model_type": f"{config['model_type']}_vision_model"}
    return vision_config, vision


def _clip_tower_with_projection(config, state):
    """A CLIPModel's image encoder and its projection to the joint embedding, as
    CLIPVisionModelWithProjection's files (`vision_model.`, `visual_projection`)."""
    kept = {key: value for key, value in state.items()
            if key.startswith("vision_model.") or key == "visual_projection.weight"}
    _tensor(state, "visual_projection.weight", "transformers")
    logger.info("Loaded the vision tower (vision_model.) and visual_projection of "
                "transformers' %s and left out %s: the output is its image_embeds.",
                (config.get("architectures") or [config["model_type"]])[0],
                ", ".join(sorted({key.split(".")[0] for key in state if key not in kept})))
    vision_config = {**(config.get("vision_config") or {}),
                     "architectures": ["CLIPVisionModelWithProjection"],
                     "model_type": "clip_vision_model",
                     "projection_dim": config.get("projection_dim", 512)}
    return vision_config, kept


def _mae_encoder(config, state):
    """`(config, state)` of the encoder (`vit.`) of a ViTMAEForPreTraining, as ViTMAEModel's;
    the decoder, which reconstructs masked patches in pre-training, dropped with a log line."""
    encoder = {key[len("vit."):]: value for key, value in state.items()
               if key.startswith("vit.")}
    if not encoder:
        _tensor(state, "vit.embeddings.patch_embeddings.projection.weight", "transformers")
    dropped = sorted({key.split(".")[0] for key in state if not key.startswith("vit.")})
    logger.info("Loaded the encoder (vit.) of transformers' ViTMAEForPreTraining and left out "
                "%s: keras_vit's model is the image encoder alone.", ", ".join(dropped))
    return {**config, "architectures": ["ViTMAEModel"]}, encoder


def _msn_classifier_names(state):
    """ViTMSNForImageClassification's state with its blocks under `vit.`: transformers (as the
    original checkpoints) saves them as `encoder.*` beside `vit.embeddings` and `vit.layernorm`."""
    return {"vit." + key if key.startswith("encoder.") else key: value
            for key, value in state.items()}


def _is_dinov2(spec):
    """Whether transformers' class for `spec` is DINOv2's: LayerScale, which ViT lacks (and no
    RoPE, which is DINOv3's)."""
    return spec.layer_scale_init is not None and not spec.distillation_token and not spec.rope


def _transformers_architecture(spec):
    if spec.rope:  # transformers_config refuses any but DINOv3's
        return "DINOv3ViTModel"
    family = _tower_family(spec)
    if family == "clip":
        return "CLIPVisionModelWithProjection" if spec.include_top else "CLIPVisionModel"
    if family:
        return "SiglipVisionModel"
    if spec.distillation_token:
        return "DeiTForImageClassificationWithTeacher"
    if _is_dinov2(spec):
        registers = "WithRegisters" if spec.num_register_tokens else ""
        return f"Dinov2{registers}{'ForImageClassification' if spec.include_top else 'Model'}"
    if spec.include_top:
        return "ViTForImageClassification"
    # Without a pooler, ViT's encoder is transformers' ViTMSNModel (its ViTModel's pooler would
    # start at random): the same weights and last_hidden_state, as MSN's and MAE's encoders.
    return "ViTModel" if spec.representation_size == spec.hidden_size else "ViTMSNModel"


def _transformers_prefix(spec):
    """What transformers' class for `spec` puts before its encoder's weights."""
    return TRANSFORMERS_ARCHITECTURES[_transformers_architecture(spec)]


def to_npz_arrays(state, spec, layout, config=None):
    """Their state dict (name -> array) as the `.npz` layout `checkpoint.load_npz` reads.
    Every tensor must be used and every expected one present: a LayoutError names the rest.
    `config`, the checkpoint's config.json, says how timm's Eva lays out RoPE's channels
    (None: as keras_vit does)."""
    prefix = _transformers_prefix(spec) if layout == "transformers" else ""
    state = _unpacked(state, _TIMM_PACKED if layout == "timm" else _TRANSFORMERS_PACKED)
    if layout == "timm":  # Eva's names as VisionTransformer's (none of them is one of its)
        state = _eva_names(state, spec)
    elif spec.rope:
        state = _dinov3_names(state, spec)
    dinov2 = layout == "transformers" and _is_dinov2(spec)
    if dinov2 and state.pop(prefix + "embeddings.mask_token", None) is not None:
        logger.info("Dropped DINOv2's embeddings.mask_token: it replaces masked patches in "
                    "masked image modelling, which keras_vit's model does not do.")
    transforms = _transforms(spec.num_heads)
    arrays, missing = {}, []
    for ours, theirs, kind in _pairs(spec, layout, prefix):
        if theirs not in state:
            missing.append(theirs)
            continue
        arrays[ours] = transforms[kind][0](np.asarray(state.pop(theirs)))
    if spec.pre_norm and "embedding/bias" not in arrays:  # timm's and CLIP's: no patch bias
        arrays["embedding/bias"] = np.zeros_like(arrays["embedding/kernel"][0, 0, 0])
    if layout == "transformers" and _tower_family(spec) == "clip" and spec.include_top:
        # CLIP's visual_projection: a Linear without bias
        arrays["head/bias"] = np.zeros_like(arrays["head/kernel"][0])
    if missing or state:
        problems = [f"missing ({len(missing)}): {', '.join(missing[:8])}"] if missing else []
        if state:
            problems.append(f"unexpected ({len(state)}): {', '.join(sorted(state)[:8])}")
        raise LayoutError(
            f"The {layout} weights do not fit the architecture their config describes: "
            f"{'; '.join(problems)}. Nothing was loaded. They may need an option keras_vit "
            "does not have yet.")
    if layout == "timm" and spec.rope:
        arrays = _permuted_rope(arrays, spec, *_timm_rope_layout(config))
    return _fold_class_row(arrays) if dinov2 and not spec.prefix_position_embeddings else arrays


def from_npz_arrays(arrays, spec, layout):
    """The `.npz` layout (`checkpoint.model_arrays`) as their state dict."""
    prefix = _transformers_prefix(spec) if layout == "transformers" else ""
    transforms = _transforms(spec.num_heads)
    family = _tower_family(spec) if layout == "transformers" else None
    if (layout == "timm" and spec.pre_norm) or family == "clip":
        arrays = _fold_patch_bias(arrays, spec)
    if family == "clip" and spec.include_top:  # visual_projection has no bias
        arrays = dict(arrays)
        _check_projection_bias(arrays.pop("head/bias"))
    dinov2 = layout == "transformers" and _is_dinov2(spec)
    if dinov2:
        arrays = _dinov2_position_rows(arrays, spec)
    if layout == "timm" and spec.rope:
        arrays = _permuted_rope(arrays, spec, *_EVA_WRITTEN_ROPE[spec.rope], inverse=True)
    pairs = _pairs(spec, layout, prefix)
    unwritten = sorted(set(arrays) - {ours for ours, _, _ in pairs})
    if unwritten:  # an option whose weights the layout has no place for yet
        raise LayoutError(
            f"The {layout} layout of this model has no place for {len(unwritten)} of its "
            f"weights: {', '.join(unwritten[:8])}. Nothing was written; keras_vit does not map "
            f"that option to {layout} yet.")
    state = {theirs: np.ascontiguousarray(transforms[kind][1](arrays[ours]))
             for ours, theirs, kind in pairs}
    if dinov2:  # transformers' initial value; only masked image modelling reads it
        state[prefix + "embeddings.mask_token"] = np.zeros((1, spec.hidden_size),
                                                  arrays["cls"].dtype)
    if layout == "transformers" and spec.rope:
        return _dinov3_state(state, spec, _key_bias(arrays, spec))
    if layout == "timm" and _is_eva(spec):
        state = _eva_state(state, spec, _eva_attention(arrays, spec))
    elif layout == "timm" and spec.activation == "swiglu":  # VisionTransformer's GluMlp
        state = _packed(state, _EVA_PACKED)
    return _packed(state, _TIMM_PACKED if layout == "timm" else _TRANSFORMERS_PACKED)


# --- timm's Eva and transformers' DINOv3: RoPE's channels, their names -------------------------

# timm's Eva RoPE layout (interleaved, rows and columns swapped: grid_indexing 'xy') that
# timm_config writes for each of keras_vit's kinds: its pretrained EVA-02's and DINOv3's.
_EVA_WRITTEN_ROPE = {"axial": (True, False), "axial_normalized": (False, False),
                     "mixed": (True, True)}  # RoPE-Mixed: naver's pretrained 'xy' grid
# Eva's packed SwiGLU (GluMlp's fc1: the gate's rows, then the value's), as its unpacked names.
_EVA_PACKED = ((r".*\.mlp", ".fc1.", ("fc1_g", "fc1_x")),)
_ATTENTION = "Transformer/encoderblock_{}/MultiHeadDotProductAttention_1/"


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
                key = _ATTENTION.format(index) + "rope/frequencies"
                arrays[key] = arrays[key][::-1]
        xy = False
    if not (interleaved or xy):
        return arrays
    order = _rope_channels(spec.hidden_size // spec.num_heads, interleaved, xy)
    if inverse:
        order = np.argsort(order)
    for index in range(spec.num_layers):
        for name in ("query/kernel", "query/bias", "key/kernel", "key/bias"):
            key = _ATTENTION.format(index) + name
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
        state = _unpacked(state, _EVA_PACKED)
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


def _key_bias(arrays, spec):
    """Whether any block's key projection has a non-zero bias (which RoPE does not cancel:
    it turns the patches' keys, so the bias changes their logits)."""
    return spec.qkv_bias and any(
        np.any(arrays[_ATTENTION.format(index) + "key/bias"])
        for index in range(spec.num_layers))


def _eva_attention(arrays, spec):
    """timm's Eva attention for the model's weights: EvaAttention ("eva": query and value
    biases, the key's zero), or AttentionRope ("rope": all three) for a non-zero key bias."""
    return "rope" if _key_bias(arrays, spec) else "eva"


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
        return _packed(renamed, _EVA_PACKED)
    return renamed


def _is_eva(spec):
    """Whether timm's files of a model of `spec` are its Eva's: RoPE, NormFormer's inner
    LayerNorms (scale_attn_inner, scale_mlp), which its VisionTransformer has not mapped, or
    Eva's attention pooling (`_eva_pooling`)."""
    return bool(spec.rope or spec.mlp_inner_norm or spec.attention_inner_norm
                or _eva_pooling(spec))


def _eva_pooling(spec):
    """Whether the model's attention pooling is timm's Eva's, not its VisionTransformer's
    (whose pooling has the blocks' heads and MLP width and leaves the prefix tokens out): one
    over the class and register tokens too, or of its own heads or MLP width."""
    return spec.classifier == "map" and bool(
        (spec.map_include_prefix and spec.num_prefix_tokens)
        or spec.map_num_heads not in (None, spec.num_heads)
        or spec.map_mlp_dim not in (None, spec.mlp_dim))


def _dinov3_names(state, spec):
    """DINOv3ViTModel's weights as `_dinov3_pairs` names them: `layer.N.` (a state dict taken
    in memory says `model.layer.N.`), zeros for the biases its config leaves out (key_bias
    False...); its mask token (masked image modelling only) dropped with a log line, and an
    empty `register_tokens`."""
    state = {re.sub(r"^model\.layer\.", "layer.", key): value for key, value in state.items()}
    if state.pop("embeddings.mask_token", None) is not None:
        logger.info("Dropped DINOv3's embeddings.mask_token: it replaces masked patches in "
                    "masked image modelling, which keras_vit's model does not do.")
    registers = state.get("embeddings.register_tokens")
    if registers is not None and not registers.size:
        del state["embeddings.register_tokens"]
    for _, theirs, _ in _dinov3_pairs(spec, ""):
        weight = theirs[:-len("bias")] + "weight"
        if theirs.endswith(".bias") and theirs not in state and weight in state:
            state[theirs] = np.zeros(state[weight].shape[:1], state[weight].dtype)
    return state


def _dinov3_state(state, spec, key_bias):
    """DINOv3ViTModel's files: no key biases unless `key_bias`, its mask token (zeros, as
    transformers starts it) and an empty `register_tokens` for a model of none."""
    if not key_bias:
        state = {key: value for key, value in state.items()
                 if not key.endswith("attention.k_proj.bias")}
    state["embeddings.mask_token"] = np.zeros((1, 1, spec.hidden_size), state["norm.weight"].dtype)
    if not spec.num_register_tokens:
        state["embeddings.register_tokens"] = np.zeros((1, 0, spec.hidden_size),
                                                       state["norm.weight"].dtype)
    return state


_POSITIONS = "Transformer/posembed_input/pos_embedding"


def _fold_class_row(arrays):
    """DINOv2 with registers' position embeddings (rows: class token, patches) as keras_vit's
    for the patches only, the class token's row added to the class token. Exact: that row is
    added to the class token alone, and resampling keeps prefix rows as they are."""
    arrays = dict(arrays)
    positions = arrays[_POSITIONS]
    arrays["cls"] = arrays["cls"] + positions[:, :1]
    arrays[_POSITIONS] = positions[:, 1:]
    return arrays


def _dinov2_position_rows(arrays, spec):
    """The arrays with position embeddings of one class-token row, then the patches', as
    transformers' DINOv2 has them: a zero row where the model has none, and the register
    tokens' rows (of a model with prefix rows for them) added to the register tokens."""
    arrays = dict(arrays)
    positions = arrays[_POSITIONS]
    if not spec.prefix_position_embeddings:
        class_row = np.zeros_like(positions[:, :1])
    else:
        class_row, registers = positions[:, :1], positions[:, 1:spec.num_prefix_tokens]
        positions = positions[:, spec.num_prefix_tokens:]
        if spec.num_register_tokens:
            arrays["reg/registers"] = arrays["reg/registers"] + registers
    arrays[_POSITIONS] = np.concatenate([class_row, positions], axis=1)
    return arrays


def _fold_patch_bias(arrays, spec):
    """The arrays with the patch embedding's bias added to the patches' position embeddings
    instead, for timm, whose patch embedding has no bias before a pre-norm. Exact: both are
    added to every patch token, and resampling (weights that sum to 1) keeps a constant."""
    arrays = dict(arrays)
    bias = arrays.pop("embedding/bias")
    key = "Transformer/posembed_input/pos_embedding"
    rows = spec.num_prefix_tokens if spec.prefix_position_embeddings else 0
    embeddings = arrays[key].copy()
    embeddings[:, rows:] += bias.astype(embeddings.dtype)
    arrays[key] = embeddings
    return arrays


# --- config.json -------------------------------------------------------------------------------

def _variant_for(hidden, mlp, heads, layers, patch):
    """A variant name of the table with these sizes (any patch size), else "B/16"; the spec
    overrides every table field anyway, the name only makes the model's name familiar."""
    for name in variants.VARIANT_NAMES:
        row = variants.variant_table_row(name)
        if (row["resnet_units"] is None and not row["axial"]
                and (row["hidden_size"], row["mlp_dim"], row["num_heads"],
                     row["num_layers"], row["patch_size"]) == (hidden, mlp, heads, layers, patch)):
            return name
    return "B/16"


def _spec(hidden, mlp, heads, layers, patch, variant=None, **fields):
    return ViTConfig(variant=variant or _variant_for(hidden, mlp, heads, layers, patch),
                     hidden_size=hidden,
                     mlp_dim=mlp, num_heads=heads, num_layers=layers, patch_size=patch, **fields)


def detect(config):
    """"transformers" or "timm": which library wrote this `config.json`."""
    if config.get("model_type") in _TRANSFORMERS_MODEL_TYPES:
        return "transformers"
    if "architecture" in config:
        return "timm"
    model_type = config.get("model_type") or config.get("architectures")
    raise LayoutError(
        f"config.json is neither transformers' ViT, DeiT, DINOv2, DINOv3, CLIP, SigLIP, ViT-MSN "
        f"nor ViT-MAE (model_type "
        f"{', '.join(repr(name) for name in _TRANSFORMERS_MODEL_TYPES)}) nor timm's (an "
        f"'architecture' field); it describes {model_type!r}. keras_vit reads those, and the "
        "original .npz checkpoints.")


def _transformers_architecture_of(config):
    """The transformers class a `config.json` names, or a LayoutError for one keras_vit has
    no model of."""
    default = _TRANSFORMERS_MODEL_TYPES.get(config.get("model_type"), "ViTModel")
    architecture = (config.get("architectures") or [default])[0]
    if architecture in _TRANSFORMERS_REFUSED:
        raise LayoutError(f"transformers' {architecture} has no keras_vit equivalent yet: "
                          f"{_TRANSFORMERS_REFUSED[architecture]}.")
    if architecture not in TRANSFORMERS_ARCHITECTURES:
        raise LayoutError(f"architecture {architecture!r}: keras_vit reads "
                          f"{', '.join(TRANSFORMERS_ARCHITECTURES)}.")
    return architecture


def spec_from_transformers(config, state):
    """The `ViTConfig` of transformers' ViT, DeiT, DINOv2, CLIP or SigLIP vision `config.json`
    (a whole CLIPModel's or SiglipModel's through `vision_tower` first), with the weights `state`
    saying whether a `ViTModel` has its pooler and how many classes DeiT's heads have."""
    if config.get("num_channels", 3) != 3:
        raise LayoutError(f"num_channels {config['num_channels']}: keras_vit takes RGB images.")
    architecture = _transformers_architecture_of(config)
    if architecture == "DINOv3ViTModel":  # its gated MLP's activation is SiLU
        return _spec_from_dinov3(config, state)
    act = config.get("hidden_act", "gelu")
    if act not in _TRANSFORMERS_ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads "
                          f"{', '.join(_TRANSFORMERS_ACTIVATIONS)}.")
    if architecture in _TOWER_FAMILIES:
        return _spec_from_tower(config, state, _TOWER_FAMILIES[architecture],
                                TRANSFORMERS_ARCHITECTURES[architecture])
    classifier = architecture in _TRANSFORMERS_CLASSIFIERS
    if architecture == "ViTMAEModel":
        _check_mae(config)
    distilled = architecture == "DeiTForImageClassificationWithTeacher"
    labels = config.get("id2label") or {}
    if architecture == "ViTForImageClassification" and config.get("pooler_act",
                                                                  "tanh") != "tanh":
        raise LayoutError(f"pooler_act {config['pooler_act']!r}: only tanh (the original's).")
    hidden = config.get("hidden_size", 768)
    prefix = TRANSFORMERS_ARCHITECTURES[architecture]
    patch, image_size = config.get("patch_size", 16), config.get("image_size", 224)
    kernel = _tensor(state, prefix + "embeddings.patch_embeddings.projection.weight",
                     "transformers")
    if tuple(kernel.shape[-2:]) != (patch, patch):
        raise LayoutError(
            f"config.json says patch_size {patch}, but model.safetensors holds "
            f"{kernel.shape[-2]}x{kernel.shape[-1]} patch kernels: the two files contradict each "
            "other (transformers refuses them too). Use the config.json written with these "
            "weights; to resize the patches, pass patch_size= to from_pretrained.")
    _check_grid(_tensor(state, prefix + "embeddings.position_embeddings", "transformers"),
                image_size, patch, 1 + distilled, "image_size")  # rows: cls (, distillation)
    if architecture in _DINOV2_ARCHITECTURES:
        return _spec_from_dinov2(config, state, architecture, patch, image_size)
    if distilled:  # a config of num_labels 0 has no heads: the mean of the two tokens
        head = state.get("cls_classifier.weight")
        top = dict(include_top=head is not None, distillation_token=True,
                   num_classes=1 if head is None else int(head.shape[0]))
    else:
        top = dict(include_top=classifier, num_classes=max(len(labels), 1) if classifier else 1,
                   representation_size=None if classifier or "pooler.dense.weight" not in state
                   else hidden)
    return _spec(hidden, config.get("intermediate_size", 3072),
                 config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                 patch, image_size=image_size, **top,
                 activation=_TRANSFORMERS_ACTIVATIONS[act],
                 layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
                 qkv_bias=config.get("qkv_bias", True),
                 dropout=config.get("hidden_dropout_prob", 0.0),
                 attention_dropout=config.get("attention_probs_dropout_prob", 0.0))


def _check_mae(config):
    """ViT-MAE's masking, which keras_vit leaves out with a log line: it drops a random
    `mask_ratio` of the patches in pre-training; the encoder reads them all in fine-tuning."""
    mask_ratio = config.get("mask_ratio", 0.75)  # transformers' default
    if mask_ratio:
        logger.info("Left out ViT-MAE's mask_ratio %s: keras_vit's encoder reads every patch in "
                    "order, as transformers' ViTMAEModel does with mask_ratio=0.0.", mask_ratio)


def _spec_from_dinov2(config, state, architecture, patch, image_size):
    """The `ViTConfig` of DINOv2's `config.json`: for its models no head, the final LayerNorm's
    class token (transformers' `pooler_output`) as the output; for its classifiers a head on
    that class token beside the mean of the patch tokens (classifier "token_gap"), as many
    classes as `state`'s classifier has."""
    hidden = config.get("hidden_size", 768)
    mlp, activation = int(hidden * config.get("mlp_ratio", 4)), _TRANSFORMERS_ACTIVATIONS[
        config.get("hidden_act", "gelu")]
    if config.get("use_swiglu_ffn"):  # DINOv2 giant: two thirds, up to a multiple of 8
        mlp, activation = (int(mlp * 2 / 3) + 7) // 8 * 8, "swiglu"
    registers = config.get("num_register_tokens", 0) if "WithRegisters" in architecture else 0
    top = dict(include_top=False, num_classes=1)
    if _DINOV2_ARCHITECTURES[architecture]:
        top = dict(include_top=True, classifier="token_gap",
                   num_classes=int(_tensor(state, "classifier.weight", "transformers").shape[0]))
    return _spec(hidden, mlp,
                 config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                 patch, image_size=image_size, **top,
                 activation=activation,
                 layer_norm_epsilon=config.get("layer_norm_eps", 1e-6),
                 qkv_bias=config.get("qkv_bias", True),
                 layer_scale_init=float(config.get("layerscale_value", 1.0)),
                 num_register_tokens=registers,
                 # registers have no position-embedding rows; to_npz_arrays folds the class
                 # token's into the class token
                 prefix_position_embeddings=not registers,
                 position_embedding_interpolation="bicubic",  # as transformers resamples
                 dropout=config.get("hidden_dropout_prob", 0.0),
                 attention_dropout=config.get("attention_probs_dropout_prob", 0.0))


def _spec_from_dinov3(config, state):
    """The `ViTConfig` of transformers' DINOv3ViTModel `config.json` (Siméoni et al., "DINOv3",
    2025): RoPE at the patch centres in [-1, 1] and no position embeddings, LayerScale, no
    head; the output its `pooler_output`, the final LayerNorm's class token."""
    act, gated = config.get("hidden_act", "gelu"), config.get("use_gated_mlp", False)
    if gated and act != "silu":
        raise LayoutError(f"use_gated_mlp with hidden_act {act!r}: keras_vit's gated MLP is "
                          "SwiGLU (hidden_act 'silu').")
    if not gated and act not in _TRANSFORMERS_ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads "
                          f"{', '.join(_TRANSFORMERS_ACTIVATIONS)} (and 'silu' gated).")
    patch, hidden = config.get("patch_size", 16), config.get("hidden_size", 384)
    kernel = _tensor(state, "embeddings.patch_embeddings.weight", "transformers")
    if tuple(kernel.shape[-2:]) != ((patch, patch) if isinstance(patch, int) else tuple(patch)):
        raise LayoutError(f"config.json says patch_size {patch}, but model.safetensors holds "
                          f"{kernel.shape[-2]}x{kernel.shape[-1]} patch kernels: use the "
                          "config.json written with these weights.")
    biases = [config.get(name, default) for name, default in (
        ("query_bias", True), ("key_bias", False), ("value_bias", True))]
    return _spec(hidden, config.get("intermediate_size", 1536),
                 config.get("num_attention_heads", 6), config.get("num_hidden_layers", 12),
                 kernel.shape[-1], image_size=config.get("image_size", 224), include_top=False,
                 num_classes=1, activation="swiglu" if gated else _TRANSFORMERS_ACTIVATIONS[act],
                 layer_norm_epsilon=config.get("layer_norm_eps", 1e-5),
                 qkv_bias=any(biases),  # the others' zero (`_dinov3_names`)
                 layer_scale_init=float(config.get("layerscale_value", 1.0)),
                 num_register_tokens=config.get("num_register_tokens", 0),
                 position_embedding="none", rope="axial_normalized",
                 rope_temperature=float(config.get("rope_theta", 100.0)),
                 attention_dropout=config.get("attention_dropout", 0.0))


def _dinov3_config(spec, arrays):
    """transformers' DINOv3ViTModel `config.json` for a model of RoPE at normalized
    coordinates (a LayoutError for what it cannot express); key_bias where the weights have a
    non-zero one."""
    problems = [problem for bad, problem in (
        (spec.rope != "axial_normalized", f"rope={spec.rope!r} (its RoPE is at the patch "
                                          "centres in [-1, 1]: 'axial_normalized')"),
        (spec.position_embedding != "none", f"position_embedding={spec.position_embedding!r}"),
        (spec.layer_scale_init is None, "blocks without LayerScale"),
        (spec.include_top, "head: save a model with include_top=False"),
        (spec.classifier != "token", f"classifier={spec.classifier!r} (it outputs the class "
                                     "token)"),
        (spec.final_norm != "tokens", f"final_norm={spec.final_norm!r} (it norms every token)"),
        (spec.pre_norm, "pre_norm=True"),
        (spec.distillation_token, "distillation token"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.is_hybrid or spec.axial, f"ResNet stem or axial blocks ({spec.variant})"),
        (spec.dropout, f"dropout {spec.dropout} (it drops only attention weights)"))
        if bad]
    if problems:
        raise LayoutError(f"A model with RoPE is written for transformers as its "
                          f"DINOv3ViTModel, which has no {'; no '.join(problems)}.")
    swiglu = spec.activation == "swiglu"
    height, width = spec.image_size
    return {
        "model_type": "dinov3_vit", "architectures": ["DINOv3ViTModel"],
        "hidden_size": spec.hidden_size, "intermediate_size": spec.mlp_dim,
        "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
        "patch_size": spec.patch_size, "image_size": height if height == width else [height,
                                                                                     width],
        "num_channels": 3, "hidden_act": "silu" if swiglu else _hidden_act(spec),
        "use_gated_mlp": swiglu, "layer_norm_eps": spec.layer_norm_epsilon,
        "rope_theta": spec.rope_temperature, "query_bias": spec.qkv_bias,
        "key_bias": bool(_key_bias(arrays, spec)), "value_bias": spec.qkv_bias,
        "proj_bias": True, "mlp_bias": True, "layerscale_value": spec.layer_scale_init,
        "num_register_tokens": spec.num_register_tokens, "drop_path_rate": 0.0,
        "attention_dropout": spec.attention_dropout,
    }


def _spec_from_tower(config, state, family, prefix=""):
    """The `ViTConfig` of CLIP's or SigLIP's vision `config.json`: no head, the output their
    `pooler_output` (CLIP: the class token, normed; SigLIP: the attention pooling of the normed
    tokens); CLIPVisionModelWithProjection's (its tower under `prefix`) with its
    visual_projection as the head (of projection_dim classes, a zero bias), the output its
    image_embeds."""
    clip = family == "clip"
    if not clip and not config.get("vision_use_head", True):
        raise LayoutError(
            "config.json has vision_use_head=False: this SiglipVisionModel has no pooling head "
            "and no pooler_output, and keras_vit's models always pool. Load a SigLIP with its "
            "head, or read the tokens of another with keras_vit.features().")
    patch, image_size = config.get("patch_size", 32 if clip else 16), config.get("image_size",
                                                                                  224)
    kernel = _tensor(state, prefix + "embeddings.patch_embedding.weight", "transformers")
    if tuple(kernel.shape[-2:]) != (patch, patch):
        raise LayoutError(f"config.json says patch_size {patch}, but model.safetensors holds "
                          f"{kernel.shape[-2]}x{kernel.shape[-1]} patch kernels: use the "
                          "config.json written with these weights.")
    positions = _tensor(state, prefix + "embeddings.position_embedding.weight", "transformers")
    _check_grid(positions[None], image_size, patch, int(clip), "image_size")
    act = config.get("hidden_act", "quick_gelu" if clip else "gelu_pytorch_tanh")
    if act not in _TRANSFORMERS_ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads "
                          f"{', '.join(_TRANSFORMERS_ACTIVATIONS)}.")
    hidden = config.get("hidden_size", 768)
    pooling = (dict(pre_norm=True, classifier="token", final_norm="pooled") if clip
               else dict(classifier="map", final_norm="tokens"))
    top = dict(include_top=False, num_classes=1)
    if prefix:  # CLIPVisionModelWithProjection's visual_projection
        top = dict(include_top=True, num_classes=int(
            _tensor(state, "visual_projection.weight", "transformers").shape[0]))
    return _spec(hidden, config.get("intermediate_size", 3072),
                 config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                 patch, image_size=image_size, **top, **pooling,
                 activation=_TRANSFORMERS_ACTIVATIONS[act],
                 layer_norm_epsilon=config.get("layer_norm_eps", 1e-5 if clip else 1e-6),
                 attention_dropout=config.get("attention_dropout", 0.0))


def _tower_config(spec, family, arrays=None):
    """transformers' CLIPVisionModel or SiglipVisionModel `config.json` for a model of their
    options (`_tower_family`), CLIPVisionModelWithProjection for CLIP's with a head whose bias
    (in `arrays`) is zero, or a LayoutError naming what else it has."""
    name = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}[family]
    _check_plain(spec, f"transformers' {name}")
    projection = family == "clip" and spec.include_top  # CLIPVisionModelWithProjection
    if projection and arrays is not None:
        _check_projection_bias(arrays["head/bias"])
    problems = [problem for bad, problem in (
        (spec.include_top and not projection, "head: save a model with include_top=False"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.num_register_tokens, "register tokens"),
        (not spec.qkv_bias, "query, key and value without bias (qkv_bias=False)"),
        (not spec.prefix_position_embeddings, "class token without a position embedding "
                                              "(prefix_position_embeddings=False)"),
        (spec.dropout, f"dropout {spec.dropout} (it drops only attention weights)"),
        (spec.image_size[0] != spec.image_size[1], f"non-square image_size {spec.image_size} "
                                                   "(its position embeddings are a square "
                                                   "grid)")) if bad]
    if problems:
        raise LayoutError(f"A model with {name[:-len('VisionModel')]}'s options is written as "
                          f"transformers' {name}, which has no {'; no '.join(problems)}.")
    config = {"model_type": f"{family}_vision_model",
              "architectures": [name + "WithProjection" if projection else name],
              "hidden_size": spec.hidden_size, "intermediate_size": spec.mlp_dim,
              "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
              "patch_size": spec.patch_size, "image_size": spec.image_size[0], "num_channels": 3,
              "hidden_act": _hidden_act(spec), "layer_norm_eps": spec.layer_norm_epsilon,
              "attention_dropout": spec.attention_dropout}
    if family == "siglip":
        config["vision_use_head"] = True
    if projection:
        config["projection_dim"] = spec.num_classes
    return config


def _check_projection_bias(bias):
    """A LayoutError unless the head's `bias` is zero: CLIP's visual_projection has none."""
    bias = np.asarray(bias)
    if np.any(bias):
        raise LayoutError(
            "A model with CLIP's options and a head is written as transformers' "
            "CLIPVisionModelWithProjection, whose visual_projection has no bias, but this "
            f"head's bias is not zero (largest {float(np.abs(bias).max()):.3g}); nothing was "
            "written. Zero the bias, or save the model without its head (include_top=False).")


def _hidden_act(spec):
    return {"gelu_tanh": "gelu_pytorch_tanh"}.get(spec.activation, spec.activation)


def _dinov2_config(spec):
    """transformers' DINOv2 `config.json` for a model with LayerScale: its Dinov2Model (or with
    registers Dinov2WithRegistersModel) without a head, its Dinov2ForImageClassification (or
    Dinov2WithRegistersForImageClassification) with a head on classifier "token_gap" (a
    LayoutError for what they cannot express)."""
    _check_plain(spec, "transformers' DINOv2", swiglu=True)
    swiglu = spec.activation == "swiglu"
    ratio = _dinov2_mlp_ratio(spec)
    pooling = "token_gap" if spec.include_top else "token"
    problems = [problem for bad, problem in (
        (spec.classifier != pooling,
         f"{'head' if spec.include_top else 'output'} on classifier={spec.classifier!r} (its "
         "Dinov2Model outputs the class token, classifier 'token' without a head; its "
         "Dinov2ForImageClassification's head reads the class token beside the patches' mean, "
         "classifier 'token_gap')"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.pre_norm, "pre_norm=True"),
        (spec.final_norm != "tokens", f"final_norm={spec.final_norm!r} (it norms every "
                                      "token)"),
        (spec.image_size[0] != spec.image_size[1], f"non-square image_size {spec.image_size} (its "
                                                   "position embeddings are a square grid)"),
        (ratio is None, f"mlp_dim {spec.mlp_dim} (its mlp_ratio, an int, makes a multiple of "
                        "hidden_size, two thirds of one up to a multiple of 8 with SwiGLU)"))
        if bad]
    if problems:
        raise LayoutError(f"A model with LayerScale is written as transformers' Dinov2Model "
                          f"(with a head, Dinov2ForImageClassification), which has no "
                          f"{'; no '.join(problems)}.")
    registers = spec.num_register_tokens
    config = {
        "model_type": "dinov2_with_registers" if registers else "dinov2",
        "architectures": [_transformers_architecture(spec)],
        "hidden_size": spec.hidden_size, "mlp_ratio": ratio,
        "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
        "patch_size": spec.patch_size, "image_size": spec.image_size[0], "num_channels": 3,
        # (SwiGLU's gate is SiLU whatever hidden_act says)
        "qkv_bias": spec.qkv_bias, "hidden_act": "gelu" if swiglu else _hidden_act(spec),
        "layer_norm_eps": spec.layer_norm_epsilon, "layerscale_value": spec.layer_scale_init,
        "use_swiglu_ffn": swiglu, "drop_path_rate": 0.0, "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": spec.attention_dropout,
    }
    if registers:
        config["num_register_tokens"] = registers
    else:
        config["use_mask_token"] = True
    if spec.include_top:
        labels = {str(index): f"LABEL_{index}" for index in range(spec.num_classes)}
        config["id2label"] = labels
        config["label2id"] = {name: int(index) for index, name in labels.items()}
    return config


def _dinov2_mlp_ratio(spec):
    """The int mlp_ratio of DINOv2's config for the model's mlp_dim, or None."""
    for ratio in range(1, 17):
        mlp = spec.hidden_size * ratio
        if spec.activation == "swiglu":
            mlp = (int(mlp * 2 / 3) + 7) // 8 * 8
        if mlp == spec.mlp_dim:
            return ratio
    return None


def transformers_config(spec, arrays=None):
    """transformers' `config.json` for a model of `spec`: its ViT, or its DeiT with a teacher
    for a model with DeiT's distillation token, its DINOv2 for one with LayerScale, its
    CLIPVisionModel or SiglipVisionModel for one of their options, its DINOv3ViTModel for one
    with RoPE (whose key bias, in the weights `arrays`, says its key_bias; a LayoutError for
    what they cannot express)."""
    timms = [problem for bad, problem in (
        (spec.residual_post_norm, "post-norm blocks (residual_post_norm, timm's ResPostBlock)"),
        (_eva_pooling(spec), "an attention pooling of its own heads or MLP width, or over the "
                             "class and register tokens (map_num_heads, map_mlp_dim, "
                             "map_include_prefix: timm's Eva)")) if bad]
    if timms:
        raise LayoutError(f"transformers' ViT classes have no {'; no '.join(timms)}: save this "
                          "model with format='timm'.")
    if spec.rope:
        return _dinov3_config(spec, arrays)
    if _is_dinov2(spec):
        return _dinov2_config(spec)
    if _tower_family(spec):
        return _tower_config(spec, _tower_family(spec), arrays)
    family = "DeiT" if spec.distillation_token else "ViT"
    _check_plain(spec, f"transformers' {family}")
    later = [f"{name}={getattr(spec, name)!r}" for name in _LATER_OPTIONS
             if getattr(spec, name) != DEFAULTS[name]]
    if later:
        raise LayoutError(f"transformers' {family} has no {', '.join(later)} (options of later "
                          "ViTs); save this model for timm (format='timm').")
    if spec.classifier != "token":
        raise LayoutError("transformers' ViT classifies from the class token; a model pooled "
                          f"otherwise (classifier={spec.classifier!r}) has no equivalent there.")
    if spec.include_top and spec.representation_size is not None:
        raise LayoutError("transformers' ViTForImageClassification has no pre_logits layer "
                          "before its head; save a model without representation_size.")
    if (not spec.include_top and not spec.distillation_token
            and spec.representation_size not in (None, spec.hidden_size)):
        raise LayoutError(
            "transformers' ViTModel's pooler (the original's pre_logits) is a tanh Dense of "
            f"the class token's width, {spec.hidden_size}, not {spec.representation_size}: "
            "save a model with representation_size=hidden_size, or None (written as its "
            "pooler-less ViTMSNModel), or with a head.")
    # DeiT without a head is its num_labels 0 (the heads are identities), which must be said.
    classes = spec.num_classes if spec.include_top else 0
    labels = {str(index): f"LABEL_{index}" for index in range(classes)}
    height, width = spec.image_size
    architecture = _transformers_architecture(spec)
    config = {
        "model_type": "vit_msn" if architecture == "ViTMSNModel" else family.lower(),
        "architectures": [architecture],
        "hidden_size": spec.hidden_size, "intermediate_size": spec.mlp_dim,
        "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
        "patch_size": spec.patch_size, "image_size": height if height == width else [height,
                                                                                     width],
        "num_channels": 3, "qkv_bias": spec.qkv_bias,
        "hidden_act": _hidden_act(spec),
        "layer_norm_eps": spec.layer_norm_epsilon,
        "hidden_dropout_prob": spec.dropout, "attention_probs_dropout_prob":
            spec.attention_dropout,
        "pooler_act": "tanh", "pooler_output_size": spec.hidden_size,
    }
    if spec.include_top or spec.distillation_token:
        config["id2label"] = labels
        config["label2id"] = {name: int(index) for index, name in labels.items()}
    return config


@functools.cache
def timm_architectures():
    """timm's `vit_*`, `deit*` and `eva02*` architectures: name -> {"class", "args"}, the
    arguments each entry point passes beyond `VisionTransformer`'s defaults (for Eva's, marked
    `"defaults": "Eva"`, beyond `Eva`'s) (written by
    benchmarks/timm_coverage.py --write_table from timm itself). A checkpoint's `config.json`
    names its architecture but does not repeat these."""
    path = os.path.join(os.path.dirname(__file__), "timm_architectures.json")
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
    timm_numerics = _TIMM_RESNET_EPSILONS
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
    mlp = _tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0] // (2 if glu else 1)
    post_norm = args["block_fn"] == _RES_POST_BLOCK  # its init_values only start its norms
    prefix_tokens = int(bool(args["class_token"])) + int(distilled) + args["reg_tokens"]
    _check_grid(_tensor(state, "pos_embed", "timm"), args["img_size"], pixels,
                0 if args["no_embed_class"] else prefix_tokens, "img_size")
    hybrid_fields = {} if hybrid is None else dict(variant=_TIMM_HYBRIDS[hybrid],
                                                    resnet_numerics="timm")
    gap = args["global_pool"] == "avg"
    fc_norm = gap if args["fc_norm"] is None else args["fc_norm"]  # timm's rule
    final_norm = "none" if not args["final_norm"] else "pooled" if fc_norm else "tokens"
    num_classes = config.get("num_classes", args["num_classes"])
    return _spec(hidden, mlp, args["num_heads"], layers, patch, **hybrid_fields,
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
                 pre_norm=args["pre_norm"], final_norm=final_norm, distillation_token=distilled,
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
    kernel = _tensor(state, "patch_embed.proj.weight", "timm")
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
    mlp = _tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0]
    relative = _tensor(state, "blocks.0.attn.rel_pos.mlp.fc1.weight", "timm").shape[0]
    num_classes = config.get("num_classes", args["num_classes"])
    post_norm = args["block_fn"] == "<ResPostRelPosBlock>"
    return _spec(hidden, mlp, args["num_heads"], layers, patch,
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
        mlp = _tensor(state, "blocks.0.mlp.fc1.weight", "timm").shape[0] // (2 if swiglu else 1)
    prefix_tokens = int(bool(args["class_token"])) + args["num_reg_tokens"]
    if args["use_abs_pos_emb"]:
        _check_grid(_tensor(state, "pos_embed", "timm"), args["img_size"], patch,
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
    return _spec(hidden, mlp, args["num_heads"], layers, patch,
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


def _tensor(state, name, layout):
    """`state[name]`, or a LayoutError saying that the weights are not in the layout of their
    config.json (`layout`), naming a tensor they do hold."""
    if name in state:
        return state[name]
    found = next((key for key in sorted(state) if "patch" in key), None) or min(state, default="")
    raise LayoutError(
        f"config.json is {layout}'s, but model.safetensors has no {name!r} (it holds "
        f"{found!r}, ...): the two files come from different libraries or models. Put the "
        "config.json written with these weights beside them.")


def _check_grid(position_embeddings, image_size, patch, prefix_tokens, field):
    """A LayoutError unless `position_embeddings` [1, tokens, D] hold `prefix_tokens` and one
    per patch of `image_size` (an int or [height, width]) in patches of `patch` pixels."""
    sides = [image_size] * 2 if isinstance(image_size, int) else list(image_size)
    rows, columns = (side // patch for side in sides)
    held = position_embeddings.shape[1] - prefix_tokens
    if held != rows * columns:
        side = math.isqrt(max(held, 0))
        grid = f"{side}x{side}" if side * side == held else f"{held}"
        raise LayoutError(
            f"config.json says {field} {image_size} ({rows}x{columns} patches of {patch} "
            f"pixels), but model.safetensors holds position embeddings for {grid} patches: the "
            "two files contradict each other. Use the config.json written with these weights; "
            "to resample the position embeddings, pass image_size= to from_pretrained.")


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
    _check_plain(spec, f"timm's {timm_class}", swiglu=True, hybrid=spec.is_hybrid)
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


def _check_plain(spec, target, swiglu=False, hybrid=False):
    if spec.rope:
        raise LayoutError(f"{target} has no rotary position embeddings (rope={spec.rope!r}); "
                          "save the model for timm (its Eva), or with rope 'axial_normalized' "
                          "for transformers (its DINOv3ViTModel).")
    if ((spec.is_hybrid and not hybrid) or spec.axial or spec.position_embedding != "learned"
            or spec.position_embedding_placement != "stem"):
        raise LayoutError(
            f"{target} has learned 1-D position embeddings added once, and no ResNet stem or "
            f"axial blocks; this model ({spec.variant}, position_embedding="
            f"{spec.position_embedding!r}, placement {spec.position_embedding_placement!r}) "
            "has no equivalent there.")
    if spec.activation == "swiglu" and not swiglu:  # DINOv2's alone has it mapped yet
        raise LayoutError(f"{target} is not written with SwiGLU MLPs (activation='swiglu') by "
                          "keras_vit yet (DINOv2's is: a model with LayerScale and no head); "
                          "save the model with keras_vit.checkpoint.save_npz or "
                          "model.save(...keras).")

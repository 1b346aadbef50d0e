"""The ViT weight layouts of Hugging Face transformers' vision models, as maps to and from the
original `.npz` layout (`keras_vit.checkpoint`), and their `config.json` to and from a
`ViTConfig`. Pure NumPy.

`ViTModel` / `ViTForImageClassification` files keep separate query, key and value Linear layers
under `vit.encoder.layer.N.attention.attention.*` (no `vit.` prefix for a saved `ViTModel`,
which may add `pooler.dense`, the original's tanh `pre_logits`). Linear weights are (out, in),
the patch convolution (D, C, p, p).

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

import logging
import re

import numpy as np

from keras_vit.spec import DEFAULTS
from keras_vit.torch_layouts import common
from keras_vit.torch_layouts.common import LayoutError, check_grid, sized_spec, tensor

logger = logging.getLogger(__name__)

# transformers' architectures keras_vit reads -> the prefix of their encoder's weights.
ARCHITECTURES = {"ViTForImageClassification": "vit.", "ViTModel": "",
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
MODEL_TYPES = {"vit": "ViTModel", "deit": "DeiTModel", "dinov2": "Dinov2Model",
               "dinov2_with_registers": "Dinov2WithRegistersModel",
               "clip_vision_model": "CLIPVisionModel",
               "siglip_vision_model": "SiglipVisionModel",
               "clip": "CLIPModel", "siglip": "SiglipModel",
               "vit_msn": "ViTMSNModel", "vit_mae": "ViTMAEModel",
               "dinov3_vit": "DINOv3ViTModel"}
# transformers' classes that classify from the final LayerNorm's class token, as keras_vit.
_CLASSIFIERS = ("ViTForImageClassification", "ViTMSNForImageClassification")
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
_REFUSED = {
    "DeiTForImageClassification": "it classifies from the class token alone while its "
                                  "distillation token still attends, where keras_vit's distilled "
                                  "models average a head on each token",
    "DeiTModel": "its pooler reads the class token alone, where keras_vit's distilled models "
                 "without a head average the class and distillation tokens",
}
# transformers' hidden_act -> the spec's activation (the tanh GELU is the original's).
_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "quick_gelu": "quick_gelu"}
# Spec options transformers' ViT does not have (timm's VisionTransformer has them all).
_LATER_OPTIONS = ("layer_scale_init", "num_register_tokens", "prefix_position_embeddings",
                  "pre_norm", "final_norm")
# Tensors transformers keeps packed (`common.unpacked`).
_PACKED = ((r".*head\.attention\.in_proj", "_", ("q", "k", "v")),  # SigLIP's pool
           (r".*\.mlp\.weights_in", ".", ("gate", "up")))  # DINOv2's SwiGLU


def weight_pairs(spec, prefix):
    """Every (`.npz` key, their key, kind) of a model of `spec` in transformers' class for it
    (`_transformers_architecture`), whose encoder's weights are under `prefix`."""
    family = _tower_family(spec)
    if family:
        return _tower_pairs(spec, family, prefix)
    if spec.rope:
        return _dinov3_pairs(spec, prefix)
    stem = [("embedding/kernel", "embeddings.patch_embeddings.projection.weight", "conv"),
            ("embedding/bias", "embeddings.patch_embeddings.projection.bias", "copy"),
            ("cls", "embeddings.cls_token", "copy"),
            (common.POSITIONS, "embeddings.position_embeddings", "copy")]
    if spec.distillation_token:
        stem.append(("dist", "embeddings.distillation_token", "copy"))
    if spec.num_register_tokens:
        stem.append(("reg/registers", "embeddings.register_tokens", "copy"))
    names = {"query": "attention.attention.query", "key": "attention.attention.key",
             "value": "attention.attention.value", "out": "attention.output.dense",
             "norm_0": "layernorm_before", "norm_2": "layernorm_after",
             "fc_0": "intermediate.dense", "fc_1": "output.dense"}
    if _is_dinov2(spec):
        names.update(norm_0="norm1", norm_2="norm2", fc_0="mlp.fc1", fc_1="mlp.fc2",
                     scale_0="layer_scale1.lambda1", scale_1="layer_scale2.lambda1")
        if spec.activation == "swiglu":  # `weights_in` unpacked (`_PACKED`)
            names.update(fc_0="mlp.weights_in.up", gate="mlp.weights_in.gate",
                         fc_1="mlp.weights_out")
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    pairs += common.encoder_pairs(spec, prefix + "encoder.layer.{}.", names)
    if spec.final_norm == "tokens":
        pairs += common.norm_pairs("Transformer/encoder_norm", prefix + "layernorm")
    if spec.representation_size is not None:
        pairs += common.dense_pairs("pre_logits", "pooler.dense")
    if spec.include_top:  # the heads are outside the encoder: no prefix
        heads = ([("head", "cls_classifier"), ("head_dist", "distillation_classifier")]
                 if spec.distillation_token else [("head", "classifier")])
        for ours, theirs in heads:
            pairs += common.dense_pairs(ours, theirs)
    return pairs


def to_npz_arrays(state, spec):
    """transformers' state dict (name -> array) of a model of `spec` as the `.npz` layout
    `checkpoint.load_npz` reads (`common.to_arrays`)."""
    prefix = _transformers_prefix(spec)
    state = common.unpacked(state, _PACKED)
    if spec.rope:
        state = _dinov3_names(state, spec)
    dinov2 = _is_dinov2(spec)
    if dinov2 and state.pop(prefix + "embeddings.mask_token", None) is not None:
        logger.info("Dropped DINOv2's embeddings.mask_token: it replaces masked patches in "
                    "masked image modelling, which keras_vit's model does not do.")
    arrays = common.to_arrays(state, weight_pairs(spec, prefix), spec, "transformers")
    if _tower_family(spec) == "clip" and spec.include_top:
        # CLIP's visual_projection: a Linear without bias
        arrays["head/bias"] = np.zeros_like(arrays["head/kernel"][0])
    return _fold_class_row(arrays) if dinov2 and not spec.prefix_position_embeddings else arrays


def from_npz_arrays(arrays, spec):
    """The `.npz` layout (`checkpoint.model_arrays`) as transformers' state dict."""
    prefix = _transformers_prefix(spec)
    if _tower_family(spec) == "clip":  # no patch bias, and visual_projection has no bias
        arrays = common.fold_patch_bias(arrays, spec)
        if spec.include_top:
            _check_projection_bias(arrays.pop("head/bias"))
    dinov2 = _is_dinov2(spec)
    if dinov2:
        arrays = _dinov2_position_rows(arrays, spec)
    state = common.from_arrays(arrays, weight_pairs(spec, prefix), spec, "transformers")
    if dinov2:  # transformers' initial value; only masked image modelling reads it
        state[prefix + "embeddings.mask_token"] = np.zeros((1, spec.hidden_size),
                                                           arrays["cls"].dtype)
    if spec.rope:
        return _dinov3_state(state, spec, common.key_bias(arrays, spec))
    return common.packed(state, _PACKED)


def _dinov3_pairs(spec, prefix):
    """transformers' DINOv3ViTModel: no position embeddings (RoPE), LayerScale, `layer.N.` as
    its files have it (in memory `model.layer.N.`: `_dinov3_names`)."""
    stem = [("embedding/kernel", "embeddings.patch_embeddings.weight", "conv"),
            ("embedding/bias", "embeddings.patch_embeddings.bias", "copy"),
            ("cls", "embeddings.cls_token", "copy")]
    if spec.num_register_tokens:
        stem.append(("reg/registers", "embeddings.register_tokens", "copy"))
    names = {"query": "attention.q_proj", "key": "attention.k_proj",
             "value": "attention.v_proj", "out": "attention.o_proj", "norm_0": "norm1",
             "norm_2": "norm2", "fc_0": "mlp.up_proj", "fc_1": "mlp.down_proj",
             "gate": "mlp.gate_proj", "scale_0": "layer_scale1.lambda1",
             "scale_1": "layer_scale2.lambda1"}
    return ([(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
            + common.encoder_pairs(spec, prefix + "layer.{}.", names)
            + common.norm_pairs("Transformer/encoder_norm", prefix + "norm"))


def _tower_pairs(spec, family, prefix):
    """CLIP's and SigLIP's vision towers (`_tower_family`)."""
    stem = [("embedding/kernel", "embeddings.patch_embedding.weight", "conv"),
            (common.POSITIONS, "embeddings.position_embedding.weight", "rows")]
    if family == "clip":  # no patch bias: common.to_arrays adds a zero one
        stem += [("cls", "embeddings.class_embedding", "vector_token"),
                 *common.norm_pairs("pre_norm", "pre_layrnorm")]
    else:
        stem.append(("embedding/bias", "embeddings.patch_embedding.bias", "copy"))
    names = {"query": "self_attn.q_proj", "key": "self_attn.k_proj", "value": "self_attn.v_proj",
             "out": "self_attn.out_proj", "norm_0": "layer_norm1", "norm_2": "layer_norm2",
             "fc_0": "mlp.fc1", "fc_1": "mlp.fc2"}
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    pairs += common.encoder_pairs(spec, prefix + "encoder.layers.{}.", names)
    pairs += common.norm_pairs("fc_norm" if family == "clip" else "Transformer/encoder_norm",
                               prefix + "post_layernorm")
    if family == "clip" and spec.include_top:  # outside vision_model.; no bias (a zero one)
        pairs.append(("head/kernel", "visual_projection.weight", "linear"))
    if family == "siglip":  # the packed in_proj unpacked (`_PACKED`)
        pairs += common.attention_pool_pairs(
            prefix + "head.", "probe", ("attention.in_proj.q", "attention.in_proj.k",
                                        "attention.in_proj.v", "attention.out_proj"), "layernorm")
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
        tensor(state, "vision_model.embeddings.patch_embedding.weight", "transformers")
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
    tensor(state, "visual_projection.weight", "transformers")
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
        tensor(state, "vit.embeddings.patch_embeddings.projection.weight", "transformers")
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
    return ARCHITECTURES[_transformers_architecture(spec)]


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


def _fold_class_row(arrays):
    """DINOv2 with registers' position embeddings (rows: class token, patches) as keras_vit's
    for the patches only, the class token's row added to the class token. Exact: that row is
    added to the class token alone, and resampling keeps prefix rows as they are."""
    arrays = dict(arrays)
    positions = arrays[common.POSITIONS]
    arrays["cls"] = arrays["cls"] + positions[:, :1]
    arrays[common.POSITIONS] = positions[:, 1:]
    return arrays


def _dinov2_position_rows(arrays, spec):
    """The arrays with position embeddings of one class-token row, then the patches', as
    transformers' DINOv2 has them: a zero row where the model has none, and the register
    tokens' rows (of a model with prefix rows for them) added to the register tokens."""
    arrays = dict(arrays)
    positions = arrays[common.POSITIONS]
    if not spec.prefix_position_embeddings:
        class_row = np.zeros_like(positions[:, :1])
    else:
        class_row, registers = positions[:, :1], positions[:, 1:spec.num_prefix_tokens]
        positions = positions[:, spec.num_prefix_tokens:]
        if spec.num_register_tokens:
            arrays["reg/registers"] = arrays["reg/registers"] + registers
    arrays[common.POSITIONS] = np.concatenate([class_row, positions], axis=1)
    return arrays


def _transformers_architecture_of(config):
    """The transformers class a `config.json` names, or a LayoutError for one keras_vit has
    no model of."""
    default = MODEL_TYPES.get(config.get("model_type"), "ViTModel")
    architecture = (config.get("architectures") or [default])[0]
    if architecture in _REFUSED:
        raise LayoutError(f"transformers' {architecture} has no keras_vit equivalent yet: "
                          f"{_REFUSED[architecture]}.")
    if architecture not in ARCHITECTURES:
        raise LayoutError(f"architecture {architecture!r}: keras_vit reads "
                          f"{', '.join(ARCHITECTURES)}.")
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
    if act not in _ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads "
                          f"{', '.join(_ACTIVATIONS)}.")
    if architecture in _TOWER_FAMILIES:
        return _spec_from_tower(config, state, _TOWER_FAMILIES[architecture],
                                ARCHITECTURES[architecture])
    classifier = architecture in _CLASSIFIERS
    if architecture == "ViTMAEModel":
        _check_mae(config)
    distilled = architecture == "DeiTForImageClassificationWithTeacher"
    labels = config.get("id2label") or {}
    if architecture == "ViTForImageClassification" and config.get("pooler_act",
                                                                  "tanh") != "tanh":
        raise LayoutError(f"pooler_act {config['pooler_act']!r}: only tanh (the original's).")
    hidden = config.get("hidden_size", 768)
    prefix = ARCHITECTURES[architecture]
    patch, image_size = config.get("patch_size", 16), config.get("image_size", 224)
    kernel = tensor(state, prefix + "embeddings.patch_embeddings.projection.weight",
                    "transformers")
    if tuple(kernel.shape[-2:]) != (patch, patch):
        raise LayoutError(
            f"config.json says patch_size {patch}, but model.safetensors holds "
            f"{kernel.shape[-2]}x{kernel.shape[-1]} patch kernels: the two files contradict each "
            "other (transformers refuses them too). Use the config.json written with these "
            "weights; to resize the patches, pass patch_size= to from_pretrained.")
    check_grid(tensor(state, prefix + "embeddings.position_embeddings", "transformers"),
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
    return sized_spec(hidden, config.get("intermediate_size", 3072),
                      config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                      patch, image_size=image_size, **top,
                      activation=_ACTIVATIONS[act],
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
    mlp, activation = int(hidden * config.get("mlp_ratio", 4)), _ACTIVATIONS[
        config.get("hidden_act", "gelu")]
    if config.get("use_swiglu_ffn"):  # DINOv2 giant: two thirds, up to a multiple of 8
        mlp, activation = (int(mlp * 2 / 3) + 7) // 8 * 8, "swiglu"
    registers = config.get("num_register_tokens", 0) if "WithRegisters" in architecture else 0
    top = dict(include_top=False, num_classes=1)
    if _DINOV2_ARCHITECTURES[architecture]:
        top = dict(include_top=True, classifier="token_gap",
                   num_classes=int(tensor(state, "classifier.weight", "transformers").shape[0]))
    return sized_spec(hidden, mlp,
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
    if not gated and act not in _ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads "
                          f"{', '.join(_ACTIVATIONS)} (and 'silu' gated).")
    patch, hidden = config.get("patch_size", 16), config.get("hidden_size", 384)
    kernel = tensor(state, "embeddings.patch_embeddings.weight", "transformers")
    if tuple(kernel.shape[-2:]) != ((patch, patch) if isinstance(patch, int) else tuple(patch)):
        raise LayoutError(f"config.json says patch_size {patch}, but model.safetensors holds "
                          f"{kernel.shape[-2]}x{kernel.shape[-1]} patch kernels: use the "
                          "config.json written with these weights.")
    biases = [config.get(name, default) for name, default in (
        ("query_bias", True), ("key_bias", False), ("value_bias", True))]
    return sized_spec(hidden, config.get("intermediate_size", 1536),
                      config.get("num_attention_heads", 6), config.get("num_hidden_layers", 12),
                      kernel.shape[-1], image_size=config.get("image_size", 224),
                      include_top=False, num_classes=1,
                      activation="swiglu" if gated else _ACTIVATIONS[act],
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
    lacking = (
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
    common.check_expressible(
        "A model with RoPE is written for transformers as its DINOv3ViTModel", lacking)
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
        "key_bias": bool(common.key_bias(arrays, spec)), "value_bias": spec.qkv_bias,
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
    kernel = tensor(state, prefix + "embeddings.patch_embedding.weight", "transformers")
    if tuple(kernel.shape[-2:]) != (patch, patch):
        raise LayoutError(f"config.json says patch_size {patch}, but model.safetensors holds "
                          f"{kernel.shape[-2]}x{kernel.shape[-1]} patch kernels: use the "
                          "config.json written with these weights.")
    positions = tensor(state, prefix + "embeddings.position_embedding.weight", "transformers")
    check_grid(positions[None], image_size, patch, int(clip), "image_size")
    act = config.get("hidden_act", "quick_gelu" if clip else "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads "
                          f"{', '.join(_ACTIVATIONS)}.")
    hidden = config.get("hidden_size", 768)
    pooling = (dict(pre_norm=True, classifier="token", final_norm="pooled") if clip
               else dict(classifier="map", final_norm="tokens"))
    top = dict(include_top=False, num_classes=1)
    if prefix:  # CLIPVisionModelWithProjection's visual_projection
        top = dict(include_top=True, num_classes=int(
            tensor(state, "visual_projection.weight", "transformers").shape[0]))
    return sized_spec(hidden, config.get("intermediate_size", 3072),
                      config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                      patch, image_size=image_size, **top, **pooling,
                      activation=_ACTIVATIONS[act],
                      layer_norm_epsilon=config.get("layer_norm_eps", 1e-5 if clip else 1e-6),
                      attention_dropout=config.get("attention_dropout", 0.0))


def _tower_config(spec, family, arrays=None):
    """transformers' CLIPVisionModel or SiglipVisionModel `config.json` for a model of their
    options (`_tower_family`), CLIPVisionModelWithProjection for CLIP's with a head whose bias
    (in `arrays`) is zero, or a LayoutError naming what else it has."""
    name = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}[family]
    common.check_plain(spec, f"transformers' {name}")
    projection = family == "clip" and spec.include_top  # CLIPVisionModelWithProjection
    if projection and arrays is not None:
        _check_projection_bias(arrays["head/bias"])
    lacking = (
        (spec.include_top and not projection, "head: save a model with include_top=False"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.num_register_tokens, "register tokens"),
        (not spec.qkv_bias, "query, key and value without bias (qkv_bias=False)"),
        (not spec.prefix_position_embeddings, "class token without a position embedding "
                                              "(prefix_position_embeddings=False)"),
        (spec.dropout, f"dropout {spec.dropout} (it drops only attention weights)"),
        (spec.image_size[0] != spec.image_size[1], f"non-square image_size {spec.image_size} "
                                                   "(its position embeddings are a square "
                                                   "grid)"))
    common.check_expressible(
        f"A model with {name[:-len('VisionModel')]}'s options is written as transformers' "
        f"{name}", lacking)
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
    common.check_plain(spec, "transformers' DINOv2", swiglu=True)
    swiglu = spec.activation == "swiglu"
    ratio = _dinov2_mlp_ratio(spec)
    pooling = "token_gap" if spec.include_top else "token"
    lacking = (
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
    common.check_expressible(
        "A model with LayerScale is written as transformers' Dinov2Model (with a head, "
        "Dinov2ForImageClassification)", lacking)
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
        (common.eva_pooling(spec), "an attention pooling of its own heads or MLP width, or "
                                   "over the class and register tokens (map_num_heads, "
                                   "map_mlp_dim, map_include_prefix: timm's Eva)")) if bad]
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
    common.check_plain(spec, f"transformers' {family}")
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

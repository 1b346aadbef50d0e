"""transformers' DINOv2: `Dinov2Model`, `Dinov2WithRegistersModel` and their classifiers.

DINOv2 (Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision", 2023) and
its registers form (Darcet et al., "Vision Transformers Need Registers", 2024) are ViT's
attention names, with LayerScale (`layer_scale1.lambda1`), `norm1`, `norm2`, `mlp.fc1`,
`mlp.fc2` (giant's SwiGLU: a packed `mlp.weights_in`, `mlp.weights_out`), a `mask_token` used
only for masked image modelling, and for registers `embeddings.register_tokens` after the
class token, which have no position-embedding rows (the class token has one). Their
`Dinov2ForImageClassification` / `Dinov2WithRegistersForImageClassification` hold that model
under `dinov2.` / `dinov2_with_registers.` and a `classifier` on the final LayerNorm's class
token concatenated with the mean of the patch tokens, registers left out (keras_vit's
classifier "token_gap").
"""

import logging

import numpy as np

from keras_vit.weights.torch_layouts import common, transformers_common
from keras_vit.weights.torch_layouts.common import sized_spec, tensor
from keras_vit.weights.torch_layouts.family import Family

logger = logging.getLogger(__name__)

# Its classes -> the prefix of their encoder's weights.
CLASSES = {"Dinov2Model": "", "Dinov2WithRegistersModel": "",
           "Dinov2ForImageClassification": "dinov2.",
           "Dinov2WithRegistersForImageClassification": "dinov2_with_registers."}
# Its SwiGLU's `weights_in` (`common.unpacked`).
_PACKED = ((r".*\.mlp\.weights_in", ".", ("gate", "up")),)


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of DINOv2's config.json: for its models no head, the final LayerNorm's
    class token (transformers' `pooler_output`) as the output; for its classifiers a head on
    that class token beside the mean of the patch tokens (classifier "token_gap"), as many
    classes as `state`'s classifier has."""
    transformers_common.check_activation(config.get("hidden_act", "gelu"))
    patch, image_size = transformers_common.vit_patches(config, state, CLASSES[architecture], 1)
    hidden = config.get("hidden_size", 768)
    mlp, activation = int(hidden * config.get("mlp_ratio", 4)), transformers_common.ACTIVATIONS[
        config.get("hidden_act", "gelu")]
    if config.get("use_swiglu_ffn"):  # DINOv2 giant: two thirds, up to a multiple of 8
        mlp, activation = (int(mlp * 2 / 3) + 7) // 8 * 8, "swiglu"
    registers = config.get("num_register_tokens", 0) if "WithRegisters" in architecture else 0
    top = dict(include_top=False, num_classes=1)
    if architecture.endswith("ForImageClassification"):
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


def writes(spec):
    """Whether transformers' class for `spec` is DINOv2's: LayerScale, which ViT lacks (and no
    RoPE, which is DINOv3's)."""
    return spec.layer_scale_init is not None and not spec.distillation_token and not spec.rope


def _architecture(spec):
    registers = "WithRegisters" if spec.num_register_tokens else ""
    return f"Dinov2{registers}{'ForImageClassification' if spec.include_top else 'Model'}"


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' DINOv2 `config.json` for a model with LayerScale: its Dinov2Model (or with
    registers Dinov2WithRegistersModel) without a head, its Dinov2ForImageClassification (or
    Dinov2WithRegistersForImageClassification) with a head on classifier "token_gap" (a
    LayoutError for what they cannot express)."""
    common.check_plain(spec, "transformers' DINOv2", swiglu=True)
    swiglu = spec.activation == "swiglu"
    ratio = _mlp_ratio(spec)
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
        "architectures": [_architecture(spec)],
        "hidden_size": spec.hidden_size, "mlp_ratio": ratio,
        "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
        "patch_size": spec.patch_size, "image_size": spec.image_size[0], "num_channels": 3,
        # (SwiGLU's gate is SiLU whatever hidden_act says)
        "qkv_bias": spec.qkv_bias,
        "hidden_act": "gelu" if swiglu else transformers_common.hidden_act(spec),
        "layer_norm_eps": spec.layer_norm_epsilon, "layerscale_value": spec.layer_scale_init,
        "use_swiglu_ffn": swiglu, "drop_path_rate": 0.0, "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": spec.attention_dropout,
    }
    if registers:
        config["num_register_tokens"] = registers
    else:
        config["use_mask_token"] = True
    if spec.include_top:
        config.update(transformers_common.labels(spec.num_classes))
    return config


def _mlp_ratio(spec):
    """The int mlp_ratio of DINOv2's config for the model's mlp_dim, or None."""
    for ratio in range(1, 17):
        mlp = spec.hidden_size * ratio
        if spec.activation == "swiglu":
            mlp = (int(mlp * 2 / 3) + 7) // 8 * 8
        if mlp == spec.mlp_dim:
            return ratio
    return None


def weight_pairs(spec):
    names = {**transformers_common.VIT_NAMES, "norm_0": "norm1", "norm_2": "norm2",
             "fc_0": "mlp.fc1", "fc_1": "mlp.fc2", "scale_0": "layer_scale1.lambda1",
             "scale_1": "layer_scale2.lambda1"}
    if spec.activation == "swiglu":  # `weights_in` unpacked (`_PACKED`)
        names.update(fc_0="mlp.weights_in.up", gate="mlp.weights_in.gate",
                     fc_1="mlp.weights_out")
    return transformers_common.vit_pairs(spec, CLASSES[_architecture(spec)], names,
                                         [("head", "classifier")])


def to_arrays(state, spec, config=None):
    """DINOv2's state dict as the `.npz` layout: its SwiGLU unpacked, its mask token dropped
    with a log line, and without registers the class token's position row folded into it."""
    prefix = CLASSES[_architecture(spec)]
    state = common.unpacked(state, _PACKED)
    if state.pop(prefix + "embeddings.mask_token", None) is not None:
        logger.info("Dropped DINOv2's embeddings.mask_token: it replaces masked patches in "
                    "masked image modelling, which keras_vit's model does not do.")
    arrays = common.to_arrays(state, weight_pairs(spec), spec, "transformers")
    return arrays if spec.prefix_position_embeddings else _fold_class_row(arrays)


def from_arrays(arrays, spec):
    """The `.npz` layout as DINOv2's state dict (`to_arrays`'s inverse), with its mask token."""
    state = common.from_arrays(_position_rows(arrays, spec), weight_pairs(spec), spec,
                               "transformers")
    # transformers' initial value; only masked image modelling reads it
    state[CLASSES[_architecture(spec)] + "embeddings.mask_token"] = np.zeros(
        (1, spec.hidden_size), arrays["cls"].dtype)
    return common.packed(state, _PACKED)


def _fold_class_row(arrays):
    """DINOv2 with registers' position embeddings (rows: class token, patches) as keras_vit's
    for the patches only, the class token's row added to the class token. Exact: that row is
    added to the class token alone, and resampling keeps prefix rows as they are."""
    arrays = dict(arrays)
    positions = arrays[common.POSITIONS]
    arrays["cls"] = arrays["cls"] + positions[:, :1]
    arrays[common.POSITIONS] = positions[:, 1:]
    return arrays


def _position_rows(arrays, spec):
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


FAMILY = Family(name="DINOv2", library="transformers", classes=CLASSES,
                model_types={"dinov2": "Dinov2Model",
                             "dinov2_with_registers": "Dinov2WithRegistersModel"},
                spec_from_config=spec_from_config, writes=writes, config_for=config_for,
                weight_pairs=weight_pairs, to_arrays=to_arrays, from_arrays=from_arrays)

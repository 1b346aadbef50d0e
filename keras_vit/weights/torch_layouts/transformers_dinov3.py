"""transformers' DINOv3: `DINOv3ViTModel` (Siméoni et al., "DINOv3", 2025).

RoPE at the patch centres in [-1, 1] and no position embeddings, LayerScale, `layer.N.` with
`attention.{q,k,v,o}_proj` (its config may leave out the query's, key's or value's bias: zeros,
the key's by default), a gated MLP (`mlp.gate_proj`, `up_proj`, `down_proj`) or a plain one,
register tokens, a mask token used only for masked image modelling; no head.
"""

import logging
import re

import numpy as np

from keras_vit.weights.torch_layouts import common, transformers_common
from keras_vit.weights.torch_layouts.common import LayoutError, sized_spec, tensor
from keras_vit.weights.torch_layouts.family import Family

logger = logging.getLogger(__name__)


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of transformers' DINOv3ViTModel `config.json`: RoPE at the patch centres
    in [-1, 1] and no position embeddings, LayerScale, no head; the output its
    `pooler_output`, the final LayerNorm's class token."""
    act, gated = config.get("hidden_act", "gelu"), config.get("use_gated_mlp", False)
    if gated and act != "silu":
        raise LayoutError(f"use_gated_mlp with hidden_act {act!r}: keras_vit's gated MLP is "
                          "SwiGLU (hidden_act 'silu').")
    if not gated and act not in transformers_common.ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads "
                          f"{', '.join(transformers_common.ACTIVATIONS)} (and 'silu' gated).")
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
                      activation="swiglu" if gated else transformers_common.ACTIVATIONS[act],
                      layer_norm_epsilon=config.get("layer_norm_eps", 1e-5),
                      qkv_bias=any(biases),  # the others' zero (`_names`)
                      layer_scale_init=float(config.get("layerscale_value", 1.0)),
                      num_register_tokens=config.get("num_register_tokens", 0),
                      position_embedding="none", rope="axial_normalized",
                      rope_temperature=float(config.get("rope_theta", 100.0)),
                      attention_dropout=config.get("attention_dropout", 0.0))


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' DINOv3ViTModel `config.json` for a model of RoPE at normalized
    coordinates (a LayoutError for what it cannot express); key_bias where the weights,
    `arrays`, have a non-zero one."""
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
        "num_channels": 3, "hidden_act": "silu" if swiglu else transformers_common.hidden_act(spec),
        "use_gated_mlp": swiglu, "layer_norm_eps": spec.layer_norm_epsilon,
        "rope_theta": spec.rope_temperature, "query_bias": spec.qkv_bias,
        "key_bias": bool(common.key_bias(arrays, spec)), "value_bias": spec.qkv_bias,
        "proj_bias": True, "mlp_bias": True, "layerscale_value": spec.layer_scale_init,
        "num_register_tokens": spec.num_register_tokens, "drop_path_rate": 0.0,
        "attention_dropout": spec.attention_dropout,
    }


def weight_pairs(spec):
    """No position embeddings (RoPE), LayerScale, `layer.N.` as its files have it (in memory
    `model.layer.N.`: `_names`)."""
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
    return (stem + common.encoder_pairs(spec, "layer.{}.", names)
            + common.norm_pairs("Transformer/encoder_norm", "norm"))


def _names(state, spec):
    """DINOv3ViTModel's weights as `weight_pairs` names them: `layer.N.` (a state dict taken
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
    for _, theirs, _ in weight_pairs(spec):
        weight = theirs[:-len("bias")] + "weight"
        if theirs.endswith(".bias") and theirs not in state and weight in state:
            state[theirs] = np.zeros(state[weight].shape[:1], state[weight].dtype)
    return state


def from_arrays(arrays, spec):
    """DINOv3ViTModel's files: no key biases unless the weights have a non-zero one, its mask
    token (zeros, as transformers starts it) and an empty `register_tokens` for a model of
    none."""
    state = common.from_arrays(arrays, weight_pairs(spec), spec, "transformers")
    if not common.key_bias(arrays, spec):
        state = {key: value for key, value in state.items()
                 if not key.endswith("attention.k_proj.bias")}
    state["embeddings.mask_token"] = np.zeros((1, 1, spec.hidden_size), state["norm.weight"].dtype)
    if not spec.num_register_tokens:
        state["embeddings.register_tokens"] = np.zeros((1, 0, spec.hidden_size),
                                                       state["norm.weight"].dtype)
    return state


FAMILY = Family(name="DINOv3", library="transformers", classes={"DINOv3ViTModel": ""},
                model_types={"dinov3_vit": "DINOv3ViTModel"}, spec_from_config=spec_from_config,
                writes=lambda spec: bool(spec.rope), config_for=config_for,
                weight_pairs=weight_pairs,
                to_arrays=lambda state, spec, config=None: common.to_arrays(
                    _names(state, spec), weight_pairs(spec), spec, "transformers"),
                from_arrays=from_arrays)

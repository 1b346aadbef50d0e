"""transformers' AIMv2 vision encoder: `Aimv2VisionModel` and the `vision_model.` of a whole
`Aimv2Model` (`vision_tower`; with `include_top=True`, its `visual_projection` as the head).

AIMv2 (Fini et al., "Multimodal Autoregressive Pre-training of Large Vision Encoders", 2024)
pre-trains a ViT without a class token. transformers' `models/aimv2/modeling_aimv2.py`:
RMSNorms everywhere, one (`embeddings.rms_norm`) on the patch tokens before the position
embeddings are added; SiLU-gated MLPs, down(silu(gate(x)) * up(x)); biases on the attention's
four projections only with `qkv_bias` and on the MLP's three only with `mlp_bias` (neither in
the released models); the final RMSNorm on every token (`last_hidden_state`); with `use_head`,
`Aimv2AttentionPoolingHead` as the pooler: its `cls_token` is the query itself (no projection),
key and value projections, softmax attention, `output_proj` (with a bias), no norm or MLP.

In keras_vit: norm_layer "rms_norm", activation "swiglu", patch_norm, proj_bias, and classifier
"map" with map_mlp_dim 0 (without a head, "gap" without a class token, as I-JEPA). The pooling's
query projection of a learned probe is one more learned vector, so loading sets it to the
identity and writing folds it into `cls_token`; without key and value biases in the files, a
key bias is dropped (softmax ignores a logit added to every key) and a value bias moved into
`output_proj`'s (the weights sum to 1). Both exact.
"""

import numpy as np

from keras_vit.weights.torch_layouts import common, transformers_common
from keras_vit.weights.torch_layouts.common import LayoutError, tensor
from keras_vit.weights.torch_layouts.family import Family

# Its classes -> the prefix of their encoder's weights (Aimv2Model's: its image encoder and
# visual_projection, `vision_tower`'s with a projection).
CLASSES = {"Aimv2VisionModel": "", "Aimv2Model": "vision_model."}
_POOL = "MAPHead_0/"
_BLOCK = "Transformer/encoderblock_{}/"


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of AIMv2's vision `config.json`: no head, the output its
    `pooler_output` (without `use_head`, the mean of its `last_hidden_state`); Aimv2Model's
    image encoder with its visual_projection as the head (of projection_dim classes, a zero
    bias), the output its `get_image_features`."""
    prefix = CLASSES[architecture]
    if config.get("hidden_act", "silu") != "silu":
        raise LayoutError(f"hidden_act {config['hidden_act']!r}: keras_vit's gated MLP is "
                          "SiLU's (activation 'swiglu'), AIMv2's 'silu'.")
    if config.get("is_native", False):
        raise LayoutError(
            "config.json has is_native=True: AIMv2's native-resolution models add fixed sines "
            "and cosines laid out [sin(w), cos(w), sin(h), cos(h)] at frequencies "
            "temperature^(-k/(D/4)), which keras_vit's position_embedding 'sincos_2d' "
            "(big_vision's, temperature^(-k/(D/4 - 1))) does not give. Load an AIMv2 of "
            "learned position embeddings (is_native=False).")
    patch = config.get("patch_size", 14)
    image_size = transformers_common.tower_patches(
        config, state, prefix, patch, 0, kernel_key="embeddings.patch_embed.weight")
    qkv_bias, mlp_bias = config.get("qkv_bias", False), config.get("mlp_bias", False)
    pooling = (dict(classifier="map", map_mlp_dim=0) if config.get("use_head", True)
               else dict(classifier="gap"))
    top = dict(include_top=False, num_classes=1)
    if prefix:
        if pooling["classifier"] != "map":
            raise LayoutError("Aimv2Model's vision_config has use_head=False: its image "
                              "features project a pooler_output that this tower has not; "
                              "load the tower alone (include_top left out).")
        top = dict(include_top=True, num_classes=int(
            tensor(state, "visual_projection.weight", "transformers").shape[0]))
    return common.sized_spec(
        config.get("hidden_size", 1024), config.get("intermediate_size", 2816),
        config.get("num_attention_heads", 8), config.get("num_hidden_layers", 24), patch,
        image_size=image_size, **top, **pooling,
        final_norm="tokens", norm_layer="rms_norm", activation="swiglu", patch_norm=True,
        qkv_bias=qkv_bias, proj_bias=qkv_bias or mlp_bias, dropout=0.0,
        layer_norm_epsilon=config.get("rms_norm_eps", 1e-5),
        attention_dropout=config.get("attention_dropout", 0.0))


def vision_tower(config, state, projection):
    """A whole Aimv2Model's image encoder (`transformers_common.vision_model`); with
    `projection`, with its visual_projection, under their names (`CLASSES`' Aimv2Model)."""
    if config.get("model_type") != "aimv2":
        return None
    if projection:  # no class of its own: the whole model's name, the rest left out
        vision_config, state = transformers_common.vision_model(
            config, state, "Aimv2Model", projection=True)
        return {**vision_config, "architectures": ["Aimv2Model"]}, state
    return transformers_common.vision_model(config, state, "Aimv2VisionModel")


def writes(spec):
    """Whether the model has AIMv2's norm of the patch tokens (no other class has it)."""
    return spec.patch_norm


def refuse_options(spec, target):
    """A LayoutError naming AIMv2's options that `spec` has, which `target`, another class,
    lacks (no other class of either library has them)."""
    options = [what for bad, what in (
        (spec.patch_norm, "norm of the patch tokens (patch_norm)"),
        (not spec.proj_bias, "output projections and MLPs without biases (proj_bias=False)"),
        (spec.classifier == "map" and spec.map_mlp_dim == 0,
         "attention pooling without its MLP (map_mlp_dim=0)")) if bad]
    if options:
        raise LayoutError(f"{target} has no {'; no '.join(options)}: transformers' "
                          "Aimv2VisionModel alone has them (with patch_norm=True, "
                          "format='transformers').")


def _biases(spec):
    """AIMv2's (qkv_bias, mlp_bias) for a model of `spec`: qkv_bias covers the attention's
    output projection too, so a model with either bias has it (the others written as zeros)."""
    return spec.qkv_bias or spec.proj_bias, spec.proj_bias


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' Aimv2VisionModel `config.json` for a model of AIMv2's options, or a
    LayoutError naming what else it has."""
    pooling = ((spec.classifier == "map" and spec.map_mlp_dim == 0
                and spec.map_num_heads in (None, spec.num_heads))
               or spec.classifier == "gap")
    lacking = (
        (spec.norm_layer != "rms_norm", f"norm_layer={spec.norm_layer!r} (its norms are "
                                        "RMSNorms: norm_layer 'rms_norm')"),
        (spec.activation != "swiglu", f"activation={spec.activation!r} (its MLPs are "
                                      "SiLU-gated: 'swiglu')"),
        (not pooling, f"classifier={spec.classifier!r} with these sizes (its pooling is "
                      "classifier 'map' of the blocks' heads and map_mlp_dim=0, or without "
                      "one 'gap')"),
        (spec.class_token or spec.num_prefix_tokens, "class, distillation or register tokens"),
        (spec.include_top, "head: save a model with include_top=False"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.final_norm != "tokens", f"final_norm={spec.final_norm!r} (it norms every "
                                      "token: 'tokens')"),
        (spec.pre_norm, "pre_norm=True"),
        (spec.layer_scale_init is not None, "LayerScale"),
        (spec.residual_post_norm, "post-norm blocks"),
        (spec.qk_norm, "qk_norm=True"), (spec.grouped_query, "num_kv_heads"),
        (spec.mlp_inner_norm or spec.attention_inner_norm, "norms inside the blocks"),
        (spec.rope, f"rotary position embeddings (rope={spec.rope!r})"),
        (spec.is_hybrid or spec.axial, f"ResNet stem or axial blocks ({spec.variant})"),
        (spec.position_embedding != "learned" or spec.position_embedding_placement != "stem",
         f"position_embedding={spec.position_embedding!r} at "
         f"{spec.position_embedding_placement!r} (its are learned, added once)"),
        (spec.dropout, f"dropout {spec.dropout} (it drops only attention weights)"),
        (spec.image_size[0] != spec.image_size[1], f"non-square image_size {spec.image_size} "
                                                   "(its position embeddings are a square "
                                                   "grid)"))
    common.check_expressible("A model with AIMv2's norm of the patch tokens (patch_norm) is "
                             "written as transformers' Aimv2VisionModel", lacking)
    qkv_bias, mlp_bias = _biases(spec)
    return {"model_type": "aimv2_vision_model", "architectures": ["Aimv2VisionModel"],
            "hidden_size": spec.hidden_size, "intermediate_size": spec.mlp_dim,
            "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
            "patch_size": spec.patch_size, "image_size": spec.image_size[0],
            "num_channels": 3, "hidden_act": "silu", "rms_norm_eps": spec.layer_norm_epsilon,
            "attention_dropout": spec.attention_dropout, "qkv_bias": qkv_bias,
            "mlp_bias": mlp_bias, "use_head": spec.classifier == "map", "is_native": False}


def _pairs(spec, qkv_bias, mlp_bias, prefix=""):
    """Every (`.npz` key, their key, kind) of AIMv2's files with these biases, the encoder's
    under `prefix` (with Aimv2Model's visual_projection as the head); the pooling's query,
    which they lack, apart."""
    pairs = [("embedding/kernel", "embeddings.patch_embed.weight", "conv"),
             ("embedding/bias", "embeddings.patch_embed.bias", "copy"),
             ("patch_norm/scale", "embeddings.rms_norm.weight", "copy"),
             (common.POSITIONS, "embeddings.position_embedding.weight", "rows"),
             ("Transformer/encoder_norm/scale", "rms_norm.weight", "copy")]
    for index in range(spec.num_layers):
        ours, theirs = _BLOCK.format(index), f"encoder.layers.{index}."
        attention = ours + "MultiHeadDotProductAttention_1/"
        pairs += [(ours + "LayerNorm_0/scale", theirs + "rms_norm1.weight", "copy"),
                  (ours + "LayerNorm_2/scale", theirs + "rms_norm2.weight", "copy")]
        for name, kind in (("query", "heads"), ("key", "heads"), ("value", "heads"),
                           ("out", "out")):
            their = f"{theirs}attention.{name[0] if kind == 'heads' else 'out'}_proj"
            pairs.append((attention + f"{name}/kernel", their + ".weight",
                          "heads_in" if kind == "heads" else "heads_out"))
            if qkv_bias:
                pairs.append((attention + f"{name}/bias", their + ".bias",
                              "heads_bias" if kind == "heads" else "copy"))
        for name, their in (("Dense_0", "up_proj"), ("Gate_0", "gate_proj"),
                            ("Dense_1", "down_proj")):
            dense = common.dense_pairs(ours + "MlpBlock_3/" + name, theirs + "ffn." + their)
            pairs += dense if mlp_bias else dense[:1]
    if spec.classifier == "map":
        pairs.append((_POOL + "probe", "head.cls_token", "copy"))
        for name, their in (("key", "k_proj"), ("value", "v_proj")):
            dense = common.dense_pairs(_POOL + name, "head." + their)
            pairs += dense if qkv_bias else dense[:1]
        pairs += common.dense_pairs(_POOL + "out", "head.output_proj")
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in pairs]
    if prefix:
        pairs.append(("head/kernel", "visual_projection.weight", "linear"))
    return pairs


def weight_pairs(spec):
    return _pairs(spec, *_biases(spec))


def _zero_biases(arrays, spec, qkv_bias, mlp_bias):
    """`arrays` with zeros for the biases the model of `spec` has and files of these biases
    lack (or the other way round), so that both sides hold the same keys."""
    arrays, hidden = dict(arrays), spec.hidden_size
    head_dim = hidden // spec.num_heads
    wanted = [(name, (spec.num_heads, head_dim)) for name in ("query", "key", "value")
              if qkv_bias or spec.qkv_bias]
    if qkv_bias or spec.proj_bias:
        wanted.append(("out", (hidden,)))
    for index in range(spec.num_layers):
        attention = _BLOCK.format(index) + "MultiHeadDotProductAttention_1/"
        for name, shape in wanted:
            arrays.setdefault(f"{attention}{name}/bias", np.zeros(shape, "float32"))
        if mlp_bias or spec.proj_bias:
            for name, width in (("Dense_0", spec.mlp_dim), ("Gate_0", spec.mlp_dim),
                                ("Dense_1", hidden)):
                arrays.setdefault(f"{_BLOCK.format(index)}MlpBlock_3/{name}/bias",
                                  np.zeros((width,), "float32"))
    return arrays


def to_arrays(state, spec, config=None):
    """AIMv2's state dict as the `.npz` layout: biases the files lack as zeros, the pooling's
    query projection the identity."""
    prefix = "vision_model." if spec.include_top else ""  # Aimv2Model's, with its projection
    qkv_bias = prefix + "encoder.layers.0.attention.q_proj.bias" in state
    mlp_bias = prefix + "encoder.layers.0.ffn.up_proj.bias" in state
    arrays = common.to_arrays(state, _pairs(spec, qkv_bias, mlp_bias, prefix), spec,
                              "transformers")
    arrays = _zero_biases(arrays, spec, qkv_bias, mlp_bias)
    if spec.include_top:  # visual_projection has no bias
        arrays["head/bias"] = np.zeros(spec.num_classes, arrays["head/kernel"].dtype)
    if spec.classifier == "map":
        dtype = arrays[_POOL + "probe"].dtype
        arrays[_POOL + "query/kernel"] = np.eye(spec.hidden_size, dtype=dtype)
        for name in ("query", "key", "value"):
            arrays.setdefault(f"{_POOL}{name}/bias", np.zeros(spec.hidden_size, dtype))
    return arrays


def from_arrays(arrays, spec):
    """The `.npz` layout as AIMv2's state dict: the pooling's query projection applied to its
    probe (`cls_token`), and without qkv_bias its key bias dropped and its value bias moved
    into `output_proj`'s."""
    qkv_bias, mlp_bias = _biases(spec)
    arrays = _zero_biases(arrays, spec, qkv_bias, mlp_bias)
    if spec.classifier == "map":
        f64 = {name: np.asarray(arrays.pop(_POOL + name), np.float64)
               for name in ("probe", "query/kernel", "query/bias")}
        dtype = arrays[_POOL + "out/kernel"].dtype
        arrays[_POOL + "probe"] = (f64["probe"] @ f64["query/kernel"]
                                   + f64["query/bias"]).astype(dtype)
        if not qkv_bias:
            value_bias = np.asarray(arrays.pop(_POOL + "value/bias"), np.float64)
            arrays.pop(_POOL + "key/bias")
            out = np.asarray(arrays[_POOL + "out/kernel"], np.float64)
            arrays[_POOL + "out/bias"] = (arrays[_POOL + "out/bias"]
                                          + value_bias @ out).astype(dtype)
    return common.from_arrays(arrays, _pairs(spec, qkv_bias, mlp_bias), spec, "transformers")


FAMILY = Family(name="AIMv2", library="transformers", classes=CLASSES,
                model_types={"aimv2_vision_model": "Aimv2VisionModel", "aimv2": "Aimv2Model"},
                vision_tower=vision_tower, spec_from_config=spec_from_config, writes=writes,
                config_for=config_for, weight_pairs=weight_pairs, to_arrays=to_arrays,
                from_arrays=from_arrays)

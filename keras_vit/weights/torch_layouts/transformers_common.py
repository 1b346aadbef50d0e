"""What transformers' families share: its activations' names, `ViTModel`'s layout (on which
DeiT, DINOv2, ViT-MSN, ViT-MAE and I-JEPA are built) with its config.json, and the layout of
the vision towers of its image-text models (CLIP's, MetaCLIP 2's and SigLIP's). Pure NumPy.

`ViTModel` / `ViTForImageClassification` files keep separate query, key and value Linear layers
under `vit.encoder.layer.N.attention.attention.*` (no `vit.` prefix for a saved `ViTModel`,
which may add `pooler.dense`, the original's tanh `pre_logits`). Linear weights are (out, in),
the patch convolution (D, C, p, p). The vision towers keep `encoder.layers.N` with
`self_attn.{q,k,v,out}_proj`, `layer_norm1`, `layer_norm2`, `mlp.fc1`, `mlp.fc2`, and position
embeddings as an nn.Embedding (tokens, D).
"""

import logging

from keras_vit.architecture.spec import DEFAULTS
from keras_vit.weights.torch_layouts import common
from keras_vit.weights.torch_layouts.common import LayoutError, check_grid, sized_spec, tensor

logger = logging.getLogger(__name__)

# transformers' hidden_act -> the spec's activation (the tanh GELU is the original's).
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "quick_gelu": "quick_gelu"}
# Spec options transformers' ViT does not have (timm's VisionTransformer has them all).
_LATER_OPTIONS = ("layer_scale_init", "num_register_tokens", "prefix_position_embeddings",
                  "pre_norm", "final_norm")
# ViTModel's names of a block's layers (`common.block_pairs`).
VIT_NAMES = {"query": "attention.attention.query", "key": "attention.attention.key",
             "value": "attention.attention.value", "out": "attention.output.dense",
             "norm_0": "layernorm_before", "norm_2": "layernorm_after",
             "fc_0": "intermediate.dense", "fc_1": "output.dense"}
# The vision towers' names of a block's layers.
_TOWER_NAMES = {"query": "self_attn.q_proj", "key": "self_attn.k_proj",
                "value": "self_attn.v_proj", "out": "self_attn.out_proj",
                "norm_0": "layer_norm1", "norm_2": "layer_norm2", "fc_0": "mlp.fc1",
                "fc_1": "mlp.fc2"}


def check_activation(act):
    """`act`, transformers' hidden_act, or a LayoutError unless keras_vit has it."""
    if act not in ACTIVATIONS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit reads {', '.join(ACTIVATIONS)}.")
    return act


def hidden_act(spec):
    """transformers' hidden_act of the spec's activation."""
    return {"gelu_tanh": "gelu_pytorch_tanh"}.get(spec.activation, spec.activation)


def labels(classes):
    """The id2label and label2id of a config.json for `classes` classes."""
    id2label = {str(index): f"LABEL_{index}" for index in range(classes)}
    return {"id2label": id2label,
            "label2id": {name: int(index) for index, name in id2label.items()}}


# ViTModel's layout -----------------------------------------------------------------------------


def vit_pairs(spec, prefix, names, heads):
    """Every (`.npz` key, their key, kind) of a model in ViTModel's layout, its encoder under
    `prefix`, its blocks' layers named by `names` and its `heads`, (ours, theirs) pairs of
    Linear layers, outside the encoder."""
    stem = [("embedding/kernel", "embeddings.patch_embeddings.projection.weight", "conv"),
            ("embedding/bias", "embeddings.patch_embeddings.projection.bias", "copy"),
            (common.POSITIONS, "embeddings.position_embeddings", "copy")]
    if spec.class_token:  # I-JEPA's has none
        stem.append(("cls", "embeddings.cls_token", "copy"))
    if spec.distillation_token:
        stem.append(("dist", "embeddings.distillation_token", "copy"))
    if spec.num_register_tokens:
        stem.append(("reg/registers", "embeddings.register_tokens", "copy"))
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    pairs += common.encoder_pairs(spec, prefix + "encoder.layer.{}.", names)
    if spec.final_norm == "tokens":
        pairs += common.norm_pairs("Transformer/encoder_norm", prefix + "layernorm")
    if spec.representation_size is not None:
        pairs += common.dense_pairs("pre_logits", "pooler.dense")
    if spec.include_top:  # the heads are outside the encoder: no prefix
        for ours, theirs in heads:
            pairs += common.dense_pairs(ours, theirs)
    return pairs


def vit_patches(config, state, prefix, prefix_rows):
    """(patch_size, image_size) of a config.json in ViTModel's layout, or a LayoutError where
    its weights (encoder under `prefix`, `prefix_rows` position rows before the patches')
    contradict it."""
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
               image_size, patch, prefix_rows, "image_size")
    return patch, image_size


def vit_spec(config, patch, image_size, **top):
    """The `ViTConfig` of ViT's config.json (or DeiT's, ViT-MSN's, ViT-MAE's) with `top`,
    the fields of its head."""
    return sized_spec(config.get("hidden_size", 768), config.get("intermediate_size", 3072),
                      config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                      patch, image_size=image_size, **top,
                      activation=ACTIVATIONS[config.get("hidden_act", "gelu")],
                      layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
                      qkv_bias=config.get("qkv_bias", True),
                      dropout=config.get("hidden_dropout_prob", 0.0),
                      attention_dropout=config.get("attention_probs_dropout_prob", 0.0))


def spec_from_vit(config, state, prefix, classifier):
    """The `ViTConfig` of ViT's config.json (or ViT-MSN's, ViT-MAE's), its encoder's weights
    under `prefix`: with `classifier` a head on the final LayerNorm's class token, as many
    classes as its labels; without, the output the class token, through the tanh pooler
    (`pre_logits`) where `state` has one."""
    patch, image_size = vit_patches(config, state, prefix, 1)
    labelled = config.get("id2label") or {}
    top = dict(include_top=classifier,
               num_classes=max(len(labelled), 1) if classifier else 1,
               representation_size=None if classifier or "pooler.dense.weight" not in state
               else config.get("hidden_size", 768))
    return vit_spec(config, patch, image_size, **top)


def check_vit(spec, family):
    """A LayoutError for what transformers' ViT or DeiT (`family`) cannot express."""
    common.check_plain(spec, f"transformers' {family}")
    later = [f"{name}={getattr(spec, name)!r}" for name in _LATER_OPTIONS
             if getattr(spec, name) != DEFAULTS[name]]
    if later:
        raise LayoutError(f"transformers' {family} has no {', '.join(later)} (options of later "
                          "ViTs); save this model for timm (format='timm').")
    if spec.classifier != "token":
        ijepa = (" (the mean of the patch tokens without a class token is its I-JEPA's)"
                 if spec.classifier == "gap" else "")
        raise LayoutError("transformers' ViT classifies from the class token; a model pooled "
                          f"otherwise (classifier={spec.classifier!r}) has no equivalent "
                          f"there{ijepa}.")
    if spec.include_top and spec.representation_size is not None:
        raise LayoutError("transformers' ViTForImageClassification has no pre_logits layer "
                          "before its head; save a model without representation_size.")


def vit_config(spec, model_type, architecture, labelled):
    """transformers' config.json of ViTModel's layout for a model of `spec` as its
    `architecture`, with its labels where `labelled` (as many as the head's classes)."""
    height, width = spec.image_size
    config = {
        "model_type": model_type, "architectures": [architecture],
        "hidden_size": spec.hidden_size, "intermediate_size": spec.mlp_dim,
        "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
        "patch_size": spec.patch_size, "image_size": height if height == width else [height,
                                                                                     width],
        "num_channels": 3, "qkv_bias": spec.qkv_bias,
        "hidden_act": hidden_act(spec),
        "layer_norm_eps": spec.layer_norm_epsilon,
        "hidden_dropout_prob": spec.dropout, "attention_probs_dropout_prob":
            spec.attention_dropout,
        "pooler_act": "tanh", "pooler_output_size": spec.hidden_size,
    }
    if labelled:  # DeiT without a head is its num_labels 0 (the heads are identities)
        config.update(labels(spec.num_classes if spec.include_top else 0))
    return config


# The vision towers' layout ----------------------------------------------------------------------


def tower_pairs(spec, prefix, stem, final_norm):
    """Every (`.npz` key, their key, kind) of a vision tower's encoder (under `prefix`) but its
    pooling: the patch embedding, position embeddings and `stem`, the family's other
    embeddings, the blocks, and `post_layernorm` as the `.npz` layout's `final_norm`."""
    stem = [("embedding/kernel", "embeddings.patch_embedding.weight", "conv"),
            (common.POSITIONS, "embeddings.position_embedding.weight", "rows"), *stem]
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    pairs += common.encoder_pairs(spec, prefix + "encoder.layers.{}.", _TOWER_NAMES)
    return pairs + common.norm_pairs(final_norm, prefix + "post_layernorm")


def tower_patches(config, state, prefix, patch, prefix_rows,
                  kernel_key="embeddings.patch_embedding.weight"):
    """The image_size of a vision tower's config.json of `patch`-pixel patches, or a
    LayoutError where its weights (under `prefix`: the patch kernel `kernel_key`, `prefix_rows`
    position rows before the patches') contradict it."""
    image_size = config.get("image_size", 224)
    kernel = tensor(state, prefix + kernel_key, "transformers")
    if tuple(kernel.shape[-2:]) != (patch, patch):
        raise LayoutError(f"config.json says patch_size {patch}, but model.safetensors holds "
                          f"{kernel.shape[-2]}x{kernel.shape[-1]} patch kernels: use the "
                          "config.json written with these weights.")
    positions = tensor(state, prefix + "embeddings.position_embedding.weight", "transformers")
    check_grid(positions[None], image_size, patch, prefix_rows, "image_size")
    return image_size


def tower_spec(config, patch, image_size, act, epsilon, **fields):
    """The `ViTConfig` of a vision tower's config.json with `fields`, its pooling and head;
    `epsilon` the LayerNorms' where it names none."""
    return sized_spec(config.get("hidden_size", 768), config.get("intermediate_size", 3072),
                      config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                      patch, image_size=image_size, **fields, activation=ACTIVATIONS[act],
                      layer_norm_epsilon=config.get("layer_norm_eps", epsilon),
                      attention_dropout=config.get("attention_dropout", 0.0))


def tower_config(spec, family, architecture, head):
    """transformers' config.json of `family`'s ("clip", "siglip") vision tower as its
    `architecture`, or a LayoutError naming what else the model has; `head`: whether the
    class has one (CLIPVisionModelWithProjection's visual_projection)."""
    name = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}[family]
    lacking = (
        (spec.include_top and not head, "head: save a model with include_top=False"),
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
    return {"model_type": f"{family}_vision_model", "architectures": [architecture],
            "hidden_size": spec.hidden_size, "intermediate_size": spec.mlp_dim,
            "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
            "patch_size": spec.patch_size, "image_size": spec.image_size[0], "num_channels": 3,
            "hidden_act": hidden_act(spec), "layer_norm_eps": spec.layer_norm_epsilon,
            "attention_dropout": spec.attention_dropout}


def vision_model(config, state, tower, projection=False):
    """`(config, state)` of the vision tower (`vision_model.`) of an image-text model's files,
    as its `tower` class's, the text tower and the contrastive parameters dropped with a log
    line; with `projection`, with its `visual_projection` (CLIP's and MetaCLIP 2's projection
    to the joint embedding), as `tower`WithProjection's files."""
    if projection:
        return _projected_vision_model(config, state, tower)
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


def _projected_vision_model(config, state, tower):
    """`vision_model` with the projection: the weights kept under their names, as
    `tower`WithProjection holds them (`vision_model.`, `visual_projection`)."""
    kept = {key: value for key, value in state.items()
            if key.startswith("vision_model.") or key == "visual_projection.weight"}
    tensor(state, "visual_projection.weight", "transformers")
    logger.info("Loaded the vision tower (vision_model.) and visual_projection of "
                "transformers' %s and left out %s: the output is its image_embeds.",
                (config.get("architectures") or [config["model_type"]])[0],
                ", ".join(sorted({key.split(".")[0] for key in state if key not in kept})))
    vision_config = {**(config.get("vision_config") or {}),
                     "architectures": [tower + "WithProjection"],
                     "model_type": f"{config['model_type']}_vision_model",
                     "projection_dim": config.get("projection_dim", 512)}
    return vision_config, kept


def clip_spec(config, state, prefix):
    """The `ViTConfig` of CLIP's (and MetaCLIP 2's, the same layout) vision `config.json`, its
    tower's weights under `prefix`: no head, the output its `pooler_output`, the class token,
    normed; a tower under `vision_model.` (CLIPVisionModelWithProjection's) with its
    visual_projection as the head (of projection_dim classes, a zero bias), the output its
    image_embeds."""
    act = check_activation(config.get("hidden_act", "quick_gelu"))
    patch = config.get("patch_size", 32)
    image_size = tower_patches(config, state, prefix, patch, 1)
    top = dict(include_top=False, num_classes=1)
    if prefix:  # ...WithProjection's visual_projection
        top = dict(include_top=True, num_classes=int(
            tensor(state, "visual_projection.weight", "transformers").shape[0]))
    return tower_spec(config, patch, image_size, act, 1e-5, **top, pre_norm=True,
                      classifier="token", final_norm="pooled")


def siglip_spec(config, state):
    """The `ViTConfig` of SigLIP's (and SigLIP 2's, read as SigLIP's) vision `config.json`: no
    head, the output its `pooler_output`, the attention pooling of the normed tokens."""
    act = check_activation(config.get("hidden_act", "gelu_pytorch_tanh"))
    if not config.get("vision_use_head", True):
        raise LayoutError(
            "config.json has vision_use_head=False: this SiglipVisionModel has no pooling head "
            "and no pooler_output, and keras_vit's models always pool. Load a SigLIP with its "
            "head, or read the tokens of another with keras_vit.features().")
    patch = config.get("patch_size", 16)
    image_size = tower_patches(config, state, "", patch, 0)
    return tower_spec(config, patch, image_size, act, 1e-6, include_top=False, num_classes=1,
                      classifier="map", final_norm="tokens")

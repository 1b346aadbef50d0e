"""transformers' SigLIP vision tower: `SiglipVisionModel` and the `vision_model.` of a whole
`SiglipModel` (`vision_tower`).

SigLIP (Zhai et al., "Sigmoid Loss for Language Image Pre-Training", 2023) has the vision
towers' layout (`transformers_common.tower_pairs`) with no class token, `post_layernorm` on
every token and attention pooling, `head` (a torch nn.MultiheadAttention with a packed
`in_proj_weight`).
"""

from keras_vit.weights.torch_layouts import common, transformers_common
from keras_vit.weights.torch_layouts.family import Family

CLASSES = {"SiglipVisionModel": ""}
# Its attention pooling's packed query, key and value (`common.unpacked`).
_PACKED = ((r".*head\.attention\.in_proj", "_", ("q", "k", "v")),)


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of SigLIP's vision `config.json` (`transformers_common.siglip_spec`)."""
    return transformers_common.siglip_spec(config, state)


def writes(spec):
    """Whether the model has the options only SigLIP's vision tower has: attention pooling of
    normed tokens without a pre-norm (and no LayerScale, distillation token or RoPE)."""
    return (spec.layer_scale_init is None and not spec.distillation_token and not spec.rope
            and not spec.pre_norm and spec.classifier == "map" and spec.final_norm == "tokens")


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' SiglipVisionModel `config.json` for a model of SigLIP's options, or a
    LayoutError naming what else it has."""
    common.check_plain(spec, "transformers' SiglipVisionModel")
    config = transformers_common.tower_config(spec, "siglip", "SiglipVisionModel", head=False)
    config["vision_use_head"] = True
    return config


def weight_pairs(spec):
    pairs = transformers_common.tower_pairs(
        spec, "", [("embedding/bias", "embeddings.patch_embedding.bias", "copy")],
        "Transformer/encoder_norm")
    return pairs + common.attention_pool_pairs(  # the packed in_proj unpacked (`_PACKED`)
        "head.", "probe", ("attention.in_proj.q", "attention.in_proj.k", "attention.in_proj.v",
                           "attention.out_proj"), "layernorm")


def to_arrays(state, spec, config=None):
    """SigLIP's state dict as the `.npz` layout, its pooling's in_proj unpacked."""
    return common.to_arrays(common.unpacked(state, _PACKED), weight_pairs(spec), spec,
                            "transformers")


def from_arrays(arrays, spec):
    """The `.npz` layout as SigLIP's state dict, its pooling's in_proj packed."""
    return common.packed(common.from_arrays(arrays, weight_pairs(spec), spec, "transformers"),
                         _PACKED)


def vision_tower(config, state, projection):
    """A whole SiglipModel's image encoder (`transformers_common.vision_model`)."""
    if config.get("model_type") != "siglip":
        return None
    return transformers_common.vision_model(config, state, "SiglipVisionModel")


FAMILY = Family(name="SigLIP", library="transformers", classes=CLASSES,
                model_types={"siglip_vision_model": "SiglipVisionModel",
                             "siglip": "SiglipModel"},
                vision_tower=vision_tower, spec_from_config=spec_from_config, writes=writes,
                config_for=config_for, weight_pairs=weight_pairs, to_arrays=to_arrays,
                from_arrays=from_arrays)

"""transformers' CLIP vision tower: `CLIPVisionModel`, `CLIPVisionModelWithProjection` and the
`vision_model.` of a whole `CLIPModel` (`vision_tower`).

CLIP (Radford et al., "Learning Transferable Visual Models From Natural Language Supervision",
2021) has the vision towers' layout (`transformers_common.tower_pairs`) with a class token
`class_embedding` (D,), a patch convolution without bias, `pre_layrnorm` and `post_layernorm`
on the pooled class token. `CLIPVisionModelWithProjection` holds the tower under
`vision_model.` and `visual_projection` (a Linear without bias to the joint embedding, its
`image_embeds`): keras_vit's head, with a zero bias.
"""

import numpy as np

from keras_vit.weights.torch_layouts import common, transformers_common
from keras_vit.weights.torch_layouts.common import LayoutError
from keras_vit.weights.torch_layouts.family import Family

# Its classes -> the prefix of their encoder's weights.
CLASSES = {"CLIPVisionModel": "", "CLIPVisionModelWithProjection": "vision_model."}


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of CLIP's vision `config.json` (`transformers_common.clip_spec`)."""
    return transformers_common.clip_spec(config, state, CLASSES[architecture])


def writes(spec):
    """Whether the model has the options only CLIP's vision tower has: a pre-norm and a norm of
    the pooled class token (and no LayerScale, distillation token or RoPE)."""
    return (spec.layer_scale_init is None and not spec.distillation_token and not spec.rope
            and spec.pre_norm and spec.classifier == "token" and spec.final_norm == "pooled")


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' CLIPVisionModel `config.json` for a model of CLIP's options,
    CLIPVisionModelWithProjection for one with a head whose bias (in `arrays`) is zero, or a
    LayoutError naming what else it has."""
    common.check_plain(spec, "transformers' CLIPVisionModel")
    if spec.include_top and arrays is not None:
        _check_projection_bias(arrays["head/bias"])
    config = transformers_common.tower_config(
        spec, "clip", "CLIPVisionModelWithProjection" if spec.include_top else "CLIPVisionModel",
        head=spec.include_top)
    if spec.include_top:
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


def weight_pairs(spec):
    prefix = "vision_model." if spec.include_top else ""
    pairs = transformers_common.tower_pairs(
        spec, prefix, [("cls", "embeddings.class_embedding", "vector_token"),
                       *common.norm_pairs("pre_norm", "pre_layrnorm")], "fc_norm")
    if spec.include_top:  # outside vision_model.; no bias (a zero one)
        pairs.append(("head/kernel", "visual_projection.weight", "linear"))
    return pairs


def to_arrays(state, spec, config=None):
    """CLIP's state dict as the `.npz` layout; its patch embedding has no bias (a zero one,
    `common.to_arrays`), nor has its visual_projection (a zero one)."""
    arrays = common.to_arrays(state, weight_pairs(spec), spec, "transformers")
    if spec.include_top:
        arrays["head/bias"] = np.zeros_like(arrays["head/kernel"][0])
    return arrays


def from_arrays(arrays, spec):
    """The `.npz` layout as CLIP's state dict: the patch bias folded into the position
    embeddings, the head's (zero) bias left out."""
    arrays = common.fold_patch_bias(arrays, spec)
    if spec.include_top:
        _check_projection_bias(arrays.pop("head/bias"))
    return common.from_arrays(arrays, weight_pairs(spec), spec, "transformers")


def vision_tower(config, state, projection):
    """A whole CLIPModel's image encoder, with its visual_projection where `projection`
    (`transformers_common.vision_model`)."""
    if config.get("model_type") != "clip":
        return None
    return transformers_common.vision_model(config, state, "CLIPVisionModel", projection)


FAMILY = Family(name="CLIP", library="transformers", classes=CLASSES,
                model_types={"clip_vision_model": "CLIPVisionModel", "clip": "CLIPModel"},
                vision_tower=vision_tower, spec_from_config=spec_from_config, writes=writes,
                config_for=config_for, weight_pairs=weight_pairs, to_arrays=to_arrays,
                from_arrays=from_arrays)

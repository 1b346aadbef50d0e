"""transformers' I-JEPA: `IJepaModel` and `IJepaForImageClassification`.

I-JEPA (Assran et al., "Self-Supervised Learning from Images with a Joint-Embedding Predictive
Architecture", 2023) trains a ViT without a class token. transformers'
`models/ijepa/modeling_ijepa.py` saves ViTModel's layout (`transformers_common.vit_pairs`)
without `embeddings.cls_token`, with position embeddings for the patches only; its model's
output is every token through the final `layernorm` (`last_hidden_state`), and its classifier
(`IJepaForImageClassification`: the model under `ijepa.`, a `classifier` Linear) reads their
mean. So both are keras_vit's classifier "gap" without a class token and final_norm "tokens",
and such a model is written as them.
"""

import logging

from keras_vit.weights.torch_layouts import common, transformers_common
from keras_vit.weights.torch_layouts.common import tensor
from keras_vit.weights.torch_layouts.family import Family

logger = logging.getLogger(__name__)

# Its classes -> the prefix of their encoder's weights.
CLASSES = {"IJepaModel": "", "IJepaForImageClassification": "ijepa."}
# Tensors IJepaModel has only when built with add_pooling_layer=True or use_mask_token=True,
# which its from_pretrained does not do: a tanh Dense of the first patch token, and the token
# that replaces masked patches in pre-training.
_UNUSED = ("pooler.", "embeddings.mask_token")


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of I-JEPA's config.json: the mean of the final LayerNorm's tokens
    (classifier "gap", no class token), with IJepaForImageClassification's `classifier` as the
    head."""
    transformers_common.check_activation(config.get("hidden_act", "gelu"))
    prefix = CLASSES[architecture]
    patch, image_size = transformers_common.vit_patches(config, state, prefix, 0)
    top = dict(include_top=False, num_classes=1)
    if prefix:
        top = dict(include_top=True, num_classes=int(
            tensor(state, "classifier.weight", "transformers").shape[0]))
    return transformers_common.vit_spec(config, patch, image_size, **top, classifier="gap",
                                        final_norm="tokens")


def vision_tower(config, state, projection):
    """An IJepaForImageClassification of num_labels 0, whose classifier is an identity (no
    weights), as the IJepaModel it holds under `ijepa.`: the same output, its mean token."""
    if ((config.get("architectures") or [None])[0] != "IJepaForImageClassification"
            or "classifier.weight" in state):
        return None
    return {**config, "architectures": ["IJepaModel"]}, {
        key[len("ijepa."):] if key.startswith("ijepa.") else key: value
        for key, value in state.items()}


def writes(spec):
    """Whether transformers' class for `spec` is I-JEPA's: the mean of the patch tokens and no
    class token (and no LayerScale or RoPE, DINOv2's and DINOv3's)."""
    return (spec.classifier == "gap" and not spec.class_token and spec.layer_scale_init is None
            and not spec.rope)


def _architecture(spec):
    return "IJepaForImageClassification" if spec.include_top else "IJepaModel"


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' I-JEPA `config.json` for a model of classifier "gap" without a class
    token: IJepaModel without a head, IJepaForImageClassification with one; or a LayoutError
    naming what else the model has."""
    common.check_plain(spec, "transformers' IJepaModel")
    lacking = (
        (spec.final_norm != "tokens", f"final_norm={spec.final_norm!r} (it norms every token, "
                                      "then its classifier averages them: final_norm "
                                      "'tokens')"),
        (spec.representation_size is not None, "pre_logits layer (representation_size)"),
        (spec.num_register_tokens, "register tokens"),
        (spec.pre_norm, "pre_norm=True"))
    common.check_expressible(
        "A model of classifier 'gap' without a class token is written as transformers' "
        "IJepaModel (with a head, IJepaForImageClassification)", lacking)
    return transformers_common.vit_config(spec, "ijepa", _architecture(spec),
                                          labelled=spec.include_top)


def weight_pairs(spec):
    return transformers_common.vit_pairs(spec, CLASSES[_architecture(spec)],
                                         transformers_common.VIT_NAMES, [("head", "classifier")])


def to_arrays(state, spec, config=None):
    """I-JEPA's state dict as the `.npz` layout, the tensors its from_pretrained leaves unbuilt
    (`_UNUSED`) dropped with a log line."""
    prefix = CLASSES[_architecture(spec)]
    unused = sorted(key for key in state if key.startswith(tuple(prefix + name
                                                                 for name in _UNUSED)))
    if unused:
        logger.info("Dropped %s: transformers' IJepaModel.from_pretrained builds no pooler or "
                    "mask token, so its outputs never read them.", ", ".join(unused))
    state = {key: value for key, value in state.items() if key not in unused}
    return common.to_arrays(state, weight_pairs(spec), spec, "transformers")


FAMILY = Family(name="I-JEPA", library="transformers", classes=CLASSES,
                model_types={"ijepa": "IJepaModel"}, vision_tower=vision_tower,
                spec_from_config=spec_from_config,
                writes=writes, config_for=config_for, weight_pairs=weight_pairs,
                to_arrays=to_arrays)

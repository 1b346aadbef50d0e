"""transformers' ViT: `ViTModel` and `ViTForImageClassification` (`transformers_common.VIT_NAMES`
names their layers). It writes every model no other transformers family claims, refusing what
ViT cannot express; a ViT without a head or a pooler is written as `ViTMSNModel`, whose
weights are ViT's without the pooler (`transformers_msn`)."""

from keras_vit.weights.torch_layouts import transformers_common
from keras_vit.weights.torch_layouts.common import LayoutError
from keras_vit.weights.torch_layouts.family import Family

# Its classes -> the prefix of their encoder's weights.
CLASSES = {"ViTForImageClassification": "vit.", "ViTModel": ""}


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of ViT's config.json: ViTForImageClassification's a head on the final
    LayerNorm's class token, ViTModel's the class token (through its tanh pooler, the
    original's pre_logits, where the weights have one)."""
    transformers_common.check_activation(config.get("hidden_act", "gelu"))
    classifier = architecture == "ViTForImageClassification"
    if classifier and config.get("pooler_act", "tanh") != "tanh":
        raise LayoutError(f"pooler_act {config['pooler_act']!r}: only tanh (the original's).")
    return transformers_common.spec_from_vit(config, state, CLASSES[architecture], classifier)


def _architecture(spec):
    if spec.include_top:
        return "ViTForImageClassification"
    # Without a pooler, ViT's encoder is transformers' ViTMSNModel (its ViTModel's pooler would
    # start at random): the same weights and last_hidden_state, as MSN's and MAE's encoders.
    return "ViTModel" if spec.representation_size == spec.hidden_size else "ViTMSNModel"


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' ViT config.json for a model of `spec`, or a LayoutError for what it
    cannot express."""
    transformers_common.check_vit(spec, "ViT")
    if not spec.include_top and spec.representation_size not in (None, spec.hidden_size):
        raise LayoutError(
            "transformers' ViTModel's pooler (the original's pre_logits) is a tanh Dense of "
            f"the class token's width, {spec.hidden_size}, not {spec.representation_size}: "
            "save a model with representation_size=hidden_size, or None (written as its "
            "pooler-less ViTMSNModel), or with a head.")
    architecture = _architecture(spec)
    return transformers_common.vit_config(
        spec, "vit_msn" if architecture == "ViTMSNModel" else "vit", architecture,
        labelled=spec.include_top)


def weight_pairs(spec):
    """Every (`.npz` key, their key, kind) of a model of `spec` in ViT's class for it."""
    return transformers_common.vit_pairs(spec, "vit." if spec.include_top else "",
                                         transformers_common.VIT_NAMES, [("head", "classifier")])


FAMILY = Family(name="ViT", library="transformers", classes=CLASSES,
                model_types={"vit": "ViTModel"}, spec_from_config=spec_from_config,
                writes=lambda spec: True,  # the last resort: it refuses what it cannot express
                config_for=config_for, weight_pairs=weight_pairs)

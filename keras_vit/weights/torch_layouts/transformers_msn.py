"""transformers' ViT-MSN: `ViTMSNModel` and `ViTMSNForImageClassification`.

ViT-MSN (Assran et al., "Masked Siamese Networks for Label-Efficient Learning", 2022) is ViT's
layout without its pooler (`vit.`, and the classifier's `classifier` on the normed class
token), so its models are written as ViT's (`transformers_vit`: a ViT without a head or pooler
as `ViTMSNModel`); this family only reads.
"""

from keras_vit.weights.torch_layouts import transformers_common
from keras_vit.weights.torch_layouts.family import Family

# Its classes -> the prefix of their encoder's weights.
CLASSES = {"ViTMSNModel": "", "ViTMSNForImageClassification": "vit."}


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of ViT-MSN's config.json: ViT's (`transformers_common.spec_from_vit`),
    its classifier's head on the final LayerNorm's class token."""
    transformers_common.check_activation(config.get("hidden_act", "gelu"))
    return transformers_common.spec_from_vit(config, state, CLASSES[architecture],
                                             architecture == "ViTMSNForImageClassification")


def vision_tower(config, state, projection):
    """ViTMSNForImageClassification's state with its blocks under `vit.`: transformers (as the
    original checkpoints) saves them as `encoder.*` beside `vit.embeddings` and `vit.layernorm`."""
    if (config.get("architectures") or [None])[0] != "ViTMSNForImageClassification":
        return None
    return config, {"vit." + key if key.startswith("encoder.") else key: value
                    for key, value in state.items()}


FAMILY = Family(name="ViT-MSN", library="transformers", classes=CLASSES,
                model_types={"vit_msn": "ViTMSNModel"}, vision_tower=vision_tower,
                spec_from_config=spec_from_config)

"""transformers' DeiT with a teacher, `DeiTForImageClassificationWithTeacher`: ViTModel's layout
under `deit.` with DeiT's distillation token.

DeiT's distilled models (Touvron et al., "Training data-efficient image transformers &
distillation through attention", 2021) add a distillation token after the class token, its
own position-embedding row and a second head on it: timm's `VisionTransformerDistilled`
(`dist_token`, `head_dist`) and transformers' `DeiTForImageClassificationWithTeacher`
(`deit.embeddings.distillation_token`, `cls_classifier`, `distillation_classifier`), whose
outputs are the mean of the two heads' logits, as keras_vit's `distillation_token=True`.
"""

from keras_vit.weights.torch_layouts import transformers_common
from keras_vit.weights.torch_layouts.family import Family

CLASSES = {"DeiTForImageClassificationWithTeacher": "deit."}
# transformers' DeiT classes keras_vit has no model of, with why.
REFUSED = {
    "DeiTForImageClassification": "it classifies from the class token alone while its "
                                  "distillation token still attends, where keras_vit's distilled "
                                  "models average a head on each token",
    "DeiTModel": "its pooler reads the class token alone, where keras_vit's distilled models "
                 "without a head average the class and distillation tokens",
}


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of DeiT's config.json: a distillation token, and a head on each token
    where the weights have them (a config of num_labels 0 has none: the output is the mean of
    the two tokens)."""
    transformers_common.check_activation(config.get("hidden_act", "gelu"))
    # position rows: the class token's, the distillation token's
    patch, image_size = transformers_common.vit_patches(config, state, CLASSES[architecture], 2)
    head = state.get("cls_classifier.weight")
    return transformers_common.vit_spec(
        config, patch, image_size, include_top=head is not None, distillation_token=True,
        num_classes=1 if head is None else int(head.shape[0]))


def config_for(spec, preprocessing=None, arrays=None):
    """transformers' DeiT config.json for a model with a distillation token, or a LayoutError
    for what it cannot express."""
    transformers_common.check_vit(spec, "DeiT")
    return transformers_common.vit_config(spec, "deit", "DeiTForImageClassificationWithTeacher",
                                          labelled=True)


def weight_pairs(spec):
    return transformers_common.vit_pairs(
        spec, "deit.", transformers_common.VIT_NAMES,
        [("head", "cls_classifier"), ("head_dist", "distillation_classifier")])


FAMILY = Family(name="DeiT", library="transformers", classes=CLASSES,
                model_types={"deit": "DeiTModel"}, refuses=REFUSED,
                spec_from_config=spec_from_config,
                writes=lambda spec: spec.distillation_token,
                config_for=config_for, weight_pairs=weight_pairs)

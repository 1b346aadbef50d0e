"""transformers' MetaCLIP 2 vision tower: `MetaClip2VisionModel`,
`MetaClip2VisionModelWithProjection` and the `vision_model.` of a whole `MetaClip2Model`.

MetaCLIP 2 (Chuang et al., "Meta CLIP 2: A Worldwide Scaling Recipe", 2025) trains OpenAI CLIP's
architecture on worldwide image-text pairs. transformers' `models/metaclip_2/
modular_metaclip_2.py` builds its classes from CLIP's: the same weight names, config fields and
defaults (quick GELU, epsilon 1e-5), so its files are read as CLIP's are
(`transformers_common.clip_spec`, `vision_model`) under other class names. A model of those
options is written as `CLIPVisionModel` (or `CLIPVisionModelWithProjection`), the same
computation; this family only reads.
"""

from keras_vit.weights.torch_layouts import transformers_common
from keras_vit.weights.torch_layouts.family import Family

# Its classes -> the prefix of their encoder's weights.
CLASSES = {"MetaClip2VisionModel": "", "MetaClip2VisionModelWithProjection": "vision_model."}
# Its classes keras_vit does not read, with why. (A whole model's files hold its classifier's
# tower too: loading that alone would drop the head the files are for.)
REFUSED = {
    "MetaClip2ForImageClassification": "its classifier reads the mean of the patch tokens "
                                       "before any norm, the class token left out (keras_vit's "
                                       "classifier 'gap' with class_token=True, pre_norm=True "
                                       "and final_norm 'none'), which keras_vit does not map to "
                                       "its files yet; the vision tower alone loads from "
                                       "MetaClip2VisionModel's or MetaClip2Model's files",
}


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of MetaCLIP 2's vision `config.json`, as CLIP's
    (`transformers_common.clip_spec`)."""
    return transformers_common.clip_spec(config, state, CLASSES[architecture])


def vision_tower(config, state, projection):
    """A whole MetaClip2Model's image encoder, with its visual_projection where `projection`
    (`transformers_common.vision_model`)."""
    architecture = (config.get("architectures") or [None])[0]
    if config.get("model_type") != "metaclip_2" or architecture in REFUSED:
        return None
    return transformers_common.vision_model(config, state, "MetaClip2VisionModel", projection)


FAMILY = Family(name="MetaCLIP 2", library="transformers", classes=CLASSES,
                model_types={"metaclip_2_vision_model": "MetaClip2VisionModel",
                             "metaclip_2": "MetaClip2Model"},
                refuses=REFUSED, vision_tower=vision_tower, spec_from_config=spec_from_config)

"""transformers' ViT-MAE encoder: `ViTMAEModel` and the `vit.` of `ViTMAEForPreTraining`.

ViT-MAE's encoder (He et al., "Masked Autoencoders Are Scalable Vision Learners", 2022) is
ViT's layout without its pooler, so its models are written as ViT's (`transformers_vit`); this
family only reads. Its fixed 2-D sin-cos position embeddings are saved with the weights (class
token row zero) and load as learned ones, exactly; keras_vit's "sincos_2d" uses other
frequencies (big_vision's) and no class row.
"""

import logging

from keras_vit.weights.torch_layouts import transformers_common
from keras_vit.weights.torch_layouts.common import tensor
from keras_vit.weights.torch_layouts.family import Family

logger = logging.getLogger(__name__)


def spec_from_config(config, state, architecture):
    """The `ViTConfig` of ViT-MAE's config.json: ViT's without a head; its masking, which drops
    a random `mask_ratio` of the patches in pre-training, left out with a log line (the
    encoder reads them all in fine-tuning)."""
    transformers_common.check_activation(config.get("hidden_act", "gelu"))
    mask_ratio = config.get("mask_ratio", 0.75)  # transformers' default
    if mask_ratio:
        logger.info("Left out ViT-MAE's mask_ratio %s: keras_vit's encoder reads every patch in "
                    "order, as transformers' ViTMAEModel does with mask_ratio=0.0.", mask_ratio)
    return transformers_common.spec_from_vit(config, state, "", classifier=False)


def vision_tower(config, state, projection):
    """`(config, state)` of the encoder (`vit.`) of a ViTMAEForPreTraining, as ViTMAEModel's;
    the decoder, which reconstructs masked patches in pre-training, dropped with a log line."""
    if (config.get("architectures") or [None])[0] != "ViTMAEForPreTraining":
        return None
    encoder = {key[len("vit."):]: value for key, value in state.items()
               if key.startswith("vit.")}
    if not encoder:
        tensor(state, "vit.embeddings.patch_embeddings.projection.weight", "transformers")
    dropped = sorted({key.split(".")[0] for key in state if not key.startswith("vit.")})
    logger.info("Loaded the encoder (vit.) of transformers' ViTMAEForPreTraining and left out "
                "%s: keras_vit's model is the image encoder alone.", ", ".join(dropped))
    return {**config, "architectures": ["ViTMAEModel"]}, encoder


FAMILY = Family(name="ViT-MAE", library="transformers", classes={"ViTMAEModel": ""},
                model_types={"vit_mae": "ViTMAEModel"}, vision_tower=vision_tower,
                spec_from_config=spec_from_config)

"""What a run's training images get beyond crop and flip: RandAugment, Mixup, CutMix and random
erasing, as config fields, with the AugReg paper's named levels as presets.

AugReg ("How to train your ViT? Data, Augmentation, and Regularization in Vision Transformers",
Steiner et al., 2021, arXiv:2106.10270) names its augmentation levels by RandAugment's (layers,
magnitude) and Mixup's alpha; the values are those of its public configs
(google-research/big_vision, `configs/vit_i1k.py`): `--config.augment=medium2`. A field given
on its own (`--config.mixup_alpha=0.8`) replaces the preset's value. CutMix, the chance of
CutMix instead of Mixup and random erasing are DeiT's ("Training data-efficient image
transformers", Touvron et al., 2021; facebookresearch/deit `main.py`: cutmix 1.0, switch 0.5,
erasing 0.25). A DeiT-style run:

    --config.augment=none --config.randaugment_layers=2 --config.randaugment_magnitude=9 \
    --config.mixup_alpha=0.8 --config.cutmix_alpha=1.0 --config.random_erasing=0.25 \
    --config.label_smoothing=0.1 --config.model.drop_path_rate=0.1

No TensorFlow here: train.run.config_checks reads this before anything loads it. The ops are in
train/data/randaugment.py (per image) and train/data/mixing.py (per pair of images).
"""

import dataclasses

# AugReg's levels: (RandAugment layers, RandAugment magnitude, Mixup alpha). light1 is
# RandAugment at magnitude 0, which still changes images (see train/data/randaugment.py).
PRESETS = {
    "none": (0, 0.0, 0.0),
    "light1": (2, 0.0, 0.0),
    "light2": (2, 10.0, 0.2),
    "medium1": (2, 15.0, 0.2),
    "medium2": (2, 15.0, 0.5),
    "strong1": (2, 20.0, 0.5),
    "strong2": (2, 20.0, 0.8),
}

# The config fields of this module and their rules (as train.run.config_checks reads them);
# `problems` checks them together.
RULES = {
    "augment": ("choice", tuple(PRESETS)),
    "randaugment_layers": ("optional_int", (0, 8)),
    "randaugment_magnitude": ("optional_float", (0.0, 30.0, True)),
    "mixup_alpha": ("optional_float", (0.0, None, False)),
    "cutmix_alpha": ("float", (0.0, None, False)),
    "cutmix_switch_prob": ("float", (0.0, 1.0, True)),
    "random_erasing": ("float", (0.0, 1.0, True)),
}
FIELDS = tuple(RULES)


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """The augmentation of a run, resolved from its config (`of`)."""

    randaugment_layers: int = 0  # RandAugment ops applied in turn to each image; 0 off
    randaugment_magnitude: float = 0.0  # their strength, 0 to 30 (10: the scale's reference)
    mixup_alpha: float = 0.0  # Mixup's Beta(alpha, alpha); 0 off
    cutmix_alpha: float = 0.0  # CutMix's Beta(alpha, alpha); 0 off
    cutmix_switch_prob: float = 0.5  # with both on: the chance that a pair is cut, not mixed
    random_erasing: float = 0.0  # the chance that an image has a box replaced by noise

    @property
    def mixes(self):
        """Whether pairs of images (and their labels) are mixed."""
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    @property
    def active(self):
        return self.randaugment_layers > 0 or self.mixes or self.random_erasing > 0


def _preset(config):
    """(RandAugment layers, magnitude, Mixup alpha) of `config.augment` ("none" if unset)."""
    return PRESETS.get(config.get("augment") or "none", PRESETS["none"])


def of(config):
    """The `Augmentation` of `config` (a ConfigDict or a config.json's dict): its preset
    (`augment`) with the fields given on their own (not None) in place of the preset's. A
    config without these fields (a run saved before them) has none."""
    layers, magnitude, mixup_alpha = _preset(config)

    def given(value, default):
        return default if value is None else value

    defaults = Augmentation()
    return Augmentation(
        randaugment_layers=given(config.get("randaugment_layers"), layers),
        randaugment_magnitude=given(config.get("randaugment_magnitude"), magnitude),
        mixup_alpha=given(config.get("mixup_alpha"), mixup_alpha),
        cutmix_alpha=given(config.get("cutmix_alpha"), defaults.cutmix_alpha),
        cutmix_switch_prob=given(config.get("cutmix_switch_prob"),
                                 defaults.cutmix_switch_prob),
        random_erasing=given(config.get("random_erasing"), defaults.random_erasing))


def problems(config, per_replica_batch):
    """What is wrong with the augmentation of `config` beyond each field's own range (`RULES`),
    as `(fields, values, what is valid)` triples."""
    found = []
    augmentation = of(config)
    given = tuple(name for name in FIELDS if name in config)
    shown = (f"config.augment={config.get('augment')!r} (RandAugment "
             f"{augmentation.randaugment_layers} x {augmentation.randaugment_magnitude:g}, "
             f"mixup_alpha {augmentation.mixup_alpha:g}, cutmix_alpha "
             f"{augmentation.cutmix_alpha:g}, random_erasing {augmentation.random_erasing:g})")
    if (augmentation.randaugment_layers and not _preset(config)[0]
            and config.get("randaugment_magnitude") is None):
        found.append((given, shown, "RandAugment's layers are given but not its magnitude, and "
                      "the level has none: set config.randaugment_magnitude (DeiT: 9) or pick "
                      "a level with RandAugment"))
    if augmentation.mixes and per_replica_batch % 2:
        found.append((given, shown, "Mixup and CutMix mix each image with its neighbour in the "
                      f"stream, so each replica's batch must be even, not {per_replica_batch}: "
                      "change config.batch_size"))
    if augmentation.active and config.get("objective") not in (None, "classification"):
        found.append((given, shown, "augmentation is for classification: masked patch "
                      "prediction's targets are the pixels it would change; use "
                      "config.augment='none' and leave the other augmentation fields unset"))
    return found

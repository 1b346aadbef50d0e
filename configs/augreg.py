"""The AugReg study's base (`python -m train.studies.ablate --study=augreg`): the ablation
studies' small plain ViT (configs/ablation.py) on a tenth of the Fashion-MNIST training images
(6,000), for 32 epochs, where regularisation matters more than on the whole split.

    python -m train.studies.ablate --study=augreg --out=docs/ablations

The study's arms set `config.augment` to AugReg's levels (train/data/augmentation.py); everything
else is this config's.
"""

from . import ablation


def get_config():
    config = ablation.get_config()
    config.train_split = "train[:10%]"  # the first 6,000 training images
    config.total_steps = 1_500  # 192,000 images: 32 epochs of the 6,000
    config.warmup_steps = 150
    config.checkpoint_every_steps = 500
    return config

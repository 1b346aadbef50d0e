"""AugReg's transfer recipe: an AugReg ImageNet-21k checkpoint ("How to train your ViT?",
Steiner et al., 2021) fine-tuned with the settings of google-research/vision_transformer's
`vit_jax/configs/augreg.py`: SGD with momentum 0.9, learning rate 0.03, no weight decay, no
dropout or stochastic depth and no augmentation beyond crop and flip ("no AugReg during
fine-tuning"), gradient clipping at 1.0, batch 512, 100 warm-up steps then cosine decay,
384x384. Unlike that file (500 steps; images resized to 448, then cropped to 384), the steps
per dataset are configs/finetune.py's (the paper's), and the crop is the inception crop of
every training run here.

    python -m train.main --config=configs/augreg_finetune.py:model=B/16,dataset=cifar100 \
        --workdir=gs://bucket/run --tpu=local

The argument is `key=value` pairs: `model` (a variant with an AugReg checkpoint: Ti/16, S/16,
S/32, B/8, B/16, B/32, L/16) and `dataset` (a TFDS name); the steps per dataset are
configs/finetune.py's. Layer-wise learning-rate decay is not part of the recipe; add it with
`--config.layer_decay=0.75`.
"""

from . import finetune


def get_config(arg=None):
    args = finetune.parse_arg(arg, model="B/16", dataset="cifar100")
    config = finetune.get_config(f"model={args['model']},dataset={args['dataset']}")
    config.pretrained = "augreg-i21k"
    config.learning_rate = 0.03
    config.warmup_steps = min(100, config.total_steps // 10)
    config.model.dropout = 0.0
    config.model.drop_path_rate = 0.0
    config.augment = "none"
    return config

"""The offline default: a small hybrid ViT on the real Fashion-MNIST (Debian's
dataset-fashion-mnist), about 10 minutes on 2 CPU cores.

    python -m train.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart

The model is the paper's R+ViT-Ti (ResNet stem, then a ViT on its stride-4 feature map) made
small: 7x7 tokens of width 96, 4 blocks. On short budgets the convolutional stem learns much
faster than 4x4 pixel patches (85.6% vs 78.7% test accuracy after 500 steps, measured here).
"""

from . import common


def get_config():
    config = common.get_config()
    config.model = "R+Ti/16"
    config.image_size = 28
    config.patch_size = 1  # 1x1 patches of the 7x7 ResNet-stem feature map
    config.hidden_size = 96
    config.mlp_dim = 192
    config.num_heads = 4
    config.num_layers = 4
    config.dataset = "fashion_mnist_local"
    config.crop_min_area = 1.0  # 28px centred items: flips only, no crops
    config.optimizer = "adamw"
    config.learning_rate = 3e-3
    config.weight_decay = 0.05
    config.batch_size = 256
    config.eval_batch_size = 1000
    config.total_steps = 1_500
    config.warmup_steps = 100
    config.steps_per_loop = 100
    config.eval_every_steps = 500
    config.checkpoint_every_steps = 500
    config.shuffle_buffer = 60_000
    config.jit_compile = True  # XLA: 717 img/s against 550 without, on 2 Xeon cores
    return config

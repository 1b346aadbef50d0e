"""The offline default: a small ViT on the real Fashion-MNIST (Debian's dataset-fashion-mnist).

    python -m train.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart
"""

from configs import common


def get_config():
    config = common.get_config()
    config.model = "Ti/16"
    config.image_size = 28
    config.patch_size = 4  # 7x7 grid of 4x4 patches
    config.hidden_size = 96
    config.mlp_dim = 192
    config.num_heads = 4
    config.num_layers = 4
    config.dataset = "fashion_mnist_local"
    config.crop_min_area = 0.6
    config.optimizer = "adamw"
    config.learning_rate = 2e-3
    config.weight_decay = 0.05
    config.batch_size = 256
    config.eval_batch_size = 1000
    config.total_steps = 1_500
    config.warmup_steps = 200
    config.steps_per_loop = 100
    config.eval_every_steps = 500
    config.checkpoint_every_steps = 500
    config.shuffle_buffer = 60_000
    return config

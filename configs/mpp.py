"""Self-supervised pre-training by masked patch prediction (paper section 4.6, appendix B.1.2).

    python -m train.main --config=configs/mpp.py --workdir=runs/mpp                 # offline
    python -m train.main --config=configs/mpp.py:model=B/16,dataset=imagenet2012 \
        --workdir=gs://bucket/mpp --tpu=local
    python -m train.main --config=configs/mpp_finetune.py \
        --config.pretrained=runs/mpp/export/encoder.npz --workdir=runs/mpp_finetune

Half of each image's patch embeddings are corrupted (80% become a learned [mask] embedding, 10%
another patch's embedding, 10% stay) and the model predicts each corrupted patch's mean colour
in 3 bits per channel (512 classes) from its final token. The run exports the encoder without
any head: `export/model.keras` and `export/encoder.npz`.

The encoder pools by global average (`classifier="gap"`): this loss trains every patch's final
token and never the class token's, so a class token would stay an untrained summary. The
fine-tuning config keeps GAP.

No argument: the offline default, a small plain ViT on the real Fashion-MNIST within 10 minutes
on 2 CPU cores. With `key=value` arguments (`model`, a keras_vit variant, and `dataset`, a TFDS
name): the paper's recipe, Adam at base learning rate 2e-4 with 10k warm-up steps and cosine
decay, batch 4096, 224x224; 100k steps, where the paper saw the gains flatten out.
"""

from . import common
from .finetune import EVAL_SPLIT, parse_arg


def get_config(arg=None):
    config = common.get_config()
    config.objective = "masked_patch_prediction"
    config.model.classifier = "gap"
    config.mpp_target = "mean_color"
    config.mpp_corruption_rate = 0.5
    config.mpp_mask_rate = 0.8
    config.mpp_random_rate = 0.1
    config.optimizer = "adam"
    config.beta_1, config.beta_2 = 0.9, 0.999
    config.decay = "cosine"
    config.grad_clip_norm = 1.0
    if arg:
        args = parse_arg(arg, model="B/16", dataset="imagenet2012")
        config.model.variant = args["model"]
        config.dataset = args["dataset"]
        config.eval_split = EVAL_SPLIT.get(args["dataset"], "test")
        config.image_size = 224
        config.learning_rate = 2e-4
        config.warmup_steps = 10_000
        config.total_steps = 100_000
        config.batch_size = 4096
        config.eval_batch_size = 4096
        config.crop_min_area = 0.05
        config.dtype_policy = "mixed_bfloat16"
        config.eval_every_steps = 5_000
        config.checkpoint_every_steps = 5_000
        return config
    offline_model(config)
    config.jit_compile = True  # XLA: 830 img/s against 540 without, on 2 Xeon cores
    config.learning_rate = 1e-3
    config.batch_size = 256
    config.eval_batch_size = 1000
    config.total_steps = 1_200  # 307,200 images, 5.1 epochs
    config.warmup_steps = 100
    config.steps_per_loop = 100
    config.eval_every_steps = 600
    config.checkpoint_every_steps = 300
    return config


def offline_model(config):
    """The offline default's model and data (shared with configs/mpp_finetune.py): 4x4-pixel
    patches of the 28x28 images, a 7x7 grid of 49 tokens."""
    config.model.variant = "Ti/16"  # a plain ViT: the sizes below replace all of Ti/16's
    config.image_size = 28
    config.model.patch_size = 4
    config.model.hidden_size = 96
    config.model.mlp_dim = 192
    config.model.num_heads = 3
    config.model.num_layers = 4
    config.dataset = "fashion_mnist_local"
    config.crop_min_area = 1.0  # 28px centred items: flips only, no crops
    config.shuffle_buffer = 10_000

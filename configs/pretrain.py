"""Pre-training from scratch as in the paper (section 4.1 and appendix B.1).

Adam (b1 0.9, b2 0.999) with decoupled weight decay 0.1 (0.03 on ImageNet-21k), batch 4096, 10k steps of linear
warm-up then linear decay, dropout 0.1, 224x224, and the tanh pre-logits head.

    python -m train.main --config=configs/pretrain.py:model=B/16,dataset=imagenet2012 \
        --workdir=gs://bucket/pretrain --tpu=local

The argument is `key=value` pairs: `model` (a keras_vit variant) and `dataset` (a TFDS name).
"""

import keras_vit
from configs import common
from configs.finetune import EVAL_SPLIT, parse_arg

# 300 epochs of ImageNet-1k (1,281,167 images) or 90 of ImageNet-21k at batch 4096.
TOTAL_STEPS = {"imagenet2012": 93_834, "imagenet21k": 300_000}


def get_config(arg=None):
    args = parse_arg(arg, model="B/16", dataset="imagenet2012")
    config = common.get_config()
    config.model = args["model"]
    config.dataset = args["dataset"]
    config.eval_split = EVAL_SPLIT.get(args["dataset"], "test")
    config.image_size = 224
    # The pre-training head: tanh pre-logits as wide as the model.
    config.representation_size = keras_vit.parse_variant(args["model"]).hidden_size
    config.dropout = 0.1
    config.optimizer = "adamw"
    config.beta_1, config.beta_2 = 0.9, 0.999
    config.weight_decay = 0.03 if args["dataset"] == "imagenet21k" else 0.1  # per the authors
    config.learning_rate = 1e-3
    config.batch_size = 4096
    config.eval_batch_size = 4096
    config.total_steps = TOTAL_STEPS.get(args["dataset"], 100_000)
    config.warmup_steps = 10_000
    config.decay = "linear"
    config.grad_clip_norm = 1.0
    config.crop_min_area = 0.05
    config.dtype_policy = "mixed_bfloat16"
    config.eval_every_steps = 5_000
    config.checkpoint_every_steps = 5_000
    return config

"""Pre-training from scratch as in the paper (section 4.1 and appendix B.1).

Adam (b1 0.9, b2 0.999) with decoupled weight decay, batch 4096, 10k steps of linear warm-up,
dropout 0.1, 224x224, and the tanh pre-logits head. Learning rate, decay and weight decay per
dataset as in the paper's Table 3: ImageNet-1k 3e-3, cosine, 0.3; ImageNet-21k 1e-3, linear, 0.03;
any other dataset section 4.1's 1e-3, linear, 0.1.

    python -m train.main --config=configs/pretrain.py:model=B/16,dataset=imagenet2012 \
        --workdir=gs://bucket/pretrain --tpu=local

The argument is `key=value` pairs: `model` (a keras_vit variant) and `dataset` (a TFDS name).
"""

from keras_vit.architecture.spec import ViTConfig

from . import common
from .finetune import EVAL_SPLIT, parse_arg

# 300 epochs of ImageNet-1k (1,281,167 images) or 90 of ImageNet-21k at batch 4096.
TOTAL_STEPS = {"imagenet2012": 93_834, "imagenet21k": 300_000}
# (learning rate, decay, weight decay): the paper's Table 3, and section 4.1 for the others.
RECIPES = {"imagenet2012": (3e-3, "cosine", 0.3), "imagenet21k": (1e-3, "linear", 0.03)}
DEFAULT_RECIPE = (1e-3, "linear", 0.1)


def get_config(arg=None):
    args = parse_arg(arg, model="B/16", dataset="imagenet2012")
    config = common.get_config()
    config.model.variant = args["model"]
    config.dataset = args["dataset"]
    config.eval_split = EVAL_SPLIT.get(args["dataset"], "test")
    config.image_size = 224
    # The pre-training head: tanh pre-logits as wide as the model.
    config.model.representation_size = ViTConfig.from_variant(args["model"]).hidden_size
    config.model.dropout = 0.1
    config.optimizer = "adamw"
    config.beta_1, config.beta_2 = 0.9, 0.999
    config.learning_rate, config.decay, config.weight_decay = RECIPES.get(args["dataset"],
                                                                          DEFAULT_RECIPE)
    config.batch_size = 4096
    config.eval_batch_size = 4096
    config.total_steps = TOTAL_STEPS.get(args["dataset"], 100_000)
    config.warmup_steps = 10_000
    config.grad_clip_norm = 1.0
    config.crop_min_area = 0.05
    config.dtype_policy = "mixed_bfloat16"
    config.eval_every_steps = 5_000
    config.checkpoint_every_steps = 5_000
    return config

"""The paper's transfer recipe (appendix B.1.1 and the public fine-tuning configs).

SGD with momentum 0.9, no weight decay, global-norm clipping at 1.0, batch 512, 384x384,
linear warm-up then cosine decay to 0, from a pre-trained checkpoint with a new zero head.

    python -m train.main --config=configs/finetune.py:model=B/16,dataset=cifar10 \
        --config.pretrained=imagenet21k --workdir=gs://bucket/run --tpu=local

The argument is `key=value` pairs: `model` (a keras_vit variant) and `dataset` (a TFDS name).
"""

from . import common

# Steps of the published fine-tuning runs (paper appendix B.1.1).
TOTAL_STEPS = {
    "cifar10": 10_000,
    "cifar100": 10_000,
    "imagenet2012": 20_000,
    "oxford_iiit_pet": 500,
    "oxford_flowers102": 500,
}
# Splits where a dataset's evaluation split is not called "test".
EVAL_SPLIT = {"imagenet2012": "validation"}


def parse_arg(arg, **defaults):
    """Parses "key=value,key=value" into a dict (values stay strings; nothing is evaluated)."""
    values = dict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in defaults:
            raise ValueError(
                f"Config argument {item!r}: expected key=value with key in {sorted(defaults)}.")
        values[key] = value
    return values


def get_config(arg=None):
    args = parse_arg(arg, model="B/16", dataset="cifar10")
    config = common.get_config()
    config.model.variant = args["model"]
    config.dataset = args["dataset"]
    config.eval_split = EVAL_SPLIT.get(args["dataset"], "test")
    config.image_size = 384
    config.pretrained = "imagenet21k"
    config.optimizer = "sgd"
    config.momentum = 0.9
    config.weight_decay = 0.0
    config.grad_clip_norm = 1.0
    config.batch_size = 512
    config.learning_rate = 0.03
    config.decay = "cosine"
    config.total_steps = TOTAL_STEPS.get(args["dataset"], 10_000)
    # 500 warm-up steps, but a tenth of the run for the 500-step ones, so they still decay.
    config.warmup_steps = min(500, config.total_steps // 10)
    config.crop_min_area = 0.05
    config.eval_every_steps = 1_000
    config.checkpoint_every_steps = 1_000
    return config

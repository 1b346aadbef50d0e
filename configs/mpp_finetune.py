"""Fine-tunes the offline masked-patch-prediction encoder (configs/mpp.py) on the labelled
Fashion-MNIST, with a new zero-initialised head; with `pretrained=''` (the default) the same
recipe trains the same model from scratch, for comparison.

    python -m train.main --config=configs/mpp_finetune.py \
        --config.pretrained=runs/mpp/export/encoder.npz --workdir=runs/mpp_finetune
    python -m train.main --config=configs/mpp_finetune.py:labels=1000 \
        --config.pretrained=runs/mpp/export/encoder.npz --workdir=runs/mpp_finetune_1000

The argument `labels=N` trains on the first N training images only (their labels are the only
ones used); the default is all 60,000. `--config.pretrained` also takes the exported
`model.keras`. The model is configs/mpp.py's, pooled by global average as it was pre-trained.
"""

from . import common, mpp
from .finetune import parse_arg


def get_config(arg=None):
    args = parse_arg(arg, labels="all")
    config = common.get_config()
    mpp.offline_model(config)
    config.model.classifier = "gap"
    config.pretrained = ""
    config.jit_compile = True
    config.optimizer = "adamw"
    config.learning_rate = 1e-3
    config.weight_decay = 0.05
    config.eval_batch_size = 1000
    config.export = False
    if args["labels"] == "all":
        config.batch_size = 256
        config.total_steps = 1_500
        config.warmup_steps = 100
    else:
        try:
            labels = int(args["labels"])
        except ValueError:
            raise ValueError(f"labels={args['labels']!r}: give a number of training images, "
                             "or 'all'.") from None
        config.train_split = f"train[:{labels}]"
        config.batch_size = min(128, labels)
        config.total_steps = 500
        config.warmup_steps = 50
    config.steps_per_loop = 100
    config.eval_every_steps = config.total_steps
    config.checkpoint_every_steps = 500
    return config

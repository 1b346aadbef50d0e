"""The optimizer of a run (`config.optimizer`), the same for both engines: its learning rate per
weight (layer-wise decay) and which weights decay.

- Weight decay (`config.weight_decay`, adamw only, decoupled: each step multiplies a weight by
  1 - rate x weight_decay) applies to the kernels of dense and convolutional layers only: not
  to biases, norms' scales and offsets, position embeddings, the class, register and mask
  tokens, LayerScale factors or the attention-pooling probe (big_vision decays `.*/kernel$`;
  timm skips 1-D weights and its embeddings and tokens).
- Layer-wise learning-rate decay (`config.layer_decay`, for fine-tuning; "BEiT", Bao et al.,
  2022, and facebookresearch/mae `util/lr_decay.py`): with depth D, a weight of block i (from 0)
  learns at rate x decay^(D - i), those before the first block (patch embedding, ResNet stem,
  position embeddings, tokens) at rate x decay^(D + 1), those after the last (final norm,
  pooling, head) at the rate itself. Weight decay follows each weight's rate.

Keras is imported when an optimizer is built, not on import: train.config_checks reads
`OPTIMIZERS` before anything loads Keras or TensorFlow.
"""

import re

OPTIMIZERS = ("sgd", "adam", "adamw")

# Layers (the first name of a weight's path, or any name in it for the encoder blocks) that
# come before the blocks and after them; a weight of none of them is an error under layer-wise
# decay (a new layer must be placed here).
BLOCK = re.compile(r"^encoderblock_(\d+)(_row|_column)?$")
BEFORE_BLOCKS = ("embedding", "posembed_input", "cls", "reg", "pre_norm", "resnet_root",
                 "mask_embedding")
BEFORE_BLOCKS_PATTERN = re.compile(r"^block\d+$")  # the ResNet stem's stages
AFTER_BLOCKS = ("encoder_norm", "fc_norm", "pre_logits", "head", "MAPHead_0", "mpp_head")


def decays(variable):
    """Whether weight decay applies to `variable` (a Keras variable): its kernels only."""
    return variable.name == "kernel"


def layer_scales(variables, decay):
    """The learning-rate factor of each of `variables` (Keras variables, a model's trainable
    ones) under layer-wise decay `decay` (see the module's docstring): a list of floats.
    Raises ValueError naming a variable of no known place."""
    blocks = [_block_index(variable.path) for variable in variables]
    depth = 1 + max((block for block in blocks if block is not None), default=-1)
    scales = []
    for variable, block in zip(variables, blocks):
        names = variable.path.split("/")
        if block is not None:
            layer = block + 1
        elif any(name in BEFORE_BLOCKS or BEFORE_BLOCKS_PATTERN.match(name) for name in names):
            layer = 0
        elif any(name in AFTER_BLOCKS for name in names):
            layer = depth + 1
        else:
            raise ValueError(f"config.layer_decay={decay}: the weight {variable.path} is "
                             "neither in an encoder block nor in a layer known to come before "
                             "or after them: set config.layer_decay=1.0, or add its layer's "
                             "name to BEFORE_BLOCKS or AFTER_BLOCKS in train/optimizers.py.")
        scales.append(float(decay ** (depth + 1 - layer)))
    return scales


def _block_index(path):
    """The encoder block (from 0) that the weight at `path` belongs to, or None."""
    for name in path.split("/"):
        match = BLOCK.match(name)
        if match:
            return int(match.group(1))
    return None


def build_optimizer(config):
    import keras

    from . import schedules

    schedule = schedules.WarmupDecay(config.learning_rate, config.warmup_steps,
                                     config.total_steps, config.decay)
    layer_decay = config.layer_decay
    weight_decay = config.weight_decay if config.optimizer == "adamw" else 0.0
    if config.optimizer == "sgd":
        base, options = keras.optimizers.SGD, {"momentum": config.momentum}
    else:
        base, options = keras.optimizers.Adam, {"beta_1": config.beta_1,
                                                "beta_2": config.beta_2}

    class Optimizer(base):
        """`base` with a learning-rate factor per weight and weight decay on kernels only:
        both in `update_step`, which each backend calls per weight with the step's rate."""

        def build(self, variables):
            super().build(variables)
            self.rate_scales = (layer_scales(variables, layer_decay) if layer_decay != 1.0
                                else [1.0] * len(variables))
            self.decayed = [decays(variable) for variable in variables]

        def update_step(self, gradient, variable, learning_rate):
            index = self._get_variable_index(variable)
            if self.rate_scales[index] != 1.0:
                learning_rate = learning_rate * self.rate_scales[index]
            if weight_decay and self.decayed[index]:
                # Keras' AdamW's decoupled decay: before the update, at the step's rate.
                rate = keras.ops.cast(learning_rate, variable.dtype)
                variable.assign(variable - variable * weight_decay * rate)
            super().update_step(gradient, variable, learning_rate)

    # Named as Keras' own optimizer of that name (its variables are named after it).
    class_name, name = {"sgd": ("SGD", "sgd"), "adam": ("Adam", "adam"),
                        "adamw": ("AdamW", "adam_w")}[config.optimizer]
    Optimizer.__name__ = class_name
    return Optimizer(schedule, name=name, **options)

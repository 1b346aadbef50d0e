"""The optimizer of a run (`config.optimizer`), the same for both engines: its learning rate per
weight (layer-wise decay) and which weights decay.

- Weight decay (`config.weight_decay`, adamw only, decoupled: each step multiplies a weight by
  1 - rate x weight_decay) applies to the kernels of dense and convolutional layers only
  (`keras_vit.ViTModel.decays` says why).
- Layer-wise learning-rate decay (`config.layer_decay`, for fine-tuning; "BEiT", Bao et al.,
  2022, and facebookresearch/mae `util/lr_decay.py`): with depth D, a weight of block i (from 0)
  learns at rate x decay^(D - i), those before the first block (patch embedding, ResNet stem,
  position embeddings, tokens) at rate x decay^(D + 1), those after the last (final norm,
  pooling, head) at the rate itself. Weight decay follows each weight's rate.

The model says which weights these are (`keras_vit.ViTModel.decays` and `layer_indices`): this
module names no layer.
"""

import keras

from .schedules import DECAYS, WarmupDecay

OPTIMIZERS = ("sgd", "adam", "adamw")

# The optimizer's config fields and their rules (as train.run.config_checks reads them); `check`
# adds the ones between fields. It reads `FIELDS`: these, and how long the run is.
RULES = {
    "optimizer": ("choice", OPTIMIZERS),
    "learning_rate": ("float_above", (0.0, None, False)),
    "warmup_steps": ("int", (0, None)),  # and <= total_steps
    "decay": ("choice", DECAYS),
    "momentum": ("float", (0.0, 1.0, False)),
    "beta_1": ("float", (0.0, 1.0, False)),
    "beta_2": ("float", (0.0, 1.0, False)),
    "weight_decay": ("float", (0.0, None, False)),
    "layer_decay": ("float_above", (0.0, 1.0, True)),
}
FIELDS = (*RULES, "total_steps")


def check(config, report):
    """Adds to `report` (train.run.config_checks) what is wrong with the fields together."""
    if report.ok("warmup_steps", "total_steps") and config.warmup_steps > config.total_steps:
        report.add("warmup_steps", f"config.warmup_steps={config.warmup_steps}",
                   f"must be at most config.total_steps={config.total_steps} (the warm-up is "
                   "part of the run)")


def warnings(config):
    """What in a valid config does nothing, worth a warning rather than an error."""
    if config.weight_decay > 0 and config.optimizer != "adamw":
        # Not an error: switching --config.optimizer keeps the config's decay.
        return [f"config.weight_decay={config.weight_decay!r} is ignored: it applies to "
                f"optimizer='adamw' only (config.optimizer={config.optimizer!r})."]
    return []


def layer_scales(model, variables, decay):
    """The learning-rate factor of each of `variables` (`model`'s trainable weights) under
    layer-wise decay `decay`: decay ** (D + 1 - depth), with D the model's encoder blocks and
    each weight's depth as the model gives it (`keras_vit.ViTModel.layer_indices`)."""
    if not hasattr(model, "layer_indices"):
        raise ValueError(f"config.layer_decay={decay}: layer-wise learning rates need a "
                         f"keras_vit model, which knows each weight's depth; {model.name!r} is "
                         "not one. Set config.layer_decay=1.0.")
    depth = model.num_blocks
    return [float(decay ** (depth + 1 - index)) for index in model.layer_indices(variables)]


def build_optimizer(config, model, fused_adam=None):
    """The optimizer of `config` for `model`, a keras_vit model: it says which of its weights
    decay (`decays`) and how deep each lies (`layer_indices`). `fused_adam`: None (Keras' own
    ops), or a backend's kernel for Adam's update and the decay before it, called as
    `fused_adam(optimizer, gradient, variable, learning_rate, weight_decay)`
    (train.engines.tf_fused_updates.adam_update)."""
    schedule = WarmupDecay(config.learning_rate, config.warmup_steps,
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
            self.rate_scales = (layer_scales(model, variables, layer_decay)
                                if layer_decay != 1.0 else [1.0] * len(variables))
            self.decayed = [model.decays(variable) for variable in variables]

        def update_step(self, gradient, variable, learning_rate):
            index = self._get_variable_index(variable)
            if self.rate_scales[index] != 1.0:
                learning_rate = learning_rate * self.rate_scales[index]
            decay = weight_decay if self.decayed[index] else 0.0
            if fused_adam is not None and base is keras.optimizers.Adam:
                fused_adam(self, gradient, variable, learning_rate, decay)
                return
            if decay:
                # Keras' AdamW's decoupled decay: before the update, at the step's rate.
                rate = keras.ops.cast(learning_rate, variable.dtype)
                variable.assign(variable - variable * decay * rate)
            super().update_step(gradient, variable, learning_rate)

    # Named as Keras' own optimizer of that name (its variables are named after it).
    class_name, name = {"sgd": ("SGD", "sgd"), "adam": ("Adam", "adam"),
                        "adamw": ("AdamW", "adam_w")}[config.optimizer]
    Optimizer.__name__ = class_name
    return Optimizer(schedule, name=name, **options)

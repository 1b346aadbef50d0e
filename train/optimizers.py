"""The optimizer of a run (`config.optimizer`), the same for both engines."""

import keras

from . import schedules


def build_optimizer(config):
    schedule = schedules.WarmupDecay(config.learning_rate, config.warmup_steps,
                                     config.total_steps, config.decay)
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(schedule, momentum=config.momentum)
    if config.optimizer == "adam":
        return keras.optimizers.Adam(schedule, beta_1=config.beta_1, beta_2=config.beta_2)
    optimizer = keras.optimizers.AdamW(schedule, weight_decay=config.weight_decay,
                                       beta_1=config.beta_1, beta_2=config.beta_2)
    # Decay the matrices only, not biases, norms, embeddings of positions or the class token.
    optimizer.exclude_from_weight_decay(
        var_names=["bias", "gamma", "beta", "pos_embedding", "cls"])
    return optimizer

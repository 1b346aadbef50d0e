"""The optimizer of a run (`config.optimizer`), the same for both engines.

Keras is imported when an optimizer is built, not on import: train.config_checks reads
`OPTIMIZERS` before anything loads Keras or TensorFlow.
"""

OPTIMIZERS = ("sgd", "adam", "adamw")


def build_optimizer(config):
    import keras

    from . import schedules

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

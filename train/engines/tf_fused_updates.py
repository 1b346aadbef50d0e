"""Keras' Adam and AdamW updates as TensorFlow's fused training kernels, for a TensorFlow step
that runs op by op (no XLA).

Keras' `Adam.update_step` is eleven element-wise ops, and its decoupled weight decay three more:
run one by one, each reads and writes a weight-sized tensor, so on ViT-B/16 (86 million weights)
the update read and wrote about 20 GB per step. `ResourceApplyAdam` does the same update in one
pass over the weight and its two moments, and `ResourceApplyGradientDescent` the decay in one
pass over the weight (TensorFlow's `training_ops`, whose Adam is Keras' formula: the same
`alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)` and `epsilon` outside the square root).
Under XLA the ops fuse anyway, so the engine asks for these only where the step is not
compiled (`TFEngine`)."""

import tensorflow as tf


def adam_update(optimizer, gradient, variable, learning_rate, weight_decay):
    """What `keras.optimizers.Adam.update_step` (amsgrad off) does to `variable` and its
    moments, after decoupled weight decay `weight_decay` at `learning_rate` (0: none) as
    Keras' AdamW applies it: `variable -= variable * weight_decay * learning_rate`.

    `optimizer` is the Keras Adam that owns the moments; `variable` a `tf.Variable` (a
    replica's component under a tf.distribute strategy, as Keras' update step gets it)."""
    dtype = variable.dtype
    rate = tf.cast(learning_rate, dtype)
    if weight_decay:
        tf.raw_ops.ResourceApplyGradientDescent(
            var=variable.handle, alpha=rate * tf.cast(weight_decay, dtype),
            delta=variable.read_value(), use_locking=False)
    index = optimizer._get_variable_index(variable)
    step = tf.cast(optimizer.iterations + 1, dtype)
    beta_1, beta_2 = tf.cast(optimizer.beta_1, dtype), tf.cast(optimizer.beta_2, dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=variable.handle, m=optimizer._momentums[index].value.handle,
        v=optimizer._velocities[index].value.handle, beta1_power=tf.pow(beta_1, step),
        beta2_power=tf.pow(beta_2, step), lr=rate, beta1=beta_1, beta2=beta_2,
        epsilon=tf.cast(optimizer.epsilon, dtype), grad=tf.cast(gradient, dtype),
        use_locking=False)

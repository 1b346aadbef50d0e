"""What a training step and an evaluation compute, written once in `keras.ops` for both engines
(vit_jax's `utils.accumulate_gradient` plays this part for its two trainers): the weighted loss
of a batch, gradients summed over micro-batches, the mean gradient clipped by its global norm,
the weights' moving average, and the sums an evaluation adds up. Each engine only takes the
gradients (a `tf.GradientTape`, `jax.value_and_grad`), places the work on its devices and
compiles it.

A batch's loss is a weighted mean over its items (examples, or the corrupted patches of masked
patch prediction), so the step keeps sums (of the weighted losses and of the weights) until the
whole global batch is counted: the mean gradient is then the same whatever the micro-batches or
replicas each held.
"""

from keras import ops


def loss_sums(objective, model, batch, training=True):
    """`(sum of the items' weighted losses, sum of their weights)` of `batch`."""
    losses, weights, _ = objective.item_losses(model, batch, training=training)
    return ops.sum(losses * weights), ops.sum(weights)


def accumulate(micro_batches, gradients_of):
    """`(gradients, loss sum, weight sum)` summed over `micro_batches` (a static list:
    unrolled), each from `gradients_of(micro_batch)`, which returns the same three."""
    gradients, loss_sum, count = None, 0.0, 0.0
    for micro in micro_batches:
        micro_gradients, micro_loss, micro_count = gradients_of(micro)
        gradients = micro_gradients if gradients is None else [
            total + more for total, more in zip(gradients, micro_gradients)]
        loss_sum, count = loss_sum + micro_loss, count + micro_count
    return gradients, loss_sum, count


def global_norm(arrays):
    """The L2 norm of all of `arrays` together (`tf.linalg.global_norm`, `optax.global_norm`)."""
    return ops.sqrt(ops.sum(ops.stack([ops.sum(ops.square(array)) for array in arrays])))


def clipped_mean(gradients, count, clip_norm, shares=1):
    """The gradient of the mean loss from `gradients` of the summed loss over `count` weights,
    clipped to global norm `clip_norm` (0: not clipped; as `tf.clip_by_global_norm`, only
    shrunk), and its norm before clipping. The mean, the clipping and a split into `shares`
    equal parts (each replica's, where the optimizer sums over replicas again) are one factor,
    so each gradient is read and written once."""
    norm = global_norm(gradients) / count
    scale = 1.0 / (count * shares)
    if clip_norm:
        scale = scale * ops.minimum(1.0, clip_norm / norm)
    return [gradient * ops.cast(scale, gradient.dtype) for gradient in gradients], norm


def moving_averages(averages, weights, decay):
    """The weights' exponential moving averages (EMA, Polyak averaging) after one more step."""
    return [decay * average + (1.0 - decay) * weight
            for average, weight in zip(averages, weights)]


def eval_sums(objective, model, batch):
    """`(correct, loss, weight, examples)` summed over `batch`, its padding (`mask` 0) left
    out: what `eval_results` adds up over the eval split."""
    losses, weights, correct = objective.item_losses(model, batch, training=False)
    mask = batch["mask"]
    weights = weights * ops.reshape(mask, [-1] + [1] * (len(weights.shape) - 1))
    correct = ops.zeros_like(losses) if correct is None else correct
    return (ops.sum(correct * weights), ops.sum(losses * weights), ops.sum(weights),
            ops.sum(mask))


def eval_results(batch_sums, expected_examples, has_accuracy):
    """`(accuracy or None, mean loss)` from each eval batch's `eval_sums`, after checking that
    every eval example was counted once."""
    correct = loss = count = examples = 0.0
    for sums in batch_sums:
        correct, loss, count, examples = (total + float(value) for total, value in zip(
            (correct, loss, count, examples), sums))
    if int(examples) != expected_examples:
        raise RuntimeError(f"Evaluated {int(examples)} examples, expected {expected_examples}.")
    return (correct / count if has_accuracy else None), loss / count

"""A layer's element-wise work in training as two XLA computations on TensorFlow: one for the
forward pass, one for the backward pass.

TensorFlow runs a training step op by op wherever XLA does not compile it (its CPU step without
`jit_compile`), and each op is a pass over the activations: the tanh-approximate GELU is eight
ops forward and about fifteen in its gradient, a layer norm a dozen. `for_training` wraps such a
function of tensors in `tf.custom_gradient`, running its forward pass as one
`tf.function(jit_compile=True)` and its backward pass (the forward again, then its gradient by
`tf.GradientTape`) as another, so XLA fuses each into a loop or two. A step that XLA compiles
whole inlines them. The backward pass keeps only the inputs, not the intermediates.

On a 2-core Intel Xeon, B/16 at batch 8 (`benchmarks/step_parts.py`): a block's GELU forward
and backward took 28.1 ms op by op and 3.8 ms as XLA computations, its layer norm 7.8 and 3.9 ms,
and the driver's training step ran 1.06-1.08x as fast (docs/speed.md). The attention's softmax is not among them:
TensorFlow's oneDNN softmax is one pass already, and the step was slower with it fused.

Everywhere else the layers call the function itself: on the other backends (JAX's step is one
XLA computation, PyTorch runs its own kernels), on TPU hosts (the whole step is one XLA
computation there), in inference (an exported SavedModel or LiteRT file must not need XLA to
run) and where this TensorFlow cannot compile with XLA."""

import functools

import keras


def for_training(fn, training, **static):
    """`fn` with the keyword arguments `static` bound: in training on TensorFlow, as two XLA
    computations with the same values and gradients (to float32 rounding); else `fn` itself.

    `fn` takes tensors positionally and returns one tensor; it must be a module-level function
    (compiled functions are kept per `fn` and `static`, so that twelve blocks share one)."""
    if not training or keras.backend.backend() != "tensorflow" or not _fusion_helps():
        return functools.partial(fn, **static)
    return _fused(fn, tuple(sorted(static.items())))


@functools.lru_cache(maxsize=None)
def _fused(fn, static):
    import tensorflow as tf

    bound = functools.partial(fn, **dict(static))
    forward = tf.function(bound, jit_compile=True, autograph=False)

    @functools.partial(tf.function, jit_compile=True, autograph=False)
    def backward(inputs, upstream):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = bound(*inputs)
        gradients = tape.gradient(outputs, inputs, output_gradients=upstream)
        return [tf.zeros_like(x) if g is None else g for x, g in zip(inputs, gradients)]

    @tf.custom_gradient
    def fused(*inputs):
        inputs = [tf.convert_to_tensor(x) for x in inputs]
        return forward(*inputs), lambda upstream: backward(inputs, upstream)

    return fused


@functools.lru_cache(maxsize=None)
def _fusion_helps():
    """Whether this TensorFlow compiles with XLA on its default device, on a machine without
    TPUs, whose step is one XLA computation anyway (checked once, eagerly, also when first
    asked while a graph is traced)."""
    import tensorflow as tf

    try:
        with tf.init_scope():
            if tf.config.list_logical_devices("TPU"):
                return False
            tf.function(lambda x: x + 1.0, jit_compile=True)(tf.constant(1.0))
    except (tf.errors.OpError, ValueError, NotImplementedError):
        return False
    return True

"""Where a training step's time goes, on the Keras backend of this process: the step's dense
matmuls at their own shapes against the square matmul peak, and on TensorFlow the optimizer's
update (AdamW over every weight) with Keras' element-wise ops and with TensorFlow's fused
kernels (train/engines/tf_fused_updates.py), and a block's GELU and layer norm, forward and
backward, op by op and as XLA computations (keras_vit/layers/fusion.py).

    python benchmarks/step_parts.py --variant=B/16 --image_size=224 --batch_size=8
    KERAS_BACKEND=jax python benchmarks/step_parts.py --variant=B/16 --image_size=224 \
        --batch_size=8

The matmuls are those of each encoder block: the fused query-key-value projection (D x 3D), the
output projection (D x D) and the MLP's two (D x F, F x D), on `batch x tokens` rows, each as the
forward product and the backward pass's two (the inputs' gradient, the weights' gradient). They
carry all but a few percent of the step's FLOPs (attention's products and the stem or patch
embedding are the rest), so their rate is about as fast as the step can be. Each figure is the
fastest of `--repeats` runs.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
import machine  # noqa: E402


def block_rows(config, batch_size):
    """The rows of a block's activations: every token (the patches and the class token) of
    every image in the batch."""
    return batch_size * (int(np.prod(config.image_size)) // config.patch_size**2 + 1)


def block_matmuls(config, batch_size):
    """`(name, (m, k, n))` of one encoder block's training matmuls, `[m, k] @ [k, n]`."""
    rows = block_rows(config, batch_size)
    width, hidden = config.hidden_size, config.mlp_dim
    shapes = []
    for name, (k, n) in (("qkv", (width, 3 * width)), ("out", (width, width)),
                         ("mlp_0", (width, hidden)), ("mlp_1", (hidden, width))):
        shapes += [(f"{name} forward", (rows, k, n)), (f"{name} input gradient", (rows, n, k)),
                   (f"{name} weight gradient", (k, rows, n))]
    return shapes


def fastest(run, repeats):
    return min(machine.run_times(run, repeats))


def matmul_run(shape):
    """A function that computes one `shape` product in this backend's library and waits."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    a, b = (rng.normal(size=size).astype("float32") for size in ((m, k), (k, n)))
    if keras.config.backend() == "jax":
        import jax

        a, b = jax.numpy.asarray(a), jax.numpy.asarray(b)
        product = jax.jit(lambda a, b: a @ b)
        return lambda: product(a, b).block_until_ready()
    import tensorflow as tf

    a, b = tf.constant(a), tf.constant(b)
    product = tf.function(lambda a, b: tf.matmul(a, b))
    return lambda: product(a, b)  # (TensorFlow's CPU ops have run when it returns)


def update_times(variant, image_size, batch_size, repeats):
    """Seconds of one AdamW update of every weight of `variant`, with Keras' ops and with the
    fused kernels (TensorFlow only), as the driver's loop runs it: in a `tf.function`."""
    import tensorflow as tf

    import train_contenders as contenders
    from train.engines import tf_fused_updates
    from train.run import config_checks, objectives, optimizers

    config = contenders.case_config(variant, image_size, batch_size, "float32")
    times = {}
    for name, fused in (("Keras' ops", None), ("fused kernels", tf_fused_updates.adam_update)):
        model = objectives.build_model(config, contenders.NUM_CLASSES)
        variables = model.trainable_variables
        optimizer = optimizers.build_optimizer(
            config_checks.section(config, optimizers.FIELDS), model, fused_adam=fused)
        optimizer.build(variables)
        grads = [tf.random.normal(v.shape, stddev=1e-3) for v in variables]
        times[name] = fastest(tf.function(lambda: optimizer.apply(grads, variables)), repeats)
    return times


def layer_times(config, batch_size, repeats):
    """Seconds of the forward and backward pass of a block's MLP activation and of its layer
    norm at the block's shapes, in a `tf.function`: op by op, and as the layers run them in
    training (`keras_vit.layers.fusion`). `{layer: (shape, {"ops": s, "XLA-fused": s})}`."""
    import tensorflow as tf

    from keras_vit.layers import blocks, fusion, normalization

    rows, width = block_rows(config, batch_size), config.hidden_size
    cases = {
        "GELU": (blocks._activated, {"kind": config.activation}, [(rows, config.mlp_dim)]),
        "layer norm": (normalization._layer_norm,
                       {"epsilon": config.layer_norm_epsilon, "scale": True, "center": True},
                       [(rows, width), (width,), (width,)]),
    }
    times = {}
    for layer, (fn, static, shapes) in cases.items():
        inputs = [tf.random.normal(shape) for shape in shapes]
        times[layer] = (shapes[0], {})
        for name, training in (("ops", False), ("XLA-fused", True)):
            function = fusion.for_training(fn, training, **static)
            times[layer][1][name] = fastest(_forward_backward(function, inputs), repeats)
    return times


def _forward_backward(function, inputs):
    """A `tf.function` of no arguments: `function(*inputs)` and its gradients."""
    import tensorflow as tf

    @tf.function
    def run():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = function(*inputs)
        return tape.gradient(outputs, inputs, output_gradients=tf.ones_like(outputs))

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    backend = keras.config.backend()
    library = "jax" if backend == "jax" else "tensorflow"
    peak = machine.matmul_peak("float32", library=library)
    config = keras_vit.ViTConfig(variant=args.variant, image_size=args.image_size)
    print(f"CPU: {machine.cpu_name()}, {os.cpu_count()} cores; Keras {keras.__version__} on "
          f"{backend}; {machine.PEAK_SIZE}^3 float32 matmul peak {peak / 1e9:.0f} GFLOP/s")
    print(f"{args.variant} at {args.image_size}px, batch {args.batch_size}: one block's "
          f"training matmuls, fastest of {args.repeats}\n")
    print("| matmul | m x k x n | ms | GFLOP/s | % of peak |")
    print("|---|---|---|---|---|")
    total_flops = total_seconds = 0.0
    for name, shape in block_matmuls(config, args.batch_size):
        seconds = fastest(matmul_run(shape), args.repeats)
        flops = 2.0 * np.prod(shape)
        total_flops, total_seconds = total_flops + flops, total_seconds + seconds
        print(f"| {name} | {' x '.join(map(str, shape))} | {1e3 * seconds:.2f} | "
              f"{flops / seconds / 1e9:.0f} | {100 * flops / seconds / peak:.1f}% |")
    rate = total_flops / total_seconds
    print(f"| all | | {1e3 * total_seconds:.2f} | {rate / 1e9:.0f} | {100 * rate / peak:.1f}% |")
    if backend == "tensorflow":
        times = update_times(args.variant, args.image_size, args.batch_size, args.repeats)
        print("\nAdamW's update of every weight, in a tf.function: " + ", ".join(
            f"{name} {1e3 * seconds:.0f} ms" for name, seconds in times.items()))
        for layer, (shape, seconds) in layer_times(config, args.batch_size,
                                                    args.repeats).items():
            print(f"A block's {layer} ({' x '.join(map(str, shape))}), forward and backward "
                  "in a tf.function: " + ", ".join(
                      f"{name} {1e3 * value:.2f} ms" for name, value in seconds.items()))


if __name__ == "__main__":
    main()

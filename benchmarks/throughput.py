"""Forward-pass throughput of keras_vit against keras-hub's ViTBackbone, beside the matmul peak.

    python benchmarks/throughput.py --variant=B/16 --batch_size=32 --image_size=224 \
        --dtype=float32 --dtype=mixed_bfloat16

Both models get the same configuration, run in the same process, in interleaved order, each
compiled once with `tf.function`; the table reports the median of `--repeats` timed batches.
Achieved FLOP/s counts the multiply-adds of the matmuls and attention (2 FLOPs each) and is
shown beside the measured peak of a 4096^3 matmul in the policy's compute dtype.
Needs `pip install keras-hub` for the peer (skipped with a note if missing).
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402


def forward_flops(config, image_size):
    """FLOPs of one image's forward pass through patch embedding and encoder (no head)."""
    grid = (image_size // config.patch_size) ** 2
    tokens, d, m = grid + 1, config.hidden_size, config.mlp_dim
    embed = 2 * grid * config.patch_size**2 * 3 * d
    per_layer = 2 * tokens * (4 * d * d + 2 * d * m) + 2 * 2 * tokens * tokens * d
    return embed + config.num_layers * per_layer


def matmul_peak(compute_dtype, size=4096, repeats=5):
    a = tf.random.normal((size, size), dtype=tf.float32)
    a = tf.cast(a, compute_dtype)
    matmul = tf.function(lambda x: tf.matmul(x, x))
    matmul(a).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).numpy()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times)


def build_models(variant, image_size, policy):
    config = keras_vit.parse_variant(variant)
    models = {"keras_vit": keras_vit.vit(variant, image_size=image_size, include_top=False,
                                         dtype=policy)}
    try:
        import keras_hub
    except ImportError:
        print("keras-hub is not installed: `pip install keras-hub` to measure the peer.")
    else:
        models["keras-hub"] = keras_hub.models.ViTBackbone(
            image_shape=(image_size, image_size, 3), patch_size=config.patch_size,
            num_layers=config.num_layers, num_heads=config.num_heads,
            hidden_dim=config.hidden_size, mlp_dim=config.mlp_dim, dtype=policy)
    return config, models


def time_models(models, images, repeats, jit_compile):
    functions = {name: tf.function(lambda x, m=model: m(x, training=False),
                                   jit_compile=jit_compile)
                 for name, model in models.items()}
    for name, function in functions.items():  # compile and warm up
        function(images)
        function(images)
    times = {name: [] for name in functions}
    for _ in range(repeats):  # interleaved so drifts in machine load hit both alike
        for name, function in functions.items():
            start = time.perf_counter()
            np.asarray(function(images))
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--dtype", action="append",
                        help="Keras dtype policy; repeat for several (default float32)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jit_compile", action="store_true", help="compile with XLA")
    args = parser.parse_args()

    rows = []
    for policy in args.dtype or ["float32"]:
        config, models = build_models(args.variant, args.image_size, policy)
        compute_dtype = keras.dtype_policies.get(policy).compute_dtype
        images = np.random.default_rng(0).uniform(
            -1, 1, (args.batch_size, args.image_size, args.image_size, 3)).astype("float32")
        seconds = time_models(models, images, args.repeats, args.jit_compile)
        peak = matmul_peak(compute_dtype)
        flops = forward_flops(config, args.image_size) * args.batch_size
        for name, elapsed in seconds.items():
            rows.append((policy, name, args.batch_size / elapsed, flops / elapsed / 1e9,
                         peak / 1e9, seconds.get("keras-hub", float("nan")) / elapsed))
        del models
        keras.backend.clear_session()

    print(f"\nViT-{args.variant} at {args.image_size}, batch {args.batch_size}, "
          f"{os.cpu_count()} CPU threads, TF {tf.__version__}, Keras {keras.__version__}, "
          f"XLA {'on' if args.jit_compile else 'off'}, median of {args.repeats}\n")
    print("| policy | model | images/s | GFLOP/s | matmul peak GFLOP/s | vs keras-hub |")
    print("|---|---|---|---|---|---|")
    for policy, name, ips, gflops, peak, ratio in rows:
        print(f"| {policy} | {name} | {ips:.2f} | {gflops:.0f} | {peak:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()

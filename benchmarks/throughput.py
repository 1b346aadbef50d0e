"""Forward-pass throughput of keras_vit variants and of keras-hub's ViTBackbone, beside the
matmul peak.

    python benchmarks/throughput.py --variant=B/16 --batch_size=32 --image_size=224 \
        --dtype=float32 --dtype=mixed_bfloat16
    python benchmarks/throughput.py --variant=B/16 --variant=Axial-B/16   # Axial-ViT vs ViT-B
    python benchmarks/throughput.py --image_size=384 --any_size_from=224  # resampled per call

Every model of a dtype policy (each `--variant`, and keras-hub's ViTBackbone of the same
configuration for plain ViT variants) runs in the same process, in interleaved order, each
compiled once with `tf.function`; the table reports the median of `--repeats` timed batches and
each model's speed relative to keras_vit's first `--variant`. Achieved FLOP/s uses
`keras_vit.analysis.flops.forward_flops` (2 FLOPs per multiply-add, convolutions, dense layers and
attention matmuls; the keras-hub model is the same architecture, so the same count) and is
shown beside the measured peak of a 4096^3 matmul in the policy's compute dtype. With
`--any_size_from=N`, each keras_vit variant is also timed as a model of any image size
(`dynamic_image_size=True`) whose position embeddings were trained for N pixels and are
resampled to `--image_size` on every call.
Needs `pip install keras-hub` for the peer (skipped with a note if missing).
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from machine import cpu_name, matmul_peak  # noqa: E402

# Keras, TensorFlow and keras_vit are imported where they are used, after the flags are read:
# `--help` and a bad flag answer at once instead of after seconds of imports.


def build_models(variants, image_size, policy, any_size_from=None):
    """{label: (model, forward FLOPs per image)}, keras_vit's first; keras-hub's ViTBackbone
    beside each plain ViT variant (it has no ResNet hybrid and no Axial-ViT)."""
    import keras_vit
    from keras_vit.analysis.flops import forward_flops

    try:
        import keras_hub
    except ImportError:
        keras_hub = None
        print("keras-hub is not installed: `pip install keras-hub` to measure the peer.")
    models, peers = {}, {}
    for variant in variants:
        model = keras_vit.vit(variant, image_size=image_size, include_top=False, dtype=policy)
        models[f"keras_vit {variant}"] = (model, forward_flops(model))
        if any_size_from:
            dynamic = keras_vit.vit(variant, image_size=any_size_from, include_top=False,
                                    dtype=policy, dynamic_image_size=True)
            models[f"keras_vit {variant} any size, trained at {any_size_from}"] = (
                dynamic, forward_flops(model))
        spec = model.spec
        if keras_hub is not None and not (spec.is_hybrid or spec.axial):
            peer = keras_hub.models.ViTBackbone(
                image_shape=(*spec.image_size, 3), patch_size=spec.patch_size,
                num_layers=spec.num_layers, num_heads=spec.num_heads,
                hidden_dim=spec.hidden_size, mlp_dim=spec.mlp_dim, dtype=policy)
            peers[f"keras-hub {keras_hub.__version__} {variant}"] = (peer, forward_flops(model))
    return {**models, **peers}


def time_models(models, images, repeats, jit_compile):
    import tensorflow as tf

    functions = {name: tf.function(lambda x, m=model: m(x, training=False),
                                   jit_compile=jit_compile)
                 for name, (model, _) in models.items()}
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
    parser.add_argument("--variant", action="append",
                        help="keras_vit variant, e.g. B/16 or Axial-B/16; repeat for several "
                             "(default B/16); speeds are relative to the first")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--dtype", action="append",
                        help="Keras dtype policy; repeat for several (default float32)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jit_compile", action="store_true", help="compile with XLA")
    parser.add_argument("--any_size_from", type=int,
                        help="also time each variant of any image size trained at this size")
    args = parser.parse_args()
    variants = list(dict.fromkeys(args.variant or ["B/16"]))  # in order, once each
    import keras
    import tensorflow as tf

    rows = []
    for policy in args.dtype or ["float32"]:
        models = build_models(variants, args.image_size, policy, args.any_size_from)
        compute_dtype = keras.dtype_policies.get(policy).compute_dtype
        images = np.random.default_rng(0).uniform(
            -1, 1, (args.batch_size, args.image_size, args.image_size, 3)).astype("float32")
        seconds = time_models(models, images, args.repeats, args.jit_compile)
        peak = matmul_peak(compute_dtype)
        reference = seconds[f"keras_vit {variants[0]}"]
        for name, elapsed in seconds.items():
            flops = models[name][1] * args.batch_size
            rows.append((policy, name, args.batch_size / elapsed, flops / elapsed / 1e9,
                         peak / 1e9, reference / elapsed))
        del models
        keras.backend.clear_session()

    print(f"\nCPU: {cpu_name()}\n{', '.join(variants)} at {args.image_size}, batch "
          f"{args.batch_size}, {os.cpu_count()} CPU threads, TF {tf.__version__}, Keras {keras.__version__}, "
          f"XLA {'on' if args.jit_compile else 'off'}, median of {args.repeats}\n")
    print(f"| policy | model | images/s | GFLOP/s | matmul peak GFLOP/s | "
          f"speed vs keras_vit {variants[0]} |")
    print("|---|---|---|---|---|---|")
    for policy, name, ips, gflops, peak, ratio in rows:
        print(f"| {policy} | {name} | {ips:.2f} | {gflops:.0f} | {peak:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()

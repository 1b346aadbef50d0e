"""Training throughput: the driver's own step (train.tf_engine.Trainer's loop) against keras-hub's
ViT of the same configuration trained with `model.fit` and with `train_on_batch`.

    python benchmarks/train_step.py --variant=S/16 --variant=B/16 --image_size=224 \
        --dtype=float32 --dtype=mixed_bfloat16

Every contender trains the same architecture (a class-token ViT with a 10-class head) on the
same synthetic batch, with AdamW and global-norm clipping at 1.0, in one process. Runs are
interleaved (each repeat times every contender once) and the table gives the median of
`--repeats` timed runs of `--steps` optimizer steps each, after one untimed run that compiles.
The driver is timed as `train.main` runs it: `Trainer.train_loop` over `--steps` steps in one
host call, with and without XLA (`config.jit_compile`). keras-hub is timed with Keras'
defaults (`jit_compile="auto"`, which is off on a CPU-only TensorFlow) and with XLA.
Needs `pip install keras-hub` and the Fashion-MNIST files the main job uses (the trainer reads
its label names; the timed batches are synthetic).

    python benchmarks/train_step.py --quickstart

times the driver's loop on the main job's model and batch (configs/quickstart.py, XLA), with the
ResNet stem's max-pool gradient as keras_vit computes it and as XLA does for `ops.max_pool`.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
import machine  # noqa: E402
from configs import common, quickstart  # noqa: E402
from keras_vit import resnet  # noqa: E402
from train import tf_engine  # noqa: E402

NUM_CLASSES = 10
LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM = 1e-3, 1e-4, 1.0


def driver_contender(variant, image_size, batch_size, policy, jit_compile, batch, workdir):
    """A function that runs `steps` of the driver's compiled loop on `batch`."""
    config = common.get_config()
    config.model.variant, config.image_size = variant, image_size
    config.dataset = "fashion_mnist_local"  # the trainer reads its label names only
    config.batch_size = config.eval_batch_size = batch_size
    config.optimizer, config.learning_rate = "adamw", LEARNING_RATE
    config.weight_decay, config.grad_clip_norm = WEIGHT_DECAY, CLIP_NORM
    config.warmup_steps, config.total_steps = 0, 1_000_000
    config.dtype_policy, config.jit_compile = policy, jit_compile
    trainer = tf_engine.Trainer(config, workdir, tf.distribute.get_strategy())
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())

    def run(steps):
        loss, _ = trainer.train_loop(iterator, tf.constant(steps))
        return float(loss)

    return run


def quickstart_contender(custom_pool_gradient, batch, workdir):
    """The driver's loop on the main job's config; without `custom_pool_gradient` the stem
    pools with `ops.max_pool`, whose gradient XLA computes (select-and-scatter)."""
    config = quickstart.get_config()
    config.warmup_steps, config.total_steps = 0, 1_000_000
    trainer = tf_engine.Trainer(config, workdir, tf.distribute.get_strategy())
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())

    def plain_pool(x):
        return keras.ops.max_pool(x, pool_size=3, strides=2, padding="same")

    def run(steps):
        pool = resnet.max_pool_3x3_stride_2  # read when the loop is traced, in the first run
        if not custom_pool_gradient:
            resnet.max_pool_3x3_stride_2 = plain_pool
        try:
            loss, _ = trainer.train_loop(iterator, tf.constant(steps))
        finally:
            resnet.max_pool_3x3_stride_2 = pool
        return float(loss)

    return run


def keras_hub_classifier(variant, image_size, policy):
    import keras_hub

    spec = keras_vit.ViTConfig.from_variant(variant, image_size=image_size)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(*spec.image_size, 3), patch_size=spec.patch_size,
        num_layers=spec.num_layers, num_heads=spec.num_heads,
        hidden_dim=spec.hidden_size, mlp_dim=spec.mlp_dim, dtype=policy)
    return keras_hub.models.ViTImageClassifier(backbone, num_classes=NUM_CLASSES, dtype=policy)


def keras_hub_contender(variant, image_size, policy, jit_compile, how, batch):
    """A function that runs `steps` of keras-hub's ViT with `fit` or `train_on_batch`."""
    model = keras_hub_classifier(variant, image_size, policy)
    model.compile(
        optimizer=keras.optimizers.AdamW(LEARNING_RATE, weight_decay=WEIGHT_DECAY,
                                         global_clipnorm=CLIP_NORM),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile)
    images, labels = batch["image"], batch["label"]
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()

    def run(steps):
        if how == "fit":
            history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0,
                                shuffle=False)
            return history.history["loss"][-1]
        for _ in range(steps):
            loss = model.train_on_batch(images, labels)
        return float(np.ravel(loss)[0])

    return run


def synthetic_batch(batch_size, image_size):
    rng = np.random.default_rng(0)
    return {"image": tf.constant(rng.uniform(-1, 1, (batch_size, image_size, image_size, 3)),
                                 tf.float32),
            "label": tf.constant(rng.integers(0, NUM_CLASSES, batch_size), tf.int32)}


def measure(variant, image_size, batch_size, policy, steps, repeats, with_peer):
    batch = synthetic_batch(batch_size, image_size)
    contenders = {}
    with tempfile.TemporaryDirectory() as workdir:
        for jit in (False, True):
            name = f"keras_vit driver loop, XLA {'on' if jit else 'off'}"
            contenders[name] = driver_contender(variant, image_size, batch_size, policy, jit,
                                                batch, os.path.join(workdir, str(jit)))
        if with_peer:
            for how, jit in (("fit", "auto"), ("fit", True), ("train_on_batch", "auto")):
                name = f"keras-hub {how}, jit_compile={jit}"
                contenders[name] = keras_hub_contender(variant, image_size, policy, jit, how,
                                                       batch)
        return interleaved_rates(contenders, steps, batch_size, repeats)


def interleaved_rates(contenders, steps, batch_size, repeats):
    """Images/s of each contender: the median of `repeats` interleaved timed runs."""
    for name, run in contenders.items():  # compile and warm up
        loss = run(steps)
        if not np.isfinite(loss):
            raise RuntimeError(f"{name}: the loss is {loss} on the warm-up steps.")
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, run in contenders.items():
            start = time.perf_counter()
            run(steps)
            times[name].append(time.perf_counter() - start)
    return {name: steps * batch_size / statistics.median(seconds)
            for name, seconds in times.items()}


def measure_quickstart(steps, repeats):
    config = quickstart.get_config()
    batch = synthetic_batch(config.batch_size, config.image_size)
    with tempfile.TemporaryDirectory() as workdir:
        contenders = {}
        for custom, name in ((True, "keras_vit's (first maximum, 9 strided views)"),
                             (False, "XLA's (select-and-scatter)")):
            contenders[name] = quickstart_contender(custom, batch,
                                                    os.path.join(workdir, str(custom)))
        rates = interleaved_rates(contenders, steps, config.batch_size, repeats)
    print(f"configs/quickstart.py: {config.model.variant} at {config.image_size}px, batch "
          f"{config.batch_size}, XLA {'on' if config.jit_compile else 'off'}; {steps} steps per "
          f"run, median of {repeats}; TF {tf.__version__}, Keras {keras.__version__}\n")
    print("| stem max-pool gradient | images/s | vs XLA's |")
    print("|---|---|---|")
    baseline = rates["XLA's (select-and-scatter)"]
    for name, rate in rates.items():
        print(f"| {name} | {rate:.0f} | {rate / baseline:.2f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", help="repeat for several (default S/16)")
    parser.add_argument("--dtype", action="append", help="dtype policies (default float32)")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--steps", type=int,
                        help="optimizer steps per timed run (default 3; 100 with --quickstart)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quickstart", action="store_true",
                        help="time the main job's model and batch instead")
    args = parser.parse_args()
    if args.quickstart:
        print(machine.describe(["float32"]))
        measure_quickstart(args.steps or 100, args.repeats)
        return
    args.steps = args.steps or 3
    try:
        import keras_hub
        with_peer = True
        peer = f"keras-hub {keras_hub.__version__}"
    except ImportError:
        with_peer, peer = False, "keras-hub not installed (`pip install keras-hub`)"
    policies = args.dtype or ["float32"]
    print(machine.describe([keras.mixed_precision.Policy(p).compute_dtype for p in policies]))
    print(f"{args.image_size}px, batch {args.batch_size}, {args.steps} steps per run, median of "
          f"{args.repeats}; TF {tf.__version__}, Keras {keras.__version__}, {peer}\n")
    print("| variant | dtype policy | trainer | images/s | vs keras_vit (XLA off) |")
    print("|---|---|---|---|---|")
    for variant in args.variant or ["S/16"]:
        for policy in policies:
            rates = measure(variant, args.image_size, args.batch_size, policy, args.steps,
                            args.repeats, with_peer)
            baseline = next(iter(rates.values()))
            for name, rate in rates.items():
                print(f"| {variant} | {policy} | {name} | {rate:.2f} | {rate / baseline:.2f}x |",
                      flush=True)


if __name__ == "__main__":
    main()

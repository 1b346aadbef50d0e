"""The contenders of benchmarks/train_step.py on one Keras backend, in a process of its own.

    KERAS_BACKEND=jax python benchmarks/train_contenders.py

serves benchmarks/train_step.py, which starts one such process per backend (the backend is fixed
per process) and interleaves their timed runs: it sends one JSON request a line on stdin
(`serve` lists them) and reads each reply, a line of REPLY_PREFIX and JSON, on stdout; only one
process works at a time. On TensorFlow, train_step.py's `--quickstart` also imports the
contenders from here.

A case is a variant name (that plain ViT or hybrid at the requested image size and batch, AdamW with
global-norm clipping at 1.0, 10 classes) or `quickstart`: configs/quickstart.py as the main job
runs it (its model, image size, batch and optimizer). The contenders train on one synthetic batch:
- TensorFlow: the driver's loop (`TFEngine.train_loop`, `steps` steps in one host call) without
  and with XLA;
- JAX: the JAX engine (`JaxEngine.train_steps`, the call train.run.loop makes: one jitted step per
  batch, dispatched asynchronously, the losses read back once at the end);
- both: the same architecture under Keras' `fit` and `train_on_batch`: keras-hub's
  `ViTImageClassifier` for a plain ViT, keras_vit's own model for a hybrid (keras-hub has none).
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import machine  # noqa: E402
from configs import common, quickstart  # noqa: E402
from keras_vit.analysis import flops  # noqa: E402
from keras_vit.layers import resnet  # noqa: E402  (the stem's module: the pool swaps there)
from train.run import objectives  # noqa: E402
from train.run.model_config import model_spec  # noqa: E402

REPLY_PREFIX = "train_contenders reply: "
NUM_CLASSES = 10
LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM = 1e-3, 1e-4, 1.0


def case_config(case, image_size, batch_size, policy):
    """The driver's config of `case` (see the module docstring)."""
    if case == "quickstart":
        config = quickstart.get_config()
    else:
        config = common.get_config()
        config.model.variant, config.image_size = case, image_size
        config.batch_size = config.eval_batch_size = batch_size
        config.optimizer, config.learning_rate = "adamw", LEARNING_RATE
        config.weight_decay, config.grad_clip_norm = WEIGHT_DECAY, CLIP_NORM
    config.dataset = "fashion_mnist_local"  # the engines read its label names only
    config.warmup_steps, config.total_steps = 0, 1_000_000
    config.dtype_policy = policy
    return config


def synthetic_batch(batch_size, image_size):
    """Numpy images in [-1, 1] and labels: what the input pipeline hands the step."""
    rng = np.random.default_rng(0)
    return {"image": rng.uniform(-1, 1, (batch_size, image_size, image_size, 3)).astype("float32"),
            "label": rng.integers(0, NUM_CLASSES, batch_size).astype("int32")}


def training_flops(config):
    """`keras_vit.analysis.flops.training_flops` (3x the forward pass) of the case's model per
    image."""
    return flops.training_flops(objectives.build_model(config, NUM_CLASSES))


# TensorFlow contenders.

def driver_contender(config, batch, workdir):
    """A function that runs `steps` of the TensorFlow driver's compiled loop on `batch`."""
    import tensorflow as tf

    from train.engines import tf_engine

    trainer = tf_engine.TFEngine(config, workdir, tf.distribute.get_strategy())
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())

    def run(steps):
        loss, _ = trainer.train_loop(iterator, tf.constant(steps))
        return float(loss)

    return run


def quickstart_contender(custom_pool_gradient, batch, workdir):
    """The driver's loop on the main job's config; without `custom_pool_gradient` the stem
    pools with `ops.max_pool`, whose gradient XLA computes (select-and-scatter)."""
    import tensorflow as tf

    from train.engines import tf_engine

    config = case_config("quickstart", None, None, "float32")
    trainer = tf_engine.TFEngine(config, workdir, tf.distribute.get_strategy())
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


# JAX contenders.

def jax_engine_contender(config, batch, workdir):
    """A function that runs `steps` of the JAX engine on `batch`, as train.run.loop calls it."""
    from train.engines import jax_engine

    engine = jax_engine.JaxEngine(config, workdir)
    engine._train_iterator = itertools.repeat(batch)  # the synthetic batch, not the dataset
    distribution = engine.distribution

    def run(steps):
        keras.distribution.set_distribution(distribution)
        loss, _ = engine.train_steps(steps)  # a float: waits for every step
        return loss

    return run


# Keras' own loops, on either backend.

def keras_hub_classifier(config):
    import keras_hub

    spec = model_spec(config, NUM_CLASSES)
    policy = config.dtype_policy
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(*spec.image_size, 3), patch_size=spec.patch_size,
        num_layers=spec.num_layers, num_heads=spec.num_heads,
        hidden_dim=spec.hidden_size, mlp_dim=spec.mlp_dim, dtype=policy)
    return keras_hub.models.ViTImageClassifier(backbone, num_classes=NUM_CLASSES, dtype=policy)


def peer_name(config):
    """Who trains the case's architecture under Keras' loops: keras-hub has plain ViTs only."""
    spec = model_spec(config, NUM_CLASSES)
    return "keras_vit's model" if spec.is_hybrid or spec.axial else "keras-hub"


def keras_loop_contender(config, jit_compile, how, batch):
    """A function that runs `steps` of `fit` or `train_on_batch` on the case's architecture."""
    if peer_name(config) == "keras-hub":
        model = keras_hub_classifier(config)
    else:
        model = objectives.build_model(config, NUM_CLASSES)
    model.compile(
        optimizer=keras.optimizers.AdamW(config.learning_rate, weight_decay=config.weight_decay,
                                         global_clipnorm=config.grad_clip_norm),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile)
    images, labels = batch["image"], batch["label"]
    if how == "fit":
        import tensorflow as tf  # a tf.data input, which `fit` takes on every backend

        dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()

    def run(steps):
        keras.distribution.set_distribution(None)  # (the JAX engine's run sets its mesh)
        if how == "fit":
            history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0,
                                shuffle=False)
            return history.history["loss"][-1]
        for _ in range(steps):
            loss = model.train_on_batch(images, labels)
        return float(np.ravel(loss)[0])

    return run


def has_keras_hub():
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        return False
    return True


def contenders(config, batch, workdir):
    """This backend's contenders for the case of `config`, by name (no keras-hub ones when it
    is not installed)."""
    backend = keras.config.backend()
    found = {}
    if backend == "tensorflow":
        for jit in (False, True):
            config.jit_compile = jit
            found[f"keras_vit driver loop, XLA {'on' if jit else 'off'}"] = driver_contender(
                config, batch, os.path.join(workdir, f"xla_{jit}"))
        loops = (("fit", "auto"), ("fit", True), ("train_on_batch", "auto"))
    elif backend == "jax":
        found["keras_vit JAX engine"] = jax_engine_contender(config, batch,
                                                             os.path.join(workdir, "jax"))
        keras.distribution.set_distribution(None)  # Keras' loops: built without the mesh
        loops = (("fit", "auto"), ("train_on_batch", "auto"))  # (always jitted on JAX)
    else:
        raise ValueError(f"No contenders for Keras backend {backend!r}.")
    peer = peer_name(config)
    if peer != "keras-hub" or has_keras_hub():
        for how, jit in loops:
            name = f"{peer} {how}" + (f", jit_compile={jit}" if backend == "tensorflow" else "")
            found[name] = keras_loop_contender(config, jit, how, batch)
    return found


def warm_up(runs, steps):
    """One untimed run of each contender, of at least 2 steps: it compiles (the JAX engine
    compiled its step again on its second call at commit 40f09e0, once the state carried the
    step's output shardings)."""
    for name, run in runs.items():
        print(f"compiling and warming up: {name}", file=sys.stderr, flush=True)
        loss = run(max(steps, 2))
        if not np.isfinite(loss):
            raise RuntimeError(f"{name}: the loss is {loss} on the warm-up steps.")


def timed_run(name, run, steps, compiles):
    """Seconds of one run of `steps` steps, and the CPU seconds this process spent in it (all
    its threads: below cores x seconds when other work takes cores). Every run returns its loss
    as a float, which waits for the device to finish them. On JAX a run that compiles is an
    error (not the steady state); `compiles` is `machine.jax_compile_counter()`'s list."""
    compiled = len(compiles)
    start, cpu_start = time.perf_counter(), time.process_time()
    run(steps)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if len(compiles) > compiled:
        raise RuntimeError(f"{name}: XLA compiled during a timed run.")
    return seconds, cpu_seconds


def interleaved_rates(runs, steps, batch_size, repeats):
    """Images/s of each contender: the median of `repeats` interleaved timed runs (each repeat
    times every contender once), after `warm_up`."""
    compiles = machine.jax_compile_counter()
    warm_up(runs, steps)
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed_run(name, run, steps, compiles)[0])
    return {name: steps * batch_size / statistics.median(seconds)
            for name, seconds in times.items()}


def versions():
    found = {"Keras": keras.__version__}
    for name, module in (("TF", "tensorflow"), ("JAX", "jax"), ("keras-hub", "keras_hub")):
        try:
            found[name] = __import__(module).__version__
        except ImportError:
            pass
    return found


def serve(requests, reply):
    """Answers the parent's requests (dicts) with `reply(dict)` until they end:

        hello                      -> backend, versions (once the imports are done)
        peaks {dtypes, peak_size}  -> the peak_size^3 matmul peak by compute dtype
        setup {case, policy, image_size, batch_size, steps}
                                   -> the case's contenders, built and warmed up: their names,
                                      the model's variant, size, batch and training FLOPs
        time {name, steps}         -> seconds of one run of that contender, and its CPU seconds
    """
    backend = keras.config.backend()
    compiles = machine.jax_compile_counter()
    runs = {}
    with tempfile.TemporaryDirectory() as workdir:
        for number, request in enumerate(requests):
            op = request["op"]
            if op == "hello":
                reply({"backend": backend, "versions": versions()})
            elif op == "peaks":
                library = "jax" if backend == "jax" else "tensorflow"
                reply({dtype: machine.matmul_peak(dtype, size=request["peak_size"],
                                                  library=library)
                       for dtype in request["dtypes"]})
            elif op == "setup":
                runs = None
                keras.backend.clear_session()  # the previous case's models
                config = case_config(request["case"], request["image_size"],
                                     request["batch_size"], request["policy"])
                batch = synthetic_batch(config.batch_size, config.image_size)
                runs = contenders(config, batch, os.path.join(workdir, str(number)))
                warm_up(runs, request["steps"])
                reply({"names": list(runs), "variant": config.model.variant,
                       "image_size": config.image_size, "batch_size": config.batch_size,
                       "compute_dtype": keras.mixed_precision.Policy(
                           config.dtype_policy).compute_dtype,
                       "training_flops": training_flops(config)})
            elif op == "time":
                name = request["name"]
                seconds, cpu_seconds = timed_run(name, runs[name], request["steps"], compiles)
                reply({"seconds": seconds, "cpu_seconds": cpu_seconds})
            else:
                raise ValueError(f"Unknown request {request!r}.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args()
    protocol = sys.stdout  # the replies; anything a library prints goes to stderr
    sys.stdout = sys.stderr

    def reply(message):
        protocol.write(REPLY_PREFIX + json.dumps(message) + "\n")
        protocol.flush()

    serve((json.loads(line) for line in sys.stdin), reply)


if __name__ == "__main__":
    main()

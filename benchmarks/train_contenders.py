"""The contenders of benchmarks/train_step.py on one Keras backend, timed in one process.

    KERAS_BACKEND=jax python benchmarks/train_contenders.py --spec='{"cases": ["B/16"], ...}'

measures every case of the spec (keys as `child_spec` of train_step.py writes them) on the
backend Keras runs on and prints one line, RESULT_PREFIX and then JSON: the versions, the matmul
peak of this backend's library in each compute dtype, and per case its training FLOPs per image
and each contender's images/s. benchmarks/train_step.py runs it once per backend (the backend is
fixed per process) and prints the table; on TensorFlow it also imports the contenders from here.

A case is a variant name (that plain ViT or hybrid at the spec's image size and batch, AdamW with
global-norm clipping at 1.0, 10 classes) or `quickstart`: configs/quickstart.py as the main job
runs it (its model, image size, batch and optimizer). The contenders train on one synthetic batch:
- TensorFlow: the driver's loop (`Trainer.train_loop`, `steps` steps in one host call) without
  and with XLA;
- JAX: the JAX engine (`JaxEngine.train_steps`, the call train.loop makes: one jitted step per
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
from keras_vit import flops, resnet  # noqa: E402
from train import objectives  # noqa: E402
from train.config_checks import model_spec  # noqa: E402

RESULT_PREFIX = "train_contenders result: "
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
    """`keras_vit.flops.training_flops` (3x the forward pass) of the case's model per image."""
    return flops.training_flops(objectives.build_model(config, NUM_CLASSES))


# TensorFlow contenders.

def driver_contender(config, batch, workdir):
    """A function that runs `steps` of the TensorFlow driver's compiled loop on `batch`."""
    import tensorflow as tf

    from train import tf_engine

    trainer = tf_engine.Trainer(config, workdir, tf.distribute.get_strategy())
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())

    def run(steps):
        loss, _ = trainer.train_loop(iterator, tf.constant(steps))
        return float(loss)

    return run


def quickstart_contender(custom_pool_gradient, batch, workdir):
    """The driver's loop on the main job's config; without `custom_pool_gradient` the stem
    pools with `ops.max_pool`, whose gradient XLA computes (select-and-scatter)."""
    import tensorflow as tf

    from train import tf_engine

    config = case_config("quickstart", None, None, "float32")
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


# JAX contenders.

def jax_engine_contender(config, batch, workdir):
    """A function that runs `steps` of the JAX engine on `batch`, as train.loop calls it."""
    from train import jax_engine

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


def interleaved_rates(runs, steps, batch_size, repeats):
    """Images/s of each contender: the median of `repeats` interleaved timed runs, after one
    untimed run each of at least 2 steps (the JAX engine compiles its step again on the second
    call, once the state carries the step's output shardings). Every run returns its loss as a
    float, which waits for the device to finish its steps. On JAX a timed run that compiles
    anything is an error: it would not be the steady state."""
    compiles = jax_compile_counter()
    for name, run in runs.items():
        print(f"compiling and warming up: {name}", file=sys.stderr, flush=True)
        loss = run(max(steps, 2))
        if not np.isfinite(loss):
            raise RuntimeError(f"{name}: the loss is {loss} on the warm-up steps.")
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            compiled = len(compiles)
            start = time.perf_counter()
            run(steps)
            times[name].append(time.perf_counter() - start)
            if len(compiles) > compiled:
                raise RuntimeError(f"{name}: XLA compiled during a timed run.")
    return {name: steps * batch_size / statistics.median(seconds)
            for name, seconds in times.items()}


def jax_compile_counter():
    """A list that gets an entry whenever XLA compiles for JAX (stays empty on TensorFlow)."""
    compiles = []
    if keras.config.backend() == "jax":
        import jax

        def listener(event, duration_secs, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                compiles.append(duration_secs)

        jax.monitoring.register_event_duration_secs_listener(listener)
    return compiles


def versions():
    found = {"Keras": keras.__version__}
    for name, module in (("TF", "tensorflow"), ("JAX", "jax"), ("keras-hub", "keras_hub")):
        try:
            found[name] = __import__(module).__version__
        except ImportError:
            pass
    return found


def measure(spec):
    """Everything the spec asks of this backend, as one JSON-ready dict."""
    backend = keras.config.backend()
    library = "jax" if backend == "jax" else "tensorflow"
    compute_dtypes = sorted({keras.mixed_precision.Policy(p).compute_dtype
                             for p in spec["policies"]})
    result = {"backend": backend, "versions": versions(),
              "peaks": {dtype: machine.matmul_peak(dtype, size=spec["peak_size"],
                                                   library=library)
                        for dtype in compute_dtypes},
              "cases": []}
    for case in spec["cases"]:
        for policy in spec["policies"]:
            config = case_config(case, spec["image_size"], spec["batch_size"], policy)
            batch = synthetic_batch(config.batch_size, config.image_size)
            with tempfile.TemporaryDirectory() as workdir:
                runs = contenders(config, batch, workdir)
                rates = interleaved_rates(runs, spec["steps"][case], config.batch_size,
                                          spec["repeats"])
            result["cases"].append({
                "case": case, "policy": policy, "variant": config.model.variant,
                "image_size": config.image_size, "batch_size": config.batch_size,
                "steps": spec["steps"][case],
                "compute_dtype": keras.mixed_precision.Policy(policy).compute_dtype,
                "training_flops": training_flops(config), "rates": rates})
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="JSON: what to measure")
    spec = json.loads(parser.parse_args().spec)
    result = measure(spec)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

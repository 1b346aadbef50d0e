"""Shared helpers for the training-driver tests: a tiny fake Fashion-MNIST, a tiny config, and
running `python -m train.main` in a subprocess.

The fake dataset is four gzipped IDX files (the MNIST format) holding 512 train and 100 test
28x28 images whose class is easy to learn (a bright horizontal band whose row is the label),
prepared once per test session as the TFDS dataset `fashion_mnist_local` in a temporary
`data_dir` (`fake_fashion_mnist`).
"""

import contextlib
import gzip
import importlib.util
import json
import math
import os
import shutil
import sys
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_TRAIN, NUM_TEST, NUM_CLASSES = 512, 100, 10
IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

# A tiny plain ViT (whatever model quickstart.py picks) and a short run; every value is a
# locked-config override of configs/quickstart.py (`model`: of config.model's fields).
TINY = {
    "model": {"variant": "Ti/16", "hidden_size": 16, "mlp_dim": 32, "num_heads": 2,
              "num_layers": 1, "patch_size": 7},
    "image_size": 28,
    "batch_size": 32,
    "eval_batch_size": 50,
    "total_steps": 6,
    "steps_per_loop": 2,
    "warmup_steps": 2,
    "eval_every_steps": 6,
    "checkpoint_every_steps": 2,
    "shuffle_buffer": 512,
    "export": False,
    "jit_compile": False,  # the tests that want XLA say so
}

# A run's config.json as train.main wrote it before config.model held the model's fields (the
# variant name as `model`, its fields beside it, no approximate_gelu or layer_norm_epsilon):
# TINY on configs/quickstart.py, written by train.main at commit a388d88 (data_dir changed).
FLAT_LAYOUT_CONFIG_JSON = {
    "seed": 0, "model": "Ti/16", "patch_size": 7, "hidden_size": 16, "mlp_dim": 32, "num_heads": 2,
    "num_layers": 1, "classifier": "token", "position_embedding": "learned",
    "position_embedding_placement": "stem", "representation_size": None, "dropout": 0.0,
    "attention_dropout": 0.0, "drop_path_rate": 0.0, "pretrained": "",
    "objective": "classification", "mpp_target": "mean_color", "mpp_corruption_rate": 0.5,
    "mpp_mask_rate": 0.8, "mpp_random_rate": 0.1, "dataset": "fashion_mnist_local",
    "data_dir": "/data/tfds", "train_split": "train", "eval_split": "test", "image_size": 28,
    "crop_min_area": 1.0, "flip": False, "shuffle_buffer": 512, "batch_size": 32,
    "eval_batch_size": 50, "total_steps": 6, "optimizer": "adamw", "learning_rate": 0.003,
    "warmup_steps": 2, "decay": "cosine", "momentum": 0.9, "beta_1": 0.9, "beta_2": 0.999,
    "weight_decay": 0.05, "grad_clip_norm": 1.0, "accum_steps": 1, "label_smoothing": 0.0,
    "dtype_policy": "float32", "ema_decay": 0.0, "steps_per_loop": 2, "eval_every_steps": 6,
    "checkpoint_every_steps": 2, "keep_checkpoints": 3, "jit_compile": False, "export": True,
}


def idx_bytes(array, magic):
    """The IDX encoding of a uint8 array: magic (big-endian int32, its low byte the rank), the
    dimensions as big-endian int32, then the values."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    assert magic & 0xFF == array.ndim
    header = magic.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in array.shape)
    return header + array.tobytes()


def write_idx(path, array, magic):
    with gzip.open(path, "wb") as handle:
        handle.write(idx_bytes(array, magic))


def fake_images(count, seed):
    """`count` 28x28 uint8 images and labels: noise plus a bright band at rows 2*label+4.."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(count) % NUM_CLASSES).astype(np.uint8)
    rng.shuffle(labels)
    images = rng.integers(0, 60, size=(count, 28, 28), dtype=np.uint8)
    for image, label in zip(images, labels):
        row = 2 * int(label) + 4
        image[row:row + 2, 3:25] = 255
    return images, labels


def write_fake_fashion_mnist(folder, num_train=NUM_TRAIN, num_test=NUM_TEST):
    os.makedirs(folder, exist_ok=True)
    for split, count, seed in (("train", num_train, 1), ("test", num_test, 2)):
        images, labels = fake_images(count, seed)
        write_idx(os.path.join(folder, FILES[split][0]), images, IMAGE_MAGIC)
        write_idx(os.path.join(folder, FILES[split][1]), labels, LABEL_MAGIC)
    return folder


def png_bytes(array):
    import tensorflow as tf
    return tf.io.encode_png(tf.constant(array, tf.uint8)).numpy()


def write_image_folder(root, rng, classes=("cat", "dog", "fox"), per_class=(6, 3)):
    """root/{train,test}/<class>/*.png, alternating RGB and grayscale, of varied sizes."""
    counts = {}
    for split, count in zip(("train", "test"), per_class):
        for label, name in enumerate(classes):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for index in range(count):
                channels = 3 if index % 2 == 0 else 1
                height, width = 20 + 4 * index, 24 + 2 * label
                image = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
                with open(os.path.join(folder, f"{index}.png"), "wb") as handle:
                    handle.write(png_bytes(image))
        counts[split] = count * len(classes)
    return counts


class FakeData:
    """Where the fake dataset lives: `source` (the .gz files) and `data_dir` (prepared TFDS)."""

    def __init__(self, root):
        self.root = str(root)
        self.source = os.path.join(self.root, "fashion-mnist")
        self.data_dir = os.path.join(self.root, "tfds")

    def env(self):
        env = dict(os.environ)
        env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", FASHION_MNIST_DIR=self.source,
                   CUDA_VISIBLE_DEVICES="")
        return env


@contextlib.contextmanager
def fashion_mnist_dir(folder):
    """FASHION_MNIST_DIR is `folder` inside the block (the files a TFDS prepare reads)."""
    previous = os.environ.get("FASHION_MNIST_DIR")
    os.environ["FASHION_MNIST_DIR"] = folder
    try:
        yield
    finally:
        if previous is None:
            del os.environ["FASHION_MNIST_DIR"]
        else:
            os.environ["FASHION_MNIST_DIR"] = previous


def fake_fashion_mnist(root):
    """Writes the fake Fashion-MNIST under `root` and prepares it as a TFDS dataset (the
    `fake_fmnist` fixture of conftest.py does this once per test session)."""
    data = FakeData(root)
    write_fake_fashion_mnist(data.source)
    if importlib.util.find_spec("tensorflow") is None:  # TFDS prepares with TensorFlow; the
        return data  # Grain pipeline reads the .gz files (CI's environment without it)
    with fashion_mnist_dir(data.source):
        from train.data import tf_pipeline
        tf_pipeline.get_builder(tiny_config(data))  # prepares it under data.data_dir
    return data


def built_once(tmp_path_factory, name, build):
    """The folder `name`, filled by `build(folder)` once per test session: by the first
    pytest-xdist worker that asks, while the others wait for it and then read it (a session or
    module fixture is otherwise built in every worker that uses it). Put nothing a test changes
    in it."""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's temporary folder, which holds each worker's own
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def tiny_config(data, **overrides):
    """configs/quickstart.py with TINY and `overrides` (`model=dict(...)` changes those fields
    of config.model), reading the fake data (in-process)."""
    from configs import quickstart
    config = quickstart.get_config()
    config.update(TINY)  # recursive: TINY["model"] changes config.model's fields it names
    config.data_dir = data.data_dir
    config.update(overrides)
    config.lock()
    return config


def merged(values, overrides):
    """`values` with `overrides`, the fields of a nested dict (`model`) merged into its own."""
    result = dict(values)
    for name, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(result.get(name), dict)
        result[name] = {**result[name], **value} if nested else value
    return result


def override_flags(values):
    """`--config.name=value` for each of `values`, `--config.model.name=value` for its model's."""
    from train.run.config_flag import flat_fields
    return [f"--config.{name}={value}" for name, value in flat_fields(values).items()]


def flags(data, workdir, config="configs/quickstart.py", **overrides):
    args = [f"--config={config}", f"--workdir={workdir}", f"--config.data_dir={data.data_dir}"]
    return args + override_flags(merged(TINY, overrides))


def main_command(data, workdir, *extra, **overrides):
    return [sys.executable, "-m", "train.main", *flags(data, workdir, **overrides), *extra]


def wait_for_progress(process, text):
    """Reads `process`'s log (its stderr, a text pipe) until a line holds `text`; returns
    what it read."""
    lines = []
    for line in process.stderr:
        lines.append(line)
        if text in line:
            return "".join(lines)
    raise AssertionError("".join(lines)[-3000:])


def wait_then_exit(processes, signals, limit=120):
    """For each of `processes` ({name: Popen}, stderr a text pipe) waiting for its peers at
    start-up: reads its log until the first "Waiting for" line, then sends it `signals[name]`
    if any; then waits (up to `limit` s) until all have exited. Returns {name: (its log, the
    seconds from that line to its exit)}. Each exit is timed by a thread of its own, so a
    process that ends while the next one is still starting is not timed late."""
    logs, waited, ended = {}, {}, {}

    def time_the_exit(name, process):
        process.wait()
        ended[name] = time.monotonic()

    for name, process in processes.items():
        logs[name] = wait_for_progress(process, "Waiting for")
        waited[name] = time.monotonic()
        threading.Thread(target=time_the_exit, args=(name, process), daemon=True).start()
        if name in signals:
            process.send_signal(signals[name])
    while len(ended) < len(processes) and time.monotonic() < min(waited.values()) + limit:
        time.sleep(0.1)
    results = {}
    for name, process in processes.items():
        if name not in ended:
            process.kill()
        logs[name] += process.communicate(timeout=30)[1]
        results[name] = logs[name], ended.get(name, math.inf) - waited[name]
    return results


def error_lines(log):
    """The "Error: ..." paragraphs of a command's log."""
    return [line for line in log.splitlines() if line.startswith("Error: ")]


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def latest_checkpoint_step(workdir):
    """The step of the newest checkpoint named in workdir/checkpoints/checkpoint, or None."""
    path = os.path.join(workdir, "checkpoints", "checkpoint")
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if line.startswith("model_checkpoint_path:"):
            return int(line.split('"')[1].rsplit("-", 1)[1])
    return None


def checkpoint_values(workdir):
    """{name: array} of every saved variable (model, optimizer, EMA) in the newest checkpoint,
    without the checkpoint's own bookkeeping."""
    import tensorflow as tf
    path = tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))
    assert path, f"no checkpoint in {workdir}"
    reader = tf.train.load_checkpoint(path)
    names = [name for name in reader.get_variable_to_shape_map()
             if "save_counter" not in name and "_CHECKPOINTABLE_OBJECT_GRAPH" not in name]
    return {name: reader.get_tensor(name) for name in names}


def assert_same_values(first, second, atol):
    assert sorted(first) == sorted(second)
    assert len(first) > 10  # model weights and optimizer slots, not an empty match
    worst = {name: float(np.max(np.abs(np.asarray(first[name], np.float64) -
                                       np.asarray(second[name], np.float64)), initial=0.0))
             for name in first if np.asarray(first[name]).dtype.kind in "fiu"}
    bad = {name: diff for name, diff in worst.items() if diff > atol}
    assert not bad, f"differ by more than {atol}: {bad}"


# Runs `python -m train.main` with `import tensorflow` failing as on a machine without it
# (the Grain tests' runs of the JAX engine).
WITHOUT_TENSORFLOW = """
import importlib.machinery, runpy, sys
class NoTensorFlow(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            return None
        return super().find_spec(name, path, target)
sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = NoTensorFlow
sys.argv = ["train.main"] + sys.argv[1:]
runpy.run_module("train.main", run_name="__main__")
"""

"""The layout of a training run's workdir, the one place that names its files:

    <workdir>/
        config.json              the run's config (train.run.run_config)
        metrics.jsonl            logged values (train.run.metrics), and tensorboard/
        train.log                the output of a run that a study started (train.studies.child_runs)
        checkpoints/             the training state: ckpt-<step>.* files (TensorFlow engine,
                                 train.engines.tf_checkpoints) or <step>/ folders (JAX engine,
                                 orbax)
        export/                  written at the end of training (train.run.export)
            model.keras          the final model (EMA weights if enabled)
            class_names.txt      a classifier's class names, one a line, in label order
            encoder.npz          a masked-patch-prediction run's encoder (original layout)
            saved_model/<N>/     TF Serving versions
            model_<kind>.tflite  TFLite files (float32, float16, dynamic, int8)
            model_<kind>.onnx    ONNX files (float32, int8)

Paths may be local or remote (gs://...).
"""

import os


def config_file(workdir):
    return os.path.join(workdir, "config.json")


def metrics_file(workdir):
    return os.path.join(workdir, "metrics.jsonl")


def tensorboard_dir(workdir):
    return os.path.join(workdir, "tensorboard")


def log_file(workdir):
    return os.path.join(workdir, "train.log")


def checkpoint_dir(workdir):
    return os.path.join(workdir, "checkpoints")


def checkpoint_engine(workdir):
    """The engine whose checkpoints `workdir` holds: "tensorflow", "jax" or None (none yet)."""
    from keras_vit import fileio

    folder = checkpoint_dir(workdir)
    names = fileio.listdir(folder) if fileio.isdir(folder) else []
    if any(name == "checkpoint" or name.startswith("ckpt-") for name in names):
        return "tensorflow"
    if any(name.rstrip("/").isdigit() for name in names):
        return "jax"
    return None


def current_engine():
    """The engine of this process's Keras backend: "jax" on JAX, else "tensorflow"."""
    import keras

    return "jax" if keras.config.backend() == "jax" else "tensorflow"


def refuse_other_engine(workdir, engine):
    """Raises ValueError when `workdir` holds checkpoints of the engine other than `engine`:
    a resume must never silently start over."""
    found = checkpoint_engine(workdir)
    if found not in (None, engine):
        raise ValueError(
            f"{checkpoint_dir(workdir)} holds checkpoints of the {found} engine, which this "
            f"{engine} run cannot resume. Resume it with KERAS_BACKEND={found}, or start "
            "this run in a new --workdir.")


def export_dir(workdir):
    return os.path.join(workdir, "export")


def model_file(workdir):
    return os.path.join(export_dir(workdir), "model.keras")


def class_names_file(workdir):
    return os.path.join(export_dir(workdir), "class_names.txt")


def encoder_file(workdir):
    return os.path.join(export_dir(workdir), "encoder.npz")


def saved_model_dir(workdir):
    return os.path.join(export_dir(workdir), "saved_model")


def tflite_file(workdir, kind):
    return os.path.join(export_dir(workdir), f"model_{kind}.tflite")


def onnx_file(workdir, kind):
    return os.path.join(export_dir(workdir), f"model_{kind}.onnx")


def write_class_names(workdir, names):
    from keras_vit import fileio  # not at import: keras_vit loads TensorFlow

    fileio.write_atomically(class_names_file(workdir), "".join(f"{name}\n" for name in names))


def read_class_names(workdir):
    """The class names saved with the trained model, or None when there are none."""
    from keras_vit import fileio

    path = class_names_file(workdir)
    if not fileio.exists(path):
        return None
    with fileio.open_file(path, "r") as handle:
        return handle.read().splitlines()

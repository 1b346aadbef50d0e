"""A run's export: the trained model of a workdir as a `.keras` file, a TF Serving SavedModel,
TFLite files and ONNX files, written at the end of training (`export_trained`, from
train.run.loop) and again by `python -m train.export` (`export_model`). The conversions
themselves are keras_vit.deploy.export's; the files' places are train.run.run_files'.

Local paths are checked without importing TensorFlow, so that the command's flag errors are
reported at once.
"""

import importlib.util
import os
import sys
import tempfile

import numpy as np
from absl import logging

from ..console import cli, native_output
from . import run_files

# The package of the commands (`train`, or `keras_vit.train` when installed), whose `export`
# command exports a model trained on JAX in a TensorFlow process.
COMMANDS_PACKAGE = __package__.rpartition(".")[0]

# The TFLite kinds: the name users give, and keras_vit.deploy.export's quantization for it.
TFLITE_KINDS = {"float32": "none", "float16": "float16", "dynamic": "dynamic", "int8": "int8"}

# The TFLite files a training run exports besides its SavedModel.
RUN_TFLITE_KINDS = ("float32", "int8")

# The ONNX kinds: the name users give, and keras_vit.deploy.export.export_onnx's quantization
# for it ("int8" calibrates on training images, as TFLite's). Each file takes uint8 pixels of any
# size, resized and scaled in its graph (at native resolution, the NaFlex arrays).
ONNX_KINDS = {"float32": "none", "int8": "int8"}

# The run's ONNX files (`config.export_onnx`, default none: the "onnx" extra is not installed
# with "train"), in the form of `python -m train.export --onnx`.
RULES = {"export_onnx": ("any_str", None)}


# What users type for a kind, and the kind they mean.
KIND_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "uint8": "int8"}


def parse_kinds(value, name, kinds):
    """The kinds of a `--tflite` or `--onnx` value or `config.export_onnx` (`name` in the
    message): 'none', 'all' or a comma list of `kinds`, in order, once each; ValueError naming
    the unknown ones and the valid values."""
    value = (value or "").strip()
    if value in ("", "none"):
        return []
    if value == "all":
        return list(kinds)
    chosen = [kind.strip() for kind in value.split(",") if kind.strip()]
    unknown = [kind for kind in chosen if kind not in kinds]
    if unknown or not chosen:
        hint = ""
        if any(kind in ("none", "all") for kind in unknown):
            hint = " ('none' and 'all' stand alone, not in a list)"
        else:
            meant = [f"{kind} is {KIND_ALIASES[kind]}" for kind in unknown
                     if KIND_ALIASES.get(kind) in kinds]
            meant += ["there is no int4"] if "int4" in unknown else []
            hint = f" ({'; '.join(meant)})" if meant else ""
        raise ValueError(f"Unknown {name} kind(s) {', '.join(map(repr, unknown))}{hint}: use "
                         f"'none', 'all', or a comma list of {', '.join(kinds)}, e.g. "
                         f"{name}={','.join(dict.fromkeys([list(kinds)[0], list(kinds)[-1]]))}.")
    return list(dict.fromkeys(chosen))  # once each, in the given order


def check_onnx_packages(name):
    """Raises ValueError when the ONNX export's packages are missing (`name` asked for ONNX
    files); looked up without importing them, or TensorFlow."""
    missing = [module for module in ("tf2onnx", "onnx")
               if importlib.util.find_spec(module) is None]
    if missing:
        raise ValueError(f"{name} asks for ONNX files, whose export needs "
                         f"{' and '.join(missing)}, not installed: pip install "
                         '"keras_vit[onnx]" (or ".[onnx]" in a checkout), or leave ONNX out.')


def check(config, report):
    """`config.export_onnx`: known kinds, and the packages to write them when the run exports
    (a missing package would otherwise fail the run's last step)."""
    if not report.ok("export_onnx"):
        return
    try:
        kinds = parse_kinds(config.export_onnx, "config.export_onnx", ONNX_KINDS)
        if kinds and config.get("export", True):
            check_onnx_packages(f"config.export_onnx={config.export_onnx!r}")
    except ValueError as error:
        report.add("export_onnx", f"config.export_onnx={config.export_onnx!r}",
                   str(error).removeprefix(f"config.export_onnx={config.export_onnx!r} "))


def export_trained(engine):
    """Writes the final model (EMA weights if enabled) into the run's export directory
    (train.run.run_files). Every process calls it; only the chief writes.

    A classifier: the `.keras` model and class names, a TF Serving SavedModel, float32
    and int8 TFLite files, and the ONNX files of `config.export_onnx`; of a run at native
    resolution (`config.native`), a SavedModel that runs each image at its own aspect ratio
    within `config.native_patches`, and TFLite and ONNX files that take the NaFlex arrays at
    that budget (keras_vit.deploy.export's `max_num_patches`). A masked-patch-prediction run:
    its encoder without any head, as `model.keras` (returning the pooled representation) and
    `encoder.npz` (the original checkpoint layout), both ready for `--config.pretrained` of a
    fine-tuning run.
    """
    import keras

    import keras_vit
    from keras_vit import fileio

    from ..data import settings

    workdir, directory = engine.workdir, run_files.export_dir(engine.workdir)
    path = run_files.model_file(workdir)
    onnx_kinds = parse_kinds(engine.config.get("export_onnx", "none"), "config.export_onnx",
                             ONNX_KINDS)
    with engine.exported_weights() as trained:
        # Masked patch prediction exports its encoder alone; a classifier is served.
        pretraining = engine.config.objective != "classification"
        # The classifier (a distilling run's student), LoRA's adapters merged into its kernels.
        model = keras_vit.lora.merged(engine.objective.encoder(trained))
        # Served as evaluated: the run's resize and crop (a starting checkpoint's).
        model.preprocessing = settings.eval_preprocessing(engine.config)
        if not engine.is_chief:  # only the chief writes into the workdir
            return path
        fileio.makedirs(directory)
        remove_partial_files(workdir)  # left by an export that was killed
        # Keras writes a .keras file only to a path of that name, so not straight to a
        # temporary name beside `path`: into a local directory first, then copied over.
        with tempfile.TemporaryDirectory(prefix="keras_vit_export_") as local:
            model.save(os.path.join(local, "model.keras"))
            with open(os.path.join(local, "model.keras"), "rb") as handle:
                fileio.write_atomically(path, handle.read())
        if pretraining:  # a pre-trained encoder: nothing to serve yet
            keras_vit.weights.checkpoint.save_npz(model, run_files.encoder_file(workdir))
        else:
            run_files.write_class_names(workdir, engine.class_names)
            if keras.config.backend() == "tensorflow":
                budget = served_budget(engine.config)
                representative = run_calibration_images(engine.builder, engine.config, 200)
                export_model(model, workdir, engine.class_names, RUN_TFLITE_KINDS,
                             representative, max_num_patches=budget, onnx_kinds=onnx_kinds)
    if not pretraining and keras.config.backend() != "tensorflow":
        # The serving signatures decode images with TensorFlow ops: a TensorFlow process
        # exports the model.keras just written, as `python -m train.export` does.
        export_in_tensorflow(workdir, RUN_TFLITE_KINDS, onnx_kinds)
    logging.info("Saved the trained %s to %s.",
                 "encoder" if pretraining else "model", directory)
    return path


def exists_and_isdir(path):
    """(exists, is a directory) of a local path, or of a URL through tf.io.gfile (gs://...).
    Not keras_vit.fileio: importing keras_vit loads TensorFlow, and flag errors are reported
    before that."""
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.exists(path), tf.io.gfile.isdir(path)
    return os.path.exists(path), os.path.isdir(path)


def path_exists(path):
    return exists_and_isdir(path)[0]


def _rerun_hint(workdir):
    return (f"Write it again by rerunning the training command with the same --config and "
            f"--workdir={workdir} (and --config.export=True): it resumes from the last "
            "checkpoint and exports the model.")


def check_model_file(path, workdir):
    """Raises ValueError unless `path` looks like a complete `.keras` file (a zip archive with
    the model's config); says what is wrong and how to write it again. No TensorFlow import
    for a local path."""
    import zipfile

    if exists_and_isdir(path)[1]:
        raise ValueError(f"{path} is a directory, not a .keras model file. "
                         f"{_rerun_hint(workdir)}")
    if "://" in path:
        import tensorflow as tf

        opener, size = tf.io.gfile.GFile, tf.io.gfile.stat(path).length
    else:
        opener, size = open, os.path.getsize(path)
    try:
        # A .keras file is a zip archive: a truncated or overwritten one has no central
        # directory at its end (Keras' own message for this is "File not found").
        with opener(path, "rb") as handle, zipfile.ZipFile(handle) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"{path} is damaged ({size} bytes, not a complete .keras zip file: "
                         "truncated, e.g. by an interrupted copy, or overwritten). "
                         f"{_rerun_hint(workdir)}") from error
    if "config.json" not in names:
        raise ValueError(f"{path} is a zip file but not a Keras model (no config.json inside). "
                         f"{_rerun_hint(workdir)}")
    return path


def load_trained_model(path, workdir):
    """The model saved at the end of training (`run_files.model_file`, safe mode), or a
    ValueError that says what is wrong with the file and how to write it again."""
    import keras

    check_model_file(path, workdir)
    try:
        return keras.models.load_model(path, safe_mode=True)
    except Exception as error:  # Keras raises many types for damaged or foreign content
        first = " ".join(str(error).split())[:300]
        raise ValueError(f"{path} could not be loaded as a keras_vit model "
                         f"({type(error).__name__}: {first}). It is damaged or was written by "
                         f"other code. {_rerun_hint(workdir)}") from error


def remove_partial_files(workdir):
    """Removes what killed exports left in the run's export directory and its `saved_model/`:
    the temporary files and directories of `keras_vit.fileio`'s atomic writes. Call only
    where no other export is writing at the same time (a run's own export directory)."""
    from keras_vit import fileio

    for folder in (run_files.export_dir(workdir), run_files.saved_model_dir(workdir)):
        fileio.remove_partial_files(folder)


def calibration_images(builder, split, image_size, count):
    """The first `count` images of `split` (from `builder`, as `tf_pipeline.get_builder`
    returns it) in 0..255 at the model's size, for int8 calibration. Pass the training split:
    the test split stays unseen by everything that shapes the file."""
    from ..data import tf_pipeline

    examples = tf_pipeline.resized_examples(builder, split, (image_size, image_size), count)
    return np.stack([image for image, _ in examples.as_numpy_iterator()]).astype(np.float32)


def served_budget(config):
    """The budget of patches a run's export serves each image within: `config.native_patches`
    for a run at native resolution, else None (squares at the model's size)."""
    return config.native_patches if config.get("native", "none") != "none" else None


def native_calibration_images(builder, split, count):
    """The first `count` images of `split` as uint8 `[height, width, 3]` arrays at their own
    sizes, for int8 calibration of a native-resolution model."""
    from keras_vit.preprocessing import decode_image

    from ..data import records

    examples = records.Split(builder, split).read_range(0, count)
    return [image for image in examples.map(lambda example: decode_image(example["image"]))
            .as_numpy_iterator()]


def run_calibration_images(builder, config, count):
    """int8's calibration images for the run of `config`: its training split's first `count`,
    as the export takes them (`served_budget`)."""
    if served_budget(config) is not None:
        return native_calibration_images(builder, config.train_split, count)
    return calibration_images(builder, config.train_split, config.image_size, count)


def export_model(model, workdir, class_names=None, tflite_kinds=(), representative=None,
                 export_dir=None, max_num_patches=None, onnx_kinds=()):
    """SavedModel at `<export_dir or the run's saved_model/>/<version>`, the run's TFLite
    files `model_<kind>.tflite` and ONNX files `model_<kind>.onnx`, at native resolution
    within `max_num_patches` when given. Returns {name: path}."""
    from keras_vit.deploy import export

    with native_output.dropped():  # a failed save's C++ warnings: the error names the path
        paths = {"saved_model": export.export_saved_model(
            model, export_dir or run_files.saved_model_dir(workdir), class_names=class_names,
            max_num_patches=max_num_patches)}
    for kind in tflite_kinds:
        path = run_files.tflite_file(workdir, kind)
        with native_output.dropped():
            size = export.export_tflite(model, path, quantization=TFLITE_KINDS[kind],
                                        representative_data=representative,
                                        max_num_patches=max_num_patches)
        logging.info("TFLite %s: %s (%.2f MB)", kind, path, size / 2**20)
        paths[f"tflite_{kind}"] = path
    for kind in onnx_kinds:
        path = run_files.onnx_file(workdir, kind)
        with native_output.dropped():
            size = export.export_onnx(model, path, class_names=class_names,
                                      preprocess="uint8" if max_num_patches is None else None,
                                      quantization=ONNX_KINDS[kind],
                                      representative_data=representative,
                                      max_num_patches=max_num_patches)
        logging.info("ONNX %s: %s (%.2f MB)", kind, path, size / 2**20)
        paths[f"onnx_{kind}"] = path
    logging.info("SavedModel: %s", paths["saved_model"])
    return paths


def export_in_tensorflow(workdir, tflite_kinds, onnx_kinds=()):
    """The SavedModel, TFLite and ONNX files of a run trained on another Keras backend (JAX):
    its `model.keras` exported by `train.export` in a TensorFlow process, serving the same
    signatures as a TensorFlow run's export. Without TensorFlow, a warning says the command
    to run where it is installed."""
    import subprocess

    command = [sys.executable, "-m", f"{COMMANDS_PACKAGE}.export", f"--workdir={workdir}",
               f"--tflite={','.join(tflite_kinds) or 'none'}",
               f"--onnx={','.join(onnx_kinds) or 'none'}"]
    if not cli.tensorflow_installed():
        logging.warning("The SavedModel, TFLite and ONNX export need TensorFlow, which is not "
                        "installed; where it is, run: KERAS_BACKEND=tensorflow python %s",
                        " ".join(command[1:]))
        return
    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    if subprocess.run(command, env=environment).returncode:
        raise RuntimeError(f"The export in TensorFlow failed (above); model.keras is in "
                           f"{run_files.export_dir(workdir)}. Retry with: KERAS_BACKEND="
                           f"tensorflow python -m {COMMANDS_PACKAGE}.export --workdir={workdir} "
                           f"--tflite={','.join(tflite_kinds)} "
                           f"--onnx={','.join(onnx_kinds) or 'none'}")

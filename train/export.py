"""A run's export: the trained model of a workdir as a TF Serving SavedModel and TFLite files,
written at the end of training (train.loop) and by this command:

    python -m train.export --workdir=/tmp/vit_quickstart --export_dir=/models/vit --tflite=all
    docker run -p 8501:8501 -v /models/vit:/models/vit -e MODEL_NAME=vit tensorflow/serving

Reads the run's `export/model.keras` (written at the end of training, loaded in safe mode), the
class names beside it and the run's `config.json` (see train.run_files); int8 TFLite calibrates
on training images. The conversions themselves are keras_vit.export's.

A user's error (bad flag, missing workdir, damaged model file, unwritable export directory)
ends with one "Error: ..." paragraph and exit status 1 (`--verbose` shows the traceback); every
flag is checked before the model is loaded, and local paths need no TensorFlow import, so flag
errors are reported at once. The command's flags are defined when it runs (`run`), not on
import, so that a training run (train.main's flags) can import this module for its own export.
"""

import os
import sys

import numpy as np
from absl import app, flags, logging

from . import cli, native_output, run_files

TFLITE_KINDS = {"float32": "none", "float16": "float16", "dynamic": "dynamic", "int8": "int8"}


def parse_tflite(value):
    """The TFLite kinds of a `--tflite` value ('none', 'all' or a comma list), in order, once
    each; ValueError naming the unknown ones and the valid values."""
    value = (value or "").strip()
    if value in ("", "none"):
        return []
    if value == "all":
        return list(TFLITE_KINDS)
    kinds = [kind.strip() for kind in value.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in TFLITE_KINDS]
    if unknown or not kinds:
        hint = ""
        if any(kind in ("none", "all") for kind in unknown):
            hint = " ('none' and 'all' stand alone, not in a list)"
        elif any(kind in ("int4", "uint8", "fp16", "fp32", "float") for kind in unknown):
            hint = " (fp16 is float16, fp32 float32; there is no int4)"
        raise ValueError(f"Unknown --tflite kind(s) {', '.join(map(repr, unknown))}{hint}: use "
                         f"'none', 'all', or a comma list of {', '.join(TFLITE_KINDS)}, e.g. "
                         "--tflite=float32,int8.")
    return list(dict.fromkeys(kinds))  # once each, in the given order


def check_calibration_images(count):
    """Raises ValueError unless `count` (--calibration_images) is a positive number."""
    if count is None or count < 1:
        raise ValueError(f"--calibration_images must be at least 1, got {count}: int8 "
                         "calibrates on that many training images (a few hundred is typical; the "
                         "default is 200).")
    return count


def _exists_and_isdir(path):
    """(exists, is a directory) of a local path, or of a URL through tf.io.gfile (gs://...).
    Not keras_vit.fileio: importing keras_vit loads TensorFlow, and flag errors are reported
    before that."""
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.exists(path), tf.io.gfile.isdir(path)
    return os.path.exists(path), os.path.isdir(path)


def path_exists(path):
    return _exists_and_isdir(path)[0]


def check_workdir(workdir):
    """Raises ValueError unless `workdir` is an existing directory (of a training run)."""
    if not workdir:
        raise ValueError("--workdir is empty: pass the --workdir of a training run "
                         "(python -m train.main --workdir=...).")
    exists, isdir = _exists_and_isdir(workdir)
    if not exists:
        raise ValueError(f"--workdir={workdir} does not exist: pass the --workdir of a "
                         "training run, or train first with python -m train.main "
                         f"--workdir={workdir} ...")
    if not isdir:
        raise ValueError(f"--workdir={workdir} is a file, not a directory: pass the --workdir "
                         "of a training run (it holds export/model.keras).")
    return workdir


def _rerun_hint(workdir):
    return (f"Write it again by rerunning the training command with the same --config and "
            f"--workdir={workdir} (and --config.export=True): it resumes from the last "
            "checkpoint and exports the model.")


def check_model_file(path, workdir):
    """Raises ValueError unless `path` looks like a complete `.keras` file (a zip archive with
    the model's config); says what is wrong and how to write it again. No TensorFlow import
    for a local path."""
    import zipfile

    if _exists_and_isdir(path)[1]:
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
    """The first `count` images of `split` (from `builder`, as `input_pipeline.get_builder`
    returns it) in 0..255 at the model's size, for int8 calibration. Pass the training split:
    the test split stays unseen by everything that shapes the file."""
    from . import input_pipeline

    examples = input_pipeline.resized_examples(builder, split, (image_size, image_size), count)
    return np.stack([image for image, _ in examples.as_numpy_iterator()]).astype(np.float32)


def export_model(model, workdir, class_names=None, tflite_kinds=(), representative=None,
                 export_dir=None):
    """SavedModel at `<export_dir or the run's saved_model/>/<version>` and the run's TFLite
    files `model_<kind>.tflite`. Returns {name: path}."""
    from keras_vit import export

    with native_output.dropped():  # a failed save's C++ warnings: the error names the path
        paths = {"saved_model": export.export_saved_model(
            model, export_dir or run_files.saved_model_dir(workdir), class_names=class_names)}
    for kind in tflite_kinds:
        path = run_files.tflite_file(workdir, kind)
        with native_output.dropped():
            size = export.export_tflite(model, path, quantization=TFLITE_KINDS[kind],
                                        representative_data=representative)
        logging.info("TFLite %s: %s (%.2f MB)", kind, path, size / 2**20)
        paths[f"tflite_{kind}"] = path
    logging.info("SavedModel: %s", paths["saved_model"])
    return paths


def export_in_tensorflow(workdir, tflite_kinds):
    """The SavedModel and TFLite files of a run trained on another Keras backend (JAX): its
    `model.keras` exported by `train.export` in a TensorFlow process, serving the same
    signatures as a TensorFlow run's export. Without TensorFlow, a warning says the command
    to run where it is installed."""
    import subprocess

    command = [sys.executable, "-m", f"{__package__}.export", f"--workdir={workdir}",
               f"--tflite={','.join(tflite_kinds) or 'none'}"]
    if not cli.tensorflow_installed():
        logging.warning("The SavedModel and TFLite export need TensorFlow, which is not "
                        "installed; where it is, run: KERAS_BACKEND=tensorflow python %s",
                        " ".join(command[1:]))
        return
    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    if subprocess.run(command, env=environment).returncode:
        raise RuntimeError(f"The export in TensorFlow failed (above); model.keras is in "
                           f"{run_files.export_dir(workdir)}. Retry with: KERAS_BACKEND="
                           f"tensorflow python -m {__package__}.export --workdir={workdir} "
                           f"--tflite={','.join(tflite_kinds)}")


# ----------------------------------------------------------------------------------------------
# The command: python -m train.export.

def define_flags():
    """The flags of `python -m train.export` (and `keras-vit-export`)."""
    flags.DEFINE_string("workdir", None, "Training workdir holding export/model.keras.")
    flags.DEFINE_string("export_dir", None, "SavedModel base directory (default workdir/export/"
                        "saved_model); the model goes to <export_dir>/<next version>.")
    flags.DEFINE_string("tflite", "none", "TFLite files to write into workdir/export: 'none', "
                        "'all', or a comma list of 'float32', 'float16', 'dynamic', 'int8'.")
    flags.DEFINE_integer("calibration_images", 200, "Training images used to calibrate int8.")
    flags.declare_key_flag("verbose")  # defined in train/cli.py; listed by --help
    flags.mark_flags_as_required(["workdir"])


def _file_system_error(error):
    """Whether `error` is one of TensorFlow's file errors (tf.io.gfile raises these, not
    OSError) for a path the user gave: missing, unreadable, unwritable, or a full disk."""
    tf = sys.modules.get("tensorflow")  # not imported for a flag error: nothing to look up
    return tf is not None and isinstance(error, (
        tf.errors.NotFoundError, tf.errors.PermissionDeniedError,
        tf.errors.FailedPreconditionError, tf.errors.AlreadyExistsError,
        tf.errors.ResourceExhaustedError, tf.errors.UnauthenticatedError))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}: every option is a flag, "
                             "e.g. --workdir=DIR (see --helpshort).")
    try:
        return export_workdir(flags.FLAGS)
    except Exception as error:
        if _file_system_error(error):  # reported as an OSError: one paragraph, no traceback
            raise OSError(" ".join(str(error.message).split())) from error
        raise


def export_workdir(options):
    """Exports the run in `options.workdir` as the flags' values `options` ask."""
    # Every flag first, most without importing TensorFlow (seconds): reported at once.
    kinds = parse_tflite(options.tflite)
    check_calibration_images(options.calibration_images)
    workdir = check_workdir(options.workdir)
    if options.export_dir is not None:
        from keras_vit import export as saved_model_export  # the one directory check

        saved_model_export.check_directory(options.export_dir, "--export_dir")
    model_path, encoder_path = run_files.model_file(workdir), run_files.encoder_file(workdir)
    if path_exists(encoder_path):
        raise app.UsageError(
            f"{workdir} holds an encoder pre-trained by masked patch prediction, which has no "
            "classes to serve: fine-tune it first, e.g. python -m train.main "
            f"--config=configs/mpp_finetune.py --config.pretrained={encoder_path} "
            "--workdir=NEW_DIR, then export that run.")
    if not path_exists(model_path):
        raise app.UsageError(
            f"No trained model at {model_path}: train first with python -m train.main "
            f"--workdir={workdir} ... (a run that ended with --config.export=False writes it "
            "when rerun with --config.export=True).")
    config = None
    if "int8" in kinds:
        import ml_collections

        from . import run_config

        config = run_config.saved(workdir, fix="restore it, or choose other --tflite kinds "
                                  "(int8 calibrates on the training data it names)")
        if config is None:
            raise app.UsageError(f"int8 calibrates on the run's training data, but "
                                 f"{run_files.config_file(workdir)} is missing; choose other "
                                 "--tflite kinds.")
        config = ml_collections.ConfigDict(config)
    check_model_file(model_path, workdir)

    import keras_vit  # noqa: F401  (registers the layers for loading)

    model = load_trained_model(model_path, workdir)
    representative = None
    if config is not None:
        from . import input_pipeline

        builder = input_pipeline.get_builder(config, for_training=False)
        representative = calibration_images(
            builder, config.train_split, config.image_size, options.calibration_images)
    export_model(model, workdir, run_files.read_class_names(workdir), kinds, representative,
                 export_dir=options.export_dir)


def run():
    """`python -m train.export`, and the `keras-vit-export` command (an installed package's
    console script)."""
    define_flags()
    cli.run(main)


if __name__ == "__main__":
    run()

"""`python -m train.export`: the trained model of a workdir as a TF Serving SavedModel, TFLite
files and ONNX files (train.run.export), as written at the end of training, again or with other
kinds:

    python -m train.export --workdir=/tmp/vit_quickstart --export_dir=/models/vit --tflite=all \
        --onnx=float32
    docker run -p 8501:8501 -v /models/vit:/models/vit -e MODEL_NAME=vit tensorflow/serving

Reads the run's `export/model.keras` (written at the end of training, loaded in safe mode), the
class names beside it and the run's `config.json` (see train.run.run_files); int8 TFLite calibrates
on training images. The conversions themselves are keras_vit.deploy.export's.

A user's error (bad flag, missing workdir, damaged model file, unwritable export directory)
ends with one "Error: ..." paragraph and exit status 1 (`--verbose` shows the traceback); every
flag is checked before the model is loaded, and local paths need no TensorFlow import, so flag
errors are reported at once.
"""

import sys

from absl import app, flags

from .console import cli
from .run import run_files
from .run.export import (ONNX_KINDS, TFLITE_KINDS, check_model_file, check_onnx_packages,
                         exists_and_isdir, export_model, load_trained_model, parse_kinds,
                         path_exists, run_calibration_images, served_budget)


def parse_tflite(value):
    """The TFLite kinds of a `--tflite` value ('none', 'all' or a comma list), in order, once
    each; ValueError naming the unknown ones and the valid values."""
    return parse_kinds(value, "--tflite", TFLITE_KINDS)


def parse_onnx(value):
    """The ONNX kinds of an `--onnx` value, as `parse_tflite`."""
    return parse_kinds(value, "--onnx", ONNX_KINDS)


def check_calibration_images(count):
    """Raises ValueError unless `count` (--calibration_images) is a positive number."""
    if count is None or count < 1:
        raise ValueError(f"--calibration_images must be at least 1, got {count}: int8 "
                         "calibrates on that many training images (a few hundred is typical; the "
                         "default is 200).")
    return count


def check_workdir(workdir):
    """Raises ValueError unless `workdir` is an existing directory (of a training run)."""
    if not workdir:
        raise ValueError("--workdir is empty: pass the --workdir of a training run "
                         "(python -m train.main --workdir=...).")
    exists, isdir = exists_and_isdir(workdir)
    if not exists:
        raise ValueError(f"--workdir={workdir} does not exist: pass the --workdir of a "
                         "training run, or train first with python -m train.main "
                         f"--workdir={workdir} ...")
    if not isdir:
        raise ValueError(f"--workdir={workdir} is a file, not a directory: pass the --workdir "
                         "of a training run (it holds export/model.keras).")
    return workdir


# ----------------------------------------------------------------------------------------------
# The command: python -m train.export.

def define_flags():
    """The flags of `python -m train.export` (and `keras-vit-export`)."""
    flags.DEFINE_string("workdir", None, "Training workdir holding export/model.keras.")
    flags.DEFINE_string("export_dir", None, "SavedModel base directory (default workdir/export/"
                        "saved_model); the model goes to <export_dir>/<next version>.")
    flags.DEFINE_string("tflite", "none", "TFLite files to write into workdir/export: 'none', "
                        "'all', or a comma list of 'float32', 'float16', 'dynamic', 'int8'.")
    flags.DEFINE_string("onnx", "none", "ONNX files to write into workdir/export: 'none', "
                        "'all', or a comma list of 'float32', 'int8'. Each takes uint8 pixels "
                        'of any size (resized and scaled in the graph); needs the "onnx" extra.')
    flags.DEFINE_integer("calibration_images", 200, "Training images used to calibrate int8.")
    flags.declare_key_flag("verbose")  # defined in train/console/cli.py; listed by --help
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
    onnx_kinds = parse_onnx(options.onnx)
    if onnx_kinds:
        check_onnx_packages(f"--onnx={options.onnx}")
    check_calibration_images(options.calibration_images)
    workdir = check_workdir(options.workdir)
    if options.export_dir is not None:
        from keras_vit.deploy import export as saved_model_export  # the one directory check

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
    int8 = "int8" in kinds or "int8" in onnx_kinds  # calibrated on the run's training images
    config = _run_config(workdir, need=int8)
    check_model_file(model_path, workdir)

    import keras_vit  # noqa: F401  (registers the layers for loading)

    model = load_trained_model(model_path, workdir)
    representative, budget = None, None
    if config is not None:
        budget = served_budget(config)
        if int8:
            from .data import tf_pipeline

            builder = tf_pipeline.get_builder(config, for_training=False)
            representative = run_calibration_images(builder, config,
                                                    options.calibration_images)
    export_model(model, workdir, run_files.read_class_names(workdir), kinds, representative,
                 export_dir=options.export_dir, max_num_patches=budget, onnx_kinds=onnx_kinds)


def _run_config(workdir, need):
    """The run's saved config (a ConfigDict): it says whether the run trained at native
    resolution (served so) and, for int8, the training data to calibrate on. Without it, None
    (the model is served at its size), unless `need`: then a UsageError."""
    import ml_collections

    from .run import run_config

    config = run_config.saved(workdir, fix="restore it: the export reads how the run trained "
                              "(its image sizes, the data int8 calibrates on)")
    if config is None and need:
        raise app.UsageError(f"int8 calibrates on the run's training data, but "
                             f"{run_files.config_file(workdir)} is missing; choose other "
                             "--tflite and --onnx kinds.")
    return None if config is None else ml_collections.ConfigDict(config)


def run():
    """`python -m train.export`, and the `keras-vit-export` command (an installed package's
    console script)."""
    define_flags()
    cli.run(main)


if __name__ == "__main__":
    run()

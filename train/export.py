"""Exports a trained workdir for production: SavedModel for TF Serving and TFLite files.

    python -m train.export --workdir=/tmp/vit_quickstart --export_dir=/models/vit --tflite=all
    docker run -p 8501:8501 -v /models/vit:/models/vit -e MODEL_NAME=vit tensorflow/serving

Reads the run's `export/model.keras` (written at the end of training, loaded in safe mode), the
class names beside it and the run's `config.json` (see train.run_files); int8 TFLite calibrates
on training images. The steps are train.export_run's, which the trainer's own export shares.

A user's error (bad flag, missing workdir, damaged model file, unwritable export directory)
ends with one "Error: ..." paragraph and exit status 1 (`--verbose` shows the traceback); every
flag is checked before the model is loaded.
"""

import sys

from absl import app, flags

from . import cli, export_run, run_files

flags.DEFINE_string("workdir", None, "Training workdir holding export/model.keras.")
flags.DEFINE_string("export_dir", None, "SavedModel base directory (default workdir/export/"
                    "saved_model); the model goes to <export_dir>/<next version>.")
flags.DEFINE_string("tflite", "none", "TFLite files to write into workdir/export: 'none', "
                    "'all', or a comma list of 'float32', 'float16', 'dynamic', 'int8'.")
flags.DEFINE_integer("calibration_images", 200, "Training images used to calibrate int8.")
flags.declare_key_flag("verbose")  # defined in train/cli.py; listed by --help


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
        return export(flags.FLAGS)
    except Exception as error:
        if _file_system_error(error):  # reported as an OSError: one paragraph, no traceback
            raise OSError(" ".join(str(error.message).split())) from error
        raise


def export(options):
    # Every flag first, most without importing TensorFlow (seconds): reported at once.
    kinds = export_run.parse_tflite(options.tflite)
    export_run.check_calibration_images(options.calibration_images)
    workdir = export_run.check_workdir(options.workdir)
    if options.export_dir is not None:
        from keras_vit import export as saved_model_export  # the one directory check

        saved_model_export.check_directory(options.export_dir, "--export_dir")
    model_path, encoder_path = run_files.model_file(workdir), run_files.encoder_file(workdir)
    if export_run.path_exists(encoder_path):
        raise app.UsageError(
            f"{workdir} holds an encoder pre-trained by masked patch prediction, which has no "
            "classes to serve: fine-tune it first, e.g. python -m train.main "
            f"--config=configs/mpp_finetune.py --config.pretrained={encoder_path} "
            "--workdir=NEW_DIR, then export that run.")
    if not export_run.path_exists(model_path):
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
    export_run.check_model_file(model_path, workdir)

    import keras_vit  # noqa: F401  (registers the layers for loading)

    model = export_run.load_trained_model(model_path, workdir)
    representative = None
    if config is not None:
        from . import input_pipeline

        builder = input_pipeline.get_builder(config, for_training=False)
        representative = export_run.calibration_images(
            builder, config.train_split, config.image_size, options.calibration_images)
    export_run.export_model(model, workdir, run_files.read_class_names(workdir), kinds,
                            representative, export_dir=options.export_dir)


def run():
    """The `keras-vit-export` command (an installed package's console script)."""
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)


if __name__ == "__main__":
    run()

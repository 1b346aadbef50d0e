"""Exports a trained workdir for production: SavedModel for TF Serving and TFLite files.

    python -m train.export --workdir=/tmp/vit_quickstart --export_dir=/models/vit --tflite=all
    docker run -p 8501:8501 -v /models/vit:/models/vit -e MODEL_NAME=vit tensorflow/serving

Reads `workdir/export/model.keras` (written at the end of training, loaded in safe mode), the
class names beside it and the run's `config.json`; int8 TFLite calibrates on eval images.
"""

import json
import os

from absl import app, flags

from train import exporting

flags.DEFINE_string("workdir", None, "Training workdir holding export/model.keras.")
flags.DEFINE_string("export_dir", None, "SavedModel base directory (default workdir/export/"
                    "saved_model); the model goes to <export_dir>/<next version>.")
flags.DEFINE_string("tflite", "none", "TFLite files to write into workdir/export: 'none', "
                    "'all', or a comma list of 'float32', 'float16', 'dynamic', 'int8'.")
flags.DEFINE_integer("calibration_images", 200, "Eval images used to calibrate int8.")


def main(argv):
    del argv
    import keras
    import ml_collections
    import tensorflow as tf

    import keras_vit  # noqa: F401  (registers the layers for loading)

    workdir = flags.FLAGS.workdir
    directory = os.path.join(workdir, "export")
    model_path = os.path.join(directory, "model.keras")
    if not tf.io.gfile.exists(model_path):
        raise app.UsageError(f"No trained model at {model_path}: train first with "
                             f"python -m train.main --workdir={workdir} ...")
    model = keras.models.load_model(model_path, safe_mode=True)
    names_path = os.path.join(directory, "class_names.txt")
    class_names = None
    if tf.io.gfile.exists(names_path):
        with tf.io.gfile.GFile(names_path) as handle:
            class_names = handle.read().splitlines()
    kinds = exporting.parse_tflite(flags.FLAGS.tflite)
    representative = None
    if "int8" in kinds:
        config_path = os.path.join(workdir, "config.json")
        if not tf.io.gfile.exists(config_path):
            raise app.UsageError(f"int8 calibrates on the run's eval data, but {config_path} "
                                 "is missing; choose other --tflite kinds.")
        with tf.io.gfile.GFile(config_path) as handle:
            config = ml_collections.ConfigDict(json.load(handle))
        representative = exporting.calibration_images(config, flags.FLAGS.calibration_images)
    exporting.export_model(model, directory, class_names, kinds, representative,
                           export_dir=flags.FLAGS.export_dir)


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir"])
    app.run(main)

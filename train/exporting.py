"""Export of a trained model: TF Serving SavedModel and TFLite files (used by the trainer at
the end of a run and by `python -m train.export`)."""

import os

import numpy as np
from absl import logging

TFLITE_KINDS = {"float32": "none", "float16": "float16", "dynamic": "dynamic", "int8": "int8"}


def parse_tflite(value):
    if value in ("", "none"):
        return []
    if value == "all":
        return list(TFLITE_KINDS)
    kinds = [kind.strip() for kind in value.split(",")]
    unknown = [kind for kind in kinds if kind not in TFLITE_KINDS]
    if unknown:
        raise ValueError(f"Unknown --tflite kinds {unknown}; use 'all' or some of "
                         f"{list(TFLITE_KINDS)}.")
    return kinds


def remove_partial_files(directory):
    """Removes what killed exports left in `directory` and its `saved_model/`: the
    `*.partial-*` files and directories that keras_vit writes before renaming into place. Call
    only where no other export is writing at the same time (a run's own export directory)."""
    import tensorflow as tf

    for folder in (directory, os.path.join(directory, "saved_model")):
        if not tf.io.gfile.isdir(folder):
            continue
        for name in tf.io.gfile.listdir(folder):
            name = name.rstrip("/")
            if ".partial-" in name:
                path = os.path.join(folder, name)
                if tf.io.gfile.isdir(path):
                    tf.io.gfile.rmtree(path)
                else:
                    tf.io.gfile.remove(path)


def calibration_images(config, count):
    """`count` eval images in 0..255 at the model's size, for int8 calibration."""
    from train import input_pipeline

    builder = input_pipeline.get_builder(config)
    examples = input_pipeline.resized_examples(builder, config.eval_split,
                                               (config.image_size, config.image_size), count)
    return np.stack([image for image, _ in examples.as_numpy_iterator()]).astype(np.float32)


def export_model(model, directory, class_names=None, tflite_kinds=(), representative=None,
                 export_dir=None):
    """SavedModel at `<export_dir or directory/saved_model>/<version>` and TFLite files
    `directory/model_<kind>.tflite`. Returns {name: path}."""
    from keras_vit import export

    paths = {"saved_model": export.export_saved_model(
        model, export_dir or os.path.join(directory, "saved_model"), class_names=class_names)}
    for kind in tflite_kinds:
        path = os.path.join(directory, f"model_{kind}.tflite")
        size = export.export_tflite(model, path, quantization=TFLITE_KINDS[kind],
                                    representative_data=representative)
        logging.info("TFLite %s: %s (%.2f MB)", kind, path, size / 2**20)
        paths[f"tflite_{kind}"] = path
    logging.info("SavedModel: %s", paths["saved_model"])
    return paths

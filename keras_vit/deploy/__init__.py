"""Deployment: a trained model leaves as a TF Serving SavedModel or a TFLite (LiteRT) model.

- `export`: `export_saved_model` and `export_tflite`, written atomically;
- `serving`: the SavedModel's REST and gRPC requests, as TF Serving decodes them.
"""

from keras_vit.imports import modules_on_first_use

__getattr__ = modules_on_first_use(__name__)  # each module loads on first use

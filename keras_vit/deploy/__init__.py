"""Deployment: a trained model leaves as a TF Serving SavedModel, a TFLite (LiteRT) model or an
ONNX file.

- `export`: `export_saved_model`, `export_tflite` and `export_onnx`, written atomically;
- `onnx_export`: the ONNX file (ONNX Runtime, OpenVINO, TensorRT), with the "onnx" extra;
- `serving`: the SavedModel's REST and gRPC requests, as TF Serving decodes them.
"""

from keras_vit.imports import modules_on_first_use

__getattr__ = modules_on_first_use(__name__)  # each module loads on first use

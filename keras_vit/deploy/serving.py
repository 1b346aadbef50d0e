"""A small client for a keras_vit model served by TF Serving (REST or gRPC).

    body = keras_vit.deploy.serving.rest_body(["cat.jpg", "dog.png"])     # POST to
    #   http://HOST:8501/v1/models/vit:predict
    request = keras_vit.deploy.serving.grpc_request(["cat.jpg"], model_name="vit")
    keras_vit.deploy.serving.top_classes(response)   # [[("cat", 0.91), ...], ...]

The server decodes `{"b64": ...}` values to the raw bytes the `serving_default` signature's
`image_bytes` input takes. gRPC needs `pip install tensorflow-serving-api`.
"""

import base64
import os

SIGNATURE = "serving_default"
INPUT = "image_bytes"


def read_images(images):
    """Bytes of each item: a path (str or PathLike) or bytes already read."""
    contents = []
    for image in images:
        if isinstance(image, (bytes, bytearray)):
            contents.append(bytes(image))
        elif isinstance(image, (str, os.PathLike)):
            with open(image, "rb") as handle:
                contents.append(handle.read())
        else:
            raise TypeError(f"Expected a file path or bytes, got {type(image).__name__}.")
    return contents


def rest_body(images, signature_name=SIGNATURE):
    """The JSON body of a REST predict request: `{"instances": [{"b64": ...}, ...]}`."""
    instances = [{"b64": base64.b64encode(content).decode("ascii")}
                 for content in read_images(images)]
    return {"signature_name": signature_name, "instances": instances}


def grpc_request(images, model_name, signature_name=SIGNATURE, version=None):
    """A `tensorflow_serving.apis.predict_pb2.PredictRequest` for the image files."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    if version is not None:
        request.model_spec.version.value = int(version)
    request.inputs[INPUT].CopyFrom(tf.make_tensor_proto(read_images(images), dtype=tf.string))
    return request


def top_classes(response):
    """(name or index, probability) pairs per image, best first, from a REST response dict
    (`{"predictions": [...]}`) or a gRPC `PredictResponse`."""
    if isinstance(response, dict):
        predictions = response.get("predictions")
        if predictions is None:
            raise ValueError(f"Not a predict response: {str(response)[:200]}")
        results = []
        for row in predictions:
            labels = row.get("top_k_names", row["top_k_indices"])
            results.append([(_text(label), float(p))
                            for label, p in zip(labels, row["top_k_probabilities"])])
        return results
    import tensorflow as tf

    outputs = {key: tf.make_ndarray(value) for key, value in response.outputs.items()}
    labels = outputs.get("top_k_names", outputs["top_k_indices"])
    return [[(_text(label), float(p)) for label, p in zip(row, probabilities)]
            for row, probabilities in zip(labels, outputs["top_k_probabilities"])]


def _text(label):
    if isinstance(label, bytes):
        return label.decode("utf-8")
    if isinstance(label, str):
        return label
    return int(label)

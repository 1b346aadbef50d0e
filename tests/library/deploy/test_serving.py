"""Serving the exported SavedModel as TF Serving does, and the client (keras_vit/deploy/serving.py).

TF Serving's binary is not available here, so its side is emulated in a subprocess that has
TensorFlow but never imports keras_vit (an import hook refuses it): it loads the SavedModel with
`tf.saved_model.load`, decodes the REST body the way the server does (JSON; each `{"b64": s}`
becomes the bytes of a DT_STRING element of the one named input) and answers in REST's row
format, and it answers the serialized gRPC `PredictRequest` with a `PredictResponse`. The test
process compares the answers with the Keras model on the same preprocessed pixels.
"""

import base64
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from export_fixtures import NUM_CLASSES, SIZE, WITHOUT_KERAS_VIT, keras_logits, tiny_vit
from keras_vit.deploy import export, serving

CLASS_NAMES = ["cat", "dog", "fox", "owl", "elk", "bee", "ant"]

SERVER = WITHOUT_KERAS_VIT + r'''
import base64, json, sys

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

export_dir, work = sys.argv[1], sys.argv[2]
loaded = tf.saved_model.load(export_dir)
results = {"inputs": {name: sorted(signature.structured_input_signature[1])
                      for name, signature in loaded.signatures.items()}}


def jsonable(value):
    if isinstance(value, np.ndarray):
        return [jsonable(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value.item()


def rest_predict(body):
    """TF Serving's REST predict, row ("instances") format, for a one-input signature."""
    signature = loaded.signatures[body.get("signature_name", "serving_default")]
    (name, spec), = signature.structured_input_signature[1].items()
    instances = [base64.b64decode(item["b64"]) if isinstance(item, dict) and set(item) == {"b64"}
                 else item for item in body["instances"]]
    outputs = {key: value.numpy() for key, value in
               signature(**{name: tf.constant(instances, dtype=spec.dtype)}).items()}
    np.savez(f"{work}/rest_outputs.npz", **outputs)
    return {"predictions": [{key: jsonable(value[row]) for key, value in outputs.items()}
                            for row in range(len(instances))]}


with open(f"{work}/body.json") as handle:
    body = json.loads(handle.read())
with open(f"{work}/response.json", "w") as handle:
    json.dump(rest_predict(body), handle)

# gRPC: PredictRequest in, PredictResponse out.
with open(f"{work}/request.pb", "rb") as handle:
    request = predict_pb2.PredictRequest.FromString(handle.read())
signature = loaded.signatures[request.model_spec.signature_name or "serving_default"]
outputs = signature(**{key: tf.constant(tf.make_ndarray(value))
                       for key, value in request.inputs.items()})
response = predict_pb2.PredictResponse()
response.model_spec.CopyFrom(request.model_spec)
for key, value in outputs.items():
    response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
with open(f"{work}/response.pb", "wb") as handle:
    handle.write(response.SerializeToString())

# Pixels of other sizes through serving_images.
pixels = np.load(f"{work}/pixels.npz")
np.savez(f"{work}/images_outputs.npz", **{
    f"{name}.{key}": value.numpy() for name in pixels.files for key, value in
    loaded.signatures["serving_images"](images=tf.constant(pixels[name])).items()})

# Broken files: an error for the request, and the model still serves the next one.
errors = {}
for name, content in json.load(open(f"{work}/corrupt.json")).items():
    try:
        loaded.signatures["serving_default"](
            image_bytes=tf.constant([base64.b64decode(item) for item in content]))
        errors[name] = None
    except Exception as error:  # reported to the test, which checks the type
        errors[name] = type(error).__name__
results["errors"] = errors
after = loaded.signatures["serving_default"](
    image_bytes=tf.constant([base64.b64decode(body["instances"][0]["b64"])]))
results["after_errors"] = after["logits"].numpy().tolist()
results["keras_vit_imported"] = any(name.split(".")[0] == "keras_vit" for name in sys.modules)
assert "keras_vit" not in sys.modules
with open(f"{work}/results.json", "w") as handle:
    json.dump(results, handle)
'''


def reference_logits(model, content):
    """The Keras model's logits on an encoded image, preprocessed as the spec says."""
    image = tf.io.decode_image(content, channels=3, expand_animations=False)
    image = tf.image.resize(tf.cast(image, tf.float32), (SIZE, SIZE), method="bilinear")
    return keras_logits(model, image[None])[0]


def smooth(height, width, channels, seed):
    """A smooth uint8 pattern (gradients and waves), like a photo more than noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    planes = [127.5 + 120 * np.sin(2 * np.pi * (rng.uniform(0.5, 3) * xx + rng.uniform(0.5, 3)
                                                * yy) + rng.uniform(0, 6))
              for _ in range(channels)]
    return np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)


def _pil_bytes(array, kind, **kwargs):
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, kind, **kwargs)
    return buffer.getvalue()


def image_files(folder):
    """Image files of several formats, modes and sizes: {name: path}."""
    from PIL import Image
    contents = {
        "rgb.jpg": tf.io.encode_jpeg(smooth(40, 56, 3, 1), quality=90).numpy(),
        "rgb.png": tf.io.encode_png(smooth(32, 32, 3, 2)).numpy(),
        "gray.png": tf.io.encode_png(smooth(20, 28, 1, 3)).numpy(),
        "rgba.png": tf.io.encode_png(smooth(48, 36, 4, 4)).numpy(),
        "gray.jpg": tf.io.encode_jpeg(smooth(64, 30, 1, 5)).numpy(),
        "rgb.bmp": _pil_bytes(smooth(24, 40, 3, 6), "BMP"),
        # Two frames: the first is the image.
        "two_frames.gif": _pil_bytes(smooth(30, 30, 3, 7), "GIF", save_all=True,
                                     append_images=[Image.fromarray(smooth(30, 30, 3, 8))]),
    }
    paths = {}
    for name, content in contents.items():
        paths[name] = os.path.join(folder, name)
        with open(paths[name], "wb") as handle:
            handle.write(content)
    return paths


@pytest.fixture(scope="module")
def model():
    return tiny_vit()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return image_files(str(tmp_path_factory.mktemp("images")))


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


@pytest.fixture(scope="module")
def served(model, files, tmp_path_factory):
    """Runs the emulated server once on a fresh export; returns what it answered."""
    root = tmp_path_factory.mktemp("serving")
    export_dir = export.export_saved_model(model, str(root / "models" / "vit"),
                                           class_names=CLASS_NAMES)
    work = root / "work"
    work.mkdir()
    names = list(files)
    with open(work / "body.json", "w") as handle:
        json.dump(serving.rest_body([files[name] for name in names]), handle)
    request = serving.grpc_request([files[name] for name in names[:3]], model_name="vit")
    (work / "request.pb").write_bytes(request.SerializeToString())
    rng = np.random.default_rng(9)
    pixels = {"other_size": rng.integers(0, 256, (3, 45, 27, 3)).astype(np.float32),
              "model_size": rng.integers(0, 256, (2, SIZE, SIZE, 3)).astype(np.float32),
              "one_pixel": rng.integers(0, 256, (1, 1, 1, 3)).astype(np.float32)}
    np.savez(work / "pixels.npz", **pixels)
    png = _read(files["rgb.png"])
    encode = lambda *items: [base64.b64encode(item).decode("ascii") for item in items]  # noqa
    corrupt = {"garbage": encode(b"this is not an image"),
               "truncated_png": encode(png[:len(png) // 2]),
               "empty": encode(b""),
               "good_then_bad": encode(png, b"\x89PNG\r\n\x1a\n broken")}
    (work / "corrupt.json").write_text(json.dumps(corrupt))
    script = root / "server.py"
    script.write_text(SERVER)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, str(script), export_dir, str(work)], cwd=str(root),
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-6000:]
    with open(work / "results.json") as handle:
        results = json.load(handle)
    with open(work / "response.json") as handle:
        results["rest_response"] = json.load(handle)
    results["rest_outputs"] = dict(np.load(work / "rest_outputs.npz", allow_pickle=True))
    results["images_outputs"] = dict(np.load(work / "images_outputs.npz", allow_pickle=True))
    from tensorflow_serving.apis import predict_pb2
    results["grpc_response"] = predict_pb2.PredictResponse.FromString(
        (work / "response.pb").read_bytes())
    results.update(names=names, pixels=pixels, request=request, export_dir=export_dir)
    return results


def test_server_never_imports_keras_vit(served):
    assert served["keras_vit_imported"] is False
    assert served["inputs"] == {"serving_default": ["image_bytes"], "serving_images": ["images"]}


def _softmax(logits):
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def _check_outputs(outputs, expected_logits):
    np.testing.assert_allclose(outputs["logits"], expected_logits, rtol=0, atol=1e-5)
    assert np.ptp(expected_logits, axis=-1).min() > 0.5  # not a trivial model
    np.testing.assert_allclose(outputs["probabilities"], _softmax(expected_logits), atol=1e-6)
    k = min(5, NUM_CLASSES)
    order = np.argsort(-outputs["logits"], axis=-1)[:, :k]
    np.testing.assert_array_equal(outputs["top_k_indices"], order)
    np.testing.assert_allclose(outputs["top_k_probabilities"],
                               np.take_along_axis(outputs["probabilities"], order, -1), atol=1e-7)
    names = np.asarray(outputs["top_k_names"]).astype(str)
    np.testing.assert_array_equal(names, np.asarray(CLASS_NAMES)[order])


def test_rest_image_bytes_match_keras(served, model, files):
    expected = np.stack([reference_logits(model, _read(files[name])) for name in served["names"]])
    outputs = served["rest_outputs"]
    assert outputs["logits"].shape == (len(files), NUM_CLASSES)  # a batch of mixed sizes
    _check_outputs(outputs, expected)
    # Decoded as RGB whatever the file holds: grey and RGBA differ from a plain copy otherwise.
    assert len({tuple(np.round(row, 4)) for row in expected}) == len(files)


def test_rest_response_to_top_classes(served):
    response = served["rest_response"]
    assert len(response["predictions"]) == len(served["names"])
    classes = serving.top_classes(response)
    outputs = served["rest_outputs"]
    assert len(classes) == len(served["names"])
    for row, pairs in enumerate(classes):
        expected = [CLASS_NAMES[index] for index in outputs["top_k_indices"][row]]
        assert [name for name, _ in pairs] == expected
        np.testing.assert_allclose([p for _, p in pairs], outputs["top_k_probabilities"][row],
                                   atol=1e-6)
        assert all(isinstance(name, str) and isinstance(p, float) for name, p in pairs)
        assert [p for _, p in pairs] == sorted((p for _, p in pairs), reverse=True)


def test_serving_images_any_size(served, model):
    outputs = served["images_outputs"]
    for name, pixels in served["pixels"].items():
        resized = tf.image.resize(pixels, (SIZE, SIZE), method="bilinear")
        expected = keras_logits(model, resized)
        _check_outputs({key.split(".", 1)[1]: value for key, value in outputs.items()
                        if key.startswith(name + ".")}, expected)
    # At the model's size the pixels go in untouched.
    np.testing.assert_allclose(outputs["model_size.logits"],
                               keras_logits(model, served["pixels"]["model_size"]), atol=1e-5)


def test_corrupt_bytes_are_an_invalid_argument(served):
    assert served["errors"] == {"garbage": "InvalidArgumentError",
                                "truncated_png": "InvalidArgumentError",
                                "empty": "InvalidArgumentError",
                                "good_then_bad": "InvalidArgumentError"}
    np.testing.assert_allclose(served["after_errors"][0], served["rest_outputs"]["logits"][0],
                               atol=1e-6)


def test_corrupt_bytes_in_process(served):
    loaded = tf.saved_model.load(served["export_dir"])
    with pytest.raises(tf.errors.InvalidArgumentError):
        loaded.signatures["serving_default"](image_bytes=tf.constant([b"GIF89a\x00\x01"]))


def test_rest_body(files, tmp_path):
    paths = [files["rgb.jpg"], files["gray.png"]]
    body = serving.rest_body(paths)
    assert json.loads(json.dumps(body)) == body  # plain JSON
    assert body.get("signature_name", "serving_default") == "serving_default"
    assert set(body) <= {"signature_name", "instances"}
    assert [set(item) for item in body["instances"]] == [{"b64"}, {"b64"}]
    assert [base64.b64decode(item["b64"]) for item in body["instances"]] == [
        _read(path) for path in paths]
    # Bytes already read and path-like objects too, in order.
    import pathlib
    mixed = serving.rest_body([_read(paths[0]), pathlib.Path(paths[1])])
    assert mixed["instances"] == body["instances"]
    other = serving.rest_body([files["rgb.png"]], signature_name="other")
    assert other["signature_name"] == "other"
    with pytest.raises(TypeError):
        serving.rest_body([123])
    with pytest.raises(FileNotFoundError):
        serving.rest_body([str(tmp_path / "missing.jpg")])


def test_grpc_request(files):
    from tensorflow_serving.apis import predict_pb2
    paths = [files["rgb.jpg"], files["rgba.png"], files["rgb.bmp"]]
    request = serving.grpc_request(paths, model_name="vit")
    assert isinstance(request, predict_pb2.PredictRequest)
    assert request.model_spec.name == "vit"
    assert request.model_spec.signature_name == "serving_default"
    assert not request.model_spec.HasField("version")
    assert list(request.inputs) == ["image_bytes"]
    tensor = request.inputs["image_bytes"]
    assert tensor.dtype == tf.string.as_datatype_enum  # DT_STRING
    assert [dim.size for dim in tensor.tensor_shape.dim] == [3]
    assert list(tensor.string_val) == [_read(path) for path in paths]
    versioned = serving.grpc_request(paths[:1], model_name="vit", version=2)
    assert versioned.model_spec.version.value == 2
    assert [dim.size for dim in versioned.inputs["image_bytes"].tensor_shape.dim] == [1]


def test_grpc_round_trip(served):
    response = served["grpc_response"]
    assert response.model_spec.name == "vit"
    classes = serving.top_classes(response)
    # The same three first files as the REST body: the same answers.
    assert len(classes) == 3
    for got, want in zip(classes, serving.top_classes(served["rest_response"])[:3]):
        assert [name for name, _ in got] == [name for name, _ in want]
        np.testing.assert_allclose([p for _, p in got], [p for _, p in want], atol=1e-6)
        assert all(isinstance(name, str) for name, _ in got)


def test_top_classes_parsing():
    from tensorflow_serving.apis import predict_pb2
    rest = {"predictions": [
        {"logits": [0.0] * 3, "top_k_indices": [2, 0], "top_k_probabilities": [0.7, 0.2],
         "top_k_names": ["fox", "cat"]},
        {"logits": [0.0] * 3, "top_k_indices": [1, 2], "top_k_probabilities": [0.6, 0.3],
         "top_k_names": ["dog", "fox"]}]}
    assert serving.top_classes(rest) == [[("fox", 0.7), ("cat", 0.2)],
                                         [("dog", 0.6), ("fox", 0.3)]]
    for row in rest["predictions"]:
        del row["top_k_names"]
    assert serving.top_classes(rest) == [[(2, 0.7), (0, 0.2)], [(1, 0.6), (2, 0.3)]]
    with pytest.raises(ValueError):
        serving.top_classes({"error": "Servable not found"})

    response = predict_pb2.PredictResponse()
    response.outputs["top_k_indices"].CopyFrom(
        tf.make_tensor_proto(np.array([[2, 0], [1, 2]], np.int32)))
    response.outputs["top_k_probabilities"].CopyFrom(
        tf.make_tensor_proto(np.array([[0.75, 0.25], [0.5, 0.125]], np.float32)))
    assert serving.top_classes(response) == [[(2, 0.75), (0, 0.25)], [(1, 0.5), (2, 0.125)]]
    response.outputs["top_k_names"].CopyFrom(
        tf.make_tensor_proto(np.array([["fox", "cat"], ["dog", "fox"]], object)))
    result = serving.top_classes(response)
    assert result == [[("fox", 0.75), ("cat", 0.25)], [("dog", 0.5), ("fox", 0.125)]]
    assert all(type(name) is str for row in result for name, _ in row)
    assert all(type(p) is float for row in result for _, p in row)

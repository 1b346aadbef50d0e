"""Export at native resolution (keras_vit/deploy/native_export.py through deploy.export's
`max_num_patches`): a SavedModel serving a wide and a tall image in one request, each at its own
aspect ratio, with the logits `NaFlexViT` gives in Python; its `serving_patches` and their
checks; TFLite files taking the NaFlex arrays at a fixed budget; and the arguments' errors."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import native
from keras_vit.deploy import export
from export_fixtures import WITHOUT_KERAS_VIT
from model_fixtures import random_tiny_vit

PATCH, BUDGET = 8, 24
NAMES = ["a", "b", "c", "d", "e"]


@pytest.fixture(scope="module")
def model():
    return random_tiny_vit(classifier="map", class_token=False)


@pytest.fixture(scope="module")
def images():
    """A wide, a tall and a small square image of smooth random colours (resizing noise would
    test only the resize)."""
    rng = np.random.default_rng(0)

    def smooth(height, width):
        coarse = rng.integers(0, 256, (4, 4, 3)).astype(np.float32)
        return tf.cast(tf.image.resize(coarse[None], (height, width))[0], tf.uint8).numpy()

    return [smooth(40, 150), smooth(130, 30), smooth(9, 9)]


@pytest.fixture(scope="module")
def served(model, tmp_path_factory):
    path = export.export_saved_model(model, str(tmp_path_factory.mktemp("native")),
                                     class_names=NAMES, max_num_patches=BUDGET)
    return path, tf.saved_model.load(path)


def _expected(model, images):
    return np.asarray(native.NaFlexViT(model)(native.prepare(images, PATCH, BUDGET)))


def test_one_request_serves_a_wide_and_a_tall_image_each_at_its_own_aspect(model, images,
                                                                           served):
    path, loaded = served
    encoded = [tf.io.encode_png(image).numpy() for image in images]
    outputs = loaded.signatures["serving_default"](image_bytes=tf.constant(encoded))
    grids = [[size // PATCH for size in native.image_size_for_budget(*image.shape[:2], PATCH,
                                                                     BUDGET)]
             for image in images]
    assert outputs["spatial_shapes"].numpy().tolist() == grids
    assert grids[0][1] > grids[0][0] and grids[1][0] > grids[1][1]  # wide, then tall
    expected = _expected(model, images)
    np.testing.assert_allclose(outputs["logits"].numpy(), expected, atol=1e-5 * np.abs(
        expected).max())
    top = np.argsort(-expected, axis=1)[:, 0]
    assert outputs["top_k_names"].numpy()[:, 0].tolist() == [NAMES[i].encode() for i in top]
    with open(os.path.join(path, export.NATIVE_ASSET)) as handle:
        assert json.load(handle) == {"patch_size": PATCH, "max_num_patches": BUDGET}


def test_a_server_without_keras_vit_serves_it(images, served):
    """TF Serving has TensorFlow alone: the budget search, resize and model are all graph."""
    path, loaded = served
    script = WITHOUT_KERAS_VIT + r'''
import numpy as np, tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
files = [open(name, "rb").read() for name in sys.argv[2:]]
np.save(sys.stdout.buffer, serve(image_bytes=tf.constant(files))["logits"].numpy())
'''
    names = []
    for index, image in enumerate(images):
        names.append(os.path.join(path, "..", f"image_{index}.png"))
        tf.io.write_file(names[-1], tf.io.encode_png(image))
    result = subprocess.run([sys.executable, "-c", script, path, *names], capture_output=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    expected = loaded.signatures["serving_default"](image_bytes=tf.stack(
        [tf.io.read_file(name) for name in names]))["logits"].numpy()
    np.testing.assert_array_equal(np.load(io.BytesIO(result.stdout)), expected)


def test_serving_images_and_serving_patches_give_the_same_logits(model, images, served):
    _, loaded = served
    expected = _expected(model, images[:1] * 2)
    pixels = tf.constant(np.stack(images[:1] * 2).astype(np.float32))
    np.testing.assert_allclose(loaded.signatures["serving_images"](images=pixels)["logits"],
                               expected, atol=1e-5 * np.abs(expected).max())
    arrays = native.prepare(images, PATCH, BUDGET)
    outputs = loaded.signatures["serving_patches"](**{k: tf.constant(v)
                                                      for k, v in arrays.items()})
    np.testing.assert_allclose(outputs["logits"], _expected(model, images), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "pixel_values": a["pixel_values"] * 127.5 + 127.5}, "scaled to [-1, 1]"),
    (lambda a: {**a, "spatial_shapes": a["spatial_shapes"] * 3}, "at most 24 patches"),
    (lambda a: {**a, "spatial_shapes": a["spatial_shapes"] * 0}, "each at least 1"),
    (lambda a: {**a, "pixel_attention_mask": np.roll(a["pixel_attention_mask"], 1, axis=1)},
     "pixel_attention_mask must be 1 for the rows x columns patches of each image"),
])
def test_serving_patches_refuses_arrays_that_do_not_hold_what_they_say(images, served, change,
                                                                       message):
    _, loaded = served
    arrays = change(native.prepare(images, PATCH, BUDGET))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message.replace("[", r"\[")
                       .replace("]", r"\]")):
        loaded.signatures["serving_patches"](**{k: tf.constant(v) for k, v in arrays.items()})


def test_serving_default_refuses_an_empty_request_and_bytes_that_are_no_image(served):
    _, loaded = served
    with pytest.raises(tf.errors.InvalidArgumentError, match="got no images"):
        loaded.signatures["serving_default"](image_bytes=tf.constant([], tf.string))
    with pytest.raises(tf.errors.InvalidArgumentError):
        loaded.signatures["serving_default"](image_bytes=tf.constant([b"not an image"]))


def test_tflite_takes_the_arrays_at_the_budget(model, images, tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    arrays = native.prepare(images, PATCH, BUDGET)
    expected = _expected(model, images)
    results = {}
    for kind in ("none", "int8"):
        path = str(tmp_path / f"{kind}.tflite")
        export.export_tflite(model, path, quantization=kind, max_num_patches=BUDGET,
                             representative_data=images * 4)
        runner = Interpreter(model_path=path).get_signature_runner()
        assert set(runner.get_input_details()) == set(arrays)
        results[kind] = runner(**arrays)["logits"]
    np.testing.assert_allclose(results["none"], expected, atol=1e-5 * np.abs(expected).max())
    # int8 holds the dense layers' activations in 8 bits: close, not equal.
    error = np.abs(results["int8"] - expected).max() / np.abs(expected).max()
    assert 0 < error < 0.25, error


@pytest.mark.parametrize("arguments, error, message", [
    ({"model": "naflex"}, ValueError, "pass max_num_patches"),
    ({"max_num_patches": 0}, ValueError, "max_num_patches"),
    ({"max_num_patches": "256"}, TypeError, "max_num_patches"),
    ({"model": "rope", "max_num_patches": 24}, ValueError, "rope='axial'"),
    ({"model": "keras", "max_num_patches": 24}, TypeError, "a keras_vit model"),
])
def test_export_arguments_of_native_models_are_named(model, tmp_path, arguments, error,
                                                     message):
    import keras

    candidates = {"naflex": native.NaFlexViT(model), "rope": keras_vit.vit(
        "Ti/16", image_size=32, patch_size=8, num_classes=5, hidden_size=24, mlp_dim=48,
        num_heads=3, num_layers=1, rope="axial"),
        "keras": keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten()])}
    arguments = dict(arguments)
    subject = candidates[arguments.pop("model", None)] if "model" in arguments else model
    for write in (lambda: export.export_saved_model(subject, str(tmp_path), **arguments),
                  lambda: export.export_tflite(subject, str(tmp_path / "m.tflite"), **arguments)):
        with pytest.raises(error, match=message):
            write()
    assert not os.listdir(tmp_path)


def test_int8_calibration_images_of_a_native_model_are_checked(model, images, tmp_path):
    path = str(tmp_path / "m.tflite")
    with pytest.raises(TypeError, match="list of uint8 images"):
        export.export_tflite(model, path, "int8", representative_data="photos",
                             max_num_patches=BUDGET)
    with pytest.raises(TypeError, match="Image 1 must hold uint8"):
        export.export_tflite(model, path, "int8", max_num_patches=BUDGET,
                             representative_data=[images[0], images[1].astype(np.float32)])
    assert not os.path.exists(path)

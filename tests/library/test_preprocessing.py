"""Preprocessing (keras_vit/preprocessing.py): one image file gives the same model inputs
through every path that feeds a model - the input pipeline's evaluation, the exported
SavedModel's `serving_default`, and `preprocess_inputs` after a decode and a resize."""

import io

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import preprocessing
from keras_vit.deploy import export
from train.data import tf_pipeline

SIZE = 8


@pytest.fixture(scope="module")
def jpeg():
    """A noisy 23x37 JPEG: not square, not the model's size, so every path has to resize."""
    pixels = np.random.default_rng(0).integers(0, 256, (23, 37, 3), dtype=np.uint8)
    return tf.io.encode_jpeg(pixels, quality=90).numpy()


def _user_path(content):
    """What the README tells users: decode, resize, then `preprocess_inputs`."""
    image = tf.io.decode_jpeg(content, channels=3)
    return np.asarray(keras_vit.preprocess_inputs(
        tf.image.resize(image, (SIZE, SIZE), method="bilinear")))


def _input_pipeline_eval(content):
    dataset = tf.data.Dataset.from_tensors(content).map(
        lambda encoded: tf_pipeline.preprocess_eval(encoded, SIZE))
    return next(iter(dataset)).numpy()


def _saved_model_serving_default(content, directory):
    """The model inputs the SavedModel's `serving_default` computes: exported with a model
    that only flattens them, its `logits` are those inputs."""
    flatten = keras.Sequential([keras.Input((SIZE, SIZE, 3)), keras.layers.Flatten()])
    path = export.export_saved_model(flatten, str(directory))
    serve = tf.saved_model.load(path).signatures["serving_default"]
    logits = serve(image_bytes=tf.constant([content]))["logits"]
    return logits.numpy().reshape(SIZE, SIZE, 3)


def test_same_jpeg_same_model_inputs_for_training_serving_and_users(jpeg, tmp_path):
    expected = _user_path(jpeg)
    assert expected.shape == (SIZE, SIZE, 3) and -1 <= expected.min() < expected.max() <= 1
    np.testing.assert_array_equal(_input_pipeline_eval(jpeg), expected)
    np.testing.assert_array_equal(_saved_model_serving_default(jpeg, tmp_path), expected)


def test_scale_pixels_maps_0_255_to_minus_1_1():
    pixels = np.array([0.0, 127.5, 255.0], np.float32)
    np.testing.assert_array_equal(preprocessing.scale_pixels(pixels), [-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(preprocessing.scale_pixels(tf.constant(pixels)).numpy(),
                                  [-1.0, 0.0, 1.0])


def test_decode_and_resize_gives_rgb_float_pixels_of_the_size():
    gray = io.BytesIO(tf.io.encode_png(np.full((5, 9, 1), 200, np.uint8)).numpy()).getvalue()
    pixels = preprocessing.decode_and_resize(gray, (4, 6))
    assert pixels.dtype == tf.float32 and pixels.shape == (4, 6, 3)
    np.testing.assert_allclose(pixels.numpy(), 200.0)

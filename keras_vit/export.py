"""Production export: a SavedModel for TF Serving and TFLite (LiteRT) models for devices.

    path = keras_vit.export.export_saved_model(model, "/models/vit", class_names=names)
    keras_vit.export.export_tflite(model, "vit.tflite", quantization="int8",
                                   representative_data=images)

The SavedModel carries its own preprocessing (decode, RGB, resize, scale to [-1, 1]) so clients
send image files or raw pixels; it loads with TensorFlow alone, without keras_vit. Both writers
build the result under a temporary name and rename it into place, so an interrupted export never
leaves a half-written version or file where a server or app would find it.
"""

import os
import tempfile

import numpy as np

QUANTIZATIONS = ("none", "float16", "dynamic", "int8")
DEFAULT_TOP_K = 5


def _image_size(model):
    shape = model.input_shape
    if len(shape) != 4 or shape[-1] != 3 or None in shape[1:3]:
        raise ValueError(f"Expected a model of images [batch, height, width, 3], got input "
                         f"shape {shape}.")
    return shape[1], shape[2]


def next_version(base_dir):
    """The next free integer version under `base_dir` (1 for a new or empty one)."""
    import tensorflow as tf

    if not tf.io.gfile.isdir(base_dir):
        return 1
    versions = [int(name.rstrip("/")) for name in tf.io.gfile.listdir(base_dir)
                if name.rstrip("/").isdigit()]
    return max(versions, default=0) + 1


def _serving_functions(model, class_names, top_k):
    """The two signature functions: encoded image bytes, and pixel batches in 0..255."""
    import tensorflow as tf

    height, width = _image_size(model)
    k = min(top_k, model.output_shape[-1])
    names = tf.constant(list(class_names)) if class_names is not None else None

    def predict(pixels):
        """Float pixels [N, h, w, 3] in 0..255, any h and w -> named outputs."""
        pixels = tf.image.resize(tf.cast(pixels, tf.float32), (height, width), method="bilinear")
        logits = tf.cast(model((pixels - 127.5) / 127.5, training=False), tf.float32)
        probabilities = tf.nn.softmax(logits, axis=-1)
        top_probabilities, top_indices = tf.math.top_k(probabilities, k=k)
        outputs = {"logits": logits, "probabilities": probabilities,
                   "top_k_indices": top_indices, "top_k_probabilities": top_probabilities}
        if names is not None:
            outputs["top_k_names"] = tf.gather(names, top_indices)
        return outputs

    def decode(encoded):
        # Any size, grayscale or RGBA: decoded to RGB, resized here so the batch stacks.
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        return tf.image.resize(tf.cast(image, tf.float32), (height, width), method="bilinear")

    def serve_bytes(image_bytes):
        pixels = tf.map_fn(decode, image_bytes,
                           fn_output_signature=tf.TensorSpec((height, width, 3), tf.float32))
        return predict(pixels)

    def serve_images(images):
        return predict(images)

    return serve_bytes, serve_images


def export_saved_model(model, base_dir, class_names=None, version=None, top_k=DEFAULT_TOP_K):
    """Writes `model` as a TF Serving SavedModel at `<base_dir>/<version>` and returns the path.

    Signatures:
        serving_default: `image_bytes` string [N] of JPEG/PNG/GIF/BMP files.
        serving_images: `images` float32 [N, H, W, 3] in 0..255, any H and W.
    Outputs: `logits`, `probabilities`, `top_k_indices`, `top_k_probabilities` and, with
    `class_names`, `top_k_names`.

    Args:
        model: a Keras model of images scaled to [-1, 1] (as `keras_vit` builds).
        base_dir: the model's base directory, as TF Serving's `--model_base_path`.
        class_names: optional names of the classes, in label order.
        version: integer version; default the next free one.
        top_k: number of top classes returned (capped at the number of classes).
    """
    import keras
    import tensorflow as tf

    if class_names is not None and len(class_names) != model.output_shape[-1]:
        raise ValueError(f"{len(class_names)} class names for a model with "
                         f"{model.output_shape[-1]} outputs.")
    version = next_version(base_dir) if version is None else int(version)
    final = os.path.join(base_dir, str(version))
    if tf.io.gfile.exists(final):
        raise FileExistsError(f"{final} already exists; TF Serving versions are immutable. "
                              "Pass another version or leave it out for the next free one.")
    serve_bytes, serve_images = _serving_functions(model, class_names, top_k)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve_bytes,
                         input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    archive.add_endpoint("serving_images", serve_images, input_signature=[
        tf.TensorSpec([None, None, None, 3], tf.float32, name="images")])
    tf.io.gfile.makedirs(base_dir)
    # A dot-name TF Serving ignores; renamed to the version only once complete.
    temporary = os.path.join(base_dir, f".partial-{version}-{os.getpid()}")
    try:
        archive.write_out(temporary, verbose=False)
        tf.io.gfile.rename(temporary, final)
    finally:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.rmtree(temporary)
    return final


def float32_copy(model):
    """The model with float32 layers and the same weights (TFLite has no bfloat16 kernels)."""
    import keras

    if all(layer.dtype_policy.name == "float32" for layer in model.layers):
        return model

    def clone(layer):
        return layer.__class__.from_config({**layer.get_config(), "dtype": "float32"})

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy


def _tflite_function(model):
    """A frozen function `images` (float32 [N, H, W, 3] in 0..255) -> {"logits": ...}."""
    import tensorflow as tf
    from tensorflow.python.framework import convert_to_constants

    height, width = _image_size(model)
    spec = tf.TensorSpec([None, height, width, 3], tf.float32, name="images")

    @tf.function(input_signature=[spec])
    def logits(images):
        return tf.cast(model((images - 127.5) / 127.5, training=False), tf.float32)

    # Weights frozen into constants: no variable ops left for the converter or calibration.
    frozen = convert_to_constants.convert_variables_to_constants_v2(logits.get_concrete_function())

    @tf.function(input_signature=[spec])
    def serve(images):
        (logits_tensor,) = frozen(images)  # frozen functions return a list of outputs
        return {"logits": logits_tensor}

    return serve.get_concrete_function()


def tflite_bytes(model, quantization="none", representative_data=None):
    """Converts `model` to a TFLite flatbuffer with builtin ops only (no Flex/Select TF ops).

    The TFLite model takes float32 pixels [N, H, W, 3] in 0..255 (N resizable) and returns
    `logits`.

    Args:
        quantization: "none" (float32), "float16" (weights), "dynamic" (int8 weights, float
            activations) or "int8" (weights and activations; needs `representative_data`).
        representative_data: for "int8", images [N, H, W, 3] in 0..255 (a few hundred),
            as an array or an iterable of arrays.
    """
    import tensorflow as tf

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}.")
    if quantization == "int8" and representative_data is None:
        raise ValueError('quantization="int8" needs representative_data: a few hundred '
                         "images [N, H, W, 3] in 0..255 like the ones the model will see.")
    model = float32_copy(model)
    samples = None
    if quantization == "int8":
        samples = _representative_samples(representative_data, _image_size(model))
    # Through a SavedModel of the frozen function: the TFLite file keeps the signature
    # (input `images`, output `logits`) that LiteRT's signature runners use.
    module = tf.Module()
    module.serve = _tflite_function(model)
    with tempfile.TemporaryDirectory(prefix="keras_vit_tflite_") as directory:
        tf.saved_model.save(module, directory, signatures={"serving_default": module.serve})
        converter = tf.lite.TFLiteConverter.from_saved_model(directory)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantization != "none":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantization == "float16":
            converter.target_spec.supported_types = [tf.float16]
        if quantization == "int8":
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                                   tf.lite.OpsSet.TFLITE_BUILTINS]
            converter.representative_dataset = samples
        try:
            return converter.convert()
        except Exception as error:  # the converter raises several types; keep its message
            raise RuntimeError(
                f"TFLite conversion ({quantization}, builtin ops only) failed: {error}"
            ) from error


def _representative_samples(representative_data, image_size):
    """A generator function of single images [1, H, W, 3] for int8 calibration."""
    height, width = image_size
    batches = [np.asarray(batch, np.float32) for batch in (
        [representative_data] if isinstance(representative_data, np.ndarray)
        else representative_data)]
    for batch in batches:
        if batch.ndim != 4 or batch.shape[1:] != (height, width, 3):
            raise ValueError(f"representative_data must be images [N, {height}, {width}, 3], "
                             f"got shape {batch.shape}.")

    def samples():
        for batch in batches:
            for image in batch:
                yield [image[None]]

    return samples


def export_tflite(model, path, quantization="none", representative_data=None):
    """Writes a TFLite model to `path` (local or gs://) atomically (see `tflite_bytes`) and
    returns its size in bytes."""
    import tensorflow as tf

    content = tflite_bytes(model, quantization, representative_data)
    directory = os.path.dirname(path)
    if directory:
        tf.io.gfile.makedirs(directory)
    temporary = f"{path}.partial-{os.getpid()}"
    try:
        with tf.io.gfile.GFile(temporary, "wb") as handle:
            handle.write(content)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    finally:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
    return len(content)

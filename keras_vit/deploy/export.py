"""Production export: a SavedModel for TF Serving and TFLite (LiteRT) models for devices, and
the ONNX file (`export_onnx`, from deploy.onnx_export, with the "onnx" extra).

    path = keras_vit.deploy.export.export_saved_model(model, "/models/vit", class_names=names)
    keras_vit.deploy.export.export_tflite(model, "vit.tflite", quantization="int8",
                                   representative_data=images)
    keras_vit.deploy.export.export_onnx(model, "vit.onnx", preprocess="uint8")

The SavedModel carries its own preprocessing (decode, RGB, resize, scale to [-1, 1]) so clients
send image files or raw pixels; it loads with TensorFlow alone, without keras_vit. A request that
breaks the signature's contract (see `export_saved_model`) is refused with INVALID_ARGUMENT by
checks inside the graph. Both writers build the result under a temporary name and rename it into
place, so an interrupted export never leaves a half-written version or file where a server or
app would find it. Arguments are checked (ValueError or TypeError naming the argument) before
any tracing or conversion.
"""

import errno
import json
import os
import re
import tempfile
import warnings

import numpy as np

from keras_vit import fileio
from keras_vit.preprocessing import model_image_size

QUANTIZATIONS = ("none", "float16", "dynamic", "int8")
DEFAULT_TOP_K = 5
SPEC_ASSET = "assets.extra/keras_vit_spec.json"  # the model's ViTConfig, in a SavedModel
# A native-resolution SavedModel's patch size and budget (`export_saved_model`'s max_num_patches)
NATIVE_ASSET = "assets.extra/keras_vit_native.json"


def _dynamic_spec(model):
    """The spec of a model of any image size, else None."""
    spec = getattr(model, "spec", None)
    return spec if spec is not None and spec.dynamic_image_size else None


def _check_model(model):
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model (as keras_vit builds), got "
                        f"{type(model).__name__} {str(model)[:80]!r}; the model comes first, "
                        "then the path.")
    if keras.config.backend() != "tensorflow":  # the signatures decode with TensorFlow ops
        raise RuntimeError(
            f"The SavedModel and TFLite export run on Keras' TensorFlow backend, not "
            f"{keras.config.backend()!r}: save the model (model.save('model.keras')) and export "
            "it in a process started with KERAS_BACKEND=tensorflow.")
    return model_image_size(model)


def _checked_models(model, max_num_patches):
    """`(model, native)`: the classic model checked (`_check_model`), and with
    `max_num_patches` the `(NaFlexViT, patch_size)` that serves it (deploy.native_export);
    `native` is None without it. A NaFlexViT needs its budget."""
    from keras_vit.native import NaFlexViT

    if max_num_patches is None:
        if isinstance(model, NaFlexViT):
            raise ValueError(f"Model {model.name!r} is a NaFlexViT: pass max_num_patches, the "
                             "budget of patches each image runs within (e.g. 256), or export "
                             "its classic model, model.vit.")
        _check_model(model)
        return model, None
    from keras_vit.deploy import native_export

    naflex, patch_size = native_export.naflex_model(model, max_num_patches)
    _check_model(naflex.vit)
    return naflex.vit, (naflex, patch_size)


def _path_text(path, argument):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a path (str or os.PathLike), got "
                        f"{type(path).__name__}.")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{argument} is empty; pass a path.")
    return path


def _nearest_existing(path):
    """`path` or its nearest existing ancestor; None when none exists (below a URL's root)."""
    while True:
        if fileio.exists(path):
            return path
        parent = os.path.dirname(path.rstrip("/"))
        if not parent or parent == path or parent.endswith(":") or parent.endswith(":/"):
            return None
        path = parent


def check_directory(path, argument="base_dir"):
    """Raises ValueError unless `path` is a directory or can be made one: neither it nor an
    ancestor is a file. Fast: call it before slow work. Returns the path as a str."""
    path = _path_text(path, argument)
    existing = _nearest_existing(path)
    if existing is not None and not fileio.isdir(existing):
        where = "is a file" if existing == path else f"is below {existing}, which is a file"
        raise ValueError(f"{argument}={path} {where}, not a directory: pass a directory "
                         "(it is created if missing), or move the file away.")
    return path


def check_file_path(path, argument="path"):
    """Raises ValueError unless a file can be written at `path` (not a directory, no file
    where a directory has to be)."""
    path = _path_text(path, argument)
    if fileio.isdir(path):
        raise ValueError(f"{argument}={path} is a directory; pass the path of the file to "
                         "write, e.g. <directory>/model.tflite.")
    directory = os.path.dirname(path)
    if directory:
        check_directory(directory, f"the directory of {argument}")
    return path


def next_version(base_dir):
    """The next free integer version under `base_dir` (1 for a new or empty one)."""
    if not fileio.isdir(base_dir):
        return 1
    versions = [int(name.rstrip("/")) for name in fileio.listdir(base_dir)
                if name.rstrip("/").isdigit()]
    return max(versions, default=0) + 1


def _checked_images(images):
    """`images` once they are what `serving_images` takes, else an INVALID_ARGUMENT error (what
    TF Serving answers for a failed `tf.debugging` assertion) that says what was wrong.

    The checks run inside the graph, on what the server was fed: TF Serving does not hold a
    request to the signature's shape, so a batch of 6-channel images or one image without its
    batch axis would otherwise reach the model (6 channels even give answers, as a grouped
    convolution). NaN, infinite and out-of-range pixels (images scaled to [-1, 1], 16-bit
    values) would give confident answers on garbage.
    """
    import tensorflow as tf

    shape = tf.shape(images)
    channels = tf.debugging.Assert(
        tf.reduce_all(tf.equal(shape[-1:], 3)),
        ["serving_images takes RGB images, float32 [N, H, W, 3] with 3 channels; got shape",
         shape], summarize=8, name="check_channels")
    with tf.control_dependencies([channels]):
        # Rank 4 and 3 channels; survives the optimizer, unlike a check on tf.rank (folded to
        # the signature's static rank).
        images = tf.ensure_shape(images, [None, None, None, 3], name="check_shape")
    shape = tf.shape(images)
    nonempty = tf.debugging.Assert(
        tf.reduce_min(shape[:3]) > 0,
        ["serving_images got no pixels: send at least one image of at least 1x1 pixels, "
         "float32 [N, H, W, 3]; got shape", shape], summarize=8, name="check_empty")
    with tf.control_dependencies([nonempty]):
        # Three reductions (a few ms for 32 images of 224x224, against hundreds for the model);
        # tf.debugging.assert_all_finite costs several times more. NaN always survives a sum,
        # infinities are the minimum or maximum.
        low, high = tf.reduce_min(images), tf.reduce_max(images)
        has_nan = tf.math.is_nan(tf.reduce_sum(images))
    finite = tf.debugging.Assert(
        tf.logical_not(has_nan) & tf.math.is_finite(low) & tf.math.is_finite(high),
        ["serving_images takes pixels in 0..255, but some are NaN or infinite; got min", low,
         "max", high], name="check_finite")
    with tf.control_dependencies([finite]):
        in_range = tf.debugging.Assert(
            tf.logical_and(low >= 0.0, high <= 255.0),
            ["serving_images takes pixels in 0..255 (not scaled to [0, 1] or [-1, 1], not "
             "16-bit; clip values that resizing took past the ends); got min", low, "max", high],
            name="check_range")
    with tf.control_dependencies([in_range]):
        return tf.identity(images)


def _checked_bytes(image_bytes):
    import tensorflow as tf

    image_bytes = tf.ensure_shape(image_bytes, [None], name="check_shape")
    nonempty = tf.debugging.Assert(
        tf.size(image_bytes) > 0,
        ["serving_default got no images: send at least one encoded image in image_bytes"],
        name="check_empty")
    with tf.control_dependencies([nonempty]):
        return tf.identity(image_bytes)


def _named_outputs(logits, names, k):
    """The signatures' outputs of float32 `logits`: probabilities, the top `k` classes (and
    their `names`, a string tensor, when given)."""
    import tensorflow as tf

    probabilities = tf.nn.softmax(logits, axis=-1)
    top_probabilities, top_indices = tf.math.top_k(probabilities, k=k)
    outputs = {"logits": logits, "probabilities": probabilities,
               "top_k_indices": top_indices, "top_k_probabilities": top_probabilities}
    if names is not None:
        outputs["top_k_names"] = tf.gather(names, top_indices)
    return outputs


def checked_class_names(class_names, outputs):
    """`class_names` as a list of one string per output, in label order (None stays None);
    TypeError or ValueError otherwise."""
    if class_names is None:
        return None
    if isinstance(class_names, (str, bytes)) or not hasattr(class_names, "__len__"):
        raise TypeError(f"class_names must be a list of {outputs} names in label order, "
                        f"got {type(class_names).__name__} {str(class_names)[:60]!r}.")
    class_names = list(class_names)
    if len(class_names) != outputs:
        raise ValueError(f"{len(class_names)} class names for a model with {outputs} "
                         "outputs; class_names must name every class, in label order.")
    wrong = [name for name in class_names if not isinstance(name, (str, bytes))]
    if wrong:
        raise TypeError(f"class_names must be strings, got {wrong[:3]!r}.")
    return class_names


def served_pixels(model, images):
    """Float pixels [N, H, W, 3] in 0..255 at the size `model` runs them: resized (and
    cropped) as its `preprocessing` says, or as sent to a model built with
    `dynamic_image_size=True` (which checks the sides itself). The preprocessing of
    `serving_images` and of an ONNX file's pixel input (deploy.onnx_export), before
    `scale_pixels`."""
    from keras_vit.preprocessing import resize

    if _dynamic_spec(model) is not None:
        return images
    return resize(images, model_image_size(model), getattr(model, "preprocessing", None))


def _serving_endpoints(model, class_names, top_k):
    """{signature name: (function, input signature)}: encoded image bytes, and pixel batches
    in 0..255, each resized to the model's size."""
    import tensorflow as tf

    from keras_vit.preprocessing import decode_and_resize_files, scale_pixels

    height, width = model_image_size(model)
    preprocessing = getattr(model, "preprocessing", None)  # the checkpoint's resize and crop
    k = min(top_k, model.output_shape[-1])
    names = tf.constant(list(class_names)) if class_names is not None else None

    def predict(pixels):
        """Float pixels [N, height, width, 3] in 0..255, at the model's size -> named outputs."""
        return _named_outputs(tf.cast(model(scale_pixels(pixels), training=False), tf.float32),
                              names, k)

    def serve_bytes(image_bytes):
        # Decoded pixels are RGB in 0..255 by construction: only the request itself is checked.
        # Each image is resized as it is decoded (the input pipeline's evaluation does the
        # same), so images of any size stack into one batch.
        return predict(decode_and_resize_files(_checked_bytes(image_bytes), (height, width),
                                               preprocessing))

    def serve_images(images):
        return predict(served_pixels(model, _checked_images(images)))

    return {"serving_default": (serve_bytes, [_bytes_spec()]),
            "serving_images": (serve_images, [_images_spec()])}


def _native_endpoints(naflex, patch_size, max_num_patches, class_names, top_k):
    """`_serving_endpoints` of a NaFlex model: each image at its own aspect ratio within
    `max_num_patches` (deploy.native_export), and `serving_patches` for arrays a client made
    itself. Each adds the grid each image ran at, `spatial_shapes`."""
    import tensorflow as tf

    from keras_vit.deploy import native_export

    k = min(top_k, naflex.vit.output_shape[-1])
    names = tf.constant(list(class_names)) if class_names is not None else None

    def predict(arrays):
        logits = tf.cast(naflex(arrays, training=False), tf.float32)
        return {**_named_outputs(logits, names, k), "spatial_shapes": arrays["spatial_shapes"]}

    def serve_bytes(image_bytes):
        return predict(native_export.patch_inputs(_checked_bytes(image_bytes), patch_size,
                                                  max_num_patches))

    def serve_images(images):
        return predict(native_export.patch_inputs(_checked_images(images), patch_size,
                                                  max_num_patches))

    def serve_patches(pixel_values, pixel_attention_mask, spatial_shapes):
        return predict(native_export.checked_patch_inputs(
            pixel_values, pixel_attention_mask, spatial_shapes, max_num_patches))

    return {"serving_default": (serve_bytes, [_bytes_spec()]),
            "serving_images": (serve_images, [_images_spec()]),
            "serving_patches": (serve_patches,
                                native_export.patch_signature(patch_size, max_num_patches))}


def _bytes_spec():  # the signatures' inputs (specs made once TensorFlow is imported)
    import tensorflow as tf

    return tf.TensorSpec([None], tf.string, name="image_bytes")


def _images_spec():
    import tensorflow as tf

    return tf.TensorSpec([None, None, None, 3], tf.float32, name="images")


def export_saved_model(model, base_dir, class_names=None, version=None, top_k=DEFAULT_TOP_K,
                       max_num_patches=None):
    """Writes `model` as a TF Serving SavedModel at `<base_dir>/<version>` and returns the path.

    Signatures:
        serving_default: `image_bytes` string [N] of JPEG/PNG/GIF/BMP files.
        serving_images: `images` float32 [N, H, W, 3] in 0..255, any H and W: resized to the
            model's size, or for a model built with `dynamic_image_size=True` run at the size
            sent (sides multiples of its pixels per patch, any size with padding).
    Both resize (and crop) as the model's `preprocessing` says, as `keras_vit.prepare_images`.
    Outputs: `logits`, `probabilities`, `top_k_indices`, `top_k_probabilities` and, with
    `class_names`, `top_k_names`. A model built by keras_vit also leaves its `ViTConfig` as
    JSON in `SPEC_ASSET` (`assets.extra/`, which loaders and TF Serving ignore).

    With `max_num_patches`, at native resolution (docs/native.md): both signatures run each
    image at its own aspect ratio within that budget of patches (`keras_vit.native`'s
    `NaFlexViT` and sizes), so one request holds images of any shapes, and add the grid each
    ran at (`spatial_shapes`, rows and columns of patches); `serving_patches` takes the arrays
    of `keras_vit.native.prepare` or transformers' `Siglip2ImageProcessor` at that budget
    (`pixel_values`, `pixel_attention_mask`, `spatial_shapes`).

    A request is an INVALID_ARGUMENT error, with a message that says why, when it holds no
    images, or (`serving_images`) when it is not rank 4, has other than 3 channels, an image of
    zero height or width, NaN or infinite pixels, or pixels outside 0..255 (e.g. scaled to
    [-1, 1] or 16-bit); `serving_default` refuses files that do not decode; `serving_patches`
    refuses grids outside the budget, a mask that does not mark them, or unscaled pixels.

    Args:
        model: a Keras model of images scaled to [-1, 1] (as `keras_vit` builds).
        base_dir: the model's base directory, as TF Serving's `--model_base_path`.
        class_names: optional names of the classes, in label order.
        version: integer version; default the next free one.
        top_k: number of top classes returned (capped at the number of classes).
        max_num_patches: the budget of patches per image, to serve at native resolution
            (`model` a keras_vit model that `NaFlexViT` runs, or a `NaFlexViT`).
    """
    model, native = _checked_models(model, max_num_patches)  # before TensorFlow is imported
    import keras
    import tensorflow as tf

    base_dir = check_directory(base_dir, "base_dir")
    class_names = checked_class_names(class_names, model.output_shape[-1])
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}.")
    if version is not None:
        if isinstance(version, bool) or not (
                isinstance(version, (int, np.integer))
                or (isinstance(version, str) and version.isdigit())) or int(version) < 0:
            raise ValueError(f"version must be a non-negative integer (TF Serving's version "
                             f"directory), got {version!r}; leave it out for the next free one.")
    version = next_version(base_dir) if version is None else int(version)
    final = os.path.join(base_dir, str(version))
    if fileio.exists(final):
        raise FileExistsError(f"{final} already exists; TF Serving versions are immutable. "
                              "Pass another version or leave it out for the next free one.")
    endpoints = (_serving_endpoints(model, class_names, top_k) if native is None else
                 _native_endpoints(*native, max_num_patches, class_names, top_k))
    # The endpoints' own variables are all the archive needs. `archive.track(model)` would
    # store every weight a second time (as the Keras variables, beside the endpoints'
    # tf.Variables), doubling the files TF Serving reads and holds in memory.
    archive = keras.export.ExportArchive()
    for name, (function, signature) in endpoints.items():
        archive.add_endpoint(name, function, input_signature=signature)
    # Written under a dot-name TF Serving ignores, renamed to the version once complete.
    try:
        with fileio.atomic_directory(final) as temporary:
            archive.write_out(temporary, verbose=False)
            spec = getattr(model, "spec", None)
            if spec is not None:  # SavedModel's place for files that the graph does not load
                fileio.makedirs(os.path.join(temporary, os.path.dirname(SPEC_ASSET)))
                with fileio.open_file(os.path.join(temporary, SPEC_ASSET), "w") as handle:
                    handle.write(json.dumps(spec.to_dict(), indent=2))
                if native is not None:  # what a client's own processor needs
                    with fileio.open_file(os.path.join(temporary, NATIVE_ASSET), "w") as handle:
                        handle.write(json.dumps({"patch_size": native[1],
                                                 "max_num_patches": max_num_patches}))
    except _file_errors(tf) as error:  # a full disk, a lost permission, a bucket gone
        raise _write_error(error, final) from error
    return final


def _file_errors(tf):
    """TensorFlow's errors for a file it cannot write (its C++ savers raise these)."""
    return (tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError,
            tf.errors.NotFoundError, tf.errors.FailedPreconditionError,
            tf.errors.UnavailableError, tf.errors.UnauthenticatedError, tf.errors.DataLossError,
            OSError)


def _write_error(error, path):
    """An OSError naming `path` for an error writing it, without TensorFlow's internals:
    "{{function_node __wrapped__SaveV2_dtypes_41_device_/job:localhost/...}} <temporary
    file>; No space left on device [Op:SaveV2]" becomes "[Errno 28] No space left on device:
    '<path>'" (the temporary files are gone by then)."""
    if isinstance(error, OSError) and error.filename:
        return error
    text = re.sub(r"\{\{.*?\}\}|\[Op:[^\]]*\]", "",
                  str(getattr(error, "message", None) or error)).strip()
    reason = text.splitlines()[0].rsplit("; ", 1)[-1].strip() if text else ""
    reason = reason or type(error).__name__
    for code in (errno.ENOSPC, errno.EACCES, errno.EDQUOT, errno.EROFS):
        if os.strerror(code).lower() in reason.lower():
            return OSError(code, os.strerror(code), str(path))
    return OSError(f"Cannot write {path}: {reason}. Nothing was left there.")


def float32_copy(model):
    """The model with float32 layers and the same weights (TFLite has no bfloat16 kernels)."""
    import keras

    if all(layer.dtype_policy.name == "float32" for layer in model.layers):
        return model

    def clone(layer):
        return layer.__class__.from_config({**layer.get_config(), "dtype": "float32"})

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    # clone_model builds the class without them
    copy.spec = getattr(model, "spec", None)
    if hasattr(model, "preprocessing"):
        copy.preprocessing = model.preprocessing
    return copy


def _frozen_signature(function, signature):
    """`function` of TensorSpecs `signature` with its weights frozen into constants (no
    variable ops left for the converter or calibration), as a concrete function returning
    {"logits": ...}."""
    import tensorflow as tf
    from tensorflow.python.framework import convert_to_constants

    traced = tf.function(function, input_signature=signature)
    frozen = convert_to_constants.convert_variables_to_constants_v2(
        traced.get_concrete_function())

    @tf.function(input_signature=signature)
    def serve(*inputs):
        (logits,) = frozen(*inputs)  # frozen functions return a list of outputs
        return {"logits": logits}

    return serve.get_concrete_function()


def _tflite_function(model):
    """A frozen function `images` (float32 [N, H, W, 3] in 0..255) -> {"logits": ...}."""
    import tensorflow as tf

    from keras_vit.preprocessing import scale_pixels

    height, width = model_image_size(model)
    return _frozen_signature(
        lambda images: tf.cast(model(scale_pixels(images), training=False), tf.float32),
        [tf.TensorSpec([None, height, width, 3], tf.float32, name="images")])


def _native_tflite_function(naflex, patch_size, max_num_patches):
    """A frozen function of the NaFlex arrays at the budget (deploy.native_export's names) ->
    {"logits": ...}."""
    import tensorflow as tf

    from keras_vit.deploy import native_export

    def logits(pixel_values, pixel_attention_mask, spatial_shapes):
        arrays = dict(zip(native_export.INPUT_NAMES,
                          (pixel_values, pixel_attention_mask, spatial_shapes)))
        return tf.cast(naflex(arrays, training=False), tf.float32)

    return _frozen_signature(logits, native_export.patch_signature(patch_size, max_num_patches))


def tflite_bytes(model, quantization="none", representative_data=None, max_num_patches=None):
    """Converts `model` to a TFLite flatbuffer with builtin ops only (no Flex/Select TF ops).

    The TFLite model takes float32 pixels [N, H, W, 3] in 0..255 (N resizable) and returns
    `logits`. With `max_num_patches`, at native resolution: it takes the NaFlex arrays at that
    budget, `pixel_values` float32 [N, max_num_patches, P * P * 3] (scaled to [-1, 1]),
    `pixel_attention_mask` int32 [N, max_num_patches] and `spatial_shapes` int32 [N, 2], as
    `keras_vit.native.prepare` makes them.

    Args:
        quantization: "none" (float32), "float16" (weights), "dynamic" (int8 weights, float
            activations) or "int8" (int8 weights and activations in the dense layers and
            convolutions, the rest in float32, see FLOAT_OPS_IN_INT8; needs
            `representative_data`).
        representative_data: for "int8", images [N, H, W, 3] in 0..255 (a few hundred),
            as an array or an iterable of arrays; checked before the conversion (shape, finite,
            0..255, not all in 0..1). At native resolution, a list of uint8 images
            [height, width, 3] of any sizes.
        max_num_patches: the budget of patches per image, for a model at native resolution
            (`export_saved_model`'s).
    """
    import tensorflow as tf

    check_quantization(quantization)
    model, native = _checked_models(model, max_num_patches)
    samples = None
    if quantization == "int8":
        if representative_data is None:
            raise ValueError('quantization="int8" needs representative_data: a few hundred '
                             "images [N, H, W, 3] in 0..255 like the ones the model will see "
                             '(or choose quantization="dynamic", which needs none).')
        if native is None:
            samples = _representative_samples(representative_data, model_image_size(model))
        else:
            from keras_vit.deploy import native_export

            samples = native_export.representative_samples(representative_data, native[1],
                                                           max_num_patches)
    model = float32_copy(model)
    # Through a SavedModel of the frozen function: the TFLite file keeps the signature
    # (inputs `images` or the NaFlex arrays, output `logits`) that LiteRT's signature runners
    # use.
    module = tf.Module()
    if native is None:
        module.serve = _tflite_function(model)
    else:
        from keras_vit.native import NaFlexViT

        module.serve = _native_tflite_function(NaFlexViT(model), native[1], max_num_patches)
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
            if quantization == "int8":
                return _selectively_quantized(converter, samples)
            return converter.convert()
        except Exception as error:  # the converter raises several types; keep its message
            raise RuntimeError(
                f"TFLite conversion ({quantization}, builtin ops only) failed: {error}"
            ) from error


# Ops that an "int8" file keeps in float32: everything but the dense layers and convolutions,
# which hold the multiply-adds. In int8 these ops lose accuracy (the attention's BATCH_MATMULs
# were off by up to 8 quantization steps, LayerNorm's ops by 1 to 3) and run in slow reference
# kernels (XNNPack has no int8 BATCH_MATMUL, SOFTMAX or MEAN). Quantizing them too, the quickstart
# model agreed with Keras on 97.9% of the test images, against 99.15% this way
# (benchmarks/export_accuracy.py), and int8 was the slowest format instead of the fastest.
FLOAT_OPS_IN_INT8 = ("MEAN", "SQUARED_DIFFERENCE", "SQUARE", "RSQRT", "BATCH_MATMUL", "SOFTMAX",
                     "GELU", "ADD", "SUB", "MUL")


def _selectively_quantized(converter, samples):
    """The int8 flatbuffer with FLOAT_OPS_IN_INT8 left in float32: int8 activations and weights
    in the dense layers and convolutions, QUANTIZE and DEQUANTIZE around them."""
    import tensorflow as tf

    options = tf.lite.experimental.QuantizationDebugOptions(
        denylisted_ops=list(FLOAT_OPS_IN_INT8))
    with warnings.catch_warnings():
        # The debugger builds a tf.lite.Interpreter of its own, whose deprecation warning
        # would tell our users to migrate code they did not write.
        warnings.filterwarnings("ignore", r"\s*Warning: tf.lite.Interpreter is deprecated",
                                UserWarning)
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=samples, debug_options=options)
        return debugger.get_nondebug_quantized_model()


ALIASES = {"float32": "none", "fp32": "none", "fp16": "float16", "dynamic_range": "dynamic",
           "full_integer": "int8"}


def check_quantization(quantization):
    """Raises ValueError unless `quantization` is one of QUANTIZATIONS."""
    if quantization in QUANTIZATIONS and isinstance(quantization, str):
        return quantization
    hint = ""
    if isinstance(quantization, str):
        meant = ALIASES.get(quantization.lower(), quantization.lower())
        if meant in QUANTIZATIONS:
            hint = f' (for {quantization!r} pass "{meant}")'
    raise ValueError(f"quantization must be one of {', '.join(map(repr, QUANTIZATIONS))}, "
                     f"got {quantization!r}{hint}.")


def _representative_samples(representative_data, image_size):
    """A generator function of single images [1, H, W, 3] for int8 calibration (TFLite's, and
    the ONNX file's in deploy.onnx_export), once the data are checked (what converter.convert()
    would otherwise take minutes to misuse): batches of the model's size, finite pixels in
    0..255 (not scaled ones)."""
    height, width = image_size
    expected = f"images [N, {height}, {width}, 3] in 0..255"
    if isinstance(representative_data, (str, bytes, os.PathLike, dict)):
        raise TypeError(f"representative_data must be {expected} (an array, or an iterable of "
                        f"such batches), got {type(representative_data).__name__}; load the "
                        "images first.")
    if isinstance(representative_data, np.ndarray) or hasattr(representative_data, "numpy"):
        items = [representative_data]  # one array (or tensor)
    else:
        try:
            items = list(representative_data)
        except TypeError:
            raise TypeError(f"representative_data must be {expected} (an array, or an iterable "
                            f"of such batches), got {type(representative_data).__name__}."
                            ) from None
    batches = []
    for index, item in enumerate(items):
        where = "representative_data" if len(items) == 1 else f"representative_data[{index}]"
        batch = np.asarray(item)
        if batch.dtype.kind not in "biuf":
            raise TypeError(f"{where} must hold numbers ({expected}), got dtype {batch.dtype}.")
        if batch.ndim == 3 and batch.shape == (height, width, 3):
            raise ValueError(f"{where} is one image {batch.shape}; representative_data must be "
                             f"batches {expected}: stack the images (np.stack) into one array.")
        if batch.ndim != 4 or batch.shape[1:] != (height, width, 3):
            raise ValueError(f"{where} must be {expected} (the model's size), got shape "
                             f"{batch.shape}; resize the images to {height}x{width} RGB.")
        batch = batch.astype(np.float32)
        if batch.size == 0:
            continue
        bad = np.size(batch) - np.count_nonzero(np.isfinite(batch))
        if bad:
            raise ValueError(f"{where} holds {bad} NaN or infinite values; calibration needs "
                             f"real {expected}.")
        low, high = float(batch.min()), float(batch.max())
        if low < 0 or high > 255:
            fix = ("pass the pixels before scaling (for [-1, 1]: x * 127.5 + 127.5)" if low < 0
                   else "convert 16-bit images to 8-bit (x / 257)" if high <= 65535
                   else "pass 8-bit pixel values")
            raise ValueError(f"{where} must be pixels in 0..255 (the export scales them as its "
                             f"model does), got values from {low:g} to {high:g}: {fix}.")
        batches.append(batch)
    if not batches:
        raise ValueError(f"representative_data holds no images; int8 calibration needs "
                         f"{expected}, a few hundred like the ones the model will see.")
    if max(float(batch.max()) for batch in batches) <= 1.0:
        raise ValueError("representative_data is in 0..1, which looks like images scaled to "
                         "[0, 1]; calibration takes pixels in 0..255: multiply by 255.")

    def samples():
        for batch in batches:
            for image in batch:
                yield [image[None]]

    return samples


def export_tflite(model, path, quantization="none", representative_data=None,
                  max_num_patches=None):
    """Writes a TFLite model to `path` (local or gs://) atomically (see `tflite_bytes`) and
    returns its size in bytes."""
    _checked_models(model, max_num_patches)  # arguments first: the conversion takes a while
    path = check_file_path(path, "path")
    content = tflite_bytes(model, quantization, representative_data, max_num_patches)
    directory = os.path.dirname(path)
    if directory:
        fileio.makedirs(directory)
    fileio.write_atomically(path, content)
    return len(content)


# The ONNX file's writer beside the SavedModel's and TFLite's: keras_vit.export.export_onnx.
from keras_vit.deploy import onnx_export  # noqa: E402  (imports export only when it runs)

export_onnx = onnx_export.export_onnx

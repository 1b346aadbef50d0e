"""ONNX export: a keras_vit model as one `.onnx` file for ONNX Runtime, OpenVINO or TensorRT.

    keras_vit.deploy.export.export_onnx(model, "vit.onnx", class_names=names)
    session = onnxruntime.InferenceSession("vit.onnx")
    (logits,) = session.run(None, {"images": keras_vit.prepare_images(model, images)})

    # or with the serving preprocessing in the graph: uint8 pixels of any size in
    keras_vit.deploy.export.export_onnx(model, "vit.onnx", preprocess="uint8")
    (logits,) = session.run(None, {"pixels": uint8_images})

    # int8 dense layers and convolutions, calibrated on a few hundred training images
    keras_vit.deploy.export.export_onnx(model, "vit_int8.onnx", preprocess="uint8",
                                        quantization="int8", representative_data=images)

tf2onnx converts a `tf.function` of the model (`tf2onnx.convert.from_function`,
https://github.com/onnx/tensorflow-onnx#python-api-reference), at ONNX opset `OPSET` or later.
The batch is always dynamic (`batch`); a model built with `dynamic_image_size=True` also takes
any `height` and `width` (sides multiples of its pixels per patch, unless it pads; ONNX has no
assertions, so the file does not check them). The file's metadata (`metadata_props`, read with
ONNX Runtime's `session.get_modelmeta().custom_metadata_map`,
https://onnxruntime.ai/docs/api/python/auto_examples/plot_metadata.html) holds the model's
`ViTConfig` (`SPEC_KEY`), the class names (`CLASS_NAMES_KEY`), what the input holds
(`INPUT_KEY`) and the quantization (`QUANTIZATION_KEY`).

The graph is tf2onnx's with two rewrites that make it run faster and change no output: each
LayerNorm is one ONNX `LayerNormalization` (`fuse_layer_norms`), and the reshapes whose target is
the batch and constants take it as a constant (`_static_reshapes`), without the `Shape`, `Cast`,
`Slice` and `Concat` that computed it; ONNX Runtime fuses the rest at load (GELU as `FastGelu`,
the dense layers' bias into `Gemm`). docs/serving.md has the before and after.

"int8" is ONNX Runtime's static quantization (`onnxruntime.quantization.quantize_static`,
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html) in its QDQ format,
int8 weights per output channel and int8 activations, of the layers that hold the multiply-adds
(`INT8_OPS` with a weight), the rest in float32, as the TFLite int8 file
(`export.FLOAT_OPS_IN_INT8`).

The packages come with the "onnx" extra, `pip install "keras_vit[onnx]"`, and are imported only
when a model is exported. Arguments are checked (TypeError or ValueError naming the argument)
before any conversion; the file is written under a temporary name and renamed into place.
"""

import importlib.util
import json
import logging
import math
import os
import tempfile

import numpy as np

# Opset 17 (ONNX 1.12, ONNX Runtime 1.13 and later): at 15 the Resize of a centre crop fails
# ONNX Runtime's shape inference ("Number of elements of input 'sizes' (0)").
OPSET = 17
DTYPES = ("uint8", "float32")  # of the pixels that `preprocess` takes
QUANTIZATIONS = ("none", "int8")
# The layers "int8" quantizes: convolutions, and matrix products with a weight (the dense
# layers, not the attention's products of two activations). On the quickstart model all MatMuls
# in int8 agreed with Keras about as often (99.1% of the test images against 99.2%); every op
# that ONNX Runtime quantizes by default, 97.8%, and 8x slower at batch 1 (9.3 ms, 1.1 ms).
INT8_OPS = ("Conv", "Gemm", "MatMul")
SPEC_KEY = "keras_vit.spec"
CLASS_NAMES_KEY = "keras_vit.class_names"
INPUT_KEY = "keras_vit.input"
QUANTIZATION_KEY = "keras_vit.quantization"
# A protobuf message, hence an .onnx file without external data, holds at most 2 GiB.
MAX_BYTES = 2**31 - 2**24  # with room for the graph itself
EXTRA = 'pip install "keras_vit[onnx]"'


def export_onnx(model, path, class_names=None, preprocess=None, quantization="none",
                representative_data=None, opset=OPSET, max_num_patches=None):
    """Writes `model` (a keras_vit model) as an ONNX file at `path` (local or gs://)
    atomically and returns its size in bytes.

    Inputs and outputs:
        preprocess=None: `images` float32 [batch, H, W, 3] scaled to [-1, 1], the Keras model's
            own input (`keras_vit.prepare_images` makes it); H and W the model's size, any for
            a model built with `dynamic_image_size=True`.
        preprocess="uint8" or "float32": `pixels` of that dtype [batch, height, width, 3] in
            0..255, of any size: resized (and cropped) as the model's `preprocessing` says and
            scaled inside the graph, as the SavedModel's `serving_images` does (a model of any
            image size runs them at the size sent).
        max_num_patches, at native resolution (docs/native.md): the NaFlex arrays of
            `keras_vit.native.prepare` at that budget, `pixel_values` float32 [batch,
            max_num_patches, P * P * 3] (scaled to [-1, 1]), `pixel_attention_mask` int32
            [batch, max_num_patches] and `spatial_shapes` int32 [batch, 2], as the TFLite
            file's (`model` a keras_vit model that `NaFlexViT` runs, or a `NaFlexViT`).
        Output: `logits` float32 [batch, classes] (`features` for a model without its head).

    Args:
        class_names: optional names of the classes, in label order, kept in the metadata.
        preprocess: None, "uint8" or "float32" (above).
        quantization: "none" (float32) or "int8" (module docstring; needs
            `representative_data`).
        representative_data: for "int8", images [N, H, W, 3] in 0..255 at the model's size
            (a few hundred like the ones the model will see), as an array or an iterable of
            arrays, checked as `export.export_tflite` checks them; at native resolution, a
            list of uint8 images [height, width, 3] of any sizes.
        opset: the ONNX opset, `OPSET` or later (up to the newest that tf2onnx writes).
    """
    model = _checked_model(model, max_num_patches)
    from keras_vit import fileio
    from keras_vit.deploy import export

    path = export.check_file_path(path, "path")
    names = export.checked_class_names(class_names, model.output_shape[-1])
    _check_preprocess(preprocess, model, max_num_patches)
    samples = _calibration(model, quantization, representative_data, preprocess,
                           max_num_patches)
    _check_opset(opset)
    _check_size(model)
    _check_packages(opset)
    proto = onnx_model(model, preprocess, opset, max_num_patches)
    if samples is not None:
        proto = int8_model(proto, samples)
    _set_metadata(proto, model, names, _input_description(model, preprocess, max_num_patches),
                  quantization)
    content = proto.SerializeToString()
    if os.path.dirname(path):
        fileio.makedirs(os.path.dirname(path))
    fileio.write_atomically(path, content)
    return len(content)


def _describe(value):
    return f"{type(value).__name__} {str(value)[:60]!r}"


def _checked_model(model, max_num_patches):
    """The keras_vit model to convert (a NaFlexViT's `vit`), once it is one and Keras runs on
    TensorFlow."""
    import keras

    from keras_vit.architecture.spec import ViTConfig
    from keras_vit.native import NaFlexViT

    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras_vit model (keras.Model), got {_describe(model)};"
                        " the model comes first, then the path.")
    if isinstance(model, NaFlexViT) and max_num_patches is None:
        raise ValueError(f"Model {model.name!r} is a NaFlexViT: pass max_num_patches, the "
                         "budget of patches each image runs within (e.g. 256), or export its "
                         "classic model, model.vit.")
    if max_num_patches is not None:  # a budget checked, a model that runs at native resolution
        from keras_vit.deploy import native_export

        model = native_export.naflex_model(model, max_num_patches)[0].vit
    if not isinstance(getattr(model, "spec", None), ViTConfig):
        raise TypeError(f"model {model.name!r} is a keras.Model but not a keras_vit model (no "
                        "ViTConfig as model.spec): export a model of keras_vit.vit, "
                        "keras_vit.from_pretrained or a .keras file of one; for any other Keras "
                        "model, model.export(path, format='onnx').")
    if keras.config.backend() != "tensorflow":  # tf2onnx converts TensorFlow graphs
        raise RuntimeError(
            f"The ONNX export runs on Keras' TensorFlow backend, not "
            f"{keras.config.backend()!r}: save the model (model.save('model.keras')) and export "
            "it in a process started with KERAS_BACKEND=tensorflow.")
    return model


def _check_preprocess(preprocess, model, max_num_patches):
    if preprocess is not None and not (isinstance(preprocess, str) and preprocess in DTYPES):
        hint = ""
        if preprocess is True:
            hint = ' (True: pass "uint8" or "float32", the dtype of the pixels the file takes)'
        elif getattr(preprocess, "name", None) in DTYPES:  # np.dtype("uint8"), tf.uint8
            hint = f' (pass its name, "{preprocess.name}")'
        elif isinstance(preprocess, str) and preprocess.lower() in DTYPES:
            hint = f' (pass "{preprocess.lower()}")'
        raise ValueError(f"preprocess must be None, \"uint8\" or \"float32\", got "
                         f"{preprocess!r}{hint}.")
    if preprocess is not None and max_num_patches is not None:
        raise ValueError(f"preprocess={preprocess!r} and max_num_patches: at native resolution "
                         "the file takes the NaFlex arrays that keras_vit.native.prepare makes "
                         "(no pixels to preprocess in the graph); leave preprocess=None.")
    resizing = getattr(model, "preprocessing", None)
    if preprocess is None or model.spec.dynamic_image_size or resizing is None:
        return  # nothing is resized in the graph
    # What ONNX Runtime cannot run: TensorFlow's filtered resize has no ONNX op, and its Resize
    # refuses to shrink with cubic interpolation where a crop left the scales to compute.
    fix = ("export with preprocess=None and resize in the client (keras_vit.prepare_images "
           "resizes as served)")
    if resizing.antialias:
        raise ValueError(f"model.preprocessing has antialias=True, a filtered resize that ONNX "
                         f"has no op for (TensorFlow's ScaleAndTranslate): {fix}.")
    if resizing.interpolation == "bicubic" and (resizing.crop_mode != "squash"
                                                or resizing.crop_fraction != 1.0):
        raise ValueError(f"model.preprocessing resizes bicubically before a crop "
                         f"(crop_mode={resizing.crop_mode!r}, crop_fraction="
                         f"{resizing.crop_fraction}), which ONNX Runtime's Resize refuses for "
                         f"downscaled images: {fix}.")


def _calibration(model, quantization, representative_data, preprocess, max_num_patches):
    """For "int8", the calibration inputs (a list of {input name: one image's array}) of
    `representative_data`, checked; None for "none". ValueError or TypeError naming what
    is wrong."""
    from keras_vit.deploy import export

    if quantization not in QUANTIZATIONS or not isinstance(quantization, str):
        meant = export.ALIASES.get(str(quantization).lower(), str(quantization).lower())
        hint = f' (for {quantization!r} pass "{meant}")' if meant in QUANTIZATIONS else ""
        raise ValueError(f"quantization must be \"none\" or \"int8\" for ONNX, got "
                         f"{quantization!r}{hint}.")
    if quantization == "none":
        return None
    if representative_data is None:
        raise ValueError('quantization="int8" needs representative_data: a few hundred images '
                         "[N, H, W, 3] in 0..255 like the ones the model will see, to calibrate "
                         "the activations' scales.")
    if max_num_patches is not None:
        from keras_vit.deploy import native_export

        return list(native_export.representative_samples(
            representative_data, model.spec.patch_size, max_num_patches)())
    from keras_vit.preprocessing import model_image_size, scale_pixels

    samples = []
    for (image,) in export._representative_samples(representative_data,
                                                   model_image_size(model))():
        if preprocess is None:
            samples.append({"images": scale_pixels(image)})
        elif preprocess == "uint8":
            samples.append({"pixels": np.clip(np.round(image), 0, 255).astype(np.uint8)})
        else:
            samples.append({"pixels": image})
    return samples


def _check_opset(opset, newest=None):
    """Raises ValueError unless `opset` is an integer from OPSET to `newest` (tf2onnx's)."""
    if (isinstance(opset, bool) or not isinstance(opset, int) or opset < OPSET
            or (newest is not None and opset > newest)):
        newest = f" to {newest}" if newest is not None else " or later"
        raise ValueError(f"opset must be an integer ONNX opset, {OPSET}{newest}, got "
                         f"{opset!r}.")


def _check_size(model):
    size = 4 * sum(math.prod(variable.shape) for variable in model.weights)  # in float32
    if size > MAX_BYTES:
        raise ValueError(f"Model {model.name!r} holds {size / 2**30:.2f} GiB of float32 "
                         f"weights, more than an ONNX file without external data holds (2 GiB, "
                         "protobuf's limit): export the SavedModel (export_saved_model) and "
                         "convert it with python -m tf2onnx.convert --large_model.")


def _check_packages(opset):
    """Raises ImportError naming the extra when tf2onnx or onnx is missing, and ValueError for
    an `opset` newer than tf2onnx writes."""
    missing = [name for name in ("tf2onnx", "onnx") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"The ONNX export needs {' and '.join(missing)}, not installed: "
                          f"{EXTRA} (tf2onnx, onnx, and onnxruntime to run the file).")
    import tf2onnx

    _check_opset(opset, max(tf2onnx.constants.OPSET_TO_IR_VERSION))


def onnx_model(model, preprocess=None, opset=OPSET, max_num_patches=None, rewrite=True):
    """The ONNX `ModelProto` of a keras_vit `model` (see `export_onnx`), without metadata;
    arguments are not checked. rewrite=False: tf2onnx's graph as it writes it, without the
    module docstring's two rewrites (benchmarks/export_latency.py --tf2onnx_graph times both)."""
    import tensorflow as tf
    import tf2onnx

    from keras_vit.deploy import export, native_export
    from keras_vit.preprocessing import model_image_size, scale_pixels

    model = export.float32_copy(model)  # ONNX Runtime's CPU kernels have no bfloat16
    output = "logits" if model.spec.include_top else "features"
    if max_num_patches is not None:
        from keras_vit.native import NaFlexViT

        naflex = NaFlexViT(model)
        signature = native_export.patch_signature(naflex.spec.patch_size, max_num_patches)

        def run(pixel_values, pixel_attention_mask, spatial_shapes):
            arrays = dict(zip(native_export.INPUT_NAMES,
                              (pixel_values, pixel_attention_mask, spatial_shapes)))
            return {output: tf.cast(naflex(arrays, training=False), tf.float32)}
    elif preprocess is None:
        height, width = (None, None) if model.spec.dynamic_image_size else \
            model_image_size(model)
        signature = [tf.TensorSpec([None, height, width, 3], tf.float32, name="images")]

        def run(images):
            return {output: tf.cast(model(images, training=False), tf.float32)}
    else:
        signature = [tf.TensorSpec([None, None, None, 3], preprocess, name="pixels")]

        def run(pixels):
            images = scale_pixels(export.served_pixels(model, tf.cast(pixels, tf.float32)))
            return {output: tf.cast(model(images, training=False), tf.float32)}

    function = tf.function(run, input_signature=signature)
    logger = logging.getLogger("tf2onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its per-op INFO and WARNING lines say nothing to users
    try:
        proto, _ = tf2onnx.convert.from_function(function, input_signature=signature,
                                                 opset=opset,
                                                 custom_rewriter=[fuse_layer_norms] if rewrite
                                                 else None)
    finally:
        logger.setLevel(level)
    if rewrite:
        _static_reshapes(proto.graph)
    _name_dimensions(proto)
    return proto


def fuse_layer_norms(graph, ops):
    """A tf2onnx rewriter: each `keras_vit.layers.LayerNorm` (the TensorFlow ops of its two-pass
    form, `Mean`, `Sub`, `Square`, `Mean`, `AddV2` epsilon, `Rsqrt`, `Mul` scale, `Mul`, bias
    `BiasAdd`) becomes one ONNX `LayerNormalization` (opset 17) over the last axis.

    tf2onnx's own layer-norm rewriter matches none of them: it looks for `Add` where TensorFlow 2
    writes `AddV2` and `BiasAdd`, and writes `InstanceNormalization`. Left as 10 separate ops
    (`GlobalAveragePool` for each mean, `Sqrt`, `Reciprocal`, ...), ONNX Runtime runs them one by
    one: its layer-norm fusion looks for `ReduceMean`, `Pow` and `Div`, and its graph after
    loading keeps them all (docs/serving.md)."""
    for bias_add in list(ops):
        match = _layer_norm(graph, bias_add)
        if match is None:
            continue
        inputs, epsilon = match
        output, name = bias_add.output[0], bias_add.name
        shape, dtype = graph.get_shape(output), graph.get_dtype(output)
        graph.remove_node(name)
        graph.make_node("LayerNormalization", inputs, attr={"axis": -1, "epsilon": epsilon},
                        outputs=[output], shapes=[shape], dtypes=[dtype], name=name)
    return graph.get_nodes()


def _layer_norm(graph, bias_add):
    """([x, scale, bias], epsilon) when `bias_add` ends LayerNorm.call's ops, else None: one
    pass's mean and the other's over the last axis only (keepdims), of the same `x`; scale,
    bias and epsilon constants of one value per feature (one in all, for epsilon)."""
    def op(name, *types):
        node = graph.get_node_by_output(name)
        return node if node is not None and node.type in types else None

    def constant(name):
        node = graph.get_node_by_output(name)
        return node.get_tensor_value(as_list=False) if node is not None and node.is_const() \
            else None

    def last_axis_mean(node, x):  # Mean(x, axes) over x's last axis, keepdims
        if node is None or node.type != "Mean" or node.input[0] != x:
            return False
        axes, rank = constant(node.input[1]), graph.get_rank(x)
        return (axes is not None and rank is not None and axes.size == 1
                and int(axes.reshape(-1)[0]) % rank == rank - 1
                and bool(node.get_attr_value("keep_dims", 0)))

    if bias_add.type not in ("BiasAdd", "Add", "AddV2"):
        return None
    for product_name, bias_name in (bias_add.input, bias_add.input[::-1]):
        product, bias = op(product_name, "Mul"), constant(bias_name)
        if product is None or bias is None or bias.ndim != 1:
            continue
        for centred_name, scaled_name in (product.input, product.input[::-1]):
            centred, scaled = op(centred_name, "Sub"), op(scaled_name, "Mul")
            if centred is None or scaled is None:
                continue
            x = centred.input[0]
            features = (graph.get_shape(x) or [-1])[-1]
            if (not last_axis_mean(op(centred.input[1], "Mean"), x)
                    or bias.shape != (features,)):
                continue
            for root_name, scale_name in (scaled.input, scaled.input[::-1]):
                root, scale = op(root_name, "Rsqrt"), constant(scale_name)
                if root is None or scale is None or scale.shape != (features,):
                    continue
                shifted = op(root.input[0], "Add", "AddV2")
                if shifted is None:
                    continue
                for variance_name, epsilon_name in (shifted.input, shifted.input[::-1]):
                    variance, epsilon = op(variance_name, "Mean"), constant(epsilon_name)
                    square = variance is not None and op(variance.input[0], "Square")
                    if (epsilon is None or epsilon.size != 1 or not square
                            or square.input[0] != centred.output[0]
                            or not last_axis_mean(variance, square.output[0])):
                        continue
                    return [x, scale_name, bias_name], float(epsilon.reshape(-1)[0])
    return None


def _static_reshapes(graph):
    """Gives each `Reshape` whose target shape is computed from one tensor's dimension and
    constants (Keras' [batch, tokens, width] after a dense layer: `Shape`, `Cast`, `Slice`,
    `Concat`, `Cast`) that shape as a constant, -1 in place of the dimension, and drops the ops
    that computed it. The same reshape (-1 is the one size that keeps the element count, the
    constants all positive), without the 4 to 5 small ops before each that ONNX Runtime runs one
    by one (Ti/16: 144 of them); top-level graph only."""
    from onnx import numpy_helper

    constants = {tensor.name: tensor for tensor in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}

    def value(name):
        return numpy_helper.to_array(constants[name]) if name in constants else None

    def producer(name):  # the op that computes `name`, through Casts
        node = producers.get(name)
        while node is not None and node.op_type == "Cast":
            node = producers.get(node.input[0])
        return node

    def dimensions(name):  # a 1-D tensor of some of a tensor's dimensions
        node = producer(name)
        return node is not None and (node.op_type == "Shape" or (
            node.op_type == "Gather" and dimensions(node.input[0])
            and getattr(value(node.input[1]), "ndim", 0) == 1))

    def one_dimension(name):  # [d]: Gather [i] or Slice [i:i + 1] of those
        node = producer(name)
        if node is None or not dimensions(node.input[0]):
            return False
        if node.op_type == "Gather":
            return value(node.input[1]).shape == (1,)
        bounds = [value(name) for name in node.input[1:]]
        return (node.op_type == "Slice" and all(bound is not None and bound.size == 1
                                                for bound in bounds)
                and int(bounds[1].item()) - int(bounds[0].item()) == 1
                and (len(bounds) < 4 or int(bounds[3].item()) == 1))

    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) != 2:
            continue
        concat = producer(node.input[1])
        if concat is None or concat.op_type != "Concat":
            continue
        parts = [value(name) for name in concat.input]
        computed = [index for index, part in enumerate(parts) if part is None]
        if (len(computed) != 1 or not one_dimension(concat.input[computed[0]])
                or any((part <= 0).any() for part in parts if part is not None)):
            continue
        parts[computed[0]] = np.array([-1])
        shape = numpy_helper.from_array(
            np.concatenate([np.asarray(part, np.int64).reshape(-1) for part in parts]),
            f"{node.name}/static_shape")
        graph.initializer.append(shape)
        constants[shape.name] = shape
        node.input[1] = shape.name
    _drop_unused(graph)


def _drop_unused(graph):
    """Removes the nodes and initializers that no graph output depends on (names a subgraph
    reads from the outer scope count as read)."""
    def read(nodes):
        for node in nodes:
            yield from node.input
            for attribute in node.attribute:
                if attribute.g.node:
                    yield from read(attribute.g.node)
                for subgraph in attribute.graphs:
                    yield from read(subgraph.node)

    needed = {output.name for output in graph.output}
    kept, grown = set(), True
    while grown:  # whatever the nodes' order
        grown = False
        for index, node in enumerate(graph.node):
            if index not in kept and any(output in needed for output in node.output):
                kept.add(index)
                needed.update(read([node]))
                grown = True
    if len(kept) < len(graph.node):
        nodes = [type(node).FromString(node.SerializeToString())
                 for index, node in enumerate(graph.node) if index in kept]
        del graph.node[:]
        graph.node.extend(nodes)
    unused = [tensor for tensor in graph.initializer if tensor.name not in needed]
    for tensor in unused:
        graph.initializer.remove(tensor)


def int8_model(proto, samples):
    """`proto` with int8 weights (per output channel) and int8 activations in its INT8_OPS
    that have a weight, QuantizeLinear and DequantizeLinear around them (QDQ), the activations'
    scales calibrated on `samples` (a list of {input name: array}), the rest in float32."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    weights = {initializer.name for initializer in proto.graph.initializer}
    layers = [node.name for node in proto.graph.node
              if node.op_type in INT8_OPS and any(name in weights for name in node.input)]

    class Samples(CalibrationDataReader):
        def __init__(self):
            self.remaining = iter(samples)

        def get_next(self):
            return next(self.remaining, None)

    # quantize_static reads and writes files (a ModelProto given to it is saved with its
    # weights as external data, which it then fails to read back).
    with tempfile.TemporaryDirectory(prefix="keras_vit_onnx_") as folder:
        source, target = os.path.join(folder, "float32.onnx"), os.path.join(folder, "int8.onnx")
        onnx.save(proto, source)
        # Its advice to pre-process first (quant_pre_process: shape inference, fusions) is for
        # whoever calls it, not for the users of this export, whom its root-logger warning
        # would reach; whether pre-processing pays here is not measured yet.
        advice = _Without("pre-processing before quantization")
        logging.getLogger().addFilter(advice)
        try:
            # S8S8 in QDQ: ONNX Runtime's recommended first choice; uint8 activations agreed
            # with Keras less often on the quickstart model (98.2% of the test images, 99.2%).
            quantize_static(source, target, Samples(), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, nodes_to_quantize=layers)
        finally:
            logging.getLogger().removeFilter(advice)
        return onnx.load(target)


class _Without(logging.Filter):
    """Drops the log records whose message holds `text`."""

    def __init__(self, text):
        super().__init__()
        self.text = text

    def filter(self, record):
        return self.text not in record.getMessage()


def _name_dimensions(proto):
    """Names the inputs' and outputs' free dimensions `batch`, `height` and `width` (tf2onnx
    calls them unk__<n>), as runtimes show them."""
    for value in [*proto.graph.input, *proto.graph.output]:
        for dimension, name in zip(value.type.tensor_type.shape.dim,
                                   ("batch", "height", "width")):
            if dimension.dim_param:
                dimension.dim_param = name


def _input_description(model, preprocess, max_num_patches):
    if max_num_patches is not None:
        patch = model.spec.patch_size
        return (f"pixel_values: float32 [batch, {max_num_patches}, {patch * patch * 3}] "
                f"scaled to [-1, 1], pixel_attention_mask: int32 [batch, {max_num_patches}], "
                f"spatial_shapes: int32 [batch, 2]; keras_vit.native.prepare(images, "
                f"patch_size={patch}, max_num_patches={max_num_patches})")
    if preprocess is not None:
        return (f"pixels: {preprocess} [batch, height, width, 3] in 0..255, any size; resized "
                "and scaled to [-1, 1] in the graph")
    size = ("height, width" if model.spec.dynamic_image_size else
            ", ".join(map(str, model.spec.image_size)))
    return f"images: float32 [batch, {size}, 3] scaled to [-1, 1] ((x - 127.5) / 127.5)"


def _set_metadata(proto, model, class_names, input_description, quantization):
    import onnx

    text = [name.decode() if isinstance(name, bytes) else name for name in class_names or []]
    properties = {SPEC_KEY: json.dumps(model.spec.to_dict()), INPUT_KEY: input_description,
                  QUANTIZATION_KEY: quantization}
    if class_names is not None:
        properties[CLASS_NAMES_KEY] = json.dumps(text)
    onnx.helper.set_model_props(proto, properties)

"""The ONNX export (keras_vit/deploy/onnx_export.py): the file that ONNX Runtime (and OpenVINO)
runs gives the Keras model's outputs, for a model of every option family, the serving
preprocessing in the graph, a model of any image size, at native resolution; its metadata; the
export command and a training run's export; and every bad argument refused, naming it, before
any conversion.

Each comparison is against the Keras model itself, within 1e-4 of its largest output, at
batch 1 and 3. The conversions need tf2onnx and onnxruntime (the "onnx" extra), the OpenVINO
ones openvino: without them those tests skip; the argument checks run anyway.
"""

import functools
import importlib.util
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

if keras.config.backend() != "tensorflow":
    pytest.skip("the ONNX export converts TensorFlow graphs (tf2onnx)", allow_module_level=True)

import keras_vit  # noqa: E402
from keras_vit.deploy import export, onnx_export  # noqa: E402
from model_fixtures import OPTION_FAMILIES, TINY_VIT, random_tiny_vit, randomise  # noqa: E402
from train_fixtures import REPO, main_command  # noqa: E402

MISSING = [name for name in ("tf2onnx", "onnx", "onnxruntime")
           if importlib.util.find_spec(name) is None]
needs_onnx = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed "
                                '(pip install "keras_vit[onnx]")')
CLASS_NAMES = ["cat", "dog", "fox", "owl", "elk"]


def tiny(**fields):
    """model_fixtures' tiny ViT (32 px, 8-pixel patches, 5 classes, random weights) with one
    block: each conversion takes about a second of tf2onnx (two blocks, two)."""
    return random_tiny_vit(**{"num_layers": 1, **fields})


def pixels(count, height=32, width=32, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).integers(0, 256, (count, height, width, 3)).astype(dtype)


def session(path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run(path, **inputs):
    (outputs,) = session(path).run(None, inputs)
    return outputs


def assert_close(got, expected):
    """Within 1e-4 of the largest output (and outputs that are not all zero)."""
    expected = np.asarray(expected, np.float64)
    scale = np.abs(expected).max()
    assert scale > 0.01
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * scale)


def scaled(images):
    return (np.asarray(images, np.float32) - 127.5) / 127.5


def _uint8_logits(model, images):
    """Keras' outputs on pixels of any size, resized as served."""
    return model(keras_vit.prepare_images(model, images), training=False)


def hybrid():
    """A ResNet-stem hybrid (StdConv, GroupNorm, max-pool) before one block."""
    model = keras_vit.vit("R+Ti/16", image_size=32, patch_size=1, num_classes=5,
                          **{**TINY_VIT, "num_layers": 1})
    randomise(model)
    return model


def center_cropped():
    model = tiny()
    model.preprocessing = keras_vit.EvalPreprocessing(crop_mode="center", crop_fraction=0.875)
    return model


# Exported once per module, compared in ONNX Runtime and OpenVINO: a model of every option family
# (model_fixtures.OPTION_FAMILIES; a new family joins there), fixed sin-cos positions, a hybrid,
# a model of any image size at two sizes, and uint8 pixels of two other sizes, cropped and
# resized in the graph. {name: (build the model, export_onnx's preprocess, image sizes)}.
SQUARE = [(32, 32), (32, 32)]
EXPORTS = {
    **{name: (functools.partial(tiny, **fields), None, SQUARE)
       for name, fields in OPTION_FAMILIES.items()},
    "sincos_2d_gap": (functools.partial(tiny, position_embedding="sincos_2d", classifier="gap"),
                      None, SQUARE),
    "hybrid": (hybrid, None, SQUARE),
    "dynamic_image_size": (functools.partial(tiny, dynamic_image_size=True), None,
                           [(32, 32), (48, 40)]),
    "uint8_pixels_center_crop": (center_cropped, "uint8", [(50, 70), (90, 40)]),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (path of the EXPORTS case's file, with CLASS_NAMES, [(its inputs, Keras'
    outputs)] at batch 1 and 3, the model), each case exported once for the module."""
    folder, done = tmp_path_factory.mktemp("exports"), {}

    def get(name):
        if name not in done:
            build, preprocess, sizes = EXPORTS[name]
            model, path = build(), folder / f"{name}.onnx"
            export.export_onnx(model, path, class_names=CLASS_NAMES, preprocess=preprocess)
            feeds = []
            for count, (height, width) in zip((1, 3), sizes):
                images = pixels(count, height, width, seed=height + count, dtype=np.uint8)
                if preprocess is None:
                    inputs, model_input = {"images": scaled(images)}, scaled(images)
                else:
                    inputs, model_input = {"pixels": images}, keras_vit.prepare_images(model,
                                                                                       images)
                feeds.append((inputs, model(model_input, training=False)))
            done[name] = path, feeds, model
        return done[name]

    return get


@needs_onnx
@pytest.mark.parametrize("name", EXPORTS)
def test_onnx_runtime_gives_the_keras_outputs(exported, name):
    path, feeds, _ = exported(name)
    for inputs, expected in feeds:
        assert_close(run(path, **inputs), expected)


@needs_onnx
@pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                    reason="openvino not installed (pip install openvino)")
@pytest.mark.parametrize("name", EXPORTS)
def test_openvino_reads_the_file_with_the_keras_outputs(exported, name):
    """OpenVINO reads the file itself (read_model, compile_model on its CPU plugin:
    https://docs.openvino.ai/2024/openvino-workflow/model-preparation/convert-model-to-ir.html)."""
    import openvino

    path, feeds, _ = exported(name)
    core = openvino.Core()
    # float32 as written: where the CPU has bfloat16 instructions (AMX) the plugin's default
    # computes in bfloat16, 1e-3 of the largest logit away.
    compiled = core.compile_model(core.read_model(str(path)), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    for inputs, expected in feeds:
        assert_close(compiled(inputs)[compiled.output(0)], expected)


def _nodes(graph):
    """The graph's nodes and those of its subgraphs (a loop's or a branch's body)."""
    import onnx

    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attribute.g)


@needs_onnx
@pytest.mark.parametrize("name", EXPORTS)
def test_each_layer_norm_is_one_onnx_op(exported, name):
    """Every keras_vit LayerNorm of the model is one `LayerNormalization` (which ONNX Runtime
    and OpenVINO run as one kernel), no op of its TensorFlow form left in the layer's scope (a
    mean as `GlobalAveragePool`, `Sqrt`, `Reciprocal`, ...); the hybrid's GroupNorms, over other
    axes, and RMSNorms (opset 17 has no RMSNormalization; its ops match no LayerNorm's), stay as
    they were (and correct: the outputs' tests)."""
    import onnx

    from keras_vit.layers.normalization import LayerNorm

    path, _, model = exported(name)
    nodes = list(_nodes(onnx.load(path).graph))
    # Exactly LayerNorm: RMSNorm is its subclass.
    layer_norms = [layer for layer in model._flatten_layers() if type(layer) is LayerNorm]
    if model.spec.norm_layer == "rms_norm":
        assert layer_norms == []
        pytest.skip("every norm is an RMSNorm")
    names = {layer.name for layer in layer_norms}  # each block's have the same names
    fused = [node for node in nodes if node.op_type == "LayerNormalization"]
    # tf2onnx names a node by its TensorFlow scope, ".../LayerNorm_0_1/Mean" (the layer's call)
    left = [f"{node.op_type} {node.name}" for node in nodes if node.op_type != "LayerNormalization"
            and any(f"/{layer}_" in node.name for layer in names)]
    assert len(fused) == len(layer_norms)
    assert len(fused) >= 3  # each block's two, and the encoder's or the pooled tokens' own
    assert left == []
    if name == "hybrid":  # its root's GroupNorm, as it was
        assert [node.op_type for node in nodes].count("Sqrt") == 1


@needs_onnx
@pytest.mark.parametrize("name", ["learned", "hybrid", "map_registers", "dynamic_image_size"])
def test_reshapes_to_a_known_shape_take_it_as_a_constant(exported, name):
    """A reshape whose target is one dimension of a tensor and constants gets that shape as a
    constant, -1 for the dimension, without the Shape, Slice, Concat and Cast that computed
    it: at a fixed size, every reshape of the blocks (the batch the one size computed). A
    model of any image size keeps the ones whose token count is computed too."""
    import onnx

    path, _, model = exported(name)
    graph = onnx.load(path).graph
    constants = {tensor.name for tensor in graph.initializer}
    reshapes = [node for node in graph.node if node.op_type == "Reshape"]
    static = [node for node in reshapes if node.input[1] in constants]
    if name == "dynamic_image_size":
        assert len(static) < len(reshapes)
    else:
        assert len(static) >= 6 * model.spec.num_layers  # 2 per dense layer of each block
        # (the patch embedding's reshape has its own -1, the tokens: left as it is)
        assert [f"{node.op_type} {node.name}" for node in graph.node if "encoderblock" in
                node.name and (node.op_type in ("Shape", "Cast") or node in reshapes
                               and node not in static)] == []
    assert not [tensor.name for tensor in graph.initializer  # nothing left unused
                if not any(tensor.name in node.input for node in _nodes(graph))]


@needs_onnx
def test_inputs_outputs_and_metadata(exported):
    """A free batch dimension named `batch`; the spec, class names and input read back."""
    path, _, model = exported("learned")
    loaded = session(path)
    (inputs,), (outputs,) = loaded.get_inputs(), loaded.get_outputs()
    assert (inputs.name, inputs.shape, inputs.type) == ("images", ["batch", 32, 32, 3],
                                                        "tensor(float)")
    assert (outputs.name, outputs.shape) == ("logits", ["batch", 5])
    metadata = loaded.get_modelmeta().custom_metadata_map
    assert keras_vit.ViTConfig.from_dict(json.loads(metadata[onnx_export.SPEC_KEY])) == model.spec
    assert json.loads(metadata[onnx_export.CLASS_NAMES_KEY]) == CLASS_NAMES
    assert "scaled to [-1, 1]" in metadata[onnx_export.INPUT_KEY]


@needs_onnx
@pytest.mark.parametrize("dtype, preprocessing, sizes", [
    ("float32", keras_vit.EvalPreprocessing(crop_mode="center", crop_fraction=0.875),
     [(50, 70), (90, 40)]),
    ("uint8", keras_vit.EvalPreprocessing(interpolation="bicubic"), [(50, 70), (20, 24)]),
], ids=["float32_center_crop", "uint8_bicubic_up_and_down"])
def test_preprocessing_in_the_graph(tmp_path, dtype, preprocessing, sizes):
    """`pixels` of any size in 0..255, resized (and cropped) as the model's preprocessing says,
    give what Keras gives on `keras_vit.prepare_images` (the SavedModel's resize)."""
    model = tiny()
    if preprocessing is not None:
        model.preprocessing = preprocessing
    path = tmp_path / "pixels.onnx"
    export.export_onnx(model, path, preprocess=dtype)
    (inputs,) = session(path).get_inputs()
    onnx_type = "tensor(float)" if dtype == "float32" else f"tensor({dtype})"
    assert (inputs.name, inputs.shape, inputs.type) == (
        "pixels", ["batch", "height", "width", 3], onnx_type)
    for count, (height, width) in zip((1, 3), sizes):
        images = pixels(count, height, width, seed=height, dtype=dtype)
        expected = model(keras_vit.prepare_images(model, images), training=False)
        assert_close(run(path, pixels=images), expected)


@needs_onnx
def test_a_model_of_any_image_size_has_free_sides(exported):
    path, _, _ = exported("dynamic_image_size")
    (inputs,) = session(path).get_inputs()
    assert inputs.shape == ["batch", "height", "width", 3]


@needs_onnx
def test_native_resolution(tmp_path):
    """With max_num_patches: the NaFlex arrays of images of several shapes, as NaFlexViT."""
    model = tiny()
    path = tmp_path / "naflex.onnx"
    export.export_onnx(model, path, max_num_patches=16)
    naflex = keras_vit.native.NaFlexViT(model)
    names = [value.name for value in session(path).get_inputs()]
    assert names == ["pixel_values", "pixel_attention_mask", "spatial_shapes"]
    for shapes in ([(32, 64)], [(32, 64), (40, 24), (16, 16)]):
        images = [pixels(1, *shape, seed=shape[0], dtype=np.uint8)[0] for shape in shapes]
        arrays = keras_vit.native.prepare(images, patch_size=8, max_num_patches=16)
        assert_close(run(path, **{name: np.asarray(arrays[name]) for name in names}),
                     naflex(arrays, training=False))


@needs_onnx
def test_mixed_precision_and_headless_models(tmp_path):
    """A bfloat16 model leaves in float32 (its weights as they are); a model without its head
    outputs `features`."""
    model = tiny(include_top=False)
    path = tmp_path / "features.onnx"
    export.export_onnx(model, path)
    assert [value.name for value in session(path).get_outputs()] == ["features"]
    images = scaled(pixels(3))
    assert_close(run(path, images=images), model(images, training=False))

    mixed = keras_vit.vit("Ti/16", image_size=32, patch_size=8, num_classes=5,
                          dtype="mixed_bfloat16", **{**TINY_VIT, "num_layers": 1})
    randomise(mixed)
    export.export_onnx(mixed, path)
    expected = export.float32_copy(mixed)(images, training=False)
    assert_close(run(path, images=images), expected)


@needs_onnx
def test_the_file_is_written_whole_or_not_at_all(exported, tmp_path, monkeypatch):
    """Into a directory it makes, returning its size; interrupted as the file is renamed into
    place, the previous file stays and no temporary file is left; then replaced whole. (The
    conversion is the learned case's, read back.)"""
    import onnx

    from keras_vit import fileio

    source, feeds, model = exported("learned")
    monkeypatch.setattr(onnx_export, "onnx_model", lambda *args: onnx.load(source))
    path = tmp_path / "export" / "vit.onnx"
    assert export.export_onnx(model, path) == os.path.getsize(path)
    path.write_bytes(b"the previous file")
    with monkeypatch.context() as interrupted:
        interrupted.setattr(fileio.os, "replace", _interrupt)
        with pytest.raises(KeyboardInterrupt):
            export.export_onnx(model, path)
    assert path.read_bytes() == b"the previous file"
    assert os.listdir(path.parent) == ["vit.onnx"]
    export.export_onnx(model, path)
    (inputs, expected), _ = feeds
    assert_close(run(path, **inputs), expected)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@needs_onnx
def test_int8_quantizes_the_layers_with_weights(tmp_path):
    """int8 weights and activations (QDQ) around every convolution and matrix product with a
    weight, none around the attention's products of two activations; logits within 10% of
    Keras' largest (random weights, random calibration images)."""
    import onnx

    model = tiny()
    path = tmp_path / "int8.onnx"
    calibration = pixels(32, seed=9, dtype=np.uint8)
    export.export_onnx(model, path, preprocess="uint8", quantization="int8",
                       representative_data=calibration)
    graph = onnx.load(path).graph
    weights = {initializer.name for initializer in graph.initializer}
    dequantize = [node for node in graph.node if node.op_type == "DequantizeLinear"]
    dequantized = {node.output[0] for node in dequantize}
    weights |= {node.output[0] for node in dequantize if node.input[0] in weights}  # int8 ones
    products = [node for node in graph.node if node.op_type in ("MatMul", "Conv")]
    with_weights = [node for node in products if node.input[1] in weights]
    assert len(with_weights) >= 5  # the patch embedding, q/k/v/out, the MLP's two, the head
    for node in products:
        quantized = all(name in dequantized for name in node.input[:2])
        assert quantized == (node in with_weights), node.name
    assert session(path).get_modelmeta().custom_metadata_map[
        onnx_export.QUANTIZATION_KEY] == "int8"
    images = pixels(3, 40, 36, seed=4, dtype=np.uint8)
    expected = np.asarray(_uint8_logits(model, images))
    np.testing.assert_allclose(run(path, pixels=images), expected,
                               atol=0.1 * np.abs(expected).max())


# python -m train.export --onnx, and the training run's export (config.export_onnx).

@needs_onnx
def test_the_export_command_writes_onnx_files(tmp_path):
    """From a workdir's model.keras and class names: uint8 pixels of any size in."""
    model = tiny()
    (tmp_path / "export").mkdir()
    model.save(tmp_path / "export" / "model.keras")
    (tmp_path / "export" / "class_names.txt").write_text("\n".join(CLASS_NAMES) + "\n")
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-m", "train.export", f"--workdir={tmp_path}",
                             "--onnx=float32"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    path = tmp_path / "export" / "model_float32.onnx"
    loaded = session(path)
    assert loaded.get_inputs()[0].name == "pixels"
    metadata = loaded.get_modelmeta().custom_metadata_map
    assert json.loads(metadata[onnx_export.CLASS_NAMES_KEY]) == CLASS_NAMES
    images = pixels(3, 40, 28, dtype=np.uint8)
    assert_close(run(path, pixels=images), _uint8_logits(model, images))


@needs_onnx
@pytest.mark.processes
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_training_run_exports_its_onnx_file(fake_fmnist, tmp_path, backend):
    """config.export_onnx: written at the end of training, on either engine (JAX exports in a
    TensorFlow process), beside the SavedModel and TFLite files; int8 calibrated on the
    run's training images."""
    workdir = tmp_path / "run"
    result = subprocess.run(main_command(fake_fmnist, str(workdir), export=True,
                                         export_onnx="float32,int8"),
                            cwd=REPO, env=dict(fake_fmnist.env(), KERAS_BACKEND=backend),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    directory = workdir / "export"
    assert {"model_float32.tflite", "model_float32.onnx",
            "model_int8.onnx"} <= set(os.listdir(directory))
    model = keras.saving.load_model(directory / "model.keras")
    images = pixels(3, 28, 28, dtype=np.uint8)
    expected = _uint8_logits(model, images)
    assert_close(run(directory / "model_float32.onnx", pixels=images), expected)
    # A few steps leave logits near 0.05, where int8's steps show: its numbers are
    # test_int8_quantizes_the_layers_with_weights' and the benchmark's.
    int8 = session(directory / "model_int8.onnx")
    assert int8.get_modelmeta().custom_metadata_map[onnx_export.QUANTIZATION_KEY] == "int8"
    assert np.isfinite(int8.run(None, {"pixels": images})[0]).all()


def test_the_export_command_without_the_onnx_packages_names_the_extra(monkeypatch):
    from train import export as command
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "tf2onnx" else find_spec(name, *args))
    with pytest.raises(ValueError) as error:
        command.check_onnx_packages("--onnx=float32")
    message = str(error.value)
    assert message.startswith("--onnx=float32 asks for ONNX files, whose export needs tf2onnx")
    assert 'not installed: pip install "keras_vit[onnx]"' in message
    assert command.parse_onnx("all") == ["float32", "int8"] and command.parse_onnx("none") == []


# Bad arguments: refused, naming them, before any conversion.

@pytest.fixture
def no_conversion(monkeypatch):
    def reached(*args, **kwargs):
        raise AssertionError("the conversion started before the arguments were checked")

    monkeypatch.setattr(onnx_export, "onnx_model", reached)


@pytest.fixture(scope="module")
def model():
    return random_tiny_vit()


def _raises(error_type, words, *args, **kwargs):
    with pytest.raises(error_type) as caught:
        export.export_onnx(*args, **kwargs)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


@pytest.mark.parametrize("arguments, error_type, words", [
    pytest.param(dict(preprocess=True), ValueError,
                 ["preprocess must be None", 'pass "uint8" or "float32"'], id="preprocess_true"),
    pytest.param(dict(preprocess="UINT8"), ValueError, ['pass "uint8"'], id="preprocess_case"),
    pytest.param(dict(preprocess=np.dtype("uint8")), ValueError, ['its name, "uint8"'],
                 id="preprocess_a_dtype"),
    pytest.param(dict(preprocess="int8"), ValueError, ["preprocess must be", "'int8'"],
                 id="preprocess_int8"),
    pytest.param(dict(preprocess="uint8", max_num_patches=16), ValueError,
                 ["max_num_patches", "NaFlex arrays", "leave preprocess=None"],
                 id="preprocess_at_native_resolution"),
    pytest.param(dict(opset=13), ValueError, ["opset must be", "17", "13"], id="old_opset"),
    pytest.param(dict(opset="17"), ValueError, ["opset must be an integer"], id="opset_text"),
    pytest.param(dict(opset=99), ValueError, ["opset must be an integer ONNX opset, 17 to"],
                 id="opset_too_new", marks=needs_onnx),
    pytest.param(dict(class_names="cat dog"), TypeError, ["class_names", "list of 5 names"],
                 id="class_names_a_string"),
    pytest.param(dict(class_names=CLASS_NAMES[:2]), ValueError, ["2 class names", "5 outputs"],
                 id="too_few_class_names"),
    pytest.param(dict(max_num_patches=0), ValueError, ["max_num_patches"],
                 id="no_budget"),
    pytest.param(dict(quantization="float16"), ValueError,
                 ['quantization must be "none" or "int8" for ONNX', "'float16'"],
                 id="float16"),
    pytest.param(dict(quantization="INT8"), ValueError, ['pass "int8"'], id="int8_case"),
    pytest.param(dict(quantization="int8"), ValueError,
                 ['quantization="int8" needs representative_data'], id="int8_without_data"),
    pytest.param(dict(quantization="int8", representative_data=pixels(2, 16, 16)), ValueError,
                 ["[N, 32, 32, 3]", "(2, 16, 16, 3)"], id="int8_data_of_another_size"),
    pytest.param(dict(quantization="int8", representative_data=pixels(2) / 255), ValueError,
                 ["[0, 1]", "multiply by 255"], id="int8_data_scaled"),
    pytest.param(dict(dtype_of_pixels="uint8"), TypeError, ["dtype_of_pixels"],
                 id="unknown_option"),
])
def test_bad_arguments(model, tmp_path, no_conversion, arguments, error_type, words):
    _raises(error_type, words, model, tmp_path / "vit.onnx", **arguments)
    assert os.listdir(tmp_path) == []


def test_bad_models_and_paths(model, tmp_path, no_conversion):
    _raises(TypeError, ["model must be a keras_vit model", "the model comes first"],
            str(tmp_path / "vit.onnx"), model)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    _raises(TypeError, ["not a keras_vit model", "model.export(path, format='onnx')"],
            plain, tmp_path / "plain.onnx")
    _raises(ValueError, ["is a NaFlexViT", "pass max_num_patches", "model.vit"],
            keras_vit.native.NaFlexViT(model), tmp_path / "naflex.onnx")
    _raises(ValueError, ["path=", "is a directory", "<directory>/model"], model, tmp_path)
    blocker = tmp_path / "export"
    blocker.write_text("x")
    _raises(ValueError, ["directory of path", "is a file"], model, blocker / "vit.onnx")
    _raises(TypeError, ["path must be a path"], model, 3)
    assert os.listdir(tmp_path) == ["export"]


@pytest.mark.parametrize("preprocessing, words", [
    (keras_vit.EvalPreprocessing(antialias=True), ["antialias=True", "preprocess=None"]),
    (keras_vit.EvalPreprocessing(interpolation="bicubic", crop_mode="center"),
     ["bicubically before a crop", "preprocess=None"]),
])
def test_resizes_that_onnx_cannot_run(tmp_path, no_conversion, monkeypatch, preprocessing,
                                      words):
    """Refused with the pixels in the graph; without them, the arguments pass (and the
    conversion, patched here, is reached)."""
    monkeypatch.setattr(onnx_export, "_check_packages", lambda opset: None)  # or not installed
    model = tiny()
    model.preprocessing = preprocessing
    _raises(ValueError, words, model, tmp_path / "vit.onnx", preprocess="uint8")
    _raises(AssertionError, ["conversion started"], model, tmp_path / "vit.onnx")


def test_missing_packages_name_the_extra(model, tmp_path, no_conversion, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "tf2onnx" else find_spec(name, *args))
    _raises(ImportError, ["needs tf2onnx", 'pip install "keras_vit[onnx]"'],
            model, tmp_path / "vit.onnx")


def test_a_model_over_two_gigabytes_is_refused(model, tmp_path, no_conversion, monkeypatch):
    monkeypatch.setattr(onnx_export, "MAX_BYTES", 1000)
    _raises(ValueError, ["GiB of float32 weights", "2 GiB", "--large_model"],
            model, tmp_path / "vit.onnx")

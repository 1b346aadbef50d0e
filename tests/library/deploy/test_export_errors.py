"""Clear errors at every boundary of the export (keras_vit/deploy/export.py, train/export.py).

- The SavedModel's signatures, served from a process without keras_vit: a request that breaks
  the contract (wrong rank or channel count, no pixels, NaN/Inf, pixels outside 0..255, no
  images) is an INVALID_ARGUMENT error that says what was wrong, both through
  `tf.saved_model.load` and through a plain session run of the signature's tensors (what TF
  Serving does: it feeds the graph without holding the request to the signature's shape). Valid
  edge cases still answer, and so does the next request.
- `python -m train.export`: a user's mistake ends with exit status 1 and one "Error: ..." line
  naming the problem and the fix, no traceback, nothing written; flag mistakes are found before
  TensorFlow is imported (each such run takes well under a second).
- The Python API: ValueError / TypeError naming the argument and what is valid, before any
  tracing or conversion (those are patched to fail the test if reached).
"""

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tensorflow as tf

import cli_cases
from export_fixtures import NUM_CLASSES, SIZE, WITHOUT_KERAS_VIT, tiny_vit
from keras_vit.deploy import export
from train_fixtures import REPO

CLASS_NAMES = ["cat", "dog", "fox", "owl", "elk", "bee", "ant"]


def _env():
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return env


@pytest.fixture(scope="module")
def model():
    return tiny_vit()


# The serving signatures.

SERVER = WITHOUT_KERAS_VIT + r'''
import json, sys

import numpy as np
import tensorflow as tf

export_dir, work = sys.argv[1], sys.argv[2]
cases = np.load(f"{work}/cases.npz")
signature_of = json.load(open(f"{work}/signatures.json"))


def outcome(call):
    try:
        outputs = call()
    except Exception as error:  # the test checks type and message
        return {"error": type(error).__name__, "message": " ".join(str(error).split())[:600]}
    return {"error": None, "logits": np.asarray(outputs["logits"]).tolist()}


def feed(name):
    value = cases[name]
    return value.astype(object) if value.dtype.kind == "S" else value


loaded = tf.saved_model.load(export_dir)
results = {"tf2": {}, "session": {}}
for name in cases.files:
    signature, key = signature_of[name]
    function = loaded.signatures[signature]
    results["tf2"][name] = outcome(lambda: function(**{key: tf.constant(cases[name])}))

# As TF Serving runs a SavedModel: the signature's tensors in a session, fed without a check of
# the request's shape against the signature's (the C++ Session::Run does none).
graph = tf.Graph()
with tf.compat.v1.Session(graph=graph) as session:
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    for name in cases.files:
        signature, _ = signature_of[name]
        definition = meta.signature_def[signature]
        (input_info,) = definition.inputs.values()
        tensor = graph.get_tensor_by_name(input_info.name)
        logits = graph.get_tensor_by_name(definition.outputs["logits"].name)
        results["session"][name] = outcome(lambda: {"logits": session._call_tf_sessionrun(
            None, {tensor._as_tf_output(): feed(name)}, [logits._as_tf_output()], [], None)[0]})
results["keras_vit_imported"] = "keras_vit" in sys.modules
with open(f"{work}/results.json", "w") as handle:
    json.dump(results, handle)
'''

rng = np.random.default_rng(4)
GOOD = rng.integers(0, 256, (2, SIZE, SIZE, 3)).astype(np.float32)
NAN = GOOD.copy()
NAN[1, 3, 4, 0] = np.nan
POSITIVE_INF = GOOD.copy()
POSITIVE_INF[0, 0, 0, 2] = np.inf
NEGATIVE_INF = GOOD.copy()
NEGATIVE_INF[1, 5, 5, 1] = -np.inf

# name: (input, signature, words the error must contain (lower case)).
INVALID = {
    "six_channels": (np.full((2, SIZE, SIZE, 6), 100, np.float32), "serving_images",
                     ["3 channels", "2 32 32 6"]),
    "four_channels": (np.full((1, SIZE, SIZE, 4), 100, np.float32), "serving_images",
                      ["3 channels", "1 32 32 4"]),
    "grayscale": (np.full((1, 20, 24, 1), 100, np.float32), "serving_images",
                  ["3 channels", "1 20 24 1"]),
    "no_batch_axis": (GOOD[0], "serving_images", ["shape", "[32,32,3]", "[?,?,?,3]"]),
    "rank_5": (GOOD[None], "serving_images", ["shape", "[1,2,32,32,3]", "[?,?,?,3]"]),
    "nan": (NAN, "serving_images", ["nan or infinite", "0..255"]),
    "positive_inf": (POSITIVE_INF, "serving_images", ["nan or infinite"]),
    "negative_inf": (NEGATIVE_INF, "serving_images", ["nan or infinite"]),
    "scaled_to_minus_one_one": (GOOD / 127.5 - 1, "serving_images",
                                ["0..255", "[-1, 1]", "min", "max"]),
    "sixteen_bit": (GOOD * 257, "serving_images", ["0..255", "16-bit", "65535"]),
    "empty_batch": (np.zeros((0, SIZE, SIZE, 3), np.float32), "serving_images",
                    ["no pixels", "0 32 32 3"]),
    "zero_height": (np.zeros((2, 0, SIZE, 3), np.float32), "serving_images",
                    ["no pixels", "2 0 32 3"]),
    "zero_width": (np.zeros((1, SIZE, 0, 3), np.float32), "serving_images",
                   ["no pixels", "1 32 0 3"]),
    "no_image_bytes": (np.zeros((0,), "S1"), "serving_default", ["no images", "image_bytes"]),
    "image_bytes_rank_2": (np.array([[b"x", b"y"]]), "serving_default",
                           ["shape", "[1,2]", "[?]"]),
}
VALID = {
    "ends_of_the_range": (np.stack([np.zeros((SIZE, SIZE, 3)), np.full((SIZE, SIZE, 3), 255.0)])
                          .astype(np.float32), "serving_images"),
    "one_pixel": (np.full((1, 1, 1, 3), 7, np.float32), "serving_images"),
    "good": (GOOD, "serving_images"),
}


@pytest.fixture(scope="module")
def served(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("serving_errors")
    export_dir = export.export_saved_model(model, str(root / "vit"), class_names=CLASS_NAMES)
    work = root / "work"
    work.mkdir()
    cases = {name: case[0] for name, case in {**INVALID, **VALID}.items()}
    np.savez(work / "cases.npz", **cases)
    inputs = {"serving_images": "images", "serving_default": "image_bytes"}
    signatures = {name: [case[1], inputs[case[1]]] for name, case in {**INVALID, **VALID}.items()}
    (work / "signatures.json").write_text(json.dumps(signatures))
    script = root / "server.py"
    script.write_text(SERVER)
    result = subprocess.run([sys.executable, str(script), export_dir, str(work)], cwd=str(root),
                            env=_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-6000:]
    results = json.loads((work / "results.json").read_text())
    assert results.pop("keras_vit_imported") is False
    return results


@pytest.mark.parametrize("runtime", ["tf2", "session"])
@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_request_is_an_invalid_argument(served, runtime, name):
    outcome = served[runtime][name]
    assert outcome["error"] == "InvalidArgumentError", outcome
    message = outcome["message"].lower()
    for word in INVALID[name][2]:
        assert word in message, (word, outcome["message"])


@pytest.mark.parametrize("runtime", ["tf2", "session"])
def test_valid_edge_cases_still_answer(served, model, runtime):
    from export_fixtures import keras_logits
    for name, (pixels, _) in VALID.items():
        outcome = served[runtime][name]
        assert outcome["error"] is None, (name, outcome)
        expected = keras_logits(model, tf.image.resize(pixels, (SIZE, SIZE), method="bilinear"))
        np.testing.assert_allclose(outcome["logits"], expected, atol=1e-5)
        assert np.shape(outcome["logits"]) == (len(pixels), NUM_CLASSES)


def test_both_runtimes_answer_alike(served):
    np.testing.assert_allclose(served["tf2"]["good"]["logits"],
                               served["session"]["good"]["logits"], atol=1e-6)


# The Python API: argument errors before any slow work.

@pytest.fixture
def no_slow_work(monkeypatch):
    """Fails the test if tracing the SavedModel or converting to TFLite starts."""
    def reached(*args, **kwargs):
        raise AssertionError("slow work started before the arguments were checked")

    monkeypatch.setattr(export, "_serving_endpoints", reached)
    monkeypatch.setattr(export, "_native_endpoints", reached)
    monkeypatch.setattr(export, "float32_copy", reached)
    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_saved_model", reached)


def _raises(error_type, words, function, *args, **kwargs):
    with pytest.raises(error_type) as caught:
        function(*args, **kwargs)
    message = str(caught.value)
    for word in words:
        assert word in message, (word, message)
    return message


def test_saved_model_base_dir_is_a_file(model, tmp_path, no_slow_work):
    path = tmp_path / "vit"
    path.write_text("not a directory")
    _raises(ValueError, ["base_dir", "is a file", "not a directory"],
            export.export_saved_model, model, str(path))
    _raises(ValueError, ["base_dir", f"is below {path}", "is a file"],
            export.export_saved_model, model, str(path / "models"))
    assert path.read_text() == "not a directory"
    assert sorted(os.listdir(tmp_path)) == ["vit"]


def test_saved_model_into_a_full_disk_names_the_path(model, tmp_path, monkeypatch):
    """A full disk ends the export with an OSError naming the version's path (TensorFlow's
    error, as a 200 kB tmpfs gave it, names the SaveV2 op and a temporary file), and leaves
    nothing behind."""
    import keras

    def full_disk(archive, path, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, (
            "{{function_node __wrapped__SaveV2_dtypes_41_device_/job:localhost/replica:0/task:0/"
            f"device:CPU:0}}}} {path}/variables/variables_temp/part-00000-of-00001.data-00000-"
            "of-00001.tempstate12129988548427344929; No space left on device [Op:SaveV2]"))

    # keras.export.ExportArchive() is a factory returning the backend's archive class.
    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", full_disk)
    base = tmp_path / "vit"
    with pytest.raises(OSError) as caught:
        export.export_saved_model(model, str(base))
    assert caught.value.errno == 28 and caught.value.filename == str(base / "1")
    assert str(caught.value) == f"[Errno 28] No space left on device: '{base / '1'}'"
    assert os.listdir(base) == []  # the partial export was removed


@pytest.mark.parametrize("arguments, error_type, words", [
    pytest.param(dict(class_names="cat dog"), TypeError, ["class_names", "list of 7 names"],
                 id="class_names_a_string"),
    pytest.param(dict(class_names=list(range(NUM_CLASSES))), TypeError, ["class_names", "strings"],
                 id="class_names_not_strings"),
    pytest.param(dict(class_names=CLASS_NAMES[:3]), ValueError, ["3 class names", "7 outputs"],
                 id="too_few_class_names"),
    pytest.param(dict(top_k=0), ValueError, ["top_k", "positive integer"], id="top_k_0"),
    pytest.param(dict(version=-1), ValueError, ["version", "non-negative integer"],
                 id="negative_version"),
    pytest.param(dict(version="latest"), ValueError, ["version", "non-negative integer"],
                 id="version_a_word"),
    pytest.param(dict(version=1.5), ValueError, ["version", "non-negative integer"],
                 id="version_a_fraction"),
])
def test_saved_model_bad_arguments(model, tmp_path, no_slow_work, arguments, error_type, words):
    _raises(error_type, words, export.export_saved_model, model, str(tmp_path / "vit"),
            **arguments)
    assert os.listdir(tmp_path) == []


def test_arguments_swapped(model, tmp_path, no_slow_work):
    _raises(TypeError, ["model must be a keras.Model", "str"],
            export.export_saved_model, str(tmp_path / "vit"), model)
    _raises(TypeError, ["model must be a keras.Model"],
            export.export_tflite, str(tmp_path / "vit.tflite"), model)
    _raises(TypeError, ["base_dir must be a path"], export.export_saved_model, model, 3)


@pytest.mark.parametrize("quantization, words", [
    ("int4", ["quantization must be one of", "'none', 'float16', 'dynamic', 'int8'", "'int4'"]),
    ("float32", ['pass "none"']),
    ("FP16", ['pass "float16"']),
    ("INT8", ['pass "int8"']),
    (None, ["quantization must be one of", "None"]),
])
def test_unknown_quantization(model, tmp_path, no_slow_work, quantization, words):
    _raises(ValueError, words, export.export_tflite, model, str(tmp_path / "m.tflite"),
            quantization=quantization, representative_data=GOOD)
    _raises(ValueError, words, export.tflite_bytes, model, quantization)
    assert os.listdir(tmp_path) == []


def _images(count=3, low=0.0, high=255.0, size=SIZE):
    return np.random.default_rng(1).uniform(low, high, (count, size, size, 3)).astype(np.float32)


def _with(value, index=(0, 1, 2, 0)):
    images = _images()
    images[index] = value
    return images


@pytest.mark.parametrize("data, error_type, words", [
    pytest.param(None, ValueError, ['quantization="int8" needs representative_data', "dynamic"],
                 id="missing"),
    pytest.param(_images(size=16), ValueError, ["[N, 32, 32, 3]", "(3, 16, 16, 3)", "resize"],
                 id="other_size"),
    pytest.param(_images()[0], ValueError, ["one image", "np.stack"], id="one_image"),
    pytest.param([_images()[0], _images()[1]], ValueError, ["representative_data[0] is one image"],
                 id="list_of_images"),
    pytest.param(_images()[..., :1], ValueError, ["[N, 32, 32, 3]", "(3, 32, 32, 1)"],
                 id="one_channel"),
    pytest.param(np.zeros((0, SIZE, SIZE, 3), np.float32), ValueError, ["holds no images"],
                 id="empty_array"),
    pytest.param([], ValueError, ["holds no images"], id="empty_list"),
    pytest.param(_with(np.nan), ValueError, ["1 NaN or infinite"], id="nan"),
    pytest.param(_with(np.inf), ValueError, ["NaN or infinite"], id="inf"),
    pytest.param(_images() / 127.5 - 1, ValueError, ["0..255", "x * 127.5 + 127.5"],
                 id="scaled_to_minus_one_one"),
    pytest.param(_images() * 257, ValueError, ["0..255", "to 65525.6", "16-bit", "x / 257"],
                 id="sixteen_bit"),
    pytest.param(_images() / 255, ValueError, ["[0, 1]", "multiply by 255"], id="scaled_to_0_1"),
    pytest.param(np.full((2, SIZE, SIZE, 3), "a"), TypeError, ["must hold numbers", "dtype"],
                 id="strings"),
    pytest.param("calibration/", TypeError,
                 ["representative_data must be", "load the images first"], id="a_path"),
    pytest.param(42, TypeError, ["representative_data must be", "int"], id="a_number"),
    pytest.param([_images(), _images(size=8)], ValueError,
                 ["representative_data[1]", "(3, 8, 8, 3)"], id="second_batch_other_size"),
])
def test_bad_representative_data(model, tmp_path, no_slow_work, data, error_type, words):
    _raises(error_type, words, export.export_tflite, model, str(tmp_path / "m.tflite"),
            quantization="int8", representative_data=data)
    assert os.listdir(tmp_path) == []


def test_good_representative_data_forms():
    """uint8 arrays, lists of batches, generators and tensors are all fine (and ignored by
    the other quantizations)."""
    pixels = _images().round().astype(np.uint8)
    for data in (pixels, [pixels[:1], pixels[1:]], (batch for batch in [pixels]),
                 tf.constant(pixels)):
        samples = list(export._representative_samples(data, (SIZE, SIZE))())
        assert len(samples) == 3
        assert all(sample[0].shape == (1, SIZE, SIZE, 3) and sample[0].dtype == np.float32
                   for sample in samples)


def test_tflite_path_is_a_directory_or_below_a_file(model, tmp_path, no_slow_work):
    _raises(ValueError, ["path=", "is a directory", "model.tflite"],
            export.export_tflite, model, str(tmp_path))
    blocker = tmp_path / "export"
    blocker.write_text("x")
    _raises(ValueError, ["directory of path", "is a file"],
            export.export_tflite, model, str(blocker / "model.tflite"))
    assert sorted(os.listdir(tmp_path)) == ["export"]


# python -m train.export

@pytest.fixture(scope="module")
def workdirs(model, tmp_path_factory):
    """A trained-like workdir (export/model.keras of the tiny ViT) and damaged variants."""
    root = tmp_path_factory.mktemp("workdirs")
    good = root / "good" / "export"
    good.mkdir(parents=True)
    model.save(str(good / "model.keras"))
    content = (good / "model.keras").read_bytes()
    damaged = {
        "truncated": content[:len(content) // 2],
        "empty": b"",
        "not_keras": None,
        "bad_config": None,
    }
    for name, data in damaged.items():
        folder = root / name / "export"
        folder.mkdir(parents=True)
        path = folder / "model.keras"
        if name == "not_keras":
            with zipfile.ZipFile(path, "w") as archive:
                archive.writestr("notes.txt", "hello")
        elif name == "bad_config":
            with zipfile.ZipFile(path, "w") as archive:
                archive.writestr("config.json", "{not json")
                archive.writestr("metadata.json", "{}")
        else:
            path.write_bytes(data)
    (root / "a_file").write_text("x")
    (root / "bad_json" / "export").mkdir(parents=True)
    (root / "bad_json" / "export" / "model.keras").write_bytes(content)
    (root / "bad_json" / "config.json").write_text("{not json")
    return root


def _cli_env():
    env = _env()
    env["PYTHONPATH"] = REPO
    return env


def _check_one_error(result, words):
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr[-3000:]
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


CLI_CASES = {
    # name: (arguments with {root} for the workdirs' root, words the Error line must contain)
    "export_dir_is_a_file": (["--workdir={root}/good", "--export_dir={root}/a_file"],
                             ["--export_dir=", "is a file", "pass a directory"]),
    "export_dir_below_a_file": (["--workdir={root}/good", "--export_dir={root}/a_file/vit"],
                                ["is below", "a_file, which is a file"]),
    "workdir_missing": (["--workdir={root}/missing"],
                        ["--workdir=", "does not exist", "python -m train.main"]),
    "workdir_is_a_file": (["--workdir={root}/a_file"], ["is a file, not a directory"]),
    "no_model": (["--workdir={root}"], ["No trained model", "train first"]),
    "truncated_model": (["--workdir={root}/truncated"],
                        ["model.keras is damaged", "truncated", "rerunning the training",
                         "--config.export=True"]),
    "empty_model": (["--workdir={root}/empty"], ["is damaged (0 bytes"]),
    "zip_not_keras": (["--workdir={root}/not_keras"],
                      ["not a Keras model", "rerunning the training"]),
    "unknown_tflite": (["--workdir={root}/good", "--tflite=int4,float32"],
                       ["Unknown --tflite kind(s) 'int4'", "float32, float16, dynamic, int8"]),
    "all_in_a_list": (["--workdir={root}/good", "--tflite=float32,all"],
                      ["'all'", "stand alone"]),
    "unknown_onnx": (["--workdir={root}/good", "--onnx=int4"],
                     ["Unknown --onnx kind(s) 'int4'", "comma list of float32, int8"]),
    "calibration_zero": (["--workdir={root}/good", "--tflite=int8", "--calibration_images=0"],
                         ["--calibration_images must be at least 1, got 0"]),
    "calibration_negative": (["--workdir={root}/good", "--calibration_images=-5"],
                             ["--calibration_images must be at least 1, got -5"]),
    "calibration_not_a_number": (["--workdir={root}/good", "--calibration_images=many"],
                                 ["--calibration_images", "many", "--helpshort"]),
    "int8_without_config": (["--workdir={root}/good", "--tflite=int8"],
                            ["config.json is missing", "choose other --tflite and --onnx kinds"]),
    "int8_config_not_json": (["--workdir={root}/bad_json", "--tflite=int8"],
                             ["config.json is not valid JSON", "restore it"]),
    "missing_workdir_flag": ([], ["--workdir", "--helpshort"]),
    "positional_argument": (["--workdir={root}/good", "int8"],
                            ["Unexpected arguments ['int8']", "--workdir=DIR"]),
}


# Run after CLI_CASES, in the same process (tests/cli_cases.py: TensorFlow imported once).
LOADING_CASES = {
    # A complete zip whose content Keras rejects: still one Error line, with Keras' reason.
    "model_keras_cannot_be_loaded": ["--workdir={root}/bad_config"],
    "verbose": ["--workdir={root}/truncated", "--verbose"],
}


@pytest.fixture(scope="module")
def cli_results(workdirs):
    """{case name: result} of `python -m train.export` for every case above."""
    cases = {name: arguments for name, (arguments, _) in CLI_CASES.items()}
    cases.update(LOADING_CASES)
    results = cli_cases.run("train.export", [[argument.format(root=workdirs)
                                              for argument in arguments]
                                             for arguments in cases.values()],
                            env=_cli_env(), cwd=REPO)
    return dict(zip(cases, results))


def _nothing_exported(workdirs):
    for folder in ("good", "truncated", "bad_json", "bad_config"):
        assert not os.path.exists(workdirs / folder / "export" / "saved_model")
    assert (workdirs / "a_file").read_text() == "x"


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_user_error(workdirs, cli_results, name):
    _check_one_error(cli_results[name], CLI_CASES[name][1])
    _nothing_exported(workdirs)


def test_cli_model_keras_cannot_be_loaded(workdirs, cli_results):
    _check_one_error(cli_results["model_keras_cannot_be_loaded"],
                     ["could not be loaded as a keras_vit model", "rerunning"])
    _nothing_exported(workdirs)


def test_cli_verbose_shows_the_traceback(cli_results):
    result = cli_results["verbose"]
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "BadZipFile" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("Error:")


def test_cli_flag_errors_do_not_import_tensorflow(workdirs):
    """Every flag is checked before TensorFlow loads (seconds): the answer comes at once."""
    env = _env()
    env["PYTHONPATH"] = REPO
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "train.export",
                             f"--workdir={workdirs}/missing", "--tflite=float32"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    _check_one_error(result, ["does not exist"])
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "absl.flags" in imported and "tensorflow" not in imported

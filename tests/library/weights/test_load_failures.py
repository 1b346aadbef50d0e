"""Every way weights reach a model (`checkpoint.load_npz` of an `.npz`, a `.keras` file or a
dict of arrays; `from_pretrained` of an `.npz`, a safetensors directory or a `.keras` file) and
`save_pretrained`'s refusals: half-precision files load, and a load that fails names the problem
and leaves every weight of the model bit-identical; a save that fails leaves nothing behind.

The files are written here with numpy and safetensors (no torch). JAX and big_vision write
bfloat16 arrays, which an `.npz` stores as 2-byte voids (`|V2`): numpy reads them back as such
whether or not ml_dtypes is imported.
"""

import os
import re
import subprocess
import sys

import keras
import ml_dtypes
import numpy as np
import pytest

import keras_vit
from keras_vit.weights import checkpoint, torch_layouts
from keras_vit.weights.checkpoint import CheckpointError
from model_fixtures import TINY_VIT, randomise, random_tiny_vit

pytestmark = pytest.mark.usefixtures("fresh_session")

from train_fixtures import REPO  # noqa: E402
LAST_BLOCK = "Transformer/encoderblock_1/"
LAST_KERNEL = LAST_BLOCK + "MlpBlock_3/Dense_1/kernel"


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def pixels(size=32):
    return np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype("float32")


def snapshot(model):
    """Every weight's dtype and bytes: equal snapshots are bit-identical weights (NaN too)."""
    return {variable.path: (str(variable.dtype), to_np(variable).tobytes())
            for variable in model.weights}


def other_weights(dtype=None):
    """`random_tiny_vit`'s architecture with other weights, so that an overwrite shows."""
    model = keras_vit.vit("Ti/16", **TINY_VIT, image_size=32, patch_size=8, num_classes=5,
                          dtype=dtype)
    randomise(model, seed=2)
    return model


def half_precision(arrays):
    """The arrays with the last block in bfloat16 and the rest of the blocks in float16."""
    return {key: value.astype(ml_dtypes.bfloat16) if key.startswith(LAST_BLOCK)
            else value.astype(np.float16) if key.startswith("Transformer/encoderblock_")
            else value for key, value in arrays.items()}


def as_float32(arrays):
    return {key: np.asarray(value, np.float32) for key, value in arrays.items()}


def write_npz_with_spec(model, arrays, path):
    """`arrays` as an .npz at `path` with `model`'s spec beside it (as save_npz writes it)."""
    checkpoint.save_npz(model, path)
    np.savez(path, **arrays)
    return str(path)


# ----------------------------------------------------------------------------------------------
# bfloat16 and float16 load
# ----------------------------------------------------------------------------------------------

def test_an_npz_of_bfloat16_and_float16_arrays_loads_with_equal_outputs(tmp_path):
    source = random_tiny_vit()
    halves = half_precision(checkpoint.model_arrays(source))
    path = write_npz_with_spec(source, halves, tmp_path / "half.npz")
    with np.load(path) as stored:
        assert stored[LAST_KERNEL].dtype == np.dtype("V2")  # what numpy reads bfloat16 as
    assert checkpoint.read_npz(path)[LAST_KERNEL].dtype == np.float32
    expected = other_weights()
    checkpoint.load_npz(expected, as_float32(halves))  # the same numbers, as float32
    model = other_weights()
    report = checkpoint.load_npz(model, path)
    assert LAST_KERNEL in report["loaded"]
    assert snapshot(model) == snapshot(expected)
    assert model.get_layer("encoderblock_1").weights[0].dtype == "float32"
    loaded = keras_vit.from_pretrained(path)
    np.testing.assert_array_equal(to_np(loaded(pixels())), to_np(expected(pixels())))


def test_bfloat16_arrays_given_as_a_dict_load(tmp_path):
    source = random_tiny_vit()
    halves = half_precision(checkpoint.model_arrays(source))
    model, expected = other_weights(), other_weights()
    checkpoint.load_npz(model, halves)  # ml_dtypes' bfloat16, as JAX's arrays convert
    checkpoint.load_npz(expected, as_float32(halves))
    assert snapshot(model) == snapshot(expected)


def test_a_bfloat16_model_loads_a_float32_file():
    source = random_tiny_vit()
    model = other_weights(dtype="bfloat16")
    checkpoint.load_npz(model, checkpoint.model_arrays(source))
    for loaded, original in zip(model.weights, source.weights):
        assert loaded.dtype == "bfloat16"
        np.testing.assert_array_equal(to_np(loaded).astype(np.float32),
                                      to_np(original).astype(ml_dtypes.bfloat16)
                                      .astype(np.float32))


def test_a_safetensors_directory_of_bfloat16_weights_loads_with_equal_outputs(tmp_path):
    from safetensors.numpy import load_file, save_file

    source = random_tiny_vit()
    keras_vit.save_pretrained(source, tmp_path / "saved", format="timm")
    weights = tmp_path / "saved" / "model.safetensors"
    state = {name: value.astype(ml_dtypes.bfloat16) for name, value in load_file(weights).items()}
    save_file(state, weights)
    expected = keras_vit.vit(source.spec)
    checkpoint.load_npz(expected, as_float32(torch_layouts.to_npz_arrays(
        as_float32(state), source.spec, "timm")))
    loaded = keras_vit.from_pretrained(str(tmp_path / "saved"))
    np.testing.assert_array_equal(to_np(loaded(pixels())), to_np(expected(pixels())))


# ----------------------------------------------------------------------------------------------
# A failed load changes nothing
# ----------------------------------------------------------------------------------------------

def _wrong_shape(arrays):
    arrays[LAST_KERNEL] = arrays[LAST_KERNEL][:-1]
    return LAST_KERNEL


def _strings(arrays):
    arrays[LAST_KERNEL] = np.full(arrays[LAST_KERNEL].shape, "0.5")
    return LAST_KERNEL


def _nan_in_bfloat16(arrays):
    arrays.update(half_precision(arrays))
    kernel = arrays[LAST_KERNEL].copy()
    kernel[0, 0] = np.nan
    arrays[LAST_KERNEL] = kernel
    return LAST_KERNEL


def _unknown_two_byte_struct(arrays):
    arrays[LAST_KERNEL] = np.zeros(arrays[LAST_KERNEL].shape, [("a", "u1"), ("b", "u1")])
    return LAST_KERNEL


BAD_FILES = {"wrong_shape": (_wrong_shape, "file (47, 24), model (48, 24)"),
             "strings": (_strings, "<U3"),
             "nan_in_bfloat16": (_nan_in_bfloat16, "NaN or infinite"),
             "struct": (_unknown_two_byte_struct, "not numbers")}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_file_with_one_bad_array_is_refused_and_changes_no_weight(tmp_path, case):
    spoil, words = BAD_FILES[case]
    source = random_tiny_vit()
    arrays = checkpoint.model_arrays(source)
    key = spoil(arrays)
    path = write_npz_with_spec(source, arrays, tmp_path / "bad.npz")
    model = other_weights()
    before = snapshot(model)
    for given in (path, arrays):
        with pytest.raises(CheckpointError) as error:
            checkpoint.load_npz(model, given)
        assert key in str(error.value) and words in str(error.value)
        assert "Nothing was loaded" in str(error.value)
        assert snapshot(model) == before
    with pytest.raises(CheckpointError, match=re.escape(words)):
        keras_vit.from_pretrained(path)


def test_object_arrays_given_as_a_dict_are_refused_and_change_no_weight():
    arrays = checkpoint.model_arrays(random_tiny_vit())
    arrays[LAST_KERNEL] = np.empty(arrays[LAST_KERNEL].shape, dtype=object)
    model = other_weights()
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=f"{LAST_KERNEL} \\(dtype object\\)"):
        checkpoint.load_npz(model, arrays)
    assert snapshot(model) == before


def test_values_beyond_the_models_dtype_are_refused_and_change_no_weight():
    arrays = checkpoint.model_arrays(random_tiny_vit())
    arrays[LAST_KERNEL] = arrays[LAST_KERNEL] * 1e6  # finite in float32, inf in float16
    model = other_weights(dtype="float16")
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=f"float16.*{LAST_KERNEL}"):
        checkpoint.load_npz(model, arrays)
    assert snapshot(model) == before
    checkpoint.load_npz(model, arrays, allow_nonfinite=True)  # what the flag is for


def test_a_bfloat16_safetensors_with_nan_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    keras_vit.save_pretrained(random_tiny_vit(), tmp_path / "saved", format="timm")
    weights = tmp_path / "saved" / "model.safetensors"
    state = {name: value.astype(ml_dtypes.bfloat16) for name, value in load_file(weights).items()}
    state["blocks.1.mlp.fc2.weight"][0, 0] = np.nan
    save_file(state, weights)
    with pytest.raises(CheckpointError, match="NaN or infinite.*encoderblock_1"):
        keras_vit.from_pretrained(str(tmp_path / "saved"))


# ----------------------------------------------------------------------------------------------
# A .keras file that is not a keras_vit model
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def cnn_file(tmp_path):
    cnn = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3)])
    path = str(tmp_path / "cnn.keras")
    cnn.save(path)
    return path


def test_a_keras_file_of_another_model_is_a_checkpoint_error(cnn_file):
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(cnn_file)
    message = str(error.value)
    assert cnn_file in message and "class Sequential" in message
    assert "not a keras_vit model" in message and "hf:" in message and ".npz" in message
    model = other_weights()
    before = snapshot(model)
    with pytest.raises(CheckpointError, match="class Sequential"):
        checkpoint.load_npz(model, cnn_file)
    assert snapshot(model) == before


def test_the_training_cli_names_a_keras_file_of_another_model(cnn_file, tmp_path):
    workdir = str(tmp_path / "run")
    result = subprocess.run(
        [sys.executable, "-m", "train.main", "--config=configs/quickstart.py",
         f"--config.pretrained={cnn_file}", f"--workdir={workdir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert len(errors) == 1 and cnn_file in errors[0] and "class Sequential" in errors[0]
    assert not os.path.exists(workdir)


# ----------------------------------------------------------------------------------------------
# What timm cannot express is refused before anything is written
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [{}, {"rope": "axial", "activation": "gelu"}],
                         ids=["vision_transformer", "eva"])
def test_timm_refuses_the_token_gap_classifier_and_writes_nothing(tmp_path, fields):
    model = random_tiny_vit(classifier="token_gap", **fields)
    with pytest.raises(torch_layouts.LayoutError, match="classifier='token_gap'"):
        keras_vit.save_pretrained(model, tmp_path / "out", format="timm")
    assert os.listdir(tmp_path) == []  # neither the directory nor a temporary one beside it

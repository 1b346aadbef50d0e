"""Every bad input to the Python API raises a clear TypeError, ValueError or CheckpointError
(naming the argument and the value) before any TensorFlow op runs; legitimate values such as
numpy integers and lists are accepted; and silent wrong answers are refused."""

import numpy as np
import pytest

import keras_vit
from keras_vit.weights import checkpoint, pretrained
from keras_vit.weights.checkpoint import CheckpointError

TINY = dict(image_size=32, patch_size=16, hidden_size=16, mlp_dim=32, num_heads=2,
            num_layers=1, num_classes=3)


def tiny(**kwargs):
    return keras_vit.vit("Ti/16", **{**TINY, **kwargs})


def message_of(info):
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# Builder arguments: (argument, bad value, exception, words the message must hold)

INT_ARGUMENTS = ["num_classes", "patch_size", "hidden_size", "mlp_dim", "num_heads",
                 "num_layers", "representation_size"]
BAD_INTS = [(224.0, TypeError, "224.0"), (True, TypeError, "True"), ("16", TypeError, "'16'"),
            (0, ValueError, "0"), (-4, ValueError, "-4"), (np.float32(16), TypeError, "16")]


@pytest.mark.parametrize("argument", INT_ARGUMENTS)
@pytest.mark.parametrize("bad,error,shown", BAD_INTS)
def test_integer_arguments_are_checked(argument, bad, error, shown):
    with pytest.raises(error) as info:
        tiny(**{argument: bad})
    text = message_of(info)
    assert argument in text and shown in text and "integer" in text, text


@pytest.mark.parametrize("bad,error,shown", [
    (224.0, TypeError, "224.0"), (np.float64(224), TypeError, "224"), (True, TypeError, "True"),
    ("224", TypeError, "'224'"), (None, TypeError, "None"), (0, ValueError, "0"),
    (-32, ValueError, "-32"), ((32,), ValueError, "(32,)"), ((32, 32, 3), ValueError, "3"),
    ((32.0, 32), TypeError, "32.0"), ([32, 0], ValueError, "0"), ({"h": 32}, ValueError, "h"),
])
def test_image_size_is_checked(bad, error, shown):
    with pytest.raises(error) as info:
        tiny(image_size=bad)
    text = message_of(info)
    assert "image_size" in text and shown in text and "positive integer" in text, text


@pytest.mark.parametrize("argument", ["dropout", "attention_dropout", "drop_path_rate"])
@pytest.mark.parametrize("bad,error,shown", [
    (1.0, ValueError, "1.0"), (-0.1, ValueError, "-0.1"), (1.5, ValueError, "1.5"),
    (float("nan"), ValueError, "nan"), ("0.1", TypeError, "'0.1'"), (True, TypeError, "True"),
])
def test_rates_are_checked(argument, bad, error, shown):
    with pytest.raises(error) as info:
        tiny(**{argument: bad})
    text = message_of(info)
    assert argument in text and shown in text and "[0, 1)" in text, text


@pytest.mark.parametrize("argument,bad,error,valid", [
    ("classifier", "mean", ValueError, "'gap'"),
    ("classifier", "Token", ValueError, "'token'"),
    ("classifier", 1, TypeError, "'gap'"),
    ("position_embedding", "sinusoidal", ValueError, "'learned_2d'"),
    ("position_embedding", 1, TypeError, "'none'"),
    ("include_top", "no", TypeError, "True or False"),
    ("approximate_gelu", 1, TypeError, "True or False"),  # older code's name, still read
    ("activation", "relu", ValueError, "'quick_gelu'"),
    ("name", 7, TypeError, "string"),
    ("dtype", "float33", ValueError, "mixed_bfloat16"),
    ("weights", 3, TypeError, "imagenet21k"),
])
def test_choices_are_checked(argument, bad, error, valid):
    with pytest.raises(error) as info:
        tiny(**{argument: bad})
    text = message_of(info)
    assert argument in text and repr(bad) in text and valid in text, text


@pytest.mark.parametrize("bad,error", [("B16", ValueError), ("b/16", ValueError),
                                       ("B/17", ValueError), (16, TypeError),
                                       (None, TypeError)])
def test_unknown_variant_names_the_value_and_lists_the_valid_names(bad, error):
    with pytest.raises(error) as info:
        keras_vit.vit(bad)
    text = message_of(info)
    assert repr(bad) in text and "variant" in text.lower(), text
    assert all(name in text for name in keras_vit.VARIANT_NAMES), text


def test_builder_refuses_positional_arguments():
    with pytest.raises(TypeError, match=r"ViT_Ti16\(\) takes 0 positional arguments"):
        keras_vit.ViT_Ti16(224)


def test_odd_hidden_size_with_learned_2d_is_refused_up_front():
    with pytest.raises(ValueError, match=r"learned_2d.*hidden_size=15"):
        tiny(hidden_size=15, num_heads=3, position_embedding="learned_2d")


def test_errors_are_raised_before_any_layer_is_built(monkeypatch):
    from keras_vit import layers as vit_layers

    def fail(*args, **kwargs):
        raise AssertionError("a layer was built before the arguments were checked")

    monkeypatch.setattr(vit_layers.PatchEmbed, "__init__", fail)
    with pytest.raises(TypeError, match="num_layers"):
        tiny(num_layers=1.0)


# ---------------------------------------------------------------------------------------------
# Legitimate values

@pytest.mark.parametrize("kwargs,grid", [
    (dict(image_size=np.int64(32)), (2, 2)),
    (dict(image_size=[32, 48]), (2, 3)),
    (dict(image_size=np.array([48, 32])), (3, 2)),
    (dict(image_size=(np.int32(32), 64)), (2, 4)),
    (dict(num_classes=np.int64(5), hidden_size=np.int32(16), num_heads=np.int64(2),
          num_layers=np.uint8(1), mlp_dim=np.int16(32), patch_size=np.int64(16),
          representation_size=np.int64(8), dropout=np.float32(0.1), drop_path_rate=0,
          include_top=np.bool_(True)), (2, 2)),
])
def test_numpy_scalars_and_lists_are_accepted(kwargs, grid):
    model = tiny(**kwargs)
    height, width = (16 * g for g in grid)
    assert tuple(model.input_shape) == (None, height, width, 3)
    out = model(np.zeros((2, height, width, 3), np.float32))
    assert out.shape[0] == 2
    layer = model.get_layer("embedding")
    assert type(layer.patch_size) is int and type(layer.hidden_size) is int
    model.get_config()  # serialisable: no numpy scalars left in the configs


# ---------------------------------------------------------------------------------------------
# Model inputs

@pytest.mark.parametrize("variant,kwargs", [
    ("Ti/16", TINY),
    ("R+Ti/16", dict(image_size=64, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1,
                     num_classes=3)),
])
def test_empty_batch_gives_an_empty_result(variant, kwargs):
    model = keras_vit.vit(variant, **kwargs)
    size = kwargs["image_size"]
    empty = np.zeros((0, size, size, 3), np.float32)
    assert tuple(model(empty).shape) == (0, 3)
    predicted = model.predict(empty, verbose=0)
    assert predicted.shape == (0, 3) and predicted.dtype == np.float32
    features = keras_vit.vit(variant, include_top=False, **kwargs)
    assert tuple(features(empty).shape) == (0, 16)


@pytest.mark.parametrize("dtype", ["uint8", "int32", "int64", "bool"])
@pytest.mark.parametrize("entry", ["call", "predict", "predict_on_batch", "attention"])
def test_integer_images_are_refused(dtype, entry):
    model = tiny()
    pixels = np.full((2, 32, 32, 3), 200).astype(dtype)
    run = {"call": model, "predict": lambda x: model.predict(x, verbose=0),
           "predict_on_batch": model.predict_on_batch,
           "attention": keras_vit.attention_model(model)}[entry]
    with pytest.raises(TypeError) as info:
        run(pixels)
    text = message_of(info)
    assert dtype in text and "[-1, 1]" in text, text
    if dtype != "bool":
        assert "keras_vit.preprocess_inputs" in text, text


def test_preprocessed_images_run():
    model = tiny()
    pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    assert model(keras_vit.preprocess_inputs(pixels)).shape == (2, 3)
    assert model(pixels.astype(np.float64) / 127.5 - 1).shape == (2, 3)


@pytest.mark.parametrize("variant,kwargs", [
    ("Ti/16", TINY),
    ("R+Ti/16", dict(image_size=64, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1,
                     num_classes=3)),
])
def test_nan_and_inf_images_give_nan_logits(variant, kwargs):
    model = keras_vit.vit(variant, **kwargs)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(1).normal(size=head.kernel.shape))
    size = kwargs["image_size"]
    images = np.random.default_rng(2).uniform(-1, 1, (4, size, size, 3)).astype(np.float32)
    images[0, 0, 0, 0] = np.nan
    images[1] = np.nan
    images[2, 3, 5, 1] = np.inf
    for logits in (model.predict(images, verbose=0), np.asarray(model(images))):
        assert np.isnan(logits[:3]).all(axis=1).tolist() == [True] * 3, logits
        assert np.isfinite(logits[3]).all(), logits


# ---------------------------------------------------------------------------------------------
# preprocess_inputs

@pytest.mark.parametrize("images,shown", [
    (np.array([[["a", "b", "c"]]]), "<U1"),
    (["jpeg bytes"], "<U10"),
    (np.zeros((2, 2, 3), bool), "bool"),
    (np.zeros((2, 2, 3), object), "object"),
    (np.zeros((2, 2, 3), np.complex64), "complex64"),
])
def test_preprocess_inputs_refuses_non_numeric_input(images, shown):
    with pytest.raises(TypeError) as info:
        keras_vit.preprocess_inputs(images)
    text = message_of(info)
    assert "dtype" in text and shown in text and "uint8" in text, text


def test_preprocess_inputs_refuses_string_tensors():
    import tensorflow as tf

    with pytest.raises(TypeError, match=r"dtype string.*decode"):
        keras_vit.preprocess_inputs(tf.constant(["not decoded"]))


def test_preprocess_inputs_accepts_lists_and_integers():
    out = keras_vit.preprocess_inputs([[[0, 255, 127.5]]])
    np.testing.assert_allclose(np.asarray(out), [[[-1.0, 1.0, 0.0]]])


# ---------------------------------------------------------------------------------------------
# Checkpoint files

@pytest.fixture
def saved(tmp_path):
    model = tiny()
    path = tmp_path / "tiny.npz"
    checkpoint.save_npz(model, path)
    return model, path


def test_weights_directory_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError) as info:
        tiny(weights=str(tmp_path))
    assert str(tmp_path) in message_of(info) and "directory" in message_of(info)
    with pytest.raises(CheckpointError, match="directory"):
        checkpoint.read_npz(tmp_path)


def test_gs_path_without_network_is_clear_and_fast():
    import time

    path = "gs://keras-vit-no-such-bucket/missing/ViT-B_16.npz"
    start = time.monotonic()
    with pytest.raises((CheckpointError, FileNotFoundError)) as info:
        tiny(weights=path)
    text = message_of(info)
    assert path in text, text
    if isinstance(info.value, CheckpointError):
        assert "could not be reached" in text, text
    assert time.monotonic() - start < 60


def test_unreachable_url_is_a_checkpoint_error(tmp_path):
    url = "https://keras-vit.invalid/ViT-B_16.npz"
    with pytest.raises(CheckpointError) as info:
        pretrained.resolve_weights(url, "Ti/16", cache_dir=str(tmp_path))
    assert url in message_of(info) and "could not be downloaded" in message_of(info)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_checkpoint_is_refused(saved, tmp_path, bad):
    model, path = saved
    arrays = checkpoint.read_npz(path)
    key = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"
    arrays[key] = arrays[key].copy()
    arrays[key][0, 0] = bad
    poisoned = tmp_path / "poisoned.npz"
    np.savez(poisoned, **arrays)
    target = tiny()
    before = [w.numpy().copy() for w in target.weights]
    with pytest.raises(CheckpointError) as info:
        checkpoint.load_npz(target, poisoned)
    text = message_of(info)
    assert key in text and "poisoned.npz" in text and "allow_nonfinite" in text, text
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, target.weights))
    with pytest.raises(CheckpointError, match="Dense_0/kernel"):
        tiny(weights=str(poisoned))
    with pytest.raises(CheckpointError, match="the arrays given"):
        checkpoint.load_npz(target, arrays)
    checkpoint.load_npz(target, poisoned, allow_nonfinite=True)
    assert not np.isfinite(target.get_layer("encoderblock_0").mlp.dense_0.kernel.numpy()).all()


def test_save_npz_into_a_missing_directory(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError) as info:
        checkpoint.save_npz(tiny(), missing / "model.npz")
    assert str(missing) in message_of(info) and "does not exist" in message_of(info)
    assert not (tmp_path / "no").exists()


def test_save_npz_under_a_regular_file(tmp_path):
    regular = tmp_path / "file.txt"
    regular.write_text("not a directory")
    with pytest.raises(NotADirectoryError) as info:
        checkpoint.save_npz(tiny(), regular / "model.npz")
    assert str(regular) in message_of(info)
    assert regular.read_text() == "not a directory"


def test_save_npz_onto_a_directory(tmp_path):
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        checkpoint.save_npz(tiny(), tmp_path)


@pytest.mark.parametrize("function", ["save", "read"])
def test_checkpoint_paths_of_the_wrong_type(function):
    with pytest.raises(TypeError, match=r"path.*42"):
        if function == "save":
            checkpoint.save_npz(tiny(), 42)
        else:
            checkpoint.read_npz(42)

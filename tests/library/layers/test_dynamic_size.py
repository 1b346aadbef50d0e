"""Any image size at call time, any patch size from trained weights, and the features of chosen
blocks (`keras_vit.layers.resample`, `dynamic_image_size`, `keras_vit.features`). Runs on every
Keras backend; the SavedModel tests need TensorFlow. The parity with timm's own resampling is in
tests/library/weights/test_timm_parity.py."""

import json

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.layers import resample
from keras_vit.weights import checkpoint
from model_fixtures import TINY_VIT, randomise

pytestmark = pytest.mark.usefixtures("fresh_session")

# Models whose weights are laid out on a grid in every way the package has: learned 1-D and 2-D
# embeddings (added once or before every block), relative logits, Axial-ViT, a hybrid, GAP.
CASES = {
    "vit": dict(variant="Ti/16"),
    "gap": dict(variant="Ti/16", classifier="gap"),
    "hybrid": dict(variant="R+Ti/16", patch_size=2),
    "learned_2d_every_layer": dict(variant="Ti/16", position_embedding="learned_2d",
                                   position_embedding_placement="every_layer"),
    "relative": dict(variant="Ti/16", position_embedding="relative"),
    "relative_2d": dict(variant="Ti/16", position_embedding="relative_2d"),
    "axial": dict(variant="Axial-Ti/16"),
    "bicubic": dict(variant="Ti/16", position_embedding_interpolation="bicubic"),
    "sincos_2d": dict(variant="Ti/16", position_embedding="sincos_2d"),
    "rope_axial": dict(variant="Ti/16", rope="axial", rope_reference_grid=(3, 5)),
    "rope_axial_normalized": dict(variant="Ti/16", rope="axial_normalized",
                                  position_embedding="none"),
    "rope_mixed": dict(variant="Ti/16", rope="mixed", num_register_tokens=1),
    "relative_mlp": dict(variant="Ti/16", position_embedding="relative_mlp",
                         relative_mlp_dim=8),
    "relative_mlp_shared": dict(variant="Ti/16", position_embedding="relative_mlp",
                                relative_mlp_dim=8, relative_mlp_shared=True),
}


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def tiny(variant="Ti/16", **fields):
    fields = {**TINY_VIT, "image_size": 64, "num_classes": 5, **fields}
    return keras_vit.vit(variant, **fields)


def pixels(height, width, batch=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, height, width, 3)).astype("float32")


def relative_error(actual, expected):
    return float(np.abs(to_np(actual) - expected).max() / np.abs(expected).max())


# --- Resize matrices ---------------------------------------------------------------------------

@pytest.mark.parametrize("interpolation", resample.INTERPOLATIONS)
def test_resize_matrix_is_the_identity_at_the_same_size_and_keeps_constants(interpolation):
    for size in (1, 3, 14):
        np.testing.assert_allclose(resample.resize_matrix(size, size, interpolation),
                                   np.eye(size), atol=1e-15)
    for old, new in ((4, 7), (7, 4), (14, 24), (24, 14), (2, 1), (1, 3)):
        matrix = resample.resize_matrix(old, new, interpolation)
        assert matrix.shape == (new, old)
        np.testing.assert_allclose(matrix.sum(axis=1), 1.0, atol=1e-12)  # constants stay


def test_bilinear_is_the_original_codes_zoom():
    """vit_jax's checkpoint.py resizes with scipy.ndimage.zoom(order=1)."""
    ndimage = pytest.importorskip("scipy.ndimage")
    grid = np.random.default_rng(1).normal(size=(5, 7, 3))
    resized = resample.resample_grid(grid, (9, 4))
    expected = ndimage.zoom(grid, (9 / 5, 4 / 7, 1), order=1)
    np.testing.assert_allclose(resized, expected, atol=1e-12)


@pytest.mark.parametrize("interpolation", resample.INTERPOLATIONS)
def test_the_call_time_matrices_equal_the_load_time_ones(interpolation):
    """keras.ops with sizes as tensors (a graph that learns them when it runs) = NumPy."""
    for old, new in ((4, 7), (7, 4), (3, 3), (14, 1)):
        in_graph = resample.resize_matrix(ops.convert_to_tensor(old), ops.convert_to_tensor(new),
                                          interpolation, xp=ops)
        np.testing.assert_allclose(to_np(in_graph), resample.resize_matrix(old, new,
                                                                           interpolation),
                                   atol=1e-6)


# --- Call-time size equals build-time size ------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_any_size_at_call_time_equals_a_model_built_at_that_size(case):
    fields = dict(CASES[case])
    variant = fields.pop("variant")
    dynamic = tiny(variant, dynamic_image_size=True, **fields)
    randomise(dynamic, scale=0.3)
    arrays = checkpoint.model_arrays(dynamic)
    stride = dynamic.spec.total_stride
    # The trained size, a larger and a smaller grid, and grids that are not square.
    for size in ((64, 64), (3 * stride, 2 * stride), (stride, 5 * stride), (96, 96)):
        built = tiny(variant, image_size=size, **fields)
        checkpoint.load_npz(built, arrays)  # today's load-time resize
        x = pixels(*size)
        expected = to_np(built(x))
        assert relative_error(dynamic(x), expected) < 1e-5, (case, size)


def test_the_trained_size_gives_exactly_the_fixed_models_outputs():
    dynamic = tiny(dynamic_image_size=True)
    randomise(dynamic)
    fixed = tiny()
    fixed.set_weights(dynamic.get_weights())
    x = pixels(64, 64)
    np.testing.assert_array_equal(to_np(dynamic(x)), to_np(fixed(x)))


def test_padding_takes_any_size_as_zeros_at_the_bottom_and_right():
    padded = tiny(dynamic_image_size=True, dynamic_image_pad=True)
    randomise(padded)
    x = pixels(50, 37)
    zeros = np.zeros((2, 64, 48, 3), "float32")
    zeros[:, :50, :37] = x
    np.testing.assert_allclose(to_np(padded(x)), to_np(padded(zeros)), rtol=1e-6, atol=1e-6)
    assert to_np(padded(pixels(9, 3))).shape == (2, 5)  # less than a patch: one padded patch


def test_a_dynamic_model_saves_and_loads_in_safe_mode(tmp_path):
    model = tiny(dynamic_image_size=True, position_embedding="relative_2d",
                 position_embedding_interpolation="bicubic")
    randomise(model)
    model.save(tmp_path / "dynamic.keras")
    loaded = keras.saving.load_model(tmp_path / "dynamic.keras", safe_mode=True)
    assert loaded.spec == model.spec
    x = pixels(48, 80)
    np.testing.assert_allclose(to_np(loaded(x)), to_np(model(x)), rtol=1e-6, atol=1e-6)


def test_it_compiles_for_each_static_size():
    """XLA (TPU's compiler) takes static shapes: one compilation per image size."""
    model = tiny(dynamic_image_size=True, position_embedding="relative")
    randomise(model)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf
        compiled = tf.function(lambda x: model(x, training=False), jit_compile=True)
    elif backend == "jax":
        import jax
        compiled = jax.jit(lambda x: model(x, training=False))
    else:
        pytest.skip(f"no XLA compilation on Keras' {backend} backend")
    for size in ((64, 64), (32, 96)):
        x = pixels(*size)
        np.testing.assert_allclose(to_np(compiled(x)), to_np(model(x)), rtol=1e-4, atol=1e-5)


# --- Bad input ------------------------------------------------------------------------------------

def test_sizes_a_model_cannot_cut_into_patches_are_refused_with_the_fix():
    model = tiny(dynamic_image_size=True)
    with pytest.raises(ValueError, match=r"multiples of 16 pixels .*got width 40 .* 32 or 48.*"
                                         r"dynamic_image_pad=True"):
        model(pixels(64, 40))
    with pytest.raises(ValueError, match=r"at least one patch, 16x16 pixels; got height 8"):
        model(pixels(8, 64))
    with pytest.raises(ValueError, match="dynamic_image_pad.*set dynamic_image_size=True"):
        keras_vit.ViTConfig(dynamic_image_pad=True)
    with pytest.raises(ValueError, match="position_embedding_interpolation"):
        keras_vit.ViTConfig(position_embedding_interpolation="nearest")


# --- Patch size from trained weights --------------------------------------------------------------

def test_the_pseudo_inverse_resize_keeps_the_tokens_of_resized_patches():
    """FlexiViT's property: <resize(x), w'> = <x, w> when the patch grows (resize injective)."""
    kernel = np.random.default_rng(2).normal(size=(8, 8, 3, 6))
    x = np.random.default_rng(3).normal(size=(8, 8, 3))
    tokens = np.einsum("hwc,hwcd->d", x, kernel)
    for new in (12, 16, 24):
        resize = resample.resize_matrix(8, new, "bicubic")
        bigger = np.einsum("ih,jw,hwc->ijc", resize, resize, x)
        new_kernel = resample.resize_patch_embedding(kernel, new)
        assert new_kernel.shape == (new, new, 3, 6)
        np.testing.assert_allclose(np.einsum("hwc,hwcd->d", bigger, new_kernel), tokens,
                                   rtol=1e-9, atol=1e-9)
        naive = resample.resize_patch_embedding(kernel, new, pseudo_inverse=False)
        assert not np.allclose(np.einsum("hwc,hwcd->d", bigger, naive), tokens, rtol=0.1)


def test_a_patch_size_other_than_the_checkpoints_is_resized_on_load(tmp_path, caplog):
    source = tiny(patch_size=16)
    randomise(source)
    checkpoint.save_npz(source, tmp_path / "p16.npz")
    with caplog.at_level("WARNING", logger="keras_vit.weights.checkpoint"):
        model = tiny(patch_size=8, weights=str(tmp_path / "p16.npz"))
    assert "from 16x16-pixel patches (the file's) to 8x8" in caplog.text
    kernel = to_np(model.get_layer("embedding").kernel)
    expected = resample.resize_patch_embedding(to_np(source.get_layer("embedding").kernel), 8)
    np.testing.assert_allclose(kernel, expected, rtol=1e-6, atol=1e-7)
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 65, 24)  # 8x8 grid
    with pytest.raises(ValueError, match="new_size must be a positive patch side"):
        resample.resize_patch_embedding(kernel, 0)


# --- Features for dense tasks ---------------------------------------------------------------------

def test_features_returns_the_blocks_tokens_and_maps_sharing_the_weights():
    model = tiny(num_layers=4, dynamic_image_size=True)
    randomise(model)
    x = pixels(48, 80)
    tokens = keras_vit.features(model, layers=(2, -1))
    maps = keras_vit.features(model, layers=(2, 4), output="maps")
    block_2, block_4 = (to_np(t) for t in tokens(x))
    map_2, map_4 = (to_np(m) for m in maps(x))
    assert block_2.shape == (2, 1 + 3 * 5, 24) and map_4.shape == (2, 3, 5, 24)
    np.testing.assert_array_equal(map_2, block_2[:, 1:].reshape(2, 3, 5, 24))
    # The last block's tokens, normalised, pooled and through the head, are the logits.
    normed = to_np(keras_vit.features(model, layers=4, norm=True)(x))
    head = model.get_layer("head")
    np.testing.assert_allclose(to_np(head(normed[:, 0])), to_np(model(x)), rtol=1e-5, atol=1e-6)
    # No copy of the weights: the same variables, and a change to the model shows.
    assert {id(v) for v in tokens.weights} <= {id(v) for v in model.weights}
    model.get_layer("encoderblock_1").mlp.dense_1.bias.assign(np.ones(24, "float32"))
    assert not np.allclose(to_np(tokens(x)[0]), block_2)


def test_features_attention_equals_attention_model_at_any_size():
    model = tiny(variant="Axial-Ti/16", num_layers=3, dynamic_image_size=True)
    randomise(model, scale=0.2)
    x = pixels(32, 96)
    outputs, weights = keras_vit.features(model, layers=(2,), attention=True)(x)
    every = keras_vit.attention_model(model)(x)
    assert len(weights) == 2 and to_np(outputs).shape == (2, 12, 24)  # rows, then columns
    for mine, theirs in zip(weights, every[2:4]):
        np.testing.assert_allclose(to_np(mine), to_np(theirs), rtol=1e-5, atol=1e-7)


def test_features_refuses_layers_that_are_not_there():
    model = tiny(num_layers=2)
    for bad in ((0,), (3,), (-3,), (1.5,), (), 1.0, "2", True):
        with pytest.raises(ValueError, match=r"layers .*1 to 2|layers is empty"):
            keras_vit.features(model, layers=bad)
    with pytest.raises(ValueError, match="output must be one of"):
        keras_vit.features(model, output="grid")


def test_attention_rollout_at_any_size():
    analysis = pytest.importorskip("keras_vit.analysis")
    model = tiny(dynamic_image_size=True)
    randomise(model, scale=0.1)
    rollout = analysis.attention_rollout(model, pixels(32, 80))
    assert rollout.shape == (2, 2, 5)
    np.testing.assert_allclose(rollout.sum(axis=(1, 2)), 1.0, atol=1e-6)


def test_resampling_stays_in_float32_under_mixed_precision():
    """The embeddings are float32 variables: resampled in float32, rounded once when added."""
    model = tiny(dynamic_image_size=True, dtype="mixed_bfloat16",
                 position_embedding_interpolation="bicubic")
    randomise(model)
    layer = model.get_layer("posembed_input")
    resampled = layer.embeddings((3, 5))
    assert keras.backend.standardize_dtype(resampled.dtype) == "float32"
    expected = resample.resize_position_embeddings(to_np(layer.pos_embedding), (3, 5),
                                                   interpolation="bicubic")
    np.testing.assert_allclose(to_np(resampled), expected, rtol=1e-5, atol=1e-6)
    built = tiny(dtype="mixed_bfloat16", image_size=(48, 80),
                 position_embedding_interpolation="bicubic")
    checkpoint.load_npz(built, checkpoint.model_arrays(model))
    x = pixels(48, 80)
    assert relative_error(model(x), to_np(built(x))) < 2e-2  # bfloat16's rounding


def test_an_empty_batch_gives_the_outputs_of_its_size():
    model = tiny(dynamic_image_size=True)
    maps = keras_vit.features(model, layers=(1, 2), output="maps")
    shapes = [tuple(to_np(m).shape) for m in maps(np.zeros((0, 32, 80, 3), "float32"))]
    assert shapes == [(0, 2, 5, 24)] * 2
    assert to_np(model(np.zeros((0, 32, 80, 3), "float32"))).shape == (0, 5)


def test_masked_patch_prediction_refuses_a_model_of_any_size():
    encoder = tiny(dynamic_image_size=True, include_top=False)
    with pytest.raises(ValueError, match="trains at one .*dynamic_image_size=False"):
        keras_vit.MaskedPatchPredictor(encoder)


def test_attention_distance_at_any_size():
    analysis = pytest.importorskip("keras_vit.analysis")
    model = tiny(dynamic_image_size=True)
    randomise(model, scale=0.1)
    wide = analysis.mean_attention_distance(model, pixels(32, 96))
    assert wide.shape == (2, 3) and np.all(wide > 0)
    # Patches 16 pixels apart: no distance exceeds the image's diagonal.
    assert np.all(wide <= np.hypot(16, 80))


# --- SavedModel -----------------------------------------------------------------------------------

SERVED_CASES = {
    "relative_2d": dict(position_embedding="relative_2d"),
    "hybrid_padded_bicubic": dict(variant="R+Ti/16", patch_size=2, dynamic_image_pad=True,
                                  position_embedding_interpolation="bicubic"),
    # Angles and offsets computed in the graph for sides known only when it runs.
    "relative_mlp": dict(position_embedding="relative_mlp", relative_mlp_dim=8),
    "relative_mlp_shared": dict(position_embedding="relative_mlp", relative_mlp_dim=8,
                                relative_mlp_shared=True),
    "rope_axial": dict(rope="axial", rope_reference_grid=(3, 3), rope_grid_offset=1.0),
    "rope_mixed": dict(rope="mixed", num_register_tokens=1),
}


@pytest.fixture(scope="module", params=list(SERVED_CASES))
def served_case(request):
    """The fields of a model of any size that `served` exports (a test may skip a case before
    paying for the export)."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the SavedModel export runs on Keras' TensorFlow backend")
    return SERVED_CASES[request.param]


@pytest.fixture(scope="module")
def served(served_case, tmp_path_factory):
    """The model of `served_case` and its SavedModel's signatures, exported once for the
    tests of that case."""
    import tensorflow as tf

    from keras_vit.deploy import export
    keras.utils.set_random_seed(0)  # module-scoped: fresh_session has not run for it
    model = tiny(dynamic_image_size=True, **served_case)
    randomise(model, scale=0.2)
    path = export.export_saved_model(model, tmp_path_factory.mktemp("served") / "served")
    with open(f"{path}/{export.SPEC_ASSET}") as handle:
        assert json.load(handle)["dynamic_image_size"] is True
    return model, tf.saved_model.load(path).signatures


def test_the_savedmodel_serves_any_size(served):
    from keras_vit.preprocessing import scale_pixels
    model, signatures = served
    for size in ((64, 64), (32, 112), (50, 37)):
        if size == (50, 37) and not model.spec.dynamic_image_pad:
            continue
        pixels_255 = np.random.default_rng(4).uniform(0, 255, (2,) + size + (3,))
        pixels_255 = pixels_255.astype("float32")
        logits = signatures["serving_images"](images=pixels_255)["logits"].numpy()
        expected = to_np(model(to_np(scale_pixels(pixels_255))))
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
    # Encoded images are resized to the size of the embeddings' grid, as for any model.
    import tensorflow as tf
    png = tf.io.encode_png(np.full((20, 30, 3), 200, np.uint8))
    assert signatures["serving_default"](image_bytes=tf.stack([png]))["logits"].shape == (1, 5)


def test_unknown_sides_that_are_not_patch_multiples_are_an_error_in_the_graph(served_case,
                                                                               request):
    """In a SavedModel, and in any tf.function of unknown height and width, the convolution
    would silently drop the pixels past the last whole patch."""
    # Skipped before the export is made (it is most of the test's time).
    if served_case.get("dynamic_image_pad"):
        pytest.skip("a padded model takes any size")
    if served_case.get("rope") or served_case.get("position_embedding") == "relative_mlp":
        pytest.skip("the check is the patch embedding's, the same whatever the positions")
    import tensorflow as tf
    model, signatures = request.getfixturevalue("served")
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiples of 16 pixels"):
        signatures["serving_images"](images=np.zeros((1, 64, 40, 3), "float32"))
    graph = tf.function(model, input_signature=[tf.TensorSpec([None, None, None, 3])])
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiples of 16 pixels"):
        graph(pixels(64, 40))
    np.testing.assert_allclose(graph(pixels(64, 48)).numpy(), to_np(model(pixels(64, 48))),
                               rtol=1e-5, atol=1e-6)


def test_the_tflite_copy_keeps_the_spec_of_a_model_of_any_size():
    """TFLite needs float32 layers: the copy of a mixed-precision model is a model of any size
    too, with its checks."""
    pytest.importorskip("tensorflow")
    from keras_vit.deploy import export
    model = tiny(dynamic_image_size=True, dtype="mixed_bfloat16")
    copy = export.float32_copy(model)
    assert copy is not model and copy.spec == model.spec
    with pytest.raises(ValueError, match="multiples of 16 pixels"):
        copy(pixels(64, 40))

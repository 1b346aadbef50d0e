"""The model builder `keras_vit.vit`: argument errors, shapes, .keras round trips, XLA, mixed
precision, attention outputs, preprocessing and a few training steps. All on tiny models."""

import zipfile

import keras
import numpy as np
import pytest

import keras_vit
from model_fixtures import TINY_VIT, randomise

pytestmark = pytest.mark.usefixtures("fresh_session")

TINY = dict(TINY_VIT, image_size=32, patch_size=8, num_classes=5)
# Stem-only hybrid: 7x7/2 conv + 3x3/2 pool (stride 4), then 8x8 patches -> 32 pixels per token.
TINY_HYBRID = dict(TINY_VIT, image_size=64, num_layers=1, num_classes=5)


def tiny(**kwargs):
    return keras_vit.vit("B/16", **{**TINY, **kwargs})


def to_np(x):
    return keras.ops.convert_to_numpy(x)


def images(batch=2, height=32, width=32, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.0, 1.0, size=(batch, height, width, channels)).astype("float32")


def tensorflow_backend():
    """TensorFlow, for the tests of TensorFlow-only paths (tf.function with XLA, tf.data,
    GradientTape); skips them on the other Keras backends, which CI runs this file on too."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip(f"needs the TensorFlow backend, not {keras.backend.backend()}")
    return pytest.importorskip("tensorflow")


def all_layers(model):
    return list(model._flatten_layers(include_self=False, recursive=True))


# ---------------------------------------------------------------------------------------------
# Clear errors


def test_image_size_not_divisible_by_patch_size():
    with pytest.raises(ValueError, match=r"225.*multiple of 16") as info:
        keras_vit.vit("B/16", image_size=225)
    assert "224" in str(info.value)  # the nearest valid size
    with pytest.raises(ValueError, match=r"width 225.*multiple of 16"):
        keras_vit.vit("B/16", image_size=(224, 225))
    # Hybrids: the ResNet's stride counts too (R50+B/16 has 16 pixels per token).
    with pytest.raises(ValueError, match="multiple of 32"):
        keras_vit.vit("R26+S/32", image_size=48)


def test_wrong_number_of_channels():
    model = tiny()
    with pytest.raises(ValueError, match="3 channels"):
        model(images(channels=1))
    with pytest.raises(ValueError, match="3 channels"):
        model.predict(images(channels=1), verbose=0)


def test_wrong_number_of_channels_hybrid():
    model = keras_vit.vit("R+Ti/16", **TINY_HYBRID)
    with pytest.raises(ValueError, match="3 channels"):
        model(images(height=64, width=64, channels=1))


def test_wrong_input_rank():
    model = tiny()
    with pytest.raises(ValueError) as info:
        model(images()[0])  # [32, 32, 3]: the batch axis is missing
    message = str(info.value)
    assert "(None, 32, 32, 3)" in message or "rank 4" in message, message


def test_wrong_image_size_for_built_model():
    model = tiny()
    with pytest.raises(ValueError) as info:
        model(images(height=48, width=48))
    message = str(info.value)
    assert "(None, 32, 32, 3)" in message or "32" in message, message


def test_unknown_variant_lists_valid_names():
    for bad in ("B/15", "X/16", "R50+B/32", "b16", ""):
        with pytest.raises(ValueError) as info:
            keras_vit.vit(bad)
        message = str(info.value)
        for name in keras_vit.VARIANT_NAMES:
            assert name in message, (bad, name, message)
    with pytest.raises(TypeError):
        keras_vit.vit(16)


def test_unknown_classifier():
    with pytest.raises(ValueError, match=r"classifier='mean': must be one of "
                                         r"\('token', 'gap', 'map', 'token_gap'\)"):
        tiny(classifier="mean")


def test_hidden_size_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"768.*num_heads.*5|num_heads.*5.*768") as info:
        keras_vit.vit("B/16", num_heads=5)
    assert "divisors of 768" in str(info.value)


def test_other_argument_errors():
    with pytest.raises(ValueError, match="position_embedding"):
        tiny(position_embedding="sinusoidal")
    with pytest.raises(TypeError, match="patch_size"):
        tiny(patch_sise=8)
    with pytest.raises(ValueError, match="image_size"):
        keras_vit.vit("B/16", image_size=(224, 224, 3))
    with pytest.raises(ValueError, match="num_layers=0: must be a positive integer"):
        tiny(num_layers=0)


# ---------------------------------------------------------------------------------------------
# Shapes and structure


def test_tiny_model_shapes_and_names():
    model = tiny()
    assert model.name == "vit_b16"
    assert model.input_shape == (None, 32, 32, 3)
    assert model.output_shape == (None, 5)
    assert tuple(model.get_layer("posembed_input").pos_embedding.shape) == (1, 17, 24)
    head = model.get_layer("head")
    np.testing.assert_array_equal(to_np(head.kernel), 0.0)
    np.testing.assert_array_equal(to_np(head.bias), 0.0)
    np.testing.assert_array_equal(to_np(model.get_layer("cls").cls), 0.0)
    out = to_np(model(images(batch=3)))
    assert out.shape == (3, 5)
    np.testing.assert_array_equal(out, 0.0)  # zero-initialised head


def test_non_square_images():
    model = tiny(image_size=(32, 48))
    assert model.input_shape == (None, 32, 48, 3)
    assert tuple(model.get_layer("posembed_input").pos_embedding.shape) == (1, 1 + 4 * 6, 24)
    randomise(model, scale=0.2)
    out = to_np(model(images(height=32, width=48)))
    assert out.shape == (2, 5) and np.all(np.isfinite(out))
    model_2d = tiny(image_size=(32, 48), position_embedding="learned_2d")
    posembed = model_2d.get_layer("posembed_input")
    assert posembed.grid_size == (4, 6)
    assert tuple(posembed.row_embedding.shape) == (4, 12)
    assert tuple(posembed.column_embedding.shape) == (6, 12)
    assert to_np(model_2d(images(height=32, width=48))).shape == (2, 5)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_include_top_false_returns_pooled_features(classifier):
    model = tiny(include_top=False, classifier=classifier)
    assert model.output_shape == (None, 24)
    randomise(model, scale=0.2)
    x = images(batch=3)
    features = to_np(model(x))
    assert features.shape == (3, 24)
    # The pooled representation is the encoder_norm output at the class token / token mean.
    tokens = keras.Model(model.input, model.get_layer("encoder_norm").output)(x)
    tokens = to_np(tokens)
    expected = tokens[:, 0] if classifier == "token" else tokens.mean(axis=1)
    np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-5)
    assert "head" not in [layer.name for layer in model.layers]


def test_representation_size_adds_tanh_pre_logits():
    model = tiny(representation_size=16)
    pre_logits = model.get_layer("pre_logits")
    assert pre_logits.units == 16 and pre_logits.activation is keras.activations.tanh
    assert model.get_layer("head").kernel.shape == (16, 5)
    assert tiny(representation_size=16, include_top=False).output_shape == (None, 16)


def test_gap_classifier_has_no_class_token():
    model = tiny(classifier="gap")
    assert "cls" not in [layer.name for layer in model.layers]
    assert tuple(model.get_layer("posembed_input").pos_embedding.shape) == (1, 16, 24)


def test_drop_path_rate_rises_linearly_and_dropout_is_passed():
    model = tiny(num_layers=3, drop_path_rate=0.2, dropout=0.1, attention_dropout=0.05)
    blocks = [model.get_layer(f"encoderblock_{i}") for i in range(3)]
    np.testing.assert_allclose([b.drop_path_rate for b in blocks], [0.0, 0.1, 0.2])
    assert all(b.dropout == 0.1 and b.attention_dropout == 0.05 for b in blocks)
    assert model.get_layer("dropout").rate == 0.1
    # The upstream dropout is the default: 0.1 for L/16 and H/14, 0 otherwise.
    small = dict(image_size=16, hidden_size=8, mlp_dim=8, num_heads=2, num_layers=1)
    assert keras_vit.vit("L/16", **small).get_layer("dropout").rate == 0.1
    assert keras_vit.vit("L/32", image_size=32, **{k: v for k, v in small.items()
                                                  if k != "image_size"}
                         ).get_layer("dropout").rate == 0.0


def _assert_no_lambda(model):
    # Walk every layer, nested ones included (the saved config is checked in the round trips).
    found = all_layers(model)
    assert len(found) > len(model.layers)  # the walk does reach the sub-layers
    assert not [l.name for l in found if isinstance(l, keras.layers.Lambda)]


@pytest.mark.parametrize("kwargs", [{}, {"classifier": "gap", "position_embedding": "learned_2d",
                                        "representation_size": 8}], ids=["token", "gap_2d"])
def test_no_lambda_layers(kwargs):
    _assert_no_lambda(tiny(**kwargs))


def test_no_lambda_layers_hybrid():
    _assert_no_lambda(keras_vit.vit("R26+S/32", image_size=32, hidden_size=24, mlp_dim=48,
                                    num_heads=3, num_layers=1, num_classes=5))


# ---------------------------------------------------------------------------------------------
# Saving


ROUND_TRIP_CASES = {
    "vit_token": lambda: tiny(),
    "vit_distillation_token": lambda: tiny(distillation_token=True),  # DeiT's two heads
    "vit_swiglu_map": lambda: tiny(activation="swiglu", classifier="map"),  # gated MLPs
    "vit_gap_learned_2d": lambda: tiny(classifier="gap", position_embedding="learned_2d",
                                       representation_size=8),
    "hybrid_stem_token": lambda: keras_vit.vit("R+Ti/16", **TINY_HYBRID),
    # R26: four ResNet stages of bottleneck units (~14M parameters, all in the ResNet).
    "hybrid_r26_gap": lambda: keras_vit.vit("R26+S/32", image_size=64, hidden_size=24,
                                            mlp_dim=48, num_heads=3, num_layers=1,
                                            num_classes=5, classifier="gap"),
}


@pytest.mark.parametrize("case", list(ROUND_TRIP_CASES))
def test_keras_round_trip_safe_mode(case, tmp_path):
    model = ROUND_TRIP_CASES[case]()
    randomise(model, scale=0.1)
    size = model.input_shape[1:3]
    x = images(height=size[0], width=size[1])
    expected = to_np(model(x))
    assert np.abs(expected).max() > 1e-3
    path = tmp_path / "m.keras"
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        assert "Lambda" not in archive.read("config.json").decode()
    loaded = keras.models.load_model(path, safe_mode=True)
    assert [l.name for l in loaded.layers] == [l.name for l in model.layers]
    assert [type(l) for l in loaded.layers] == [type(l) for l in model.layers]
    np.testing.assert_allclose(to_np(loaded(x)), expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# XLA and mixed precision


@pytest.mark.parametrize("hybrid", [False, True], ids=["vit", "hybrid"])
def test_forward_pass_compiles_with_xla(hybrid):
    tf = tensorflow_backend()
    model = keras_vit.vit("R+Ti/16", **TINY_HYBRID) if hybrid else tiny()
    randomise(model, scale=0.2)
    size = model.input_shape[1:3]
    x = images(batch=3, height=size[0], width=size[1])
    expected = to_np(model(x, training=False))
    forward = tf.function(lambda t: model(t, training=False), jit_compile=True)
    got = to_np(forward(tf.constant(x)))
    assert np.abs(expected).max() > 1e-2
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # It really went through XLA: the compiler IR of the compiled function exists.
    assert "HloModule" in forward.experimental_get_compiler_ir(tf.constant(x))(stage="hlo")


def test_compile_with_jit_compile_and_predict():
    model = tiny()
    randomise(model, scale=0.2)
    x = images(batch=4)
    expected = to_np(model(x))
    model.compile(jit_compile=True)
    got = model.predict(x, batch_size=4, verbose=0)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_mixed_bfloat16_runs_with_float32_outputs():
    reference = tiny()
    randomise(reference, scale=0.1)
    mixed = tiny(dtype="mixed_bfloat16")
    block = mixed.get_layer("encoderblock_0")
    assert block.compute_dtype == "bfloat16" and block.variable_dtype == "float32"
    assert all(w.dtype == "float32" for w in mixed.weights)
    mixed.set_weights(reference.get_weights())
    x = images(batch=4)
    expected = to_np(reference(x))
    out = mixed(x)
    assert out.dtype == "float32"
    out = to_np(out)
    assert out.shape == (4, 5) and np.all(np.isfinite(out))
    scale = np.abs(expected).max()
    assert scale > 1e-2
    np.testing.assert_allclose(out, expected, atol=0.05 * scale + 1e-3)
    # The global policy is untouched.
    assert keras.config.dtype_policy().name == "float32"
    # include_top=False features are float32 too.
    features = tiny(dtype="mixed_bfloat16", include_top=False)(x)
    assert features.dtype == "float32"


# Sapiens2's options: RMSNorms, normed queries and keys, grouped-query attention per block.
SAPIENS2_LIKE = dict(norm_layer="rms_norm", qk_norm=True, num_kv_heads=(2, 1, 4), num_heads=4,
                     hidden_size=32, mlp_dim=48,
                     num_layers=3, rope="axial_normalized", num_register_tokens=2)
# AIMv2's: a norm of the patch tokens, no biases in the blocks, attention pooling without MLP.
AIMV2_LIKE = dict(norm_layer="rms_norm", activation="swiglu", patch_norm=True, qkv_bias=False,
                  proj_bias=False, classifier="map", map_mlp_dim=0, hidden_size=32, mlp_dim=48,
                  num_heads=4, num_layers=2)
# timm's vit_srelpos_*: one relative-position MLP whose logits every block adds.
SRELPOS_LIKE = dict(position_embedding="relative_mlp", relative_mlp_shared=True,
                    relative_mlp_dim=16, classifier="gap", layer_scale_init=0.1, qkv_bias=False)
# MobileCLIP's: convolutions with BatchNorm (in training, the batch's statistics) and GELU
# before the patch embedding.
MOBILECLIP_LIKE = dict(conv_stem=True, prefix_position_embeddings=False, hidden_size=32,
                       mlp_dim=48, num_heads=4, num_layers=2)
# timm's DiffParallelScalingBlock (its vit_dpwee's): differential attention with normed
# queries and keys beside the MLP, LayerScale.
DIFFERENTIAL_PARALLEL_LIKE = dict(attention_layer="differential", parallel_blocks=True,
                                  qk_norm=True, layer_scale_init=0.5, hidden_size=32, num_heads=4,
                                  num_register_tokens=1)
LATER_OPTIONS = {"sapiens2": SAPIENS2_LIKE, "aimv2": AIMV2_LIKE, "srelpos": SRELPOS_LIKE,
                 "mobileclip": MOBILECLIP_LIKE, "differential_parallel": DIFFERENTIAL_PARALLEL_LIKE}
# In training also differential attention in plain blocks.
TRAINED_OPTIONS = {**LATER_OPTIONS, "differential": dict(attention_layer="differential",
                                                         hidden_size=32, num_heads=2)}


@pytest.mark.parametrize("options", LATER_OPTIONS.values(), ids=LATER_OPTIONS.keys())
def test_later_options_compile_with_xla_and_run_in_bfloat16(options):
    tf = tensorflow_backend()
    model = tiny(**options)
    randomise(model, scale=0.3)
    x = images(batch=3)
    expected = to_np(model(x, training=False))
    assert np.abs(expected).max() > 1e-2
    forward = tf.function(lambda t: model(t, training=False), jit_compile=True)
    np.testing.assert_allclose(to_np(forward(tf.constant(x))), expected, rtol=1e-4, atol=1e-4)
    assert "HloModule" in forward.experimental_get_compiler_ir(tf.constant(x))(stage="hlo")
    mixed = tiny(dtype="mixed_bfloat16", **options)
    mixed.set_weights(model.get_weights())
    out = mixed(x)
    assert out.dtype == "float32"
    scale = np.abs(expected).max()
    np.testing.assert_allclose(to_np(out), expected, atol=0.05 * scale + 1e-3)


@pytest.mark.parametrize("options", TRAINED_OPTIONS.values(), ids=TRAINED_OPTIONS.keys())
def test_later_options_train_with_remat_to_the_same_gradients(options):
    """Remat computes the blocks again in the backward pass: the same loss and gradients."""
    x = images(batch=2)
    grads = []
    for remat in ("none", "blocks"):
        model = tiny(remat=remat, **options)
        randomise(model, scale=0.3)
        grads.append(_gradients(model, x))
    for plain, rematerialised in zip(*grads):
        np.testing.assert_allclose(rematerialised, plain, rtol=1e-4, atol=1e-5)


def _gradients(model, x):
    """The gradients of the logits' sum of squares on every backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x, training=True)))
        return [to_np(g) for g in tape.gradient(loss, model.trainable_variables)]
    if backend == "jax":
        import jax

        def loss(trainable):
            logits, _ = model.stateless_call(trainable, [v.value for v in
                                                         model.non_trainable_variables],
                                             x, training=True)
            return (logits ** 2).sum()
        return [np.asarray(g) for g in
                jax.grad(loss)([v.value for v in model.trainable_variables])]
    loss = (model(x, training=True) ** 2).sum()  # torch
    loss.backward()
    return [v.value.grad.cpu().numpy() for v in model.trainable_variables]


# ---------------------------------------------------------------------------------------------
# Attention maps


def test_attention_model():
    model = tiny(num_layers=3)
    randomise(model, scale=0.2)
    x = images(batch=2)
    before = to_np(model(x))
    attention = keras_vit.attention_model(model)
    maps = attention(x)
    assert isinstance(maps, (list, tuple)) and len(maps) == 3
    for scores in maps:
        scores = to_np(scores)
        assert scores.shape == (2, 3, 17, 17)  # [batch, heads, tokens, tokens]
        np.testing.assert_allclose(scores.sum(axis=-1), 1.0, atol=1e-5)
    # It shares the weights: block 0's maps are those of the layer on the embedded tokens.
    embedded = keras.Model(model.input, model.get_layer("dropout").output)(x)
    _, scores_0 = model.get_layer("encoderblock_0")(embedded, return_attention_scores=True)
    np.testing.assert_allclose(to_np(maps[0]), to_np(scores_0), rtol=1e-5, atol=1e-6)
    # The default model is unchanged: one output, the same logits.
    assert len(model.outputs) == 1
    np.testing.assert_array_equal(to_np(model(x)), before)


# ---------------------------------------------------------------------------------------------
# Preprocessing


def test_preprocess_inputs_eager_uint8():
    pixels = np.array([[[[0, 255, 127]]]], dtype="uint8")  # [1, 1, 1, 3]
    out = keras_vit.preprocess_inputs(pixels)
    assert out.dtype == "float32"
    np.testing.assert_allclose(to_np(out), [[[[-1.0, 1.0, -0.5 / 127.5]]]], atol=1e-7)
    batch = np.random.default_rng(0).integers(0, 256, size=(2, 8, 8, 3), dtype="uint8")
    out = to_np(keras_vit.preprocess_inputs(batch))
    np.testing.assert_allclose(out, (batch.astype("float32") - 127.5) / 127.5, atol=1e-6)
    assert out.min() >= -1.0 and out.max() <= 1.0
    single = to_np(keras_vit.preprocess_inputs(batch[0]))  # [height, width, 3]
    np.testing.assert_allclose(single, out[0])
    floats = to_np(keras_vit.preprocess_inputs(np.full((4, 4, 3), 255.0, "float32")))
    np.testing.assert_allclose(floats, 1.0)


def test_preprocess_inputs_in_tf_data():
    tf = tensorflow_backend()
    pixels = np.random.default_rng(0).integers(0, 256, size=(6, 8, 8, 3), dtype="uint8")
    pixels[0] = 0
    pixels[1] = 255
    dataset = tf.data.Dataset.from_tensor_slices(pixels).map(keras_vit.preprocess_inputs)
    assert dataset.element_spec.dtype == tf.float32
    assert tuple(dataset.element_spec.shape) == (8, 8, 3)
    out = np.stack([e.numpy() for e in dataset])
    np.testing.assert_allclose(out, (pixels.astype("float32") - 127.5) / 127.5, atol=1e-6)
    np.testing.assert_array_equal(out[0], -1.0)
    np.testing.assert_array_equal(out[1], 1.0)
    batched = tf.data.Dataset.from_tensor_slices(pixels).batch(3).map(keras_vit.preprocess_inputs)
    np.testing.assert_allclose(np.concatenate([e.numpy() for e in batched]), out)


@pytest.mark.parametrize("shape", [(8, 8), (8, 8, 1), (2, 8, 8, 4), (1, 2, 8, 8, 3), (8,)])
def test_preprocess_inputs_rejects_wrong_shapes(shape):
    with pytest.raises(ValueError, match=r"\[batch, height, width, 3\]"):
        keras_vit.preprocess_inputs(np.zeros(shape, "uint8"))


# ---------------------------------------------------------------------------------------------
# Training


def test_training_steps_change_weights_and_reduce_loss():
    model = tiny(dropout=0.1, attention_dropout=0.1, drop_path_rate=0.1, num_classes=3)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(16, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 3, size=(16,))
    initial = [to_np(w).copy() for w in model.trainable_weights]
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=8, epochs=8, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert np.isclose(losses[0], np.log(3.0), atol=0.1)  # zero head: uniform predictions
    assert losses[-1] < losses[0] - 0.05, losses
    unchanged = [w.path for w, before in zip(model.trainable_weights, initial)
                 if np.array_equal(to_np(w), before)]
    assert not unchanged, f"weights that training did not change: {unchanged}"
    # Dropout and drop path are active in training: two training-mode passes differ.
    first = to_np(model(x[:4], training=True))
    second = to_np(model(x[:4], training=True))
    assert not np.allclose(first, second)
    np.testing.assert_array_equal(to_np(model(x[:4])), to_np(model(x[:4])))


def test_gradient_tape_step_hybrid():
    tf = tensorflow_backend()
    model = keras_vit.vit("R+Ti/16", **TINY_HYBRID)
    randomise(model, scale=0.1)
    x = images(batch=4, height=64, width=64)
    y = np.array([0, 1, 2, 3])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(0.05)
    losses = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_weights)
        assert all(g is not None for g in gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_weights))
        losses.append(float(loss))
    assert losses[-1] < losses[0], losses

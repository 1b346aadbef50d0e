"""Fused attention (`attention_impl`, keras.ops.dot_product_attention) against the explicit
ops: the same logits and gradients for every architecture, at two grid sizes, on whichever
Keras backend runs the tests (CI runs this file on TensorFlow, JAX and PyTorch); the weights,
when asked for, from the explicit path."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers import attention
from keras_vit.layers.attention import _fused
from model_fixtures import TINY_VIT, randomise

pytestmark = pytest.mark.usefixtures("fresh_session")

BASE = dict(variant="Ti/16", image_size=32, patch_size=8, num_classes=5, **TINY_VIT)
ARCHITECTURES = {
    "learned": {},
    "learned_2d": dict(position_embedding="learned_2d"),
    "none": dict(position_embedding="none"),
    "sincos_2d": dict(position_embedding="sincos_2d"),
    "rope_normalized_registers": dict(rope="axial_normalized", num_register_tokens=2),
    "rope_mixed": dict(rope="mixed", position_embedding="none"),
    "relative_mlp": dict(position_embedding="relative_mlp", relative_mlp_dim=16),
    "relative_mlp_shared": dict(position_embedding="relative_mlp", relative_mlp_dim=16,
                                relative_mlp_shared=True),
    "inner_norms_rope_offset": dict(mlp_inner_norm=True, attention_inner_norm=True,
                                    rope="axial", rope_grid_offset=1.0),
    "relative": dict(position_embedding="relative"),
    "relative_2d": dict(position_embedding="relative_2d", classifier="gap"),
    "every_layer": dict(position_embedding_placement="every_layer"),
    "axial": dict(variant="Axial-Ti/16"),
    "registers_map": dict(num_register_tokens=2, classifier="map"),
    "any_size_relative": dict(position_embedding="relative", dynamic_image_size=True),
}


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def relative_error(got, expected, floor=1e-12):
    """The largest difference relative to the largest expected value (at least `floor`)."""
    return float(np.max(np.abs(to_np(got) - to_np(expected))) /
                 max(np.max(np.abs(to_np(expected))), floor))


def pair(fields, dtype=None):
    """The same weights behind explicit and fused attention."""
    explicit = keras_vit.vit(keras_vit.ViTConfig(**{**BASE, **fields}), dtype=dtype,
                             attention_impl="explicit")
    randomise(explicit, scale=0.3)
    fused = keras_vit.vit(explicit.spec, dtype=dtype, attention_impl="fused")
    fused.set_weights(explicit.get_weights())
    return explicit, fused


def images(size=32, batch=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, size, size, 3)).astype("float32")


def gradients(model, x, training=False):
    """The gradients of the summed squared logits with respect to every trainable weight."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x, training=training)))
        return tape.gradient(loss, model.trainable_variables)
    if backend == "jax":
        import jax

        non_trainable = [v.value for v in model.non_trainable_variables]

        def loss(trainable):
            logits, _ = model.stateless_call(trainable, non_trainable, x, training=training)
            return jax.numpy.sum(jax.numpy.square(logits))

        return jax.grad(loss)([v.value for v in model.trainable_variables])
    if backend == "torch":
        for variable in model.trainable_variables:
            variable.value.grad = None
        (model(x, training=training) ** 2).sum().backward()
        return [variable.value.grad for variable in model.trainable_variables]
    pytest.skip(f"no gradients on the {backend} backend")


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_fused_equals_explicit_logits_and_gradients(name):
    explicit, fused = pair(ARCHITECTURES[name])
    sizes = (32, 48) if explicit.spec.dynamic_image_size else (32,)
    for size in sizes:  # a model of any size: the trained grid and a larger one
        x = images(size)
        assert relative_error(fused(x), explicit(x)) < 1e-5, (name, size)
        expected = [to_np(g) for g in gradients(explicit, x)]
        # Gradients that are zero in exact arithmetic (the keys' bias: a softmax ignores what
        # it adds to every logit of a row) are rounding noise, measured against the largest.
        floor = 1e-2 * max(np.max(np.abs(g)) for g in expected)
        for got, wanted, variable in zip(gradients(fused, x), expected,
                                         explicit.trainable_variables):
            assert relative_error(got, wanted, floor) < 1e-5, (name, size, variable.path)


def test_odd_token_counts_train_padded_where_the_kernel_refuses_them(monkeypatch):
    """Where the fused kernel trains only even lengths (cuDNN's on JAX's GPUs), the 17 tokens
    of this model are padded with one that no query sees: the same logits and gradients."""
    explicit, fused = pair({})
    monkeypatch.setattr(attention, "odd_lengths_refused", lambda: True)
    padded = []
    pad = attention._padded_to_even  # the original, which the stand-in counts and calls
    monkeypatch.setattr(attention, "_padded_to_even", lambda *qkv: padded.append(1) or pad(*qkv))
    x = images()
    assert relative_error(fused(x, training=True), explicit(x, training=True)) < 1e-5
    assert padded, "the padded kernel was not used"
    expected = [to_np(g) for g in gradients(explicit, x, training=True)]
    floor = 1e-2 * max(np.max(np.abs(g)) for g in expected)
    for got, wanted in zip(gradients(fused, x, training=True), expected):
        assert relative_error(got, wanted, floor) < 1e-5


def test_fused_in_bfloat16_is_explicit_within_its_rounding():
    explicit, fused = pair(dict(position_embedding="relative"), dtype="mixed_bfloat16")
    x = images()
    # bfloat16 keeps 8 bits of mantissa (relative steps of 2**-8); the fused kernel sums the
    # logits and the softmax in float32 where the explicit ops round them to bfloat16.
    assert relative_error(fused(x), explicit(x)) < 2**-5


def test_the_weights_asked_for_come_from_the_explicit_path():
    explicit, fused = pair(dict(position_embedding="relative"))
    x = images()
    got = keras_vit.attention_model(fused)(x)
    expected = keras_vit.attention_model(explicit)(x)
    assert len(got) == explicit.spec.num_layers
    for weights, reference in zip(got, expected):
        np.testing.assert_allclose(to_np(weights), to_np(reference), atol=1e-6)
        np.testing.assert_allclose(to_np(keras.ops.sum(weights, axis=-1)), 1.0, atol=1e-5)


def test_auto_is_fused_on_torch_and_jax_accelerators_and_never_with_dropout_in_training():
    backend = keras.backend.backend()
    on_cpu = backend != "jax" or __import__("jax").devices()[0].platform == "cpu"
    fused_here = backend == "torch" or (backend == "jax" and not on_cpu)
    assert _fused("auto", 0.0, True, False) == fused_here
    assert not _fused("auto", 0.1, True, False)  # dropout on the weights needs them
    assert _fused("auto", 0.1, False, False) == fused_here
    assert _fused("fused", 0.0, True, False) and not _fused("fused", 0.0, False, True)
    assert not _fused("explicit", 0.0, False, False)


def test_fused_with_attention_dropout_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="attention_impl='auto'"):
        keras_vit.vit("Ti/16", **TINY_VIT, attention_dropout=0.1, attention_impl="fused")
    model = keras_vit.vit("Ti/16", **TINY_VIT, attention_dropout=0.1)
    with pytest.raises(ValueError, match="attention_impl='auto'"):
        keras_vit.set_execution(model, attention_impl="fused")
    assert model.execution.attention_impl == "auto"  # unchanged
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        keras_vit.vit("Ti/16", **TINY_VIT, attention_impl="flash")


def test_the_attention_kernel_is_chosen_on_a_built_model_and_left_out_of_its_files(tmp_path):
    """`set_execution` changes how every attention of a built model runs (its outputs the
    same); the choice is no spec field and not in the model's `.keras` file."""
    explicit, _ = pair({"classifier": "map"})
    x = images()
    expected = to_np(explicit(x))
    keras_vit.set_execution(explicit, attention_impl="fused")
    impls = {layer.attention_impl for layer in explicit._flatten_layers()
             if hasattr(layer, "attention_impl")}
    assert impls == {"fused"}
    assert relative_error(explicit(x), expected) < 1e-5
    explicit.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    assert {layer.attention_impl for layer in loaded._flatten_layers()
            if hasattr(layer, "attention_impl")} == {"auto"}
    with pytest.raises(TypeError, match="keras_vit.set_execution"):
        keras_vit.ViTConfig.from_variant("S/16", attention_impl="fused")
    assert "attention_impl" not in keras_vit.ViTConfig().to_dict()


def test_masked_attention_normalising_after_the_sum_is_the_softmax_and_its_gradient():
    """Masked attention (NaFlex's padding and packing) divides the weighted sum by the weights'
    sum instead of normalising every weight: softmax(logits) @ values within float32 rounding,
    gradients too, a fully masked query (padding) the mean of the values as before."""
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(2, 3, 6, 6)).astype("float32")
    values = rng.normal(size=(2, 3, 6, 4)).astype("float32")
    mask = rng.uniform(size=(2, 1, 6, 6)) < 0.6
    mask[..., 0] = True  # every query but one sees a key
    mask[1, :, 4] = False
    masked = attention.masked_logits(keras.ops.convert_to_tensor(logits), mask)

    def outputs(form, logits, values):
        if form == "softmax":
            return keras.ops.matmul(keras.ops.softmax(logits, axis=-1), values)
        return attention.weighted_then_normalised(logits, values)

    assert relative_error(outputs("after", masked, values),
                          outputs("softmax", masked, values)) < 1e-6
    padding = to_np(outputs("after", masked, values))[1, :, 4]
    np.testing.assert_allclose(padding, values[1].mean(axis=1), rtol=1e-5, atol=1e-6)
    gradients = {"jax": _jax_gradients, "tensorflow": _tf_gradients}.get(keras.backend.backend())
    if gradients is not None:
        for got, expected in zip(*(gradients(lambda x, v, form=form: outputs(form, x, v),
                                             masked, values) for form in ("after", "softmax"))):
            assert relative_error(got, expected) < 1e-5


def _jax_gradients(function, *inputs):
    import jax

    return jax.grad(lambda *xs: (function(*xs) ** 2).sum(), argnums=(0, 1))(*inputs)


def _tf_gradients(function, *inputs):
    import tensorflow as tf

    inputs = [tf.convert_to_tensor(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        loss = tf.reduce_sum(function(*inputs) ** 2)
    return tape.gradient(loss, inputs)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_only_masked_float32_attention_without_its_weights_normalises_after_the_sum(
        dtype, monkeypatch):
    """The layer divides after the weighted sum only for masked float32 attention whose weights
    are neither asked for nor dropped out: then its output is the weights' path's (softmax)
    within float32 rounding, a fully masked query's included. Mixed bfloat16 keeps the softmax
    (the same output as that path, bit for bit); fused attention never takes it."""
    taken = []

    def spy(logits, value):
        taken.append(keras.backend.standardize_dtype(logits.dtype))
        return attention.weighted_then_normalised.__wrapped__(logits, value)

    spy.__wrapped__ = attention.weighted_then_normalised
    monkeypatch.setattr(attention, "weighted_then_normalised", spy)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    mask = rng.uniform(size=(2, 7, 7)) < 0.6  # each query's keys, as packing gives them
    mask[..., 0] = True
    mask[1, 5] = False  # a query that sees no key
    layer = attention.MultiHeadSelfAttention(2, dropout=0.1, attention_impl="explicit",
                                             dtype=dtype)
    output = layer(x, attention_mask=mask)
    assert taken == (["float32"] if dtype == "float32" else [])
    through_weights, weights = layer(x, attention_mask=mask, return_attention_scores=True)
    assert not np.isnan(to_np(output)).any()
    np.testing.assert_allclose(to_np(weights)[1, :, 5], 1 / 7, rtol=1e-2)  # sees every key
    if dtype == "float32":
        assert relative_error(output, through_weights) < 1e-6
    else:
        np.testing.assert_array_equal(to_np(output), to_np(through_weights))
    taken.clear()
    layer(x, attention_mask=mask, training=True)  # weights dropped out: the softmax
    fused = attention.MultiHeadSelfAttention(2, attention_impl="fused", dtype=dtype)
    fused(x, attention_mask=mask)
    assert taken == []

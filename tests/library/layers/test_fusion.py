"""keras_vit.layers.fusion: in training on TensorFlow, a layer's element-wise work runs as XLA
computations with the values and gradients of its ops; an inference graph holds no XLA."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit import layers as L
from keras_vit.layers import fusion

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="the fusion is TensorFlow's")

LAYERS = {
    "gelu_tanh": lambda: L.MlpBlock(32, activation="gelu_tanh"),
    "gelu": lambda: L.MlpBlock(32, activation="gelu"),
    "quick_gelu": lambda: L.MlpBlock(32, activation="quick_gelu"),
    "mlp_bfloat16": lambda: L.MlpBlock(32, dtype="mixed_bfloat16"),
    "layer_norm": lambda: L.LayerNorm(),
    "layer_norm_plain": lambda: L.LayerNorm(center=False, scale=False),
    "layer_norm_scale_only": lambda: L.LayerNorm(center=False),
    "rms_norm": lambda: L.RMSNorm(),
}


def _outputs_and_gradients(layer, x, training):
    """A tf.function's outputs of `layer(x)` and their gradients to `x` and every weight,
    with the graph it ran."""
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.cast(layer(x, training=training), "float32")
            loss = tf.reduce_sum(y * tf.sin(y))  # not linear in y: the gradients differ per unit
        return [y] + tape.gradient(loss, [x] + layer.trainable_variables)

    concrete = step.get_concrete_function(tf.TensorSpec(x.shape, x.dtype))
    return [t.numpy() for t in step(x)], concrete.graph


def _xla_calls(graph):
    """The calls in `graph` (and the functions it calls) that XLA must compile."""
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes += list(function.node_def)
    return [node for node in nodes
            if "_XlaMustCompile" in node.attr and node.attr["_XlaMustCompile"].b]


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_training_runs_xla_with_the_values_and_gradients_of_the_ops(name, monkeypatch):
    layer = LAYERS[name]()
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 5, 16)) * 3, "float32")
    layer.build(x.shape)
    if layer.trainable_variables:  # weights away from their initial ones and zeros
        for weight in layer.trainable_variables:
            weight.assign(np.random.default_rng(1).normal(size=weight.shape) * 0.5 + 0.3)

    fused, fused_graph = _outputs_and_gradients(layer, x, training=True)
    monkeypatch.setattr(fusion, "_fusion_helps", lambda: False)  # the ops, as elsewhere
    plain, plain_graph = _outputs_and_gradients(layer, x, training=True)

    assert len(_xla_calls(fused_graph)) >= 2  # the forward and the backward computation
    assert _xla_calls(plain_graph) == []
    assert len(fused) == len(plain) == 2 + len(layer.trainable_variables)
    tolerance = 2e-2 if "bfloat16" in name else 1e-5  # bfloat16: the output's rounding
    for got, want in zip(fused, plain):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * scale)


def test_an_inference_graph_holds_no_xla_call():
    """What an export traces (training False) must run where XLA does not: TF Serving, LiteRT."""
    block = L.EncoderBlock(num_heads=2, mlp_dim=32)
    x = tf.zeros((1, 5, 16))
    block(x)
    inference = tf.function(lambda x: block(x, training=False)).get_concrete_function(x)
    training = tf.function(lambda x: block(x, training=True)).get_concrete_function(x)
    assert _xla_calls(inference.graph) == []
    assert len(_xla_calls(training.graph)) == 3  # two layer norms and the GELU, forward


def test_twelve_blocks_share_one_compiled_function():
    """Compiled functions are kept per function and arguments: one XLA compile for a model's
    GELUs, not one per block."""
    first = fusion.for_training(L.blocks._activated, True, kind="gelu_tanh")
    again = fusion.for_training(L.blocks._activated, True, kind="gelu_tanh")
    exact = fusion.for_training(L.blocks._activated, True, kind="gelu")
    assert first is again and first is not exact


def _refuse_xla(*args, **kwargs):
    raise tf.errors.UnimplementedError(None, None, "XLA is not built in")


@pytest.mark.parametrize("machine", ["no XLA", "TPU host"])
def test_without_xla_or_on_a_tpu_host_training_runs_the_ops(machine, monkeypatch):
    """A TensorFlow whose XLA fails to compile (a build without it), or a TPU host, whose step
    XLA compiles whole: the layer's own ops."""
    fusion._fusion_helps.cache_clear()
    if machine == "no XLA":
        monkeypatch.setattr(tf, "function", _refuse_xla)
    else:
        monkeypatch.setattr(tf.config, "list_logical_devices",
                            lambda kind=None: ["/device:TPU:0"] if kind == "TPU" else [])
    try:
        assert fusion._fusion_helps() is False
        activate = fusion.for_training(L.blocks._activated, True, kind="gelu")
        assert isinstance(activate, functools.partial)
        np.testing.assert_allclose(activate(tf.constant([1.0])), [0.8413447], rtol=1e-6)
    finally:
        monkeypatch.undo()
        fusion._fusion_helps.cache_clear()
    assert fusion._fusion_helps() is True  # this machine: XLA, no TPU

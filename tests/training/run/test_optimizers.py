"""The driver's optimizer (train/run/optimizers.py): layer-wise learning-rates exactly as the
formula says, weight decay on kernels only, and the same updates as Keras' AdamW where neither
option changes anything.
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import masked_patches
from train.run import optimizers, schedules
from train_fixtures import tiny_config

pytestmark = pytest.mark.usefixtures("fresh_session")

DECAY = 0.5


def _model(**fields):
    spec = dict(variant="Ti/16", image_size=16, patch_size=4, hidden_size=8, mlp_dim=16,
                num_heads=2, num_layers=3, num_classes=5)
    return keras_vit.vit(keras_vit.ViTConfig(**{**spec, **fields}))


def _expected_layer(path, depth):
    """The layer id of a weight by the formula: 0 before the blocks, i + 1 in block i, D + 1
    after them."""
    first = path.split("/")[0]
    if first.startswith("encoderblock_"):
        return int(first.split("_")[1]) + 1
    if first in ("encoder_norm", "head", "MAPHead_0", "fc_norm", "pre_logits", "mpp_head"):
        return depth + 1
    return 0


@pytest.mark.parametrize("fields", [
    {},
    {"classifier": "map", "num_register_tokens": 2, "pre_norm": True, "layer_scale_init": 0.1,
     "representation_size": 8},
    {"classifier": "gap", "final_norm": "pooled"},
    {"variant": "R+Ti/16", "patch_size": 1},
    {"variant": "Axial-Ti/16", "classifier": "gap"},
])
def test_layer_scales_are_the_formula(fields):
    model = _model(**fields)
    variables = model.trainable_variables
    scales = optimizers.layer_scales(model, variables, DECAY)
    depth = 3
    seen = set()
    for variable, scale in zip(variables, scales):
        layer = _expected_layer(variable.path, depth)
        seen.add(layer)
        assert scale == DECAY ** (depth + 1 - layer), variable.path
    assert seen == {0, 1, 2, 3, 4}


def test_layer_scales_of_masked_patch_prediction():
    encoder = _model(include_top=False, classifier="gap")
    model = masked_patches.MaskedPatchPredictor(encoder, target="mean_color")
    model.build((None, 16, 16, 3))
    scales = dict(zip((v.path for v in model.trainable_variables),
                      optimizers.layer_scales(model, model.trainable_variables, DECAY)))
    assert scales["masked_patch_predictor/mask_embedding"] == DECAY ** 4
    assert scales["mpp_head/kernel"] == 1.0


def test_layer_decay_needs_a_model_that_knows_its_depths():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="adapter")(inputs))
    with pytest.raises(ValueError, match="layer_decay=0.5: .*need a keras_vit model"):
        optimizers.layer_scales(model, model.trainable_variables, DECAY)


def test_a_weight_of_another_model_is_named():
    model, other = _model(), _model(num_layers=1)
    with pytest.raises(ValueError, match="Not weights of model .*: head/kernel"):
        model.layer_indices([other.get_layer("head").kernel])


def test_every_layer_placements_go_with_the_block_they_feed():
    model = _model(position_embedding_placement="every_layer")
    depths = dict(zip((v.path for v in model.trainable_variables),
                      model.layer_indices(model.trainable_variables)))
    assert depths["posembed_input/pos_embedding"] == 0
    assert depths["posembed_1/pos_embedding"] == depths["encoderblock_1/LayerNorm_0/gamma"] == 2
    assert depths["posembed_2/pos_embedding"] == 3


def test_weight_decay_applies_to_kernels_only():
    model = _model(classifier="map", num_register_tokens=1, layer_scale_init=0.1)
    decayed = {v.path for v in model.trainable_variables if model.decays(v)}
    assert decayed == {v.path for v in model.trainable_variables if v.path.endswith("/kernel")}
    kept = {v.path for v in model.trainable_variables} - decayed
    for name in ("posembed_input/pos_embedding", "reg/registers", "MAPHead_0/probe",
                 "encoderblock_0/layer_scale_0/scale", "encoder_norm/gamma", "head/bias"):
        assert name in kept


def _config(fake_fmnist, **fields):
    return tiny_config(fake_fmnist, **{"warmup_steps": 0, "learning_rate": 0.1, **fields})


def _step(config, model, gradient):
    """One optimizer step of `config`'s optimizer on `model` with a constant gradient; returns
    {path: (before, after)}."""
    optimizer = optimizers.build_optimizer(config, model)
    variables = model.trainable_variables
    optimizer.build(variables)
    before = {v.path: np.array(v.numpy()) for v in variables}
    optimizer.apply([keras.ops.full(v.shape, gradient) for v in variables], variables)
    return {v.path: (before[v.path], v.numpy()) for v in variables}


def test_each_weight_moves_at_its_layers_rate(fake_fmnist):
    config = _config(fake_fmnist, optimizer="sgd", momentum=0.0, layer_decay=DECAY)
    for path, (before, after) in _step(config, _model(), 1.0).items():
        rate = 0.1 * DECAY ** (4 - _expected_layer(path, 3))
        np.testing.assert_allclose(before - after, rate, rtol=1e-5, err_msg=path)


def test_weight_decay_follows_the_layers_rate(fake_fmnist):
    # A zero gradient: Adam moves nothing, so what changes is the decay alone.
    config = _config(fake_fmnist, optimizer="adamw", weight_decay=0.2, layer_decay=DECAY)
    for path, (before, after) in _step(config, _model(), 0.0).items():
        if path.endswith("/kernel"):
            rate = 0.1 * DECAY ** (4 - _expected_layer(path, 3))
            np.testing.assert_allclose(after, before * (1 - 0.2 * rate), rtol=1e-6,
                                       err_msg=path)
        else:
            np.testing.assert_array_equal(after, before, err_msg=path)


def test_same_updates_as_keras_adamw(fake_fmnist):
    """Without layer decay, the optimizer is Keras' AdamW excluding what the driver excluded
    before this module decided it (names containing bias, gamma, beta, pos_embedding, cls)."""
    config = _config(fake_fmnist, optimizer="adamw", weight_decay=0.05, warmup_steps=2)

    def three_steps(make_optimizer):
        keras.utils.set_random_seed(0)
        model = _model(variant="R+Ti/16", patch_size=1)
        optimizer = make_optimizer(model)
        optimizer.build(model.trainable_variables)
        rng = np.random.default_rng(0)
        for _ in range(3):
            optimizer.apply([rng.normal(size=v.shape).astype("float32")
                             for v in model.trainable_variables], model.trainable_variables)
        return [v.numpy() for v in model.trainable_variables]

    schedule = schedules.WarmupDecay(config.learning_rate, config.warmup_steps,
                                     config.total_steps, config.decay)
    reference = keras.optimizers.AdamW(schedule, weight_decay=0.05)
    reference.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "pos_embedding",
                                                   "cls"])
    for ours, theirs in zip(three_steps(lambda model: optimizers.build_optimizer(config, model)),
                            three_steps(lambda model: reference)):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("fields", [
    {"optimizer": "adamw", "weight_decay": 0.05, "layer_decay": DECAY},
    {"optimizer": "adam", "weight_decay": 0.0},
])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_tensorflows_fused_kernels_update_as_keras_ops_do(fake_fmnist, fields, compiled):
    """train.engines.tf_fused_updates: three steps of the fused Adam (and AdamW's decay) kernels
    give the weights and moments of Keras' element-wise ops, to float32 rounding (the steps
    move weights by about 0.1, the learning rate)."""
    tf = pytest.importorskip("tensorflow")
    from train.engines import tf_fused_updates

    config = _config(fake_fmnist, warmup_steps=2, **fields)

    weights = []  # each model's number of trainable weights

    def three_steps(fused_adam):
        keras.utils.set_random_seed(0)
        model = _model(variant="R+Ti/16", patch_size=1)
        variables = model.trainable_variables
        weights.append(len(variables))
        optimizer = optimizers.build_optimizer(config, model, fused_adam=fused_adam)
        optimizer.build(variables)
        apply = optimizer.apply
        if compiled:
            apply = tf.function(lambda grads: optimizer.apply(grads, variables))
        rng = np.random.default_rng(0)
        for _ in range(3):
            grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
            apply(grads) if compiled else apply(grads, variables)
        return [v.numpy() for v in variables + optimizer.variables]

    calls = []

    def counted(*args):
        calls.append(args[2].name)
        return tf_fused_updates.adam_update(*args)

    fused, plain = three_steps(counted), three_steps(None)
    assert len(calls) == (1 if compiled else 3) * weights[0]  # a tf.function traces once
    assert len(fused) == len(plain)
    for ours, theirs in zip(fused, plain):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_tensorflow_engine_fuses_the_update_where_xla_does_not_compile_it(fake_fmnist):
    tf = pytest.importorskip("tensorflow")
    from train.engines import tf_engine

    strategy = tf.distribute.get_strategy()
    assert not tf_engine.update_compiled(_config(fake_fmnist, jit_compile=False), strategy)
    assert tf_engine.update_compiled(_config(fake_fmnist, jit_compile=True), strategy)

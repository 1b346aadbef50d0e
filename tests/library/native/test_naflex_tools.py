"""The tools on a NaFlex model (keras_vit.native.NaFlexViT): the analysis (each image's attention
at its own grid, rollout, attention distance, few-shot features, the weights' pictures), LoRA and
remat. Checked against the classic model at its own grid, against each image alone, and against
hand computations; on whichever Keras backend runs the tests."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import analysis, lora, native
from keras_vit.architecture.execution import execution_of
from keras_vit.layers import EncoderBlock
from test_naflex import IMAGES, PATCH, assert_close, classic, numpy

pytestmark = pytest.mark.usefixtures("fresh_session")

CLASS_TOKEN = {}  # the default: a class token, read by the rollout
MAP_REGISTERS_FUSED = {"classifier": "map", "num_register_tokens": 2, "attention_impl": "fused"}
PACKABLE = {"classifier": "map", "class_token": False}


def naflex_of(fields):
    model = classic(fields)
    return model, native.NaFlexViT(model)


def one(arrays, index):
    """Image `index` of a NaFlex batch, alone."""
    return {name: value[index:index + 1] for name, value in arrays.items()}


@pytest.mark.parametrize("fields", [CLASS_TOKEN, MAP_REGISTERS_FUSED, {
    "position_embedding": "sincos_2d", "classifier": "gap", "class_token": False}],
    ids=["class_token", "map_registers_fused", "sincos_gap"])
def test_an_image_at_the_models_grid_has_the_classic_models_attention(fields):
    """The square image at the model's own 4x4 grid: no resize anywhere, so its attention, its
    rollout and its attention distance are the classic model's (fused attention hands over
    the explicit weights when asked, with the mask)."""
    model, naflex = naflex_of(fields)
    arrays = native.prepare(IMAGES, PATCH, 16)
    assert arrays["spatial_shapes"][0].tolist() == [4, 4]
    image = keras_vit.preprocess_inputs(IMAGES[0][None])
    got, expected = analysis.attention_maps(naflex, arrays)[0], analysis.attention_maps(
        model, image)[0]
    assert (got.grid, got.num_prefix_tokens, got.class_token) == (
        expected.grid, expected.num_prefix_tokens, expected.class_token)
    assert got.weights.shape == (2, 3) + (model.spec.num_prefix_tokens + 16,) * 2
    assert_close(got.weights, expected.weights, "attention weights")
    # The classic model's, from its weights by the functions its own tools use.
    layers, prefix = list(expected.weights), expected.num_prefix_tokens
    assert_close(analysis.attention_rollout(naflex, one(arrays, 0))[0],
                 analysis.rollout_from_attention(layers, (4, 4), prefix, got.class_token)[0],
                 "rollout")
    assert_close(analysis.mean_attention_distance(naflex, one(arrays, 0)),
                 analysis.attention_distance_from_attention(layers, (4, 4), (PATCH, PATCH),
                                                            prefix), "attention distance")


def test_each_image_of_a_mixed_batch_has_the_attention_it_has_alone():
    model, naflex = naflex_of(MAP_REGISTERS_FUSED)
    arrays = native.prepare(IMAGES, PATCH, 16)
    maps = analysis.attention_maps(naflex, arrays, batch_size=3)
    assert [image.grid for image in maps] == [tuple(s) for s in arrays["spatial_shapes"]]
    for index, image in enumerate(maps):
        tokens = 2 + image.grid[0] * image.grid[1]
        assert image.weights.shape == (2, 3, tokens, tokens)
        np.testing.assert_allclose(image.weights.sum(axis=-1), 1.0, atol=1e-5)
        alone = analysis.attention_maps(naflex, one(arrays, index))[0]
        assert_close(image.weights, alone.weights, f"image {index} in a batch")
    # The blocks' own weights over the whole sequences: padding keys get nothing.
    weights = [numpy(layer) for layer in keras_vit.attention_model(naflex)(arrays)]
    padding = np.concatenate([np.zeros((4, 2), bool), arrays["pixel_attention_mask"] == 0], 1)
    assert padding.any()
    for layer in weights:
        assert layer.shape == (4, 3, 18, 18)
        assert np.all(np.where(padding[:, None, None, :], layer, 0.0) == 0.0)
    rollout = analysis.attention_rollout(naflex, arrays)
    assert [map_.shape for map_ in rollout] == [image.grid for image in maps]
    for map_ in rollout:
        assert np.all(map_ >= 0) and abs(map_.sum() - 1.0) < 1e-9


def test_timms_names_in_any_patch_order_give_the_same_maps():
    """Each image's patches are put back row by row from their rows and columns (timm's
    `patch_coord`), wherever they lie in the sequence."""
    _, naflex = naflex_of(CLASS_TOKEN)
    arrays = native.prepare(IMAGES, PATCH, 16)
    valid = arrays["pixel_attention_mask"] == 1
    patches = np.zeros_like(arrays["pixel_values"])
    coords = np.zeros(valid.shape + (2,), np.int32)
    rng = np.random.default_rng(0)
    for index, (rows, columns) in enumerate(arrays["spatial_shapes"]):
        count = rows * columns
        order = rng.permutation(count)
        grid = np.stack(np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij"), -1)
        coords[index, :count] = grid.reshape(-1, 2)[order]
        patches[index, :count] = arrays["pixel_values"][index, order]
    timm = {"patches": patches, "patch_valid": valid, "patch_coord": coords}
    for got, expected in zip(analysis.attention_maps(naflex, timm),
                             analysis.attention_maps(naflex, arrays)):
        assert got.grid == expected.grid
        assert_close(got.weights, expected.weights, f"timm's order, grid {got.grid}")
    # Coordinates that do not cover an image's grid once each cannot be put back.
    coords[0, 1] = coords[0, 0]
    with pytest.raises(ValueError, match=r"do not cover its 4x4 grid once each"):
        analysis.attention_maps(naflex, dict(timm, patch_coord=coords))


def test_packed_images_have_the_attention_they_have_alone():
    """Packed (NaViT), each image attends to its own patches: cut out of its sequence, its
    weights are its padded ones, and the other images' patches get nothing."""
    _, naflex = naflex_of(PACKABLE)
    images = IMAGES + IMAGES[::-1]
    packed = native.pack(images, PATCH, 16, sequence_length=40, max_images=3)
    order = packed["image_index"][packed["image_index"] >= 0]
    padded = analysis.attention_maps(naflex, native.prepare(images, PATCH, 16))
    got = analysis.attention_maps(naflex, packed)
    assert len(got) == len(images)
    for image, index in zip(got, order):
        assert image.grid == padded[index].grid
        assert_close(image.weights, padded[index].weights, f"packed image {index}")
    segments = packed["segment_ids"]
    other = (segments[:, :, None] != segments[:, None, :]) & (segments[:, :, None] > 0)
    for layer in keras_vit.attention_model(naflex)(packed):
        assert np.all(np.where(other[:, None], numpy(layer), 0.0) == 0.0)
    rollout = analysis.attention_rollout(naflex, packed)
    assert [map_.shape for map_ in rollout] == [padded[index].grid for index in order]


def _uniform(model):
    """Zero query and key projections: every logit 0, so each query attends alike to every
    key it may see."""
    for block in model.layers:
        if isinstance(block, EncoderBlock):
            for dense in (block.attention.query, block.attention.key):
                for variable in dense.weights:
                    variable.assign(np.zeros(variable.shape, variable.dtype))


def _mean_patch_distance(rows, columns, pitch):
    """Mean over query patches of their mean distance to every patch of the grid, by hand."""
    cells = np.array([(r, c) for r in range(rows) for c in range(columns)], float) * pitch
    return np.linalg.norm(cells[:, None] - cells[None], axis=-1).mean(), rows * columns


def test_uniform_attention_gives_each_images_own_mean_distance_and_a_flat_rollout():
    """Uniform attention over an image's own tokens: the distance of a query is its mean
    distance to the patches of its image (8 pixels apart in both directions), averaged over
    the query patches of every image; padding that took any weight would change it. The
    rollout of a class token is flat over each image's grid."""
    model, naflex = naflex_of(CLASS_TOKEN)
    _uniform(model)
    arrays = native.prepare(IMAGES, PATCH, 16)
    per_image = [_mean_patch_distance(rows, columns, PATCH)
                 for rows, columns in arrays["spatial_shapes"]]
    expected = sum(mean * count for mean, count in per_image) / sum(
        count for _, count in per_image)
    distance = analysis.mean_attention_distance(naflex, arrays, batch_size=2)
    assert distance.shape == (2, 3)
    np.testing.assert_allclose(distance, expected, rtol=1e-5)
    for map_ in analysis.attention_rollout(naflex, arrays):
        np.testing.assert_allclose(map_, 1.0 / map_.size, rtol=1e-5)


def test_features_are_the_classic_representation_and_feed_the_few_shot_metric():
    """`representation` is what the classic feature model gives at the model's grid; packed
    slots give each image's, empty slots dropped; the few-shot metric runs on NaFlex data."""
    model, naflex = naflex_of({"classifier": "gap", "class_token": False,
                               "representation_size": 16})
    arrays = native.prepare(IMAGES, PATCH, 16)
    image = keras_vit.preprocess_inputs(IMAGES[0][None])
    expected = numpy(analysis.feature_model(model)(image))[0]
    assert_close(numpy(analysis.feature_model(naflex)(arrays))[0], expected, "features")
    labels = np.arange(len(IMAGES)) % 2
    features, got_labels = analysis.representations(naflex, (arrays, labels), batch_size=3)
    assert features.shape == (4, 16) and got_labels.tolist() == labels.tolist()
    packed = native.pack(IMAGES, PATCH, 16, sequence_length=32, max_images=3)
    index = packed["image_index"]
    slot_labels = np.where(index >= 0, labels[np.maximum(index, 0)], 0)
    packed_features, packed_labels = analysis.representations(naflex, (packed, slot_labels))
    assert len(packed_features) == len(IMAGES)  # the empty slots are dropped
    order = index[index >= 0]
    assert_close(packed_features, features[order], "packed features")
    assert packed_labels.tolist() == labels[order].tolist()
    # Dict batches as the training pipeline gives them: the inputs, "label", "label_weight".
    batches = [dict(one(arrays, i), label=labels[i:i + 1], label_weight=np.ones(1))
               for i in range(len(IMAGES))]
    batches[3]["label_weight"] = np.zeros(1)
    assert len(analysis.representations(naflex, batches)[0]) == 3
    accuracy = analysis.few_shot_accuracy(naflex, (arrays, labels), (arrays, labels),
                                          shots=(1,), draws=2)
    assert set(accuracy) == {1} and 0.0 <= accuracy[1] <= 1.0
    with pytest.raises(ValueError, match="one value per image of the NaFlex batch"):
        analysis.representations(naflex, (packed, labels[:len(packed["segment_ids"])]))


def test_the_weights_pictures_are_the_classic_models():
    model, naflex = naflex_of(CLASS_TOKEN)
    np.testing.assert_array_equal(analysis.position_embedding_similarity(naflex),
                                  analysis.position_embedding_similarity(model))
    np.testing.assert_array_equal(analysis.embedding_filters(naflex, n=4),
                                  analysis.embedding_filters(model, n=4))


def test_bad_inputs_are_refused_naming_what_to_use():
    model, naflex = naflex_of(CLASS_TOKEN)
    arrays = native.prepare(IMAGES, PATCH, 16)
    images = keras_vit.preprocess_inputs(np.stack([IMAGES[0]]))
    with pytest.raises(ValueError, match="takes a dict of arrays"):
        analysis.attention_maps(naflex, images)
    with pytest.raises(ValueError, match="not a dict.*NaFlexViT"):
        analysis.attention_rollout(model, arrays)
    with pytest.raises(ValueError, match=r"pixel_values must be scaled to \[-1, 1\]"):
        analysis.mean_attention_distance(naflex, dict(
            arrays, pixel_values=(arrays["pixel_values"] * 127.5 + 127.5).astype(np.uint8)))
    with pytest.raises(ValueError, match="at least one sequence"):
        analysis.attention_maps(naflex, {name: value[:0] for name, value in arrays.items()})
    with pytest.raises(ValueError, match="takes a dict of pixel_values"):
        analysis.attention_maps(naflex, {"pixel_values": arrays["pixel_values"]})
    for batch_size in (0, 1.5, True):
        with pytest.raises(ValueError, match="batch_size must be a whole number"):
            analysis.attention_maps(naflex, arrays, batch_size=batch_size)
    with pytest.raises(ValueError, match="no one token layout.*token_layout"):
        analysis.token_layout(naflex)
    with pytest.raises(ValueError, match=r"features\(\) builds a model of square images"):
        keras_vit.features(naflex, layers=-1)
    with pytest.raises(ValueError, match="one value per image of the NaFlex batch"):
        analysis.representations(naflex, [(arrays, np.zeros((4, 2)))])


def test_a_lora_adapted_naflex_model_trains_its_adapters_and_head_alone():
    """LoRA on a NaFlexViT adapts its classic model's blocks (the same layers); training on
    NaFlex batches changes the adapters and the head only, and the merged copy gives the
    adapted model's outputs on NaFlex inputs."""
    model, naflex = naflex_of(MAP_REGISTERS_FUSED)
    before = {variable.path: numpy(variable) for variable in model.weights}
    lora.enable(naflex, rank=2)
    assert lora.is_adapted(model)
    arrays = native.prepare(IMAGES, PATCH, 16)
    naflex.compile(optimizer=keras.optimizers.Adam(1e-2),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   # CPU seconds of this fit: TensorFlow 6.3 traced, 2.3 eager; JAX 9 jitted,
                   # 20 eager (each op compiled for its shapes)
                   run_eagerly=keras.backend.backend() != "jax")
    naflex.fit(arrays, np.arange(len(IMAGES)) % 5, epochs=3, batch_size=4, verbose=0)
    for variable in model.weights:
        if not (lora.is_adapter(variable) or variable.path.startswith("head/")):
            np.testing.assert_array_equal(numpy(variable), before[variable.path],
                                          err_msg=variable.path)
    assert all(np.abs(numpy(variable)).max() > 0 for variable in model.weights
               if variable.name == "lora_kernel_b")
    assert not np.array_equal(numpy(model.get_layer("head").kernel), before["head/kernel"])
    plain = lora.merged(naflex)
    assert isinstance(plain, native.NaFlexViT) and not lora.is_adapted(plain)
    assert_close(numpy(plain(arrays)), numpy(naflex(arrays)), "merged against adapted")


def _loss_and_gradients(model, arrays):
    """The summed squared outputs in training mode and their gradients, on this backend."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        trainable = [variable.value for variable in model.trainable_variables]
        state = [variable.value for variable in model.non_trainable_variables]

        def loss(weights):
            outputs, _ = model.stateless_call(weights, state, arrays, training=True)
            return jax.numpy.sum(jax.numpy.square(outputs))

        # Jitted, as a training step runs (and one compile costs less than eager ops here).
        value, grads = jax.jit(jax.value_and_grad(loss))(trainable)
        return float(value), [numpy(g) for g in grads]
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            value = tf.reduce_sum(tf.square(model(arrays, training=True)))
        return float(value), [numpy(g) for g in tape.gradient(value,
                                                             model.trainable_variables)]
    if backend == "torch":
        for variable in model.trainable_variables:
            variable.value.grad = None
        value = (model(arrays, training=True) ** 2).sum()
        value.backward()
        return float(value.detach()), [numpy(v.value.grad) for v in model.trainable_variables]
    pytest.skip(f"no gradients on the {backend} backend")


@pytest.mark.parametrize("fields, packed", [(MAP_REGISTERS_FUSED, False), (PACKABLE, True)],
                         ids=["padded_fused", "packed"])
def test_remat_gives_a_naflex_model_the_same_outputs_and_gradients(fields, packed, monkeypatch):
    """`set_execution(naflex, remat="blocks")` sets its classic model's blocks (and says so for
    both): each block, called with the attention mask, is computed again in the backward pass,
    with the outputs and gradients of the plain run."""
    model, naflex = naflex_of(fields)
    arrays = (native.pack(IMAGES, PATCH, 16, sequence_length=40, max_images=3) if packed
              else native.prepare(IMAGES, PATCH, 16))
    arrays = {name: value for name, value in arrays.items() if name != "image_index"}
    loss, expected = _loss_and_gradients(naflex, arrays)
    keras_vit.set_execution(naflex, remat="blocks")
    assert execution_of(model).remat == execution_of(naflex).remat == "blocks"
    calls = []
    original = EncoderBlock._rematerialized

    def counted(self, *args, **kwargs):
        calls.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EncoderBlock, "_rematerialized", counted)
    remat_loss, got = _loss_and_gradients(naflex, arrays)
    assert sorted(set(calls)) == ["encoderblock_0", "encoderblock_1"]
    assert remat_loss == pytest.approx(loss, rel=1e-6)
    scale = max(np.abs(g).max() for g in expected)
    for a, b, variable in zip(got, expected, naflex.trainable_variables):
        assert np.abs(a - b).max() <= 1e-6 * max(np.abs(b).max(), 1e-2 * scale), variable.path

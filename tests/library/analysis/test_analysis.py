"""The analysis tools (keras_vit.analysis) on hand-built attention, features and weights, and on
small models; the figures (keras_vit.analysis.plotting) are checked by the CLI test in
test_analyze_cli."""

import itertools
import math

import numpy as np
import pytest

import keras_vit
from keras_vit import analysis
from model_fixtures import randomise

# Seeded models: the few-shot test needs a random model that maps the colour classes apart,
# which must not depend on what the tests before it drew from Keras' global seed.
pytestmark = pytest.mark.usefixtures("fresh_session")

SMALL = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, num_classes=5)


def small_vit(**kwargs):
    return keras_vit.vit("Ti/16", **{**SMALL, **kwargs})


def model_images(model, count=3, seed=0):
    shape = (count,) + tuple(model.input_shape[1:])
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


# --- rollout ------------------------------------------------------------------------------------

# Two layers of 3 tokens (a class token and a 1x2 grid), two heads each, computed by hand:
#   layer 1: head a = identity, head b = everyone attends to token 1
#     mean = 0.5 I + 0.5 B; + I and renormalised: A1 = 0.75 I + 0.25 B
#     A1 = [[.75, .25, 0], [0, 1, 0], [0, .25, .75]]
#   layer 2: both heads: everyone attends to token 2
#     A2 = [[.5, 0, .5], [0, .5, .5], [0, 0, 1]]
#   rollout R = A2 @ A1; its class row = .5 A1[0] + .5 A1[2] = [.375, .25, .375]
#   patches [.25, .375] renormalised: [.4, .6]
#   read as a "gap" model (no prefix, 1x3 grid): the mean of R's rows is [.125, .375, .5]
LAYER_1 = np.stack([np.eye(3), np.tile([0.0, 1.0, 0.0], (3, 1))])[None]
LAYER_2 = np.stack([np.tile([0.0, 0.0, 1.0], (3, 1))] * 2)[None]


def test_rollout_equals_the_hand_computation():
    rollout = analysis.rollout_from_attention([LAYER_1, LAYER_2], grid=(1, 2))
    np.testing.assert_allclose(rollout, [[[0.4, 0.6]]], atol=1e-12)


def test_rollout_of_a_gap_model_averages_all_tokens():
    rollout = analysis.rollout_from_attention([LAYER_1, LAYER_2], grid=(1, 3),
                                              num_prefix_tokens=0)
    np.testing.assert_allclose(rollout, [[[0.125, 0.375, 0.5]]], atol=1e-12)


def test_rollout_rejects_what_is_not_attention():
    with pytest.raises(ValueError, match=r"expected \[batch, heads, 5, 5\]"):
        analysis.rollout_from_attention([LAYER_1], grid=(2, 2))
    with pytest.raises(ValueError, match="empty"):
        analysis.rollout_from_attention([], grid=(1, 2))
    with pytest.raises(ValueError, match="same images"):
        analysis.rollout_from_attention([LAYER_1, np.concatenate([LAYER_2] * 2)], grid=(1, 2))
    with pytest.raises(ValueError, match="not logits"):
        analysis.attention_distance_from_attention([LAYER_1 * 3 - 1], grid=(1, 2))


@pytest.mark.parametrize("kwargs, grid", [
    (dict(image_size=(32, 48)), (2, 3)),
    (dict(image_size=(48, 32), classifier="gap"), (3, 2)),
])
def test_rollout_of_a_model(kwargs, grid):
    model = small_vit(**kwargs)
    rollout = analysis.attention_rollout(model, model_images(model, count=5), batch_size=2)
    assert rollout.shape == (5,) + grid
    assert np.all(rollout >= 0)
    np.testing.assert_allclose(rollout.sum(axis=(1, 2)), 1.0, atol=1e-9)
    # Different images attend differently: the maps are computed per image.
    assert np.abs(rollout[0] - rollout[1]).max() > 1e-6


def test_rollout_of_a_hybrid():
    model = keras_vit.vit("R+Ti/16", image_size=(32, 64), patch_size=2, **SMALL)
    layout = analysis.token_layout(model)
    assert layout.grid == (4, 8) and layout.pixel_pitch == (8.0, 8.0)
    rollout = analysis.attention_rollout(model, model_images(model, count=2))
    assert rollout.shape == (2, 4, 8)
    np.testing.assert_allclose(rollout.sum(axis=(1, 2)), 1.0, atol=1e-9)


def test_images_are_checked():
    model = small_vit(image_size=32)
    good = model_images(model, count=1)
    with pytest.raises(ValueError, match=r"takes \[N, 32, 32, 3\]"):
        analysis.attention_rollout(model, good[:, :16])
    with pytest.raises(ValueError, match="preprocess_inputs"):
        analysis.attention_rollout(model, ((good + 1) * 127.5).astype(np.uint8))
    with pytest.raises(ValueError, match="preprocess_inputs"):
        analysis.mean_attention_distance(model, (good + 1) * 127.5)


def test_not_a_vit():
    import keras
    inputs = keras.Input((8, 8, 3))
    other = keras.Model(inputs, keras.layers.Flatten()(inputs))
    with pytest.raises(ValueError, match="keras_vit.vit"):
        analysis.position_embedding_similarity(other)


# --- overlay ------------------------------------------------------------------------------------

def test_overlay():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(2, 32, 48, 3), dtype=np.uint8)
    maps = np.zeros((2, 2, 3))
    maps[:, 0, 0] = 1.0  # all attention on the top-left patch
    unchanged = analysis.overlay(images, maps, alpha=0.0)
    np.testing.assert_array_equal(unchanged, images)
    heat = analysis.overlay(np.zeros_like(images), maps, alpha=1.0)
    assert heat.dtype == np.uint8 and heat.shape == images.shape
    # The attended corner is brighter than the far corner.
    assert heat[:, :4, :4].astype(int).sum() > heat[:, -4:, -4:].astype(int).sum() + 1000
    gray = analysis.overlay(images[0, ..., 0], maps[0], alpha=0.0)  # one grayscale image
    np.testing.assert_array_equal(gray, np.repeat(images[0, ..., :1], 3, axis=-1))


def test_overlay_bad_input():
    images = np.zeros((2, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="one map per image"):
        analysis.overlay(images, np.ones((3, 2, 2)))
    with pytest.raises(ValueError, match="uint8"):
        analysis.overlay(images.astype(np.float32), np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="alpha"):
        analysis.overlay(images, np.ones((2, 2, 2)), alpha=2)


# --- mean attention distance --------------------------------------------------------------------

def test_attention_to_itself_has_distance_zero():
    tokens = 1 + 2 * 3
    weights = np.broadcast_to(np.eye(tokens), (4, 2, tokens, tokens))
    distance = analysis.attention_distance_from_attention([weights, weights], grid=(2, 3),
                                                          pixel_pitch=(16, 16))
    np.testing.assert_array_equal(distance, np.zeros((2, 2)))


def test_uniform_attention_gives_the_mean_pairwise_distance():
    grid, pitch = (2, 3), (16.0, 10.0)
    centres = [((row + 0.5) * pitch[0], (column + 0.5) * pitch[1])
               for row in range(grid[0]) for column in range(grid[1])]
    pairs = [math.dist(a, b) for a, b in itertools.product(centres, repeat=2)]
    expected = sum(pairs) / len(pairs)
    tokens = 1 + len(centres)
    uniform = np.full((3, 4, tokens, tokens), 1.0 / tokens)  # the class token gets a share too
    distance = analysis.attention_distance_from_attention([uniform], grid, pitch)
    assert distance.shape == (1, 4)
    np.testing.assert_allclose(distance, expected, rtol=1e-12)


def test_attention_to_the_neighbour():
    # Two patches side by side, 10 pixels apart; each attends only to the other.
    swap = np.array([[[[1.0, 0, 0], [0, 0, 1], [0, 1, 0]]]])
    distance = analysis.attention_distance_from_attention([swap], grid=(1, 2),
                                                          pixel_pitch=(16, 10))
    np.testing.assert_allclose(distance, [[10.0]])


def test_mean_attention_distance_of_a_model():
    model = small_vit(image_size=(32, 64), num_layers=3)
    images = model_images(model, count=5)
    distance = analysis.mean_attention_distance(model, images, batch_size=2)
    assert distance.shape == (3, 2)
    assert np.all(distance > 0) and np.all(distance < math.hypot(32, 64))
    # Batching does not change the average.
    np.testing.assert_allclose(
        analysis.mean_attention_distance(model, images, batch_size=5), distance, rtol=1e-5)


# --- position embeddings and filters ------------------------------------------------------------

def test_position_similarity_learned():
    model = small_vit(image_size=(48, 32))  # a 3x2 grid
    layer = model.get_layer("posembed_input")
    embedding = np.zeros((1, 7, 16), np.float32)
    embedding[0, 0] = 5.0  # the class token: left out
    for index in range(6):
        embedding[0, 1 + index, index // 2] = 1.0 + index  # one-hot of the row, any length
    layer.pos_embedding.assign(embedding)
    similarity = analysis.position_embedding_similarity(model)
    rows = np.arange(6) // 2
    expected = (rows[:, None] == rows[None, :]).astype(float).reshape(6, 3, 2)
    np.testing.assert_allclose(similarity, expected, atol=1e-6)


def test_position_similarity_learned_2d():
    model = small_vit(image_size=(48, 32), position_embedding="learned_2d")
    layer = model.get_layer("posembed_input")
    layer.row_embedding.assign(np.eye(3, 8, dtype=np.float32))
    layer.column_embedding.assign(np.eye(2, 8, dtype=np.float32))
    similarity = analysis.position_embedding_similarity(model)
    cells = [(row, column) for row in range(3) for column in range(2)]
    expected = [[((a[0] == b[0]) + (a[1] == b[1])) / 2 for b in cells] for a in cells]
    np.testing.assert_allclose(similarity, np.reshape(expected, (6, 3, 2)), atol=1e-6)
    # Neighbours share a row or a column: 0.5; patches sharing neither: 0.
    summary = analysis.position_similarity_summary(similarity)
    assert summary == pytest.approx(
        {"adjacent": 0.5, "same_row": 0.5, "same_column": 0.5, "other": 0.0}, abs=1e-6)


def test_position_similarity_without_embeddings():
    with pytest.raises(ValueError, match="no position embeddings"):
        analysis.position_embedding_similarity(small_vit(position_embedding="none"))
    # Relative ones are logits inside the attention: the message says so, with their kind.
    for kind, shared in (("relative", False), ("relative_2d", False), ("relative_mlp", True)):
        with pytest.raises(ValueError) as error:
            analysis.position_embedding_similarity(small_vit(
                position_embedding=kind, **({"relative_mlp_shared": True} if shared else {})))
        message = str(error.value)
        assert f"has relative position embeddings (position_embedding='{kind}')" in message
        assert "'none'" not in message and "position_embedding='learned'" in message
    with pytest.raises(ValueError, match=r"rotary position embeddings \(rope='axial'\)"):
        analysis.position_embedding_similarity(small_vit(position_embedding="none",
                                                         rope="axial"))


def test_rollout_and_attention_distance_of_a_rope_model():
    """Rotary embeddings change the logits, not the token layout: the analysis tools read a
    rope model's attention like any other, and its maps differ from the same weights'
    without rope."""
    model = small_vit(rope="axial", num_register_tokens=1)
    randomise(model, scale=0.5)
    plain = keras_vit.vit(model.spec.replace(rope=None, rope_temperature=None))
    plain.set_weights(model.get_weights())
    images = model_images(model)
    rollout = analysis.attention_rollout(model, images)
    assert rollout.shape[0] == len(images) and np.isfinite(rollout).all()
    assert np.abs(rollout - analysis.attention_rollout(plain, images)).max() > 1e-3
    distances = analysis.mean_attention_distance(model, images)
    assert np.isfinite(distances).all()


def test_differential_attention_maps_are_given_and_rollout_and_distance_refused():
    """Differential attention's weights (each head's difference of two softmax maps, rows
    summing to 1 - lambda) come out of attention_maps; rollout and the mean attention distance,
    which read softmax weights, refuse the model naming why."""
    model = small_vit(image_size=32, attention_layer="differential", parallel_blocks=True)
    randomise(model)
    images = model_images(model, count=2)
    maps = analysis.attention_maps(model, images)
    assert len(maps) == 2 and maps[0].weights.shape == (2, 2, 5, 5)
    sums = maps[0].weights.sum(axis=-1)
    np.testing.assert_allclose(sums, sums[..., :1] * np.ones_like(sums), atol=1e-5)
    assert np.abs(sums - 1).max() > 1e-3  # not softmax rows
    for tool in (analysis.attention_rollout, analysis.mean_attention_distance):
        with pytest.raises(ValueError, match="attention_layer='differential', whose weights "
                                             "are the difference of two softmax maps"):
            tool(model, images)


def test_embedding_filters_find_the_planted_direction():
    model = small_vit(image_size=32, hidden_size=64)  # 64 filters of 16x16x3
    rng = np.random.default_rng(0)
    direction = rng.normal(size=16 * 16 * 3)
    direction /= np.linalg.norm(direction)
    strengths = rng.normal(size=64) * 10
    noise = rng.normal(size=(64, 16 * 16 * 3)) * 0.01
    kernel = (strengths[:, None] * direction + noise).T.reshape(16, 16, 3, 64)
    model.get_layer("embedding").kernel.assign(kernel.astype(np.float32))
    components = analysis.embedding_filters(model, n=5)
    assert components.shape == (5, 16, 16, 3)
    flat = components.reshape(5, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(5), atol=1e-6)
    assert abs(flat[0] @ direction) > 0.999
    assert np.all(flat[np.arange(5), np.abs(flat).argmax(axis=1)] > 0)  # sign convention
    with pytest.raises(ValueError, match="pass 1 <= n <= 63"):
        analysis.embedding_filters(model, n=64)


def test_hybrid_filters_are_the_standardised_root_convolution():
    model = keras_vit.vit("R+Ti/16", image_size=32, **SMALL)
    filters = analysis.first_layer_filters(model)
    assert filters.shape == (7, 7, 3, 64)
    np.testing.assert_allclose(filters.mean(axis=(0, 1, 2)), 0, atol=1e-9)
    np.testing.assert_allclose(filters.std(axis=(0, 1, 2)), 1, atol=1e-3)
    assert analysis.embedding_filters(model, n=28).shape == (28, 7, 7, 3)


def test_conv_stem_filters_are_its_first_convolution():
    model = keras_vit.vit("Ti/16", image_size=32, conv_stem=True, **SMALL)
    filters = analysis.first_layer_filters(model)
    stem = model.get_layer("conv_stem").convs[0].kernel
    np.testing.assert_array_equal(filters, np.asarray(stem))
    assert filters.shape == (4, 4, 3, SMALL["hidden_size"] // 4)


# --- few-shot -----------------------------------------------------------------------------------

def separable(count_per_class, noise_seed, classes=4, dims=6):
    """Features clustered tightly around far-apart class centres (the same for every seed)."""
    centres = np.random.default_rng(0).normal(size=(classes, dims)) * 10
    labels = np.repeat(np.arange(classes), count_per_class)
    noise = np.random.default_rng(noise_seed).normal(size=(len(labels), dims)) * 0.1
    return centres[labels] + noise, labels


def test_few_shot_on_separable_features_is_perfect():
    accuracy = analysis.few_shot_from_features(*separable(30, 1), *separable(50, 2),
                                               shots=(1, 5, 25), l2_reg=1.0, draws=3)
    assert accuracy == {1: 1.0, 5: 1.0, 25: 1.0}


def test_few_shot_on_random_labels_is_near_chance():
    features, labels = separable(50, 1)
    rng = np.random.default_rng(1)
    accuracy = analysis.few_shot_from_features(features, rng.permutation(labels), features,
                                               rng.permutation(labels), shots=(10,))
    assert accuracy[10] < 0.5  # 4 classes: chance is 0.25


# More examples than features (the primal form) and fewer (the dual form).
@pytest.mark.parametrize("count, dims, l2_reg", [
    (30, 8, 1e-9), (30, 8, 0.7), (30, 8, 50.0), (5, 12, 0.7), (5, 12, 50.0)])
def test_ridge_closed_form_equals_a_least_squares_solve(count, dims, l2_reg):
    rng = np.random.default_rng(count + dims)
    features = rng.normal(size=(count, dims)) + 3.0
    labels = rng.integers(0, 3, size=count)
    weights, bias = analysis.ridge_classifier(features, labels, 3, l2_reg)
    targets = np.where(np.eye(3)[labels] > 0, 1.0, -1.0)
    # min |X W + b - Y|^2 + l2 |W|^2 as one stacked least-squares problem; b unregularised.
    stacked = np.block([[features, np.ones((count, 1))],
                        [np.sqrt(l2_reg) * np.eye(dims), np.zeros((dims, 1))]])
    goal = np.vstack([targets, np.zeros((dims, 3))])
    solution = np.linalg.lstsq(stacked, goal, rcond=None)[0]
    np.testing.assert_allclose(weights, solution[:-1], atol=1e-8)
    np.testing.assert_allclose(bias, solution[-1], atol=1e-8)


def test_few_shot_errors():
    features, labels = separable(3, 1)

    def few_shot(**kwargs):
        arguments = dict(train_features=features, train_labels=labels, test_features=features,
                         test_labels=labels, shots=(2,))
        return analysis.few_shot_from_features(**{**arguments, **kwargs})

    with pytest.raises(ValueError, match=r"5-shot needs 5 .* fewer: \{0: 3, 1: 3, 2: 3, 3: 3\}"):
        few_shot(shots=(5,))
    with pytest.raises(ValueError, match="must be"):
        few_shot(train_labels=labels[:-1])
    with pytest.raises(ValueError, match="whole numbers"):
        few_shot(train_labels=labels + 0.5)
    with pytest.raises(ValueError, match="whole numbers"):
        few_shot(test_labels=labels - 1)
    with pytest.raises(ValueError, match="num_classes=3"):
        few_shot(num_classes=3)
    broken = features.copy()
    broken[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        few_shot(test_features=broken)
    with pytest.raises(ValueError, match="l2_reg must be > 0"):
        few_shot(l2_reg=0.0)
    with pytest.raises(ValueError, match="draws"):
        few_shot(draws=0)
    with pytest.raises(ValueError, match="positive"):
        few_shot(shots=(0,))
    with pytest.raises(ValueError, match="num_classes=4"):
        analysis.ridge_classifier(features, labels + 1, 4)


def test_few_shot_draws_are_random_subsets():
    features, labels = separable(40, 1)
    noisy = features + np.random.default_rng(3).normal(size=features.shape) * 12
    one_draw = [analysis.few_shot_from_features(noisy, labels, noisy, labels, shots=(2,),
                                                draws=1, seed=seed)[2] for seed in range(4)]
    assert len(set(one_draw)) > 1  # different seeds pick different examples
    repeated = analysis.few_shot_from_features(noisy, labels, noisy, labels, shots=(2,),
                                               draws=1, seed=0)[2]
    assert repeated == one_draw[0]  # and a seed repeats its draw


def test_few_shot_accuracy_of_a_model():
    """Features of images that a random model maps apart: a class is a colour."""
    model = small_vit(image_size=32, representation_size=8)
    rng = np.random.default_rng(0)

    def data(count):
        labels = np.repeat(np.arange(3), count)
        images = 1.8 * np.eye(3)[labels][:, None, None, :] - 0.9 + \
            rng.normal(size=(len(labels), 32, 32, 3)) * 0.01
        return images.astype(np.float32), labels

    accuracy = analysis.few_shot_accuracy(model, data(10), data(10), shots=(1, 5), draws=2)
    assert accuracy == {1: 1.0, 5: 1.0}
    assert analysis.feature_model(model).output.shape == (None, 8)  # pre-logits


def test_representations_drop_padding():
    tf = pytest.importorskip("tensorflow")  # a tf.data pipeline, as the training driver feeds
    model = small_vit(image_size=32)
    images = model_images(model, count=6)
    labels = np.arange(6) % 3
    mask = np.array([1, 1, 0, 1, 0, 1], bool)
    batches = tf.data.Dataset.from_tensor_slices(
        {"image": images, "label": labels, "mask": mask}).batch(4)
    seen = []
    features, kept = analysis.representations(model, batches, progress=seen.append)
    expected, _ = analysis.representations(model, (images[mask], labels[mask]))
    np.testing.assert_array_equal(kept, labels[mask])
    np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-5)  # batch sizes differ
    assert seen == [3, 4]


def test_rollout_of_a_gap_model_with_registers_reads_the_patches():
    """Registers that no patch attends to change nothing: the rollout of the patches' rows
    equals that of the same attention without the registers (not a register's row)."""
    rng = np.random.default_rng(0)
    layers_with, layers_without = [], []
    for _ in range(2):
        patches = rng.uniform(size=(1, 2, 4, 4))
        patches /= patches.sum(-1, keepdims=True)
        registers = rng.uniform(size=(1, 2, 2, 6))
        registers /= registers.sum(-1, keepdims=True)
        full = np.concatenate([registers, np.concatenate(
            [np.zeros((1, 2, 4, 2)), patches], axis=-1)], axis=2)
        layers_with.append(full)
        layers_without.append(patches)
    with_registers = analysis.rollout_from_attention(layers_with, (2, 2), num_prefix_tokens=2,
                                                     class_token=False)
    np.testing.assert_allclose(with_registers, analysis.rollout_from_attention(
        layers_without, (2, 2), num_prefix_tokens=0), atol=1e-12)
    model = keras_vit.vit("Ti/16", image_size=32, hidden_size=16, mlp_dim=32, num_heads=2,
                          num_layers=1, classifier="gap", num_register_tokens=2)
    layout = analysis.token_layout(model)
    assert (layout.num_prefix_tokens, layout.class_token) == (2, False)


@pytest.mark.parametrize("fields, layer", [({"classifier": "map"}, "MAPHead_0"),
                                           ({"classifier": "gap", "final_norm": "pooled"},
                                            "fc_norm")])
def test_few_shot_features_are_what_the_head_reads(fields, layer):
    model = keras_vit.vit("Ti/16", image_size=32, hidden_size=16, mlp_dim=32, num_heads=2,
                          num_layers=1, **fields)
    assert analysis.feature_model(model).outputs[0] is model.get_layer(layer).output
    assert model.get_layer("head").input is model.get_layer(layer).output

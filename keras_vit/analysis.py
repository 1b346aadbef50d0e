"""Looking inside a ViT: the analyses of the paper's section 4.5 and appendix D.7/D.8, and its
few-shot linear metric (section 4.1).

    from keras_vit import analysis
    rollout = analysis.attention_rollout(model, images)        # [N, gh, gw], each sums to 1
    overlay = analysis.overlay(images_uint8, rollout)          # heat map over the images
    dist = analysis.mean_attention_distance(model, images)     # [layers, heads] in pixels
    sim = analysis.position_embedding_similarity(model)        # [gh*gw, gh, gw]
    pcs = analysis.embedding_filters(model, n=28)              # [n, kh, kw, 3]
    acc = analysis.few_shot_accuracy(model, train_data, test_data, shots=(1, 5, 10, 25))

`images` are what the model takes: `[N, height, width, 3]` at its input size, scaled to [-1, 1]
(`keras_vit.preprocess_inputs`). Every function works for non-square grids, for hybrids and for
"gap" models. The results are numpy arrays; `keras_vit.plotting` draws them. The functions named
`*_from_attention` and `few_shot_from_features` do the arithmetic on arrays, without a model.
"""

import dataclasses

import keras
import numpy as np

from keras_vit import layers as vit_layers
from keras_vit.layers import resnet
from keras_vit.intermediates import attention_model
from keras_vit.model import check_image_size

DEFAULT_SHOTS = (1, 5, 10, 25)
# Between the best two of 2^-10..2^14 (2^6 and 2^8, mean over k = 1, 5, 10, 25) measured on
# the quickstart model; features are standardised first, so it does not depend on their scale.
DEFAULT_L2_REG = 128.0
_STD_EPSILON = 1e-5  # keeps a constant feature from dividing by zero when standardising


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """Where a model's tokens come from: `num_prefix_tokens` (the class token, if
    `class_token`, then register tokens) followed by a `grid` of patches, each `pixel_pitch`
    (rows, columns) pixels apart in the input."""

    grid: tuple
    num_prefix_tokens: int
    image_size: tuple
    pixel_pitch: tuple
    class_token: bool = True


def token_layout(model, image_size=None):
    """The `TokenLayout` of a model built by `keras_vit.vit()` (or loaded from `.keras`), for
    images of its size or, for a model of any image size, of `image_size` (height, width;
    default the size its position embeddings were trained for, `spec.image_size`)."""
    position = _find_layer(model, vit_layers.AddPositionEmbs, "AddPositionEmbs")
    spec = getattr(model, "spec", None)
    prefix = position.num_prefix_tokens
    class_token = spec.class_token if spec is not None else prefix > 0
    if spec is not None and spec.dynamic_image_size:
        image_size = tuple(int(side) for side in (image_size or spec.image_size))
        pitch = (float(spec.total_stride),) * 2
        return TokenLayout(spec.grid_for(image_size), prefix, image_size, pitch, class_token)
    image_size = tuple(model.input_shape[1:3])
    grid = position.grid_size
    pitch = tuple(size / cells for size, cells in zip(image_size, grid))
    return TokenLayout(grid, prefix, image_size, pitch, class_token)


def _find_layer(model, kind, what):
    for layer in model.layers:
        if isinstance(layer, kind):
            return layer
    raise ValueError(f"Model {model.name!r} has no {what} layer; the analysis tools take a "
                     "model built by keras_vit.vit() or one of its builders.")


# --- Attention rollout (appendix D.8) ---------------------------------------------------------

def rollout_from_attention(attentions, grid, num_prefix_tokens=1, class_token=None):
    """Attention rollout of per-layer attention weights.

    Args:
        attentions: one array per layer, in order, `[batch, heads, tokens, tokens]` (or
            `[heads, tokens, tokens]` for one image), rows summing to 1.
        grid: `(rows, columns)` of the patch grid; tokens = num_prefix_tokens + rows * columns.
        num_prefix_tokens: tokens before the patches (class and register tokens).
        class_token: whether the first token is a class token, whose row is read; otherwise
            (a "gap" or "map" model) the rows of the patches are averaged. None: whether there
            are prefix tokens.

    Returns:
        `[batch, rows, columns]` float64, each map summing to 1.

    The heads are averaged, the identity is added (for the residual connection) and each row
    renormalised; these matrices are multiplied from the first layer to the last.
    """
    rows, columns = grid
    tokens = num_prefix_tokens + rows * columns
    rollout = None
    for weights in _checked_layers(attentions, tokens):
        mixed = weights.mean(axis=1) + np.eye(tokens)
        mixed /= mixed.sum(axis=-1, keepdims=True)
        rollout = mixed if rollout is None else mixed @ rollout
    if num_prefix_tokens > 0 if class_token is None else class_token:
        source = rollout[:, 0, num_prefix_tokens:]
    else:
        source = rollout[:, num_prefix_tokens:, num_prefix_tokens:].mean(axis=1)
    source = source / source.sum(axis=-1, keepdims=True)
    return source.reshape(-1, rows, columns)


def _checked_layers(attentions, tokens):
    """Yields each layer's attention as float64 `[batch, heads, tokens, tokens]`, one layer at a
    time (a batch of all layers in float64 would not fit in memory for large models)."""
    batch = None
    for index, weights in enumerate(attentions):
        weights = np.asarray(weights, dtype=np.float64)
        if weights.ndim == 3:
            weights = weights[None]
        what = f"attentions[{index}]"
        if weights.ndim != 4 or weights.shape[-2:] != (tokens, tokens):
            raise ValueError(f"{what} has shape {weights.shape}; expected [batch, heads, "
                             f"{tokens}, {tokens}] for this grid and number of prefix tokens.")
        if batch is not None and weights.shape[0] != batch:
            raise ValueError(f"{what} has {weights.shape[0]} images, attentions[0] {batch}; "
                             "every layer must hold the same images.")
        batch = weights.shape[0]
        # Loose enough for bfloat16 softmax outputs; catches logits passed by mistake.
        if weights.min() < 0 or np.abs(weights.sum(axis=-1) - 1).max() > 2e-2:
            raise ValueError(f"{what} is not attention weights: rows must be >= 0 and sum to 1 "
                             "(softmax outputs, not logits).")
        yield weights
    if batch is None:
        raise ValueError("attentions is empty; pass one attention array per layer.")


def attention_rollout(model, images, batch_size=8):
    """Attention rollout (see `rollout_from_attention`) of `images` through `model`.

    Returns `[N, rows, columns]`, one map per image over the patch grid, each summing to 1.
    """
    images = check_images(model, images)
    layout = token_layout(model, images.shape[1:3])
    maps = [rollout_from_attention(weights, layout.grid, layout.num_prefix_tokens,
                                   layout.class_token)
            for weights in _attention_batches(model, images, batch_size)]
    return np.concatenate(maps, axis=0)


def _attention_batches(model, images, batch_size):
    """Yields the list of per-layer attention weights (model dtype) for each batch."""
    images = check_images(model, images)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    weights_model = attention_model(model)
    for start in range(0, len(images), batch_size):
        yield weights_model.predict_on_batch(images[start:start + batch_size])


def check_images(model, images):
    """Returns `images` as float32 after checking they are what `model` takes."""
    images = np.asarray(images)
    expected = tuple(model.input_shape[1:])
    if images.ndim != 4 or not len(images) or any(
            want is not None and got != want for got, want in zip(images.shape[1:], expected)):
        shown = ", ".join("any" if want is None else str(want) for want in expected)
        raise ValueError(f"images have shape {images.shape}; model {model.name!r} takes "
                         f"[N, {shown}].")
    check_image_size(model, images)
    if images.dtype == np.uint8 or float(np.abs(images).max()) > 1.0 + 1e-3:
        raise ValueError("images must be scaled to [-1, 1] as the model takes them; got values "
                         f"up to {float(np.abs(images).max()):g} ({images.dtype}). Use "
                         "keras_vit.preprocess_inputs(images) on 0..255 pixels.")
    return images.astype(np.float32)


def overlay(images, rollout, alpha=0.6, colormap="inferno"):
    """Draws attention maps over images.

    Args:
        images: uint8 `[N, height, width, 3]` (or `[height, width, 3]`; grayscale `[..., 1]` or
            without a channel axis is repeated to RGB).
        rollout: `[N, rows, columns]` maps (or one `[rows, columns]` map), e.g. from
            `attention_rollout`; each is scaled to its own maximum.
        alpha: weight of the heat map in the blend.
        colormap: a matplotlib colormap name.

    Returns:
        uint8 `[N, height, width, 3]`, or `[height, width, 3]` for one `[rows, columns]` map.
    """
    images = np.asarray(images)
    maps = np.asarray(rollout, dtype=np.float64)
    single = maps.ndim == 2  # one map for one image
    if single:
        images, maps = images[None], maps[None]
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 [N, height, width, 3 or 1]; got "
                         f"{images.dtype} {images.shape}.")
    if maps.ndim != 3 or len(maps) != len(images):
        raise ValueError(f"rollout has shape {maps.shape}; expected [{len(images)}, rows, "
                         "columns], one map per image.")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
    height, width = images.shape[1:3]
    maps = maps / np.maximum(maps.max(axis=(1, 2), keepdims=True), 1e-12)
    resized = keras.ops.image.resize(maps[..., None].astype(np.float32), (height, width),
                                     interpolation="bilinear")
    resized = np.clip(keras.ops.convert_to_numpy(resized)[..., 0], 0.0, 1.0)
    heat = _colormap(colormap)(resized)[..., :3] * 255.0
    rgb = np.broadcast_to(images, images.shape[:3] + (3,)).astype(np.float64)
    blended = np.round((1.0 - alpha) * rgb + alpha * heat).astype(np.uint8)
    return blended[0] if single else blended


def _colormap(name):
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("overlay colours its heat maps with matplotlib: "
                          "pip install 'keras_vit[analysis]' (or matplotlib).") from error
    return matplotlib.colormaps[name]


# --- Mean attention distance (appendix D.7) ---------------------------------------------------

def patch_center_distances(grid, pixel_pitch=(1.0, 1.0)):
    """`[P, P]` Euclidean distances in pixels between the centres of the grid's patches (row
    major, P = rows * columns), patches `pixel_pitch` (rows, columns) pixels apart."""
    rows, columns = grid
    row_index, column_index = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
    centres = np.stack([(row_index.ravel() + 0.5) * pixel_pitch[0],
                        (column_index.ravel() + 0.5) * pixel_pitch[1]], axis=-1)
    return np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=-1)


def _distance_sums(weights, distances, num_prefix_tokens):
    """Sum over images and query patches of each head's attention-weighted distance."""
    patches = weights[:, :, num_prefix_tokens:, num_prefix_tokens:]
    # Attention paid to prefix tokens has no position: the patch-to-patch weights are
    # renormalised so each query's distance is an average over patches.
    mass = np.maximum(patches.sum(axis=-1), 1e-30)
    per_query = (patches * distances).sum(axis=-1) / mass
    return per_query.sum(axis=(0, 2))


def attention_distance_from_attention(attentions, grid, pixel_pitch=(1.0, 1.0),
                                      num_prefix_tokens=1):
    """Mean attention distance of per-layer attention weights (see `rollout_from_attention`
    for `attentions`), `[layers, heads]`: for each query patch, the attention-weighted mean
    distance to the patches it attends to, averaged over queries and images. Distances are in
    units of `pixel_pitch` (rows, columns), the spacing of the patches: pixels if it is the
    patch size, patches with the default (1, 1)."""
    distances = patch_center_distances(grid, pixel_pitch)
    tokens = num_prefix_tokens + distances.shape[0]
    return np.stack([_distance_sums(weights, distances, num_prefix_tokens) /
                     (weights.shape[0] * distances.shape[0])
                     for weights in _checked_layers(attentions, tokens)])


def mean_attention_distance(model, images, batch_size=8):
    """The paper's mean attention distance (figure 7, right): `[layers, heads]` in pixels of
    the input image, averaged over `images` (the paper used 128)."""
    images = check_images(model, images)
    layout = token_layout(model, images.shape[1:3])
    distances = patch_center_distances(layout.grid, layout.pixel_pitch)
    tokens = layout.num_prefix_tokens + distances.shape[0]
    totals, count = 0.0, 0
    for attentions in _attention_batches(model, images, batch_size):
        layers = _checked_layers(attentions, tokens)
        totals = totals + np.stack([_distance_sums(weights, distances, layout.num_prefix_tokens)
                                    for weights in layers])
        count += attentions[0].shape[0] * distances.shape[0]
    return totals / count


# --- Position embeddings and embedding filters (figure 7, centre and left) --------------------

def position_embedding_similarity(model):
    """Cosine similarity between the position embeddings of every pair of patches.

    Returns `[rows * columns, rows, columns]`: entry `[i]` is the map of patch i's similarity
    to every position (1 at i itself). Class-token embeddings are left out.
    """
    position = _find_layer(model, vit_layers.AddPositionEmbs, "AddPositionEmbs")
    embeddings = position.embeddings()
    if embeddings is None:
        relative = next((layer.relative_position for layer in model.layers
                         if getattr(layer, "relative_position", None)), None)
        if relative:  # the blocks' attention holds them: logits of offsets, not vectors
            kind = {"1d": "relative", "2d": "relative_2d",
                    "mlp": "relative_mlp"}.get(relative, relative)
            raise ValueError(
                f"Model {model.name!r} has relative position embeddings "
                f"(position_embedding={kind!r}): each block's attention adds logits for the "
                "offset between two patches, so no patch has an embedding of its own to "
                "compare. The similarity needs position_embedding='learned' or 'learned_2d'.")
        rope = getattr(getattr(model, "spec", None), "rope", None)
        if rope:
            raise ValueError(
                f"Model {model.name!r} has rotary position embeddings (rope={rope!r}) and no "
                "added ones: each block rotates the queries and keys by the patches' "
                "positions, so no patch has an embedding of its own to compare. The "
                "similarity needs position_embedding='learned' or 'learned_2d'.")
        raise ValueError(f"Model {model.name!r} adds no position embeddings "
                         "(position_embedding='none'); there is nothing to compare.")
    grid = np.asarray(keras.ops.convert_to_numpy(embeddings), np.float64)[0]
    grid = grid[position.num_embedded_prefix:]
    unit = grid / np.maximum(np.linalg.norm(grid, axis=-1, keepdims=True), 1e-12)
    rows, columns = position.grid_size
    return (unit @ unit.T).reshape(-1, rows, columns)


def position_similarity_summary(similarity):
    """Mean cosine similarity (from `position_embedding_similarity`) between distinct patches
    that are adjacent (sharing an edge), in the same row, in the same column, or neither."""
    similarity = np.asarray(similarity)
    count, rows, columns = similarity.shape
    row, column = np.divmod(np.arange(count), columns)
    same_row = row[:, None] == row[None, :]
    same_column = column[:, None] == column[None, :]
    distinct = ~np.eye(count, dtype=bool)
    steps = np.abs(row[:, None] - row[None, :]) + np.abs(column[:, None] - column[None, :])
    flat = similarity.reshape(count, count)
    groups = {"adjacent": steps == 1, "same_row": same_row & distinct,
              "same_column": same_column & distinct, "other": ~same_row & ~same_column}
    return {name: float(flat[mask].mean()) if mask.any() else None  # None: no such pairs
            for name, mask in groups.items()}


def first_layer_filters(model):
    """The filters that look at pixels, `[kh, kw, 3, filters]`: the patch embedding of a plain
    ViT, or the (weight-standardised, as applied) 7x7 root convolution of a hybrid."""
    for layer in model.layers:
        if isinstance(layer, resnet.ResNetStem):
            kernel = np.asarray(keras.ops.convert_to_numpy(layer.conv_root.kernel), np.float64)
            centred = kernel - kernel.mean(axis=(0, 1, 2), keepdims=True)
            std = kernel.std(axis=(0, 1, 2), keepdims=True)
            return centred / (std + resnet.WEIGHT_STANDARDIZATION_EPSILON)
    embed = _find_layer(model, vit_layers.PatchEmbed, "PatchEmbed")
    return np.asarray(keras.ops.convert_to_numpy(embed.kernel), np.float64)


def _component_count(kernel):
    kh, kw, channels, count = kernel.shape
    return min(count - 1, kh * kw * channels)  # centring removes one dimension


def embedding_filter_count(model):
    """How many principal components `embedding_filters` can return for `model`."""
    return _component_count(first_layer_filters(model))


def embedding_filters(model, n=28):
    """The first `n` principal components of the pixel filters (`first_layer_filters`),
    `[n, kh, kw, channels]`, unit norm, strongest first; each is signed so that its largest
    entry is positive."""
    kernel = first_layer_filters(model)
    kh, kw, channels, count = kernel.shape
    filters = kernel.reshape(-1, count).T  # one row per filter
    available = _component_count(kernel)
    if not 1 <= n <= available:
        raise ValueError(f"n={n}: this model's {count} filters of {kh}x{kw}x{channels} have "
                         f"{available} principal components; pass 1 <= n <= {available}.")
    centred = filters - filters.mean(axis=0)
    components = np.linalg.svd(centred, full_matrices=False)[2][:n]
    strongest = components[np.arange(n), np.abs(components).argmax(axis=1)]
    components *= np.where(strongest < 0, -1.0, 1.0)[:, None]
    return components.reshape(n, kh, kw, channels)


# --- Few-shot linear evaluation (section 4.1) --------------------------------------------------

def ridge_classifier(features, labels, num_classes, l2_reg=DEFAULT_L2_REG):
    """The regularised least-squares map from features to {-1, 1}^K targets, in closed form.

    Solves min_{W, b} |X W + b - Y|^2 + l2_reg |W|^2 (the bias is not regularised) and returns
    `(W [d, K], b [K])`. Uses the d x d normal equations or, with fewer examples than
    features, the equal n x n dual form.
    """
    x = np.asarray(features, np.float64)
    labels = _class_indices(labels, "labels", num_classes)
    _check_pairs(x, labels, "train")
    if not l2_reg > 0:
        raise ValueError(f"l2_reg must be > 0 (the fit is regularised), got {l2_reg}.")
    targets = 2.0 * np.eye(num_classes)[labels] - 1.0
    x_mean, y_mean = x.mean(axis=0), targets.mean(axis=0)
    xc, yc = x - x_mean, targets - y_mean
    n, d = xc.shape
    if n >= d:
        weights = np.linalg.solve(xc.T @ xc + l2_reg * np.eye(d), xc.T @ yc)
    else:
        weights = xc.T @ np.linalg.solve(xc @ xc.T + l2_reg * np.eye(n), yc)
    return weights, y_mean - x_mean @ weights


def _standardiser(features):
    mean = features.mean(axis=0)
    std = features.std(axis=0) + _STD_EPSILON
    return lambda x: (x - mean) / std


def few_shot_from_features(train_features, train_labels, test_features, test_labels,
                           shots=DEFAULT_SHOTS, l2_reg=DEFAULT_L2_REG, draws=5, seed=0,
                           num_classes=None):
    """Few-shot linear accuracy of fixed features.

    For each k in `shots` and each of `draws` random draws, k training examples per class are
    picked, standardised with their own mean and std per feature, fitted with
    `ridge_classifier`, and the test examples classified by the largest output.

    Returns:
        `{k: mean test accuracy over the draws}`.
    """
    train_features = np.asarray(train_features, np.float64)
    test_features = np.asarray(test_features, np.float64)
    train_labels = _class_indices(train_labels, "train labels", num_classes)
    test_labels = _class_indices(test_labels, "test labels", num_classes)
    _check_pairs(train_features, train_labels, "train")
    _check_pairs(test_features, test_labels, "test")
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}.")
    if not l2_reg > 0:
        raise ValueError(f"l2_reg must be > 0 (the fit is regularised), got {l2_reg}.")
    by_class = [np.flatnonzero(train_labels == label) for label in range(num_classes)]
    rng = np.random.default_rng(seed)
    results = {}
    for k in shots:
        if k < 1:
            raise ValueError(f"shots must be positive, got {k}.")
        short = {label: len(indices) for label, indices in enumerate(by_class)
                 if len(indices) < k}
        if short:
            raise ValueError(f"{k}-shot needs {k} training examples of every class; these "
                             f"classes have fewer: {short}. Give more training examples or "
                             "smaller shots.")
        accuracies = []
        for _ in range(draws):
            chosen = np.concatenate([rng.choice(indices, k, replace=False)
                                     for indices in by_class])
            standardise = _standardiser(train_features[chosen])
            weights, bias = ridge_classifier(standardise(train_features[chosen]),
                                             train_labels[chosen], num_classes, l2_reg)
            predicted = (standardise(test_features) @ weights + bias).argmax(axis=1)
            accuracies.append(float(np.mean(predicted == test_labels)))
        results[int(k)] = float(np.mean(accuracies))
    return results


def _class_indices(labels, what, num_classes=None):
    """`labels` as int64 class indices, or a ValueError naming what is wrong."""
    labels = np.asarray(labels)
    if labels.size and (labels.dtype.kind not in "iuf" or not np.all(labels == np.round(labels))
                        or labels.min() < 0):
        raise ValueError(f"{what} must be class indices (whole numbers >= 0), got "
                         f"{labels.dtype} values such as {labels.ravel()[:3]}.")
    labels = labels.astype(np.int64)
    if num_classes is not None and labels.size and labels.max() >= num_classes:
        raise ValueError(f"{what} go up to {labels.max()}, but num_classes={num_classes}.")
    return labels


def _check_pairs(features, labels, what):
    if features.ndim != 2 or labels.shape != (features.shape[0],) or not len(labels):
        raise ValueError(f"{what} features {features.shape} and labels {labels.shape} must be "
                         "[n, d] and [n] with n > 0.")
    if not np.all(np.isfinite(features)):
        raise ValueError(f"{what} features contain NaN or infinity; the model's outputs "
                         "overflowed or its weights are broken.")


def feature_model(model):
    """A model sharing `model`'s layers that outputs its representation: the pre-logits layer
    if it has one, else the pooled token, normalised where the model normalises it (what the
    paper's few-shot evaluation uses)."""
    names = {layer.name for layer in model.layers}
    for name in ("pre_logits", "fc_norm", "MAPHead_0", "pool"):  # the last before the head
        if name in names:
            return keras.Model(model.inputs, model.get_layer(name).output,
                               name=f"{model.name}_features")
    raise ValueError(f"Model {model.name!r} has no 'pre_logits' or 'pool' layer; the few-shot "
                     "evaluation takes a model built by keras_vit.vit().")


def representations(model, data, batch_size=256, progress=None):
    """Features (`feature_model`) and labels of every example in `data`.

    `data` is a tuple `(images, labels)` of arrays, or an iterable (e.g. a `tf.data.Dataset`) of
    `(images, labels)` batches or of `{"image", "label"}` batches, optionally with a "mask"
    (examples with mask 0 are padding and dropped). Images must be scaled to [-1, 1] as the
    model takes them.
    `progress`, if given, is called with the number of examples done after each batch.
    """
    features_of = feature_model(model)
    features, labels, done = [], [], 0
    for images, batch_labels, mask in _batches(data, batch_size):
        images = check_images(model, images)
        if mask is not None:
            images, batch_labels = images[mask], batch_labels[mask]
        if len(images):
            features.append(np.asarray(features_of.predict_on_batch(images), np.float64))
            labels.append(np.asarray(batch_labels).reshape(-1))
        done += len(images)
        if progress is not None:
            progress(done)
    if not features:
        raise ValueError("data yielded no examples.")
    return np.concatenate(features), np.concatenate(labels)


def _batches(data, batch_size):
    if isinstance(data, tuple):
        images, labels = (np.asarray(part) for part in data)
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels.")
        for start in range(0, len(images), batch_size):
            yield images[start:start + batch_size], labels[start:start + batch_size], None
        return
    for batch in data:
        if isinstance(batch, dict):
            mask = batch.get("mask")
            mask = None if mask is None else np.asarray(mask).astype(bool)
            yield np.asarray(batch["image"]), np.asarray(batch["label"]), mask
        else:
            images, labels = batch[:2]
            yield np.asarray(images), np.asarray(labels), None


def few_shot_accuracy(model, train_data, test_data, shots=DEFAULT_SHOTS,
                      l2_reg=DEFAULT_L2_REG, draws=5, seed=0, batch_size=256, progress=None):
    """The paper's few-shot linear accuracy of `model`'s frozen representation.

    `train_data` is the pool the k-shot subsets are drawn from and `test_data` the examples
    scored (see `representations` for the accepted forms). Returns `{k: accuracy}`; see
    `few_shot_from_features`.
    """
    train = representations(model, train_data, batch_size, progress)
    # The progress count runs on through the test examples.
    test_progress = None if progress is None else (
        lambda done: progress(len(train[1]) + done))
    test = representations(model, test_data, batch_size, test_progress)
    num_classes = int(max(train[1].max(), test[1].max())) + 1
    return few_shot_from_features(*train, *test, shots=shots, l2_reg=l2_reg, draws=draws,
                                  seed=seed, num_classes=num_classes)


"""Where a ViT attends: the token layout of a model, attention rollout (Abnar & Zuidema, 2020;
the paper's Figure 6 and appendix D.8) and the mean attention distance per layer and head
(Figure 7), from a model or, `*_from_attention`, from attention weights alone."""

import dataclasses

import keras
import numpy as np

from keras_vit import layers as vit_layers
from keras_vit.intermediates import attention_model
from keras_vit.model import check_image_size


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

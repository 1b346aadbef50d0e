"""Where a ViT attends: the token layout of a model, each image's attention weights, attention
rollout (Abnar & Zuidema, 2020; the paper's Figure 6 and appendix D.8) and the mean attention
distance per layer and head (Figure 7), from a model or, `*_from_attention`, from attention
weights alone.

A `keras_vit.native.NaFlexViT` is analysed on its input dict (`native.prepare`'s arrays,
`native.pack`'s or timm's): each image at its own grid, its tokens cut out of its sequence in the
classic model's order (prefix tokens, then its patches row by row), so padding and the other
images of a packed sequence are left out, and the arithmetic is the classic model's."""

import dataclasses

import keras
import numpy as np

from keras_vit import layers as vit_layers
from keras_vit.intermediates import attention_model
from keras_vit.model import check_image_size, classic_model
from keras_vit.native import NaFlexViT


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


@dataclasses.dataclass(frozen=True)
class ImageAttention:
    """One image's attention weights, `weights` `[blocks, heads, tokens, tokens]` (float32; two
    blocks a layer for Axial-ViT), over its `num_prefix_tokens` prefix tokens and then its
    `grid` (rows, columns) of patches row by row: what `rollout_from_attention` and
    `attention_distance_from_attention` take, one block at a time. `class_token`: whether the
    first prefix token is a class token (a rollout reads its row)."""

    grid: tuple
    num_prefix_tokens: int
    class_token: bool
    weights: np.ndarray


def token_layout(model, image_size=None):
    """The `TokenLayout` of a model built by `keras_vit.vit()` (or loaded from `.keras`), for
    images of its size or, for a model of any image size, of `image_size` (height, width;
    default the size its position embeddings were trained for, `spec.image_size`)."""
    if isinstance(model, NaFlexViT):
        raise ValueError(
            f"Model {model.name!r} (a NaFlexViT) has no one token layout: each image has its "
            "own grid (spatial_shapes; attention_maps(model, inputs)[i].grid), and its patches "
            f"are {model.spec.patch_size} pixels apart. token_layout(model.vit) is the classic "
            "model's, at its own image size.")
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
    for layer in classic_model(model).layers:  # a NaFlexViT's are its classic model's
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

    Returns `[N, rows, columns]`, one map per image over the patch grid, each summing to 1. For
    a NaFlexViT, `images` is its input dict and the result a list, one `[rows, columns]` map
    per image at its own grid (see `attention_maps` for their order), padding left out.
    """
    _check_softmax(model, "Attention rollout")
    if isinstance(model, NaFlexViT):
        return [rollout_from_attention(image.weights, image.grid, image.num_prefix_tokens,
                                       image.class_token)[0]
                for image in _image_attentions(model, images, batch_size)]
    images = check_images(model, images)
    layout = token_layout(model, images.shape[1:3])
    maps = [rollout_from_attention(weights, layout.grid, layout.num_prefix_tokens,
                                   layout.class_token)
            for _, weights in _attention_batches(model, images, batch_size)]
    return np.concatenate(maps, axis=0)


def _check_softmax(model, what):
    """A ValueError for a model of differential attention, whose weights `what` cannot read."""
    spec = getattr(model, "spec", None)
    if spec is not None and spec.attention_layer != "softmax":
        raise ValueError(
            f"{what} reads softmax weights (rows >= 0 summing to 1); model {model.name!r} has "
            f"attention_layer={spec.attention_layer!r}, whose weights are the difference of "
            "two softmax maps (signed, rows summing to 1 - lambda). attention_maps(model, "
            "images) gives them.")


def attention_maps(model, images, batch_size=8):
    """Each image's attention weights at its own grid: a list of `ImageAttention`, one per
    image, its `weights` in the classic model's token order. With differential attention
    (`ViTConfig.attention_layer`), each head's difference of its two softmax maps.

    `images` is what `model` takes: `[N, height, width, 3]` images in [-1, 1], or a NaFlexViT's
    input dict. A NaFlex image's tokens are its prefix tokens and its patches, reordered row by
    row from their rows and columns; the padding, and the other images of a packed sequence,
    are cut out (their weights are 0 under the attention mask, so each row still sums to 1).
    The images come in the order of the sequences and, packed, of their slots: `pack`'s
    `image_index[image_index >= 0]` says which input image each is.
    """
    return list(_image_attentions(model, images, batch_size))


def _image_attentions(model, images, batch_size):
    """Yields the `ImageAttention` of each image, one batch of the model at a time."""
    if isinstance(model, NaFlexViT):
        inputs = check_naflex_inputs(model, images)
        for batch, weights in _attention_batches(model, inputs, batch_size):
            for sequence, tokens, grid in _naflex_images(model, batch):
                cut = np.ix_(tokens, tokens)
                yield ImageAttention(grid, model.spec.num_prefix_tokens, model.spec.class_token,
                                     np.stack([layer[sequence][:, cut[0], cut[1]]
                                               for layer in weights]).astype(np.float32))
        return
    images = check_images(model, images)
    layout = token_layout(model, images.shape[1:3])
    for _, weights in _attention_batches(model, images, batch_size):
        for index in range(len(weights[0])):
            yield ImageAttention(layout.grid, layout.num_prefix_tokens, layout.class_token,
                                 np.stack([layer[index] for layer in weights]).astype(np.float32))


def _naflex_images(model, inputs):
    """Yields `(sequence, tokens, grid)` for each image of a NaFlex batch, in the order of the
    sequences and their slots: the indices of its tokens in its sequence, its prefix tokens
    first and then its patches row by row, and its (rows, columns)."""
    layout = model.layout(inputs)
    rows, columns, sizes, groups = (keras.ops.convert_to_numpy(part) for part in (
        layout.rows, layout.columns, layout.sizes, layout.pool_mask))
    prefix = model.spec.num_prefix_tokens
    if groups.ndim == 2:  # one image a sequence: its prefix tokens and patches
        groups = groups[:, None]
    for sequence, slot in zip(*np.nonzero(groups[..., prefix:].any(axis=-1))):
        patches = np.flatnonzero(groups[sequence, slot, prefix:])
        grid = tuple(int(side) for side in sizes[sequence, patches[0]])
        cells = (rows[sequence, patches] * grid[1] + columns[sequence, patches]).astype(np.int64)
        order = np.argsort(cells, kind="stable")
        if not np.array_equal(cells[order], np.arange(grid[0] * grid[1])):
            raise ValueError(
                f"Sequence {sequence}{f', slot {slot}' if groups.shape[1] > 1 else ''} holds "
                f"{len(patches)} patches whose rows and columns do not cover its {grid[0]}x"
                f"{grid[1]} grid once each; the analysis needs every patch of an image, as "
                "keras_vit.native.prepare and pack give them.")
        yield sequence, np.concatenate([np.arange(prefix), patches[order] + prefix]), grid


def _attention_batches(model, images, batch_size):
    """Yields `(batch, per-layer attention weights)` (model dtype) for each batch of `images`
    (checked already: an array, or a NaFlexViT's dict of arrays)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number at least 1, got {batch_size!r}.")
    weights_model = attention_model(model)
    count = len(next(iter(images.values()))) if isinstance(images, dict) else len(images)
    for start in range(0, count, batch_size):
        batch = _rows(images, start, start + batch_size)
        yield batch, _run_batch(weights_model, batch)


def _run_batch(model, batch):
    """`model`'s outputs on one batch as NumPy: compiled (`predict_on_batch`) for images; a
    NaFlex dict is run as called, since compiling costs more than it saves at an analysis's
    few batches of each shape (the first predict_on_batch of the tiny test model's attention:
    9.8 s of CPU on JAX, 0.7 s on TensorFlow; a call 0.06 and 0.1 s)."""
    if not isinstance(batch, dict):
        return model.predict_on_batch(batch)
    return keras.tree.map_structure(keras.ops.convert_to_numpy, model(batch))


def _rows(images, start, stop):
    """Rows `start:stop` of an array of images, or of each array of a NaFlex dict."""
    if isinstance(images, dict):
        return {name: value[start:stop] for name, value in images.items()}
    return images[start:stop]


def check_naflex_inputs(model, inputs):
    """Returns a NaFlexViT's input dict as NumPy arrays (patches as float32) after checking it
    is one: a dict (its names and shapes the model checks) of at least one sequence, of patches
    scaled to [-1, 1]."""
    if not isinstance(inputs, dict):
        raise ValueError(f"Model {model.name!r} (a NaFlexViT) takes a dict of arrays "
                         "(keras_vit.native.prepare's or pack's), not images; got "
                         f"{type(inputs).__name__}.")
    inputs = {name: np.asarray(keras.ops.convert_to_numpy(value))
              for name, value in inputs.items()}
    name = "pixel_values" if "pixel_values" in inputs else "patches"
    pixels = inputs.get(name)
    if pixels is None or pixels.ndim < 1 or not len(pixels):
        raise ValueError(f"Model {model.name!r} takes a dict with pixel_values (or timm's "
                         f"patches) of at least one sequence; got {sorted(inputs)} of shapes "
                         f"{[getattr(value, 'shape', None) for value in inputs.values()]}.")
    _check_range(pixels, name, "keras_vit.native.prepare(images, ...) on uint8 images")
    inputs[name] = pixels.astype(np.float32)
    return inputs


def _check_range(images, what, advice="keras_vit.preprocess_inputs(images) on 0..255 pixels"):
    if images.dtype == np.uint8 or float(np.abs(images).max()) > 1.0 + 1e-3:
        raise ValueError(f"{what} must be scaled to [-1, 1] as the model takes them; got values "
                         f"up to {float(np.abs(images).max()):g} ({images.dtype}). Use "
                         f"{advice}.")


def check_images(model, images):
    """Returns `images` as float32 after checking they are what `model` takes."""
    if isinstance(images, dict):
        raise ValueError(f"Model {model.name!r} takes images [N, height, width, 3], not a dict "
                         f"({sorted(images)}); NaFlex arrays are for "
                         "keras_vit.native.NaFlexViT(model).")
    images = np.asarray(images)
    expected = tuple(model.input_shape[1:])
    if images.ndim != 4 or not len(images) or any(
            want is not None and got != want for got, want in zip(images.shape[1:], expected)):
        shown = ", ".join("any" if want is None else str(want) for want in expected)
        raise ValueError(f"images have shape {images.shape}; model {model.name!r} takes "
                         f"[N, {shown}].")
    check_image_size(model, images)
    _check_range(images, "images")
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
    the input image, averaged over `images` (the paper used 128).

    For a NaFlexViT, `images` is its input dict: each query patch's distances are to the patches
    of its own image, from their rows and columns, in pixels of the image as the model sees it
    (resized to whole patches: patches `patch_size` pixels apart); the average is over every
    query patch of every image, as the classic model's over every query of every image."""
    _check_softmax(model, "The mean attention distance")
    if isinstance(model, NaFlexViT):
        return _naflex_distance(model, images, batch_size)
    images = check_images(model, images)
    layout = token_layout(model, images.shape[1:3])
    distances = patch_center_distances(layout.grid, layout.pixel_pitch)
    tokens = layout.num_prefix_tokens + distances.shape[0]
    totals, count = 0.0, 0
    for _, attentions in _attention_batches(model, images, batch_size):
        layers = _checked_layers(attentions, tokens)
        totals = totals + np.stack([_distance_sums(weights, distances, layout.num_prefix_tokens)
                                    for weights in layers])
        count += attentions[0].shape[0] * distances.shape[0]
    return totals / count


def _naflex_distance(model, inputs, batch_size):
    """`mean_attention_distance` of a NaFlexViT's images, each at its own grid."""
    pitch = (float(model.spec.patch_size),) * 2
    totals, count = 0.0, 0
    for image in _image_attentions(model, inputs, batch_size):
        distances = patch_center_distances(image.grid, pitch)
        layers = _checked_layers(image.weights, image.weights.shape[-1])
        totals = totals + np.stack([_distance_sums(weights, distances, image.num_prefix_tokens)
                                    for weights in layers])
        count += distances.shape[0]
    return totals / count

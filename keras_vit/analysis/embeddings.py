"""What a ViT's first layers learned: the similarity of its position embeddings (Figure 7,
center) and the principal components of its patch-embedding filters (Figure 7, left). These are
weights, not activations: a `keras_vit.native.NaFlexViT`'s are its classic model's (its learned
position embeddings at the grid they were trained for, which NaFlex resizes to each image's)."""

import keras
import numpy as np

from keras_vit import layers as vit_layers
from keras_vit.analysis.attention import _find_layer
from keras_vit.layers import resnet
from keras_vit.model import classic_model


def position_embedding_similarity(model):
    """Cosine similarity between the position embeddings of every pair of patches.

    Returns `[rows * columns, rows, columns]`: entry `[i]` is the map of patch i's similarity
    to every position (1 at i itself). Class-token embeddings are left out.
    """
    model = classic_model(model)
    position = _find_layer(model, vit_layers.AddPositionEmbs, "AddPositionEmbs")
    embeddings = position.embeddings()
    if embeddings is None:
        relative = next((layer.relative_position for layer in model.layers
                         if getattr(layer, "relative_position", None)), None)
        if getattr(getattr(model, "spec", None), "relative_mlp_shared", False):
            relative = "mlp"  # one MLP of the model's, none in the blocks
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
    ViT, the (weight-standardised, as applied) 7x7 root convolution of a hybrid, or the first
    convolution of a conv_stem (MobileCLIP's)."""
    model = classic_model(model)
    for layer in model.layers:
        if isinstance(layer, vit_layers.ConvStem):
            return np.asarray(keras.ops.convert_to_numpy(layer.convs[0].kernel), np.float64)
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

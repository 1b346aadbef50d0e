"""Where each patch of an image at its own aspect ratio is, and the position embedding it gets:
the learned grid resized to each image's rows and columns (SigLIP 2's NaFlex: antialiased
bilinear; timm's NaFlexVit: antialiased bicubic, the model's position_embedding_interpolation),
or the fixed sine-cosine embedding of its row and column. All in static shapes: `[batch,
length]` positions, whatever the images' sizes, so that XLA compiles one program for every
batch."""

from keras import ops

from keras_vit.layers import resample


def patch_positions(spatial_shapes, length):
    """`(rows, columns, valid)`, each `[batch, length]`: the row and column of each of `length`
    positions in an image of `spatial_shapes` `[batch, 2]` (rows, columns) patches, row-major,
    and whether the position holds one of its patches (the padding positions take (0, 0))."""
    sizes = ops.cast(spatial_shapes, "float32")
    positions = ops.arange(length, dtype="float32")[None, :]
    columns = ops.maximum(sizes[:, 1:2], 1.0)
    row = ops.floor(positions / columns)
    valid = positions < sizes[:, 0:1] * columns
    zero = ops.zeros_like(row)
    return (ops.where(valid, row, zero), ops.where(valid, positions - row * columns, zero),
            valid)


def resize_weights(index, size, grid, interpolation="bilinear"):
    """`[batch, length, grid]`: the weights that resizing a `grid`-long axis to `size` `[batch,
    length]` gives the output at `index` `[batch, length]`, as PyTorch's antialiased
    `F.interpolate(..., align_corners=False, antialias=True)` computes them on half-pixel
    centres. "bilinear" (SigLIP 2's): a triangle as wide as the scale when shrinking, linear
    interpolation when enlarging; "bicubic" (timm's NaFlexVit): Keys' cubic with a = -0.5,
    as wide as twice the scale when shrinking (`resample.antialiased_bicubic`). Both
    renormalised at the edges."""
    scale = float(grid) / size
    center = (ops.cast(index, "float32") + 0.5) * scale
    source = ops.arange(grid, dtype="float32")
    if interpolation == "bicubic":
        return resample.antialiased_bicubic(center[..., None], scale[..., None], source, xp=ops)
    if interpolation != "bilinear":
        raise ValueError(f"interpolation must be 'bilinear' or 'bicubic', got {interpolation!r}.")
    support = ops.maximum(scale, 1.0)[..., None]
    weights = ops.maximum(1.0 - ops.abs(source - (center - 0.5)[..., None]) / support, 0.0)
    return weights / ops.sum(weights, axis=-1, keepdims=True)


def resized_learned(table, rows, columns, sizes, interpolation="bilinear"):
    """The learned embeddings `table` `[grid rows, grid columns, D]` resized to each patch's
    image grid (`interpolation`: `resize_weights`) and read at its place: `[batch, length, D]`
    in float32, for patches at `rows`, `columns` `[batch, length]` of images of `sizes`
    `[batch, length, 2]` patches. Resizing is linear, so each output is the table weighted by
    its row's and its column's weights (one matmul)."""
    grid_rows, grid_columns, width = table.shape
    sizes = ops.maximum(ops.cast(sizes, "float32"), 1.0)  # padding: no division by zero
    row_weights = resize_weights(rows, sizes[..., 0], grid_rows, interpolation)
    column_weights = resize_weights(columns, sizes[..., 1], grid_columns, interpolation)
    weights = row_weights[..., :, None] * column_weights[..., None, :]
    weights = ops.reshape(weights, (-1, rows.shape[1], grid_rows * grid_columns))
    flat = ops.reshape(ops.cast(table, "float32"), (grid_rows * grid_columns, width))
    return ops.matmul(weights, flat)

"""Resampling of trained weights to another grid: position embeddings (to another image size)
and the patch-embedding kernel (to another patch size).

Every resize here is linear and separable, so it is a matrix per axis (`resize_matrix`), built
by one function that takes either NumPy (at load time, in float64) or `keras.ops` (at call time,
where the new size may be known only when the graph runs, as in a SavedModel of any image
size). The two interpolations:

- "bilinear": the original code's (`scipy.ndimage.zoom(..., order=1)` in vit_jax's
  checkpoint.py): linear, with the corners kept (a 2-wide axis resized to 3 gives [0, 0.5, 1]).
- "bicubic": timm's (`timm.layers.resample_abs_pos_embed` and `resample_patch_embed`, which call
  `torch.nn.functional.interpolate(mode="bicubic", antialias=True, align_corners=False)`):
  Keys' cubic with a = -0.5 on pixel centres, widened by the scale when shrinking, weights
  renormalised at the borders (PIL's resampling, which PyTorch's antialiased path follows).

`resize_patch_embedding` is FlexiViT's pseudo-inverse resize (Beyer et al., "FlexiViT: One Model
for All Patch Sizes", 2023, section 3.4): the new kernel w' solves <resize(x), w'> = <x, w> for
every patch x, so tokens of resized patches equal those of the original ones.
"""

import numpy as np
from keras import ops

from keras_vit.architecture.spec import INTERPOLATIONS

_CUBIC_A = -0.5  # PIL's and PyTorch's antialiased bicubic (not the -0.75 of plain bicubic)


def check_interpolation(interpolation):
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}.")
    return interpolation


def _cubic(xp, x):
    x = xp.abs(x)
    near = ((_CUBIC_A + 2.0) * x - (_CUBIC_A + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * _CUBIC_A
    return xp.where(x < 1.0, near, xp.where(x < 2.0, far, xp.zeros_like(x)))


def resize_matrix(old, new, interpolation="bilinear", xp=np):
    """The `[new, old]` matrix that resizes an axis of `old` samples to `new`.

    Args:
        old, new: sizes (Python ints, or scalar tensors with `xp=keras.ops`).
        interpolation: "bilinear" (the original's) or "bicubic" (timm's); see the module doc.
        xp: `numpy` (float64) or `keras.ops` (float32, sizes may be tensors).
    """
    check_interpolation(interpolation)
    if xp is np:
        old_f, new_f = float(old), float(new)
        sources, targets = np.arange(old, dtype="float64"), np.arange(new, dtype="float64")
    else:
        old_f, new_f = ops.cast(old, "float32"), ops.cast(new, "float32")
        sources = ops.cast(ops.arange(old), "float32")
        targets = ops.cast(ops.arange(new), "float32")
    if interpolation == "bilinear":
        # The hat function at each target's position on the source axis: exactly the two
        # neighbours' linear weights. One target (or one source) reads the first source.
        step = xp.where(new_f > 1.0, (old_f - 1.0) / xp.maximum(new_f - 1.0, 1.0), 0.0)
        positions = targets * step
        return xp.maximum(1.0 - xp.abs(positions[:, None] - sources[None, :]), 0.0)
    scale = old_f / new_f
    return antialiased_bicubic(((targets + 0.5) * scale)[:, None], scale, sources[None, :], xp)


def antialiased_bicubic(centres, scale, sources, xp=np):
    """The weights `[..., old]` of the `sources` (`[old]`, the source indices) that PyTorch's
    `F.interpolate(mode="bicubic", antialias=True, align_corners=False)` gives an output whose
    centre is at `centres` `[..., 1]` on the source axis (pixel edges at the integers) when the
    axis shrinks by `scale` (old / new, `[..., 1]` or a number): Keys' cubic with a = -0.5,
    widened by the scale when shrinking, renormalised where the border cuts it. Shared by
    `resize_matrix` (one scale per axis) and NaFlex (`keras_vit.native`: one per image)."""
    stretch = xp.maximum(scale, 1.0)  # shrinking widens the kernel (antialiasing)
    support = 2.0 * stretch
    # PyTorch's window: [floor(centre - support + 0.5), floor(centre + support + 0.5)).
    first = xp.floor(centres - support + 0.5)
    last = xp.floor(centres + support + 0.5)
    inside = xp.logical_and(sources >= first, sources < last)
    weights = _cubic(xp, (sources - centres + 0.5) / stretch)
    weights = xp.where(inside, weights, xp.zeros_like(weights))
    total = xp.sum(weights, axis=-1, keepdims=True)
    return weights / xp.where(total == 0.0, 1.0, total)


def resample_axis(array, new, axis, interpolation="bilinear", xp=np):
    """`array` resized along `axis` to `new` samples (see `resize_matrix`)."""
    old = array.shape[axis] if xp is np or array.shape[axis] is not None else ops.shape(array)[axis]
    if isinstance(old, int) and isinstance(new, (int, np.integer)) and old == new:
        return array
    matrix = resize_matrix(old, new, interpolation, xp)
    if xp is not np:
        matrix = ops.cast(matrix, array.dtype)
    moved = xp.moveaxis(array, axis, 0)
    resized = xp.tensordot(matrix, moved, axes=1)
    return xp.moveaxis(resized, 0, axis)


def resample_grid(grid, new_grid, interpolation="bilinear", xp=np):
    """A `[rows, columns, ...]` array resized to `new_grid` = (rows, columns)."""
    grid = resample_axis(grid, new_grid[0], 0, interpolation, xp)
    return resample_axis(grid, new_grid[1], 1, interpolation, xp)


def resize_position_embeddings(embeddings, new_grid, old_grid=None, num_prefix_tokens=1,
                               interpolation="bilinear"):
    """Resizes learned position embeddings to a new patch grid.

    The prefix rows (the class token's) are kept as they are; the grid rows are reshaped to
    `(old_rows, old_columns, D)` and resized, by default as the original code does
    ("bilinear", corners kept); "bicubic" gives timm's `resample_abs_pos_embed`.

    Args:
        embeddings: array `[1, prefix + old_rows * old_columns, D]` (or without the leading 1).
        new_grid: `(rows, columns)` of the target grid.
        old_grid: `(rows, columns)` of the source grid; None assumes a square grid.
        num_prefix_tokens: rows before the grid (1 for a class token, 0 for a GAP model).
        interpolation: "bilinear" or "bicubic".

    Returns:
        A float array `[1, prefix + rows * columns, D]` of the input's dtype.
    """
    check_interpolation(interpolation)
    embeddings = np.asarray(embeddings)
    squeezed = embeddings.ndim == 2
    if squeezed:
        embeddings = embeddings[None]
    if embeddings.ndim != 3 or embeddings.shape[0] != 1:
        raise ValueError(f"Expected embeddings of shape [1, tokens, D], got {embeddings.shape}.")
    prefix, grid = embeddings[0, :num_prefix_tokens], embeddings[0, num_prefix_tokens:]
    if old_grid is None:
        side = int(round(np.sqrt(len(grid))))
        if side * side != len(grid):
            raise ValueError(
                f"{len(grid)} grid positions do not form a square grid; pass old_grid.")
        old_grid = (side, side)
    old_rows, old_columns = old_grid
    if old_rows * old_columns != len(grid):
        raise ValueError(f"old_grid {old_grid} does not hold the {len(grid)} grid positions.")
    rows, columns = (int(side) for side in new_grid)
    grid = grid.reshape(old_rows, old_columns, -1).astype(np.float64)
    grid = resample_grid(grid, (rows, columns), interpolation)
    resized = np.concatenate([prefix, grid.reshape(rows * columns, -1).astype(embeddings.dtype)])
    return resized if squeezed else resized[None]


def resize_offset_table(table, new_positions, has_prefix_row, interpolation="bilinear", xp=np):
    """A relative-position table `[2n - 1 (+1), ...]` of the offsets -(n-1)..n-1 of an axis of
    n positions (then a row for pairs with a prefix token, kept as it is), resized to the
    offsets of `new_positions`."""
    offsets = table[:-1] if has_prefix_row else table
    resized = resample_axis(offsets, 2 * new_positions - 1, 0, interpolation, xp)
    return xp.concatenate([resized, table[-1:]], axis=0) if has_prefix_row else resized


def resize_patch_embedding(kernel, new_size, interpolation="bicubic", pseudo_inverse=True):
    """The patch-embedding kernel of trained weights for another patch size.

    Args:
        kernel: `[height, width, channels, D]` (Keras' layout, `embedding/kernel`).
        new_size: the new patch side, or (height, width).
        interpolation: the resize the pseudo-inverse inverts, "bicubic" (timm's default) or
            "bilinear".
        pseudo_inverse: True (FlexiViT's resize, equal to timm's `resample_patch_embed`); False
            resizes the kernel as an image, the naive baseline FlexiViT compares with.

    Returns:
        A float array `[new_height, new_width, channels, D]` of the kernel's dtype.
    """
    kernel = np.asarray(kernel)
    if kernel.ndim != 4:
        raise ValueError(f"kernel must be [height, width, channels, D], got shape {kernel.shape}.")
    new_size = (new_size, new_size) if np.ndim(new_size) == 0 else tuple(new_size)
    if len(new_size) != 2 or any(int(side) != side or side < 1 for side in new_size):
        raise ValueError(f"new_size must be a positive patch side or (height, width), got "
                         f"{new_size!r}.")
    new_size = tuple(int(side) for side in new_size)
    old_size = kernel.shape[:2]
    if new_size == old_size:
        return kernel
    # [new_h * new_w, old_h * old_w]: row-major patches, as the kernel's flattening.
    resize = np.kron(resize_matrix(old_size[0], new_size[0], interpolation),
                     resize_matrix(old_size[1], new_size[1], interpolation))
    matrix = np.linalg.pinv(resize).T if pseudo_inverse else resize
    flat = kernel.reshape(old_size[0] * old_size[1], -1).astype(np.float64)
    return (matrix @ flat).reshape(new_size + kernel.shape[2:]).astype(kernel.dtype)

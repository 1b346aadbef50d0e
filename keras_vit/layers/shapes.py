"""Shape helpers the layers share: a rank check with a message that names the layer, and the
sides of a patch grid, static or known only when the graph runs."""

import numpy as np
from keras import ops


def grid_sides(grid):
    """`(rows, columns)` of a patch grid `[batch, rows, columns, D]` (what `PatchEmbed` returns
    with `flatten=False`): Python ints where the shape is static, scalar tensors where the
    graph learns them only when it runs (a SavedModel of any image size)."""
    static = grid.shape[1:3]
    dynamic = ops.shape(grid)
    return tuple(int(side) if isinstance(side, (int, np.integer)) else dynamic[axis + 1]
                 for axis, side in enumerate(static))


def _check_rank(layer, shape, rank, what):
    if len(shape) != rank:
        raise ValueError(
            f"{layer.__class__.__name__} '{layer.name}' expects {what} of rank {rank}, "
            f"got shape {tuple(shape)}."
        )

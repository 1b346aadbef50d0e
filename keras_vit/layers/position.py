"""Where each token is: absolute position embeddings added to the tokens (`AddPositionEmbs`,
`sincos_2d`), rotary embeddings' angles for the queries and keys (`rope_angles`,
`MixedRopeFrequencies`, `rotate`), and relative positions as attention logits
(`RelativePositionBias`, `RelativePositionMlp`). Each is computed for the grid of the weights
or, in a model of any image size, for the grid the input has when it runs."""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.layers import resample
from keras_vit.layers.shapes import _check_rank, grid_sides


def _is_static(sides, expected):
    """Whether grid `sides` are known when the graph is built and are `expected` (the grid of
    the weights, which then need no resampling)."""
    return all(isinstance(side, int) for side in sides) and tuple(sides) == tuple(expected)


POSITION_EMBEDDINGS = ("learned", "learned_2d", "none", "sincos_2d")


def sincos_2d(rows, columns, width, temperature=10_000.0):
    """Fixed 2-D position embeddings of a `rows` x `columns` patch grid, `[rows * columns,
    width]` in row-major order: for each of width / 4 frequencies from 1 to 1 / temperature
    (geometric), the sine and the cosine of the column index, then of the row index
    (big_vision's `posemb_sincos_2d`, as MAE's)."""
    row = ops.broadcast_to(ops.arange(rows, dtype="float32")[:, None], (rows, columns))
    column = ops.broadcast_to(ops.arange(columns, dtype="float32")[None, :], (rows, columns))
    return sincos_at(ops.reshape(row, (-1,)), ops.reshape(column, (-1,)), width, temperature)


def sincos_at(rows, columns, width, temperature=10_000.0):
    """`[..., width]`: `sincos_2d`'s embedding of patches at float32 `rows`, `columns` (any
    shape, the same), wherever they lie: a grid's, or each image's own (keras_vit.native)."""
    quarter = width // 4
    omega = 1.0 / temperature ** (ops.arange(quarter, dtype="float32") / (quarter - 1))
    row, column = rows[..., None] * omega, columns[..., None] * omega
    return ops.concatenate([ops.sin(column), ops.cos(column), ops.sin(row), ops.cos(row)],
                           axis=-1)


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbs(keras.layers.Layer):
    """Adds position embeddings to a sequence of `prefix` tokens followed by a grid of patches.

    Args:
        grid_size: `(rows, columns)` of the patch grid.
        num_prefix_tokens: tokens before the grid (the class token and register tokens).
        kind: the paper's choices (appendix D.4):
            "learned": one learned D-vector per position, including the prefix tokens, weight
                `pos_embedding` of shape `(1, prefix + rows * columns, D)` as in the checkpoints;
            "learned_2d": learned row and column embeddings of size D/2 each, concatenated
                (`row_embedding`, `column_embedding`), plus `prefix_embedding` for prefix tokens;
            "none": nothing is added;
            "sincos_2d": fixed sines and cosines of each patch's row and column (`sincos_2d`),
                no weights, nothing for the prefix tokens; computed for any grid, so it is
                never resampled.
        interpolation: how the embeddings are resampled for another grid, "bilinear" (the
            original code's) or "bicubic" (timm's); see `keras_vit.layers.resample`.
        embed_prefix: False to add embeddings to the patches only (timm's `no_embed_class`):
            the weights have no rows for the prefix tokens, which pass unchanged.
        **kwargs: base `Layer` arguments.

    `call(tokens, grid=None)`: with `grid`, the patch grid `[batch, rows, columns, D]` of these
    tokens, the embeddings are resampled from `grid_size` to its size at call time (a model of
    any image size); without it the tokens must be of `grid_size`.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, kind="learned",
                 interpolation="bilinear", embed_prefix=True, **kwargs):
        # The embeddings are read in their own (float32) dtype and resampled in it; the sum
        # with the tokens is in theirs.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        if kind not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"Unknown position embedding {kind!r}; expected one of {POSITION_EMBEDDINGS}."
            )
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.kind = kind
        self.interpolation = resample.check_interpolation(interpolation)
        self.embed_prefix = bool(embed_prefix)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    @property
    def num_embedded_prefix(self):
        """Rows of the weights for prefix tokens: all of them, or none (`embed_prefix=False`)."""
        return self.num_prefix_tokens if self.embed_prefix else 0

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        hidden = self.hidden_size = input_shape[-1]
        init = keras.initializers.RandomNormal(stddev=0.02)
        if self.kind == "sincos_2d" and (hidden % 4 or hidden < 8):
            raise ValueError(f"sincos_2d position embeddings need a width that is a multiple of "
                             f"4, at least 8, got {hidden}.")
        if self.kind == "learned":
            rows = self.num_embedded_prefix + self.grid_size[0] * self.grid_size[1]
            self.pos_embedding = self.add_weight(
                name="pos_embedding", shape=(1, rows, hidden), initializer=init)
        elif self.kind == "learned_2d":
            if hidden % 2:
                raise ValueError(
                    f"learned_2d position embeddings need an even width, got {hidden}.")
            rows, columns = self.grid_size
            self.row_embedding = self.add_weight(
                name="row_embedding", shape=(rows, hidden // 2), initializer=init)
            self.column_embedding = self.add_weight(
                name="column_embedding", shape=(columns, hidden // 2), initializer=init)
            if self.num_embedded_prefix:
                self.prefix_embedding = self.add_weight(
                    name="prefix_embedding", shape=(self.num_embedded_prefix, hidden),
                    initializer=init)

    def embeddings(self, sides=None):
        """The `[1, tokens, D]` embeddings this layer adds (None for "none"), for its own grid
        or resampled to `sides` = (rows, columns)."""
        if self.kind == "none":
            return None
        sides = self.grid_size if sides is None else sides
        same = _is_static(sides, self.grid_size)
        rows, columns = sides
        prefix = self.num_embedded_prefix
        if self.kind == "sincos_2d":
            grid = sincos_2d(rows, columns, self.hidden_size)
            return ops.pad(grid, [(prefix, 0), (0, 0)])[None]  # nothing for the prefix
        if self.kind == "learned":
            if same:
                return self.pos_embedding
            grid = ops.reshape(self.pos_embedding[0, prefix:], self.grid_size + (-1,))
            grid = resample.resample_grid(grid, sides, self.interpolation, xp=ops)
            grid = ops.reshape(grid, (rows * columns, grid.shape[-1]))
            return ops.concatenate([self.pos_embedding[0, :prefix], grid], axis=0)[None]
        row_table, column_table = self.row_embedding, self.column_embedding
        if not same:
            row_table = resample.resample_axis(row_table, rows, 0, self.interpolation, xp=ops)
            column_table = resample.resample_axis(column_table, columns, 0, self.interpolation,
                                                  xp=ops)
        half = self.row_embedding.shape[-1]
        row = ops.broadcast_to(row_table[:, None, :], (rows, columns, half))
        column = ops.broadcast_to(column_table[None, :, :], (rows, columns, half))
        grid = ops.reshape(ops.concatenate([row, column], axis=-1), (rows * columns, 2 * half))
        if prefix:
            grid = ops.concatenate([self.prefix_embedding, grid], axis=0)
        return grid[None]

    def call(self, tokens, grid=None):
        if grid is None and tokens.shape[1] is not None and tokens.shape[1] != self.num_tokens:
            raise ValueError(
                f"Position embeddings were built for {self.num_tokens} tokens "
                f"({self.num_prefix_tokens} prefix + {self.grid_size[0]}x{self.grid_size[1]} "
                f"grid) but got {tokens.shape[1]}. Build the model for this image size, or "
                "with dynamic_image_size=True."
            )
        embeddings = self.embeddings(None if grid is None else grid_sides(grid))
        if embeddings is None:
            return tokens
        embeddings = ops.cast(embeddings, tokens.dtype)
        if self.num_prefix_tokens and not self.embed_prefix:
            # The prefix tokens pass unchanged (timm adds the embeddings before they join).
            prefix = self.num_prefix_tokens
            return ops.concatenate([tokens[:, :prefix], tokens[:, prefix:] + embeddings],
                                   axis=1)
        return tokens + embeddings

    def compute_output_spec(self, tokens, grid=None):
        return keras.KerasTensor(tokens.shape, dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens, "kind": self.kind,
                "interpolation": self.interpolation, "embed_prefix": self.embed_prefix}


def rope_angles(kind, sides, head_dim, temperature, reference_grid=None, grid_offset=0.0,
                xp=np):
    """Rotary embeddings' angles of a `rows` x `columns` patch grid, `[rows * columns,
    head_dim / 2]` in row-major order: for each of head_dim / 4 geometric frequencies, the
    patch's row coordinate times it, then its column coordinate times it (see
    `ViTConfig.rope`). Channel i of a query or key rotates with channel i + head_dim / 2 by
    angle i. In `xp`: NumPy (float64, for a grid known when the model is built) or
    `keras.ops` (float32, for the grid of the input at call time)."""
    rows, columns = sides
    quarter = head_dim // 4
    dtype = "float32" if xp is ops else "float64"
    frequencies = xp.arange(quarter, dtype=dtype) / quarter
    frequencies = 1.0 / xp.power(float(temperature), frequencies)

    def coordinates(count, reference):
        index = xp.arange(count, dtype=dtype)
        count = ops.cast(count, dtype) if xp is ops else float(count)
        if kind == "axial_normalized":  # the patch centres, scaled to [-1, 1]
            return 2.0 * (index + 0.5) / count - 1.0
        index = index + grid_offset
        return index if reference is None else index / count * reference

    if kind == "axial_normalized":
        frequencies = 2.0 * math.pi * frequencies
    reference = reference_grid or (None, None)
    row = coordinates(rows, reference[0])[:, None] * frequencies[None]  # [rows, quarter]
    column = coordinates(columns, reference[1])[:, None] * frequencies[None]
    row = xp.broadcast_to(row[:, None, :], (rows, columns, quarter))
    column = xp.broadcast_to(column[None, :, :], (rows, columns, quarter))
    return xp.reshape(xp.concatenate([row, column], axis=-1), (-1, 2 * quarter))


@keras.saving.register_keras_serializable(package="keras_vit")
class MixedRopeFrequencies(keras.layers.Layer):
    """RoPE-Mixed's learned frequencies (Heo et al., "Rotary Position Embedding for Vision
    Transformer", 2024): weight `frequencies` `[2, heads, head_dim / 2]`, each pair of channels'
    frequency along the rows and along the columns, initialised as theirs (magnitudes
    temperature^(-k/(head_dim/4)), turned by a random angle per head). A float32 layer under
    any policy: angles of tens of radians need its precision.

    `call(coordinates)`: the patches' (row, column) indices `[patches, 2]` to their angles
    `[patches, heads, head_dim / 2]`, row times the row frequency plus column times the column
    one.
    """

    def __init__(self, num_heads, head_dim, temperature=10.0, **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        self.num_heads, self.head_dim = int(num_heads), int(head_dim)
        self.temperature = float(temperature)

    def build(self, input_shape=None):
        self.frequencies = self.add_weight(
            name="frequencies", shape=(2, self.num_heads, self.head_dim // 2),
            initializer=self._initial_frequencies)

    def _initial_frequencies(self, shape, dtype=None):
        quarter = self.head_dim // 4
        magnitude = ops.convert_to_tensor(
            1.0 / self.temperature ** (np.arange(quarter) / quarter), "float32")
        turn = keras.random.uniform((self.num_heads, 1), 0.0, 2.0 * math.pi)
        rows = ops.concatenate([magnitude * ops.sin(turn), magnitude * ops.cos(turn)], axis=-1)
        columns = ops.concatenate([magnitude * ops.cos(turn), -magnitude * ops.sin(turn)],
                                  axis=-1)
        return ops.cast(ops.stack([rows, columns]), dtype or "float32")

    def call(self, coordinates):
        return (coordinates[:, 0, None, None] * self.frequencies[0][None]
                + coordinates[:, 1, None, None] * self.frequencies[1][None])

    def compute_output_shape(self, coordinates_shape):
        return (coordinates_shape[0], self.num_heads, self.head_dim // 2)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "head_dim": self.head_dim,
                "temperature": self.temperature}


def _patch_coordinates(sides):
    """The (row, column) index of each patch of a grid of `sides`, `[rows * columns, 2]`
    float32 in row-major order (NumPy where the sides are known, else `keras.ops`)."""
    rows, columns = sides
    xp = np if all(isinstance(side, int) for side in sides) else ops
    row = xp.repeat(xp.arange(rows, dtype="float32"), columns)
    column = xp.tile(xp.arange(columns, dtype="float32"), [rows])
    return xp.stack([row, column], axis=1)


def rotate(x, cos, sin):
    """`x` `[..., head_dim]` rotated by the angles whose cosines and sines are `cos` and `sin`
    `[..., head_dim / 2]`: channel i with channel i + head_dim / 2."""
    first, second = ops.split(x, 2, axis=-1)
    return ops.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


RELATIVE_POSITIONS = ("1d", "2d")


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionMlp(keras.layers.Layer):
    """Attention logits from the patches' offsets through a small MLP (Liu et al.'s Swin
    Transformer V2, 2022, continuous position bias; timm's `RelPosMlp` in its "cr" mode, as its
    `vit_relpos_*` models): each (row, column) offset between two patches, as
    sign(d) log(1 + |d|), goes through Dense(hidden, ReLU) and Dense(heads); the logit of a
    query and key is their offset's output, 0 for pairs with a prefix token. No dropout in its
    hidden layer (timm drops 12.5% there in training). Float32 inside, any image size.

    `call(queries, grid=None)`: queries `[batch, heads, tokens, head_dim]`, or the tokens
    `[batch, tokens, D]` of a model whose blocks share one MLP (`ViTConfig.relative_mlp_shared`)
    (their dtype only), `grid` as in `RelativePositionBias`; returns logits `[1, heads, tokens,
    tokens]`. Weights: `fc1`, `fc2` (kernel and bias each).
    """

    def __init__(self, grid_size, num_heads, num_prefix_tokens=0, hidden_dim=128, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_heads = int(num_heads)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.hidden_dim = int(hidden_dim)

    def build(self, queries_shape=None):
        self.fc1 = keras.layers.Dense(self.hidden_dim, activation="relu", name="fc1",
                                      dtype="float32")
        self.fc2 = keras.layers.Dense(self.num_heads, name="fc2", dtype="float32")
        self.fc1.build((None, 2))
        self.fc2.build((None, self.hidden_dim))

    @staticmethod
    def offsets(sides, xp=np):
        """(every (row, column) offset of a grid of `sides`, sign(d) log(1 + |d|),
        `[(2 rows - 1) * (2 columns - 1), 2]`; for each pair of patches, row-major, the row of
        their offset `[patches, patches]`)."""
        rows, columns = sides
        row_offsets = xp.arange(-(rows - 1), rows, dtype="float32")
        column_offsets = xp.arange(-(columns - 1), columns, dtype="float32")
        table = xp.stack([
            xp.reshape(xp.broadcast_to(row_offsets[:, None], (2 * rows - 1, 2 * columns - 1)),
                       (-1,)),
            xp.reshape(xp.broadcast_to(column_offsets[None], (2 * rows - 1, 2 * columns - 1)),
                       (-1,))], axis=1)
        table = xp.sign(table) * xp.log1p(xp.abs(table))
        patch = _patch_coordinates(sides)  # each patch's (row, column), as exact floats
        patch = ops.cast(patch, "int32") if xp is ops else patch.astype("int32")
        row, column = patch[:, 0], patch[:, 1]
        index = ((row[:, None] - row[None] + rows - 1) * (2 * columns - 1)
                 + column[:, None] - column[None] + columns - 1)
        return table, index

    def call(self, queries, grid=None):
        sides = self.grid_size if grid is None else grid_sides(grid)
        xp = np if all(isinstance(side, int) for side in sides) else ops
        table, index = self.offsets(sides, xp)
        logits = self.fc2(self.fc1(ops.convert_to_tensor(table, "float32")))  # [offsets, heads]
        patches = ops.shape(index)[0] if xp is ops else index.shape[0]
        bias = ops.take(logits, ops.reshape(index, (-1,)), axis=0)
        bias = ops.transpose(ops.reshape(bias, (patches, patches, self.num_heads)), (2, 0, 1))
        prefix = self.num_prefix_tokens
        bias = ops.pad(bias, ((0, 0), (prefix, 0), (prefix, 0)))
        return ops.cast(bias[None], queries.dtype)

    def compute_output_shape(self, queries_shape, grid_shape=None):
        return (1, self.num_heads, queries_shape[-2], queries_shape[-2])

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_heads": self.num_heads, "num_prefix_tokens": self.num_prefix_tokens,
                "hidden_dim": self.hidden_dim}


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionBias(keras.layers.Layer):
    """Attention logits from relative positions (paper appendix D.4).

    Every (query, key) pair of patches has an offset: `p_q - p_k` along the flattened patch
    sequence ("1d"), or the row offset and the column offset ("2d", their two logits summed).
    Each offset has a learned embedding per head. A second attention, of the queries against
    these embeddings as keys, gives logits `q . r[p_q - p_k]` that the attention adds to its
    content logits before the softmax. Pairs with a prefix (class) token, which has no
    position, use one more learned embedding of their own per axis.

    Args:
        grid_size: `(rows, columns)` of the patch grid.
        num_heads: attention heads.
        num_prefix_tokens: tokens before the grid (1 with a class token, else 0).
        kind: "1d" (one table of `2 * rows * columns - 1` offsets) or "2d" (tables of
            `2 * rows - 1` row offsets and `2 * columns - 1` column offsets).
        interpolation: how the tables are resampled along their offsets for another grid
            ("bilinear" or "bicubic", see `keras_vit.layers.resample`); the prefix row is kept.
        **kwargs: base `Layer` arguments.

    `call(queries, grid=None)`: with `grid`, the patch grid `[batch, rows, columns, D]`, the
    offsets are those of its size (a model of any image size).

    Input: queries `[batch, heads, tokens, head_dim]`. Output: logits
    `[batch, heads, tokens, tokens]`. Weights: `offset_embedding` ("1d"), or
    `row_offset_embedding` and `column_offset_embedding` ("2d"), each
    `[offsets (+1 with prefix tokens), heads, head_dim]`.
    """

    def __init__(self, grid_size, num_heads, num_prefix_tokens=1, kind="1d",
                 interpolation="bilinear", **kwargs):
        kwargs.setdefault("autocast", False)  # tables resampled in float32, then cast
        super().__init__(**kwargs)
        if kind not in RELATIVE_POSITIONS:
            raise ValueError(f"Unknown relative position kind {kind!r}; expected one of "
                             f"{RELATIVE_POSITIONS}.")
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_heads = int(num_heads)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.kind = kind
        self.interpolation = resample.check_interpolation(interpolation)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def _axes(self, sides, xp=np):
        """(coordinate of every patch along each axis, positions on the axis), for a grid of
        `sides` = (rows, columns), in `xp` (NumPy, or `keras.ops` for sides known at run time).
        """
        rows, columns = sides
        index = xp.arange(rows * columns)
        if self.kind == "1d":
            return [(index, rows * columns)]
        return [(index // columns, rows), (index % columns, columns)]

    def offset_indices(self, sides=None, xp=np):
        """Per axis, `[tokens, tokens]` rows into its table: `c_q - c_k + n - 1` between
        patches, and the last row, `2n - 1`, for pairs with a prefix token."""
        indices = []
        prefix = self.num_prefix_tokens
        for coordinate, positions in self._axes(sides or self.grid_size, xp):
            index = coordinate[:, None] - coordinate[None, :] + positions - 1
            index = xp.pad(index, ((prefix, 0), (prefix, 0)),
                           constant_values=2 * positions - 1)
            indices.append(xp.cast(index, "int32") if xp is ops else index.astype("int32"))
        return indices

    def build(self, queries_shape):
        _check_rank(self, queries_shape, 4, "queries [batch, heads, tokens, head_dim]")
        if queries_shape[1] != self.num_heads or queries_shape[2] not in (None, self.num_tokens):
            raise ValueError(
                f"RelativePositionBias '{self.name}' was set up for {self.num_heads} heads and "
                f"{self.num_tokens} tokens ({self.num_prefix_tokens} prefix + "
                f"{self.grid_size[0]}x{self.grid_size[1]} grid), got queries of shape "
                f"{tuple(queries_shape)}.")
        head_dim = queries_shape[-1]
        init = keras.initializers.RandomNormal(stddev=0.02)
        extra = int(self.num_prefix_tokens > 0)
        names = (["offset_embedding"] if self.kind == "1d"
                 else ["row_offset_embedding", "column_offset_embedding"])
        self.tables = [
            self.add_weight(name=name, shape=(2 * positions - 1 + extra, self.num_heads,
                                              head_dim), initializer=init)
            for name, (_, positions) in zip(names, self._axes(self.grid_size))
        ]

    def call(self, queries, grid=None):
        sides = self.grid_size if grid is None else grid_sides(grid)
        # Constant indices for the grid of the weights (or any static grid); computed in the
        # graph only where the grid is known when it runs.
        static = all(isinstance(side, int) for side in sides)
        xp = np if static else ops
        tables = [ops.convert_to_tensor(table) for table in self.tables]
        if not _is_static(sides, self.grid_size):
            tables = [resample.resize_offset_table(table, positions, self.num_prefix_tokens > 0,
                                                   self.interpolation, xp=ops)
                      for table, (_, positions) in zip(tables, self._axes(sides, xp))]
        tables = [ops.cast(table, queries.dtype) for table in tables]
        batch = ops.shape(queries)[0]
        tokens = self.num_prefix_tokens + sides[0] * sides[1]
        bias = None
        for table, index in zip(tables, self.offset_indices(sides, xp)):
            size = table.shape[0] if table.shape[0] is not None else ops.shape(table)[0]
            keys = ops.transpose(table, (1, 2, 0))  # [heads, dim, size]
            logits = ops.matmul(queries, keys)  # [batch, heads, tokens, size]: every offset
            # Pick, for query q and key k, the logit of their offset: one gather on the
            # flattened (query, offset) axis with indices q * size + index[q, k].
            logits = ops.reshape(logits, (batch, self.num_heads, tokens * size))
            flat = index + xp.arange(tokens, dtype="int32")[:, None] * size
            picked = ops.take(logits, flat, axis=2)
            bias = picked if bias is None else bias + picked
        return bias

    def compute_output_shape(self, queries_shape, grid_shape=None):
        tokens = self.num_tokens if grid_shape is None else queries_shape[2]
        return (queries_shape[0], self.num_heads, tokens, tokens)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_heads": self.num_heads, "num_prefix_tokens": self.num_prefix_tokens,
                "kind": self.kind, "interpolation": self.interpolation}

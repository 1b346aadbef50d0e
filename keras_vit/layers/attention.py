"""Multi-head self-attention, and how it runs: the explicit ops (logits, softmax, weighted sum)
or one fused kernel (`keras.ops.dot_product_attention`), as `attention_impl` says and where
the kernel is faster (`fused_by_default`)."""

import functools
import math

import keras
import numpy as np
from keras import ops

from keras_vit.layers import resample
from keras_vit.architecture.execution import ATTENTION_IMPLS
from keras_vit.layers.normalization import RMSNorm, make_norm
from keras_vit.layers.position import (MixedRopeFrequencies, RelativePositionBias,
                                       RelativePositionMlp, _patch_coordinates, rope_angles,
                                       rotate)
from keras_vit.layers.shapes import _check_rank, grid_sides
from keras_vit.architecture.spec import ROPE_TEMPERATURES


def _xavier_uniform_flat(fan_in, fan_out):
    """Xavier-uniform on the flattened (fan_in, fan_out) matrix, for any kernel shape."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


def _attention_output_spec(layer, x, return_attention_scores):
    """Symbolic outputs of a layer that returns tokens and optionally attention weights."""
    output = keras.KerasTensor(x.shape, dtype=layer.compute_dtype)
    if not return_attention_scores:
        return output
    tokens = x.shape[1]
    scores = keras.KerasTensor((x.shape[0], layer.num_heads, tokens, tokens),
                               dtype=layer.compute_dtype)
    return output, scores


def _attention_impl(value):
    if value not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {value!r}.")
    return value


def _fused(attention_impl, dropout, training, return_attention_scores):
    """Whether attention runs fused (`keras.ops.dot_product_attention`): as `attention_impl`
    says, "auto" meaning where a fused kernel is faster (`fused_by_default`); never where the
    weights are returned or dropped out."""
    if return_attention_scores or (training and dropout):
        return False
    if attention_impl == "auto":
        return fused_by_default()
    return attention_impl == "fused"


@functools.cache
def fused_by_default():
    """What attention_impl="auto" means in this process: fused on PyTorch (its
    `scaled_dot_product_attention` beat the explicit ops on CPU too: B/16 inference 4.73 against
    4.42 images/s, 2-core AMD EPYC) and on JAX's GPUs and TPUs (cuDNN flash and Pallas splash
    attention), explicit on JAX's CPU (XLA's reference attention: 10.62 against 11.14 images/s,
    same CPU) and on TensorFlow (no fused kernel; Keras' einsum form of it is slower)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() != "cpu"
    return backend == "torch"


@functools.cache
def odd_lengths_refused():
    """Whether the fused kernel cannot be trained on an odd number of tokens: cuDNN's flash
    attention, Keras' kernel on JAX's GPUs. JAX's gradient rule for it refuses odd lengths
    whenever there is a bias, and counts an absent one as present (jax 0.11,
    `_dot_product_attention_fwd_rule`), so ViT's 197 tokens fall back to XLA's attention, or,
    under remat in `lax.scan`, where Keras' fallback cannot catch the refusal, end the step."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    return jax.default_backend() == "gpu"


def _padded_to_even(query, key, value):
    """Fused attention over one more (zero) token that no query attends to, cut off again: an
    even length, which cuDNN's flash attention trains, for the price of one token."""
    tokens = query.shape[1]
    padded = [ops.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0))) for x in (query, key, value)]
    keep = np.ones((1, 1, tokens + 1, tokens + 1), bool)
    keep[..., tokens] = False  # no query sees the padding key
    attended = ops.dot_product_attention(*padded, mask=keep, scale=1.0)
    return attended[:, :tokens]


def keys_mask(attention_mask):
    """`attention_mask` as the `[batch, 1, queries or 1, keys]` booleans attention takes: which
    keys each query may see, from a mask of the keys `[batch, keys]` (padding left out) or of
    each query's keys `[batch, queries, keys]` (images packed in one sequence)."""
    mask = ops.cast(attention_mask, "bool")
    if len(mask.shape) not in (2, 3):
        raise ValueError(f"attention_mask must be [batch, keys] or [batch, queries, keys], got "
                         f"shape {tuple(mask.shape)}.")
    return mask[:, None, None, :] if len(mask.shape) == 2 else mask[:, None]


def masked_logits(logits, mask):
    """`logits` where `mask` allows, a large negative number elsewhere (not -inf: a query
    that sees no key, a padding token's, then averages the values instead of giving NaN)."""
    lowest = -6.0e4 if keras.backend.standardize_dtype(logits.dtype) == "float16" else -1.0e9
    return ops.where(mask, logits, ops.cast(lowest, logits.dtype))


def weighted_then_normalised(logits, value):
    """`softmax(logits) @ value` as `(exp(logits - max) @ value) / sum(exp(logits - max))`:
    the same in exact arithmetic (float32 rounding apart), with the division on `[..., queries,
    head_dim]` instead of every weight `[..., queries, keys]`, and no normalised weights kept
    for the gradient. Masked (NaFlex) attention runs it: XLA on CPU made two more passes over
    the weights for the softmax's division (one a broadcast of the sums), and a packed step's
    128-long sequences have 1.25x the weights of padding's 64-long ones (training step 1.16x
    to 1.28x faster packed, 1.06x padded, JAX on 2 loaded AMD EPYC cores)."""
    top = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True))  # (no effect on the value)
    weights = ops.exp(logits - top)
    return ops.matmul(weights, value) / ops.sum(weights, axis=-1, keepdims=True)


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head scaled dot-product self-attention, as in the paper's equations 5 to 8.

    Weights: `query`, `key`, `value` and `out` dense layers on the flattened `(D, D)` shape
    (the checkpoints store them as `(D, heads, D/heads)`; loading reshapes). The call fuses the
    query, key and value projections into one matmul.

    Args:
        num_heads: attention heads; must divide the input width.
        dropout: dropout on the attention weights.
        relative_position: None, or "1d" / "2d" to add relative position logits (appendix
            D.4) from a `RelativePositionBias` sub-layer named `relative_position`, or "mlp"
            for a `RelativePositionMlp` of `relative_mlp_dim` hidden units.
        grid_size: `(rows, columns)` of the patch grid; needed with `relative_position`.
        num_prefix_tokens: tokens before the grid; used with `relative_position`.
        interpolation: how the relative tables are resampled for another grid.
        qkv_bias: biases in the query, key and value projections (the original has them).
        rope, rope_temperature, rope_reference_grid, rope_grid_offset: rotary embeddings of
            the patches' queries and keys (None: none, the original), see `ViTConfig.rope`;
            with `grid_size` and `num_prefix_tokens`.
        inner_norm_epsilon: None, or the epsilon of a LayerNorm (`inner_norm`) of the heads'
            concatenated outputs before the output projection (`ViTConfig.attention_inner_norm`).
        num_kv_heads: None (num_heads), or fewer key and value heads, each shared by a group
            of num_heads / num_kv_heads consecutive query heads (`ViTConfig.num_kv_heads`):
            `key` and `value` are num_kv_heads * head_dim wide.
        qk_norm_epsilon: None, or the epsilon of norms of each head's queries (`query_norm`)
            and keys (`key_norm`) before rotary embeddings (`ViTConfig.qk_norm`).
        norm_layer: the kind of the inner and qk norms (`ViTConfig.norm_layer`).
        proj_bias: a bias in the output projection (`ViTConfig.proj_bias`).
        differential_lambda_init: None (softmax attention), or differential attention's
            lambda_init (`ViTConfig.attention_layer`, 0.8 - 0.6 exp(-0.3 i) in block i): the
            queries and keys of each head in two halves, whose softmax maps are subtracted,
            the second times lambda (weights `lambda_q1`, `lambda_k1`, `lambda_q2`,
            `lambda_k2`), then each head's output RMS-normed (`sub_norm`) and scaled by
            1 - lambda_init, as timm's `DiffAttention`.
        attention_impl: "fused" (`keras.ops.dot_product_attention`, relative logits as its
            bias), "explicit" (logits, softmax, weighted sum) or "auto" (fused where that is
            faster: PyTorch, JAX's GPUs and TPUs); the weights, when returned, and dropout on
            them in training always take the explicit path. How the layer runs, not what it
            computes: left out of its config (`keras_vit.architecture.execution`).
        **kwargs: base `Layer` arguments.

    `call(x, training, return_attention_scores=False, grid=None, attention_mask=None,
    relative_bias=None)` returns `[batch, tokens, D]`, and with `return_attention_scores=True`
    also the weights `[batch, heads, tokens, tokens]`; `grid` (the patch grid of these tokens)
    tells relative and rotary positions the grid at call time; `attention_mask` (`keys_mask`)
    the keys each query sees; `relative_bias` `[1, heads, tokens, tokens]`, logits added as
    the layer's own relative positions would be (one MLP's for every block:
    `ViTConfig.relative_mlp_shared`).
    """

    def __init__(self, num_heads, dropout=0.0, relative_position=None, grid_size=None,
                 num_prefix_tokens=0, interpolation="bilinear", qkv_bias=True,
                 attention_impl="auto", rope=None, rope_temperature=None,
                 rope_reference_grid=None, rope_grid_offset=0.0, inner_norm_epsilon=None,
                 relative_mlp_dim=None, num_kv_heads=None, qk_norm_epsilon=None,
                 norm_layer="layer_norm", proj_bias=True, differential_lambda_init=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.proj_bias = bool(proj_bias)
        self.differential_lambda_init = (None if differential_lambda_init is None
                                         else float(differential_lambda_init))
        if self.differential_lambda_init is not None and (
                rope is not None or relative_position is not None
                or num_kv_heads not in (None, num_heads)):
            raise ValueError("Differential attention takes no rope, relative_position or "
                             "num_kv_heads (timm's DiffAttention has none of them).")
        self.num_heads = int(num_heads)
        self.num_kv_heads = self.num_heads if num_kv_heads is None else int(num_kv_heads)
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads!r} must divide num_heads="
                             f"{self.num_heads} (each key and value head serves an equal group "
                             "of query heads).")
        if rope == "mixed" and self.num_kv_heads != self.num_heads:
            raise ValueError("rope 'mixed' learns frequencies for each query head, which "
                             "grouped keys do not have: use num_kv_heads=None with it.")
        self.qk_norm_epsilon = None if qk_norm_epsilon is None else float(qk_norm_epsilon)
        self.norm_layer = norm_layer
        self.qkv_bias = bool(qkv_bias)
        self.dropout = float(dropout)
        self.attention_impl = _attention_impl(attention_impl)
        if (relative_position is not None or rope is not None) and grid_size is None:
            raise ValueError("relative_position and rope need the grid_size (rows, columns) "
                             "of the patch grid.")
        if rope is not None and rope not in ROPE_TEMPERATURES:
            raise ValueError(f"Unknown rope {rope!r}; expected None or one of "
                             f"{tuple(ROPE_TEMPERATURES)}.")
        self.rope = rope
        self.rope_temperature = (None if rope is None else
                                 float(rope_temperature or ROPE_TEMPERATURES[rope]))
        self.rope_reference_grid = (None if rope_reference_grid is None
                                    else tuple(int(g) for g in rope_reference_grid))
        self.rope_grid_offset = float(rope_grid_offset)
        self.relative_mlp_dim = None if relative_mlp_dim is None else int(relative_mlp_dim)
        self.inner_norm_epsilon = (None if inner_norm_epsilon is None
                                   else float(inner_norm_epsilon))
        self.relative_position = relative_position
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = resample.check_interpolation(interpolation)

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        hidden = input_shape[-1]
        if hidden % self.num_heads:
            raise ValueError(
                f"Hidden size {hidden} is not divisible by num_heads={self.num_heads}; "
                f"choose num_heads among the divisors of {hidden}."
            )
        self.head_dim = hidden // self.num_heads
        differential = self.differential_lambda_init is not None
        if differential and self.head_dim % 2:
            raise ValueError(f"Differential attention splits each head's queries and keys in "
                             f"two halves; its heads of {self.head_dim} channels (hidden "
                             f"{hidden} / {self.num_heads} heads) must be even.")
        # Differential attention's queries and keys: twice the heads, each half as wide.
        self.qk_head_dim = self.head_dim // 2 if differential else self.head_dim
        kernel_init = _xavier_uniform_flat(hidden, hidden)

        def dense(name, use_bias=True, width=hidden):
            layer = keras.layers.Dense(width, kernel_initializer=kernel_init, name=name,
                                       use_bias=use_bias, dtype=self.dtype_policy)
            layer.build(input_shape)
            return layer

        self.query = dense("query", self.qkv_bias)
        self.key, self.value = (dense(n, self.qkv_bias, self.num_kv_heads * self.head_dim)
                                for n in ("key", "value"))
        self.out = dense("out", self.proj_bias)
        self.inner_norm = None
        if self.inner_norm_epsilon is not None:
            self.inner_norm = make_norm(self.norm_layer, self.inner_norm_epsilon,
                                        name="inner_norm", dtype=self.dtype_policy)
            self.inner_norm.build(input_shape)
        self.query_norm = self.key_norm = None
        if self.qk_norm_epsilon is not None:  # over each head's channels
            self.query_norm, self.key_norm = (
                make_norm(self.norm_layer, self.qk_norm_epsilon, name=name,
                          dtype=self.dtype_policy) for name in ("query_norm", "key_norm"))
            for norm in (self.query_norm, self.key_norm):
                norm.build((None, self.qk_head_dim))
        self.sub_norm = None
        if differential:  # timm's: lambda's vectors N(0, 0.1), an RmsNorm of epsilon 1e-5
            self.lambdas = [self.add_weight(
                name=name, shape=(self.qk_head_dim,),
                initializer=keras.initializers.RandomNormal(stddev=0.1))
                for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
            self.sub_norm = RMSNorm(1e-5, name="sub_norm", dtype=self.dtype_policy)
            self.sub_norm.build((None, self.head_dim))
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.rope_frequencies = None
        if self.rope == "mixed":
            self.rope_frequencies = MixedRopeFrequencies(
                self.num_heads, self.head_dim, self.rope_temperature, name="rope")
            self.rope_frequencies.build()
        self.relative = None
        if self.relative_position == "mlp":
            self.relative = RelativePositionMlp(
                self.grid_size, self.num_heads, self.num_prefix_tokens,
                hidden_dim=self.relative_mlp_dim, name="relative_position",
                dtype=self.dtype_policy)
            self.relative.build()
        elif self.relative_position is not None:
            self.relative = RelativePositionBias(
                self.grid_size, self.num_heads, self.num_prefix_tokens,
                kind=self.relative_position, interpolation=self.interpolation,
                name="relative_position", dtype=self.dtype_policy)
            self.relative.build((input_shape[0], self.num_heads, input_shape[1], self.head_dim))

    def call(self, x, training=False, return_attention_scores=False, grid=None,
             attention_mask=None, relative_bias=None):
        batch, tokens, hidden = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        heads, head_dim = self.num_heads, self.head_dim
        # One (D, 3D) matmul on 2-D rows instead of three, with the 1/sqrt(head_dim) scale of
        # the queries folded into their kernel and bias: fewer passes over the activations
        # (after their norm instead, with qk_norm, which would undo it).
        scale = 1.0 / math.sqrt(self.qk_head_dim)
        folded = scale if self.query_norm is None else 1.0
        kernel = ops.concatenate(
            [self.query.kernel * folded, self.key.kernel, self.value.kernel], axis=1)
        qkv = ops.matmul(ops.reshape(x, (-1, hidden)), ops.cast(kernel, x.dtype))
        if self.qkv_bias:
            bias = ops.concatenate([self.query.bias * folded, self.key.bias, self.value.bias],
                                   axis=0)
            qkv = ops.add(qkv, ops.cast(bias, x.dtype))  # ops.add: a BiasAdd that fuses on TF
        mask = None if attention_mask is None else keys_mask(attention_mask)
        if self.sub_norm is not None:
            return self._differential(qkv, batch, tokens, scale, training,
                                      return_attention_scores, mask)
        if self.num_kv_heads == heads and self.query_norm is None:
            qkv = ops.reshape(qkv, (batch, tokens, 3, heads, head_dim))
        else:
            qkv = self._normed_and_grouped(qkv, batch, tokens, scale)
        if self.rope is not None:
            qkv = self._rotated(qkv, grid)
        if _fused(self.attention_impl, self.dropout, training, return_attention_scores):
            attended = self._fused_attention(qkv, grid, training, mask, relative_bias)
            return ops.reshape(self._project(attended), (batch, tokens, hidden))
        qkv = ops.transpose(qkv, (2, 0, 3, 1, 4))  # [3, batch, heads, tokens, head_dim]
        # Unstacked, not indexed: each slice's gradient would be a zero-filled copy of all of
        # qkv, summed (S/16 trains 1.17x faster without XLA this way; the same with XLA).
        query, key, value = ops.unstack(qkv, 3, axis=0)
        logits = ops.matmul(query, ops.transpose(key, (0, 1, 3, 2)))
        if self.relative is not None:  # the (scaled) queries against the offset embeddings
            logits = logits + self.relative(query, grid=grid)
        if relative_bias is not None:
            logits = logits + ops.cast(relative_bias, logits.dtype)
        if mask is not None:
            logits = masked_logits(logits, mask)
        # float32 only: under mixed precision the softmax keeps its bfloat16 rounding (the
        # other form is as accurate there, 0.8% of the largest either way, but not the same).
        if (mask is not None and not return_attention_scores and not (training and self.dropout)
                and keras.backend.standardize_dtype(logits.dtype) == "float32"):
            attended = weighted_then_normalised(logits, value)
            attended = ops.reshape(ops.transpose(attended, (0, 2, 1, 3)), (-1, hidden))
            return ops.reshape(self._project(attended), (batch, tokens, hidden))
        # Softmax in the compute dtype, as the original. TensorFlow's CPU kernel accumulates
        # bfloat16 in float32: its output equals a float32 softmax rounded to bfloat16.
        weights = ops.softmax(logits, axis=-1)
        attended = ops.matmul(self.attention_dropout(weights, training=training), value)
        attended = ops.reshape(ops.transpose(attended, (0, 2, 1, 3)), (-1, hidden))
        output = ops.reshape(self._project(attended), (batch, tokens, hidden))
        if return_attention_scores:
            return output, weights
        return output

    def _normed_and_grouped(self, qkv, batch, tokens, scale):
        """The projections `[batch * tokens, (heads + 2 kv_heads) head_dim]` as `[batch,
        tokens, 3, heads, head_dim]`: queries and keys normed per head (qk_norm), then the
        queries scaled; each key and value head repeated for its group of query heads, head h
        reading kv head h // group (timm's AttentionRope: `repeat_interleave` on the heads,
        after its norms and RoPE, which act on each head alike)."""
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        query, key, value = ops.split(
            qkv, [heads * head_dim, (heads + kv_heads) * head_dim], axis=-1)
        query = ops.reshape(query, (batch, tokens, heads, head_dim))
        key, value = (ops.reshape(t, (batch, tokens, kv_heads, head_dim)) for t in (key, value))
        if self.query_norm is not None:
            query = self.query_norm(query) * ops.cast(scale, query.dtype)
            key = self.key_norm(key)
        if kv_heads != heads:
            key, value = (ops.repeat(t, heads // kv_heads, axis=2) for t in (key, value))
        return ops.stack([query, key, value], axis=2)

    def _project(self, attended):
        """The heads' concatenated outputs `[batch * tokens, D]` through the output
        projection (after `inner_norm`, if any)."""
        if self.inner_norm is not None:
            attended = self.inner_norm(attended)
        return self.out(attended)

    def _rotated(self, qkv, grid):
        """`qkv` `[batch, tokens, 3, heads, head_dim]` with the patches' queries and keys
        rotated by their rows and columns; the prefix tokens keep theirs (angle 0)."""
        sides = self.grid_size if grid is None else grid_sides(grid)
        if self.rope_frequencies is not None:  # learned: [patches, heads, head_dim / 2]
            xp = ops
            angles = self.rope_frequencies(_patch_coordinates(sides))
        else:  # fixed: [patches, 1, head_dim / 2], constants where the grid is known
            xp = np if all(isinstance(side, int) for side in sides) else ops
            angles = rope_angles(self.rope, sides, self.head_dim, self.rope_temperature,
                                 self.rope_reference_grid, self.rope_grid_offset, xp=xp)
            angles = angles[:, None, :]
        angles = xp.pad(angles, ((self.num_prefix_tokens, 0), (0, 0), (0, 0)))
        cos = ops.cast(xp.cos(angles), qkv.dtype)  # [tokens, heads or 1, head_dim / 2]
        sin = ops.cast(xp.sin(angles), qkv.dtype)
        query, key, value = ops.unstack(qkv, 3, axis=2)
        return ops.stack([rotate(query, cos, sin), rotate(key, cos, sin), value], axis=2)

    def _fused_attention(self, qkv, grid, training, mask=None, relative_bias=None):
        """`[batch * tokens, D]` attended values of `qkv` `[batch, tokens, 3, heads,
        head_dim]` (queries scaled) by `keras.ops.dot_product_attention`, which never returns
        the score matrix (and on GPUs and TPUs, on JAX, never forms it whole); `mask` as
        `keys_mask` gives it."""
        query, key, value = ops.unstack(qkv, 3, axis=2)  # [batch, tokens, heads, head_dim]
        bias = None
        if self.relative is not None:  # the relative logits, [batch, heads, tokens, tokens]
            bias = self.relative(ops.transpose(query, (0, 2, 1, 3)), grid=grid)
        elif relative_bias is not None:
            bias = ops.cast(relative_bias, query.dtype)
        attended = _fused_kernel(query, key, value, bias, mask, training)
        return ops.reshape(attended, (-1, qkv.shape[-1] * self.num_heads))

    def _differential(self, qkv, batch, tokens, scale, training, return_attention_scores,
                      mask):
        """Differential attention (timm's `DiffAttention`) of the projections `[batch *
        tokens, 3 D]` (queries scaled unless qk_norm): the output `[batch, tokens, D]`, and
        with `return_attention_scores` each head's weights, the difference of its two maps
        `[batch, heads, tokens, tokens]`. Sub-heads 2h and 2h + 1 of the queries and keys
        (each head_dim / 2 wide) are head h's two halves, as timm pairs them."""
        heads, half, hidden = self.num_heads, self.qk_head_dim, self.head_dim * self.num_heads
        query, key, value = ops.split(qkv, 3, axis=-1)
        query, key = (ops.reshape(t, (batch, tokens, 2 * heads, half)) for t in (query, key))
        if self.query_norm is not None:
            query = self.query_norm(query) * ops.cast(scale, query.dtype)
            key = self.key_norm(key)
        value = ops.reshape(value, (batch, tokens, heads, self.head_dim))
        lam = self._lambda(query.dtype)
        if _fused(self.attention_impl, self.dropout, training, return_attention_scores):
            # Each half's map through the fused kernel, then the difference of the outputs.
            # The kernels take values as wide as the keys (JAX's, cuDNN's): each head's values
            # as two heads of half its channels, its queries and keys repeated for both.
            (q1, q2), (k1, k2) = (ops.unstack(ops.reshape(t, (batch, tokens, heads, 2, half)),
                                              2, axis=3) for t in (query, key))
            halves = ops.reshape(value, (batch, tokens, 2 * heads, half))

            def attend(q, k):
                return _fused_kernel(ops.repeat(q, 2, axis=2), ops.repeat(k, 2, axis=2),
                                     halves, None, mask, training)

            attended = ops.reshape(attend(q1, k1) - lam * attend(q2, k2),
                                   (batch, tokens, heads, self.head_dim))
            weights = None
        else:
            logits = ops.matmul(ops.transpose(query, (0, 2, 1, 3)),
                                ops.transpose(key, (0, 2, 3, 1)))  # [batch, 2 heads, q, k]
            if mask is not None:
                logits = masked_logits(logits, mask)
            maps = self.attention_dropout(ops.softmax(logits, axis=-1), training=training)
            first, second = ops.unstack(ops.reshape(maps, (batch, heads, 2, tokens, tokens)),
                                        2, axis=2)
            weights = first - lam * second
            attended = ops.transpose(ops.matmul(weights, ops.transpose(value, (0, 2, 1, 3))),
                                     (0, 2, 1, 3))  # [batch, tokens, heads, head_dim]
        attended = self.sub_norm(attended) * ops.cast(1.0 - self.differential_lambda_init,
                                                      attended.dtype)
        output = ops.reshape(self._project(ops.reshape(attended, (-1, hidden))),
                             (batch, tokens, hidden))
        return (output, weights) if return_attention_scores else output

    def _lambda(self, dtype):
        """lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, in
        float32 (as timm), then in `dtype`."""
        q1, k1, q2, k2 = (ops.cast(weight, "float32") for weight in self.lambdas)
        lam = (ops.exp(ops.sum(q1 * k1)) - ops.exp(ops.sum(q2 * k2))
               + self.differential_lambda_init)
        return ops.cast(lam, dtype)

    def compute_output_spec(self, x, training=False, return_attention_scores=False, grid=None,
                            attention_mask=None, relative_bias=None):
        return _attention_output_spec(self, x, return_attention_scores)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "dropout": self.dropout,
                "relative_position": self.relative_position, "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens,
                "interpolation": self.interpolation, "qkv_bias": self.qkv_bias,
                "rope": self.rope,
                "rope_temperature": self.rope_temperature,
                "rope_reference_grid": self.rope_reference_grid,
                "rope_grid_offset": self.rope_grid_offset,
                "inner_norm_epsilon": self.inner_norm_epsilon,
                "relative_mlp_dim": self.relative_mlp_dim,
                **({} if self.num_kv_heads == self.num_heads else
                   {"num_kv_heads": self.num_kv_heads}),  # files of other models unchanged
                **({} if self.qk_norm_epsilon is None else
                   {"qk_norm_epsilon": self.qk_norm_epsilon}),
                **({} if self.norm_layer == "layer_norm" else {"norm_layer": self.norm_layer}),
                **({} if self.proj_bias else {"proj_bias": False}),
                **({} if self.differential_lambda_init is None else
                   {"differential_lambda_init": self.differential_lambda_init})}


def _fused_kernel(query, key, value, bias, mask, training):
    """`keras.ops.dot_product_attention` of `[batch, tokens, heads, head_dim]` queries (scaled),
    keys and values, with `bias` (relative logits) and `mask` (`keys_mask`): `[batch, tokens,
    heads, head_dim]`."""
    tokens = query.shape[1]
    plain = bias is None and mask is None
    if plain and training and tokens and tokens % 2 and odd_lengths_refused():
        return _padded_to_even(query, key, value)
    # With a bias, XLA's kernel: Keras' TPU kernel (splash attention) takes none.
    if mask is not None:  # as a bias: one kernel form on every backend
        bias = masked_logits(ops.zeros((), query.dtype) if bias is None else bias, mask)
    return ops.dot_product_attention(query, key, value, bias=bias, scale=1.0,
                                     flash_attention=False if bias is not None else None)

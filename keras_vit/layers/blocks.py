"""The encoder block and its parts: the MLP, stochastic depth (`DropPath`), `LayerScale`, the
pre-norm residual block around the attention (`EncoderBlock`, with rematerialisation in
training) and Axial-ViT's block, whose attention runs along one axis of the patch grid."""

import keras
from keras import ops

from keras_vit.layers import fusion, resample
from keras_vit.layers.attention import (MultiHeadSelfAttention, _attention_impl,
                                        _attention_output_spec)
from keras_vit.layers.normalization import make_norm
from keras_vit.layers.shapes import _check_rank, grid_sides
from keras_vit.architecture.spec import ACTIVATIONS, LAYER_NORM_EPSILON


def _activation(activation, approximate_gelu=None):
    """The MLP activation's name, also from `approximate_gelu` (a bool, what layers saved
    before `activation` existed have instead)."""
    if approximate_gelu is not None:
        implied = "gelu_tanh" if approximate_gelu else "gelu"
        if activation not in ("gelu_tanh", implied):  # "gelu_tanh": activation's default
            raise ValueError(f"approximate_gelu={approximate_gelu} and activation="
                             f"{activation!r} disagree; give activation alone.")
        activation = implied
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}.")
    return activation


class _SeedStream:
    """Seeds for a random layer from one seed tensor and a stream number, drawn in turn with no
    state to update: the k-th draw is `seed + (stream, k)` (`EncoderBlock._rematerialized`)."""

    def __init__(self, seed, stream):
        self.seed, self.stream, self.drawn = seed, stream, 0

    def next(self, ordered=True):
        del ordered
        self.drawn += 1
        return ops.add(self.seed, ops.convert_to_tensor([self.stream, self.drawn],
                                                        dtype=self.seed.dtype))


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops the whole residual branch of a sample with probability `rate`.

    Kept samples are scaled by `1 / (1 - rate)`, so inference needs no change.

    Args:
        rate: probability of dropping a sample's branch during training.
        seed: optional integer seed.
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"DropPath rate must be in [0, 1), got {rate}.")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if rate > 0 else None

    def call(self, inputs, training=False):
        if not training or self.rate == 0.0:
            return inputs
        keep = 1.0 - self.rate
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        noise = keras.random.uniform(shape, seed=self.seed_generator, dtype=inputs.dtype)
        mask = ops.cast(noise < keep, inputs.dtype)
        return inputs * mask / ops.cast(keep, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """Multiplies its input by a learned per-channel `scale` that starts at `init_value`
    (Touvron et al., "Going deeper with Image Transformers", 2021; timm's `LayerScale`)."""

    def __init__(self, init_value, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale", shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.init_value))

    def call(self, x):
        return x * ops.cast(self.scale, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}


def _activated(x, kind):
    """The MLP's activation `kind`: "gelu_tanh", "gelu" or "quick_gelu"."""
    if kind == "quick_gelu":
        return x * ops.sigmoid(1.702 * x)
    return ops.gelu(x, approximate=kind == "gelu_tanh")


@keras.saving.register_keras_serializable(package="keras_vit")
class MlpBlock(keras.layers.Layer):
    """Dense(mlp_dim) -> GELU -> Dropout -> Dense(D) -> Dropout (weights `Dense_0`, `Dense_1`);
    with SwiGLU, SiLU(Gate_0(x)) * Dense_0(x) in place of GELU(Dense_0(x)).

    Args:
        mlp_dim: hidden size of the MLP.
        dropout: dropout rate after each dense layer.
        activation: "gelu_tanh" (the original's tanh-approximate GELU), "gelu" (exact),
            "quick_gelu" (OpenAI CLIP's x * sigmoid(1.702 x)) or "swiglu" (a gated SiLU with a
            second input projection, `Gate_0`, as timm's `SwiGLU`: `fc1_g`, `fc1_x`).
        inner_norm_epsilon: None, or the epsilon of a LayerNorm (`inner_norm`) of the hidden
            units before `Dense_1` (`ViTConfig.mlp_inner_norm`).
        approximate_gelu: what layers saved before `activation` have instead: True for
            "gelu_tanh", False for "gelu".
        norm_layer: the inner norm's kind (`ViTConfig.norm_layer`).
        use_bias: biases in the dense layers (`ViTConfig.proj_bias`).
        **kwargs: base `Layer` arguments.
    """

    def __init__(self, mlp_dim, dropout=0.0, activation="gelu_tanh", approximate_gelu=None,
                 inner_norm_epsilon=None, norm_layer="layer_norm", use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.use_bias = bool(use_bias)
        self.norm_layer = norm_layer
        self.mlp_dim = int(mlp_dim)
        self.inner_norm_epsilon = (None if inner_norm_epsilon is None
                                   else float(inner_norm_epsilon))
        self.dropout = float(dropout)
        self.activation = _activation(activation, approximate_gelu)

    def build(self, input_shape):
        hidden = input_shape[-1]
        bias_init = keras.initializers.RandomNormal(stddev=1e-6)
        self.dense_0 = keras.layers.Dense(
            self.mlp_dim, kernel_initializer="glorot_uniform", bias_initializer=bias_init,
            use_bias=self.use_bias, name="Dense_0", dtype=self.dtype_policy)
        self.dense_1 = keras.layers.Dense(
            hidden, kernel_initializer="glorot_uniform", bias_initializer=bias_init,
            use_bias=self.use_bias, name="Dense_1", dtype=self.dtype_policy)
        self.dense_0.build(input_shape)
        self.gate = None
        if self.activation == "swiglu":  # apart from Dense_0, so that both shard alike
            self.gate = keras.layers.Dense(
                self.mlp_dim, kernel_initializer="glorot_uniform", bias_initializer=bias_init,
                use_bias=self.use_bias, name="Gate_0", dtype=self.dtype_policy)
            self.gate.build(input_shape)
        hidden_shape = tuple(input_shape[:-1]) + (self.mlp_dim,)
        self.dense_1.build(hidden_shape)
        self.inner_norm = None
        if self.inner_norm_epsilon is not None:
            self.inner_norm = make_norm(self.norm_layer, self.inner_norm_epsilon,
                                        name="inner_norm", dtype=self.dtype_policy)
            self.inner_norm.build(hidden_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def call(self, x, training=False):
        shape = ops.shape(x)
        x = ops.reshape(x, (-1, x.shape[-1]))  # 2-D matmuls are the fastest on CPU
        if self.gate is not None:
            # SiLU as x * sigmoid(x): TensorFlow's silu op has a custom gradient that a
            # SavedModel cannot hold.
            gate = self.gate(x)
            x = gate * ops.sigmoid(gate) * self.dense_0(x)
        else:
            x = self._gelu(self.dense_0(x), training)
        x = self.dropout_layer(x, training=training)
        if self.inner_norm is not None:
            x = self.inner_norm(x)
        x = self.dropout_layer(self.dense_1(x), training=training)
        return ops.reshape(x, shape)

    def _gelu(self, x, training):
        # In training on TensorFlow, forward and backward as one XLA computation each (fusion).
        activate = fusion.for_training(_activated, training, kind=self.activation)
        if training and self.compute_dtype != "float32":
            # Training under a 16-bit policy: GELU in float32, which is also the more accurate.
            # TensorFlow's CPU kernels run its element-wise ops and their gradients faster in
            # float32 than in bfloat16 (ViT-S/16's bfloat16 training step: 1.09x keras-hub's
            # with it, 0.99x without; benchmarks/train_step.py). Not in inference, where
            # TensorFlow fuses the bfloat16 GELU into the matmul before it and a cast between
            # them would prevent that.
            return ops.cast(activate(ops.cast(x, "float32")), self.compute_dtype)
        return activate(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {**super().get_config(), "mlp_dim": self.mlp_dim, "dropout": self.dropout,
                  "activation": self.activation}
        if self.inner_norm_epsilon is not None:  # files of other models unchanged
            config["inner_norm_epsilon"] = self.inner_norm_epsilon
        if self.norm_layer != "layer_norm":
            config["norm_layer"] = self.norm_layer
        if not self.use_bias:
            config["use_bias"] = False
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class EncoderBlock(keras.layers.Layer):
    """One pre-norm transformer block (paper equations 2 and 3):

        x = x + DropPath(Dropout(MSA(LN(x))))
        x = x + DropPath(MLP(LN(x)))

    Sub-layers are named as in the checkpoints: `LayerNorm_0`, `MultiHeadDotProductAttention_1`,
    `LayerNorm_2`, `MlpBlock_3`.

    Args:
        num_heads: attention heads.
        mlp_dim: hidden size of the MLP.
        dropout: dropout after the attention and inside the MLP.
        attention_dropout: dropout on the attention weights.
        drop_path_rate: stochastic-depth rate of this block.
        activation, approximate_gelu: the MLP's activation, see `MlpBlock`.
        layer_norm_epsilon: of the two LayerNorms (the original's 1e-6).
        relative_position, grid_size, num_prefix_tokens, interpolation, relative_mlp_dim:
            relative position logits in the attention, see `MultiHeadSelfAttention` (None:
            none, the original).
        qkv_bias: biases in the query, key and value projections.
        rope, rope_temperature, rope_reference_grid, rope_grid_offset: rotary embeddings in
            the attention, see `MultiHeadSelfAttention` (None: none, the original).
        mlp_inner_norm, attention_inner_norm: LayerNorms inside the MLP and the attention
            (`ViTConfig.mlp_inner_norm`, `attention_inner_norm`).
        residual_post_norm: True to norm each branch's output (x + LN(branch(x))) instead of
            its input (`ViTConfig.residual_post_norm`).
        attention_impl: how the attention is computed, see `MultiHeadSelfAttention`.
        remat: True to keep, in training, only the block's input for the backward pass,
            which computes the block again (see `_rematerialized`). This and `attention_impl`
            are how the block runs, left out of its config (`keras_vit.architecture.execution`).
        layer_scale_init: None (the original), or LayerScale's initial value: each residual
            branch is multiplied by a learned per-channel scale (`layer_scale_0` after the
            attention, `layer_scale_1` after the MLP).
        norm_layer: the kind of every norm of the block ("layer_norm" or "rms_norm":
            `ViTConfig.norm_layer`).
        qk_norm: norms of each head's queries and keys (`ViTConfig.qk_norm`).
        num_kv_heads: None, or the key and value heads of grouped-query attention
            (`ViTConfig.num_kv_heads`, this block's).
        proj_bias: biases in the attention's output projection and the MLP
            (`ViTConfig.proj_bias`).
        differential_lambda_init: None, or differential attention's lambda_init in this block
            (`ViTConfig.attention_layer`, see `MultiHeadSelfAttention`).
        parallel: True for a parallel block (`ViTConfig.parallel_blocks`): the attention and
            the MLP side by side on one norm, `x + DropPath(LayerScale(MSA(LN(x)) +
            MLP(LN(x))))`, without `LayerNorm_2` and `layer_scale_1`.
        **kwargs: base `Layer` arguments.

    `call(x, training, return_attention_scores=False, grid=None, attention_mask=None,
    relative_bias=None)`: with `return_attention_scores=True` returns `(x, attention_weights)`
    with weights `[batch, heads, tokens, tokens]`. `grid`, the patch grid `[batch, rows,
    columns, D]` of the tokens, gives relative positions (and Axial-ViT) the grid at call time;
    `attention_mask` the keys each token attends to (`keras_vit.layers.attention.keys_mask`):
    padding and packed images (native resolution); `relative_bias` the logits of a
    relative-position MLP that the blocks share (`ViTConfig.relative_mlp_shared`).
    """

    def __init__(self, num_heads, mlp_dim, dropout=0.0, attention_dropout=0.0,
                 drop_path_rate=0.0, activation="gelu_tanh", relative_position=None,
                 grid_size=None, num_prefix_tokens=0, layer_norm_epsilon=LAYER_NORM_EPSILON,
                 interpolation="bilinear", qkv_bias=True, layer_scale_init=None,
                 approximate_gelu=None, attention_impl="auto", remat=False, rope=None,
                 rope_temperature=None, rope_reference_grid=None, rope_grid_offset=0.0,
                 mlp_inner_norm=False, attention_inner_norm=False, relative_mlp_dim=None,
                 residual_post_norm=False, norm_layer="layer_norm", qk_norm=False,
                 num_kv_heads=None, proj_bias=True, differential_lambda_init=None,
                 parallel=False, **kwargs):
        super().__init__(**kwargs)
        self.proj_bias = bool(proj_bias)
        self.differential_lambda_init = (None if differential_lambda_init is None
                                         else float(differential_lambda_init))
        self.parallel = bool(parallel)
        if self.parallel and residual_post_norm:
            raise ValueError("A parallel block norms its input once for both branches: it "
                             "takes no residual_post_norm.")
        self.residual_post_norm = bool(residual_post_norm)
        self.norm_layer = norm_layer
        self.qk_norm = bool(qk_norm)
        self.num_kv_heads = None if num_kv_heads is None else int(num_kv_heads)
        self.relative_mlp_dim = None if relative_mlp_dim is None else int(relative_mlp_dim)
        self.rope_options = {"rope": rope, "rope_temperature": rope_temperature,
                             "rope_reference_grid": rope_reference_grid,
                             "rope_grid_offset": rope_grid_offset}
        self.mlp_inner_norm = bool(mlp_inner_norm)
        self.attention_inner_norm = bool(attention_inner_norm)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.attention_impl = _attention_impl(attention_impl)
        self.remat = bool(remat)
        self.dropout = float(dropout)
        self.attention_dropout = float(attention_dropout)
        self.drop_path_rate = float(drop_path_rate)
        self.activation = _activation(activation, approximate_gelu)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.relative_position = relative_position
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = resample.check_interpolation(interpolation)
        self.qkv_bias = bool(qkv_bias)
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        # While attention_model() runs the model: a function that takes each call's weights.
        self.attention_recorder = None

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        policy = self.dtype_policy
        self.norm_0 = make_norm(self.norm_layer, self.layer_norm_epsilon, name="LayerNorm_0",
                                dtype=policy)
        self.attention = MultiHeadSelfAttention(
            self.num_heads, dropout=self.attention_dropout,
            relative_position=self.relative_position, grid_size=self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens, interpolation=self.interpolation,
            qkv_bias=self.qkv_bias, attention_impl=self.attention_impl, **self.rope_options,
            inner_norm_epsilon=self.layer_norm_epsilon if self.attention_inner_norm else None,
            relative_mlp_dim=self.relative_mlp_dim, num_kv_heads=self.num_kv_heads,
            qk_norm_epsilon=self.layer_norm_epsilon if self.qk_norm else None,
            norm_layer=self.norm_layer, proj_bias=self.proj_bias,
            differential_lambda_init=self.differential_lambda_init,
            name="MultiHeadDotProductAttention_1", dtype=policy)
        self.norm_2 = None if self.parallel else make_norm(
            self.norm_layer, self.layer_norm_epsilon, name="LayerNorm_2", dtype=policy)
        self.mlp = MlpBlock(self.mlp_dim, dropout=self.dropout, activation=self.activation,
                            inner_norm_epsilon=(self.layer_norm_epsilon if self.mlp_inner_norm
                                                else None),
                            norm_layer=self.norm_layer, use_bias=self.proj_bias,
                            name="MlpBlock_3", dtype=policy)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=policy)
        self.drop_path = DropPath(self.drop_path_rate, dtype=policy)
        self.layer_scales = [None, None]
        if self.layer_scale_init is not None:
            # A parallel block scales the sum of its branches: one LayerScale.
            self.layer_scales = [LayerScale(self.layer_scale_init, name=f"layer_scale_{index}",
                                            dtype=policy) if index == 0 or not self.parallel
                                 else None for index in range(2)]
            for layer in self.layer_scales:
                if layer is not None:
                    layer.build(input_shape)
        for layer in (self.norm_0, self.norm_2, self.mlp):
            if layer is not None:
                layer.build(input_shape)
        self.attention.build(self.attention_input_shape(input_shape))

    def attention_input_shape(self, input_shape):
        """The shape the attention sees (the token sequence here; rows or columns in axial)."""
        return input_shape

    def attend(self, x, training, return_attention_scores, grid, attention_mask=None,
               relative_bias=None):
        """Self-attention over the (normalised) tokens `x` of the patch grid `grid`."""
        return self.attention(x, training=training,
                              return_attention_scores=return_attention_scores, grid=grid,
                              attention_mask=attention_mask, relative_bias=relative_bias)

    def call(self, x, training=False, return_attention_scores=False, grid=None,
             attention_mask=None, relative_bias=None):
        # Remat serves a backward pass, so only training: an inference graph (an export's
        # SavedModel or TFLite file) must not carry its custom gradient.
        if (self.remat and training and not return_attention_scores
                and self.attention_recorder is None):
            return self._rematerialized(x, training, grid, attention_mask, relative_bias)
        return self._forward(x, training, return_attention_scores, grid, attention_mask,
                             relative_bias)

    def _rematerialized(self, x, training, grid, attention_mask=None, relative_bias=None):
        """The block through `keras.remat`, so that the backward pass computes its activations
        again instead of keeping them. Keras' own `RematScope` cannot do this here: the block's
        random layers would update their seed generators inside the recomputed function (on
        JAX a tracer that escapes it, on TensorFlow other masks the second time). So in
        training one seed is drawn outside, and each random layer draws from it without state,
        the same in the forward pass and in its recomputation."""
        random = [layer for layer in (self.attention.attention_dropout, self.dropout_layer,
                                      self.mlp.dropout_layer, self.drop_path)
                  if training and getattr(layer, "seed_generator", None) is not None]
        seed = random[0].seed_generator.next() if random else None

        def forward(tokens, *bias):
            for stream, layer in enumerate(random, 1):  # (an attribute of the generator, not
                layer.seed_generator.next = _SeedStream(seed, stream).next  # of the layer)
            try:
                return self._forward(tokens, training, False, grid, attention_mask, *bias)
            finally:
                for layer in random:
                    del layer.seed_generator.next

        # A shared relative bias goes in as an input, not a closure: its MLP's gradient must
        # flow back through the recomputation.
        return keras.remat(forward)(x, *([] if relative_bias is None else [relative_bias]))

    def _forward(self, x, training, return_attention_scores, grid, attention_mask=None,
                 relative_bias=None):
        record = self.attention_recorder is not None
        post_norm = self.residual_post_norm  # x + LN(branch(x)), not x + branch(LN(x))
        normed = x if post_norm else self.norm_0(x)
        attended = self.attend(normed, training, return_attention_scores or record, grid,
                               attention_mask, relative_bias)
        if return_attention_scores or record:
            attended, weights = attended
            if record:
                self.attention_recorder(weights)
        attended = self.dropout_layer(attended, training=training)
        if self.parallel:  # both branches from the one norm, one residual sum
            branches = attended + self.mlp(normed, training=training)
            x = x + self.drop_path(self._scaled(0, branches), training=training)
            return (x, weights) if return_attention_scores else x
        if post_norm:
            attended = self.norm_0(attended)
        x = x + self.drop_path(self._scaled(0, attended), training=training)
        if post_norm:
            mlp = self.norm_2(self.mlp(x, training=training))
        else:
            mlp = self.mlp(self.norm_2(x), training=training)
        x = x + self.drop_path(self._scaled(1, mlp), training=training)
        if return_attention_scores:
            return x, weights
        return x

    def _scaled(self, branch, x):
        layer = self.layer_scales[branch]
        return x if layer is None else layer(x)

    def compute_output_spec(self, x, training=False, return_attention_scores=False, grid=None,
                            attention_mask=None, relative_bias=None):
        return _attention_output_spec(self, x, return_attention_scores)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "dropout": self.dropout, "attention_dropout": self.attention_dropout,
                "drop_path_rate": self.drop_path_rate, "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "relative_position": self.relative_position, "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens,
                "interpolation": self.interpolation, "qkv_bias": self.qkv_bias,
                "layer_scale_init": self.layer_scale_init, **self.rope_options,
                "mlp_inner_norm": self.mlp_inner_norm,
                "attention_inner_norm": self.attention_inner_norm,
                "relative_mlp_dim": self.relative_mlp_dim,
                "residual_post_norm": self.residual_post_norm, "norm_layer": self.norm_layer,
                "qk_norm": self.qk_norm, "num_kv_heads": self.num_kv_heads,
                "differential_lambda_init": self.differential_lambda_init,
                "parallel": self.parallel,
                **({} if self.proj_bias else {"proj_bias": False})}


AXES = ("row", "column")


@keras.saving.register_keras_serializable(package="keras_vit")
class AxialEncoderBlock(EncoderBlock):
    """An Axial-ViT block (paper appendix D.6): an `EncoderBlock` whose self-attention runs
    along one axis of the patch grid, within each row (`axis="row"`) or within each column
    (`axis="column"`), followed by its own MLP. Axial-ViT replaces every ViT block by a row
    block and a column block.

    Args:
        axis: "row" or "column".
        grid_size: `(rows, columns)` of the patch grid; the tokens are that grid, flattened
            row major, with no class token.
        **kwargs: the arguments of `EncoderBlock` (relative positions excepted).

    With `return_attention_scores=True` the weights are returned as the equivalent full
    `[batch, heads, tokens, tokens]` matrix (zero between tokens of different rows, resp.
    columns), so attention rollout and attention distance apply unchanged.
    """

    def __init__(self, axis, grid_size, **kwargs):
        if kwargs.get("relative_position") is not None:
            raise ValueError("AxialEncoderBlock does not take relative_position.")
        kwargs.pop("num_prefix_tokens", None)
        super().__init__(grid_size=grid_size, num_prefix_tokens=0, **kwargs)
        if axis not in AXES:
            raise ValueError(f"axis must be one of {AXES}, got {axis!r}.")
        self.axis = axis

    def attention_input_shape(self, input_shape):
        rows, columns = self.grid_size
        if input_shape[1] not in (None, rows * columns):
            raise ValueError(
                f"AxialEncoderBlock '{self.name}' was set up for a {rows}x{columns} grid "
                f"({rows * columns} tokens, no class token), got {input_shape[1]} tokens.")
        lines, length = (rows, columns) if self.axis == "row" else (columns, rows)
        batch = None if input_shape[0] is None else input_shape[0] * lines
        return (batch, length, input_shape[-1])

    def attend(self, x, training, return_attention_scores, grid, attention_mask=None,
               relative_bias=None):  # (never given: the spec has no relative Axial-ViT)
        if attention_mask is not None:
            raise ValueError(f"AxialEncoderBlock '{self.name}' takes no attention_mask: an "
                             "Axial-ViT attends within whole rows and columns of one image.")
        rows, columns = self.grid_size if grid is None else grid_sides(grid)
        batch, hidden = ops.shape(x)[0], x.shape[-1]
        cells = ops.reshape(x, (batch, rows, columns, hidden))
        if self.axis == "column":
            cells = ops.transpose(cells, (0, 2, 1, 3))
        lines, length = (rows, columns) if self.axis == "row" else (columns, rows)
        attended = self.attention(ops.reshape(cells, (-1, length, hidden)), training=training,
                                  return_attention_scores=return_attention_scores)
        if return_attention_scores:
            attended, weights = attended
        attended = ops.reshape(attended, (batch, lines, length, hidden))
        if self.axis == "column":
            attended = ops.transpose(attended, (0, 2, 1, 3))
        attended = ops.reshape(attended, (batch, rows * columns, hidden))
        if not return_attention_scores:
            return attended
        return attended, self._full_weights(weights, batch, (rows, columns))

    def _full_weights(self, weights, batch, sides):
        """`[batch * lines, heads, length, length]` as `[batch, heads, tokens, tokens]`."""
        rows, columns = sides
        lines, length = (rows, columns) if self.axis == "row" else (columns, rows)
        weights = ops.reshape(weights, (batch, lines, self.num_heads, length, length))
        same_line = ops.eye(lines, dtype=weights.dtype)
        # row: [b, row, h, col, col'] x [row, row'] -> [b, h, row, col, row', col']
        if self.axis == "row":
            full = ops.einsum("brhcd,rs->bhrcsd", weights, same_line)
        else:  # [b, col, h, row, row'] x [col, col'] -> [b, h, row, col, row', col']
            full = ops.einsum("bchrs,cd->bhrcsd", weights, same_line)
        tokens = rows * columns
        return ops.reshape(full, (batch, self.num_heads, tokens, tokens))

    def get_config(self):
        config = super().get_config()
        for key in ("relative_position", "num_prefix_tokens"):
            config.pop(key)
        return {**config, "axis": self.axis}

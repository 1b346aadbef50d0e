"""The encoder's tokens to one vector for the head: one token, their mean, or both
(`TokenPooling`), or a learned query's attention over them (`AttentionPooling`, "map")."""

import math

import keras
from keras import ops

from keras_vit.layers.attention import (_attention_impl, _fused, _xavier_uniform_flat,
                                        keys_mask, masked_logits)
from keras_vit.layers.blocks import MlpBlock, _activation
from keras_vit.layers.normalization import make_norm
from keras_vit.layers.shapes import _check_rank
from keras_vit.architecture.spec import CLASSIFIERS, LAYER_NORM_EPSILON


POOLINGS = tuple(kind for kind in CLASSIFIERS if kind != "map")


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Reduces `[batch, tokens, D]` to `[batch, D]`: one token ("token": the class token, or
    the token at `token_index`, 1 for DeiT's distillation token), the mean of the patch
    tokens ("gap"), or both side by side, `[batch, 2 D]` ("token_gap", DINOv2's).

    Args:
        classifier: "token", "gap" or "token_gap".
        num_prefix_tokens: tokens before the patches (register tokens), left out of the mean.
        token_index: the token "token" reads.

    `call(tokens, token_mask=None)`: `token_mask` `[batch, tokens]` (True for a token, False
    for padding) leaves the padding out of the mean; `[batch, slots, tokens]` averages each
    slot's tokens (the images packed in one sequence; "gap" only) into `[batch, slots, D]`.
    """

    def __init__(self, classifier="token", num_prefix_tokens=0, token_index=0, **kwargs):
        super().__init__(**kwargs)
        if classifier not in POOLINGS:
            raise ValueError(f"classifier must be {' or '.join(map(repr, POOLINGS))}, got "
                             f"{classifier!r} (attention pooling is AttentionPooling).")
        self.classifier = classifier
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.token_index = int(token_index)

    def call(self, tokens, token_mask=None):
        if self.classifier == "token":
            return tokens[:, self.token_index]
        patches = tokens
        if self.num_prefix_tokens:  # registers (no slice otherwise: the same graph as before)
            patches = tokens[:, self.num_prefix_tokens:]
        if token_mask is None:
            mean = ops.mean(patches, axis=1)
        elif len(token_mask.shape) == 3:  # per slot: [batch, slots, tokens] x [batch, tokens, D]
            if self.classifier != "gap":
                raise ValueError(f"TokenPooling {self.name!r} pools packed images with "
                                 f"classifier 'gap' only, not {self.classifier!r}.")
            weights = ops.cast(token_mask[:, :, self.num_prefix_tokens:], patches.dtype)
            return ops.matmul(weights, patches) / ops.maximum(
                ops.sum(weights, axis=-1, keepdims=True), ops.cast(1, patches.dtype))
        else:
            weights = ops.cast(token_mask[:, self.num_prefix_tokens:, None], patches.dtype)
            mean = ops.sum(patches * weights, axis=1) / ops.maximum(
                ops.sum(weights, axis=1), ops.cast(1, patches.dtype))
        if self.classifier == "token_gap":
            return ops.concatenate([tokens[:, self.token_index], mean], axis=-1)
        return mean

    def compute_output_shape(self, input_shape):
        width = input_shape[-1] * (2 if self.classifier == "token_gap" else 1)
        return (input_shape[0], width)

    def get_config(self):
        config = {**super().get_config(), "classifier": self.classifier,
                  "num_prefix_tokens": self.num_prefix_tokens}
        if self.token_index:  # files of other models unchanged
            config["token_index"] = self.token_index
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPooling(keras.layers.Layer):
    """Multihead attention pooling, "map" (Zhai et al., "Scaling Vision Transformers", 2022;
    big_vision's `MAPHead`, timm's `AttentionPoolLatent`): a learned query, `probe`, attends to
    the patch tokens; a LayerNorm and an MLP follow, with a residual connection (none with
    `mlp_dim` 0: AIMv2's `Aimv2AttentionPoolingHead`, the attention's output alone).

    Args:
        num_heads: attention heads.
        mlp_dim: hidden size of the MLP; 0 for no LayerNorm and MLP.
        num_prefix_tokens: tokens before the patches (class, registers), not attended to.
        layer_norm_epsilon, activation, attention_impl, norm_layer: as the encoder blocks'.

    `[batch, tokens, D]` -> `[batch, D]`; `call(tokens, token_mask=None)`: the probe attends
    to no token where `token_mask` `[batch, tokens]` is False (padding); a `token_mask` `[batch,
    slots, tokens]` pools each slot's tokens (the images packed in one sequence) into `[batch,
    slots, D]`. Weights `probe` `(1, 1, D)`, `query`, `key`, `value`, `out` (D, D),
    `LayerNorm_0`, `MlpBlock_0`.
    """

    def __init__(self, num_heads, mlp_dim, num_prefix_tokens=0,
                 layer_norm_epsilon=LAYER_NORM_EPSILON, activation="gelu_tanh",
                 attention_impl="auto", norm_layer="layer_norm", **kwargs):
        super().__init__(**kwargs)
        self.norm_layer = norm_layer
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.attention_impl = _attention_impl(attention_impl)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation = _activation(activation)

    def build(self, input_shape):
        _check_rank(self, input_shape, 3, "tokens [batch, tokens, hidden]")
        hidden = input_shape[-1]
        self.head_dim = hidden // self.num_heads
        policy = self.dtype_policy
        self.probe = self.add_weight(name="probe", shape=(1, 1, hidden),
                                     initializer=keras.initializers.GlorotUniform())
        self.query, self.key, self.value, self.out = (
            keras.layers.Dense(hidden, kernel_initializer=_xavier_uniform_flat(hidden, hidden),
                               name=name, dtype=policy)
            for name in ("query", "key", "value", "out"))
        for layer in (self.query, self.key, self.value, self.out):
            layer.build(input_shape)
        self.norm = self.mlp = None
        if self.mlp_dim:
            self.norm = make_norm(self.norm_layer, self.layer_norm_epsilon, name="LayerNorm_0",
                                  dtype=policy)
            self.mlp = MlpBlock(self.mlp_dim, activation=self.activation, name="MlpBlock_0",
                                dtype=policy)
            self.norm.build((None, 1, hidden))
            self.mlp.build((None, 1, hidden))

    def call(self, tokens, token_mask=None):
        tokens = tokens[:, self.num_prefix_tokens:]
        mask = None
        if token_mask is not None:
            mask = keys_mask(token_mask[:, self.num_prefix_tokens:])
        batch, hidden = ops.shape(tokens)[0], tokens.shape[-1]
        heads, head_dim = self.num_heads, self.head_dim
        per_slot = mask is not None and len(token_mask.shape) == 3
        slots = token_mask.shape[1] if per_slot else 1

        def split_heads(x):  # [b, n, D] -> [b, n, heads, head_dim]
            return ops.reshape(x, (ops.shape(x)[0], -1, heads, head_dim))

        probe = ops.cast(self.probe, tokens.dtype)
        if per_slot or _fused(self.attention_impl, 0.0, False, False):  # a query per image
            probe = ops.broadcast_to(probe, (batch, slots, hidden))
        query = split_heads(self.query(probe))
        query = query * ops.cast(1.0 / math.sqrt(head_dim), query.dtype)
        keys, values = split_heads(self.key(tokens)), split_heads(self.value(tokens))
        if _fused(self.attention_impl, 0.0, False, False):
            bias = None if mask is None else masked_logits(ops.zeros((), query.dtype), mask)
            pooled = ops.dot_product_attention(query, keys, values, bias=bias, scale=1.0)
        else:
            query, keys, values = (ops.transpose(x, (0, 2, 1, 3)) for x in (query, keys, values))
            logits = ops.matmul(query, ops.transpose(keys, (0, 1, 3, 2)))
            if mask is not None:
                logits = masked_logits(logits, mask)
            weights = ops.softmax(logits, axis=-1)
            pooled = ops.transpose(ops.matmul(weights, values), (0, 2, 1, 3))
        # pooled: [b, slots, heads, d]
        pooled = self.out(ops.reshape(pooled, (batch, slots, hidden)))
        if self.mlp is not None:
            pooled = pooled + self.mlp(self.norm(pooled))
        return pooled if per_slot else pooled[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "num_prefix_tokens": self.num_prefix_tokens,
                "layer_norm_epsilon": self.layer_norm_epsilon, "activation": self.activation,
                **({} if self.norm_layer == "layer_norm" else {"norm_layer": self.norm_layer})}

"""LoRA (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models") on a keras_vit
model: each encoder block's attention (query, key, value, out) and MLP kernels W become
W + (alpha / rank) A B, with Keras' own `Dense.enable_lora` (A from He's uniform, B zeros, so
the model starts as it was; float32 adapters), and every other weight but the heads is frozen.

    keras_vit.lora.enable(model, rank=8)           # then compile and fit: adapters and heads train
    plain = keras_vit.lora.merged(model)           # the same outputs, no adapters: for export

The head is every classifier layer of the model (`HEADS`): `head`, and `head_dist` beside it in
a model with DeiT's distillation token (which a distilling run trains on the teacher): the
layers that map the pooled representation to logits, which a fine-tuning run starts from zeros
for its classes (`keras_vit.weights.checkpoint`'s new head). What comes before them is the encoder's
and frozen: an attention-pooling head (`MAPHead_0`), `fc_norm` (trained with `train_norms`) and the
tanh `pre_logits` layer of a spec with `representation_size`, which a checkpoint gives.

The attention reads its query, key and value kernels as one concatenated matrix; Keras' LoRA
`Dense.kernel` is the sum above, so the fused matmul stays one matmul. A `.keras` file of an
adapted model holds the merged kernels (Keras' `Dense.save_own_variables` merges them), and
`keras_vit.weights.checkpoint` reads and writes the merged weights too.
"""

import keras

from keras_vit import layers as vit_layers
from keras_vit.architecture import variants
from keras_vit.model import classic_model

ADAPTER_NAMES = ("lora_kernel_a", "lora_kernel_b")
# The classifier layers a model may have, all trained under LoRA (see the module's docstring).
HEADS = ("head", "head_dist")


def adapted_layers(model):
    """The Dense layers that LoRA adapts: the attention's (query, key, value, out) and the MLP's
    inside `model`'s encoder blocks; not the patch embedding, a relative-position MLP (it gives
    positions, frozen like the position embeddings), an attention-pooling head or the heads.
    A `keras_vit.native.NaFlexViT`'s are its classic model's (the same layers)."""
    return [layer for block in classic_model(model).layers
            if isinstance(block, vit_layers.EncoderBlock)
            for layer in _feature_dense_layers(block)]


def _feature_dense_layers(layer):
    for child in layer._flatten_layers(include_self=False, recursive=False):
        if isinstance(child, keras.layers.Dense):
            yield child
        elif not isinstance(child, vit_layers.RelativePositionMlp):
            yield from _feature_dense_layers(child)


def enable(model, rank, alpha=None, train_norms=False):
    """Adapts `model` (built by keras_vit) in place: LoRA of `rank` on `adapted_layers`, scaled
    by `alpha / rank` (default alpha: the rank), and every weight frozen but the adapters, the
    heads (`HEADS`, those the model has) and, with `train_norms`, the LayerNorms. Returns
    `model`.

    Python or NumPy numbers are taken alike. A TypeError names an argument of another type
    (`rank` not an integer, `alpha` not a real number, `train_norms` not a bool); a ValueError
    a rank below 1 or above `max_rank(model.spec)`, an alpha not finite and > 0, a model without
    encoder blocks or one adapted already. Nothing is changed when one is raised."""
    rank = variants.check_int("rank", rank)
    alpha = variants.check_positive_number("alpha", alpha, allow_none=True)
    train_norms = variants.check_bool("train_norms", train_norms)
    layers = adapted_layers(model)
    if not layers:
        raise ValueError(f"Model {model.name!r} has no encoder blocks to adapt.")
    if is_adapted(model):
        raise ValueError(f"Model {model.name!r} is adapted already.")
    _check_rank_fits(rank, layers)
    for layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)
    trained = {id(variable) for variable in _trained_with_adapters(model, train_norms)}
    for variable in model.weights:
        variable.trainable = id(variable) in trained
    return model


def max_rank(spec):
    """The highest rank `enable` takes for a model of `spec` (a keras_vit.ViTConfig), without
    building it: the smaller side of the narrowest kernel it adapts (the attention's are
    hidden_size square, the MLP's hidden_size x mlp_dim and back)."""
    return min(spec.hidden_size, spec.mlp_dim)


def _check_rank_fits(rank, layers):
    """A rank above a kernel's smaller side adds nothing a rank of that side could not, in
    adapters larger than the kernel itself."""
    narrowest = min(layers, key=lambda layer: min(layer.kernel.shape))
    limit = min(narrowest.kernel.shape)
    if rank > limit:
        rows, columns = narrowest.kernel.shape
        raise ValueError(
            f"rank must be at most {limit}, the smaller side of the narrowest kernel LoRA "
            f"adapts ({narrowest.path}, {rows} x {columns}), got {rank}: a larger rank makes "
            f"adapters larger than that kernel and adapts it no better. Give a rank <= {limit}.")


def is_adapted(model):
    return any(layer.lora_enabled for layer in adapted_layers(model))


def _trained_with_adapters(model, train_norms):
    yield from (variable for layer in adapted_layers(model)
                for variable in (layer.lora_kernel_a, layer.lora_kernel_b))
    classic = classic_model(model)
    names = {layer.name for layer in classic.layers}
    for head in HEADS:
        if head in names:
            yield from classic.get_layer(head).weights
    if train_norms:
        yield from (variable for layer in model._flatten_layers()
                    if isinstance(layer, vit_layers.LayerNorm) for variable in layer.weights)


def merged_kernels(model):
    """`{path of an adapted kernel: W + (alpha / rank) A B}` of `model` ({} if not adapted)."""
    return {layer._kernel.path: layer.kernel for layer in adapted_layers(model)
            if layer.lora_enabled}


def is_adapter(variable):
    return variable.name in ADAPTER_NAMES


def merged(model):
    """A plain copy of an adapted `model`: the same spec, dtype and preprocessing, its kernels
    the merged ones, no adapters; `model` itself when it is not adapted. Of a NaFlexViT, a
    NaFlexViT of the plain copy."""
    kernels = merged_kernels(model)
    if not kernels:
        return model
    # Built again from its config: the attention's and MLP's Dense layers are made in build(),
    # so the copy has none of the adapters (its spec, dtype and preprocessing are in the config).
    plain = type(model).from_config(model.get_config())
    values = {variable.path: variable for variable in model.weights if not is_adapter(variable)}
    values.update(kernels)
    for variable in plain.weights:
        variable.assign(keras.ops.cast(values[variable.path], variable.dtype))
    return plain

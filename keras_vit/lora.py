"""LoRA (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models") on a keras_vit
model: each encoder block's attention (query, key, value, out) and MLP kernels W become
W + (alpha / rank) A B, with Keras' own `Dense.enable_lora` (A from He's uniform, B zeros, so
the model starts as it was; float32 adapters), and every other weight but the head is frozen.

    keras_vit.lora.enable(model, rank=8)           # then compile and fit: adapters and head train
    plain = keras_vit.lora.merged(model)           # the same outputs, no adapters: for export

The attention reads its query, key and value kernels as one concatenated matrix; Keras' LoRA
`Dense.kernel` is the sum above, so the fused matmul stays one matmul. A `.keras` file of an
adapted model holds the merged kernels (Keras' `Dense.save_own_variables` merges them), and
`keras_vit.checkpoint` reads and writes the merged weights too.
"""

import keras

from keras_vit import layers as vit_layers

ADAPTER_NAMES = ("lora_kernel_a", "lora_kernel_b")


def adapted_layers(model):
    """The Dense layers that LoRA adapts: those inside `model`'s encoder blocks (attention and
    MLP); not the patch embedding, an attention-pooling head or the classifier."""
    return [layer for block in model.layers if isinstance(block, vit_layers.EncoderBlock)
            for layer in block._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.Dense)]


def enable(model, rank, alpha=None, train_norms=False):
    """Adapts `model` (built by keras_vit) in place: LoRA of `rank` on `adapted_layers`, scaled
    by `alpha / rank` (default alpha: the rank), and every weight frozen but the adapters, the
    head (a model with one) and, with `train_norms`, the LayerNorms. Returns `model`."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive integer, got {rank!r}.")
    if alpha is not None and not alpha > 0:
        raise ValueError(f"alpha must be positive (or None: the rank), got {alpha!r}.")
    layers = adapted_layers(model)
    if not layers:
        raise ValueError(f"Model {model.name!r} has no encoder blocks to adapt.")
    if is_adapted(model):
        raise ValueError(f"Model {model.name!r} is adapted already.")
    for layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)
    trained = {id(variable) for variable in _trained_with_adapters(model, train_norms)}
    for variable in model.weights:
        variable.trainable = id(variable) in trained
    return model


def is_adapted(model):
    return any(layer.lora_enabled for layer in adapted_layers(model))


def _trained_with_adapters(model, train_norms):
    yield from (variable for layer in adapted_layers(model)
                for variable in (layer.lora_kernel_a, layer.lora_kernel_b))
    if "head" in {layer.name for layer in model.layers}:
        yield from model.get_layer("head").weights
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
    the merged ones, no adapters; `model` itself when it is not adapted."""
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

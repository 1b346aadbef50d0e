"""How a built model runs, apart from what it computes: the attention kernel and
rematerialisation. The same weights, files and outputs (to float rounding) whichever is chosen,
so none of it is part of the architecture (`keras_vit.ViTConfig`) or of a model's files: it is
chosen when a model is built (`keras_vit.vit(..., attention_impl=..., remat=...)`) or on a built
model (`set_execution`, as timm's `set_grad_checkpointing()`), and a training run records it
in its own config.

    model = keras_vit.vit("B/16")
    keras_vit.set_execution(model, attention_impl="fused", remat="blocks")

On Keras' JAX backend a model's blocks can also run as one checkpointed `jax.lax.scan`
(`ScannedBlocks`), which the JAX engine uses with remat.
"""

import dataclasses

from keras_vit.architecture import variants

# How self-attention is computed: Keras' fused `dot_product_attention`, the paper's three ops,
# or the fused one where the backend has a fused kernel and nothing asks for the weights.
ATTENTION_IMPLS = ("auto", "fused", "explicit")
# What the backward pass computes again instead of keeping: nothing, or every encoder block.
REMAT = ("none", "blocks")
# The ViTConfig fields these were, in files and configs written before they moved here.
FIELDS = ("attention_impl", "remat")


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a model runs.

    Attributes:
        attention_impl: "fused" (`keras.ops.dot_product_attention`, which on Keras' JAX backend
            runs cuDNN's flash attention on GPUs and Pallas' splash attention on TPUs, and
            PyTorch's `scaled_dot_product_attention` on torch: the score matrix is not kept
            for the backward pass), "explicit" (the paper's three ops: logits, softmax,
            weighted sum), or "auto" (fused where that is faster: on PyTorch and on JAX's GPUs
            and TPUs; explicit on JAX's CPU, whose XLA reference attention is slower, and on
            TensorFlow, which has no fused kernel). The attention weights, when asked for
            (`attention_model`, `features(attention=True)`), and attention dropout in training
            always take the explicit path.
        remat: "none", or "blocks": in training, each encoder block keeps only its input for
            the backward pass, which computes the block again (`keras.remat`: jax.checkpoint,
            tf.recompute_grad, torch's checkpoint): the activations of one block at a time
            instead of all, for about a third more compute. Dropout and stochastic depth draw
            the same masks again. An inference graph (an export) never carries it.
    """

    attention_impl: str = "auto"
    remat: str = "none"

    def __post_init__(self):
        variants.check_choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
        variants.check_choice("remat", self.remat, REMAT)

    def to_dict(self):
        return dataclasses.asdict(self)


def set_execution(model, *, attention_impl=None, remat=None):
    """Sets how `model` (built by keras_vit) runs from now on; None keeps a choice as it is.
    Returns `model`.

    Raises a ValueError for a value that is not one of the choices (`ATTENTION_IMPLS`,
    `REMAT`), and for fused attention in a model with attention dropout, whose weights the
    fused kernel never forms. Nothing is changed when one is raised."""
    current = execution_of(model)
    execution = Execution(
        attention_impl=current.attention_impl if attention_impl is None else attention_impl,
        remat=current.remat if remat is None else remat)
    spec = getattr(model, "spec", None)
    if execution.attention_impl == "fused" and spec is not None and spec.attention_dropout:
        raise ValueError(
            f"attention_impl='fused' never forms the attention weights that the model's "
            f"attention_dropout={spec.attention_dropout} would drop: use attention_impl='auto' "
            "(explicit in training, fused otherwise) or 'explicit'.")
    for layer in model._flatten_layers(include_self=False):
        if hasattr(layer, "attention_impl"):
            layer.attention_impl = execution.attention_impl
        if hasattr(layer, "remat"):
            layer.remat = execution.remat == "blocks"
    model.execution = execution
    return model


def execution_of(model):
    """How `model` runs: what `set_execution` or `keras_vit.vit` set, else the defaults."""
    return getattr(model, "execution", None) or Execution()


def split_fields(fields):
    """`(architecture fields, execution fields)` of a dict that may hold both (the fields of
    a spec written before execution moved out of it, or `vit()`'s arguments)."""
    fields = dict(fields)
    execution = {name: fields.pop(name) for name in FIELDS if name in fields}
    return fields, execution

"""A model's encoder blocks as one checkpointed `jax.lax.scan`, on Keras' JAX backend: how the
JAX engine runs a model with remat (`keras_vit.architecture.execution`). Only JAX imports this
module.

    chain = ScannedBlocks.chain_of(model)     # None where the blocks cannot loop
    with keras.StatelessScope(state_mapping=...):
        logits = ScannedBlocks(model, chain, trainable, non_trainable)(images, training=True)
"""

import jax
import keras

from keras_vit.architecture.execution import execution_of
from keras_vit.layers import EncoderBlock
from keras_vit.model import ViTModel


class ScannedBlocks:
    """The model's forward pass with its encoder blocks as one `jax.lax.scan` over their stacked
    weights, each step of the loop checkpointed (`jax.checkpoint`): the backward pass keeps
    each block's input only and computes the block again. Unrolled, with each block
    checkpointed (`keras.remat`), XLA's memory plan on CPU kept every block's activations all
    the same (measured: benchmarks/memory_per_device.py); the loop leaves it no other order.
    The blocks draw from their own seed generators as they would unrolled, so dropout and
    stochastic depth mask what they would without remat.

    For models whose blocks are alike and follow each other (`chain_of`); the layers before
    and after them run as the model's own graph (DeiT's two heads are not a chain). The
    objective calls it in place of the model."""

    def __init__(self, model, chain, trainable, non_trainable):
        self.blocks = [layer for layer in chain if isinstance(layer, EncoderBlock)]
        # The graph before the first block and after the last, as functional models of the
        # model's own layers and weights.
        self.stem = keras.Model(model.input, self.blocks[0].input)
        self.top = keras.Model(self.blocks[-1].output, model.outputs[0])
        self.trainable = dict(zip(map(id, model.trainable_variables), trainable))
        self.non_trainable = dict(zip(map(id, model.non_trainable_variables), non_trainable))
        self.updated = {}  # id(variable) -> the blocks' new seed states

    @staticmethod
    def chain_of(model):
        """The chain of `model`'s layers (no input layer) when its encoder runs as a loop: with
        remat "blocks" (its `keras_vit.architecture.execution`), a classifier (not masked patch
        prediction's wrapper) of one image size whose blocks follow each other and are alike
        but for their weights (not Axial-ViT's row and column blocks, no position embedding
        between them, and no stochastic depth, whose rate rises from block to block). None
        otherwise."""
        spec = getattr(model, "spec", None)
        if (spec is None or not isinstance(model, ViTModel) or spec.dynamic_image_size
                or spec.relative_mlp_shared  # the blocks take the shared logits as an input
                or execution_of(model).remat != "blocks"):
            return None
        chain = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
        positions = [i for i, layer in enumerate(chain) if isinstance(layer, EncoderBlock)]
        if len(positions) < 2 or positions != list(range(positions[0], positions[-1] + 1)):
            return None
        configs = [{**chain[i].get_config(), "name": None} for i in positions]
        if any(config != configs[0] for config in configs):
            return None
        return chain

    def __call__(self, images, training=False):
        x = self._blocks(self.stem(images, training=training), training)
        return self.top(x, training=training)

    def _stacked(self, values, kind):
        """Each of the first block's variables of `kind`, stacked over the blocks."""
        count = len(getattr(self.blocks[0], kind))
        return [jax.numpy.stack([values[id(getattr(block, kind)[index])]
                                 for block in self.blocks]) for index in range(count)]

    def _blocks(self, x, training):
        template = self.blocks[0]

        def body(tokens, weights):
            trainable, non_trainable = weights
            tokens, non_trainable = template.stateless_call(trainable, non_trainable, tokens,
                                                            training=training)
            return tokens, non_trainable

        remat, template.remat = template.remat, False  # the loop's checkpoint does it
        try:
            x, states = jax.lax.scan(
                jax.checkpoint(body, prevent_cse=False), x,
                (self._stacked(self.trainable, "trainable_variables"),
                 self._stacked(self.non_trainable, "non_trainable_variables")))
        finally:
            template.remat = remat
        for index in range(len(template.non_trainable_variables)):
            for number, block in enumerate(self.blocks):
                self.updated[id(block.non_trainable_variables[index])] = states[index][number]
        return x

"""What a ViT computes on the way to its logits: the tokens of chosen blocks, as a sequence or as
maps over the patch grid, and the attention weights. For dense tasks (a segmentation, detection
or keypoint head on the maps) and for the analysis tools.

    backbone = keras_vit.features(model, layers=(3, 6, 9, 12), output="maps")
    maps = backbone(images)            # four [batch, H / p, W / p, D] maps

The models returned here are built from the layers of `model` itself, so they share its weights
(training one trains the other) and take what it takes: images of its size, or of any size for a
model built with `dynamic_image_size=True`.
"""

import keras
import numpy as np
from keras import ops

from keras_vit import layers as vit_layers
from keras_vit.model import ViTModel, _check_images, classic_model

OUTPUTS = ("tokens", "maps")


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchMap(keras.layers.Layer):
    """Tokens `[batch, prefix + rows * columns, D]` as maps `[batch, rows, columns, D]`: the
    prefix (class) tokens dropped, the patches put back on their grid.

    Args:
        grid_size: `(rows, columns)` of the patch grid.
        num_prefix_tokens: tokens before the grid.

    `call(tokens, grid=None)`: `grid`, the patch grid `[batch, rows, columns, D]` of a model of
    any image size, gives the grid's size at call time.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(side) for side in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens, grid=None):
        rows, columns = self.grid_size if grid is None else vit_layers.grid_sides(grid)
        patches = tokens[:, self.num_prefix_tokens:]
        return ops.reshape(patches, (ops.shape(tokens)[0], rows, columns, tokens.shape[-1]))

    def compute_output_spec(self, tokens, grid=None):
        rows, columns = self.grid_size if grid is None else grid.shape[1:3]
        return keras.KerasTensor((tokens.shape[0], rows, columns, tokens.shape[-1]),
                                 dtype=tokens.dtype)

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens}


def _encoder_layers(model, caller):
    """The blocks of each encoder layer, in order: one `EncoderBlock`, or Axial-ViT's row and
    column blocks (a NaFlexViT's are its classic model's)."""
    blocks = [layer for layer in classic_model(model).layers
              if isinstance(layer, vit_layers.EncoderBlock)]
    if not blocks:
        raise ValueError(f"Model {model.name!r} has no EncoderBlock layers; {caller}() takes "
                         "a model built by keras_vit.vit() or one of its builders.")
    if any(isinstance(block, vit_layers.AxialEncoderBlock) for block in blocks):
        return [blocks[index:index + 2] for index in range(0, len(blocks), 2)]
    return [[block] for block in blocks]


def _chosen(layers, depth):
    """1-based layer numbers (negative ones count from the last) -> 0-based indices."""
    if layers is None:
        return list(range(depth))
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        layers = (layers,)  # one number (or a float, a string: refused below, by name)
    chosen = []
    for number in layers:
        valid = (isinstance(number, (int, np.integer)) and not isinstance(number, bool)
                 and (1 <= number <= depth or -depth <= number <= -1))
        if not valid:
            raise ValueError(
                f"layers holds {number!r}, but the model has {depth} encoder layers: name them "
                f"1 to {depth} (the output of the first to the last block), or -1 to -{depth} "
                "from the last.")
        chosen.append(int(number) - 1 if number > 0 else depth + int(number))
    if not chosen:
        raise ValueError(f"layers is empty; name at least one of 1 to {depth}.")
    return chosen


def _token_norm(model):
    try:
        return model.get_layer("encoder_norm")
    except ValueError:
        spec = getattr(model, "spec", None)
        raise ValueError(
            f"Model {model.name!r} has no LayerNorm over the tokens (final_norm="
            f"{getattr(spec, 'final_norm', None)!r}: it normalises the pooled vector or "
            "nothing); take features with norm=False.") from None


def features(model, layers=None, output="tokens", norm=False, attention=False):
    """A model of the same images to the outputs of chosen encoder layers.

    Args:
        model: a model built by `keras_vit.vit()` (or loaded from its `.keras` file).
        layers: layer numbers, 1 (the first block's output) to the model's depth, or negative
            from the last (-1 is the last); an int for one layer; None for every layer.
        output: "tokens", each `[batch, tokens, D]` as the blocks pass them on (class token
            first), or "maps", each `[batch, rows, columns, D]` over the patch grid with the
            prefix tokens left out (rows = height / patch pixels).
        norm: apply the model's final LayerNorm (`encoder_norm`, shared) to each output, as
            timm's `forward_intermediates(norm=True)`; False gives the residual stream itself.
        attention: also return each chosen layer's attention weights
            `[batch, heads, tokens, tokens]` (two per layer for Axial-ViT: rows, then columns).

    Returns:
        A Keras model that shares `model`'s layers (and weights). Its output is a list with one
        tensor per chosen layer, in the order given (one tensor when one layer is chosen, as
        Keras returns single outputs); with `attention=True`, a pair `(outputs, weights)`,
        `weights` a list. Only the layers up to the deepest one chosen run.
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}.")
    if classic_model(model) is not model:
        # A functional model of one image shape cannot take a NaFlex batch's dict of grids.
        raise ValueError(
            f"features() builds a model of square images; {model.name!r} runs on NaFlex "
            "arrays, each image at its own grid. Use its tokens(inputs) (the encoder's tokens "
            "and their mask), representation(inputs) (what its head reads), "
            "keras_vit.attention_model(model) (every block's attention weights), or "
            "features(model.vit, ...) for the classic model on square images.")
    encoder = _encoder_layers(model, "features")
    chosen = _chosen(layers, len(encoder))
    position = next(layer for layer in model.layers
                    if isinstance(layer, vit_layers.AddPositionEmbs))
    embedding = model.get_layer("embedding")
    grid_input = {} if embedding.flatten else {"grid": embedding.output}
    outputs = []
    for index in chosen:
        tokens = encoder[index][-1].output
        if norm:
            tokens = _token_norm(model)(tokens)
        if output == "maps":
            tokens = PatchMap(position.grid_size, position.num_prefix_tokens,
                              name=f"map_{index + 1}_{len(outputs)}")(tokens, **grid_input)
        outputs.append(tokens)
    name = f"{model.name}_features"
    extractor = ViTModel(model.input, outputs[0] if len(outputs) == 1 else outputs, name=name,
                         spec=getattr(model, "spec", None),
                         preprocessing=getattr(model, "preprocessing", None))
    if not attention:
        return extractor
    blocks = [block for index in chosen for block in encoder[index]]
    return _WithAttention(extractor, blocks, keep_outputs=True, name=f"{name}_attention")


def attention_model(model):
    """Returns a model that maps the same images to the attention weights of every block.

    The new model shares the layers (and so the weights) of `model`, a model built by `vit()`.
    Its output is a list with one `[batch, heads, tokens, tokens]` tensor per encoder block
    (two per layer for Axial-ViT: rows, then columns, each as the equivalent full matrix).
    The default forward pass of `model` is untouched and computes no extra output.

    `model` may be a `keras_vit.native.NaFlexViT`: the new model takes its input dict and gives
    the weights over its whole sequences, `prefix + length` tokens, as the blocks computed them
    under its attention mask (padding, and in a packed sequence the other images' patches, get
    0 from every query of an image; `keras_vit.analysis.attention_maps` cuts out each image).
    """
    blocks = [block for layer in _encoder_layers(model, "attention_model") for block in layer]
    return _WithAttention(model, blocks, keep_outputs=False, name=f"{model.name}_attention")


class _WithAttention(keras.Model):
    """Runs `runner` (a ViT, or a features model of one) and also returns the attention weights
    of `blocks`, in the order they run."""

    def __init__(self, runner, blocks, keep_outputs, **kwargs):
        super().__init__(**kwargs)
        self.runner = runner
        self.blocks = list(blocks)
        self.keep_outputs = keep_outputs

    def __call__(self, images, *args, **kwargs):
        _check_images(self.runner, images)  # before Keras would wrap the message
        return super().__call__(images, *args, **kwargs)

    def call(self, images):
        weights = []
        # Each block hands its weights to the recorder while the model runs as built (with
        # any shared or repeated layers), then forgets it.
        for block in self.blocks:
            block.attention_recorder = weights.append
        try:
            outputs = self.runner(images)
        finally:
            for block in self.blocks:
                block.attention_recorder = None
        return (outputs, weights) if self.keep_outputs else weights

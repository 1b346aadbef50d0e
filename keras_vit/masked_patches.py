"""Masked patch prediction, the paper's self-supervised objective (section 4.6, appendix B.1.2).

As in BERT's masked language modelling, a share of each image's patch embeddings is corrupted
and the model predicts, from the final token of every corrupted patch, a target computed from
that patch's pixels. A corrupted embedding is replaced by a learned [mask] embedding, or by the
embedding of another patch of the same image, or left as it is. The targets (`TARGETS`):

- "mean_color": the patch's mean colour, 3 bits per channel: one of 512 classes (the target
  the paper reports);
- "downscaled_color": the patch downscaled to 4x4 cells, each cell's colour in 3 bits: 16
  predictions of 512 classes;
- "pixels": the patch's pixel values, regressed with a squared error.

The corruption of each image is drawn outside the model (the training driver draws it in its
input pipeline, so that it does not depend on how a batch is split over replicas) and given as
two integer inputs per patch: `corruption`, one of the codes below, and `source`, the index of
the patch whose embedding replaces a REPLACED one.

    encoder = keras_vit.vit("B/16", include_top=False, classifier="gap")
    model = keras_vit.MaskedPatchPredictor(encoder)
    predictions = model({"images": images, "corruption": corruption, "source": source})
    loss_sum, count = model.loss_sums(predictions, model.targets(images), corruption)

Pixel targets come from the images the model sees (scaled to [-1, 1]), in the patch of pixels
each token covers. For a hybrid (ResNet stem) model that is the stem's stride times the patch
size; the stem's receptive field reaches past it, so a masked patch's pixels are still partly
seen through its neighbours' tokens, and the task is easier than for a plain ViT.
"""

import keras
import numpy as np
from keras import ops

from keras_vit import layers as vit_layers
from keras_vit.model import ViTModel

# Per-patch corruption codes. Every code but NOT_CORRUPTED is predicted (and in the loss).
NOT_CORRUPTED, MASKED, REPLACED, KEPT = 0, 1, 2, 3
TARGETS = ("mean_color", "downscaled_color", "pixels")
COLOR_BITS = 3  # per channel: 8 levels, 512 colours for RGB
DOWNSCALED_CELLS = 4  # "downscaled_color": a 4x4 grid of cells per patch
# A mean colour this close below a level's boundary (in levels) counts as that level, so that
# float rounding cannot move an exact boundary value (e.g. a patch of pixels 32) down a level.
_LEVEL_TOLERANCE = 1e-3


def patch_pixels(images, patch_size):
    """`[batch, H, W, C]` images to `[batch, patches, patch_size, patch_size, C]`, patches in
    row-major order (the order of the tokens)."""
    _, height, width, channels = images.shape
    rows, columns = height // patch_size, width // patch_size
    patches = ops.reshape(images, (-1, rows, patch_size, columns, patch_size, channels))
    patches = ops.transpose(patches, (0, 1, 3, 2, 4, 5))
    return ops.reshape(patches, (-1, rows * columns, patch_size, patch_size, channels))


def color_classes(colors, bits=COLOR_BITS):
    """Colours `[..., C]` in [-1, 1] (pixel values 0..255 scaled as the model's inputs) to
    class indices: each channel's top `bits` bits of its 0..255 value, as one number with the
    first channel most significant (RGB at 3 bits: r * 64 + g * 8 + b, in [0, 512))."""
    levels = 2**bits
    values = (ops.cast(colors, "float32") + 1.0) * 127.5  # back to 0..255
    level = ops.floor(values * (levels / 256.0) + _LEVEL_TOLERANCE)
    level = ops.cast(ops.clip(level, 0, levels - 1), "int32")
    channels = colors.shape[-1]
    weights = ops.convert_to_tensor([levels ** (channels - 1 - c) for c in range(channels)],
                                    dtype="int32")
    return ops.sum(level * weights, axis=-1)


def mean_color_targets(images, patch_size, bits=COLOR_BITS):
    """Each patch's mean colour as a class: `[batch, patches]` int32 in [0, 2**(bits*C))."""
    patches = patch_pixels(ops.cast(images, "float32"), patch_size)
    return color_classes(ops.mean(patches, axis=(2, 3)), bits)


def check_downscaled_cells(patch_size, cells=DOWNSCALED_CELLS):
    if patch_size % cells:
        raise ValueError(f"The downscaled_color target averages each patch over {cells}x{cells} "
                         f"cells, so it needs patches of a multiple of {cells} pixels, not "
                         f"{patch_size}.")


def downscaled_color_targets(images, patch_size, cells=DOWNSCALED_CELLS, bits=COLOR_BITS):
    """Each patch averaged over a `cells x cells` grid, each cell's colour as a class:
    `[batch, patches, cells * cells]` int32, cells in row-major order."""
    check_downscaled_cells(patch_size, cells)
    patches = patch_pixels(ops.cast(images, "float32"), patch_size)
    channels, size = patches.shape[-1], patch_size // cells
    grid = ops.reshape(patches, (-1, patches.shape[1], cells, size, cells, size, channels))
    means = ops.mean(grid, axis=(3, 5))  # [batch, patches, cells, cells, C]
    return color_classes(ops.reshape(means, (-1, patches.shape[1], cells * cells, channels)),
                         bits)


def pixel_targets(images, patch_size):
    """Each patch's pixels, flattened: `[batch, patches, patch_size * patch_size * C]`."""
    patches = patch_pixels(ops.cast(images, "float32"), patch_size)
    return ops.reshape(patches, (-1, patches.shape[1], patch_size * patch_size * images.shape[-1]))


def corrupt_tokens(tokens, corruption, source, mask_embedding):
    """Applies the corruption codes to patch tokens `[batch, patches, D]`: MASKED tokens become
    `mask_embedding`, REPLACED ones the (uncorrupted) token at their `source` index."""
    replacements = ops.take_along_axis(tokens, ops.expand_dims(source, -1), axis=1)
    corruption = ops.expand_dims(corruption, -1)
    tokens_out = ops.where(corruption == REPLACED, replacements, tokens)
    return ops.where(corruption == MASKED, ops.cast(mask_embedding, tokens.dtype), tokens_out)


_WHAT = {"corruption": f"the codes are {NOT_CORRUPTED} (not corrupted), {MASKED} (masked), "
                       f"{REPLACED} (replaced by the patch at `source`) and {KEPT} (kept, "
                       "still predicted)",
         "source": "the index of the patch whose embedding replaces a replaced one, any "
                   "patch's index elsewhere"}


def _known_values(tensor):
    """`tensor`'s values as numpy if they are known now (numpy input, or an eager call), else
    None (while tracing or compiling: tf.function, jax.jit, XLA)."""
    if isinstance(tensor, (np.ndarray, list, tuple)):
        return np.asarray(tensor)
    if isinstance(tensor, keras.KerasTensor):
        return None
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.is_symbolic_tensor(tensor) or not hasattr(tensor, "numpy"):
            return None
        return tensor.numpy()
    if backend == "jax":
        import jax

        if isinstance(tensor, jax.core.Tracer) or not getattr(tensor, "is_fully_addressable",
                                                              True):
            return None  # (a batch split over several processes: not on this host)
        return np.asarray(tensor)
    if backend == "torch":
        return tensor.detach().cpu().numpy()
    return None


class MaskedPatchPredictor(keras.Model):
    """A ViT encoder with the masked-patch-prediction head, for self-supervised pre-training.

    It shares the encoder's layers: training it trains `encoder`, which is what one keeps (and
    fine-tunes with a new classification head) afterwards.

    Args:
        encoder: a model from `keras_vit.vit(..., include_top=False)`.
        target: one of `TARGETS`.

    Inputs: a dict of `images` `[batch, H, W, 3]` scaled to [-1, 1], and `corruption` and
    `source`, int32 `[batch, patches]` (see the module doc). Outputs: float32 predictions of
    every patch: logits `[batch, patches, 512]` ("mean_color"), `[batch, patches, 16, 512]`
    ("downscaled_color"), or pixels `[batch, patches, p * p * 3]` ("pixels").
    """

    def __init__(self, encoder, target="mean_color", **kwargs):
        super().__init__(**kwargs)
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}.")
        embeddings = [layer for layer in encoder.layers
                      if isinstance(layer, vit_layers.PatchEmbed)]
        try:
            norm = encoder.get_layer("encoder_norm")
            position = encoder.get_layer("posembed_input")
        except ValueError:
            norm = position = None
        spec = getattr(encoder, "spec", None)
        if spec is not None and spec.final_norm != "tokens":
            raise ValueError(f"Model {encoder.name!r} has final_norm={spec.final_norm!r}, but "
                             "masked patch prediction predicts from the normalised tokens: "
                             "build the encoder with final_norm='tokens'.")
        if len(embeddings) != 1 or norm is None:
            raise ValueError(f"Model {encoder.name!r} is not a keras_vit ViT: build the encoder "
                             "with keras_vit.vit(..., include_top=False).")
        if None in tuple(encoder.inputs[0].shape[1:3]):
            raise ValueError(f"Model {encoder.name!r} takes images of any size, but masked "
                             "patch prediction trains at one (its targets are the patches of "
                             "that grid): build the encoder with dynamic_image_size=False.")
        self.encoder, self.target = encoder, target
        self.patch_embed = embeddings[0]
        # The encoder's final (normalised) tokens, through the same layers.
        self.tokens_model = keras.Model(encoder.inputs, norm.output)
        self.num_prefix_tokens = position.num_prefix_tokens
        self.grid_size = tuple(position.grid_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        image_size = encoder.inputs[0].shape[1:3]
        self.patch_pixels = image_size[0] // self.grid_size[0]
        self.channels = encoder.inputs[0].shape[-1]
        colors = 2 ** (COLOR_BITS * self.channels)
        if target == "downscaled_color":
            check_downscaled_cells(self.patch_pixels)
        self.prediction_shape = {
            "mean_color": (colors,),
            "downscaled_color": (DOWNSCALED_CELLS**2, colors),
            "pixels": (self.patch_pixels**2 * self.channels,),
        }[target]
        hidden = self.patch_embed.hidden_size
        policy = self.patch_embed.dtype_policy
        # BERT's [mask] embedding: learned, initialised like its word embeddings.
        self.mask_embedding = self.add_weight(
            name="mask_embedding", shape=(hidden,), dtype=policy.variable_dtype,
            initializer=keras.initializers.TruncatedNormal(stddev=0.02))
        units = 1
        for size in self.prediction_shape:
            units *= size
        self.head = keras.layers.Dense(units, kernel_initializer="zeros", name="mpp_head",
                                       dtype="float32")
        self.head.build((None, hidden))
        self.built = True  # every weight exists now

    # What each weight is to a trainer, as `keras_vit.ViTModel` says it: the mask embedding
    # goes with the layers before the blocks, the head after them.

    def layer_indices(self, variables):
        """As `ViTModel.layer_indices`, the mask embedding at 0 and the head after the last
        block."""
        head = {id(weight) for weight in self.head.weights}
        encoder = [variable for variable in variables
                   if variable is not self.mask_embedding and id(variable) not in head]
        depths = iter(self.encoder.layer_indices(encoder))
        return [0 if variable is self.mask_embedding else
                self.num_blocks + 1 if id(variable) in head else next(depths)
                for variable in variables]

    @property
    def num_blocks(self):
        return self.encoder.num_blocks

    decays = staticmethod(ViTModel.decays)
    get_layout_map = staticmethod(ViTModel.get_layout_map)

    def call(self, inputs, training=False):
        images, corruption, source = inputs["images"], inputs["corruption"], inputs["source"]
        self._check_corruption(images, corruption, source)
        corruption = ops.cast(corruption, "int32")
        source = ops.cast(source, "int32")
        self.patch_embed.token_transform = lambda tokens: corrupt_tokens(
            tokens, corruption, source, self.mask_embedding)
        try:
            tokens = self.tokens_model(images, training=training)
        finally:
            self.patch_embed.token_transform = None
        tokens = ops.cast(tokens[:, self.num_prefix_tokens:], "float32")
        predictions = self.head(tokens)
        return ops.reshape(predictions, (-1, self.num_patches) + self.prediction_shape)

    def _check_corruption(self, images, corruption, source):
        """ValueError or TypeError for corruption inputs the model cannot apply (TensorFlow
        would fail deep inside PatchEmbed with a raw SelectV2 or GatherV2 error, or, for an
        unknown code, go on silently). Shapes and dtypes are checked on every call, tracing
        included, at no cost; the values (codes, source indices) when they are known now:
        numpy inputs and eager calls. Inside a compiled function (tf.function, jax.jit, XLA)
        they are not: XLA has no runtime assertions, and a check would copy them to the host
        every step. The training driver draws valid values (train/data/masking.py)."""
        patches, prefix = self.num_patches, self.num_prefix_tokens
        grid = f"{self.grid_size[0]}x{self.grid_size[1]}"
        batch = images.shape[0] if len(images.shape) == 4 else None
        for name, value in (("corruption", corruption), ("source", source)):
            shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
            dtype = keras.backend.standardize_dtype(
                value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)
            if "int" not in dtype:
                raise TypeError(f"{name} must hold integers ({_WHAT[name]}), got dtype {dtype}.")
            if len(shape) != 2 or shape[1] not in (None, patches):
                hint = (f" It has a slot for the class token: give the {patches} patches only."
                        if len(shape) == 2 and prefix and shape[1] == patches + prefix else "")
                raise ValueError(f"{name} must be [batch, {patches}], one entry per patch of "
                                 f"the encoder's {grid} grid in row-major order ({_WHAT[name]}), "
                                 f"got shape {shape}.{hint}")
            if None not in (batch, shape[0]) and shape[0] != batch:
                raise ValueError(f"{name} has {shape[0]} rows for a batch of {batch} images: "
                                 "one row per image.")
        codes, indices = _known_values(corruption), _known_values(source)
        if codes is not None:
            bad = np.setdiff1d(codes, [NOT_CORRUPTED, MASKED, REPLACED, KEPT])
            if bad.size:
                raise ValueError(f"corruption holds unknown codes {bad[:5].tolist()}: "
                                 f"{_WHAT['corruption']}.")
        if indices is not None:
            bad = np.unique(indices[(indices < 0) | (indices >= patches)])
            if bad.size:
                raise ValueError(f"source holds patch indices {bad[:5].tolist()} outside 0.."
                                 f"{patches - 1}: {_WHAT['source']}.")

    def targets(self, images):
        """The targets of every patch of `images` (see the module doc)."""
        if self.target == "mean_color":
            return mean_color_targets(images, self.patch_pixels)
        if self.target == "downscaled_color":
            return downscaled_color_targets(images, self.patch_pixels)
        return pixel_targets(images, self.patch_pixels)

    def patch_losses(self, predictions, targets):
        """The loss of every patch, `[batch, patches]`: the cross-entropy (averaged over the
        cells of "downscaled_color"), or the mean squared error of "pixels"."""
        if self.target == "pixels":
            return ops.mean(ops.square(predictions - ops.cast(targets, "float32")), axis=-1)
        losses = keras.losses.sparse_categorical_crossentropy(targets, predictions,
                                                              from_logits=True)
        return ops.mean(losses, axis=-1) if self.target == "downscaled_color" else losses

    def patch_accuracy(self, predictions, targets):
        """The share of correct classes of every patch, `[batch, patches]`; None for
        "pixels"."""
        if self.target == "pixels":
            return None
        correct = ops.cast(ops.argmax(predictions, axis=-1) == ops.cast(targets, "int32"),
                           "float32")
        return ops.mean(correct, axis=-1) if self.target == "downscaled_color" else correct

    def loss_sums(self, predictions, targets, corruption):
        """`(sum of the corrupted patches' losses, number of corrupted patches)`: the loss
        ignores every patch that was not corrupted."""
        weights = ops.cast(ops.cast(corruption, "int32") != NOT_CORRUPTED, "float32")
        losses = self.patch_losses(predictions, targets)
        return ops.sum(losses * weights), ops.sum(weights)

"""The Vision Transformer's layers, written with `keras.ops` so they run on any Keras backend.
One module per kind, in the model's reading order:

- `tokens`: images to patch tokens (`PatchEmbed`, `ConvStem`, `PadToMultiple`) and the learned
  tokens put before them (`ClassToken`, `DistillationToken`, `RegisterTokens`);
- `position`: where each token is: absolute embeddings (`AddPositionEmbs`, `sincos_2d`),
  rotary angles (`rope_angles`, `MixedRopeFrequencies`, `rotate`) and relative logits
  (`RelativePositionBias`, `RelativePositionMlp`);
- `attention`: `MultiHeadSelfAttention`, explicit or through one fused kernel;
- `normalization`: `LayerNorm`, `RMSNorm` (`make_norm`: `ViTConfig.norm_layer`'s kind);
- `blocks`: the encoder block and its parts (`EncoderBlock`, `AxialEncoderBlock`, `MlpBlock`,
  `DropPath`, `LayerScale`);
- `pooling`: the tokens to one vector for the head (`TokenPooling`, `AttentionPooling`);
- `resnet`: the hybrids' ResNet stem and stages (also `keras_vit.layers.resnet`);
- `shapes`: a rank check and the patch grid's sides, which the others share;
- `fusion`: in training on TensorFlow, the GELU's and the norms' element-wise work as XLA
  computations, forward and backward.

Weights are named after the original checkpoint tree so that loading a released `.npz` file is
a mechanical map. Keras finds a layer of a `.keras` file by the name it registers,
"keras_vit>" and its class name, not by its module: files saved while these modules were one,
`keras_vit/layers.py`, load unchanged.
"""

from keras_vit.layers import resnet  # noqa: F401  (registered for loading)
from keras_vit.layers.attention import (MultiHeadSelfAttention, fused_by_default,
                                        odd_lengths_refused)
from keras_vit.layers.blocks import AXES, AxialEncoderBlock, DropPath, EncoderBlock, LayerScale
from keras_vit.layers.blocks import MlpBlock
from keras_vit.layers.normalization import (FUSED_LAYER_NORM_BACKENDS, LayerNorm, RMSNorm,
                                            make_norm)
from keras_vit.layers.pooling import POOLINGS, AttentionPooling, TokenPooling
from keras_vit.layers.position import (POSITION_EMBEDDINGS, RELATIVE_POSITIONS, AddPositionEmbs,
                                       MixedRopeFrequencies, RelativePositionBias,
                                       RelativePositionMlp, rope_angles, rotate, sincos_2d)
from keras_vit.layers.shapes import grid_sides
from keras_vit.layers.tokens import (ClassToken, ConvStem, DistillationToken, PadToMultiple,
                                     PatchEmbed, RegisterTokens)

__all__ = [
    "AXES", "AddPositionEmbs", "AttentionPooling", "AxialEncoderBlock", "ClassToken", "ConvStem",
    "DistillationToken", "DropPath", "EncoderBlock", "FUSED_LAYER_NORM_BACKENDS", "LayerNorm",
    "LayerScale", "MixedRopeFrequencies", "MlpBlock", "MultiHeadSelfAttention", "POOLINGS",
    "POSITION_EMBEDDINGS", "PadToMultiple", "PatchEmbed", "RELATIVE_POSITIONS", "RMSNorm",
    "RegisterTokens", "RelativePositionBias", "RelativePositionMlp", "TokenPooling",
    "fused_by_default", "grid_sides", "make_norm", "odd_lengths_refused", "rope_angles", "rotate",
    "sincos_2d",
]

"""The hybrids' ResNet stem and stages, kept importable from here; the code is in
`keras_vit.layers.resnet`, beside the other layers. Rebinding a name here changes nothing the
layers call: patch `keras_vit.layers.resnet` (e.g. its `max_pool_3x3_stride_2`)."""

from keras_vit.layers.resnet import (GROUP_NORM_EPSILON, NUMERICS,
                                     WEIGHT_STANDARDIZATION_EPSILON, BottleneckUnit, GroupNorm,
                                     ResNetStage, ResNetStem, StdConv2D, max_pool_3x3_stride_2)

__all__ = ["GROUP_NORM_EPSILON", "NUMERICS", "WEIGHT_STANDARDIZATION_EPSILON", "BottleneckUnit",
           "GroupNorm", "ResNetStage", "ResNetStem", "StdConv2D", "max_pool_3x3_stride_2"]

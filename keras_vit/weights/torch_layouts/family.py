"""What a checkpoint family is: the interface each family module fills in once, as its
`FAMILY`, and the registry in this package's `__init__` lists.

A family is a set of one library's classes whose files share one weight layout and one
`config.json`: transformers' DINOv2 (`Dinov2Model`, `Dinov2ForImageClassification` and their
registers forms), timm's `Eva`... Reading, a family claims files by their class and makes a
`ViTConfig` of them; writing, it claims a `ViTConfig` by its options, writes its config.json or
refuses what its classes cannot express (`common.check_expressible`), and maps the weights to
and from the `.npz` layout.
"""

import dataclasses
from typing import Callable, Mapping, Optional

from keras_vit.weights.torch_layouts import common, timm_common


@dataclasses.dataclass(frozen=True)
class Family:
    """One checkpoint family. Reading needs `classes` and `spec_from_config`; a family that
    also writes (not ViT-MSN's, whose encoder is written as ViT's) needs `writes`, `config_for`
    and `weight_pairs`."""

    # How messages name it ("DINOv2").
    name: str
    # "transformers" or "timm".
    library: str
    # The library's classes it reads -> what the library's table says of each (transformers:
    # the prefix of the encoder's weights; timm: whether it has DeiT's distillation token).
    classes: Mapping[str, object]
    # (config.json, state dict, the class of `classes` it names: transformers' architecture,
    # timm's model class) -> the `ViTConfig` of the checkpoint, or a LayoutError for what it
    # cannot express.
    spec_from_config: Callable
    # transformers' model_type of its config.json -> the class of a config that names none.
    model_types: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Classes it knows but keras_vit has no model of -> why (the message of their refusal).
    refuses: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # timm: (the arguments its architecture and config.json's model_args set) -> whether this
    # family reads it, where another reads the same class (a hybrid is timm's
    # VisionTransformer on a ResNet).
    reads: Callable = lambda args: True
    # (config, state, projection) -> the (config, state) of the part keras_vit reads of a
    # larger model of the family (CLIPModel's vision tower, ViT-MAE's encoder), or None.
    vision_tower: Optional[Callable] = None
    # ViTConfig -> whether a model of it is written as this family.
    writes: Callable = lambda spec: False
    # (spec, preprocessing, the model's `.npz` arrays or None) -> its config.json, or a
    # LayoutError naming what its classes lack.
    config_for: Optional[Callable] = None
    # spec -> every (`.npz` key, their key, kind) of its weights (`common.to_arrays`).
    weight_pairs: Optional[Callable] = None
    # Where the layout is more than a renaming (packed tensors, rows moved, biases dropped):
    # (state, spec, config or None) -> the `.npz` arrays, and (arrays, spec) -> their state.
    to_arrays: Optional[Callable] = None
    from_arrays: Optional[Callable] = None
    # A NaFlex family (transformers' SigLIP 2, timm's NaFlexVit): its checkpoints load as a
    # `keras_vit.native.NaFlexViT`, and a NaFlexViT is written as its classes (`writes` stays
    # for classic models, which none of them claims).
    native: bool = False

    def to_npz_arrays(self, state, spec, config=None):
        """Their state dict as the `.npz` layout (`common.to_arrays`; timm's through its
        packed tensors and names, `timm_common.to_arrays`)."""
        if self.to_arrays:
            return self.to_arrays(state, spec, config)
        if self.library == "timm":
            return timm_common.to_arrays(state, spec, self.weight_pairs(spec))
        return common.to_arrays(state, self.weight_pairs(spec), spec, self.library)

    def from_npz_arrays(self, arrays, spec):
        """The `.npz` layout as their state dict (`common.from_arrays`, or
        `timm_common.from_arrays`)."""
        if self.from_arrays:
            return self.from_arrays(arrays, spec)
        if self.library == "timm":
            return timm_common.from_arrays(arrays, spec, self.weight_pairs(spec))
        return common.from_arrays(arrays, self.weight_pairs(spec), spec, self.library)

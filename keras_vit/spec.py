"""`ViTConfig`: the one typed description of a ViT architecture, in pure Python.

Every way of making a model goes through it: `keras_vit.vit("B/16", ...)` and the builders,
the training configs (their `config.model` holds its fields), the studies and benchmarks, and
the files the package writes (a `.keras` model, the `.npz` sidecar, the SavedModel assets),
which record it so that a file says what it is. Its fields, allowed values and the rules that
combine them are written here once.

    spec = ViTConfig.from_variant("R50+B/16", num_classes=37, image_size=384)
    spec.to_dict() == ViTConfig.from_dict(spec.to_dict()).to_dict()

A spec validates itself when it is made and reports every problem at once. It needs no Keras,
so configuration checks can use it before TensorFlow starts.
"""

import dataclasses
import inspect
import math
import numbers
import re

from keras_vit import variants
from keras_vit.execution import FIELDS as EXECUTION_FIELDS
from keras_vit.variants import _describe

CLASSIFIERS = ("token", "gap", "map", "token_gap")
# Paper appendix D.4: the absolute kinds (added to tokens) and the relative kinds (in the
# attention); and the fixed 2-D sine-cosine embedding of later ViTs.
POSITION_EMBEDDINGS = ("learned", "learned_2d", "none", "relative", "relative_2d", "sincos_2d",
                       "relative_mlp")
# Only embeddings added to the tokens can be added again before every block (Table 8).
LEARNED_POSITION_EMBEDDINGS = ("learned", "learned_2d")
PLACEMENTS = ("stem", "every_layer", "every_layer_shared")
# How position embeddings are resampled for another grid: the original code's, or timm's.
INTERPOLATIONS = ("bilinear", "bicubic")
# Where the final LayerNorm sits: on every token before pooling (the original), on the pooled
# vector after it (timm's `fc_norm`, its default for GAP), or nowhere.
FINAL_NORMS = ("tokens", "pooled", "none")
# The MLP's activation: the original's tanh-approximate GELU, the exact one, OpenAI CLIP's
# x * sigmoid(1.702 x), or SwiGLU's gated SiLU (a second input projection, the gate).
ACTIVATIONS = ("gelu_tanh", "gelu", "quick_gelu", "swiglu")
# How a hybrid's ResNet normalises: the original code's, or timm's ResNetV2 (keras_vit.resnet).
RESNET_NUMERICS = ("original", "timm")
# Rotary position embeddings of the patches' rows and columns in every attention: at the
# patches' indices (EVA-02, timm's RoPE ViTs), or at their centres scaled to [-1, 1] (DINOv3),
# or learned frequencies mixing both axes (RoPE-Mixed); each kind's default temperature (the
# base of its geometric frequencies; for "mixed", of their initial values).
ROPE_TEMPERATURES = {"axial": 10_000.0, "axial_normalized": 100.0, "mixed": 10.0}
# The fields a variant name fills in, and that a spec may change.
TABLE_FIELDS = variants.OVERRIDABLE_FIELDS
LAYER_NORM_EPSILON = 1e-6  # the original's (Keras' default is 1e-3)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: the fields at fault, their values, and what is required."""

    fields: tuple
    values: tuple
    requirement: str
    error: type = ValueError  # TypeError for a value of the wrong type

    def describe(self, field_name=lambda field: field):
        """`field=value: requirement`, with each field shown as `field_name(field)`."""
        show = _describe if self.error is TypeError else repr
        shown = ", ".join(f"{field_name(field)}={show(value)}"
                          for field, value in zip(self.fields, self.values))
        return f"{shown}: {self.requirement}"


def raise_problems(problems):
    """Raises one error naming every problem: a TypeError when all are wrong types, else a
    ValueError. Does nothing when `problems` is empty."""
    if not problems:
        return
    error = TypeError if all(p.error is TypeError for p in problems) else ValueError
    text = "; ".join(problem.describe() for problem in problems)
    prefix = "Invalid ViT architecture: " if len(problems) > 1 else ""
    raise error(prefix + text + ".")


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """The architecture of a ViT, checked when made; `keras_vit.vit(spec)` builds it.

    Attributes:
        variant: a name from `keras_vit.VARIANT_NAMES` ("B/16", "R50+B/16", "Axial-B/16", ...):
            the transformer size, whether a ResNet stem ("hybrid") comes first, Axial-ViT.
        patch_size, hidden_size, mlp_dim, num_heads, num_layers: the variant's table fields;
            None takes the variant's. Patches are cut from the image, or from the ResNet
            feature map of a hybrid.
        image_size: int or (height, width), stored as a pair; multiples of the pixels per patch.
            The size of the position embeddings' grid (and of the model's input unless
            `dynamic_image_size`).
        num_classes: classes of the head (zero-initialised, as the paper's transfer recipe).
        include_top: False for a model that returns the pooled representation, no head.
        classifier: "token" (the class token), "gap" (mean of the patch tokens), "map"
            (attention pooling of the patch tokens by a learned query; Zhai et al., "Scaling
            Vision Transformers", 2022, as SigLIP) or "token_gap" (the class token and the
            patch tokens' mean side by side, 2 x hidden_size wide: DINOv2's linear classifier,
            transformers' Dinov2ForImageClassification); None takes "token", or "gap" for Axial
            variants (their tokens stay a grid). "gap" and "map" have no class token unless
            `class_token` says so.
        representation_size: width of the tanh "pre_logits" layer before the head; None: none.
        position_embedding: appendix D.4's kinds: "learned" (1-D, the default), "learned_2d"
            (row and column halves), "none", "relative" or "relative_2d" (logits in every
            block's attention); or "sincos_2d", fixed sines and cosines of each patch's row
            and column (no weights; the patches only, not the class and register tokens; as
            big_vision's `posemb_sincos_2d`, used by MAE and by "Better plain ViT baselines for
            ImageNet-1k", Beyer et al., 2022); or "relative_mlp", logits in every block's
            attention from each (row, column) offset between two patches, log-spaced, through
            an MLP of `relative_mlp_dim` hidden units (Swin Transformer V2's continuous
            position bias, timm's `vit_relpos_*`; 0 for pairs with the class token).
        position_embedding_placement: where learned kinds are added (Table 8): "stem" (once,
            before the encoder), "every_layer" (a new one before every block) or
            "every_layer_shared" (the same one before every block).
        dropout: after the position embeddings, the attention and the MLP dense layers; None
            takes the upstream configuration's (0.1 for L/16 and H/14, else 0).
        attention_dropout: on the attention weights.
        drop_path_rate: stochastic depth, rising linearly from 0 at the first block.
        activation: of the MLPs: "gelu_tanh" (the original's tanh-approximate GELU), "gelu"
            (exact), "quick_gelu" (OpenAI CLIP's x * sigmoid(1.702 x)) or "swiglu" (Shazeer,
            "GLU Variants Improve Transformer", 2020, as DINOv2 giant and EVA-02 use it): a
            gated MLP, SiLU(x W_gate) * (x W) of mlp_dim units each (weights `Gate_0` and
            `Dense_0`), then the second projection; a third more weights than a GELU MLP of
            the same mlp_dim. Files and code from before this field may give
            `approximate_gelu=True/False` instead.
        layer_norm_epsilon: of every LayerNorm (the original's 1e-6).
        dynamic_image_size: True for a model that takes images of any size the pixels per patch
            divide (timm's `dynamic_img_size`): the position embeddings, relative position
            tables and Axial-ViT's grid follow the input's size at call time, resampled from
            the `image_size` grid; the same outputs as a model built at that size from the same
            weights.
        dynamic_image_pad: with `dynamic_image_size`, images of any size at all: padded at the
            bottom and right with zeros to a multiple of the pixels per patch.
        position_embedding_interpolation: how position embeddings (and relative tables) are
            resampled for another grid, when weights load and at call time: "bilinear" (the
            original code's) or "bicubic" (timm's `resample_abs_pos_embed`).

    Options of later ViTs (as timm's `VisionTransformer` names them), off by default:
        qkv_bias: biases in the query, key and value projections (False: none, as some
            CLIP-style models).
        layer_scale_init: None, or the initial value of LayerScale (Touvron et al., "Going
            deeper with Image Transformers", 2021; timm's `init_values`): each block's two
            residual branches are multiplied by a learned per-channel scale.
        num_register_tokens: learned tokens after the class token that no output reads
            (Darcet et al., "Vision Transformers Need Registers", 2024; timm's `reg_tokens`).
        prefix_position_embeddings: False for position embeddings of the patches only, none for
            the class and register tokens (timm's `no_embed_class`).
        pre_norm: a LayerNorm (`pre_norm`) on the tokens before the first block (CLIP).
        final_norm: "tokens" (the original: `encoder_norm` on every token, then pooling),
            "pooled" (`fc_norm` on the pooled vector: timm's default for GAP) or "none".
        distillation_token: True for DeiT's distillation token (Touvron et al., "Training
            data-efficient image transformers & distillation through attention", 2021;
            timm's `dist_token`): a second learned token after the class token, with a head of
            its own (`head_dist`) that a distilling run trains on the teacher's logits while
            the class token's head learns the labels. The model outputs the mean of the two
            heads' logits (as DeiT evaluates; without a head, the mean of the two tokens);
            `keras_vit.distillation_heads(model)` gives both. Needs classifier "token", no
            register tokens, final_norm "tokens" and no representation_size.
        class_token: None (a class token for classifier "token" only, the original's rule),
            or True for a class token that a "gap" or "map" classifier leaves out of its
            pooling, as timm's `class_token=True, global_pool="avg"` (DINOv3, EVA-02): it
            attends in every block and is a feature, but the output pools the patches.
        rope: None, or rotary position embeddings (Su et al., "RoFormer", 2021) in every
            block's attention, as Heo et al.'s "Rotary Position Embedding for Vision
            Transformer" (2024) does for images: each head's queries and keys of the patches
            (not the class or register tokens) are rotated in pairs of channels (channel i
            with i + head_dim/2), a quarter of the pairs by the patch's row times a
            frequency, a quarter by its column, so that their products depend on the
            patches' offset. "axial": at the patches' indices, frequencies
            temperature^(-k/(head_dim/4)) (EVA-02, timm's RoPE ViTs); "axial_normalized":
            at the patch centres scaled to [-1, 1] along each side, frequencies
            2 pi temperature^(-k/(head_dim/4)) (DINOv3); both without weights. "mixed":
            Heo et al.'s RoPE-Mixed, learned frequencies for each block, head and pair of
            channels, each angle a row frequency times the row index plus a column frequency
            times the column index (weights `rope/frequencies`, initialised as theirs). Any
            image size. Needs a head_dim that 4 divides, and no relative kind of
            position_embedding; another position_embedding ("learned", "sincos_2d", "none") is
            added as well.
        rope_temperature: the base of rope's frequencies; None takes the kind's (10,000 for
            "axial", 100 for "axial_normalized", 10 for "mixed", where it sets the initial
            frequencies only).
        rope_reference_grid: None, or (rows, columns) for "axial" rope: the patch indices are
            scaled to this grid (timm's `ref_feat_shape`: EVA-02 fine-tuned at a larger size
            keeps the rotations of its pre-training grid).
        residual_post_norm: True for blocks that norm each branch's output before adding it
            to the residual stream, x + LN(attention(x)) and x + LN(MLP(x)) (Liu et al.'s Swin
            Transformer V2 "res-post-norm"; timm's `ResPostBlock`, Eva's `use_post_norm`), in
            place of the pre-norm x + attention(LN(x)); the same weights (`LayerNorm_0`,
            `LayerNorm_2`). Not with layer_scale_init.
        map_num_heads, map_mlp_dim: the heads and MLP width of classifier "map"'s attention
            pooling; None takes num_heads and mlp_dim (Perception Encoder's pooling has 8 heads
            and 4 x hidden_size whatever the model's).
        map_include_prefix: True for classifier "map"'s pooling to attend to the class and
            register tokens too (timm's Eva), not the patches alone (big_vision, timm's
            VisionTransformer).
        resnet_numerics: how a hybrid's ResNet normalises: "original" (the original code's
            weight standardisation (w - mean) / (std + 1e-5) and GroupNorm epsilon 1e-6, as the
            paper's checkpoints were trained) or "timm" (timm's ResNetV2: (w - mean) /
            sqrt(var + 1e-8), GroupNorm epsilon 1e-5; its copies of those checkpoints give its
            logits only so).
        relative_mlp_dim: the hidden units of position_embedding "relative_mlp"'s MLP; None
            takes timm's 128.
        rope_grid_offset: added to the patch indices of "axial" rope before any scaling
            (timm's `rope_grid_offset`: 1 in Perception Encoder's models).
        mlp_inner_norm: a LayerNorm (`inner_norm`) on each MLP's hidden units before its second
            projection (NormFormer, Shleifer et al., 2021; timm's `scale_mlp`, as EVA-02).
        attention_inner_norm: a LayerNorm (`inner_norm`) on each attention's heads, concatenated,
            before its output projection (timm's `scale_attn_inner`, as EVA-02's CLIP towers).
    """

    variant: str = "B/16"
    patch_size: int = None
    hidden_size: int = None
    mlp_dim: int = None
    num_heads: int = None
    num_layers: int = None
    image_size: tuple = 224
    num_classes: int = 1000
    include_top: bool = True
    classifier: str = None
    representation_size: int = None
    position_embedding: str = "learned"
    position_embedding_placement: str = "stem"
    dropout: float = None
    attention_dropout: float = 0.0
    drop_path_rate: float = 0.0
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = LAYER_NORM_EPSILON
    dynamic_image_size: bool = False
    dynamic_image_pad: bool = False
    position_embedding_interpolation: str = "bilinear"
    qkv_bias: bool = True
    layer_scale_init: float = None
    num_register_tokens: int = 0
    prefix_position_embeddings: bool = True
    pre_norm: bool = False
    final_norm: str = "tokens"
    distillation_token: bool = False
    class_token: bool = None
    rope: str = None
    rope_temperature: float = None
    rope_reference_grid: tuple = None
    rope_grid_offset: float = 0.0
    relative_mlp_dim: int = None
    resnet_numerics: str = "original"
    residual_post_norm: bool = False
    map_num_heads: int = None
    map_mlp_dim: int = None
    map_include_prefix: bool = False
    mlp_inner_norm: bool = False
    attention_inner_norm: bool = False

    def __post_init__(self):
        values, problems = _resolved(dataclasses.asdict(self))
        raise_problems(problems)
        for field, value in values.items():
            object.__setattr__(self, field, value)

    @classmethod
    def from_variant(cls, variant, **fields):
        """The spec of a variant name, with any field changed (`TypeError` for unknown ones)."""
        return cls(variant=variant, **_known(fields))

    @classmethod
    def from_dict(cls, fields):
        """The spec that `to_dict()` wrote (a JSON object)."""
        if not isinstance(fields, dict):
            raise TypeError(f"A ViTConfig is read from a dict, got {_describe(fields)}.")
        # Files written when the execution choices were fields of the spec hold them too.
        return cls(**_known({name: value for name, value in fields.items()
                             if name not in EXECUTION_FIELDS}))

    @classmethod
    def problems(cls, **fields):
        """Every `Problem` of a spec with these fields (unknown ones included), without
        raising: for configuration checks that report on their own terms."""
        found = []
        try:
            fields = upgrade_fields(fields)
        except (TypeError, ValueError) as error:
            found.append(Problem(("approximate_gelu",), (fields["approximate_gelu"],),
                                 str(error).removeprefix("approximate_gelu ").split(", got")[0],
                                 type(error)))
            fields = {name: value for name, value in fields.items()
                      if name != "approximate_gelu"}
        unknown = sorted(set(fields) - set(FIELDS))
        found += [Problem((name,), (fields[name],), "not a ViTConfig field", TypeError)
                  for name in unknown]
        return found + _resolved({k: v for k, v in fields.items() if k not in unknown})[1]

    def to_dict(self):
        """The fields as JSON-ready values (`image_size` as a list)."""
        fields = dataclasses.asdict(self)
        fields["image_size"] = list(self.image_size)
        return fields

    def replace(self, **fields):
        """A copy with these fields changed, checked again."""
        return dataclasses.replace(self, **_known(fields))

    @property
    def resnet_units(self):
        """Units per ResNet stage for hybrids, `()` for the stem alone, None for a plain ViT."""
        return variants.variant_table_row(self.variant)["resnet_units"]

    @property
    def axial(self):
        """True for Axial-ViT (appendix D.6): every block is a row block and a column block."""
        return variants.variant_table_row(self.variant)["axial"]

    @property
    def is_hybrid(self):
        return self.resnet_units is not None

    @property
    def resnet_stride(self):
        """Downsampling of the ResNet in front of the patches (1 for a plain ViT)."""
        if self.resnet_units is None:
            return 1
        return 4 * 2 ** max(len(self.resnet_units) - 1, 0)

    @property
    def total_stride(self):
        """Pixels per token along each side of the image."""
        return self.resnet_stride * self.patch_size

    @property
    def grid_size(self):
        """Patches along (height, width)."""
        return tuple(side // self.total_stride for side in self.image_size)

    def grid_for(self, image_size):
        """Patches along (height, width) of images of `image_size` (height, width): whole
        patches, and with `dynamic_image_pad` the padded ones too."""
        stride = self.total_stride
        if self.dynamic_image_pad:
            return tuple(-(-int(side) // stride) for side in image_size)
        return tuple(int(side) // stride for side in image_size)

    @property
    def num_prefix_tokens(self):
        """Tokens before the patches: the class token (if any), the distillation token (if
        any), then the register tokens."""
        return (int(self.class_token) + int(self.distillation_token)
                + self.num_register_tokens)

    @property
    def default_name(self):
        """The model's name, e.g. "vit_b16" or "vit_r50_b16"."""
        return "vit_" + "".join(
            {"/": "", "+": "_", "-": "_"}.get(char, char) for char in self.variant.lower())


FIELDS = tuple(field.name for field in dataclasses.fields(ViTConfig))


def parse_variant(name):
    """The `ViTConfig` of a variant name such as "B/16" or "R50+B/16" (its table fields,
    224x224, 1000 classes): `ViTConfig.from_variant(name)`."""
    return ViTConfig.from_variant(name)


def upgrade_fields(fields):
    """`fields` with `approximate_gelu` (a bool, before `activation` existed) as `activation`."""
    if "approximate_gelu" not in fields:
        return fields
    fields = dict(fields)
    approximate = variants.check_bool("approximate_gelu", fields.pop("approximate_gelu"))
    implied = "gelu_tanh" if approximate else "gelu"
    if fields.setdefault("activation", implied) != implied:
        raise ValueError(f"approximate_gelu must be left out with activation (it is the older "
                         f"name of 'gelu_tanh' and 'gelu'), got approximate_gelu={approximate} "
                         f"and activation={fields['activation']!r}")
    return fields


def _known(fields):
    fields = upgrade_fields(fields)
    unknown = sorted(set(fields) - set(FIELDS))
    moved = [name for name in unknown if name in EXECUTION_FIELDS]
    if moved:
        raise TypeError(
            f"{' and '.join(moved)} {'are' if len(moved) > 1 else 'is'} how a model runs, not "
            "what it is, and no ViTConfig field: pass it to keras_vit.vit(..., "
            f"{moved[0]}=...) or keras_vit.set_execution(model, {moved[0]}=...).")
    if unknown:
        raise TypeError(f"Unknown ViTConfig fields {unknown}; the fields are {list(FIELDS)}.")
    return fields


def _image_size_pair(image_size):
    """`image_size` as (height, width) of ints: an int or a sequence of two."""
    valid = "must be a positive integer or (height, width) of two positive integers"
    if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool):
        image_size = (image_size, image_size)
    elif isinstance(image_size, (str, bytes, dict)) or not hasattr(image_size, "__len__"):
        error = ValueError if isinstance(image_size, dict) else TypeError
        raise error(valid)
    if len(image_size) != 2:
        raise ValueError(valid)
    pair = []
    for side, value in zip(("height", "width"), image_size):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{valid}; its {side} is {_describe(value)}")
        if value <= 0:
            raise ValueError(f"{valid}; its {side} is {value!r}")
        pair.append(int(value))
    return tuple(pair)


def _positive_float(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("must be a positive number")
    if not (math.isfinite(value) and value > 0):
        raise ValueError("must be a positive number")
    return float(value)


def _finite_float(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("must be a number")
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return float(value)


def _resolved(fields):
    """`(values, problems)`: the fields with defaults filled in and types normalised, and
    every `Problem`. A combination rule is checked only when its fields are valid."""
    values, problems = {}, []

    def check(field, function, *args):
        value = fields.get(field, DEFAULTS[field])
        try:
            values[field] = function(value, *args)
        except (TypeError, ValueError) as error:
            requirement = str(error)
            if requirement.startswith(f"{field} must be"):  # variants.check_*: keep "must be"
                requirement = requirement.removeprefix(f"{field} ").split(", got ")[0]
            requirement = requirement.rstrip(".")
            problems.append(Problem((field,), (value,), requirement, type(error)))

    def ok(*names):
        return all(name in values for name in names)

    def add(names, requirement):
        problems.append(Problem(names, tuple(values[name] for name in names), requirement))
        for name in names:
            values.pop(name)

    check("variant", variants.variant_table_row)
    row = values.pop("variant", None)
    if row:
        values["variant"] = row["name"]
    for field in TABLE_FIELDS:
        if fields.get(field) is None:
            if row:
                values[field] = row[field]
        else:
            check(field, lambda value, name=field: variants.check_int(name, value))
    check("image_size", _image_size_pair)
    check("num_classes", lambda value: variants.check_int("num_classes", value))
    check("include_top", lambda value: variants.check_bool("include_top", value))
    classifier = fields.get("classifier")
    if classifier is None and row:
        values["classifier"] = "gap" if row["axial"] else "token"
    elif classifier is not None:
        check("classifier", lambda value: variants.check_choice("classifier", value,
                                                                CLASSIFIERS))
    check("representation_size", lambda value: variants.check_int(
        "representation_size", value, allow_none=True))
    check("position_embedding", lambda value: variants.check_choice(
        "position_embedding", value, POSITION_EMBEDDINGS))
    check("position_embedding_placement", lambda value: variants.check_choice(
        "position_embedding_placement", value, PLACEMENTS))
    if fields.get("dropout") is None and row:
        values["dropout"] = row["dropout"]
    elif fields.get("dropout") is not None:
        check("dropout", lambda value: variants.check_rate("dropout", value))
    for field in ("attention_dropout", "drop_path_rate"):
        check(field, lambda value, name=field: variants.check_rate(name, value))
    check("activation", lambda value: variants.check_choice("activation", value, ACTIVATIONS))
    check("layer_norm_epsilon", _positive_float)
    for field in ("dynamic_image_size", "dynamic_image_pad"):
        check(field, lambda value, name=field: variants.check_bool(name, value))
    check("position_embedding_interpolation", lambda value: variants.check_choice(
        "position_embedding_interpolation", value, INTERPOLATIONS))
    for field in ("qkv_bias", "prefix_position_embeddings", "pre_norm", "distillation_token",
                  "mlp_inner_norm", "attention_inner_norm", "residual_post_norm",
                  "map_include_prefix"):
        check(field, lambda value, name=field: variants.check_bool(name, value))
    if fields.get("layer_scale_init") is None:
        values["layer_scale_init"] = None
    else:
        check("layer_scale_init", _positive_float)
    check("num_register_tokens", lambda value: variants.check_int(
        "num_register_tokens", value, minimum=0))
    check("final_norm", lambda value: variants.check_choice("final_norm", value, FINAL_NORMS))
    _check_class_token(fields, values, check)
    _check_rope(values, check)
    _check_relative_mlp(values, check)
    for field in ("map_num_heads", "map_mlp_dim"):
        check(field, lambda value, name=field: variants.check_int(name, value, allow_none=True))
    map_fields = [name for name in ("map_num_heads", "map_mlp_dim", "map_include_prefix")
                  if ok(name) and values[name] not in (None, False)]
    if map_fields and ok("classifier") and values["classifier"] != "map":
        add(("classifier", *map_fields), "these shape the attention pooling of classifier "
            "'map': set classifier='map', or leave them None (False)")
    elif ok("map_num_heads", "hidden_size") and values["map_num_heads"] and (
            values["hidden_size"] % values["map_num_heads"]):
        add(("map_num_heads", "hidden_size"), "map_num_heads must divide hidden_size (each "
            "head gets an equal share)")
    if ok("residual_post_norm", "layer_scale_init") and (
            values["residual_post_norm"] and values["layer_scale_init"] is not None):
        add(("residual_post_norm", "layer_scale_init"), "post-norm blocks scale each branch "
            "by its norm's own weights (timm's ResPostBlock starts them at init_values): use "
            "layer_scale_init=None with residual_post_norm")
    check("resnet_numerics", lambda value: variants.check_choice(
        "resnet_numerics", value, RESNET_NUMERICS))
    if ok("resnet_numerics") and values["resnet_numerics"] != "original" and not (
            row and row["resnet_units"] is not None):
        add(("variant", "resnet_numerics"), "only a hybrid (R50+B/16, ...) has a ResNet: "
            "leave resnet_numerics 'original'")

    # The rules that combine fields.
    if ok("dynamic_image_size", "dynamic_image_pad") and (
            values["dynamic_image_pad"] and not values["dynamic_image_size"]):
        add(("dynamic_image_pad", "dynamic_image_size"),
            "padding images at call time needs a model of any image size: set "
            "dynamic_image_size=True too")
    if ok("position_embedding", "position_embedding_placement") and (
            values["position_embedding_placement"] != "stem"
            and values["position_embedding"] not in LEARNED_POSITION_EMBEDDINGS):
        add(("position_embedding_placement", "position_embedding"),
            "a placement other than 'stem' adds learned embeddings before every block, so it "
            f"needs position_embedding {' or '.join(map(repr, LEARNED_POSITION_EMBEDDINGS))} "
            "(or placement 'stem')")
    if ok("prefix_position_embeddings", "position_embedding_placement") and (
            not values["prefix_position_embeddings"]
            and values["position_embedding_placement"] != "stem"):
        add(("prefix_position_embeddings", "position_embedding_placement"),
            "position embeddings of the patches only are added once, at the stem: use "
            "placement 'stem' or prefix_position_embeddings=True")
    if row and row["axial"]:  # Axial-ViT's tokens stay a 2-D grid
        if ok("num_register_tokens") and values["num_register_tokens"]:
            add(("variant", "num_register_tokens"),
                "Axial-ViT's tokens are the patch grid alone: use num_register_tokens=0")
        if ok("class_token") and values["class_token"] and values.get("classifier") == "gap":
            add(("variant", "class_token"),
                "Axial-ViT has no class token (its tokens stay a 2-D grid of patches): use "
                "class_token=None")
        if ok("classifier") and values["classifier"] != "gap":
            add(("variant", "classifier"),
                "Axial-ViT has no class token (its tokens stay a 2-D grid of patches): use "
                "classifier='gap' (its default)")
        elif ok("position_embedding") and values["position_embedding"].startswith("relative"):
            add(("variant", "position_embedding"),
                "Axial-ViT takes no relative position embeddings: use 'learned', "
                "'learned_2d' or 'none'")
    if ok("distillation_token") and values["distillation_token"]:
        # DeiT's layout (timm's VisionTransformerDistilled): the class token, the distillation
        # token, the patches; each of the two tokens has its own head.
        needs = (("classifier", "token", "the heads read the class and distillation tokens"),
                 ("num_register_tokens", 0, "DeiT's layout has no register tokens"),
                 ("final_norm", "tokens", "the heads read the normed tokens"),
                 ("representation_size", None, "the heads read the tokens directly"))
        for field, value, reason in needs:
            if ok(field, "distillation_token") and values[field] != value:
                add((field, "distillation_token"), f"{reason}: use {field}={value!r} with a "
                    "distillation token")
    if ok("rope") and values["rope"]:
        if row and row["axial"]:
            add(("variant", "rope"), "Axial-ViT's attention runs along rows and columns; "
                "rotary embeddings are for plain ViT blocks: use rope=None")
        if ok("position_embedding") and values["position_embedding"].startswith("relative"):
            add(("position_embedding", "rope"), "rotary embeddings already make the attention "
                "relative: use position_embedding 'learned', 'sincos_2d' or 'none' with rope")
        if ok("hidden_size", "num_heads") and (values["hidden_size"] // values["num_heads"]) % 4:
            add(("hidden_size", "num_heads", "rope"),
                "rotary embeddings rotate pairs of channels for rows and for columns, so "
                "each head's width (hidden_size / num_heads) must be a multiple of 4")
    if ok("classifier", "final_norm") and (values["classifier"] == "token_gap"
                                            and values["final_norm"] == "pooled"):
        add(("classifier", "final_norm"), "the class token and the patches' mean are normed "
            "as tokens before they are put side by side: use final_norm 'tokens' (DINOv2's) "
            "or 'none' with classifier 'token_gap'")
    if ok("hidden_size", "num_heads") and values["hidden_size"] % values["num_heads"]:
        add(("hidden_size", "num_heads"),
            "num_heads must divide hidden_size (each head gets an equal share); choose "
            f"num_heads among the divisors of {values['hidden_size']}")
    if (ok("position_embedding", "hidden_size") and values["position_embedding"] == "learned_2d"
            and values["hidden_size"] % 2):
        add(("position_embedding", "hidden_size"),
            "learned_2d embeddings need an even hidden_size (half for rows, half for columns)")
    if (ok("position_embedding", "hidden_size") and values["position_embedding"] == "sincos_2d"
            and (values["hidden_size"] % 4 or values["hidden_size"] < 8)):
        add(("position_embedding", "hidden_size"),
            "sincos_2d embeddings need a hidden_size that is a multiple of 4, at least 8 (a sine "
            "and a cosine of at least two frequencies for rows, and for columns)")
    if ok("variant", "patch_size", "image_size"):
        units = row["resnet_units"]
        resnet_stride = 1 if units is None else 4 * 2 ** max(len(units) - 1, 0)
        stride = resnet_stride * values["patch_size"]
        bad = [(side, value) for side, value in zip(("height", "width"), values["image_size"])
               if value % stride]
        if bad:
            side, value = bad[0]
            nearest = max(stride, round(value / stride) * stride)
            how = (f"patch_size {values['patch_size']} on a ResNet of stride {resnet_stride}"
                   if units is not None else f"patch_size {values['patch_size']}")
            add(("image_size",),
                f"its {side} {value} must be a multiple of {stride}, the pixels per patch of "
                f"{values['variant']} ({how}), e.g. {nearest}")
    return values, problems


DEFAULTS = {field.name: field.default for field in dataclasses.fields(ViTConfig)}


def _check_class_token(fields, values, check):
    """class_token: True for classifier "token", its given value (default False) otherwise."""
    classifier = values.get("classifier")
    given = fields.get("class_token")

    def class_token(value):
        if value is None:
            return classifier in ("token", "token_gap")
        value = variants.check_bool("class_token", value)
        if classifier in ("token", "token_gap") and not value:
            raise ValueError(f"the {classifier} classifier reads the class token: use "
                             f"class_token=True (or None) with classifier {classifier!r}")
        return value

    if classifier is not None or given is None:
        check("class_token", class_token)


def _check_relative_mlp(values, check):
    """relative_mlp_dim: its hidden units (128 by default) with position_embedding
    "relative_mlp", None otherwise."""
    kind = values.get("position_embedding")

    def hidden_units(value):
        if kind != "relative_mlp":
            if value is None:
                return None
            raise ValueError("applies to position_embedding 'relative_mlp' only: set it too, "
                             "or leave relative_mlp_dim None")
        return 128 if value is None else variants.check_int("relative_mlp_dim", value)

    check("relative_mlp_dim", hidden_units)


def _check_rope(values, check):
    """rope, rope_temperature (the kind's default filled in) and rope_reference_grid."""
    def kind(value):
        if value is not None and value not in ROPE_TEMPERATURES:
            error = ValueError if isinstance(value, str) else TypeError
            raise error(f"must be None or one of {tuple(ROPE_TEMPERATURES)}")
        return value

    check("rope", kind)
    rope = values.get("rope")

    def only_with_rope(name, parse, off=None, axial_because=None):
        """`name` parsed where rope (or, with `axial_because`, "axial" rope) is on, its value
        `off` (or None) standing for none."""
        def checked(value):
            if value is None or (off is not None and parse(value) == off):
                return off
            if not axial_because and rope is None:
                raise ValueError(f"applies to rotary embeddings only: set rope too, or leave "
                                 f"{name} {off}")
            if axial_because and rope != "axial":
                raise ValueError(f"{axial_because}, so it is for rope='axial' only "
                                 "(normalized coordinates follow the grid)")
            return parse(value)
        check(name, checked)

    only_with_rope("rope_temperature", _positive_float)
    only_with_rope("rope_reference_grid", _image_size_pair, axial_because="scales patch indices")
    only_with_rope("rope_grid_offset", _finite_float, off=0.0,
                   axial_because="shifts patch indices")
    if rope is not None and values.get("rope_temperature", 0) is None:
        values["rope_temperature"] = ROPE_TEMPERATURES[rope]


def field_descriptions():
    """{field: its description}, read from `ViTConfig`'s docstring, the one place each field is
    described (docs/models.md's table of arguments is made from it: `fields_table`)."""
    descriptions, current = {}, []
    for line in inspect.cleandoc(ViTConfig.__doc__).splitlines():
        entry = re.match(r"^    (\w+(?:, \w+)*): (.*)$", line)
        if entry:
            current = entry.group(1).split(", ")
            for name in current:
                descriptions[name] = entry.group(2)
        elif line.startswith("        ") and current:
            for name in current:
                descriptions[name] += " " + line.strip()
        else:
            current = []
    return descriptions


def fields_table():
    """The Markdown table of every field, its default and its description (fields described
    together share a row), as docs/models.md shows it."""
    descriptions = field_descriptions()
    rows, done = ["| field | default | meaning |", "|---|---|---|"], set()
    for field in dataclasses.fields(ViTConfig):
        if field.name in done:
            continue
        together = [name for name in FIELDS if descriptions[name] == descriptions[field.name]]
        done.update(together)
        default = ("the variant's" if field.name in TABLE_FIELDS else
                   f"`{field.default!r}`".replace("'", '"'))
        names = ", ".join(f"`{name}`" for name in together)
        rows.append(f"| {names} | {default} | {descriptions[field.name]} |")
    return "\n".join(rows)


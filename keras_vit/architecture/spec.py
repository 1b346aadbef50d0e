"""`ViTConfig`: the one typed description of a ViT architecture, in pure Python.

Every way of making a model goes through it: `keras_vit.vit("B/16", ...)` and the builders,
the training configs (their `config.model` holds its fields), the studies and benchmarks, and
the files the package writes (a `.keras` model, the `.npz` sidecar, the SavedModel assets),
which record it so that a file says what it is. Its fields are written here once, what each
may be and the rules that combine them in `keras_vit.architecture.spec_rules`, by family of options.
How a model runs (the attention kernel, remat) is no part of it: `keras_vit.architecture.execution`.

    spec = ViTConfig.from_variant("R50+B/16", num_classes=37, image_size=384)
    spec.to_dict() == ViTConfig.from_dict(spec.to_dict()).to_dict()

A spec validates itself when it is made and reports every problem at once. It needs no Keras,
so configuration checks can use it before TensorFlow starts.
"""

import dataclasses
import inspect
import re

from keras_vit.architecture import variants
from keras_vit.architecture.execution import FIELDS as EXECUTION_FIELDS
# What each field may be, and the rules between fields, by family of options.
from keras_vit.architecture.spec_rules import (ACTIVATIONS, ATTENTION_LAYERS,  # noqa: F401
                                               CLASSIFIERS, FINAL_NORMS, INTERPOLATIONS,
                                               LEARNED_POSITION_EMBEDDINGS, NORM_LAYERS,
                                               PLACEMENTS, POSITION_EMBEDDINGS, RESNET_NUMERICS,
                                               ROPE_TEMPERATURES, TABLE_FIELDS, Problem,
                                               resolved)
from keras_vit.architecture.variants import _describe

LAYER_NORM_EPSILON = 1e-6  # the original's (Keras' default is 1e-3)


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
        layer_norm_epsilon: of every norm, LayerNorm or RMSNorm (the original's 1e-6).
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
            and 4 x hidden_size whatever the model's). map_mlp_dim 0: no LayerNorm and MLP
            after the attention, whose output is the pooling's (AIMv2's
            `Aimv2AttentionPoolingHead`; Fini et al., "Multimodal Autoregressive Pre-training
            of Large Vision Encoders", 2024).
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
        relative_mlp_shared: True for one relative-position MLP (weights `relative_position`)
            whose logits every block adds, in place of one per block (timm's
            `shared_rel_pos`, its `vit_srelpos_*`). Needs position_embedding "relative_mlp".
        rope_grid_offset: added to the patch indices of "axial" rope before any scaling
            (timm's `rope_grid_offset`: 1 in Perception Encoder's models).
        mlp_inner_norm: a LayerNorm (`inner_norm`) on each MLP's hidden units before its second
            projection (NormFormer, Shleifer et al., 2021; timm's `scale_mlp`, as EVA-02).
        attention_inner_norm: a LayerNorm (`inner_norm`) on each attention's heads, concatenated,
            before its output projection (timm's `scale_attn_inner`, as EVA-02's CLIP towers).
        norm_layer: the kind of every norm of the model (the blocks', the inner ones, pre_norm,
            the final norm, the attention pooling's, qk_norm's): "layer_norm" (LayerNorm, the
            original's) or "rms_norm" (RMSNorm, Zhang and Sennrich, 2019: x / sqrt(mean(x^2)
            + epsilon) times a learned scale, no centring and no bias; timm's `RmsNorm`, as
            Sapiens2 and AIMv2). Both take layer_norm_epsilon.
        qk_norm: a norm (`norm_layer`'s kind) of each head's queries (`query_norm`) and keys
            (`key_norm`), over its head_dim channels, before rotary embeddings and the
            1/sqrt(head_dim) scale (Dehghani et al., "Scaling Vision Transformers to 22
            Billion Parameters", 2023; timm's `qk_norm`, as Sapiens2).
        num_kv_heads: None (as many key and value heads as query heads), or grouped-query
            attention (Ainslie et al., "GQA", 2023; timm's `num_kv_heads`): the keys and values
            of fewer heads, each shared by num_heads / num_kv_heads consecutive query heads
            (query head h reads key head h // (num_heads / num_kv_heads)), so the key and value
            projections are num_kv_heads * head_dim wide. An int for every block, or one per
            block (Sapiens2 keeps all heads in its first and last 8 blocks). Each must divide
            num_heads. Not with rope "mixed" (its learned frequencies are per query head).
        patch_norm: a norm (`norm_layer`'s kind, weights `patch_norm`) of the patch tokens
            right after the patch embedding, before the position embeddings are added (timm's
            `embed_norm_layer`; AIMv2's `embeddings.rms_norm`).
        proj_bias: False for attention output projections and MLP layers without biases
            (timm's `proj_bias`; AIMv2's, whose Linear layers have none).
        conv_stem: True for MobileCLIP's convolutional stem in place of the patch embedding's
            one convolution (Vasu et al., "MobileCLIP", 2024; timm's `ConvStem`,
            `vit_base_mci_224`): convolutions of kernel = stride patch_size / 4, then 2, each
            to hidden_size / 4 channels with BatchNorm (epsilon 1e-5, momentum 0.9 as
            PyTorch's 0.1) and exact GELU (weights `conv_stem`), then the patch embedding as a
            2x2 convolution with bias (`embedding`). Each token still sees its own patch
            alone. BatchNorm uses its moving statistics at inference and the batch's in
            training (updating them), as PyTorch's. Needs patch_size and hidden_size
            multiples of 4; not with a ResNet stem.
        attention_layer: the kind of every block's attention: "softmax" (the original's) or
            "differential" (Ye et al., "Differential Transformer", 2024; timm's
            `DiffAttention`, `attn_layer='diff'`): each head's queries and keys are two halves
            of head_dim / 2 channels, whose two softmax maps, the second times a learned
            lambda (weights `lambda_q1`, `lambda_k1`, `lambda_q2`, `lambda_k2`: lambda =
            exp(q1.k1) - exp(q2.k2) + lambda_init), are subtracted before they weigh the
            head's values; each head's output is then RMS-normed (`sub_norm`, epsilon 1e-5)
            and scaled by 1 - lambda_init, with lambda_init = 0.8 - 0.6 exp(-0.3 i) in block
            i. Needs an even head_dim; not with rope, relative position embeddings,
            num_kv_heads or Axial-ViT.
        parallel_blocks: True for blocks whose attention and MLP read one norm of the tokens
            side by side, x + attention(LN(x)) + MLP(LN(x)) (Dehghani et al., "Scaling Vision
            Transformers to 22 Billion Parameters", 2023; timm's `ParallelScalingBlock`, and
            `DiffParallelScalingBlock` with attention_layer "differential"): one norm
            (`LayerNorm_0`) and one LayerScale (`layer_scale_0`) a block. Not with
            residual_post_norm or Axial-ViT.
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
    relative_mlp_shared: bool = False
    resnet_numerics: str = "original"
    residual_post_norm: bool = False
    map_num_heads: int = None
    map_mlp_dim: int = None
    map_include_prefix: bool = False
    mlp_inner_norm: bool = False
    attention_inner_norm: bool = False
    norm_layer: str = "layer_norm"
    qk_norm: bool = False
    num_kv_heads: int = None
    patch_norm: bool = False
    proj_bias: bool = True
    conv_stem: bool = False
    attention_layer: str = "softmax"
    parallel_blocks: bool = False

    def __post_init__(self):
        values, problems = resolved(dataclasses.asdict(self), DEFAULTS)
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
        return found + resolved({k: v for k, v in fields.items() if k not in unknown},
                                DEFAULTS)[1]

    def to_dict(self):
        """The fields as JSON-ready values (`image_size` as a list)."""
        fields = dataclasses.asdict(self)
        fields["image_size"] = list(self.image_size)
        if isinstance(self.num_kv_heads, tuple):
            fields["num_kv_heads"] = list(self.num_kv_heads)
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

    def kv_heads(self, index):
        """The key and value heads of block `index`: `num_kv_heads`' (per block, or for all),
        else num_heads."""
        heads = self.num_kv_heads
        if heads is None:
            return self.num_heads
        return heads[index] if isinstance(heads, tuple) else heads

    @property
    def grouped_query(self):
        """Whether any block has fewer key and value heads than query heads."""
        return any(self.kv_heads(index) != self.num_heads for index in range(self.num_layers))

    @property
    def differential(self):
        """Whether the blocks' attention is differential (`attention_layer`)."""
        return self.attention_layer == "differential"

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


DEFAULTS = {field.name: field.default for field in dataclasses.fields(ViTConfig)}


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


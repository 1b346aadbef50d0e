"""What each field of `keras_vit.ViTConfig` may be and the rules that combine them, grouped by
the family of options they belong to: the sizes (the variant and its table), the head
(classifier and pooling), the position embeddings, the blocks, the prefix tokens, rotary
embeddings, Axial-ViT and the hybrids' ResNet. Each family checks its own fields first
(`*_fields`), then, once every field is known to be valid, the combinations it cares about
(`*_rules`); `resolved` runs them all and reports every problem at once. Pure Python, as the
spec: no Keras.
"""

import dataclasses
import math
import numbers

from keras_vit.architecture import variants
from keras_vit.architecture.variants import _describe

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
# The kind of every norm: LayerNorm (the original's) or RMSNorm (timm's RmsNorm: Sapiens2).
NORM_LAYERS = ("layer_norm", "rms_norm")
# The blocks' attention: softmax (the original's), or differential (two softmax maps of half
# the channels, subtracted: timm's DiffAttention).
ATTENTION_LAYERS = ("softmax", "differential")
# How a hybrid's ResNet normalises: the original code's, or timm's ResNetV2
# (keras_vit.layers.resnet).
RESNET_NUMERICS = ("original", "timm")
# Rotary position embeddings of the patches' rows and columns in every attention: at the
# patches' indices (EVA-02, timm's RoPE ViTs), or at their centres scaled to [-1, 1] (DINOv3),
# or learned frequencies mixing both axes (RoPE-Mixed); each kind's default temperature (the
# base of its geometric frequencies; for "mixed", of their initial values).
ROPE_TEMPERATURES = {"axial": 10_000.0, "axial_normalized": 100.0, "mixed": 10.0}
# The fields a variant name fills in, and that a spec may change.
TABLE_FIELDS = variants.OVERRIDABLE_FIELDS


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


class Resolution:
    """The fields of a spec being resolved: `values` (checked, types normalised, defaults
    filled in), the `problems` found, and `row`, what the variant table says of the variant
    (None while the variant is not valid). A field with a problem has no value, so a rule
    that combines fields runs only when all of them are valid (`ok`)."""

    def __init__(self, fields, defaults):
        self.fields, self.defaults = fields, defaults
        self.values, self.problems, self.row = {}, [], None

    def given(self, field):
        return self.fields.get(field, self.defaults[field])

    def check(self, field, parse):
        """`values[field] = parse(the given value)`, or a Problem with what `parse` raised."""
        value = self.given(field)
        try:
            self.values[field] = parse(value)
        except (TypeError, ValueError) as error:
            requirement = str(error)
            if requirement.startswith(f"{field} must be"):  # variants.check_*: keep "must be"
                requirement = requirement.removeprefix(f"{field} ").split(", got ")[0]
            requirement = requirement.rstrip(".")
            self.problems.append(Problem((field,), (value,), requirement, type(error)))

    def check_choice(self, field, choices):
        self.check(field, lambda value: variants.check_choice(field, value, choices))

    def check_bool(self, *fields):
        for field in fields:
            self.check(field, lambda value, name=field: variants.check_bool(name, value))

    def ok(self, *names):
        return all(name in self.values for name in names)

    def add(self, names, requirement):
        """A problem of the valid fields `names` together (they lose their values)."""
        self.problems.append(Problem(names, tuple(self.values[name] for name in names),
                                     requirement))
        for name in names:
            self.values.pop(name)


def resolved(fields, defaults):
    """`(values, problems)` of a spec's `fields` (`defaults` for those not given): every
    family's field checks, then every family's rules."""
    resolution = Resolution(fields, defaults)
    for family_fields in FIELD_CHECKS:
        family_fields(resolution)
    for family_rules in RULES:
        family_rules(resolution)
    return resolution.values, resolution.problems


def image_size_pair(image_size):
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


# The sizes: the variant, the fields of its table, the image and the classes.

def sizes_fields(r):
    r.check("variant", variants.variant_table_row)
    r.row = r.values.pop("variant", None)
    if r.row:
        r.values["variant"] = r.row["name"]
    for field in TABLE_FIELDS:
        if r.fields.get(field) is None:
            if r.row:
                r.values[field] = r.row[field]
        else:
            r.check(field, lambda value, name=field: variants.check_int(name, value))
    r.check("image_size", image_size_pair)
    r.check("num_classes", lambda value: variants.check_int("num_classes", value))
    r.check_bool("include_top")


def sizes_rules(r):
    if r.ok("hidden_size", "num_heads") and r.values["hidden_size"] % r.values["num_heads"]:
        r.add(("hidden_size", "num_heads"),
              "num_heads must divide hidden_size (each head gets an equal share); choose "
              f"num_heads among the divisors of {r.values['hidden_size']}")
    if not r.ok("variant", "patch_size", "image_size"):
        return
    units = r.row["resnet_units"]
    resnet_stride = 1 if units is None else 4 * 2 ** max(len(units) - 1, 0)
    stride = resnet_stride * r.values["patch_size"]
    bad = [(side, value) for side, value in zip(("height", "width"), r.values["image_size"])
           if value % stride]
    if bad:
        side, value = bad[0]
        nearest = max(stride, round(value / stride) * stride)
        how = (f"patch_size {r.values['patch_size']} on a ResNet of stride {resnet_stride}"
               if units is not None else f"patch_size {r.values['patch_size']}")
        r.add(("image_size",), f"its {side} {value} must be a multiple of {stride}, the pixels "
              f"per patch of {r.values['variant']} ({how}), e.g. {nearest}")


# The head: the classifier, its pooling (attention pooling's own sizes), the class token,
# the pre-logits layer and the final norm.

def head_fields(r):
    if r.fields.get("classifier") is None and r.row:
        r.values["classifier"] = "gap" if r.row["axial"] else "token"
    elif r.fields.get("classifier") is not None:
        r.check_choice("classifier", CLASSIFIERS)
    r.check("representation_size", lambda value: variants.check_int(
        "representation_size", value, allow_none=True))
    r.check_choice("final_norm", FINAL_NORMS)
    _class_token(r)
    r.check_bool("map_include_prefix")
    r.check("map_num_heads", lambda value: variants.check_int("map_num_heads", value,
                                                              allow_none=True))
    # 0: no LayerNorm and MLP after the pooling's attention (AIMv2's head)
    r.check("map_mlp_dim", lambda value: variants.check_int("map_mlp_dim", value, minimum=0,
                                                            allow_none=True))


def _class_token(r):
    """class_token: True for classifier "token", its given value (default False) otherwise."""
    classifier = r.values.get("classifier")

    def class_token(value):
        if value is None:
            return classifier in ("token", "token_gap")
        value = variants.check_bool("class_token", value)
        if classifier in ("token", "token_gap") and not value:
            raise ValueError(f"the {classifier} classifier reads the class token: use "
                             f"class_token=True (or None) with classifier {classifier!r}")
        return value

    if classifier is not None or r.fields.get("class_token") is None:
        r.check("class_token", class_token)


def head_rules(r):
    values = r.values
    map_fields = [name for name in ("map_num_heads", "map_mlp_dim", "map_include_prefix")
                  if r.ok(name) and values[name] is not None and values[name] is not False]
    if map_fields and r.ok("classifier") and values["classifier"] != "map":
        r.add(("classifier", *map_fields), "these shape the attention pooling of classifier "
              "'map': set classifier='map', or leave them None (False)")
    elif r.ok("map_num_heads", "hidden_size") and values["map_num_heads"] and (
            values["hidden_size"] % values["map_num_heads"]):
        r.add(("map_num_heads", "hidden_size"), "map_num_heads must divide hidden_size (each "
              "head gets an equal share)")
    if r.ok("classifier", "final_norm") and (values["classifier"] == "token_gap"
                                              and values["final_norm"] == "pooled"):
        r.add(("classifier", "final_norm"), "the class token and the patches' mean are normed "
              "as tokens before they are put side by side: use final_norm 'tokens' (DINOv2's) "
              "or 'none' with classifier 'token_gap'")


# The position embeddings: their kind, placement, resampling, and a model of any image size.

def positions_fields(r):
    r.check_choice("position_embedding", POSITION_EMBEDDINGS)
    r.check_choice("position_embedding_placement", PLACEMENTS)
    r.check_choice("position_embedding_interpolation", INTERPOLATIONS)
    r.check_bool("dynamic_image_size", "dynamic_image_pad", "prefix_position_embeddings",
                 "relative_mlp_shared")
    _relative_mlp(r)


def _relative_mlp(r):
    """relative_mlp_dim: its hidden units (128 by default) with position_embedding
    "relative_mlp", None otherwise."""
    kind = r.values.get("position_embedding")

    def hidden_units(value):
        if kind != "relative_mlp":
            if value is None:
                return None
            raise ValueError("applies to position_embedding 'relative_mlp' only: set it too, "
                             "or leave relative_mlp_dim None")
        return 128 if value is None else variants.check_int("relative_mlp_dim", value)

    r.check("relative_mlp_dim", hidden_units)


def positions_rules(r):
    values = r.values
    if r.ok("relative_mlp_shared", "position_embedding") and (
            values["relative_mlp_shared"] and values["position_embedding"] != "relative_mlp"):
        r.add(("relative_mlp_shared", "position_embedding"),
              "shares the MLP of position_embedding 'relative_mlp' between the blocks: set "
              "position_embedding='relative_mlp' too, or leave relative_mlp_shared False")
    if r.ok("dynamic_image_size", "dynamic_image_pad") and (
            values["dynamic_image_pad"] and not values["dynamic_image_size"]):
        r.add(("dynamic_image_pad", "dynamic_image_size"),
              "padding images at call time needs a model of any image size: set "
              "dynamic_image_size=True too")
    if r.ok("position_embedding", "position_embedding_placement") and (
            values["position_embedding_placement"] != "stem"
            and values["position_embedding"] not in LEARNED_POSITION_EMBEDDINGS):
        r.add(("position_embedding_placement", "position_embedding"),
              "a placement other than 'stem' adds learned embeddings before every block, so it "
              f"needs position_embedding {' or '.join(map(repr, LEARNED_POSITION_EMBEDDINGS))} "
              "(or placement 'stem')")
    if r.ok("prefix_position_embeddings", "position_embedding_placement") and (
            not values["prefix_position_embeddings"]
            and values["position_embedding_placement"] != "stem"):
        r.add(("prefix_position_embeddings", "position_embedding_placement"),
              "position embeddings of the patches only are added once, at the stem: use "
              "placement 'stem' or prefix_position_embeddings=True")
    kind = values.get("position_embedding") if r.ok("position_embedding", "hidden_size") else None
    if kind == "learned_2d" and values["hidden_size"] % 2:
        r.add(("position_embedding", "hidden_size"),
              "learned_2d embeddings need an even hidden_size (half for rows, half for columns)")
    elif kind == "sincos_2d" and (values["hidden_size"] % 4 or values["hidden_size"] < 8):
        r.add(("position_embedding", "hidden_size"),
              "sincos_2d embeddings need a hidden_size that is a multiple of 4, at least 8 (a "
              "sine and a cosine of at least two frequencies for rows, and for columns)")


# The blocks: regularisation, activation, norms, LayerScale and post-norm.

def blocks_fields(r):
    if r.fields.get("dropout") is None and r.row:
        r.values["dropout"] = r.row["dropout"]
    elif r.fields.get("dropout") is not None:
        r.check("dropout", lambda value: variants.check_rate("dropout", value))
    for field in ("attention_dropout", "drop_path_rate"):
        r.check(field, lambda value, name=field: variants.check_rate(name, value))
    r.check_choice("activation", ACTIVATIONS)
    r.check_choice("norm_layer", NORM_LAYERS)
    r.check_choice("attention_layer", ATTENTION_LAYERS)
    r.check("layer_norm_epsilon", _positive_float)
    r.check_bool("qkv_bias", "pre_norm", "mlp_inner_norm", "attention_inner_norm",
                 "residual_post_norm", "qk_norm", "patch_norm", "proj_bias",
                 "parallel_blocks")
    r.check("num_kv_heads", _kv_heads)
    if r.fields.get("layer_scale_init") is None:
        r.values["layer_scale_init"] = None
    else:
        r.check("layer_scale_init", _positive_float)


def _kv_heads(value):
    """num_kv_heads: None, a positive int, or a tuple of them (one per block; a JSON list)."""
    valid = "must be None, a positive integer or a sequence of them (one per block)"
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        heads = []
        for index, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, numbers.Integral):
                raise TypeError(f"{valid}; its entry {index} is {_describe(item)}")
            if item < 1:
                raise ValueError(f"{valid}; its entry {index} is {item!r}")
            heads.append(int(item))
        if not heads:
            raise ValueError(f"{valid}; it is empty")
        return tuple(heads)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(valid)
    if value < 1:
        raise ValueError(valid)
    return int(value)


def blocks_rules(r):
    heads = r.values.get("num_kv_heads") if r.ok("num_kv_heads", "num_heads") else None
    if isinstance(heads, tuple) and r.ok("num_layers") and len(heads) != r.values["num_layers"]:
        r.add(("num_kv_heads", "num_layers"), f"give one number of key and value heads per "
              f"block ({r.values['num_layers']}), or one int for every block")
    elif heads is not None:
        num_heads = r.values["num_heads"]
        wrong = sorted({h for h in (heads if isinstance(heads, tuple) else (heads,))
                        if num_heads % h})
        if wrong:
            divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
            r.add(("num_kv_heads", "num_heads"), f"each key and value head serves an equal "
                  f"group of query heads, so num_kv_heads must divide num_heads ({wrong} do "
                  f"not): choose among {divisors}")
        elif r.ok("rope") and r.values["rope"] == "mixed" and any(
                h != num_heads for h in (heads if isinstance(heads, tuple) else (heads,))):
            r.add(("num_kv_heads", "rope"), "rope 'mixed' learns frequencies for each query "
                  "head, which grouped keys do not have: use rope 'axial' or "
                  "'axial_normalized' with num_kv_heads, or num_kv_heads=None")
    _differential_rules(r)
    if r.ok("residual_post_norm", "parallel_blocks") and (
            r.values["residual_post_norm"] and r.values["parallel_blocks"]):
        r.add(("residual_post_norm", "parallel_blocks"), "a parallel block norms its input "
              "once for both branches: use residual_post_norm=False with parallel_blocks")
    if r.ok("residual_post_norm", "layer_scale_init") and (
            r.values["residual_post_norm"] and r.values["layer_scale_init"] is not None):
        r.add(("residual_post_norm", "layer_scale_init"), "post-norm blocks scale each branch "
              "by its norm's own weights (timm's ResPostBlock starts them at init_values): use "
              "layer_scale_init=None with residual_post_norm")


def _differential_rules(r):
    """Differential attention: two halves of each head's channels, and none of the other
    attentions' positions or grouping (timm's DiffAttention has none of them)."""
    if not (r.ok("attention_layer") and r.values["attention_layer"] == "differential"):
        return
    if r.ok("hidden_size", "num_heads") and (r.values["hidden_size"]
                                             // r.values["num_heads"]) % 2:
        r.add(("hidden_size", "num_heads", "attention_layer"), "differential attention splits "
              "each head's queries and keys into two halves, so each head's width "
              "(hidden_size / num_heads) must be even")
    heads = r.values.get("num_kv_heads") if r.ok("num_kv_heads", "num_heads") else None
    if heads is not None and any(h != r.values["num_heads"] for h in
                                 (heads if isinstance(heads, tuple) else (heads,))):
        r.add(("num_kv_heads", "attention_layer"), "differential attention has a key and value "
              "head for each query head: use num_kv_heads=None with it")
    if r.ok("rope") and r.values["rope"]:
        r.add(("rope", "attention_layer"), "keras_vit's differential attention has no rotary "
              "embeddings (nor has timm's DiffAttention): use rope=None with it")
    if r.ok("position_embedding") and r.values["position_embedding"].startswith("relative"):
        r.add(("position_embedding", "attention_layer"), "keras_vit's differential attention "
              "takes no relative position logits (nor does timm's DiffAttention): use "
              "position_embedding 'learned', 'sincos_2d' or 'none' with it")


# The prefix tokens beside the class token: registers and DeiT's distillation token.

def tokens_fields(r):
    r.check("num_register_tokens", lambda value: variants.check_int(
        "num_register_tokens", value, minimum=0))
    r.check_bool("distillation_token")


def tokens_rules(r):
    if not (r.ok("distillation_token") and r.values["distillation_token"]):
        return
    # DeiT's layout (timm's VisionTransformerDistilled): the class token, the distillation
    # token, the patches; each of the two tokens has its own head.
    needs = (("classifier", "token", "the heads read the class and distillation tokens"),
             ("num_register_tokens", 0, "DeiT's layout has no register tokens"),
             ("final_norm", "tokens", "the heads read the normed tokens"),
             ("representation_size", None, "the heads read the tokens directly"))
    for field, value, reason in needs:
        if r.ok(field, "distillation_token") and r.values[field] != value:
            r.add((field, "distillation_token"), f"{reason}: use {field}={value!r} with a "
                  "distillation token")


# Rotary position embeddings.

def rope_fields(r):
    """rope, rope_temperature (the kind's default filled in) and rope_reference_grid."""
    def kind(value):
        if value is not None and value not in ROPE_TEMPERATURES:
            error = ValueError if isinstance(value, str) else TypeError
            raise error(f"must be None or one of {tuple(ROPE_TEMPERATURES)}")
        return value

    r.check("rope", kind)
    rope = r.values.get("rope")

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
        r.check(name, checked)

    only_with_rope("rope_temperature", _positive_float)
    only_with_rope("rope_reference_grid", image_size_pair, axial_because="scales patch indices")
    only_with_rope("rope_grid_offset", _finite_float, off=0.0,
                   axial_because="shifts patch indices")
    if rope is not None and r.values.get("rope_temperature", 0) is None:
        r.values["rope_temperature"] = ROPE_TEMPERATURES[rope]


def rope_rules(r):
    if not (r.ok("rope") and r.values["rope"]):
        return
    if r.ok("position_embedding") and r.values["position_embedding"].startswith("relative"):
        r.add(("position_embedding", "rope"), "rotary embeddings already make the attention "
              "relative: use position_embedding 'learned', 'sincos_2d' or 'none' with rope")
    if r.ok("hidden_size", "num_heads") and (r.values["hidden_size"]
                                             // r.values["num_heads"]) % 4:
        r.add(("hidden_size", "num_heads", "rope"),
              "rotary embeddings rotate pairs of channels for rows and for columns, so each "
              "head's width (hidden_size / num_heads) must be a multiple of 4")


# Axial-ViT (appendix D.6): row and column blocks over a 2-D grid of patch tokens.

def axial_rules(r):
    if not (r.row and r.row["axial"]):
        return
    values = r.values
    if r.ok("num_register_tokens") and values["num_register_tokens"]:
        r.add(("variant", "num_register_tokens"),
              "Axial-ViT's tokens are the patch grid alone: use num_register_tokens=0")
    if r.ok("class_token") and values["class_token"] and values.get("classifier") == "gap":
        r.add(("variant", "class_token"), "Axial-ViT has no class token (its tokens stay a "
              "2-D grid of patches): use class_token=None")
    if r.ok("classifier") and values["classifier"] != "gap":
        r.add(("variant", "classifier"), "Axial-ViT has no class token (its tokens stay a "
              "2-D grid of patches): use classifier='gap' (its default)")
    elif r.ok("position_embedding") and values["position_embedding"].startswith("relative"):
        r.add(("variant", "position_embedding"), "Axial-ViT takes no relative position "
              "embeddings: use 'learned', 'learned_2d' or 'none'")
    if r.ok("rope") and values["rope"]:
        r.add(("variant", "rope"), "Axial-ViT's attention runs along rows and columns; "
              "rotary embeddings are for plain ViT blocks: use rope=None")
    if r.ok("attention_layer") and values["attention_layer"] != "softmax":
        r.add(("variant", "attention_layer"), "Axial-ViT's row and column blocks have softmax "
              "attention; differential attention is for plain ViT blocks: use "
              "attention_layer='softmax'")
    if r.ok("parallel_blocks") and values["parallel_blocks"]:
        r.add(("variant", "parallel_blocks"), "Axial-ViT's row and column blocks each run their "
              "attention before their MLP; parallel blocks are for plain ViT blocks: use "
              "parallel_blocks=False")


# The stems before the patch embedding: the hybrids' ResNet, MobileCLIP's convolutions.

def hybrid_fields(r):
    r.check_choice("resnet_numerics", RESNET_NUMERICS)
    r.check_bool("conv_stem")


def hybrid_rules(r):
    if r.ok("resnet_numerics") and r.values["resnet_numerics"] != "original" and not (
            r.row and r.row["resnet_units"] is not None):
        r.add(("variant", "resnet_numerics"), "only a hybrid (R50+B/16, ...) has a ResNet: "
              "leave resnet_numerics 'original'")
    if not (r.ok("conv_stem") and r.values["conv_stem"]):
        return
    if r.ok("variant") and r.row["resnet_units"] is not None:
        r.add(("variant", "conv_stem"), "a hybrid's ResNet already makes the patches' map: use "
              "a plain ViT variant ('B/16', ...) with conv_stem, or conv_stem=False")
        return
    for field, why in (("patch_size", "its first convolution steps patch_size / 4 pixels, "
                        "then two of 2"), ("hidden_size", "its convolutions have hidden_size / "
                                           "4 channels")):
        if r.ok(field, "conv_stem") and r.values[field] % 4:
            size = r.values[field]
            r.add((field, "conv_stem"), f"{why}, so {field} must be a multiple of 4 with "
                  f"conv_stem: use {max(4, size // 4 * 4)}, or conv_stem=False")


FIELD_CHECKS = (sizes_fields, head_fields, positions_fields, blocks_fields, tokens_fields,
                rope_fields, hybrid_fields)
RULES = (hybrid_rules, positions_rules, axial_rules, tokens_rules, rope_rules, head_rules,
         blocks_rules, sizes_rules)

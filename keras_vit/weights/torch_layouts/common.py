"""What both libraries' layouts share: the error they raise, the transforms between PyTorch's
tensors and the `.npz` layout's, the pairs (`.npz` key, their key, kind) of an encoder block and
of common layers, the mapping of a whole state dict through such pairs with its checks, packed
tensors, the spec a checkpoint's sizes make, the checks of a config against its weights, and
the questions about a spec both ask (its key bias, its kind of attention pooling)."""

import math
import re

import numpy as np

from keras_vit.architecture import variants
from keras_vit.architecture.spec import ViTConfig


class LayoutError(ValueError):
    """A config or a set of weights these layouts cannot map, with the reason and the fix."""


def transforms(head_dim):
    """kind -> (to the `.npz` layout, back to PyTorch's), attention split in heads of
    `head_dim` channels (grouped-query attention's keys and values have fewer heads)."""
    return {
        "copy": (lambda v: v, lambda v: v),
        "linear": (lambda v: v.T, lambda v: v.T),
        "conv": (lambda v: v.transpose(2, 3, 1, 0), lambda v: v.transpose(3, 2, 0, 1)),
        # q, k, v: Linear (heads * head_dim, D) -> kernel (D, heads, head_dim); bias (heads,
        # head_dim).
        "heads_in": (lambda v: v.T.reshape(v.shape[1], -1, head_dim),
                     lambda v: v.reshape(v.shape[0], -1).T),
        "heads_bias": (lambda v: v.reshape(-1, head_dim), lambda v: v.reshape(-1)),
        # the output projection: Linear (D, D) -> kernel (heads, D / heads, D).
        "heads_out": (lambda v: v.T.reshape(-1, head_dim, v.shape[0]),
                      lambda v: v.reshape(-1, v.shape[-1]).T),
        # CLIP's class token (D,) and an nn.Embedding's position rows (tokens, D).
        "vector_token": (lambda v: v.reshape(1, 1, -1), lambda v: v.reshape(-1)),
        "rows": (lambda v: v[None], lambda v: v[0]),
    }


def block_pairs(index, theirs, spec):
    """(`.npz` key, their key, kind) of one encoder block, with `theirs` naming their layers."""
    ours = f"Transformer/encoderblock_{index}/"
    attention = ours + "MultiHeadDotProductAttention_1/"
    pairs = []
    for name in ("query", "key", "value"):
        pairs.append((attention + f"{name}/kernel", theirs[name] + ".weight", "heads_in"))
        if spec.qkv_bias:
            pairs.append((attention + f"{name}/bias", theirs[name] + ".bias", "heads_bias"))
    pairs += [(attention + "out/kernel", theirs["out"] + ".weight", "heads_out"),
              (attention + "out/bias", theirs["out"] + ".bias", "copy")]
    if spec.qk_norm:  # timm's Eva's attention: q_norm, k_norm
        pairs += (norm_pairs(attention + "query_norm", theirs["query_norm"], spec)
                  + norm_pairs(attention + "key_norm", theirs["key_norm"], spec))
    if (spec.differential or spec.parallel_blocks) and "sub_norm" not in theirs:
        raise LayoutError("Only timm's VisionTransformer has differential attention and "
                          "parallel blocks (attention_layer='differential', parallel_blocks: "
                          "its DiffAttention, ParallelScalingBlock, DiffParallelScalingBlock); "
                          "save this model with format='timm'.")
    if spec.differential:  # lambda's four vectors, each head's RMSNorm (no bias)
        pairs += [(attention + name, theirs[name], "copy") for name in LAMBDAS]
        pairs.append((attention + "sub_norm/scale", theirs["sub_norm"] + ".weight", "copy"))
    norms = (("LayerNorm_0", "norm_0"),) + ((("LayerNorm_2", "norm_2"),)
                                            if not spec.parallel_blocks else ())
    for ours_name, their_name in norms:
        pairs += norm_pairs(ours + ours_name, theirs[their_name], spec)
    mlp = (("Dense_0", "fc_0"), ("Dense_1", "fc_1"))
    if spec.activation == "swiglu":  # the gate: a second input projection
        mlp += (("Gate_0", "gate"),)
    for ours_name, their_name in mlp:
        pairs += dense_pairs(ours + "MlpBlock_3/" + ours_name, theirs[their_name])
    if (spec.position_embedding == "relative_mlp" and not spec.relative_mlp_shared
            and "relative_fc_0" in theirs):
        # timm's VisionTransformerRelPos: RelPosMlp's fc1 (2 -> hidden), fc2 (hidden -> heads)
        for index in range(2):
            pairs += dense_pairs(attention + f"relative_position/fc{index + 1}",
                                 theirs[f"relative_fc_{index}"])
    if spec.layer_scale_init is not None:  # timm's and DINOv2's LayerScale (not ViT's)
        pairs += [(ours + f"layer_scale_{branch}/scale", theirs[f"scale_{branch}"], "copy")
                  for branch in range(1 if spec.parallel_blocks else 2)]
    for inner, ours_name, their_name in (
            (spec.attention_inner_norm, attention + "inner_norm", "attention_norm"),
            (spec.mlp_inner_norm, ours + "MlpBlock_3/inner_norm", "mlp_norm")):
        if inner and their_name not in theirs:  # timm's Eva alone has them
            raise LayoutError("Only timm's Eva has LayerNorms inside the attention or the MLP "
                              "(attention_inner_norm, mlp_inner_norm: its scale_attn_inner, "
                              "scale_mlp); save this model with format='timm'.")
        if inner:
            pairs += norm_pairs(ours_name, theirs[their_name], spec)
    return pairs


# Differential attention's weights of lambda (timm's names, and keras_vit's).
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def norm_pairs(ours, theirs, spec=None):
    """A norm's (`.npz` key, their key, kind): a LayerNorm's scale and bias, an RMSNorm's
    (`spec.norm_layer`) scale alone."""
    pairs = [(ours + "/scale", theirs + ".weight", "copy")]
    if spec is None or spec.norm_layer == "layer_norm":
        pairs.append((ours + "/bias", theirs + ".bias", "copy"))
    return pairs


def dense_pairs(ours, theirs):
    """A Linear layer's (`.npz` key, their key, kind): kernel and bias."""
    return [(ours + "/kernel", theirs + ".weight", "linear"),
            (ours + "/bias", theirs + ".bias", "copy")]


def attention_pool_pairs(theirs, probe, attention, norm, spec=None):
    """The attention pooling (the original's MAPHead, timm's AttentionPoolLatent, SigLIP's
    head) under `theirs`: its `probe`, the `attention`'s query, key, value and output
    projections, its MLP (`mlp.fc1`, `mlp.fc2`) and LayerNorm (`norm`), as they name them."""
    ours = "MAPHead_0/"
    pairs = [(ours + "probe", theirs + probe, "copy")]
    for name, their_name in zip(("query", "key", "value", "out"), attention):
        pairs += dense_pairs(ours + name, theirs + their_name)
    for index in range(2):
        pairs += dense_pairs(f"{ours}MlpBlock_0/Dense_{index}", f"{theirs}mlp.fc{index + 1}")
    return pairs + norm_pairs(ours + "LayerNorm_0", theirs + norm, spec)


def encoder_pairs(spec, block, names):
    """Every block's pairs: `block` formats a block's index into its prefix, `names` name its
    layers after it (`block_pairs`)."""
    pairs = []
    for index in range(spec.num_layers):
        prefix = block.format(index)
        pairs += block_pairs(index, {key: prefix + value for key, value in names.items()}, spec)
    return pairs


def to_arrays(state, pairs, spec, layout):
    """Their state dict (name -> array) as the `.npz` layout through `pairs`. Every tensor must
    be used and every expected one present: a LayoutError names the rest. A model with a norm
    before the blocks (timm's, CLIP's) has no patch bias there: a zero one."""
    state, kinds = dict(state), transforms(spec.hidden_size // spec.num_heads)
    arrays, missing = {}, []
    for ours, theirs, kind in pairs:
        if theirs not in state:
            missing.append(theirs)
            continue
        arrays[ours] = kinds[kind][0](np.asarray(state.pop(theirs)))
    if missing or state:
        problems = [f"missing ({len(missing)}): {', '.join(missing[:8])}"] if missing else []
        if state:
            problems.append(f"unexpected ({len(state)}): {', '.join(sorted(state)[:8])}")
        raise LayoutError(
            f"The {layout} weights do not fit the architecture their config describes: "
            f"{'; '.join(problems)}. Nothing was loaded. They may need an option keras_vit "
            "does not have yet.")
    if spec.pre_norm and "embedding/bias" not in arrays:
        arrays["embedding/bias"] = np.zeros_like(arrays["embedding/kernel"][0, 0, 0])
    return arrays


def from_arrays(arrays, pairs, spec, layout):
    """The inverse of `to_arrays`: the `.npz` layout as their state dict, or a LayoutError for
    weights `pairs` have no place for."""
    unwritten = sorted(set(arrays) - {ours for ours, _, _ in pairs})
    if unwritten:  # an option whose weights the layout has no place for yet
        raise LayoutError(
            f"The {layout} layout of this model has no place for {len(unwritten)} of its "
            f"weights: {', '.join(unwritten[:8])}. Nothing was written; keras_vit does not map "
            f"that option to {layout} yet.")
    kinds = transforms(spec.hidden_size // spec.num_heads)
    return {theirs: np.ascontiguousarray(kinds[kind][1](arrays[ours]))
            for ours, theirs, kind in pairs}


def unpacked(state, packings):
    """`state` with each tensor packed as one of `packings` says split into its parts. torch
    keeps some tensors packed along their first axis; each packing is (the pattern of the
    packed tensor's base name, what joins base and kind in its key, the parts in their order),
    and the parts are named `{base}.{part}.{kind}`."""
    split = dict(state)
    for base, joiner, parts in packings:
        pattern = re.compile(rf"({base}){re.escape(joiner)}(weight|bias)$")
        for key, value in state.items():
            match = pattern.fullmatch(key)
            if match:
                del split[key]
                for part, name in zip(np.split(value, len(parts), axis=0), parts):
                    split[f"{match[1]}.{name}.{match[2]}"] = part
    return split


def packed(state, packings):
    """The inverse of `unpacked`: the parts concatenated in their order."""
    joined = dict(state)
    for base, joiner, parts in packings:
        first = re.compile(rf"({base})\.{parts[0]}\.(weight|bias)$")
        for key in state:
            match = first.fullmatch(key)
            names = match and [f"{match[1]}.{name}.{match[2]}" for name in parts]
            if names and all(name in joined for name in names):
                joined[f"{match[1]}{joiner}{match[2]}"] = np.concatenate(
                    [joined.pop(name) for name in names])
    return joined


ATTENTION = "Transformer/encoderblock_{}/MultiHeadDotProductAttention_1/"
POSITIONS = "Transformer/posembed_input/pos_embedding"


def key_bias(arrays, spec):
    """Whether any block's key projection has a non-zero bias (which RoPE does not cancel:
    it turns the patches' keys, so the bias changes their logits)."""
    return spec.qkv_bias and any(
        np.any(arrays[ATTENTION.format(index) + "key/bias"])
        for index in range(spec.num_layers))


def eva_pooling(spec):
    """Whether the model's attention pooling is timm's Eva's, not its VisionTransformer's
    (whose pooling has the blocks' heads and MLP width and leaves the prefix tokens out): one
    over the class and register tokens too, or of its own heads or MLP width."""
    return spec.classifier == "map" and bool(
        (spec.map_include_prefix and spec.num_prefix_tokens)
        or spec.map_num_heads not in (None, spec.num_heads)
        or spec.map_mlp_dim not in (None, 0, spec.mlp_dim))  # 0: AIMv2's, no MLP


def fold_patch_bias(arrays, spec):
    """The arrays with the patch embedding's bias added to the patches' position embeddings
    instead, for timm and CLIP, whose patch embeddings have no bias before a pre-norm. Exact:
    both are added to every patch token, and resampling (weights that sum to 1) keeps a
    constant."""
    arrays = dict(arrays)
    bias = arrays.pop("embedding/bias")
    rows = spec.num_prefix_tokens if spec.prefix_position_embeddings else 0
    embeddings = arrays[POSITIONS].copy()
    embeddings[:, rows:] += bias.astype(embeddings.dtype)
    arrays[POSITIONS] = embeddings
    return arrays


def _variant_for(hidden, mlp, heads, layers, patch):
    """A variant name of the table with these sizes (any patch size), else "B/16"; the spec
    overrides every table field anyway, the name only makes the model's name familiar."""
    for name in variants.VARIANT_NAMES:
        row = variants.variant_table_row(name)
        if (row["resnet_units"] is None and not row["axial"]
                and (row["hidden_size"], row["mlp_dim"], row["num_heads"],
                     row["num_layers"], row["patch_size"]) == (hidden, mlp, heads, layers, patch)):
            return name
    return "B/16"


def sized_spec(hidden, mlp, heads, layers, patch, variant=None, **fields):
    """The `ViTConfig` of a checkpoint of these sizes and `fields`."""
    return ViTConfig(variant=variant or _variant_for(hidden, mlp, heads, layers, patch),
                     hidden_size=hidden,
                     mlp_dim=mlp, num_heads=heads, num_layers=layers, patch_size=patch, **fields)


def tensor(state, name, layout):
    """`state[name]`, or a LayoutError saying that the weights are not in the layout of their
    config.json (`layout`), naming a tensor they do hold."""
    if name in state:
        return state[name]
    found = next((key for key in sorted(state) if "patch" in key), None) or min(state, default="")
    raise LayoutError(
        f"config.json is {layout}'s, but model.safetensors has no {name!r} (it holds "
        f"{found!r}, ...): the two files come from different libraries or models. Put the "
        "config.json written with these weights beside them.")


def check_grid(position_embeddings, image_size, patch, prefix_tokens, field):
    """A LayoutError unless `position_embeddings` [1, tokens, D] hold `prefix_tokens` and one
    per patch of `image_size` (an int or [height, width]) in patches of `patch` pixels."""
    sides = [image_size] * 2 if isinstance(image_size, int) else list(image_size)
    rows, columns = (side // patch for side in sides)
    held = position_embeddings.shape[1] - prefix_tokens
    if held != rows * columns:
        side = math.isqrt(max(held, 0))
        grid = f"{side}x{side}" if side * side == held else f"{held}"
        raise LayoutError(
            f"config.json says {field} {image_size} ({rows}x{columns} patches of {patch} "
            f"pixels), but model.safetensors holds position embeddings for {grid} patches: the "
            "two files contradict each other. Use the config.json written with these weights; "
            "to resample the position embeddings, pass image_size= to from_pretrained.")


def check_expressible(target, lacking):
    """A LayoutError for a model with any of `lacking`'s options, (whether the model has it,
    the option in words) pairs: `target`, the library's class it is written as, has none."""
    problems = [problem for bad, problem in lacking if bad]
    if problems:
        raise LayoutError(f"{target}, which has no {'; no '.join(problems)}.")


def check_plain(spec, target, swiglu=False, hybrid=False):
    """A LayoutError for what `target`, a library's plain ViT class, cannot write: RoPE, other
    position embeddings, a ResNet stem (unless `hybrid`), axial blocks, SwiGLU (unless
    `swiglu`)."""
    eva_only = [what for bad, what in (
        (spec.norm_layer != "layer_norm", f"norm_layer={spec.norm_layer!r}"),
        (spec.qk_norm, "qk_norm=True"), (spec.grouped_query, "num_kv_heads"))
        if bad]
    if eva_only:
        raise LayoutError(f"{target} has no {', no '.join(eva_only)}: save this model with "
                          "format='timm' (its Eva, as Sapiens2).")
    if spec.rope:
        raise LayoutError(f"{target} has no rotary position embeddings (rope={spec.rope!r}); "
                          "save the model for timm (its Eva), or with rope 'axial_normalized' "
                          "for transformers (its DINOv3ViTModel).")
    if ((spec.is_hybrid and not hybrid) or spec.axial or spec.position_embedding != "learned"
            or spec.position_embedding_placement != "stem"):
        raise LayoutError(
            f"{target} has learned 1-D position embeddings added once, and no ResNet stem or "
            f"axial blocks; this model ({spec.variant}, position_embedding="
            f"{spec.position_embedding!r}, placement {spec.position_embedding_placement!r}) "
            "has no equivalent there.")
    if spec.activation == "swiglu" and not swiglu:  # DINOv2's alone has it mapped yet
        raise LayoutError(f"{target} is not written with SwiGLU MLPs (activation='swiglu') by "
                          "keras_vit yet (DINOv2's is: a model with LayerScale and no head); "
                          "save the model with keras_vit.weights.checkpoint.save_npz or "
                          "model.save(...keras).")

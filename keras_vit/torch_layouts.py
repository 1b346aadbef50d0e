"""The ViT weight layouts of PyTorch's two libraries, Hugging Face transformers and timm, as maps
to and from the original `.npz` layout (`keras_vit.checkpoint`), and their `config.json` to and
from a `ViTConfig`. Pure NumPy: no torch is needed to read or write them.

transformers' `ViTModel` / `ViTForImageClassification` files keep separate query, key and value
Linear layers under `vit.encoder.layer.N.attention.attention.*` (no `vit.` prefix for a saved
`ViTModel`, which may add `pooler.dense`, the original's tanh `pre_logits`); timm's
`VisionTransformer` fuses them (`blocks.N.attn.qkv`, [3D, D]). Linear weights are
(out, in) in both, the patch convolution (D, C, p, p).
"""

import re

import numpy as np

from keras_vit import variants
from keras_vit.spec import LAYER_NORM_EPSILON, ViTConfig

FORMATS = ("transformers", "timm")
TRANSFORMERS_ARCHITECTURES = ("ViTForImageClassification", "ViTModel")
# transformers' names of the two GELUs (tanh form: the original's).
_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
# timm's plain ViT family: what this module maps. Other families (CLIP, SigLIP, DeiT-III, DINO
# registers...) change the block or the activation in ways the weights alone do not show.
_TIMM_PLAIN = re.compile(r"^vit_(tiny|small|medium|base|large|huge|giant)_patch\d+_\d+$")
# The model_args of timm's VisionTransformer that this module reads; any other is refused.
_TIMM_ARGS = {"img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio",
              "global_pool", "class_token", "fc_norm", "act_layer", "qkv_bias", "in_chans",
              "drop_rate", "attn_drop_rate", "drop_path_rate", "num_classes"}


class LayoutError(ValueError):
    """A config or a set of weights this module cannot map, with the reason and the fix."""


def _transforms(heads):
    """kind -> (to the `.npz` layout, back to PyTorch's)."""
    return {
        "copy": (lambda v: v, lambda v: v),
        "linear": (lambda v: v.T, lambda v: v.T),
        "conv": (lambda v: v.transpose(2, 3, 1, 0), lambda v: v.transpose(3, 2, 0, 1)),
        # q, k, v: Linear (D, D) -> kernel (D, heads, D / heads); bias (heads, D / heads).
        "heads_in": (lambda v: v.T.reshape(v.shape[1], heads, -1),
                     lambda v: v.reshape(v.shape[0], -1).T),
        "heads_bias": (lambda v: v.reshape(heads, -1), lambda v: v.reshape(-1)),
        # the output projection: Linear (D, D) -> kernel (heads, D / heads, D).
        "heads_out": (lambda v: v.T.reshape(heads, -1, v.shape[0]),
                      lambda v: v.reshape(-1, v.shape[-1]).T),
    }


def _block_pairs(index, theirs):
    """(`.npz` key, their key, kind) of one encoder block, with `theirs` naming their layers."""
    ours = f"Transformer/encoderblock_{index}/"
    attention = ours + "MultiHeadDotProductAttention_1/"
    pairs = []
    for name in ("query", "key", "value"):
        pairs += [(attention + f"{name}/kernel", theirs[name] + ".weight", "heads_in"),
                  (attention + f"{name}/bias", theirs[name] + ".bias", "heads_bias")]
    pairs += [(attention + "out/kernel", theirs["out"] + ".weight", "heads_out"),
              (attention + "out/bias", theirs["out"] + ".bias", "copy")]
    for ours_name, their_name in (("LayerNorm_0", "norm_0"), ("LayerNorm_2", "norm_2")):
        pairs += [(ours + f"{ours_name}/scale", theirs[their_name] + ".weight", "copy"),
                  (ours + f"{ours_name}/bias", theirs[their_name] + ".bias", "copy")]
    for ours_name, their_name in (("Dense_0", "fc_0"), ("Dense_1", "fc_1")):
        pairs += [(ours + f"MlpBlock_3/{ours_name}/kernel", theirs[their_name] + ".weight",
                   "linear"),
                  (ours + f"MlpBlock_3/{ours_name}/bias", theirs[their_name] + ".bias", "copy")]
    return pairs


def _pairs(spec, layout, prefix=""):
    """Every (`.npz` key, their key, kind) of a model of `spec` in `layout`."""
    if layout == "transformers":
        stem = [("embedding/kernel", "embeddings.patch_embeddings.projection.weight", "conv"),
                ("embedding/bias", "embeddings.patch_embeddings.projection.bias", "copy"),
                ("cls", "embeddings.cls_token", "copy"),
                ("Transformer/posembed_input/pos_embedding", "embeddings.position_embeddings",
                 "copy")]
        norm = "layernorm"
        block = "encoder.layer.{}."
        names = {"query": "attention.attention.query", "key": "attention.attention.key",
                 "value": "attention.attention.value", "out": "attention.output.dense",
                 "norm_0": "layernorm_before", "norm_2": "layernorm_after",
                 "fc_0": "intermediate.dense", "fc_1": "output.dense"}
        head = "classifier"
    else:
        stem = [("embedding/kernel", "patch_embed.proj.weight", "conv"),
                ("embedding/bias", "patch_embed.proj.bias", "copy"),
                ("Transformer/posembed_input/pos_embedding", "pos_embed", "copy")]
        if spec.classifier == "token":
            stem.append(("cls", "cls_token", "copy"))
        norm = "norm"
        block = "blocks.{}."
        names = {"query": "attn.q", "key": "attn.k", "value": "attn.v", "out": "attn.proj",
                 "norm_0": "norm1", "norm_2": "norm2", "fc_0": "mlp.fc1", "fc_1": "mlp.fc2"}
        head = "head"
    pairs = [(ours, prefix + theirs, kind) for ours, theirs, kind in stem]
    for index in range(spec.num_layers):
        theirs = {key: prefix + block.format(index) + value for key, value in names.items()}
        pairs += _block_pairs(index, theirs)
    pairs += [("Transformer/encoder_norm/scale", prefix + norm + ".weight", "copy"),
              ("Transformer/encoder_norm/bias", prefix + norm + ".bias", "copy")]
    if layout == "transformers" and spec.representation_size is not None:
        pairs += [("pre_logits/kernel", "pooler.dense.weight", "linear"),
                  ("pre_logits/bias", "pooler.dense.bias", "copy")]
    if spec.include_top:
        pairs += [("head/kernel", head + ".weight", "linear"),
                  ("head/bias", head + ".bias", "copy")]
    return pairs


def _split_qkv(state):
    """timm's fused `attn.qkv` as the `attn.q`, `attn.k`, `attn.v` entries `_pairs` names."""
    split = {}
    for key, value in state.items():
        if key.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            base, kind = key.rsplit(".qkv.", 1)
            for part, name in zip(np.split(value, 3, axis=0), "qkv"):
                split[f"{base}.{name}.{kind}"] = part
        else:
            split[key] = value
    return split


def _fuse_qkv(state):
    fused, parts = {}, {}
    for key, value in state.items():
        match = re.match(r"(.*attn)\.([qkv])\.(weight|bias)$", key)
        if match:
            parts.setdefault((match[1], match[3]), {})[match[2]] = value
        else:
            fused[key] = value
    for (base, kind), qkv in parts.items():
        fused[f"{base}.qkv.{kind}"] = np.concatenate([qkv["q"], qkv["k"], qkv["v"]], axis=0)
    return fused


def to_npz_arrays(state, spec, layout):
    """Their state dict (name -> array) as the `.npz` layout `checkpoint.load_npz` reads.
    Every tensor must be used and every expected one present: a LayoutError names the rest."""
    prefix = ""
    if layout == "transformers" and spec.include_top:
        prefix = "vit."
    state = _split_qkv(state) if layout == "timm" else dict(state)
    transforms = _transforms(spec.num_heads)
    arrays, missing = {}, []
    for ours, theirs, kind in _pairs(spec, layout, prefix):
        if theirs not in state:
            missing.append(theirs)
            continue
        arrays[ours] = transforms[kind][0](np.asarray(state.pop(theirs)))
    if missing or state:
        problems = [f"missing ({len(missing)}): {', '.join(missing[:8])}"] if missing else []
        if state:
            problems.append(f"unexpected ({len(state)}): {', '.join(sorted(state)[:8])}")
        raise LayoutError(
            f"The {layout} weights do not fit the architecture their config describes: "
            f"{'; '.join(problems)}. Nothing was loaded. They may need an option keras_vit "
            "does not have yet.")
    return arrays


def from_npz_arrays(arrays, spec, layout):
    """The `.npz` layout (`checkpoint.model_arrays`) as their state dict."""
    prefix = "vit." if layout == "transformers" and spec.include_top else ""
    transforms = _transforms(spec.num_heads)
    state = {theirs: np.ascontiguousarray(transforms[kind][1](arrays[ours]))
             for ours, theirs, kind in _pairs(spec, layout, prefix)}
    return _fuse_qkv(state) if layout == "timm" else state


# --- config.json -------------------------------------------------------------------------------

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


def _spec(hidden, mlp, heads, layers, patch, **fields):
    return ViTConfig(variant=_variant_for(hidden, mlp, heads, layers, patch), hidden_size=hidden,
                     mlp_dim=mlp, num_heads=heads, num_layers=layers, patch_size=patch, **fields)


def detect(config):
    """"transformers" or "timm": which library wrote this `config.json`."""
    if config.get("model_type") == "vit":
        return "transformers"
    if "architecture" in config:
        return "timm"
    model_type = config.get("model_type") or config.get("architectures")
    raise LayoutError(
        f"config.json is neither transformers' ViT (model_type 'vit') nor timm's (an "
        f"'architecture' field); it describes {model_type!r}. keras_vit reads those two, and "
        "the original .npz checkpoints.")


def spec_from_transformers(config, state):
    """The `ViTConfig` of transformers' ViT `config.json`, with the weights `state` saying
    whether a `ViTModel` has its pooler."""
    act = config.get("hidden_act", "gelu")
    if act not in ("gelu",) + _TANH_GELUS:
        raise LayoutError(f"hidden_act {act!r}: keras_vit has the exact GELU ('gelu') and its "
                          f"tanh form ({', '.join(_TANH_GELUS)}).")
    if not config.get("qkv_bias", True) or config.get("num_channels", 3) != 3:
        raise LayoutError("qkv_bias=False and images of other than 3 channels are not "
                          "supported yet.")
    architecture = (config.get("architectures") or ["ViTModel"])[0]
    if architecture not in TRANSFORMERS_ARCHITECTURES:
        raise LayoutError(f"architecture {architecture!r}: keras_vit reads "
                          f"{' and '.join(TRANSFORMERS_ARCHITECTURES)}.")
    classifier = architecture == "ViTForImageClassification"
    labels = config.get("id2label") or {}
    if classifier and config.get("pooler_act", "tanh") != "tanh":
        raise LayoutError(f"pooler_act {config['pooler_act']!r}: only tanh (the original's).")
    hidden = config.get("hidden_size", 768)
    return _spec(hidden, config.get("intermediate_size", 3072),
                 config.get("num_attention_heads", 12), config.get("num_hidden_layers", 12),
                 config.get("patch_size", 16), image_size=config.get("image_size", 224),
                 include_top=classifier, num_classes=max(len(labels), 1) if classifier else 1,
                 representation_size=None if classifier or "pooler.dense.weight" not in state
                 else hidden,
                 approximate_gelu=act in _TANH_GELUS,
                 layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
                 dropout=config.get("hidden_dropout_prob", 0.0),
                 attention_dropout=config.get("attention_probs_dropout_prob", 0.0))


def transformers_config(spec):
    """transformers' `config.json` for a model of `spec` (a LayoutError for what its ViT cannot
    express)."""
    _check_plain(spec, "transformers' ViT")
    if spec.classifier != "token":
        raise LayoutError("transformers' ViT classifies from the class token; a GAP model "
                          "(classifier='gap') has no equivalent there.")
    if spec.include_top and spec.representation_size is not None:
        raise LayoutError("transformers' ViTForImageClassification has no pre_logits layer "
                          "before its head; save a model without representation_size.")
    if not spec.include_top and spec.representation_size != spec.hidden_size:
        raise LayoutError(
            "transformers' ViTModel has a pooler (a tanh Dense of the class token's width, "
            "the original's pre_logits) that its from_pretrained would start at random: save "
            "a model with representation_size=hidden_size, or with a head.")
    labels = {str(index): f"LABEL_{index}" for index in range(spec.num_classes)}
    height, width = spec.image_size
    config = {
        "model_type": "vit",
        "architectures": ["ViTForImageClassification" if spec.include_top else "ViTModel"],
        "hidden_size": spec.hidden_size, "intermediate_size": spec.mlp_dim,
        "num_attention_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
        "patch_size": spec.patch_size, "image_size": height if height == width else [height,
                                                                                     width],
        "num_channels": 3, "qkv_bias": True,
        "hidden_act": "gelu_pytorch_tanh" if spec.approximate_gelu else "gelu",
        "layer_norm_eps": spec.layer_norm_epsilon,
        "hidden_dropout_prob": spec.dropout, "attention_probs_dropout_prob":
            spec.attention_dropout,
        "pooler_act": "tanh", "pooler_output_size": spec.hidden_size,
    }
    if spec.include_top:
        config["id2label"] = labels
        config["label2id"] = {name: int(index) for index, name in labels.items()}
    return config


def _timm_heads(hidden, model_args):
    if "num_heads" in model_args:
        return model_args["num_heads"]
    for name in variants.VARIANT_NAMES:
        row = variants.variant_table_row(name)
        if row["hidden_size"] == hidden:
            return row["num_heads"]
    raise LayoutError(f"No number of heads known for width {hidden}: give num_heads in "
                      "config.json's model_args.")


def spec_from_timm(config, state):
    """The `ViTConfig` of timm's `config.json`, with the sizes the weights `state` show."""
    architecture = config["architecture"].split(".")[0]
    if not _TIMM_PLAIN.match(architecture):
        raise LayoutError(
            f"timm architecture {architecture!r} is not supported yet: keras_vit maps timm's "
            "plain ViTs (vit_<size>_patch<p>_<resolution>); CLIP, SigLIP, DeiT-III, register "
            "and other families need options (pre_norm, LayerScale, registers, quick GELU) it "
            "does not have yet.")
    args = dict(config.get("model_args") or {})
    unknown = sorted(set(args) - _TIMM_ARGS)
    if unknown:
        raise LayoutError(f"timm model_args {unknown} are not supported yet (keras_vit maps "
                          f"{sorted(_TIMM_ARGS)}).")
    act = args.get("act_layer", "gelu")
    if act not in ("gelu", "gelu_tanh") or not args.get("qkv_bias", True) or (
            args.get("in_chans", 3) != 3):
        raise LayoutError(f"timm act_layer={act!r}, qkv_bias={args.get('qkv_bias', True)}, "
                          f"in_chans={args.get('in_chans', 3)}: keras_vit maps GELU (exact or "
                          "tanh), query/key/value biases and RGB images.")
    kernel = state["patch_embed.proj.weight"]
    hidden, patch = kernel.shape[0], kernel.shape[-1]
    layers = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    mlp = state["blocks.0.mlp.fc1.weight"].shape[0]
    global_pool = config.get("global_pool", args.get("global_pool", "token"))
    class_token = args.get("class_token", global_pool == "token")
    fc_norm = args.get("fc_norm")
    if global_pool == "token" and class_token:
        classifier = "token"
    elif global_pool == "avg" and not class_token and fc_norm is False:
        classifier = "gap"  # the original's GAP: normalised, then pooled
    else:
        raise LayoutError(
            f"timm global_pool={global_pool!r} with class_token={class_token}, "
            f"fc_norm={fc_norm}: keras_vit maps 'token' with a class token, and 'avg' without "
            "one and with fc_norm=False (the original's GAP); timm's default 'avg' normalises "
            "after pooling, which keras_vit has not got yet.")
    num_classes = config.get("num_classes", 1000)
    image = (config.get("pretrained_cfg") or {}).get("input_size", [3, 224, 224])[1:]
    image = args.get("img_size", image)
    return _spec(hidden, mlp, _timm_heads(hidden, args), layers, patch, image_size=image,
                 include_top=num_classes > 0, num_classes=max(num_classes, 1),
                 classifier=classifier, approximate_gelu=act == "gelu_tanh",
                 layer_norm_epsilon=LAYER_NORM_EPSILON,
                 position_embedding_interpolation="bicubic")  # as timm resamples


def timm_config(spec):
    """timm's `config.json` (what `timm.create_model("local-dir:DIR", pretrained=True)` reads)
    for a model of `spec`."""
    _check_plain(spec, "timm's VisionTransformer")
    if spec.representation_size is not None:
        raise LayoutError("timm's VisionTransformer has no tanh pre_logits layer; save a model "
                          "without representation_size.")
    if spec.layer_norm_epsilon != LAYER_NORM_EPSILON:
        raise LayoutError(f"timm's ViT LayerNorms have epsilon {LAYER_NORM_EPSILON}, the model "
                          f"{spec.layer_norm_epsilon}.")
    height, width = spec.image_size
    gap = spec.classifier == "gap"
    args = {"img_size": [height, width], "patch_size": spec.patch_size,
            "embed_dim": spec.hidden_size, "depth": spec.num_layers,
            "num_heads": spec.num_heads, "mlp_ratio": spec.mlp_dim / spec.hidden_size,
            "class_token": not gap, "global_pool": "avg" if gap else "token",
            "fc_norm": False if gap else None,
            "act_layer": "gelu_tanh" if spec.approximate_gelu else "gelu"}
    num_classes = spec.num_classes if spec.include_top else 0
    return {
        "architecture": "vit_base_patch16_224", "num_classes": num_classes,
        "num_features": spec.hidden_size, "global_pool": args["global_pool"],
        "model_args": args,
        "pretrained_cfg": {"input_size": [3, height, width], "interpolation": "bilinear",
                           "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 1.0,
                           "num_classes": num_classes},
    }


def _check_plain(spec, target):
    if (spec.is_hybrid or spec.axial or spec.position_embedding != "learned"
            or spec.position_embedding_placement != "stem"):
        raise LayoutError(
            f"{target} has learned 1-D position embeddings added once, and no ResNet stem or "
            f"axial blocks; this model ({spec.variant}, position_embedding="
            f"{spec.position_embedding!r}, placement {spec.position_embedding_placement!r}) "
            "has no equivalent there.")

"""How many of timm's pretrained ViTs keras_vit reads, each checked against timm itself.

For every architecture in `timm.list_pretrained("vit_*")`, then (a second count) in
`timm.list_pretrained("deit*")` (DeiT, DeiT III, and DeiT's distilled models: timm's
`VisionTransformerDistilled`), then (a third) in `timm.list_pretrained("eva02*")` (EVA-02,
timm's `Eva` class, which also builds its `vit_*` RoPE, DINOv3, PE... models), timm builds it
with random weights of order 1 (its depth cut to `--depth` blocks: every block has the same
options, and the whole list then runs in minutes on a CPU), saves it as its hub files do
(`config.json` + `model.safetensors`), `keras_vit.from_pretrained` loads the directory, and the
logits of one image are compared; then `keras_vit.save_pretrained(..., format="timm")` writes
it back and `timm.create_model("local-dir:...")` must give the same logits. An architecture
keras_vit has no option for is reported with the reason `from_pretrained` gives.

    KERAS_BACKEND=torch python benchmarks/timm_coverage.py              # the tables
    KERAS_BACKEND=torch python benchmarks/timm_coverage.py --only deit  # DeiT's only
    KERAS_BACKEND=torch python benchmarks/timm_coverage.py --only eva02  # EVA-02's only
    python benchmarks/timm_coverage.py --write_table    # the table from_pretrained reads

`--write_table` records, for each `vit_*`, `deit*` and `eva02*` architecture timm registers, its
model class and (for `VisionTransformer` and its subclass `VisionTransformerDistilled`, which
takes the same arguments) the arguments its entry point passes that differ from
`VisionTransformer`'s defaults: the options a checkpoint's `config.json` does not repeat
(heads, activation, LayerNorm epsilon, pooling...), which `from_pretrained` reads from there.
For timm's `Eva` class it records the same, relative to `Eva.__init__`'s defaults, and says so
with `"defaults": "Eva"` (an entry without "defaults" is relative to `VisionTransformer`'s),
which `from_pretrained` reads as Eva's (RoPE, registers without class token, SwiGLU...), and
for `VisionTransformerRelPos` relative to its own (`"defaults": "VisionTransformerRelPos"`).
timm's `naflexvit_*` architectures (its `NaFlexVit`, which their entry points build from a
`NaFlexVitCfg`) are recorded too, their config's fields that differ from `NaFlexVitCfg`'s
defaults (`"defaults": "NaFlexVitCfg"`); the coverage count leaves them out (they take patches,
not images: tests/library/native/test_timm_naflex_parity.py compares them).
Needs torch and timm (CI's torch leg has both).
"""

import argparse
import collections
import functools
import inspect
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_vit",
                     "weights", "torch_layouts", "timm_architectures.json")
# What every build passes that is not an architecture option.
_BUILD_ARGUMENTS = {"pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "feature_cfg",
                    "pretrained_filter_fn", "pretrained_strict"}
# The name patterns of timm's architectures: `vit_*` first (the count quoted in the docs), then
# DeiT's, whose distilled models are a class of their own, then EVA-02's (timm's Eva class).
FAMILIES = ("vit_*", "deit*", "eva02*")
# The table records these too: timm's NaFlexVit, read as a keras_vit.native.NaFlexViT.
TABLE_FAMILIES = FAMILIES + ("naflexvit_*",)
# timm's classes whose arguments the table records -> the class whose `__init__` defaults they
# are relative to (VisionTransformerDistilled takes VisionTransformer's arguments).
_ARGUMENT_CLASSES = {"VisionTransformer": "VisionTransformer",
                     "VisionTransformerDistilled": "VisionTransformer", "Eva": "Eva",
                     "VisionTransformerRelPos": "VisionTransformerRelPos"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=2, help="blocks of each model built")
    parser.add_argument("--only", default="", help="architectures whose name contains this")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest logit difference allowed, relative to the largest logit")
    parser.add_argument("--write_table", action="store_true",
                        help=f"regenerate {os.path.relpath(TABLE)} from the installed timm")
    return parser.parse_args(argv)


class _Captured(Exception):
    pass


def _json_value(value):
    """An argument as JSON: plain values as they are, a LayerNorm as its epsilon (the only
    thing that differs between timm's ViTs), an RmsNorm of a set epsilon (Eva's) as that
    epsilon, a partial of one of timm's MLP classes as {"partial": its class, its keyword
    arguments}, a hybrid's HybridEmbed as its backbone (`_backbone`), anything else by name."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if isinstance(value, functools.partial) and "LayerNorm" in value.func.__name__:
        return {"layer_norm": value.keywords.get("eps", 1e-5)}
    if isinstance(value, functools.partial) and "RmsNorm" in value.func.__name__:
        return {"rms_norm": value.keywords.get("eps", value.func(8).eps)}
    if isinstance(value, functools.partial) and _is_mlp(value.func):
        # an MLP class with its arguments (DINOv2 giant's SwiGLUPacked: GluMlp, SiLU, the
        # gate's rows first), which decide the layout of its weights
        return {"partial": value.func.__name__,
                **{name: _json_value(argument) for name, argument in
                   sorted(value.keywords.items())}}
    if isinstance(value, functools.partial) and value.func.__name__ == "HybridEmbed":
        return {"hybrid_embed": {
            name: _backbone(item) if name == "backbone" else _json_value(item)
            for name, item in sorted(value.keywords.items())}}
    name = getattr(value, "__name__", type(value).__name__)
    if name == "LayerNorm" and isinstance(value, type):  # its own default epsilon
        return {"layer_norm": value(8).eps}
    return f"<{name}>"


def _is_mlp(function):
    """Whether `function` is one of timm's MLP classes (timm.layers.mlp)."""
    return isinstance(function, type) and function.__module__ == "timm.layers.mlp"


def _backbone(module):
    """A hybrid's backbone (the `backbone` of timm's HybridEmbed, a built module) as what
    decides its weights and numerics: for timm's ResNetV2 (or its stem alone, a Sequential of
    `conv`, `norm`, `pool`), the units of each stage, its block, and the classes and epsilons
    of its convolutions (StdConv2dSame: "same" padding; StdConv2d: padding_same=False), norms
    and pooling; MobileCLIP's ConvStem as its convolutions' kernels, strides, paddings and
    channels, its norm (class, epsilon) and activation; any other backbone by its class."""
    name = type(module).__name__
    if name == "ConvStem":
        layers = list(module)
        norm = layers[0].bn
        return {"class": name, "channels": [layer.conv.out_channels for layer in layers],
                "kernel_size": [layer.conv.kernel_size[0] for layer in layers],
                "stride": [layer.conv.stride[0] for layer in layers],
                "padding": [layer.conv.padding[0] for layer in layers],
                "norm": type(norm).__name__, "norm_eps": norm.eps,
                "act": type(norm.act).__name__,
                "act_approximate": getattr(norm.act, "approximate", None)}
    stem = getattr(module, "stem", module)
    if name not in ("ResNetV2", "Sequential") or not all(
            hasattr(stem, part) for part in ("conv", "norm", "pool")):
        return {"class": name}
    stages = list(getattr(module, "stages", []))
    entry = {"class": name if stages else "ResNetV2 stem",
             "layers": [len(stage.blocks) for stage in stages],
             "conv": type(stem.conv).__name__, "conv_eps": stem.conv.eps,
             "norm": type(stem.norm).__name__, "norm_eps": stem.norm.eps,
             "pool": type(stem.pool).__name__}
    if stages:
        entry.update(block=type(stages[0].blocks[0]).__name__,
                     final_norm=type(module.norm).__name__)
    return entry


def architecture_table(timm):
    """architecture -> {"class": timm's model class, "args": its non-default arguments, and for
    a class whose defaults are not VisionTransformer's, "defaults": that class (Eva)}."""
    from timm.models import _builder
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    defaults = {model_class.__name__: {
        name: parameter.default for name, parameter in
        inspect.signature(model_class.__init__).parameters.items()}
        for model_class in (VisionTransformer, Eva, VisionTransformerRelPos)}
    original, seen = _builder.build_model_with_cfg, {}

    def capture(model_class, variant, pretrained, **kwargs):
        seen[variant] = (model_class, kwargs)
        raise _Captured

    # Entry points call build_model_with_cfg as a name of their own module: replace it there.
    modules = [module for name, module in list(sys.modules.items())
               if name.startswith("timm.models")
               and getattr(module, "build_model_with_cfg", None) is original]
    for module in modules:
        module.build_model_with_cfg = capture
    table = {}
    try:
        for architecture in (name for family in TABLE_FAMILIES
                             for name in timm.list_models(family)):
            try:
                timm.create_model(architecture, pretrained=False)
            except _Captured:
                pass
            model_class, kwargs = seen.get(architecture, (None, {}))
            if model_class is None:
                continue
            entry = {"class": model_class.__name__}
            if model_class.__name__ == "NaFlexVit":
                entry.update(args=_naflex_args(kwargs), defaults="NaFlexVitCfg")
            elif model_class.__name__ in _ARGUMENT_CLASSES:
                of = _ARGUMENT_CLASSES[model_class.__name__]
                entry["args"] = {
                    name: _json_value(value) for name, value in sorted(kwargs.items())
                    if name not in _BUILD_ARGUMENTS and not (
                        name in defaults[of] and _same(value, defaults[of][name]))}
                if of != "VisionTransformer":
                    entry["defaults"] = of
            table[architecture] = entry
    finally:
        for module in modules:
            module.build_model_with_cfg = original
    return table


def _naflex_args(kwargs):
    """The fields of a NaFlexVit entry point's `NaFlexVitCfg` (its `cfg` argument) that differ
    from the dataclass's defaults, with any other argument it passes."""
    import dataclasses

    from timm.models.naflexvit import NaFlexVitCfg

    cfg, default = kwargs.get("cfg") or NaFlexVitCfg(), NaFlexVitCfg()
    args = {field.name: _json_value(getattr(cfg, field.name))
            for field in dataclasses.fields(NaFlexVitCfg)
            if not _same(getattr(cfg, field.name), getattr(default, field.name))}
    args.update({name: _json_value(value) for name, value in sorted(kwargs.items())
                 if name not in _BUILD_ARGUMENTS | {"cfg"}})
    return dict(sorted(args.items()))


def _same(value, default):
    try:
        return bool(value == default)
    except Exception:  # tensors and other values without a plain ==
        return False


def order_one(torch, model):
    """Random weights that keep activations of order 1 at any width, so that a wrong
    activation, epsilon or scale shows: kernels N(0, 1 / fan_in), biases and tokens N(0, 0.3),
    norm and LayerScale scales 1 + N(0, 0.1); BatchNorm's running means N(0, 0.3) and
    variances 1 + U(-0.5, 0.5) (MobileCLIP's ConvStem), so that neither is a no-op."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            unit = ("norm" in name or name.endswith("gamma")) and not name.endswith("bias")
            kernel = parameter.dim() >= 2 and not name.endswith(_TOKENS)
            std = (parameter[0].numel() ** -0.5 if kernel else 0.1 if unit else 0.3)
            parameter.copy_(torch.randn_like(parameter) * std + float(unit))
        for name, buffer in model.named_buffers():
            if name.endswith("running_mean"):
                buffer.copy_(torch.randn_like(buffer) * 0.3)
            elif name.endswith("running_var"):
                buffer.copy_(torch.rand_like(buffer) + 0.5)
    return model.eval()


_TOKENS = ("pos_embed", "cls_token", "reg_token", "dist_token")


def check(architecture, depth, tolerance, workdir):
    """("covered", detail) | ("missing", reason) | ("error", what), for one architecture."""
    import keras
    import timm
    import torch
    from timm.models import _hub

    import keras_vit
    from keras_vit.weights import torch_layouts

    entry = torch_layouts.timm_architectures()[architecture]
    if entry["class"] not in torch_layouts.TIMM_CLASSES:
        return "missing", f"timm's {entry['class']} class"
    cut = {"depth": depth}
    heads = entry.get("args", {}).get("num_kv_heads")
    if isinstance(heads, list):  # Eva's per-block key and value heads: the first blocks'
        cut["num_kv_heads"] = heads[:depth]
    theirs = order_one(torch, timm.create_model(architecture, pretrained=False, **cut))
    directory = os.path.join(workdir, architecture)
    _hub.save_for_hf(theirs, directory, model_args=cut, safe_serialization=True)
    try:
        ours = keras_vit.from_pretrained(directory)
    except torch_layouts.LayoutError as error:
        return "missing", str(error).replace(f"timm architecture {architecture!r} ", "")[:160]
    # At timm's input size; keras_vit's may be smaller (whole patches), timm's convolution
    # drops the rest.
    _, height, width = theirs.pretrained_cfg["input_size"]
    pixels = np.random.default_rng(0).uniform(0, 255, (1, height, width, 3)).astype("float32")
    height, width = ours.spec.image_size

    def logits(model):  # on the pixels as the model's pretrained_cfg normalises them
        mean, std = (np.asarray(model.pretrained_cfg[key]) for key in ("mean", "std"))
        normalised = ((pixels / 255 - mean) / std).transpose(0, 3, 1, 2)
        with torch.no_grad():
            return model(torch.tensor(normalised, dtype=torch.float32)).numpy()

    expected = logits(theirs)
    ours_logits = keras.ops.convert_to_numpy(
        ours(keras_vit.preprocess_inputs(pixels[:, :height, :width])))
    scale = np.abs(expected).max()
    loaded = np.abs(ours_logits - expected).max() / scale
    keras_vit.save_pretrained(ours, directory + "_back", format="timm")
    back = timm.create_model("local-dir:" + directory + "_back", pretrained=True).eval()
    pixels = pixels[:, :height, :width]
    saved = np.abs(logits(back) - ours_logits).max() / scale
    if max(loaded, saved) > tolerance:
        return "error", f"logits differ: {loaded:.1e} loaded, {saved:.1e} saved back"
    return "covered", f"{loaded:.1e} / {saved:.1e}"


def main(argv=None):
    args = parse_args(argv)
    import timm

    if args.write_table:
        table = {"timm": timm.__version__, "architectures": architecture_table(timm)}
        with open(TABLE, "w") as handle:
            json.dump(table, handle, indent=1, sort_keys=True)
            handle.write("\n")
        print(f"{len(table['architectures'])} architectures written to {TABLE}")
        return
    with tempfile.TemporaryDirectory() as workdir:
        for family in FAMILIES:
            tags = collections.Counter(name.split(".")[0]
                                       for name in timm.list_pretrained(family))
            results = {}
            for architecture in sorted(tags):
                if args.only not in architecture:
                    continue
                results[architecture] = _checked(architecture, args, workdir)
                status, detail = results[architecture]
                print(f"| {architecture} | {tags[architecture]} | {status} | {detail} |",
                      flush=True)
            if results:  # --only may leave a family out
                summarise(timm, family, tags, results)


def _checked(architecture, args, workdir):
    try:
        return check(architecture, args.depth, args.tolerance, workdir)
    except Exception as error:  # a row of the table, not the end of the run
        return "error", f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    finally:  # the widest models' files take gigabytes: keep one architecture's at a time
        for directory in (architecture, architecture + "_back"):
            shutil.rmtree(os.path.join(workdir, directory), ignore_errors=True)


def summarise(timm, family, tags, results):
    """The counts of one family's table, by pretrained tag, and the reasons for the missing."""
    counts = collections.Counter()
    for architecture, (status, _) in results.items():
        counts[status] += tags[architecture]
    total = sum(tags[architecture] for architecture in results)
    covered = len([result for result in results.values() if result[0] == "covered"])
    named = "" if family == FAMILIES[0] else f", {family}"  # the first line as it always was
    print(f"\ntimm {timm.__version__}{named}: {counts['covered']} of {total} pretrained tags "
          f"covered ({covered} of {len(results)} architectures); missing an option: "
          f"{counts['missing']}; errors: {counts['error']}.")
    reasons = collections.Counter()
    for architecture, (status, detail) in results.items():
        if status == "missing":
            reasons[detail] += tags[architecture]
    for reason, count in reasons.most_common():
        print(f"- {count} tags: {reason}")
    print()


if __name__ == "__main__":
    main()

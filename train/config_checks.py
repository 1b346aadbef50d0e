"""Checks of everything a user gives `train.main` and `train.analyze`, before any slow work.

`check(config)` validates every field of `configs/common.py`: each number against its range and
each string against its known values, plus the combinations that would fail later (warm-up
longer than the run, a batch that does not split over the replicas or accumulation steps, ...).
The model, `config.model` with `config.image_size`, is checked by `keras_vit.ViTConfig` itself
(`model_spec` makes the spec of a config). It reports every bad field at once, each as
`config.<field>=<value>: <what is valid>` (`config.model.<field>` for the model's), in one
ValueError. A field added to `configs/common.py` needs a rule in `RULES` (a test checks that
every field has one); a field added to the spec needs nothing here.

Also here: the `--workdir`/`--out` folder check (a file, or not creatable). The `--config` flag
and the loading of config files are train.config_flag's.

The checks run before TensorFlow starts, and importing this module loads neither Keras nor
TensorFlow (keras_vit is imported where a check needs it): the valid values whose owners load
them on import (train.schedules, train.objectives, keras_vit.masked_patches) are repeated here,
and tests/test_configs.py holds each copy equal to its owner's.
"""

import dataclasses
import math
import os

from absl import app, logging

from . import augmentation
from .optimizers import OPTIMIZERS

# Copies of their owners' values (the owners load Keras on import).
DECAYS = ("cosine", "linear")  # train.schedules.DECAYS
OBJECTIVES = ("classification", "masked_patch_prediction")  # train.objectives.OBJECTIVES
MPP_TARGETS = ("mean_color", "downscaled_color", "pixels")  # keras_vit.masked_patches.TARGETS
MPP_DOWNSCALED_CELLS = 4  # keras_vit.masked_patches.DOWNSCALED_CELLS
# A folder dataset's prefix: `folder:/path/to/root`, and the offline default's TFDS name
# (train/fashion_mnist.py). Both input pipelines read them from here (train.input_pipeline
# loads TensorFlow on import, train.grain_input must not).
FOLDER_PREFIX = "folder:"
DEFAULT_DATASET = "fashion_mnist_local"

# The checks' own: float32 everywhere, or bfloat16 compute with float32 weights (TPU, CPUs with
# AMX). No float16: the loop has no loss scaling, so float16 gradients would underflow.
DTYPE_POLICIES = ("float32", "mixed_bfloat16")
MAX_SEED = 2**31 - 1


# Rules: (kind, details). "int": (low, high) inclusive, None for unbounded; "float": (low, high,
# high_inclusive) with low inclusive unless the rule says "above"; "choice": the valid values;
# "bool"; "str": non-empty; "any_str": may be empty; "optional_str": a string or None; "spec":
# the fields of keras_vit.ViTConfig, checked by the spec (`_check_model`).
RULES = {
    "seed": ("int", (0, MAX_SEED)),
    "model": ("spec", None),  # keras_vit.ViTConfig's fields, checked by the spec (below)
    "objective": ("choice", OBJECTIVES),
    "mpp_target": ("choice", MPP_TARGETS),
    "mpp_corruption_rate": ("float_above", (0.0, 1.0, True)),
    "mpp_mask_rate": ("float", (0.0, 1.0, True)),
    "mpp_random_rate": ("float", (0.0, 1.0, True)),  # and mask + random <= 1, below
    "pretrained": ("any_str", None),  # checked below: a published name, URL or file
    "dataset": ("str", None),  # checked below where cheap (folders); TFDS names on loading
    "data_dir": ("optional_str", None),
    "train_split": ("str", None),
    "eval_split": ("str", None),
    "augment": ("choice", tuple(augmentation.PRESETS)),
    "randaugment_layers": ("optional_int", (0, 8)),
    "randaugment_magnitude": ("optional_float", (0.0, 30.0, True)),
    "mixup_alpha": ("optional_float", (0.0, None, False)),
    "cutmix_alpha": ("float", (0.0, None, False)),
    "cutmix_switch_prob": ("float", (0.0, 1.0, True)),
    "random_erasing": ("float", (0.0, 1.0, True)),
    "input_pipeline": ("choice", ("auto", "tf.data", "grain")),
    "input_workers": ("int", (0, None)),
    "image_size": ("int", (1, None)),  # and a whole number of patches: by the spec
    "crop_min_area": ("float_above", (0.0, 1.0, True)),
    "flip": ("bool", None),
    "shuffle_buffer": ("int", (1, None)),
    "batch_size": ("int", (1, None)),
    "eval_batch_size": ("int", (1, None)),
    "total_steps": ("int", (1, None)),
    "optimizer": ("choice", OPTIMIZERS),
    "learning_rate": ("float_above", (0.0, None, False)),
    "warmup_steps": ("int", (0, None)),  # and <= total_steps, below
    "decay": ("choice", DECAYS),
    "momentum": ("float", (0.0, 1.0, False)),
    "beta_1": ("float", (0.0, 1.0, False)),
    "beta_2": ("float", (0.0, 1.0, False)),
    "weight_decay": ("float", (0.0, None, False)),
    "layer_decay": ("float_above", (0.0, 1.0, True)),
    "grad_clip_norm": ("float", (0.0, None, False)),
    "accum_steps": ("int", (1, None)),
    "label_smoothing": ("float", (0.0, 1.0, False)),
    "dtype_policy": ("choice", DTYPE_POLICIES),
    "ema_decay": ("float", (0.0, 1.0, False)),
    "steps_per_loop": ("int", (1, None)),
    "eval_every_steps": ("int", (1, None)),
    "checkpoint_every_steps": ("int", (1, None)),
    "keep_checkpoints": ("int", (1, None)),
    "jit_compile": ("bool", None),
    "model_parallel": ("int", (1, None)),
    "export": ("bool", None),
}

# What configs written before config.model held the model's fields (a variant name, and the other
# fields beside it) are told.
MODEL_FIELDS_MOVED = ("config.model holds the model's fields (those of keras_vit.ViTConfig), "
                      "not a variant name")

# What train.analyze reads of a config (a workdir's config.json or a config file).
ANALYZE_FIELDS = ("model", "pretrained", "dataset", "data_dir", "train_split", "eval_split",
                  "image_size")


def _interval(low, high, high_inclusive, low_inclusive=True):
    if high is None:
        return f">= {low}" if low_inclusive else f"> {low}"
    left = "[" if low_inclusive else "("
    right = "]" if high_inclusive else ")"
    return f"in {left}{low}, {high}{right}"


def _rule_problem(kind, details, value):
    """What is wrong with `value` under the rule, or None."""
    if kind.startswith("optional_") and kind != "optional_str":
        return None if value is None else _rule_problem(kind[len("optional_"):], details, value)
    if kind == "int":
        low, high = details
        what = "an integer"
        if not isinstance(value, int) or isinstance(value, bool):
            return f"must be {what}"
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
            return f"must be {what} {bounds}"
        return None
    if kind in ("float", "float_above"):
        low, high, high_inclusive = details
        interval = _interval(low, high, high_inclusive, low_inclusive=kind == "float")
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value)):
            return f"must be a finite number {interval}"
        too_low = value <= low if kind == "float_above" else value < low
        too_high = high is not None and (value > high if high_inclusive else value >= high)
        return f"must be {interval}" if too_low or too_high else None
    if kind == "choice":
        return None if value in details else f"must be one of {', '.join(map(repr, details))}"
    if kind == "bool":
        return None if isinstance(value, bool) else "must be True or False"
    if kind == "str":
        return None if isinstance(value, str) and value.strip() else "must be a non-empty string"
    if kind == "any_str":
        return None if isinstance(value, str) else "must be a string"
    if kind == "optional_str":
        return None if value is None or isinstance(value, str) else "must be a string or None"
    raise AssertionError(f"unknown rule {kind}")


def problems(config, num_replicas=None, fields=None):
    """Every problem of `config` as `config.field=value: what is valid` strings.

    `num_replicas`: also check that the batches split evenly over that many replicas.
    `fields`: check only these (default: all of RULES); fields the config lacks are skipped.
    """
    fields = set(RULES if fields is None else fields)
    present = {name for name in fields if name in config}
    found, bad = [], set()

    def add(names, value_text, message=None):
        """Reports `value_text: message` (or `value_text` alone) against the fields `names`
        (`model.<field>` for the model's)."""
        names = (names,) if isinstance(names, str) else names
        found.append(value_text if message is None else f"{value_text}: {message}")
        bad.update(names)

    def ok(*names):
        return all(name.split(".")[0] in present and name not in bad for name in names)

    for name in sorted(present, key=list(RULES).index):
        kind, details = RULES[name]
        if kind == "spec":
            continue  # below, with the image size
        message = _rule_problem(kind, details, config[name])
        if message:
            add(name, f"config.{name}={config[name]!r}", message)
    for name in _misplaced_model_fields(config):
        add(name, f"config.{name}={config[name]!r}",
            f"is a model field, which is config.model.{name} now (the fields of "
            "keras_vit.ViTConfig are in config.model)")

    if ok("warmup_steps", "total_steps") and config.warmup_steps > config.total_steps:
        add("warmup_steps", f"config.warmup_steps={config.warmup_steps}",
            f"must be at most config.total_steps={config.total_steps} (the warm-up is part of "
            "the run)")
    if ok("batch_size") and num_replicas:
        if config.batch_size % num_replicas:
            add("batch_size", f"config.batch_size={config.batch_size}",
                f"must be divisible by the {num_replicas} replicas (each gets an equal share)")
    if ok("eval_batch_size") and num_replicas:
        if config.eval_batch_size % num_replicas:
            add("eval_batch_size", f"config.eval_batch_size={config.eval_batch_size}",
                f"must be divisible by the {num_replicas} replicas (each gets an equal share)")
    if ok("batch_size", "accum_steps"):
        per_replica = config.batch_size // (num_replicas or 1)
        if per_replica % config.accum_steps:
            where = (f"the per-replica batch {per_replica} (batch_size {config.batch_size} over "
                     f"{num_replicas} replicas)" if num_replicas and num_replicas > 1
                     else f"config.batch_size={config.batch_size}")
            add("accum_steps", f"config.accum_steps={config.accum_steps}",
                f"must divide {where} into equal micro-batches")
    if ok(*(name for name in augmentation.FIELDS if name in config)):
        per_replica = config.batch_size // (num_replicas or 1) if ok("batch_size") else 2
        for names, shown, message in augmentation.problems(config, per_replica):
            add(names, shown, message)
    if ok("mpp_mask_rate", "mpp_random_rate") and (
            config.mpp_mask_rate + config.mpp_random_rate > 1.0 + 1e-9):
        add(("mpp_mask_rate", "mpp_random_rate"),
            f"config.mpp_mask_rate={config.mpp_mask_rate}, "
            f"config.mpp_random_rate={config.mpp_random_rate}",
            "are shares of the corrupted patches, so together at most 1 (the rest are kept "
            "as they are)")
    if "model" in present:
        spec = _check_model(config, ok("image_size"), add)
        if spec is not None and ok("image_size"):
            _check_masked_patch_prediction(config, spec.total_stride, ok, add)
    if ok("dataset") and config.dataset.startswith(FOLDER_PREFIX):
        root = config.dataset[len(FOLDER_PREFIX):]
        if "://" not in root and not os.path.isdir(root):
            add("dataset", f"config.dataset={config.dataset!r}",
                f"{root!r} is not a folder. A folder dataset is "
                "root/<split>/<class>/<image files>")
    if ok("pretrained", "model.variant") and config.pretrained:
        _check_pretrained(config, add)
    return found


def model_spec(config, num_classes, include_top=True):
    """The `keras_vit.ViTConfig` of a training config: the fields of `config.model`, with
    `config.image_size`, the dataset's `num_classes` and `include_top` (False for an encoder
    without a head). `config` is a ConfigDict or the dict of a `config.json` (`run_config.saved`);
    a field that a config.json written before it existed lacks takes the spec's default.
    Raises the spec's ValueError (or TypeError) naming every bad field."""
    from keras_vit.spec import ViTConfig

    return ViTConfig.from_dict({**_model_fields(config), "image_size": config["image_size"],
                                "num_classes": num_classes, "include_top": include_top})


def _model_fields(config):
    model = config["model"]
    return {name: model[name] for name in model}


def _misplaced_model_fields(config):
    """Top-level fields of `config` that are ViTConfig fields other than image_size: what a
    config file written for flat model fields (`config.patch_size = 4`) adds."""
    from keras_vit.spec import FIELDS

    return [name for name in config if name in FIELDS and name not in RULES]


def _check_model(config, image_size_ok, add):
    """Adds the spec's problems with `config.model` (and `config.image_size`, when it passed its
    own rule), each as `config.model.<field>=<value>`; returns the spec, or None."""
    from keras_vit.spec import ViTConfig

    model = config.model
    if isinstance(model, str):  # a config.json written before config.model held the fields
        add("model.variant", f"config.model={model!r}",
            f"{MODEL_FIELDS_MOVED}: name the variant as config.model.variant={model!r}")
        return None
    if not hasattr(model, "keys"):
        add("model.variant", f"config.model={model!r}", MODEL_FIELDS_MOVED)
        return None
    fields = _model_fields(config)
    if image_size_ok:
        fields["image_size"] = config.image_size
    problems = [problem for problem in ViTConfig.problems(**fields)
                if image_size_ok or "image_size" not in problem.fields]
    for problem in problems:
        shown = dataclasses.replace(problem, values=tuple(
            config.image_size if field == "image_size" else value  # as given, not as a pair
            for field, value in zip(problem.fields, problem.values)))
        text = shown.describe(field_name=lambda field: "config.image_size"
                              if field == "image_size" else f"config.model.{field}")
        add([field if field == "image_size" else f"model.{field}" for field in problem.fields],
            text)
    if problems or not image_size_ok:
        return None
    return ViTConfig.from_dict(fields)


def _check_masked_patch_prediction(config, patch_pixels, ok, add):
    """What keras_vit.MaskedPatchPredictor and the corruption draw need of the patches."""
    if not ok("objective") or config.objective != "masked_patch_prediction":
        return
    if config.model.get("dynamic_image_size"):
        add("model.dynamic_image_size", "config.model.dynamic_image_size=True",
            "masked patch prediction trains at one image size (its targets are the patches of "
            "that grid): set it to False, and build a model of any size to fine-tune")
    if (ok("mpp_target") and config.mpp_target == "downscaled_color"
            and patch_pixels % MPP_DOWNSCALED_CELLS):
        add("mpp_target", f"config.mpp_target={config.mpp_target!r}",
            f"averages each patch over {MPP_DOWNSCALED_CELLS}x{MPP_DOWNSCALED_CELLS} cells, so "
            f"it needs patches of a multiple of {MPP_DOWNSCALED_CELLS} pixels, not {patch_pixels}"
            " (use 'mean_color' or 'pixels')")
    if ok("mpp_random_rate") and config.mpp_random_rate > 0 and (
            config.image_size // patch_pixels) ** 2 < 2:
        add("mpp_random_rate", f"config.mpp_random_rate={config.mpp_random_rate}",
            "replaces a patch by another patch of the image, but the image is one patch: "
            "set it to 0")


def _check_pretrained(config, add):
    from keras_vit import pretrained

    weights, variant = config.pretrained, config.model["variant"]
    if weights in pretrained.PUBLISHED:
        if variant not in pretrained.PUBLISHED[weights]:
            add("pretrained", f"config.pretrained={weights!r}",
                f"no such checkpoint was published for model {variant!r}; it exists for "
                f"{', '.join(sorted(pretrained.PUBLISHED[weights]))}")
        return
    if "://" in weights or weights.startswith("augreg/") or os.path.isfile(weights):
        return
    add("pretrained", f"config.pretrained={weights!r}",
        "is neither an existing file, a URL, a gs:// path nor a published name "
        f"({', '.join(sorted(pretrained.PUBLISHED))}); use '' to train from scratch")


def check(config, num_replicas=None, fields=None):
    """Raises ValueError naming every bad field of `config` (see `problems`)."""
    found = problems(config, num_replicas, fields)
    if (not found and {"weight_decay", "optimizer"} <= set(config)
            and config.weight_decay > 0 and config.optimizer != "adamw"):
        # A warning, not an error: switching --config.optimizer keeps the config's decay.
        logging.warning("config.weight_decay=%r is ignored: it applies to optimizer='adamw' "
                        "only (config.optimizer=%r).", config.weight_decay, config.optimizer)
    if found:
        plural = "s" if len(found) > 1 else ""
        raise ValueError(f"Invalid config value{plural}: {'; '.join(found)}. Change "
                         f"{'them' if plural else 'it'} in the config file or with "
                         "--config.FIELD=VALUE.")


def check_output_folder(path, flag):
    """Raises UsageError unless `path` (local) is a folder that can be written, or can be
    created; `flag` names the flag in the message. Remote paths (gs://) are left to the run."""
    if not path:
        raise app.UsageError(f"--{flag} is empty: give a folder.")
    if "://" in path:
        return
    path = os.path.abspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise app.UsageError(f"--{flag}={path} is a file, not a folder: give a folder "
                                 "(existing or to be created).")
        if not os.access(path, os.W_OK | os.X_OK):
            raise app.UsageError(f"--{flag}={path} is not writable: fix its permissions or "
                                 "give another folder.")
        return
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise app.UsageError(f"--{flag}={path} cannot be created: {parent} is a file. Give "
                             "another folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise app.UsageError(f"--{flag}={path} cannot be created: {parent} is not writable. "
                             "Give another folder.")

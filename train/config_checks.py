"""Checks of everything a user gives `train.main` and `train.analyze`, before any slow work.

`check(config)` validates every field of `configs/common.py`: each number against its range and
each string against its known values, plus the combinations that would fail later (warm-up
longer than the run, a batch that does not split over the replicas or accumulation steps, ...).
The model, `config.model` with `config.image_size`, is checked by `keras_vit.ViTConfig` itself
(`model_spec` makes the spec of a config). It reports every bad field at once, each as
`config.<field>=<value>: <what is valid>` (`config.model.<field>` for the model's), in one
ValueError. A field added to `configs/common.py` needs a rule in `RULES` (a test checks that
every field has one); a field added to the spec needs nothing here.

Also here: the `--config` flag's parser (a bare name such as `quickstart` is the shipped config
of that name; a config file that is missing or fails to load is one line, not a traceback) and
the `--workdir`/`--out` folder check (a file, or not creatable).
"""

import copy
import dataclasses
import importlib
import importlib.util
import math
import os
import re
import sys

from absl import app, logging

# What the trainer and the model builder accept (also read by train.tf_engine and
# train.schedules; repeated here so that the checks need no TensorFlow).
OPTIMIZERS = ("sgd", "adam", "adamw")
DECAYS = ("cosine", "linear")
OBJECTIVES = ("classification", "masked_patch_prediction")
MPP_TARGETS = ("mean_color", "downscaled_color", "pixels")
MPP_DOWNSCALED_CELLS = 4  # the "downscaled_color" target's cells per patch side
# float32 everywhere, or bfloat16 compute with float32 weights (TPU, CPUs with AMX). No float16:
# the loop has no loss scaling, so float16 gradients would underflow.
DTYPE_POLICIES = ("float32", "mixed_bfloat16")
FOLDER_PREFIX = "folder:"
MAX_SEED = 2**31 - 1
# The tf.distribute strategies of train.main's --strategy (set up by train.strategy).
STRATEGIES = ("tpu", "mirrored", "multi_worker", "one_device")


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

    return ViTConfig(**_model_fields(config), image_size=config["image_size"],
                     num_classes=num_classes, include_top=include_top)


def flat_fields(config, prefix=""):
    """The fields of a config (ConfigDict or dict) by dotted name, as `--config.<name>` names
    them: {"seed": 0, "model.variant": "B/16", "model.hidden_size": None, ...}."""
    flat = {}
    for name in config:
        value = config[name]
        if hasattr(value, "keys"):
            flat.update(flat_fields(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


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
    return ViTConfig(**fields)


def _check_masked_patch_prediction(config, patch_pixels, ok, add):
    """What keras_vit.MaskedPatchPredictor and the corruption draw need of the patches."""
    if not ok("objective") or config.objective != "masked_patch_prediction":
        return
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


# The shipped experiment configs, the package beside this one: `configs` in a checkout (where
# this package is `train`), `keras_vit.configs` when installed (where it is `keras_vit.train`).
CONFIGS_PACKAGE = ".".join([*__package__.split(".")[:-1], "configs"])


def shipped_config(name):
    """The shipped config module `name` (`common`, `quickstart`, ...)."""
    return importlib.import_module(f"{CONFIGS_PACKAGE}.{name}")


def _configs_folder():
    return os.path.dirname(os.path.abspath(importlib.import_module(CONFIGS_PACKAGE).__file__))


def shipped_config_names():
    """The experiment configs `--config=<name>` accepts (`common` is their shared base)."""
    return sorted(name[:-3] for name in os.listdir(_configs_folder())
                  if name.endswith(".py") and not name.startswith("_") and name != "common.py")


def config_file(name):
    """The file `--config=<name>` means: a bare name (no folder, no `.py`) is the shipped
    config of that name, wherever the package is; anything else is a path."""
    if os.sep in name or "/" in name or name.endswith(".py"):
        if not os.path.isfile(name):
            where = "" if os.path.isabs(name) else f" (relative to {os.getcwd()})"
            raise ValueError(f"no config file {name}{where}; give a shipped config "
                             f"({', '.join(shipped_config_names())}) or a config file path")
        return name
    if name not in shipped_config_names():
        raise ValueError(f"no shipped config named {name!r}; give one of "
                         f"{', '.join(shipped_config_names())}, or a config file path")
    return os.path.join(_configs_folder(), f"{name}.py")


def load_config_module(filename):
    """The config file as a module of the shipped configs package, so that its `from . import
    common` is the shipped `common` wherever the package is installed. A shipped file is
    imported under its package name (once per process, as any import); another file (a copy
    to edit) is run as an unregistered module of that package."""
    stem = os.path.splitext(os.path.basename(filename))[0]
    if os.path.samefile(os.path.dirname(os.path.abspath(filename)), _configs_folder()):
        return shipped_config(stem)
    spec = importlib.util.spec_from_file_location(f"{CONFIGS_PACKAGE}.{stem}", filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def define_config_flag(help_text, default=None):
    """Defines the `--config` flag of a command (a shipped config by name, or a file.py, with
    `[:arg]` and `--config.field=value` overrides), loaded by `install_config_parser`."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, help_text, lock_config=True)
    install_config_parser(flags.FLAGS["config"])
    if default is not None:
        flags.FLAGS.set_default("config", default)


def install_config_parser(flag):
    """Gives a `config_flags.DEFINE_config_file` flag our loading (`config_file`,
    `load_config_module`) and one-line errors: a missing file, a syntax error or a bad
    `file.py:argument` name the file and the problem, instead of ml_collections' traceback
    text (or a placeholder config that fails on first use)."""
    base = type(flag.parser)

    class ConfigFileParser(base):
        def parse(self, path):
            name, has_argument, argument = path.partition(":")
            filename = config_file(name)
            try:
                module = load_config_module(filename)
                config = module.get_config(*([argument] if has_argument else []))
            except SyntaxError as error:
                raise ValueError(f"{filename} line {error.lineno}: {error.msg}") from None
            except (TypeError, ValueError) as error:
                text = " ".join(str(error).split()).rstrip(".")
                if "field 'model'" in text:  # `config.model = "B/16"`, the old layout
                    text = (f"{text}. {MODEL_FIELDS_MOVED}: set "
                            "config.model.variant and config.model.<field>")
                raise type(error)(text) from None
            _check_model_flags(flag.name, config, sys.argv)
            if getattr(self, "_lock_config", True) and callable(getattr(config, "lock", None)):
                config.lock()
            return config

    parser = copy.copy(flag.parser)
    parser.__class__ = ConfigFileParser
    flag.parser = parser


def _check_model_flags(flag, config, argv):
    """Raises ValueError for an override in the layout before config.model held the model's
    fields: `--config.model=B/16` or `--config.patch_size=2` (ml_collections would say that
    'B/16' is no ConfigDict, or suggest batch_size)."""
    model = config.get("model") if hasattr(config, "get") else None
    if not hasattr(model, "keys"):
        return
    for arg in argv[1:]:
        match = re.match(rf"^--?{re.escape(flag)}\.(\w+)(?:=(.*))?$", arg)
        if match is None:
            continue
        name, value = match.group(1), match.group(2) or "VALUE"
        if name == "model":
            raise ValueError(f"--{flag}.model={value}: {MODEL_FIELDS_MOVED}; give the variant as "
                             f"--{flag}.model.variant={value}")
        if name in model and name not in config:
            raise ValueError(f"--{flag}.{name}={value}: the model's fields are in config.model; "
                             f"use --{flag}.model.{name}={value}")


def loaded_config(flag_values, name="config"):
    """The config of `--name`, touched so that a file that failed to load is a UsageError
    now, not an `_ErrorConfig` object later. None when the flag was not given."""
    config = flag_values[name].value
    if config is None:
        return None
    try:
        getattr(config, "lock")  # any access raises the loading error
    except OSError as error:
        cause = error.__cause__ or error
        raise app.UsageError(f"--{name}: cannot load the config file "
                             f"({' '.join(str(cause).split())}).") from None
    return config

"""Checks of everything a user gives `train.main` and `train.analyze`, before any slow work.

`check(config)` validates every field of `configs/common.py`: each number against its range and
each string against its known values, plus the combinations that would fail later (warm-up
longer than the run, a batch that does not split over the replicas or accumulation steps, ...).
Each part of the trainer owns its fields: their rules (`RULES`) and the checks between them
(`check`) stand in its module (train.data.settings and .augmentation, train.run.objectives,
.optimizers, .engine, .loop, .export, .starting_point and .distillation), and this module gathers
them (`rules`). The model, `config.model` with `config.image_size`, is checked by
`keras_vit.ViTConfig` itself (`train.run.model_config.model_spec` makes the spec of a config).
Every bad field is reported at once, each as `config.<field>=<value>: <what is valid>`
(`config.model.<field>` for the model's), in one ValueError. A test checks that every field of
`configs/common.py` has a rule; a field added to the spec needs nothing here.

A part is handed only its fields: `section(config, fields)` (the input pipelines get
train.data.settings.FIELDS, the optimizer train.run.optimizers.FIELDS).

Also here: the `--workdir`/`--out` folder check (a file, or not creatable). The `--config` flag
and the loading of config files are train.run.config_flag's. Importing this module loads
neither Keras nor TensorFlow; the owners of the rules are imported when a check runs.
"""

import dataclasses
import math
import numbers
import os

from absl import app, logging

from .model_config import MODEL_FIELDS_MOVED, model_fields


def rules():
    """{field: (kind, details)} of every field of configs/common.py, from each field's owner.

    Kinds: "int": (low, high) inclusive, None for unbounded; "float": (low, high,
    high_inclusive), low inclusive ("float_above": exclusive); "optional_int",
    "optional_float": the same or None; "choice": the valid values; "bool"; "str": non-empty;
    "any_str": may be empty; "optional_str": a string or None; "spec": the fields of
    keras_vit.ViTConfig, checked by the spec (`_check_model`)."""
    from ..data import augmentation, native_input, settings
    from . import (distillation, engine, export, loop, objectives, optimizers,
                   starting_point)

    return {"model": ("spec", None), **loop.RULES, **export.RULES, **objectives.RULES,
            **settings.RULES, **augmentation.RULES, **optimizers.RULES, **engine.RULES,
            **starting_point.RULES, **distillation.RULES, **native_input.RULES}


class Section:
    """The fields `fields` of a config, read-only: `section.batch_size`, `section["seed"]`,
    `section.get(...)`, `name in section`. A part of the trainer given a section reads nothing
    else (another field is an AttributeError naming it)."""

    def __init__(self, config, fields):
        object.__setattr__(self, "_values", {name: config[name] for name in fields
                                             if name in config})

    def __getattr__(self, name):
        if name.startswith("_"):  # Python's own look-ups (pickling for Grain's workers)
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"config.{name} is not in this section of the config "
                                 f"({', '.join(self._values)})") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"a section of the config is read-only (config.{name})")

    def __getitem__(self, name):
        return self.__getattr__(name)

    def __contains__(self, name):
        return name in self._values

    def __iter__(self):
        return iter(self._values)

    def get(self, name, default=None):
        return self._values.get(name, default)


def section(config, fields):
    """`Section` of `config`'s `fields`."""
    return Section(config, fields)


@dataclasses.dataclass
class Report:
    """What `problems` found so far, which each owner's `check` adds to."""

    present: set
    found: list = dataclasses.field(default_factory=list)
    bad: set = dataclasses.field(default_factory=set)

    def add(self, names, value_text, message=None):
        """Reports `value_text: message` (or `value_text` alone) against the fields `names`
        (`model.<field>` for the model's)."""
        names = (names,) if isinstance(names, str) else names
        self.found.append(value_text if message is None else f"{value_text}: {message}")
        self.bad.update(names)

    def ok(self, *names):
        """Whether the fields `names` are checked and passed their own rules so far."""
        return all(name.split(".")[0] in self.present and name not in self.bad
                   for name in names)


# What train.analyze reads of a config (a workdir's config.json or a config file).
ANALYZE_FIELDS = ("model", "pretrained", "dataset", "data_dir", "train_split", "eval_split",
                  "image_size")


def _interval(low, high, high_inclusive, low_inclusive=True):
    if high is None:
        return f">= {low}" if low_inclusive else f"> {low}"
    left = "[" if low_inclusive else "("
    right = "]" if high_inclusive else ")"
    return f"in {left}{low}, {high}{right}"


def _is_bool(value):
    """A Python or NumPy bool (NumPy's numbers are taken where Python's are)."""
    return type(value).__name__ in ("bool", "bool_")


def _rule_problem(kind, details, value):
    """What is wrong with `value` under the rule, or None."""
    if kind.startswith("optional_") and kind != "optional_str":
        return None if value is None else _rule_problem(kind[len("optional_"):], details, value)
    if kind == "int":
        low, high = details
        what = "an integer"
        if not isinstance(value, numbers.Integral) or _is_bool(value):
            return f"must be {what}"
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
            return f"must be {what} {bounds}"
        return None
    if kind in ("float", "float_above"):
        low, high, high_inclusive = details
        interval = _interval(low, high, high_inclusive, low_inclusive=kind == "float")
        if (not isinstance(value, numbers.Real) or _is_bool(value)
                or not math.isfinite(value)):
            return f"must be a finite number {interval}"
        too_low = value <= low if kind == "float_above" else value < low
        too_high = high is not None and (value > high if high_inclusive else value >= high)
        return f"must be {interval}" if too_low or too_high else None
    if kind == "choice":
        return None if value in details else f"must be one of {', '.join(map(repr, details))}"
    if kind == "bool":
        return None if _is_bool(value) else "must be True or False"
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
    `fields`: check only these (default: every field with a rule); fields the config lacks are
    skipped.
    """
    from ..data import augmentation, native_input, settings
    from . import distillation, engine, export, objectives, optimizers, starting_point

    every_rule = rules()
    fields = set(every_rule if fields is None else fields)
    report = Report(present={name for name in fields if name in config})
    for name in sorted(report.present, key=list(every_rule).index):
        kind, details = every_rule[name]
        if kind == "spec":
            continue  # below, with the image size
        message = _rule_problem(kind, details, config[name])
        if message:
            report.add(name, f"config.{name}={config[name]!r}", message)
    for name in _misplaced_model_fields(config, every_rule):
        report.add(name, f"config.{name}={config[name]!r}",
                   f"is a model field, which is config.model.{name} now (the fields of "
                   "keras_vit.ViTConfig are in config.model)")

    optimizers.check(config, report)
    export.check(config, report)
    engine.check(config, report, num_replicas)
    starting_point.check(config, report)
    distillation.check(config, report)
    if report.ok(*(name for name in augmentation.FIELDS if name in config)):
        per_replica = config.batch_size // (num_replicas or 1) if report.ok("batch_size") else 2
        for names, shown, message in augmentation.problems(config, per_replica):
            report.add(names, shown, message)
    settings.check(config, report)
    if "model" in report.present:
        spec = _check_model(config, report.ok("image_size"), report.add)
        if spec is not None and report.ok("image_size"):
            objectives.check(config, report, spec)
            if all(name in config for name in native_input.FIELDS):
                native_input.check(config, report, spec)
    return report.found


def _misplaced_model_fields(config, every_rule):
    """Top-level fields of `config` that are ViTConfig fields other than image_size: what a
    config file written for flat model fields (`config.patch_size = 4`) adds."""
    from keras_vit.architecture.spec import FIELDS

    return [name for name in config if name in FIELDS and name not in every_rule]


def _check_model(config, image_size_ok, add):
    """Adds the spec's problems with `config.model` (and `config.image_size`, when it passed its
    own rule), each as `config.model.<field>=<value>`; returns the spec, or None."""
    from keras_vit.architecture.spec import ViTConfig

    model = config.model
    if isinstance(model, str):  # a config.json written before config.model held the fields
        add("model.variant", f"config.model={model!r}",
            f"{MODEL_FIELDS_MOVED}: name the variant as config.model.variant={model!r}")
        return None
    if not hasattr(model, "keys"):
        add("model.variant", f"config.model={model!r}", MODEL_FIELDS_MOVED)
        return None
    fields = model_fields(config)
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


def check(config, num_replicas=None, fields=None):
    """Raises ValueError naming every bad field of `config` (see `problems`)."""
    found = problems(config, num_replicas, fields)
    if not found and {"weight_decay", "optimizer"} <= set(config):
        from . import optimizers

        for warning in optimizers.warnings(config):
            logging.warning("%s", warning)
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

"""The run's config, `workdir/config.json`: checked on every rerun, written once the run is valid.

A rerun in the same workdir resumes from its checkpoints, so it must train the same model on the
same data with the same batch. A rerun whose config differs in anything else than the fields
below is refused before anything is written, naming the fields (`model.hidden_size` for the
model's); `config.json` keeps describing the checkpoints beside it.

Runs written before `config.model` held the model's fields have the old, flat layout (`"model":
"R+Ti/16", "patch_size": 2, ...`): `saved` reads them in today's layout (`migrate`), so that they
resume, export and are analysed as before.
"""

import json

from keras_vit import fileio
from keras_vit.architecture.execution import split_fields
from keras_vit.architecture.spec import FIELDS as SPEC_FIELDS
from keras_vit.architecture.spec import upgrade_fields

from . import run_files
from .model_config import model_spec
from .config_flag import flat_fields, shipped_config

# What a rerun may change: how long to run and how to evaluate, save and export, where the same
# data lives, how the JAX engine lays the model over the devices, how many processes make its
# batches, how attention is computed and what the backward pass computes again; not what is
# trained.
MAY_CHANGE_ON_RESUME = ("total_steps", "steps_per_loop", "eval_every_steps",
                        "checkpoint_every_steps", "keep_checkpoints", "eval_batch_size",
                        "jit_compile", "export", "export_onnx", "data_dir", "model_parallel",
                        "fsdp", "input_workers", "attention_impl", "remat")


# Fields added to configs/common.py whose default does something else than the code did before
# them, with the value a saved run without the field had.
OLDER_RUNS = {"input_pipeline": "tf.data"}


class ConfigMismatchError(ValueError):
    """The config of a rerun differs from the saved run's where it must not."""


def _as_json(config):
    return json.loads(config.to_json_best_effort())


def migrate(saved):
    """`saved` (a config.json's dict) in today's layout: a run written before `config.model`
    held the model's fields has `model` as the variant name and the other fields beside it
    (patch_size, hidden_size, classifier, ...); they move into `model`, the name as its
    `variant`. A run written while `attention_impl` and `remat` were model fields has them in
    `model`; they move out, beside it (how a run executes is not the model)."""
    model = saved.get("model")
    if isinstance(model, str):
        model_fields = set(SPEC_FIELDS) - {"variant", "image_size"}  # the image size stays
        migrated = {name: value for name, value in saved.items() if name not in model_fields}
        migrated["model"] = {"variant": saved["model"],
                             **{name: saved[name] for name in saved if name in model_fields}}
        saved, model = migrated, migrated["model"]
    if not isinstance(model, dict):
        return saved
    # `approximate_gelu` before `activation`; the execution fields before they left the model.
    fields, execution = split_fields(upgrade_fields(model))
    return {**execution, **saved, "model": fields}


def replaced(config, fields=None, **more):
    """A copy of `config` with `fields` (by dotted name: `model.num_layers`) and `more` set,
    locked as `config` is; `config` itself when nothing changes. A run's config is not edited
    in place once it is checked."""
    fields = {**(fields or {}), **more}
    if all(_get(config, name) == value for name, value in fields.items()):
        return config
    copy = config.copy_and_resolve_references()
    for name, value in fields.items():
        section, _, field = name.rpartition(".")
        (_get(copy, section) if section else copy)[field] = (
            list(value) if isinstance(value, tuple) else value)
    if config.is_locked:
        copy.lock()
    return copy


def _get(config, name):
    for part in name.split("."):
        config = config[part]
    return config


def saved(workdir, fix="restore it, or use a new --workdir"):
    """The saved config as a dict in today's layout (`migrate`, and `OLDER_RUNS` for the fields
    it lacks), or None when the workdir has none. A file that is not valid JSON is a ValueError
    naming it, with `fix`, what the caller's user can do."""
    path = run_files.config_file(workdir)
    if not fileio.exists(path):
        return None
    with fileio.open_file(path, "r") as handle:
        text = handle.read()
    try:
        return {**OLDER_RUNS, **migrate(json.loads(text))}
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); it describes the run "
                         f"in this workdir: {fix}.") from error


def _nested(flat):
    """The inverse of `flat_fields`."""
    nested = {}
    for name, value in flat.items():
        *parents, leaf = name.split(".")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return nested


def _resolved_model(fields):
    """`fields` (a config as JSON) with its model as the spec resolves it: a field left None
    (the variant's) and the same value given explicitly are the same model."""
    try:
        spec = model_spec(fields, num_classes=1).to_dict()
    except (TypeError, ValueError, KeyError):
        return fields  # not a valid model: compared as written
    model = {name: spec[name] for name in fields["model"]}
    return {**fields, "model": model}


def differences(config, workdir, may_change=MAY_CHANGE_ON_RESUME):
    """`[(field, saved value, value in config)]` for each field outside `may_change` in which
    `config` differs from the run saved in `workdir`; [] when the workdir has no run."""
    previous = saved(workdir)
    if previous is None:
        return []
    # A field added to configs/common.py (or to the spec) after the run started is missing from
    # its config.json. New fields default to what the code did before them (position_embedding
    # "learned" at the "stem", ...), so the saved run had the default (or, for a few, OLDER_RUNS).
    defaults = {**flat_fields(_as_json(shipped_config("common").get_config())), **OLDER_RUNS}
    previous = flat_fields(_resolved_model(_nested({**defaults, **flat_fields(previous)})))
    current = flat_fields(_resolved_model(_as_json(config)))
    if current.get("input_pipeline") == "auto":  # "auto" resumes with the saved run's choice
        current["input_pipeline"] = previous.get("input_pipeline")
    return [(name, previous.get(name), current.get(name))
            for name in sorted(set(previous) | set(current))
            if name not in may_change and previous.get(name) != current.get(name)]


def describe(differences):
    """`field: old -> new, ...` of `differences`."""
    return ", ".join(f"{name}: {old!r} -> {new!r}" for name, old, new in differences)


def check_resume(config, workdir):
    """Raises ConfigMismatchError when `config` may not resume the run saved in `workdir`."""
    differ = differences(config, workdir)
    if differ:
        raise ConfigMismatchError(
            f"{workdir} holds a run with another config ({describe(differ)}); resuming it would "
            "mix two runs. Use a new --workdir, or rerun with the saved values from "
            f"{run_files.config_file(workdir)}. Only {', '.join(MAY_CHANGE_ON_RESUME)} may change "
            "on a rerun.")


def write(config, workdir):
    """Writes `config.json` atomically (read back by train.export and by reruns)."""
    fileio.write_atomically(run_files.config_file(workdir), config.to_json_best_effort(indent=2))

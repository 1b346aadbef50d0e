"""The run's config, `workdir/config.json`: checked on every rerun, written once the run is valid.

A rerun in the same workdir resumes from its checkpoints, so it must train the same model on the
same data with the same batch. A rerun whose config differs in anything else than the fields
below is refused before anything is written, naming the fields; `config.json` keeps describing
the checkpoints beside it.
"""

import json

from keras_vit import fileio

from . import run_files
from .config_checks import shipped_config

# What a rerun may change: how long to run and how to evaluate, save and export, and where the
# same data lives; not what is trained.
MAY_CHANGE_ON_RESUME = ("total_steps", "steps_per_loop", "eval_every_steps",
                        "checkpoint_every_steps", "keep_checkpoints", "eval_batch_size",
                        "jit_compile", "export", "data_dir")


class ConfigMismatchError(ValueError):
    """The config of a rerun differs from the saved run's where it must not."""


def _as_json(config):
    return json.loads(config.to_json_best_effort())


def saved(workdir, fix="restore it, or use a new --workdir"):
    """The saved config as a dict, or None when the workdir has none. A file that is not valid
    JSON is a ValueError naming it, with `fix`, what the caller's user can do."""
    path = run_files.config_file(workdir)
    if not fileio.exists(path):
        return None
    with fileio.open_file(path, "r") as handle:
        text = handle.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); it describes the run "
                         f"in this workdir: {fix}.") from error


def differences(config, workdir, may_change=MAY_CHANGE_ON_RESUME):
    """`[(field, saved value, value in config)]` for each field outside `may_change` in which
    `config` differs from the run saved in `workdir`; [] when the workdir has no run."""
    previous = saved(workdir)
    if previous is None:
        return []
    current = _as_json(config)
    # A field added to configs/common.py after the run started is missing from its config.json.
    # New fields default to what the code did before them (position_embedding "learned" at the
    # "stem", ...), so the saved run had the default.
    defaults = _as_json(shipped_config("common").get_config())
    previous = {**{name: value for name, value in defaults.items() if name not in previous},
                **previous}
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

"""The run's config, `workdir/config.json`: checked on every rerun, written once the run is valid.

A rerun in the same workdir resumes from its checkpoints, so it must train the same model on the
same data with the same batch. A rerun whose config differs in anything else than the fields
below is refused before anything is written, naming the fields; `config.json` keeps describing
the checkpoints beside it.
"""

import json
import os

import tensorflow as tf

# What a rerun may change: how long to run and how to evaluate, save and export, and where the
# same data lives; not what is trained.
MAY_CHANGE_ON_RESUME = ("total_steps", "steps_per_loop", "eval_every_steps",
                        "checkpoint_every_steps", "keep_checkpoints", "eval_batch_size",
                        "jit_compile", "export", "data_dir")


class ConfigMismatchError(ValueError):
    """The config of a rerun differs from the saved run's where it must not."""


def path(workdir):
    return os.path.join(workdir, "config.json")


def _as_json(config):
    return json.loads(config.to_json_best_effort())


def saved(workdir, fix="restore it, or use a new --workdir"):
    """The saved config as a dict, or None when the workdir has none. A file that is not valid
    JSON is a ValueError naming it, with `fix`, what the caller's user can do."""
    if not tf.io.gfile.exists(path(workdir)):
        return None
    with tf.io.gfile.GFile(path(workdir)) as handle:
        text = handle.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path(workdir)} is not valid JSON ({error}); it describes the run "
                         f"in this workdir: {fix}.") from error


def check_resume(config, workdir):
    """Raises ConfigMismatchError when `config` may not resume the run saved in `workdir`."""
    previous = saved(workdir)
    if previous is None:
        return
    current = _as_json(config)
    differ = sorted(name for name in set(previous) | set(current)
                    if name not in MAY_CHANGE_ON_RESUME
                    and previous.get(name) != current.get(name))
    if differ:
        changes = ", ".join(f"{name}: {previous.get(name)!r} -> {current.get(name)!r}"
                            for name in differ)
        raise ConfigMismatchError(
            f"{workdir} holds a run with another config ({changes}); resuming it would mix "
            "two runs. Use a new --workdir, or rerun with the saved values from "
            f"{path(workdir)}. Only {', '.join(MAY_CHANGE_ON_RESUME)} may change on a rerun.")


def write(config, workdir):
    """Writes `config.json` atomically (read back by train.export and by reruns)."""
    temporary = path(workdir) + ".tmp"
    with tf.io.gfile.GFile(temporary, "w") as handle:
        handle.write(config.to_json_best_effort(indent=2))
    tf.io.gfile.rename(temporary, path(workdir), overwrite=True)

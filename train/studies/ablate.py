"""Trains every arm of an ablation study at several seeds, and writes the paper-style table.

    python -m train.studies.ablate --study=position_embedding --out=docs/ablations
    python -m train.studies.ablate --study=classifier --out=docs/ablations --steps=600 --seeds=3
    python -m train.studies.ablate --study=hybrid --out=/tmp/ablations --dataset=cifar10

Studies (train/studies/ablations.py): `position_embedding` (the paper's Table 8), `classifier`
(class token against GAP, each at its best learning rate), `hybrid` (ViT against R+ViT at equal
training FLOPs), `axial` (ViT against Axial-ViT), `augreg` (AugReg's augmentation levels on
6,000 training images, base configs/augreg.py) and `layer_decay` (fine-tuning a pre-trained
encoder given by --config.pretrained with and without layer-wise learning-rate decay, base
configs/mpp_finetune.py:labels=6000). Writes into --out:

- `<study>.md`: the table (mean ± std of the test top-1 accuracy over seeds), the budget and
  the command; `<study>.png`: each arm's accuracy with error bars; `<study>.json`: every run's
  numbers, rewritten after each run;
- `runs/<study>/<arm>/seed<k>/`: the workdir of each run, with its `train.log`.

Every run is `python -m train.main` in a subprocess (a fresh TensorFlow each), on the base config
(--config, default the study's, with any --config.field=value) plus the arm's fields, the
seed and the steps. Rerun the same command to resume a stopped study: the runs whose
metrics.jsonl holds the final evaluation are skipped, and train.main resumes an unfinished one
from its checkpoint. A run folder that holds a run of other settings is an error, before any
training. Exit status: 0 when every run finished; 75 when stopped by SIGTERM or Ctrl-C (the run
in progress saves a checkpoint; rerun to resume); 1 on an error (one `Error:` line).
"""

import copy
import dataclasses
import itertools
import json
import os
import shlex
import signal
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from ..console import cli
from ..run import config_checks, config_flag, model_config
from . import ablations, child_runs

DEFAULT_CONFIG = "ablation"  # the shipped configs/ablation.py, for an unknown --study

flags.DEFINE_enum("study", None, list(ablations.STUDIES), "The study to run.")
flags.DEFINE_string("out", None, "Local folder for <study>.md, .png, .json and runs/.")
flags.DEFINE_integer("steps", None, "Training steps of every run (hybrid: of the costlier "
                     "model); default: the config's total_steps.")
flags.DEFINE_integer("seeds", 2, "Seeds per arm: 0, 1, ..., seeds - 1.")
flags.DEFINE_string("dataset", None, "A TFDS dataset name or folder:/path (as "
                    "--config.dataset); default: the config's, the offline Fashion-MNIST.")
config_flag.define_config_flag("Base config of every run (a shipped name or file.py, [:arg]); "
                               "default: the study's (configs/ablation.py; augreg: "
                               "configs/augreg.py; layer_decay: "
                               "configs/mpp_finetune.py:labels=6000). --config.field=value "
                               "overrides a field.")
flags.declare_key_flag("verbose")  # defined in train/console/cli.py; listed by --help
flags.mark_flags_as_required(["study", "out"])
FLAGS = flags.FLAGS

# Fields that this command sets in every run, and the flag that sets each. (It sets the warm-up
# too, from the config's: the same fraction of each run's steps. The classifier study's sweep
# derives its rates and splits from the config's too.)
RUN_FIELDS = {"seed": "--seeds", "total_steps": "--steps"}


class Stopped(Exception):
    """SIGTERM reached this process."""


@dataclasses.dataclass
class Run:
    """One training run: an arm at a seed, its config and workdir, the name its progress lines
    show, and whether it belongs to the classifier study's learning-rate sweep."""

    arm: ablations.Arm
    seed: int
    config: object  # an ml_collections.ConfigDict
    workdir: str
    name: str
    sweep: bool = False


def check_flags():
    """Checks every flag before TensorFlow starts; returns the base config (a copy)."""
    if FLAGS.steps is not None and FLAGS.steps < 1:
        raise app.UsageError(f"--steps={FLAGS.steps} must be at least 1.")
    if FLAGS.seeds < 1:
        raise app.UsageError(f"--seeds={FLAGS.seeds} must be at least 1.")
    if "://" in FLAGS.out:
        raise app.UsageError(f"--out={FLAGS.out}: give a local folder (each run's log is a "
                             "local file).")
    config_checks.check_output_folder(FLAGS.out, "out")
    config = copy.deepcopy(config_flag.loaded_config(FLAGS))
    overrides = config_flags.get_override_values(FLAGS["config"])
    study = ablations.STUDIES[FLAGS.study]
    owned = dict(RUN_FIELDS)
    for arm in study.arms:
        owned.update({name: f"the arms of --study={FLAGS.study}" for name in arm.fields})
    taken = {name: owner for name, owner in owned.items() if name in overrides}
    if taken:
        raise app.UsageError(" ".join(f"--config.{name} is set by {owner}: drop it." for
                                      name, owner in taken.items()))
    if FLAGS.dataset is not None:
        if "dataset" in overrides and overrides["dataset"] != FLAGS.dataset:
            raise app.UsageError(f"--dataset={FLAGS.dataset} and --config.dataset="
                                 f"{overrides['dataset']} disagree: give one.")
        config.dataset = FLAGS.dataset
    if study.sweep_learning_rate and any(c in config.train_split for c in "[+"):
        raise app.UsageError(f"--study={FLAGS.study} holds out {ablations.HELD_OUT_PERCENT}% of "
                             f"config.train_split={config.train_split!r} for its sweep: give a "
                             "plain split name (such as 'train').")
    if study.needs_pretrained and not config.pretrained:
        raise app.UsageError(f"--study={FLAGS.study} fine-tunes a pre-trained encoder: give it "
                             "with --config.pretrained=FILE (e.g. the export/encoder.npz of a "
                             "configs/mpp.py run).")
    return config


def child_flags(config):
    """`--config.field=value` (`--config.model.field=value`) for every field in which `config`
    differs from the base config file's own values: the command-line overrides and the run's
    fields."""
    given = config_flag.flat_fields(config_flag.loaded_config(FLAGS))  # with the overrides
    fields = dict(config_flags.get_override_values(FLAGS["config"]))
    fields.update({name: value for name, value in config_flag.flat_fields(config).items()
                   if value != given[name]})
    return [f"--config.{name}={_flag_text(name, value)}" for name, value in fields.items()]


def _flag_text(name, value):
    if value is None:  # ml_collections cannot parse None back for a typed field
        raise ValueError(f"config.{name}=None cannot be passed to train.main; set it in the "
                         "config file.")
    return repr(value) if isinstance(value, float) else str(value)


def run_config(config, fields):
    """A copy of `config` with `fields` (dotted names, as an arm's) changed."""
    config = copy.deepcopy(config)
    config.update_from_flattened_dict(fields)
    return config


def plan(study_name, base, steps, seeds, builder):
    """The arms' summaries (model size and cost, steps), the runs of every arm and seed, and
    `test_runs(picked)`: for the classifier study the runs are its sweep's, and its test runs
    are at the learning rates `picked` from their results ({arm name: rate})."""
    from ..run import objectives
    from keras_vit.analysis import flops

    study = ablations.STUDIES[study_name]
    num_classes = builder.info.features["label"].num_classes
    warmup_fraction = base.warmup_steps / base.total_steps
    arms = {}
    for arm in study.arms:
        config = run_config(base, arm.fields)
        try:  # an arm that cannot train is an error before any run
            config_checks.check(config)
        except ValueError as error:
            raise ValueError(f"--study={study_name}, arm {arm.name!r}: {error}") from None
        model = objectives.build_model(config, num_classes)
        arms[arm.name] = {"label": arm.label.replace("\n", " "), "fields": arm.fields,
                          "model": config.model.variant, "params": model.count_params(),
                          "forward_flops": flops.forward_flops(model),
                          "batch_size": config.batch_size, "steps": steps, "runs": []}
        if study.sweep_learning_rate:
            arms[arm.name].update(sweep=[], learning_rate=None)
    if study.match_flops:
        matched = ablations.matched_steps(
            steps, {name: arm["forward_flops"] for name, arm in arms.items()})
        for name, arm in arms.items():
            arm["steps"] = matched[name]

    def make_run(arm, seed, sweep=False, **fields):
        arm_steps = arms[arm.name]["steps"]
        fields = dict(arm.fields, seed=seed, total_steps=arm_steps,
                      warmup_steps=round(warmup_fraction * arm_steps), **fields)
        config = run_config(base, fields)
        config_checks.check(config)
        folder, name = arm.name, arm.name
        if "learning_rate" in fields:
            folder += f"-lr{fields['learning_rate']:g}"
            name += f" lr {fields['learning_rate']:g}" + (" (held-out)" if sweep else "")
        parts = [FLAGS.out, "runs", study_name] + (["sweep"] if sweep else [])
        workdir = os.path.abspath(os.path.join(*parts, folder, f"seed{seed}"))
        return Run(arm, seed, config, workdir, f"{name} seed {seed}", sweep)

    if study.sweep_learning_rate:
        train = f"{base.train_split}[:{100 - ablations.HELD_OUT_PERCENT}%]"
        held_out = f"{base.train_split}[{100 - ablations.HELD_OUT_PERCENT}%:]"
        runs = [make_run(arm, 0, sweep=True, learning_rate=rate, train_split=train,
                         eval_split=held_out)
                for arm in study.arms for rate in ablations.sweep_learning_rates(
                    base.learning_rate)]
    else:
        runs = [make_run(arm, seed) for arm in study.arms for seed in range(seeds)]

    def test_runs(picked):
        return [make_run(arm, seed, learning_rate=picked[arm.name])
                for arm in study.arms for seed in range(seeds)]

    return arms, runs, test_runs


def check_resumable(run):
    """Raises UsageError when the run's workdir holds a run of other settings."""
    from ..run import run_config as saved_runs

    # Stricter than train.main: a finished run counts only if it trained what this invocation
    # would, for as many steps; where the data lives and how it evaluated, saved and logged
    # along the way may differ.
    may_change = [name for name in saved_runs.MAY_CHANGE_ON_RESUME if name != "total_steps"]
    differ = saved_runs.differences(run.config, run.workdir, may_change=may_change)
    if differ:
        raise app.UsageError(
            f"{run.workdir} holds a run of other settings ({saved_runs.describe(differ)}): "
            f"this --out was used for --study={FLAGS.study} with other --steps, --dataset or "
            "--config values. Use another --out, or delete that folder (or all of "
            f"{os.path.join(FLAGS.out, 'runs', FLAGS.study)}) to train it again.")


def final_accuracy(run):
    """The test (or held-out) accuracy of the run's final evaluation, or None if the run has
    not finished."""
    return child_runs.final_accuracy(run.workdir, run.config.total_steps)


def train(run):
    """Runs (or resumes) `python -m train.main` for `run`, its output in workdir/train.log;
    returns the final accuracy. Raises UsageError if it fails."""
    return child_runs.train([f"--config={config_flags.get_config_filename(FLAGS['config'])}",
                             *child_flags(run.config)], run.workdir, run.config.total_steps)


def describe_model(config):
    spec = model_config.model_spec(config, num_classes=1)
    return (f"`{spec.variant}` with {spec.patch_size}x{spec.patch_size} patches, width "
            f"{spec.hidden_size}, MLP {spec.mlp_dim}, {spec.num_heads} heads, "
            f"{_count(spec.num_layers, 'block')}, classifier `{spec.classifier}`, position "
            f"embedding `{spec.position_embedding}` at `{spec.position_embedding_placement}`"
            " (each arm changes what its study names)")


def describe_training(config, sweep):
    rate = ("learning rate picked per arm (below)" if sweep
            else f"learning rate {config.learning_rate:g}")
    decay = f", weight decay {config.weight_decay:g}" if config.optimizer == "adamw" else ""
    return (f"{config.optimizer}, {rate}{decay}, warm-up "
            f"{config.warmup_steps / config.total_steps:.0%} of the steps then {config.decay} "
            f"decay to 0, gradient clipping at {config.grad_clip_norm:g}, "
            f"{config.dtype_policy}")


def summarize(base, steps, builder, arms):
    """The study's summary, kept in <out>/<study>.json: what every run shares, and `arms`, to
    which each run's result is added as it finishes."""
    splits = builder.info.splits
    return {
        "study": FLAGS.study,
        "command": shlex.join(["python", "-m", "train.studies.ablate", *sys.argv[1:]]),
        "dataset": base.dataset,
        "train_split": base.train_split,
        "eval_split": base.eval_split,
        "train_examples": splits[base.train_split].num_examples,
        "eval_examples": splits[base.eval_split].num_examples,
        "budget": {"steps": steps, "batch_size": base.batch_size,
                   "image_size": base.image_size, "model": describe_model(base),
                   "optimizer": describe_training(
                       base, ablations.STUDIES[FLAGS.study].sweep_learning_rate)},
        "seeds": list(range(FLAGS.seeds)),
        "arms": arms,
        "complete": False,
    }


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    base = check_flags()
    steps = FLAGS.steps or base.total_steps
    # The base config at these steps (each run's warm-up is set with its steps, below).
    config_checks.check(run_config(base, {"total_steps": steps, "warmup_steps": 0}))
    from keras_vit import fileio
    from keras_vit.analysis import plotting
    from ..data import tf_pipeline
    from ..run import metrics
    from ..run.loop import RESUMABLE_EXIT_CODE

    study = ablations.STUDIES[FLAGS.study]
    builder = tf_pipeline.get_builder(base)  # the dataset and its splits, checked now
    arms, runs, test_runs = plan(FLAGS.study, base, steps, FLAGS.seeds, builder)
    summary = summarize(base, steps, builder, arms)
    if study.sweep_learning_rate:
        summary["sweep_splits"] = [runs[0].config.train_split, runs[0].config.eval_split]
        tf_pipeline.get_builder(runs[0].config)  # the held-out split expressions, checked
    for run in runs:
        check_resumable(run)
    json_path = os.path.join(FLAGS.out, f"{FLAGS.study}.json")
    previous_seconds = _previous_seconds(json_path)
    total = len(runs) + (len(study.arms) * FLAGS.seeds if study.sweep_learning_rate else 0)
    counter = itertools.count(1)

    def execute(run):
        """Trains `run` unless it finished before; adds its result to the summary."""
        progress = f"[{next(counter)}/{total}] {FLAGS.study}: {run.name}"
        accuracy = final_accuracy(run)
        if accuracy is not None:
            seconds = previous_seconds.get(run.workdir)
            print(f"{progress}: finished before, {100 * accuracy:.2f}%", flush=True)
        else:
            print(f"{progress}: training (in {os.path.relpath(run.workdir, FLAGS.out)})",
                  flush=True)
            start = time.time()
            accuracy = train(run)
            seconds = round(time.time() - start, 1)
            print(f"{progress}: {100 * accuracy:.2f}% in {seconds:.0f} s", flush=True)
        arms[run.arm.name]["sweep" if run.sweep else "runs"].append({
            "seed": run.seed, "learning_rate": run.config.learning_rate, "accuracy": accuracy,
            **child_runs.final_losses(run.workdir, run.config.total_steps),
            "seconds": seconds, "workdir": os.path.relpath(run.workdir, FLAGS.out)})
        metrics.write_json(json_path, summary)

    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        for run in runs:
            execute(run)
        if study.sweep_learning_rate:
            for arm in arms.values():
                arm["learning_rate"] = ablations.pick_learning_rate(arm["sweep"])
            runs = test_runs({name: arm["learning_rate"] for name, arm in arms.items()})
            for run in runs:
                check_resumable(run)
            for run in runs:
                execute(run)
    except (KeyboardInterrupt, Stopped):
        cli.fail(f"Stopped. Rerun the same command to resume --study={FLAGS.study}: finished "
                 "runs are kept, the stopped one resumes from its checkpoint.",
                 exit_code=RESUMABLE_EXIT_CODE)
    summary["complete"] = True
    metrics.write_json(json_path, summary)
    plot_path = plotting.plot_ablation(
        [arm["label"].replace(" ", "\n", 1) for arm in arms.values()],
        [[run["accuracy"] for run in arm["runs"]] for arm in arms.values()],
        os.path.join(FLAGS.out, f"{FLAGS.study}.png"),
        title=f"{study.title}\ntest top-1 of {len(arms)} arms, {_count(FLAGS.seeds, 'seed')} "
              "each")
    report_path = os.path.join(FLAGS.out, f"{FLAGS.study}.md")
    fileio.write_atomically(report_path, ablations.report(summary))
    print(f"Wrote {report_path}, {plot_path} and {json_path}.", flush=True)


def _count(number, noun):
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _raise_stopped(signum, frame):
    raise Stopped()


def _previous_seconds(json_path):
    """{absolute workdir: seconds} of the runs an earlier invocation trained, for the summary
    of the runs this one skips."""
    try:
        with open(json_path) as handle:
            arms = json.load(handle)["arms"]
        return {os.path.abspath(os.path.join(FLAGS.out, run["workdir"])): run["seconds"]
                for arm in arms.values() for run in arm["runs"] + arm.get("sweep", [])}
    except (OSError, ValueError, LookupError, TypeError, AttributeError):
        return {}  # none yet, or not ours: only the earlier runs' timings are missing


def with_default_config(argv):
    """`argv`, with the study's base config (configs/ablation.py for most) unless it names a
    config. (Not a flag default: ml_collections parses a default, with the --config.field
    overrides, when the flag is defined, so a misspelt field would be a traceback instead of
    an error line.)"""
    named = any(arg in ("--config", "-config") or arg.startswith(("--config=", "-config="))
                for arg in argv[1:])
    if named:
        return argv
    study = ablations.STUDIES.get(_flag_value(argv, "study"))
    return [argv[0], f"--config={study.config if study else DEFAULT_CONFIG}", *argv[1:]]


def _flag_value(argv, name):
    """The value of `--name=value` or `--name value` in `argv`, or None."""
    for index, arg in enumerate(argv[1:], 1):
        for prefix in (f"--{name}", f"-{name}"):
            if arg.startswith(prefix + "="):
                return arg[len(prefix) + 1:]
            if arg == prefix and index + 1 < len(argv):
                return argv[index + 1]
    return None


def run():
    """The `keras-vit-ablate` command (an installed package's console script)."""
    cli.run(main, with_default_config(sys.argv))


if __name__ == "__main__":
    run()

"""Measures what masked patch prediction gives: the pre-trained encoder against the same model
freshly initialised, by few-shot linear accuracy and by fine-tuning.

    python -m train.main --config=configs/mpp.py --workdir=runs/mpp
    python -m train.studies.mpp --pretrain_workdir=runs/mpp --out=docs/mpp

- Few-shot: `keras_vit.analysis.few_shot_accuracy` of the encoder's pooled representation, k
  examples per class drawn from the first --few_shot_train training images, scored on every
  test image; the fresh encoders are initialised with seeds 0 .. --seeds - 1.
- Fine-tuning: `python -m train.main --config=configs/mpp_finetune.py[:labels=N]` for every
  entry of --labels, from the run's `export/encoder.npz` and from scratch, at seeds
  0 .. --seeds - 1 (workdirs under `<out>/runs/`).

Writes `<out>/mpp.md` (the tables and the commands) and `<out>/mpp.json` (every number). Rerun
the same command to resume: finished fine-tuning runs are kept and an unfinished one resumes
from its checkpoint. Exit status: 0 done; 75 stopped by SIGTERM or Ctrl-C; 1 on an error.
"""

import os
import shlex
import signal
import statistics
import sys
import time

from absl import app, flags

from ..console import cli
from ..run import config_checks, config_flag, run_files
from . import child_runs

FINETUNE_CONFIG = "mpp_finetune"  # the shipped configs/mpp_finetune.py

flags.DEFINE_string("pretrain_workdir", None, "Workdir of a finished configs/mpp.py run.")
flags.DEFINE_string("out", None, "Local folder for mpp.md, mpp.json and runs/.")
flags.DEFINE_integer("seeds", 2, "Seeds of the fresh encoders and of every fine-tuning arm.")
flags.DEFINE_list("shots", ["1", "5", "10", "25"], "Examples per class of the few-shot sets.")
flags.DEFINE_integer("few_shot_train", 10_000, "Training images the k-shot sets come from.")
flags.DEFINE_list("labels", ["1000", "all"], "Labelled training images of each fine-tuning "
                  "comparison: numbers, or 'all'.")
flags.mark_flags_as_required(["pretrain_workdir", "out"])
FLAGS = flags.FLAGS


class Stopped(Exception):
    """SIGTERM reached this process."""


def check_flags():
    """Every flag, before TensorFlow starts; returns the pre-training run's config."""
    from ..run import run_config

    for name in ("seeds", "few_shot_train"):
        if FLAGS[name].value < 1:
            raise app.UsageError(f"--{name}={FLAGS[name].value} must be at least 1.")
    try:
        shots = [int(k) for k in FLAGS.shots]
    except ValueError:
        raise app.UsageError(f"--shots={','.join(FLAGS.shots)}: give whole numbers.") from None
    if not shots or min(shots) < 1:
        raise app.UsageError(f"--shots={','.join(FLAGS.shots)}: each must be at least 1.")
    for labels in FLAGS.labels:
        if labels != "all" and (not labels.isdigit() or int(labels) < 1):
            raise app.UsageError(f"--labels: {labels!r} is neither a number of images nor "
                                 "'all'.")
    if "://" in FLAGS.out:
        raise app.UsageError(f"--out={FLAGS.out}: give a local folder.")
    config_checks.check_output_folder(FLAGS.out, "out")
    workdir = FLAGS.pretrain_workdir
    config = run_config.saved(workdir, fix="use the --workdir of a configs/mpp.py run")
    if config is None or config.get("objective") != "masked_patch_prediction":
        raise app.UsageError(f"--pretrain_workdir={workdir} holds no masked-patch-prediction "
                             "run: train one with python -m train.main "
                             f"--config=configs/mpp.py --workdir={workdir}.")
    if not os.path.isfile(encoder_path()):
        raise app.UsageError(f"No {encoder_path()}: the run has not finished (rerun it to "
                             "resume) or ran with --config.export=False.")
    return config, sorted(set(shots))


def encoder_path():
    return run_files.encoder_file(FLAGS.pretrain_workdir)


def few_shot(config, shots):
    """{arm: {k: [accuracy per seed]}} for the pre-trained and the fresh encoders."""
    import keras
    import ml_collections

    from keras_vit import analysis

    from keras_vit.weights import checkpoint
    from ..data import tf_pipeline
    from ..run import objectives

    config = ml_collections.ConfigDict(config)
    builder = tf_pipeline.get_builder(config, for_training=False)
    size = (config.image_size, config.image_size)
    test_examples = builder.info.splits[config.eval_split].num_examples
    train = tf_pipeline.labelled_batches(builder, config.train_split, size, FLAGS.few_shot_train)
    test = tf_pipeline.labelled_batches(builder, config.eval_split, size, test_examples)
    results = {"mpp": {}, "scratch": {}}
    for arm, seeds in (("mpp", [0]), ("scratch", range(FLAGS.seeds))):
        for seed in seeds:
            keras.utils.set_random_seed(seed + 1)
            encoder = objectives.build_model(config, num_classes=1, include_top=False)
            if arm == "mpp":
                checkpoint.load_npz(encoder, encoder_path())
            start = time.time()
            accuracy = analysis.few_shot_accuracy(encoder, train, test, shots=shots)
            print(f"few-shot, {arm} seed {seed}: " + ", ".join(
                f"{k}-shot {100 * value:.2f}%" for k, value in accuracy.items())
                + f" ({time.time() - start:.0f} s)", flush=True)
            for k, value in accuracy.items():
                results[arm].setdefault(str(k), []).append(value)
    return results, test_examples


def finetune(labels, arm, seed):
    """Trains (or resumes, or finds finished) one fine-tuning run; returns its accuracy."""
    arg = "" if labels == "all" else f"labels={labels}"
    finetune_config = config_flag.shipped_config(FINETUNE_CONFIG)
    total_steps = finetune_config.get_config(arg or None).total_steps
    workdir = os.path.abspath(os.path.join(FLAGS.out, "runs", f"finetune-{labels}", arm,
                                           f"seed{seed}"))
    accuracy = child_runs.final_accuracy(workdir, total_steps)
    name = f"fine-tuning on {labels} labels, {arm} seed {seed}"
    if accuracy is not None:
        print(f"{name}: finished before, {100 * accuracy:.2f}%", flush=True)
        return accuracy
    print(f"{name}: training (in {os.path.relpath(workdir, FLAGS.out)})", flush=True)
    start = time.time()
    arguments = [f"--config={FINETUNE_CONFIG}{':' + arg if arg else ''}",
                 f"--config.seed={seed}",
                 f"--config.pretrained={os.path.abspath(encoder_path()) if arm == 'mpp' else ''}"]
    accuracy = child_runs.train(arguments, workdir, total_steps)
    print(f"{name}: {100 * accuracy:.2f}% in {time.time() - start:.0f} s", flush=True)
    return accuracy


def _cell(values):
    mean = 100 * statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {100 * statistics.stdev(values):.2f}"


def report(summary):
    """The markdown of `summary` (as kept in mpp.json)."""
    lines = [
        "# Masked patch prediction: pre-trained encoder against a fresh one", "",
        f"Pre-training: `{summary['pretrain_command']}` ({summary['pretrain']}).", "",
        f"Measured with `{summary['command']}`.", "",
        "## Few-shot linear accuracy (%)", "",
        f"Ridge regression on the frozen pooled representation; k examples per class drawn "
        f"from the first {summary['few_shot_train']:,} training images, 5 draws, scored on "
        f"all {summary['test_examples']:,} test images. Fresh encoders: mean ± std over "
        f"seeds {summary['seeds']}.", "",
        "| encoder | " + " | ".join(f"{k}-shot" for k in summary["few_shot"]["mpp"]) + " |",
        "|---|" + "---|" * len(summary["few_shot"]["mpp"]),
    ]
    for arm, label in (("mpp", "pre-trained (MPP)"), ("scratch", "fresh")):
        lines.append(f"| {label} | " + " | ".join(
            _cell(values) for values in summary["few_shot"][arm].values()) + " |")
    gains = [100 * (statistics.mean(summary["few_shot"]["mpp"][k])
                    - statistics.mean(summary["few_shot"]["scratch"][k]))
             for k in summary["few_shot"]["mpp"]]
    lines.append("| gain (points) | " + " | ".join(f"{gain:+.2f}" for gain in gains) + " |")
    lines += ["", "## Fine-tuning, test top-1 (%)", "",
              f"`configs/mpp_finetune.py` (its `labels=N` argument for the first N training "
              f"images), the same recipe from the encoder and from scratch; mean ± std over "
              f"seeds {summary['seeds']}.", "",
              "| labelled images | from scratch | from MPP | gain (points) |", "|---|---|---|---|"]
    for labels, arms in summary["finetune"].items():
        gain = 100 * (statistics.mean(arms["mpp"]) - statistics.mean(arms["scratch"]))
        lines.append(f"| {labels} | {_cell(arms['scratch'])} | {_cell(arms['mpp'])} | "
                     f"{gain:+.2f} |")
    return "\n".join(lines) + "\n"


def _pretrain_summary(config):
    from ..run import metrics

    records = metrics.read_records(FLAGS.pretrain_workdir)
    final = [record for record in records if record["step"] == config["total_steps"]
             and "eval_loss" in record]
    text = (f"{config['total_steps']:,} steps of batch {config['batch_size']}, target "
            f"`{config['mpp_target']}`")
    if final and "eval_accuracy" in final[-1]:
        text += (f"; final test accuracy of the corrupted patches' targets "
                 f"{100 * final[-1]['eval_accuracy']:.2f}%")
    return text


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config, shots = check_flags()
    from keras_vit import fileio

    from ..run import metrics
    from ..run.loop import RESUMABLE_EXIT_CODE

    signal.signal(signal.SIGTERM, _raise_stopped)
    summary = {
        "command": shlex.join(["python", "-m", "train.studies.mpp", *sys.argv[1:]]),
        "pretrain_command": "python -m train.main --config=configs/mpp.py "
                            f"--workdir={FLAGS.pretrain_workdir}",
        "pretrain": _pretrain_summary(config), "seeds": list(range(FLAGS.seeds)),
        "few_shot_train": FLAGS.few_shot_train}
    json_path = os.path.join(FLAGS.out, "mpp.json")
    try:
        summary["few_shot"], summary["test_examples"] = few_shot(config, shots)
        summary["finetune"] = {}
        for labels in FLAGS.labels:
            summary["finetune"][labels] = {arm: [finetune(labels, arm, seed)
                                                 for seed in range(FLAGS.seeds)]
                                           for arm in ("scratch", "mpp")}
            metrics.write_json(json_path, summary)
    except (KeyboardInterrupt, Stopped):
        cli.fail("Stopped. Rerun the same command to resume: finished runs are kept, the "
                 "stopped one resumes from its checkpoint.", exit_code=RESUMABLE_EXIT_CODE)
    metrics.write_json(json_path, summary)
    report_path = os.path.join(FLAGS.out, "mpp.md")
    fileio.write_atomically(report_path, report(summary))
    print(f"Wrote {report_path} and {json_path}.", flush=True)


def _raise_stopped(signum, frame):
    raise Stopped()


def run():
    """The `keras-vit-mpp-study` command (an installed package's console script)."""
    cli.run(main)


if __name__ == "__main__":
    run()

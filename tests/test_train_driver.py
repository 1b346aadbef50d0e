"""The training driver end to end (train/main.py, train/trainer.py, train/metrics.py).

The multi-replica, XLA and interruption runs are `python -m train.main` subprocesses (the CPU can
only be split into logical devices before TensorFlow starts). They all run on the tiny fake
Fashion-MNIST and start together in one module fixture, to keep the wall time low on 2 cores:

- `one`: one device, 100 steps (the reference the others are compared with);
- `two`: the same on 2 mirrored replicas (--cpu_devices=2), same seed and global batch;
- `kill`: as `one`, SIGKILLed after its first checkpoint, then rerun to the end;
- `term`: as `one` but checkpointing every 50 steps, SIGTERMed before the first, then rerun;
- `xla`: one device with config.jit_compile; `xla2`: jit_compile on 2 replicas (must refuse).
"""

import glob
import json
import math
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from train import trainer
from train.metrics import MetricsWriter
from train.schedules import WarmupDecay
from train_fixtures import (REPO, assert_same_values, checkpoint_values, fake_fashion_mnist,
                            latest_checkpoint_step, main_command, read_metrics, tiny_config,
                            write_image_folder)

# SGD (not Adam, which hides gradient-scale errors) on a run that learns the fake task.
RUN = dict(optimizer="sgd", learning_rate=0.1, classifier="gap", crop_min_area=1.0,
           total_steps=100, steps_per_loop=5, warmup_steps=10, eval_every_steps=50,
           checkpoint_every_steps=10)
# SIGKILL once a checkpoint, SIGTERM once a loss record, at this step or later exists.
INTERRUPT_AFTER = 10
TERM_CHECKPOINT_EVERY = 50  # `term` saves less often, so its stopping checkpoint is SIGTERM's
TIMEOUT = 400


class Run:
    def __init__(self, data, root, name, *extra, env=None, **overrides):
        self.name, self.workdir = name, os.path.join(root, name)
        self.command = main_command(data, self.workdir, *extra, **dict(RUN, **overrides))
        self.env = dict(data.env(), **(env or {}))
        self.logs, self.returncodes = [], []

    def start(self):
        os.makedirs(os.path.dirname(self.workdir), exist_ok=True)
        self.log_path = f"{self.workdir}.{len(self.logs)}.log"
        self.handle = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, cwd=REPO, env=self.env,
                                        stdout=self.handle, stderr=subprocess.STDOUT)

    def wait(self, deadline):
        try:
            returncode = self.process.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            returncode = self.process.wait()
        self.handle.close()
        with open(self.log_path) as handle:
            self.logs.append(handle.read())
        self.returncodes.append(returncode)
        return returncode

    def check(self, attempt=-1):
        assert self.returncodes[attempt] == 0, (
            f"run {self.name!r} exited with {self.returncodes[attempt]}:\n"
            f"{self.logs[attempt][-6000:]}")

    @property
    def metrics(self):
        return read_metrics(self.workdir)


def _loss_steps(workdir):
    try:
        return [record["step"] for record in read_metrics(workdir) if "loss" in record]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


@pytest.fixture(scope="module")
def fake_fmnist(tmp_path_factory):
    return fake_fashion_mnist(tmp_path_factory)


@pytest.fixture(scope="module")
def runs(fake_fmnist, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("driver_runs"))
    runs = {
        "one": Run(fake_fmnist, root, "one", "--strategy=one_device", export=True),
        "two": Run(fake_fmnist, root, "two", "--strategy=mirrored", "--cpu_devices=2"),
        "kill": Run(fake_fmnist, root, "kill", "--strategy=one_device"),
        # Checkpoints only every 50 steps: the one it stops at is the one SIGTERM saves.
        "term": Run(fake_fmnist, root, "term", "--strategy=one_device",
                    checkpoint_every_steps=TERM_CHECKPOINT_EVERY),
        "xla": Run(fake_fmnist, root, "xla", "--strategy=one_device", env={
            "TF_CPP_MIN_LOG_LEVEL": "0"}, jit_compile=True, total_steps=4, warmup_steps=2,
            eval_every_steps=4),
        "xla2": Run(fake_fmnist, root, "xla2", "--strategy=mirrored", "--cpu_devices=2",
                    jit_compile=True, total_steps=4, warmup_steps=2),
    }
    try:
        _run_all(runs)
        yield runs
    finally:
        for run in runs.values():  # only if a test run was interrupted
            if getattr(run, "process", None) is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()


def _run_all(runs):
    deadline = time.time() + TIMEOUT
    for run in runs.values():
        run.start()
    # Interrupt `kill` after its first checkpoint, once a loss record newer than the checkpoint
    # exists (the rerun must drop it), and `term` mid-run, before its first checkpoint. Each is
    # rerun as soon as it has stopped.
    interrupts = {"kill": signal.SIGKILL, "term": signal.SIGTERM}
    reruns = set(interrupts)
    for name in interrupts:
        runs[name].at_signal = runs[name].after_stop = None
    while reruns and time.time() < deadline:
        for name in list(interrupts):
            run = runs[name]
            if run.process.poll() is not None:
                del interrupts[name]  # finished or failed on its own: the tests say which
                continue
            step = latest_checkpoint_step(run.workdir)
            logged = max(_loss_steps(run.workdir), default=0)
            if name == "kill" and (step is None or step < INTERRUPT_AFTER or logged <= step):
                continue
            if name == "term" and logged < INTERRUPT_AFTER:
                continue
            run.process.send_signal(interrupts.pop(name))
            run.at_signal = {"checkpoint": step, "loss_steps": _loss_steps(run.workdir)}
        for name in list(reruns):
            run = runs[name]
            if name not in interrupts and run.process.poll() is not None:
                run.wait(deadline)
                run.after_stop = {"checkpoint": latest_checkpoint_step(run.workdir),
                                  "loss_steps": _loss_steps(run.workdir)}
                run.start()  # the same command again: resumes
                reruns.remove(name)
        time.sleep(0.005)
    for run in runs.values():
        run.wait(deadline)


def _by_kind(records):
    train = {record["step"]: record for record in records if "loss" in record}
    evaluation = {record["step"]: record for record in records if "eval_accuracy" in record}
    return train, evaluation


def _assert_no_duplicate_steps(records):
    train = [record["step"] for record in records if "loss" in record]
    evaluation = [record["step"] for record in records if "eval_accuracy" in record]
    assert len(train) == len(set(train)), f"duplicate training steps: {train}"
    assert len(evaluation) == len(set(evaluation)), f"duplicate eval steps: {evaluation}"
    assert train == sorted(train) and evaluation == sorted(evaluation)


# 1. Two replicas compute what one does.

def test_two_replicas_match_one_replica(runs):
    one, two = runs["one"], runs["two"]
    one.check()
    two.check()
    assert "with 2 replicas" in two.logs[0] and "with 1 replicas" in one.logs[0]
    train_one, eval_one = _by_kind(one.metrics)
    train_two, eval_two = _by_kind(two.metrics)
    assert sorted(train_one) == sorted(train_two) == list(range(5, 101, 5))
    for step in train_one:
        assert abs(train_one[step]["loss"] - train_two[step]["loss"]) <= 1e-5, step
        assert train_one[step]["learning_rate"] == pytest.approx(
            train_two[step]["learning_rate"], abs=1e-9)
        assert train_one[step]["grad_norm"] == pytest.approx(train_two[step]["grad_norm"],
                                                             abs=1e-4)
    assert sorted(eval_one) == sorted(eval_two) == [50, 100]
    for step in eval_one:
        assert eval_one[step]["eval_loss"] == pytest.approx(eval_two[step]["eval_loss"],
                                                            abs=1e-5)
        assert eval_one[step]["eval_accuracy"] == eval_two[step]["eval_accuracy"]
    assert latest_checkpoint_step(one.workdir) == latest_checkpoint_step(two.workdir) == 100
    assert_same_values(checkpoint_values(one.workdir), checkpoint_values(two.workdir), 1e-5)


# 2. XLA.

def test_jit_compile_on_one_device(runs):
    run = runs["xla"]
    run.check()
    assert "Compiled cluster using XLA" in run.logs[0]
    train, evaluation = _by_kind(run.metrics)
    assert sorted(train) == [4]  # one loop of 4 steps
    assert all(math.isfinite(record["loss"]) for record in train.values())
    assert sorted(evaluation) == [4]


def test_jit_compile_on_two_replicas_is_a_clear_error(runs):
    run = runs["xla2"]
    assert run.returncodes[0] != 0
    assert "ValueError" in run.logs[0]
    assert "config.jit_compile works on one device" in run.logs[0]


# 3. Interruptions: SIGKILL and SIGTERM, then the same command again.

def test_kill_9_then_rerun_matches_an_uninterrupted_run(runs):
    run, reference = runs["kill"], runs["one"]
    reference.check()
    assert run.at_signal is not None, f"the run was never killed:\n{run.logs[0][-4000:]}"
    assert run.returncodes[0] == -signal.SIGKILL
    stopped = run.after_stop["checkpoint"]
    assert INTERRUPT_AFTER <= stopped < RUN["total_steps"]
    run.check(1)
    assert "Resumed from" in run.logs[1] and f"at step {stopped}" in run.logs[1]
    records = run.metrics
    _assert_no_duplicate_steps(records)
    train, evaluation = _by_kind(records)
    train_ref, eval_ref = _by_kind(reference.metrics)
    assert sorted(train) == sorted(train_ref) and sorted(evaluation) == sorted(eval_ref)
    for step in train_ref:
        for name in ("loss", "learning_rate", "grad_norm"):
            assert train[step][name] == pytest.approx(train_ref[step][name], abs=1e-6), (
                step, name)
    for step in eval_ref:
        assert evaluation[step]["eval_loss"] == pytest.approx(eval_ref[step]["eval_loss"],
                                                              abs=1e-6)
    assert_same_values(checkpoint_values(run.workdir), checkpoint_values(reference.workdir),
                       1e-6)


def test_sigterm_saves_stops_and_resumes(runs):
    run, reference = runs["term"], runs["one"]
    reference.check()
    assert run.at_signal is not None, f"the run was never signalled:\n{run.logs[0][-4000:]}"
    run.check(0)  # a clean exit
    assert run.at_signal["checkpoint"] is None  # signalled before any periodic checkpoint
    stopped = run.after_stop["checkpoint"]  # so this one is SIGTERM's
    assert stopped is not None, f"no checkpoint after SIGTERM:\n{run.logs[0][-4000:]}"
    signalled_at = run.at_signal["loss_steps"][-1]
    assert signalled_at <= stopped <= signalled_at + 2 * RUN["steps_per_loop"]
    assert stopped % TERM_CHECKPOINT_EVERY  # not a periodic checkpoint
    assert f"Stopped at step {stopped}" in run.logs[0]
    assert run.after_stop["loss_steps"][-1] == stopped  # saved where it stopped
    assert "Final (step" not in run.logs[0]
    run.check(1)
    assert f"at step {stopped}" in run.logs[1] and "Final (step 100)" in run.logs[1]
    records = run.metrics
    _assert_no_duplicate_steps(records)
    train, _ = _by_kind(records)
    assert stopped in train and RUN["total_steps"] in train
    assert_same_values(checkpoint_values(run.workdir), checkpoint_values(reference.workdir),
                       1e-6)


# 9. What a run leaves in its workdir.

def test_metrics_jsonl_and_tensorboard(runs):
    run = runs["one"]
    run.check()
    with open(os.path.join(run.workdir, "metrics.jsonl")) as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert all(isinstance(record["step"], int) for record in records)
    _assert_no_duplicate_steps(records)
    train, evaluation = _by_kind(records)
    assert sorted(train) == list(range(5, 101, 5)) and sorted(evaluation) == [50, 100]
    for record in train.values():
        assert {"loss", "learning_rate", "images_per_second", "grad_norm"} <= set(record)
        assert all(math.isfinite(value) for value in record.values())
        assert record["images_per_second"] > 0 and record["grad_norm"] > 0
    for record in evaluation.values():
        assert {"eval_accuracy", "eval_loss"} <= set(record)
        assert 0.0 <= record["eval_accuracy"] <= 1.0
    # The logged rate is the schedule's (cosine, base 0.1, warm-up 10, 100 steps) at that step.
    schedule = WarmupDecay(0.1, 10, 100, "cosine")
    for step, record in train.items():
        assert record["learning_rate"] == pytest.approx(float(schedule(step)), abs=1e-6)
    # The fake task is learnable: the run learns it.
    assert train[100]["loss"] < train[5]["loss"] - 0.5
    assert evaluation[100]["eval_accuracy"] >= 0.5
    events = glob.glob(os.path.join(run.workdir, "tensorboard", "events.out.tfevents.*"))
    assert events
    tags = {}
    for path in events:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    for tag in ("loss", "learning_rate", "images_per_second", "grad_norm"):
        assert sorted(tags.get(tag, [])) == list(range(5, 101, 5)), tag
    for tag in ("eval_accuracy", "eval_loss"):
        assert sorted(tags.get(tag, [])) == [50, 100], tag


def test_checkpoints_kept_and_export(runs):
    import keras

    import keras_vit  # noqa: F401  (registers the layers for loading)
    run = runs["one"]
    run.check()
    kept = sorted(int(path.rsplit("-", 1)[1].split(".")[0]) for path in
                  glob.glob(os.path.join(run.workdir, "checkpoints", "ckpt-*.index")))
    assert kept == [80, 90, 100]  # keep_checkpoints = 3
    model = keras.saving.load_model(os.path.join(run.workdir, "export", "model.keras"))
    saved = checkpoint_values(run.workdir)
    for index, variable in enumerate(model.trainable_variables):
        np.testing.assert_array_equal(
            variable.numpy(),
            saved[f"optimizer/_trainable_variables/{index}/.ATTRIBUTES/VARIABLE_VALUE"])
    assert model.output_shape == (None, 10)


# In-process pieces.

def test_metrics_writer_drops_records_after_the_resumed_step(tmp_path):
    writer = MetricsWriter(str(tmp_path))
    for step in (5, 10, 15):
        writer.write(step, loss=1.0 / step)
    writer.write(10, eval_accuracy=0.5)
    resumed = MetricsWriter(str(tmp_path), resume_step=10)
    resumed.write(15, loss=0.25)
    records = read_metrics(str(tmp_path))
    assert [record["step"] for record in records] == [5, 10, 10, 15]
    assert records[-1]["loss"] == 0.25
    assert not os.path.exists(os.path.join(tmp_path, "metrics.jsonl.tmp"))


def test_check_config_rejects_bad_values(fake_fmnist):
    with pytest.raises(ValueError, match="optimizer"):
        trainer.check_config(tiny_config(fake_fmnist, optimizer="lamb"), 1)
    with pytest.raises(ValueError, match="accum_steps"):
        trainer.check_config(tiny_config(fake_fmnist, accum_steps=3), 2)  # 16 per replica
    with pytest.raises(ValueError, match="total_steps"):
        trainer.check_config(tiny_config(fake_fmnist, total_steps=0), 1)
    trainer.check_config(tiny_config(fake_fmnist, accum_steps=4), 2)


def test_adamw_decays_only_the_matrices(fake_fmnist):
    """Zero gradients: AdamW then only applies the decay, to kernels, not to biases, norms,
    the position embedding or the class token."""
    config = tiny_config(fake_fmnist, optimizer="adamw", weight_decay=0.5, learning_rate=0.1,
                         warmup_steps=0)
    model = trainer.build_model(config, 10)
    optimizer = trainer.build_optimizer(config)
    before = [variable.numpy() for variable in model.trainable_variables]
    optimizer.apply([tf.zeros_like(v) for v in model.trainable_variables],
                    model.trainable_variables)
    for variable, value in zip(model.trainable_variables, before):
        if not np.any(value):
            continue
        decayed = not np.allclose(variable.numpy(), value)
        assert decayed == variable.path.endswith("kernel"), (
            f"{variable.path}: {'decayed' if decayed else 'not decayed'}")


def test_folder_dataset_trains(tmp_path, fake_fmnist):
    """A few steps on a folder of RGB and grayscale PNGs, with quickstart's hybrid (R+Ti) stem."""
    root = str(tmp_path / "images")
    counts = write_image_folder(root, np.random.default_rng(1))
    config = tiny_config(fake_fmnist, dataset=f"folder:{root}", model="R+Ti/16", patch_size=1,
                         image_size=16, batch_size=4,
                         eval_batch_size=4, total_steps=2, steps_per_loop=1, eval_every_steps=2,
                         checkpoint_every_steps=2)
    workdir = str(tmp_path / "run")
    metrics = trainer.train_and_evaluate(config, workdir,
                                         tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert metrics is not None and 0.0 <= metrics["eval_accuracy"] <= 1.0
    records = read_metrics(workdir)
    assert [record["step"] for record in records if "loss" in record] == [1, 2]
    assert latest_checkpoint_step(workdir) == 2
    assert counts["test"] == 9

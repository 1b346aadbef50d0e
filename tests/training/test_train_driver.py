"""The training driver end to end (train/main.py, train/engines/tf_engine.py, train/run/metrics.py).

The multi-replica, multi-worker, XLA and interruption runs are `python -m train.main`
subprocesses (the CPU can only be split into logical devices before TensorFlow starts). They all
run on the tiny fake Fashion-MNIST and start together in one fixture, once per test session
(`runs`), to keep the wall time low on 2 cores:

- `one`: one device, 100 steps (the reference the others are compared with);
- `two`: the same on 2 mirrored replicas (--cpu_devices=2), same seed and global batch;
- `workers`: the same on 2 worker processes (TF_CONFIG on free localhost ports), exporting;
- `kill`: as `one`, SIGKILLed after its first checkpoint, then rerun to the end;
- `term`: as `one` but checkpointing every 50 steps, SIGTERMed before the first, then rerun;
- `workers_kill`, `workers_term`: as `kill` and `term` on 2 workers; SIGKILL goes to worker 0
  (the chief), SIGTERM to worker 1, then both are started again;
- `xla`: one device with config.jit_compile (the whole step compiled); `xla2`: on 2 replicas
  (each replica's forward and backward pass compiled); both with RandAugment, Mixup, CutMix,
  random erasing and layer-wise learning-rate decay (RECIPE);
- `mpp`, `mpp_two`, `mpp_kill`, `mpp_xla`: as `one`, `two`, `kill` and `xla`, pre-training by
  masked patch prediction (config.objective), `mpp` exporting its encoder.
"""

import glob
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from train.run import objectives
from train.engines import tf_engine
from train.run.metrics import MetricsWriter
from train.engines.preemption import RESUMABLE_EXIT_CODE
from train.run.schedules import WarmupDecay
from train.engines.tf_strategy import local_cluster
from train_fixtures import (FLAT_LAYOUT_CONFIG_JSON, REPO, assert_same_values, built_once,
                            checkpoint_values, error_lines, latest_checkpoint_step, main_command,
                            merged, read_metrics, tiny_config, wait_then_exit,
                            write_image_folder)

# SGD (not Adam, which hides gradient-scale errors) on a run that learns the fake task.
RUN = dict(optimizer="sgd", learning_rate=0.1, model=dict(classifier="gap"), crop_min_area=1.0,
           total_steps=100, steps_per_loop=5, warmup_steps=10, eval_every_steps=50,
           checkpoint_every_steps=10)
# SIGKILL once a checkpoint, SIGTERM once a loss record, at this step or later exists.
INTERRUPT_AFTER = 10
TERM_CHECKPOINT_EVERY = 50  # `term` saves less often, so its stopping checkpoint is SIGTERM's
TIMEOUT = 600
# Masked patch prediction: the 28x28 images in 7x7 patches, 16 of them, about 8 corrupted.
MPP = dict(objective="masked_patch_prediction")


class Run:
    """One `python -m train.main` process, started again for each attempt."""

    def __init__(self, data, root, name, *extra, env=None, label=None, **overrides):
        self.name, self.workdir = name, os.path.join(root, name)
        self.log_prefix = os.path.join(root, label or name)
        self.command = main_command(data, self.workdir, *extra, **merged(RUN, overrides))
        self.env = dict(data.env(), **(env or {}))
        self.logs, self.returncodes, self.pids = [], [], []

    def start(self):
        os.makedirs(os.path.dirname(self.workdir), exist_ok=True)
        self.log_path = f"{self.log_prefix}.{len(self.logs)}.log"
        self.handle = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, cwd=REPO, env=self.env,
                                        stdout=self.handle, stderr=subprocess.STDOUT)
        self.pids.append(self.process.pid)

    def running(self):
        return self.process.poll() is None

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


class Cluster:
    """The worker processes of one multi-worker run: the same command, `--strategy=multi_worker`
    and a TF_CONFIG naming every worker on free localhost ports (new ports for each start)."""

    def __init__(self, data, root, name, workers=2, **overrides):
        self.name = name
        self.workers = [Run(data, root, name, "--strategy=multi_worker", label=f"{name}.w{index}",
                            **overrides) for index in range(workers)]
        self.workdir = self.workers[0].workdir

    def start(self):
        for worker, tf_config in zip(self.workers, local_cluster(len(self.workers))):
            worker.env["TF_CONFIG"] = tf_config
            worker.start()

    def running(self):
        return any(worker.running() for worker in self.workers)

    def wait(self, deadline):
        return [worker.wait(deadline) for worker in self.workers]

    def check(self, attempt=-1):
        for worker in self.workers:
            worker.check(attempt)

    @property
    def metrics(self):
        return read_metrics(self.workdir)


def _loss_steps(workdir):
    try:
        return [record["step"] for record in read_metrics(workdir) if "loss" in record]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


# The AugReg/DeiT options (train/data/augmentation.py, train/run/optimizers.py), on the XLA runs:
# their shapes must stay static, and 2 replicas must train what one does.
RECIPE = {"augment": "medium2", "cutmix_alpha": 1.0, "random_erasing": 0.25,
          "label_smoothing": 0.1, "layer_decay": 0.75}


def _define_runs(data, root):
    return {
        "one": Run(data, root, "one", "--strategy=one_device", export=True),
        "two": Run(data, root, "two", "--strategy=mirrored", "--cpu_devices=2"),
        "workers": Cluster(data, root, "workers", export=True),
        "kill": Run(data, root, "kill", "--strategy=one_device"),
        # Checkpoints only every 50 steps: the one it stops at is the one SIGTERM saves.
        "term": Run(data, root, "term", "--strategy=one_device",
                    checkpoint_every_steps=TERM_CHECKPOINT_EVERY),
        "workers_kill": Cluster(data, root, "workers_kill"),
        "workers_term": Cluster(data, root, "workers_term",
                                checkpoint_every_steps=TERM_CHECKPOINT_EVERY),
        "xla": Run(data, root, "xla", "--strategy=one_device", env={
            "TF_CPP_MIN_LOG_LEVEL": "0"}, jit_compile=True, total_steps=4, warmup_steps=2,
            eval_every_steps=4, **RECIPE),
        "xla2": Run(data, root, "xla2", "--strategy=mirrored", "--cpu_devices=2",
                    jit_compile=True, total_steps=4, warmup_steps=2, eval_every_steps=4,
                    **RECIPE),
        "mpp": Run(data, root, "mpp", "--strategy=one_device", export=True, **MPP),
        "mpp_two": Run(data, root, "mpp_two", "--strategy=mirrored", "--cpu_devices=2", **MPP),
        "mpp_kill": Run(data, root, "mpp_kill", "--strategy=one_device", **MPP),
        "mpp_xla": Run(data, root, "mpp_xla", "--strategy=one_device", env={
            "TF_CPP_MIN_LOG_LEVEL": "0"}, jit_compile=True, total_steps=4, warmup_steps=2,
            eval_every_steps=4, **MPP),
    }


# What a finished run's tests read besides its folder: of the run (or cluster), and of each of
# its processes.
RUN_RECORD, PROCESS_RECORD = ("at_signal", "after_stop"), ("logs", "returncodes", "pids")


@pytest.fixture(scope="module")
def runs(fake_fmnist, tmp_path_factory):
    """The runs of `_define_runs`, run once per session (`built_once`): by the first
    pytest-xdist worker that asks, which records what the tests read besides the run folders
    (RUN_RECORD, PROCESS_RECORD); every worker, that one too, loads the record into Run and
    Cluster objects of its own (which start nothing until asked)."""
    def run_all(root):
        runs = _define_runs(fake_fmnist, str(root))
        try:
            _run_all(runs)
        finally:
            for run in runs.values():  # only if the runs were interrupted
                for process in _processes(run):
                    if process.poll() is None:
                        process.kill()
                        process.wait()
        record = {name: {"run": {key: getattr(run, key, None) for key in RUN_RECORD},
                         "processes": [{key: getattr(member, key) for key in PROCESS_RECORD}
                                       for member in _members(run)]}
                  for name, run in runs.items()}
        (root / "record.json").write_text(json.dumps(record))

    root = built_once(tmp_path_factory, "driver_runs", run_all)
    runs = _define_runs(fake_fmnist, str(root))
    for name, record in json.loads((root / "record.json").read_text()).items():
        vars(runs[name]).update(record["run"])
        for member, recorded in zip(_members(runs[name]), record["processes"]):
            vars(member).update(recorded)
    return runs


def _members(run):
    return run.workers if isinstance(run, Cluster) else [run]


def _processes(run):
    return [member.process for member in _members(run) if getattr(member, "process", None)]


# What to interrupt, with what, and which worker of a cluster: SIGTERM goes to worker 1 (not
# the chief), SIGKILL to worker 0 (the chief, which hosts TensorFlow's coordination service:
# the harder loss for the survivor).
INTERRUPTS = {"kill": signal.SIGKILL, "term": signal.SIGTERM,
              "workers_kill": signal.SIGKILL, "workers_term": signal.SIGTERM,
              "mpp_kill": signal.SIGKILL}
INTERRUPTED_WORKER = {"workers_kill": 0, "workers_term": 1}


def _ready_to_interrupt(name, workdir):
    """SIGKILL once a checkpoint and a newer loss record (the rerun must drop it) exist; SIGTERM
    mid-run, before the first checkpoint."""
    step = latest_checkpoint_step(workdir)
    logged = max(_loss_steps(workdir), default=0)
    if INTERRUPTS[name] == signal.SIGKILL:
        return step is not None and step >= INTERRUPT_AFTER and logged > step
    return logged >= INTERRUPT_AFTER


def _run_all(runs):
    deadline = time.time() + TIMEOUT
    for run in runs.values():
        run.start()
    # Each interrupted run is rerun, the same command, as soon as all its processes stopped.
    pending = dict(INTERRUPTS)
    reruns = set(INTERRUPTS)
    for name in INTERRUPTS:
        runs[name].at_signal = runs[name].after_stop = None
    while reruns and time.time() < deadline:
        for name in list(pending):
            run = runs[name]
            target = _processes(run)[INTERRUPTED_WORKER.get(name, 0)]
            if target.poll() is not None:
                del pending[name]  # finished or failed on its own: the tests say which
                continue
            if not _ready_to_interrupt(name, run.workdir):
                continue
            run.at_signal = {"checkpoint": latest_checkpoint_step(run.workdir),
                             "loss_steps": _loss_steps(run.workdir)}
            target.send_signal(pending.pop(name))
        for run in runs.values():
            _stop_orphans(run)
        for name in list(reruns):
            run = runs[name]
            if name in pending or run.running():
                continue
            run.wait(deadline)
            run.after_stop = {"checkpoint": latest_checkpoint_step(run.workdir),
                              "loss_steps": _loss_steps(run.workdir)}
            run.start()  # the same command again: resumes
            reruns.remove(name)
        time.sleep(0.005)
    while time.time() < deadline and any(run.running() for run in runs.values()):
        for run in runs.values():
            _stop_orphans(run)
        time.sleep(0.05)
    for run in runs.values():
        run.wait(deadline)


def _stop_orphans(run, grace=30):
    """Kills the workers of a cluster still running `grace` seconds after one of them exited:
    they fail on their own once they miss a peer mid-run, but wait for it forever at start-up
    (a worker that could not start, for one)."""
    if not isinstance(run, Cluster):
        return
    exited = [process.poll() is not None for process in _processes(run)]
    if all(exited) or not any(exited):
        run.orphaned_at = None
        return
    run.orphaned_at = getattr(run, "orphaned_at", None) or time.time()
    if time.time() - run.orphaned_at > grace:
        for process in _processes(run):
            process.kill()


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

@pytest.mark.processes
@pytest.mark.parametrize("one,two", [("one", "two"), ("mpp", "mpp_two")])
def test_two_replicas_match_one_replica(runs, one, two):
    one, two = runs[one], runs[two]
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
        # Relative: the stem's max-pool routes a gradient to one of two near-equal maxima,
        # which summation order can flip (the losses still agree to 1e-5).
        assert train_one[step]["grad_norm"] == pytest.approx(train_two[step]["grad_norm"],
                                                             rel=2e-4)
    assert sorted(eval_one) == sorted(eval_two) == [50, 100]
    for step in eval_one:
        assert eval_one[step]["eval_loss"] == pytest.approx(eval_two[step]["eval_loss"],
                                                            abs=1e-5)
        assert eval_one[step]["eval_accuracy"] == eval_two[step]["eval_accuracy"]
    assert latest_checkpoint_step(one.workdir) == latest_checkpoint_step(two.workdir) == 100
    # Most weights agree to about 1e-6; a gradient the stem's max-pool routed to the other of
    # two near-equal maxima (see grad_norm above) leaves a few weights up to about 2e-5 apart.
    assert_same_values(checkpoint_values(one.workdir), checkpoint_values(two.workdir), 5e-5)


# 2. Several worker processes compute what one process does.

def _assert_same_training(run, reference, atol=1e-5):
    train, evaluation = _by_kind(run.metrics)
    train_ref, eval_ref = _by_kind(reference.metrics)
    assert sorted(train) == sorted(train_ref) and sorted(evaluation) == sorted(eval_ref)
    for step in train_ref:
        for name in ("loss", "learning_rate", "grad_norm"):
            assert train[step][name] == pytest.approx(train_ref[step][name], abs=atol), (
                step, name)
    for step in eval_ref:
        assert evaluation[step]["eval_loss"] == pytest.approx(eval_ref[step]["eval_loss"],
                                                              abs=atol)
        assert evaluation[step]["eval_accuracy"] == eval_ref[step]["eval_accuracy"]
    assert_same_values(checkpoint_values(run.workdir), checkpoint_values(reference.workdir), atol)


def _only_the_chief_wrote(cluster):
    """No leftovers, and TensorBoard files only from worker 0's processes (their names hold the
    writer's process id)."""
    workdir = cluster.workdir
    assert [name for name in os.listdir(workdir) if "tmp" in name or "temp" in name] == []
    assert glob.glob(os.path.join(workdir, "**", "*temp*"), recursive=True) == []
    events = glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
    # events.out.tfevents.<time>.<host>.<pid>.<counter>
    writers = {int(os.path.basename(path).split(".")[-2]) for path in events}
    assert writers and writers <= set(cluster.workers[0].pids), (writers, cluster.workers[0].pids)


@pytest.mark.processes
def test_two_workers_match_two_replicas(runs):
    """TF_CONFIG with 2 workers on localhost: the same losses and weights as --cpu_devices=2."""
    workers, two = runs["workers"], runs["two"]
    workers.check()
    two.check()
    for worker in workers.workers:
        assert "Strategy multi_worker with 2 replicas" in worker.logs[0]
    records = workers.metrics
    _assert_no_duplicate_steps(records)
    _assert_same_training(workers, two)
    assert latest_checkpoint_step(workers.workdir) == 100
    _only_the_chief_wrote(workers)
    # One export, by the chief: one SavedModel version, the Keras model and the TFLite files.
    export = os.path.join(workers.workdir, "export")
    assert sorted(os.listdir(os.path.join(export, "saved_model"))) == ["1"]
    assert {"model.keras", "class_names.txt", "model_float32.tflite",
            "model_int8.tflite"} <= set(os.listdir(export))
    assert "Saved the trained model" in workers.workers[0].logs[0]
    assert "Saved the trained model" not in workers.workers[1].logs[0]


@pytest.mark.processes
def test_worker_killed_then_all_restarted_matches_uninterrupted(runs):
    run, reference = runs["workers_kill"], runs["workers"]
    reference.check()
    assert run.at_signal is not None, f"never killed:\n{run.workers[0].logs[0][-4000:]}"
    killed, survivor = run.workers[0], run.workers[1]
    assert killed.returncodes[0] == -signal.SIGKILL
    # It lost its peer (on its own: _stop_orphans would have killed it after 30 s), says which
    # and what to do, in one paragraph.
    assert survivor.returncodes[0] == 1, survivor.logs[0][-4000:]
    errors = error_lines(survivor.logs[0])
    assert len(errors) == 1
    assert errors[0].startswith("Error: lost contact with worker 0 (localhost:")
    assert "Start all workers again with the same command" in errors[0]
    assert "Traceback" not in survivor.logs[0]
    stopped = run.after_stop["checkpoint"]
    assert INTERRUPT_AFTER <= stopped < RUN["total_steps"]
    run.check(1)
    for worker in run.workers:
        assert f"at step {stopped}" in worker.logs[1] and "Resumed from" in worker.logs[1]
    _assert_no_duplicate_steps(run.metrics)
    _assert_same_training(run, reference)
    _only_the_chief_wrote(run)


@pytest.mark.processes
def test_sigterm_to_one_worker_stops_all_at_one_checkpoint(runs):
    run, reference = runs["workers_term"], runs["workers"]
    reference.check()
    assert run.at_signal is not None, f"never signalled:\n{run.workers[1].logs[0][-4000:]}"
    assert run.at_signal["checkpoint"] is None  # signalled before any periodic checkpoint
    stopped = run.after_stop["checkpoint"]
    assert stopped is not None and stopped % TERM_CHECKPOINT_EVERY, stopped  # SIGTERM's
    for worker in run.workers:  # both stopped, at the same step, resumable
        assert worker.returncodes[0] == RESUMABLE_EXIT_CODE, worker.logs[0][-4000:]
        assert f"Stopped at step {stopped};" in worker.logs[0]
    assert run.after_stop["loss_steps"][-1] == stopped
    run.check(1)
    for worker in run.workers:
        assert f"at step {stopped}" in worker.logs[1]
    _assert_no_duplicate_steps(run.metrics)
    _assert_same_training(run, reference)
    _only_the_chief_wrote(run)


@pytest.mark.processes
def test_a_worker_whose_peer_never_starts_gives_up_naming_it(fake_fmnist, tmp_path):
    """Worker 0 of a two-worker TF_CONFIG whose worker 1 never starts: after --startup_timeout
    it exits 1 naming worker 1's address (progress lines meanwhile); SIGTERM ends the wait at
    once (TensorFlow alone waits forever and ignores SIGTERM). Ctrl-C: test_startup.py."""
    processes, peers = {}, {}
    for name, timeout in (("timeout", 5), ("sigterm", 300)):
        tf_config = local_cluster(2)[0]
        peers[name] = json.loads(tf_config)["cluster"]["worker"][1]
        processes[name] = subprocess.Popen(
            main_command(fake_fmnist, str(tmp_path / name), "--strategy=multi_worker",
                         f"--startup_timeout={timeout}"),
            cwd=REPO, env=dict(fake_fmnist.env(), TF_CONFIG=tf_config),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    results = wait_then_exit(processes, {"sigterm": signal.SIGTERM})
    for name, (log, took) in results.items():
        errors = error_lines(log)
        assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
        assert not (tmp_path / name).exists()  # nothing written
        if name == "timeout":
            # 5 s, then the exit (measured 1.2 s quiet; CI's loaded machine took 8.6 s before
            # the exit skipped the interpreter's teardown).
            assert processes[name].returncode == 1 and took < 5 + 10, (took, log[-3000:])
            assert errors[0].startswith(f"Error: worker 1 at {peers[name]} did not answer "
                                        "within --startup_timeout=5 s. Check that every worker")
        else:
            assert processes[name].returncode == 75 and took < 5, (took, log[-3000:])
            assert errors[0].startswith(f"Error: Stopped by SIGTERM while waiting for worker 1 "
                                        f"at {peers[name]}, before training began")


# 2. XLA.

@pytest.mark.processes
@pytest.mark.parametrize("name", ["xla", "mpp_xla"])
def test_jit_compile_on_one_device(runs, name):
    run = runs[name]
    run.check()
    assert "Compiled cluster using XLA" in run.logs[0]
    train, evaluation = _by_kind(run.metrics)
    assert sorted(train) == [4]  # one loop of 4 steps
    assert all(math.isfinite(record["loss"]) for record in train.values())
    assert sorted(evaluation) == [4]


@pytest.mark.processes
def test_jit_compile_on_two_replicas_matches_one_device(runs):
    run, reference = runs["xla2"], runs["xla"]
    run.check()
    assert "with 2 replicas" in run.logs[0]
    train, evaluation = _by_kind(run.metrics)
    train_ref, eval_ref = _by_kind(reference.metrics)
    assert sorted(train) == sorted(train_ref) == [4]
    assert train[4]["loss"] == pytest.approx(train_ref[4]["loss"], abs=1e-5)
    assert evaluation[4]["eval_loss"] == pytest.approx(eval_ref[4]["eval_loss"], abs=1e-5)


# 3. Interruptions: SIGKILL and SIGTERM, then the same command again.

@pytest.mark.processes
@pytest.mark.parametrize("name,reference", [("kill", "one"), ("mpp_kill", "mpp")])
def test_kill_9_then_rerun_matches_an_uninterrupted_run(runs, name, reference):
    run, reference = runs[name], runs[reference]
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


@pytest.mark.processes
def test_sigterm_saves_stops_and_resumes(runs):
    run, reference = runs["term"], runs["one"]
    reference.check()
    assert run.at_signal is not None, f"the run was never signalled:\n{run.logs[0][-4000:]}"
    assert run.returncodes[0] == RESUMABLE_EXIT_CODE, run.logs[0][-4000:]  # "stopped, resumable"
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

@pytest.mark.processes
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


@pytest.mark.processes
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

@pytest.mark.processes
def test_masked_patch_prediction_learns_and_exports_its_encoder(runs, fake_fmnist):
    import keras

    from keras_vit.weights import checkpoint

    run = runs["mpp"]
    run.check()
    train, evaluation = _by_kind(run.metrics)
    assert train[100]["loss"] < 0.5 * train[5]["loss"]  # from log(512) = 6.24
    assert evaluation[100]["eval_accuracy"] > evaluation[50]["eval_accuracy"] - 0.05
    assert "masked patch prediction, target mean_color" in run.logs[0]
    export = os.path.join(run.workdir, "export")
    # encoder.npz.json: the encoder's keras_vit.ViTConfig, beside the weights (save_npz).
    assert sorted(os.listdir(export)) == ["encoder.npz", "encoder.npz.json", "model.keras"]
    encoder = keras.saving.load_model(os.path.join(export, "model.keras"), safe_mode=True)
    assert encoder.output.shape == (None, 16)  # the pooled representation, no head
    assert checkpoint.read_spec(os.path.join(export, "encoder.npz")) == encoder.spec
    arrays = checkpoint.read_npz(os.path.join(export, "encoder.npz"))
    assert not any(key.startswith(("head", "mpp")) for key in arrays)
    expected = checkpoint.model_arrays(encoder)
    assert sorted(arrays) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(arrays[key], expected[key])
    # Fine-tuning starts from either file, with a new zero head.
    for path in (os.path.join(export, "encoder.npz"), os.path.join(export, "model.keras")):
        config = tiny_config(fake_fmnist, model=dict(classifier="gap"), pretrained=path)
        with tempfile.TemporaryDirectory() as workdir:
            model = tf_engine.TFEngine(config, workdir,
                                      tf.distribute.OneDeviceStrategy("/cpu:0")).model
        np.testing.assert_array_equal(model.get_layer("encoderblock_0").get_weights()[0],
                                      encoder.get_layer("encoderblock_0").get_weights()[0])
        assert not model.get_layer("head").get_weights()[0].any()
    # No serving export of an encoder: one line saying what to do instead.
    result = subprocess.run([sys.executable, "-m", "train.export", f"--workdir={run.workdir}"],
                            cwd=REPO, env=fake_fmnist.env(), capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "fine-tune it first" in result.stderr


@pytest.mark.parametrize("clip,accum_steps", [(1e-3, 1), (1e-3, 2), (1e3, 1)])
def test_step_is_gradient_descent_on_the_clipped_mean_gradient(fake_fmnist, clip, accum_steps):
    """One SGD step of the driver's loop moves every weight by -lr times the gradient of the
    batch's mean loss, clipped to a global norm of `clip` (active at 1e-3, not at 1e3), with or
    without accumulation over micro-batches; the logged norm is the unclipped one."""
    config = tiny_config(fake_fmnist, optimizer="sgd", momentum=0.0, grad_clip_norm=clip,
                         accum_steps=accum_steps, warmup_steps=0)
    rng = np.random.default_rng(3)
    batch = {"image": tf.constant(rng.uniform(-1, 1, (32, 28, 28, 3)), tf.float32),
             "label": tf.constant(rng.integers(0, 10, 32), tf.int32)}
    with tempfile.TemporaryDirectory() as workdir:
        run = tf_engine.TFEngine(config, workdir, tf.distribute.OneDeviceStrategy("/cpu:0"))
        model, variables = run.model, run.model.trainable_variables
        learning_rate = float(run.optimizer.learning_rate)
        before = [v.numpy() for v in variables]
        with tf.GradientTape() as tape:
            logits = model(batch["image"], training=True)
            loss = tf.reduce_mean(objectives.cross_entropy(batch["label"], logits, 10, 0.0))
        gradients = tape.gradient(loss, variables)
        norm = float(tf.linalg.global_norm(gradients))
        clipped, _ = tf.clip_by_global_norm(gradients, clip)
        step_loss, step_norm = run.train_loop(iter(tf.data.Dataset.from_tensors(batch).repeat()),
                                              tf.constant(1))
        assert float(step_loss) == pytest.approx(float(loss), rel=1e-5)
        assert float(step_norm) == pytest.approx(norm, rel=1e-4)
        assert (norm > clip) == (clip < 1)  # the clipping is active in the 1e-3 cases only
        for start, gradient, variable in zip(before, clipped, variables):
            np.testing.assert_allclose(variable.numpy(), start - learning_rate * gradient.numpy(),
                                       rtol=1e-4, atol=1e-7)


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
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "tensorboard"]  # no temporaries


def test_check_config_rejects_bad_values(fake_fmnist):
    with pytest.raises(ValueError, match="optimizer"):
        tf_engine.check_config(tiny_config(fake_fmnist, optimizer="lamb"), 1)
    with pytest.raises(ValueError, match="accum_steps"):
        tf_engine.check_config(tiny_config(fake_fmnist, accum_steps=3), 2)  # 16 per replica
    with pytest.raises(ValueError, match="total_steps"):
        tf_engine.check_config(tiny_config(fake_fmnist, total_steps=0), 1)
    tf_engine.check_config(tiny_config(fake_fmnist, accum_steps=4), 2)


def test_adamw_decays_only_the_matrices(fake_fmnist):
    """Zero gradients: AdamW then only applies the decay, to kernels, not to biases, norms,
    the position embedding or the class token."""
    config = tiny_config(fake_fmnist, optimizer="adamw", weight_decay=0.5, learning_rate=0.1,
                         warmup_steps=0)
    model = objectives.build_model(config, 10)
    optimizer = tf_engine.build_optimizer(config, model)
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
    config = tiny_config(fake_fmnist, dataset=f"folder:{root}",
                         model=dict(variant="R+Ti/16", patch_size=1), image_size=16, batch_size=4,
                         eval_batch_size=4, total_steps=2, steps_per_loop=1, eval_every_steps=2,
                         checkpoint_every_steps=2)
    workdir = str(tmp_path / "run")
    metrics = tf_engine.train_and_evaluate(config, workdir,
                                           tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert metrics is not None and 0.0 <= metrics["eval_accuracy"] <= 1.0
    records = read_metrics(workdir)
    assert [record["step"] for record in records if "loss" in record] == [1, 2]
    assert latest_checkpoint_step(workdir) == 2
    assert counts["test"] == 9


# Faults one process survives without losing work (in-process, tiny runs).

def _tiny_run(fake_fmnist, workdir, **overrides):
    config = tiny_config(fake_fmnist, **dict(dict(total_steps=4, steps_per_loop=1,
                                                  warmup_steps=1, eval_every_steps=2,
                                                  checkpoint_every_steps=2), **overrides))
    return tf_engine.train_and_evaluate(config, str(workdir),
                                        tf.distribute.OneDeviceStrategy("/cpu:0"))


def test_progress_lines_give_an_eta_from_the_loops_after_the_compiling_one(tmp_path,
                                                                          fake_fmnist, caplog):
    """The first loop compiles the step, so its pace would overstate the time left (8 min 56 s
    for a 4-minute main job): it promises an ETA, and the later lines count from its end."""
    with caplog.at_level("INFO", logger="absl"):
        _tiny_run(fake_fmnist, tmp_path / "run")
    lines = [line for line in caplog.text.splitlines() if " img/s  ETA " in line]
    assert [re.search(r"step (\d+)/4", line).group(1) for line in lines] == ["1", "2", "3", "4"]
    assert lines[0].endswith("ETA after the next loop (this one compiled the step)")
    for line in lines[1:]:
        assert re.search(r"ETA \d+:\d\d:\d\d$", line), line
    assert lines[-1].endswith("ETA 0:00:00")


def test_unreadable_newest_checkpoint_is_moved_aside_and_the_run_resumes(tmp_path, fake_fmnist,
                                                                         caplog):
    workdir = tmp_path / "run"
    _tiny_run(fake_fmnist, workdir)
    checkpoints_dir = workdir / "checkpoints"
    data = checkpoints_dir / "ckpt-4.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])  # a save cut short
    with caplog.at_level("INFO", logger="absl"):
        _tiny_run(fake_fmnist, workdir, total_steps=6)
    assert "ckpt-4.data-00000-of-00001" in caplog.text and "unreadable" in caplog.text
    assert (checkpoints_dir / "corrupt" / "ckpt-4.data-00000-of-00001").exists()
    assert "Resumed from" in caplog.text and "at step 2." in caplog.text
    assert latest_checkpoint_step(str(workdir)) == 6


def test_missing_index_file_resumes_from_the_newest_checkpoint(tmp_path, fake_fmnist, caplog):
    workdir = tmp_path / "run"
    _tiny_run(fake_fmnist, workdir)
    os.remove(workdir / "checkpoints" / "checkpoint")
    with caplog.at_level("INFO", logger="absl"):
        _tiny_run(fake_fmnist, workdir, total_steps=6, keep_checkpoints=2)
    assert "at step 4." in caplog.text  # not a silent restart from 0
    kept = sorted(os.path.basename(path) for path in
                  glob.glob(str(workdir / "checkpoints" / "ckpt-*.index")))
    assert kept == ["ckpt-4.index", "ckpt-6.index"]  # rotation goes on with the old ones
    assert latest_checkpoint_step(str(workdir)) == 6


def test_resumed_at_an_evaluation_step_writes_its_record(tmp_path, fake_fmnist):
    """A kill after the checkpoint of an evaluation step, before its record: the rerun writes
    it (once)."""
    workdir = tmp_path / "run"
    _tiny_run(fake_fmnist, workdir, total_steps=2)
    _tiny_run(fake_fmnist, workdir, total_steps=4)  # the run to interrupt, at step 4
    records = [record for record in read_metrics(str(workdir))
               if not ("eval_accuracy" in record and record["step"] == 4)]
    with open(workdir / "metrics.jsonl", "w") as handle:  # as if killed before the record
        handle.write("".join(json.dumps(record) + "\n" for record in records))
    _tiny_run(fake_fmnist, workdir, total_steps=6)
    records = read_metrics(str(workdir))
    _assert_no_duplicate_steps(records)
    _, evaluation = _by_kind(records)
    assert sorted(evaluation) == [2, 4, 6]


def test_rerun_with_another_config_is_refused_before_writing(tmp_path, fake_fmnist):
    workdir = tmp_path / "run"
    _tiny_run(fake_fmnist, workdir)
    before = {path: os.path.getmtime(path) for path in glob.glob(f"{workdir}/**",
                                                                    recursive=True)}
    saved = (workdir / "config.json").read_text()
    with pytest.raises(ValueError) as error:
        _tiny_run(fake_fmnist, workdir, total_steps=6, model=dict(hidden_size=32),
                  batch_size=16)
    message = str(error.value)
    assert "batch_size: 32 -> 16" in message and "model.hidden_size: 16 -> 32" in message
    changes = message.split("(", 1)[1].split(")", 1)[0]
    assert "new --workdir" in message and "total_steps" not in changes
    assert (workdir / "config.json").read_text() == saved
    assert {path: os.path.getmtime(path) for path in glob.glob(f"{workdir}/**",
                                                                  recursive=True)} == before
    # Logistics may change: a longer run with other checkpoint and eval intervals resumes.
    _tiny_run(fake_fmnist, workdir, total_steps=6, checkpoint_every_steps=3,
              eval_every_steps=3)
    assert json.loads((workdir / "config.json").read_text())["total_steps"] == 6


def test_a_run_written_before_config_model_resumes(tmp_path, fake_fmnist, caplog):
    """A workdir whose config.json has the flat model fields (`"model": "Ti/16"`,
    `"patch_size": 7`, ...), as runs wrote it before config.model held them, resumes with the
    same run's config of today, which then rewrites config.json in today's layout."""
    workdir = tmp_path / "run"
    _tiny_run(fake_fmnist, workdir)
    today = json.loads((workdir / "config.json").read_text())
    loop = ("data_dir", "total_steps", "steps_per_loop", "warmup_steps", "eval_every_steps",
            "checkpoint_every_steps", "export")
    old = dict(FLAT_LAYOUT_CONFIG_JSON, **{name: today[name] for name in loop})
    (workdir / "config.json").write_text(json.dumps(old))
    with caplog.at_level("INFO", logger="absl"):
        _tiny_run(fake_fmnist, workdir, total_steps=6)
    assert "Resumed from" in caplog.text and "at step 4." in caplog.text
    assert latest_checkpoint_step(str(workdir)) == 6
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"] == dict(today["model"]) and "patch_size" not in saved


def test_a_run_and_its_export_leave_no_temporary_files(tmp_path, fake_fmnist, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    workdir = tmp_path / "run"
    os.makedirs(workdir / "checkpoints" / "ckpt-2_temp" / "part-00000-of-00001")  # killed saves
    os.makedirs(workdir / "export" / "saved_model" / ".partial-1-999")  # and exports
    (workdir / "export" / "model_int8.tflite.partial-999").write_bytes(b"half")
    _tiny_run(fake_fmnist, workdir, export=True)
    everything = [os.path.relpath(path, tmp_path) for path in
                  glob.glob(f"{workdir}/**", recursive=True)]
    assert [path for path in everything if "tmp" in os.path.basename(path) or "temp" in path
            or "partial" in path] == []
    # Ours (not TensorFlow's autograph files): the export copy, the TFLite and handler dirs.
    assert [name for name in os.listdir(tmp_path / "tmp") if name.startswith("keras_vit")] == []
    assert os.listdir(workdir / "export" / "saved_model") == ["1"]


def test_cli_error_is_one_paragraph_without_traceback(tmp_path, fake_fmnist):
    workdir = tmp_path / "run"
    (workdir).mkdir()
    (workdir / "config.json").write_text(json.dumps({"model": "B/16"}))
    result = subprocess.run(main_command(fake_fmnist, str(workdir), "--strategy=one_device"),
                            cwd=REPO, env=fake_fmnist.env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "model.variant: 'B/16' -> 'Ti/16'" in errors[0]
    assert sorted(os.listdir(workdir)) == ["config.json"]


@pytest.mark.parametrize("use_tf_handler", [True, False], ids=["tf_handler", "tpu_fallback"])
def test_preemption_watcher_saves_once_then_stops(use_tf_handler):
    """SIGTERM: TensorFlow's handler saves at the loop after the next (its agreed step), the
    fallback used under TPUStrategy at the next one; both save once, raise Stopped, and give
    back the previous SIGTERM handler."""
    from train.engines.preemption import PreemptionWatcher, Stopped

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    saves = []
    watcher = PreemptionWatcher(tf.distribute.OneDeviceStrategy("/cpu:0"),
                                lambda: saves.append(len(saves)), use_tf_handler)
    try:
        for _ in range(3):
            watcher.check()  # no signal yet: nothing happens
        assert saves == []
        os.kill(os.getpid(), signal.SIGTERM)
        loops = 0
        with pytest.raises(Stopped):
            for loops in range(1, 4):
                watcher.check()
        assert saves == [0] and loops == (2 if use_tf_handler else 1)
    finally:
        watcher.close()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        signal.signal(signal.SIGTERM, previous)


def test_tensorflows_preemption_handler_is_quiet_about_a_lost_worker(monkeypatch):
    """What TensorFlow's preemption handler raises when a worker is lost (its watcher thread's
    UnavailableError, its __del__ unable to join that thread) is dropped: train.main reports
    the loss in one paragraph. The same errors from elsewhere still reach the hooks."""
    from train.engines import preemption

    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_value))
    preemption._quiet_lost_peer_in_handler_threads()
    handler_code = {}  # a function whose frames name TensorFlow's failure_handling module
    exec(compile("def fail(error):\n    raise error\n", "/site-packages/tensorflow/python/"
                 "distribute/failure_handling/failure_handling.py", "exec"), handler_code)

    def raised(error, where=handler_code["fail"]):
        try:
            where(error)
        except Exception as caught:
            return caught

    def hook_args(error):
        return types.SimpleNamespace(exc_type=type(error), exc_value=error, thread=None,
                                     exc_traceback=error.__traceback__, err_msg=None,
                                     object=None)

    threading.excepthook(hook_args(raised(tf.errors.UnavailableError(None, None, "lost"))))
    sys.unraisablehook(hook_args(raised(RuntimeError("cannot join current thread"))))
    assert seen == []

    def elsewhere(error):
        raise error

    ours = raised(tf.errors.UnavailableError(None, None, "ours"), where=elsewhere)
    threading.excepthook(hook_args(ours))
    sys.unraisablehook(hook_args(raised(ValueError("another"))))
    assert [str(error) for error in seen] == ["ours", "another"]


def test_remat_trains_as_without_it(fake_fmnist):
    """`--config.remat=blocks` on the TensorFlow engine: 20 steps log the same losses as
    without it (tf.recompute_grad recomputes each block in the backward pass)."""
    losses = {}
    for remat in ("none", "blocks"):
        config = tiny_config(fake_fmnist, model=dict(num_layers=2), remat=remat,
                             total_steps=20, warmup_steps=2)
        with tempfile.TemporaryDirectory() as workdir:
            run = tf_engine.TFEngine(config, workdir, tf.distribute.OneDeviceStrategy("/cpu:0"))
            losses[remat] = [run.train_steps(1)[0] for _ in range(20)]
    np.testing.assert_allclose(losses["blocks"], losses["none"], atol=1e-4)
    assert losses["none"][-1] < losses["none"][0]

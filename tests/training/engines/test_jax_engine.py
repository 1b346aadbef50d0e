"""The JAX engine (train/engines/jax_engine.py) end to end: `python -m train.main` with
KERAS_BACKEND=jax in subprocesses on virtual CPU devices, the same configs and fake data as the
TensorFlow engine's tests. Data parallel over 4 devices and a 2x2 mesh (model_parallel=2) train
the weights of 1 device; a checkpoint saved on 4 devices resumes on 1 and on 2x2; the engines
refuse each other's checkpoints; SIGTERM saves and exits 75; the export is the TensorFlow
engine's."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

from train_fixtures import (REPO, built_once, error_lines, flags, main_command,  # noqa: E402
                            read_metrics, wait_for_progress, wait_then_exit)
from train.engines import jax_cpu_settings  # noqa: E402


def jax_command(data, workdir, *extra, **overrides):
    return [sys.executable, "-m", "train.main", *flags(data, workdir, **overrides), *extra]


def run_jax(data, workdir, *extra, check=True, **overrides):
    result = subprocess.run(jax_command(data, workdir, *extra, **overrides), cwd=REPO,
                            env=dict(data.env(), KERAS_BACKEND="jax"), capture_output=True,
                            text=True, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def saved_state(workdir, step=None):
    """The JAX engine's checkpoint at `step` (default the newest) as numpy arrays, whatever
    mesh wrote it."""
    import jax
    import orbax.checkpoint as ocp

    folder = os.path.join(workdir, "checkpoints")
    steps = sorted(int(name) for name in os.listdir(folder) if name.isdigit())
    assert steps, f"no checkpoint in {folder}"
    path = os.path.join(folder, str(steps[-1] if step is None else step), "default")
    checkpointer = ocp.StandardCheckpointer()
    one_device = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                            sharding=one_device),
                          checkpointer.metadata(path).item_metadata)
    state = checkpointer.restore(path, target)
    return {kind: [np.asarray(value) for value in values] for kind, values in state.items()}


def assert_close(first, second, rtol=1e-4, atol=1e-5):
    """Every weight (and optimizer slot) within `rtol` of the other run's, relative to its
    norm; `atol` for the attention's key biases, whose gradient is zero up to rounding (a
    constant added to every key's logit leaves the softmax as it is), so that Adam turns
    rounding noise into values of order 1e-7 that no two device layouts share."""
    assert len(first["trainable"]) == len(second["trainable"]) > 5
    for kind in ("trainable", "optimizer"):
        for index, (a, b) in enumerate(zip(first[kind], second[kind])):
            error = float(np.linalg.norm(a - b))
            assert error <= rtol * float(np.linalg.norm(b)) + atol, (kind, index, error)


# 12 steps of the tiny model, a checkpoint every 4 (kept: 4, 8, 12).
SHORT = dict(total_steps=12, steps_per_loop=4, checkpoint_every_steps=4, eval_every_steps=12,
             eval_batch_size=40)  # 4 or 8 devices share every batch


# A run that SIGTERM stops long before its end (the tiny model runs ~900 steps a second).
LONG = dict(total_steps=100_000, steps_per_loop=2, checkpoint_every_steps=100_000,
            eval_every_steps=100_000, eval_batch_size=20)


@pytest.fixture(scope="module")
def short_runs(fake_fmnist, tmp_path_factory):
    """SHORT on one device, on 4 (data parallel), on a 2x2 mesh, and fully sharded over 8 (and
    over 4 batch x 2 model devices), each run once per session (`built_once`): {name: workdir}.
    The tests only read them."""
    layouts = {"one": ((), {}), "four": (("--cpu_devices=4",), {}),
               "two_by_two": (("--cpu_devices=4",), {"model_parallel": 2}),
               "fsdp": (("--cpu_devices=8",), {"fsdp": True}),
               "fsdp_4x2": (("--cpu_devices=8",), {"fsdp": True, "model_parallel": 2})}

    def run_all(root):
        for name, (extra, overrides) in layouts.items():
            run_jax(fake_fmnist, str(root / name), *extra, **SHORT, **overrides)

    root = built_once(tmp_path_factory, "jax_short_runs", run_all)
    return {name: str(root / name) for name in layouts}


@pytest.mark.processes
def test_a_jax_run_trains_evaluates_checkpoints_and_resumes(fake_fmnist, tmp_path):
    workdir = str(tmp_path / "run")
    first = run_jax(fake_fmnist, workdir)
    records = read_metrics(workdir)
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 6]
    final = [r for r in records if "eval_accuracy" in r]
    assert [r["step"] for r in final] == [6] and 0.0 <= final[0]["eval_accuracy"] <= 1.0
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0], losses  # it learned (6 steps of the fake data: no accuracy)
    assert "loop.py" in first.stderr and "step 6/6" in first.stderr
    # train.main restarted with the CPU settings where the machine takes them (a plain ViT:
    # no compile options).
    restarted = jax_cpu_settings.environment(fake_fmnist.env(), "jax")
    for setting in jax_cpu_settings.active(restarted, {}):
        assert setting in first.stderr, first.stderr[-3000:]
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4", "6"]
    again = run_jax(fake_fmnist, workdir, total_steps=8, eval_every_steps=8)
    assert "Resumed from" in again.stderr and "at step 6" in again.stderr
    steps = [r["step"] for r in read_metrics(workdir) if "loss" in r]
    assert steps == [2, 4, 6, 8]  # no step twice


@pytest.mark.processes
def test_data_and_model_parallel_train_the_weights_of_one_device(short_runs):
    reference = saved_state(short_runs["one"])
    for name in ("four", "two_by_two", "fsdp", "fsdp_4x2"):
        assert_close(saved_state(short_runs[name]), reference)
    losses = [record["loss"] for record in read_metrics(short_runs["one"]) if "loss" in record]
    assert losses[-1] < losses[0]  # the runs learned: equal weights are not a no-op


@pytest.mark.processes
@pytest.mark.parametrize("written_by", ["four", "fsdp"])
def test_a_checkpoint_of_several_devices_resumes_on_1_and_on_2x2(fake_fmnist, short_runs,
                                                                 tmp_path, written_by):
    for name, extra, overrides in (("on_one", (), {}),
                                   ("on_2x2", ("--cpu_devices=4",), {"model_parallel": 2})):
        workdir = str(tmp_path / name)
        shutil.copytree(short_runs[written_by], workdir)
        shutil.rmtree(os.path.join(workdir, "checkpoints", "12"))  # as if killed after step 8
        result = run_jax(fake_fmnist, workdir, *extra, **SHORT, **overrides)
        assert "at step 8" in result.stderr, result.stderr[-2000:]
        assert_close(saved_state(workdir), saved_state(short_runs["one"]))


@pytest.mark.processes
def test_the_engines_refuse_each_others_checkpoints(fake_fmnist, tmp_path):
    workdir = str(tmp_path / "run")
    run_jax(fake_fmnist, workdir)
    result = subprocess.run(main_command(fake_fmnist, workdir, total_steps=8), cwd=REPO,
                            env=dict(fake_fmnist.env(), KERAS_BACKEND="tensorflow"),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert "holds checkpoints of the jax engine" in result.stderr
    assert "KERAS_BACKEND=jax" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.processes
def test_sigterm_saves_a_checkpoint_and_exits_75(fake_fmnist, tmp_path):
    workdir = str(tmp_path / "run")
    process = subprocess.Popen(
        jax_command(fake_fmnist, workdir, **LONG), cwd=REPO,
        env=dict(fake_fmnist.env(), KERAS_BACKEND="jax"), stderr=subprocess.PIPE, text=True)
    wait_for_progress(process, f"step 2/{LONG['total_steps']}")
    process.send_signal(signal.SIGTERM)
    rest = process.stderr.read()
    assert process.wait(timeout=300) == 75, rest[-3000:]
    steps = [int(name) for name in os.listdir(os.path.join(workdir, "checkpoints"))]
    assert len(steps) == 1 and 2 <= steps[0] < LONG["total_steps"]
    assert "rerun the same command to resume" in rest


@pytest.mark.processes
def test_export_from_jax_is_the_tensorflow_engines(fake_fmnist, tmp_path):
    pytest.importorskip("tensorflow")
    workdir = str(tmp_path / "run")
    run_jax(fake_fmnist, workdir, export=True)
    export = os.path.join(workdir, "export")
    assert {"model.keras", "class_names.txt", "saved_model", "model_float32.tflite",
            "model_int8.tflite"} <= set(os.listdir(export))
    import tensorflow as tf

    served = tf.saved_model.load(os.path.join(export, "saved_model", "1"))
    assert set(served.signatures) == {"serving_default", "serving_images"}
    images = np.random.default_rng(0).uniform(0, 255, (2, 28, 28, 3)).astype("float32")
    logits = served.signatures["serving_images"](images=tf.constant(images))["logits"]
    assert logits.shape == (2, 10)


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def start_processes(data, workdir, count=2, **overrides):
    """`count` processes of one run (2 CPU devices each), through JAX's coordinator on
    localhost."""
    address = f"localhost:{free_port()}"
    return [subprocess.Popen(
        jax_command(data, workdir, "--cpu_devices=2", f"--coordinator_address={address}",
                    f"--num_processes={count}", f"--process_id={index}", **overrides),
        cwd=REPO, env=dict(data.env(), KERAS_BACKEND="jax"), stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL, text=True) for index in range(count)]


@pytest.mark.processes
def test_two_processes_train_the_weights_of_one_process_of_four_devices(fake_fmnist,
                                                                         short_runs, tmp_path):
    workdir = str(tmp_path / "two")
    processes = start_processes(fake_fmnist, workdir, **SHORT, export=True)
    outputs = [process.communicate(timeout=600)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs[1][-3000:]
    assert_close(saved_state(workdir), saved_state(short_runs["four"]))
    steps = [record["step"] for record in read_metrics(workdir) if "loss" in record]
    assert steps == [4, 8, 12]  # one writer: no record twice
    assert os.listdir(os.path.join(workdir, "export", "saved_model")) == ["1"]  # one export


@pytest.mark.processes
def test_sigterm_to_one_process_stops_both_at_one_checkpoint(fake_fmnist, tmp_path):
    workdir = str(tmp_path / "run")
    first, second = start_processes(fake_fmnist, workdir, **LONG)
    wait_for_progress(second, f"step 2/{LONG['total_steps']}")
    second.send_signal(signal.SIGTERM)
    logs = [process.communicate(timeout=300)[1] for process in (first, second)]
    assert [first.returncode, second.returncode] == [75, 75], logs[0][-3000:]
    steps = [int(name) for name in os.listdir(os.path.join(workdir, "checkpoints"))]
    assert len(steps) == 1 and 2 <= steps[0] < LONG["total_steps"]  # one common checkpoint
    assert all("rerun the same command to resume" in log for log in logs)


@pytest.mark.processes
def test_a_killed_process_ends_the_other_and_the_rerun_resumes(fake_fmnist, tmp_path):
    workdir = str(tmp_path / "run")
    run = {**LONG, "checkpoint_every_steps": 4}
    first, second = start_processes(fake_fmnist, workdir, **run)
    wait_for_progress(first, "Saved checkpoint")
    second.kill()
    started = time.time()
    log = first.communicate(timeout=300)[1]
    assert first.returncode != 0 and time.time() - started < 60, log[-3000:]
    # One paragraph (JAX's heartbeats find the loss; train/engines/jax_stderr.py turns its C++ abort
    # into the message), not JAX's FATAL line, C++ stack and Python thread dump.
    errors = error_lines(log)
    assert len(errors) == 1 and errors[0].startswith("Error: lost contact with "), log[-3000:]
    assert "Start all 2 processes again with the same command" in errors[0]
    for dump in ("Terminating process", "Check failure stack trace", "Fatal Python error",
                 "Traceback"):
        assert dump not in log, log[-3000:]
    saved = max(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints")))
    again = start_processes(fake_fmnist, workdir, **{**run, "total_steps": saved + 4})
    logs = [process.communicate(timeout=600)[1] for process in again]
    assert [process.returncode for process in again] == [0, 0], logs[0][-3000:]
    assert f"at step {saved}" in logs[0]


@pytest.mark.processes
def test_a_process_whose_peers_never_start_gives_up_naming_them(fake_fmnist, tmp_path):
    """Process 0 alone and process 1 alone of a two-process run: after --startup_timeout each
    exits 1 naming the peer it waited for (JAX alone ends its wait with a C++ abort); SIGTERM
    ends the wait at once, exit 75."""
    addresses, processes = {}, {}
    for name, process_id, timeout in (("coordinator", 0, 5), ("other", 1, 5),
                                      ("sigterm", 0, 300)):
        addresses[name] = f"localhost:{free_port()}"
        processes[name] = subprocess.Popen(
            jax_command(fake_fmnist, str(tmp_path / name),
                        f"--coordinator_address={addresses[name]}", "--num_processes=2",
                        f"--process_id={process_id}", f"--startup_timeout={timeout}"),
            cwd=REPO, env=dict(fake_fmnist.env(), KERAS_BACKEND="jax"), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
    results = wait_then_exit(processes, {"sigterm": signal.SIGTERM})
    expected = {
        "coordinator": (1, f"Error: process 1 did not connect to this process's coordinator at "
                           f"{addresses['coordinator']} within --startup_timeout=5 s. Check "
                           "that all 2 processes were started with"),
        "other": (1, f"Error: process 0 (the coordinator) at {addresses['other']} did not "
                     "answer within --startup_timeout=5 s."),
        "sigterm": (75, "Error: Stopped by SIGTERM while waiting for process 1, before "
                        "training began"),
    }
    for name, (log, took) in results.items():
        code, start = expected[name]
        errors = error_lines(log)
        assert processes[name].returncode == code, log[-3000:]
        assert len(errors) == 1 and errors[0].startswith(start), log[-3000:]
        assert took < 5 + (0 if name == "sigterm" else 5), (took, log[-3000:])
        assert "Traceback" not in log and "Check failure" not in log
        assert not (tmp_path / name).exists()  # nothing written


# Each engine on its default input: with RandAugment, Mixup, CutMix and random erasing the JAX
# engine reads tf.data (Grain has none of them); with crops and flips alone, Grain.
RECIPES = {
    "augreg": (dict(augment="medium2", cutmix_alpha=1.0, random_erasing=0.25,
                    label_smoothing=0.1, layer_decay=0.75), "tf.data"),
    "crop_flip": (dict(crop_min_area=0.3, flip=True), "grain"),
    # DeiT's distillation from a teacher (written by the test) inside the step: Grain's input.
    "distill_soft": (dict(distill="soft", distill_weight=0.5, distill_temperature=3.0,
                          crop_min_area=0.3, flip=True), "grain"),
    # DeiT's distillation token: the encoder has one, so the run takes it; hard distillation.
    "distill_token": (dict(distill="hard", distill_weight=0.5, crop_min_area=0.3, flip=True),
                      "grain"),
}


@pytest.mark.processes
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_both_engines_fine_tune_an_npz_to_the_same_losses(fake_fmnist, tmp_path, recipe):
    """From the same original-layout encoder (its head zero-initialised, as the paper
    fine-tunes) and the same seed, TensorFlow and JAX log the same loss at every step, each
    engine on its default input pipeline: one stream per seed (train.data.stream), and both
    engines crop, mix the labels and scale the rates alike."""
    import keras

    import keras_vit
    from model_fixtures import randomise
    from train_fixtures import TINY

    keras.utils.set_random_seed(3)
    encoder = keras_vit.vit(TINY["model"]["variant"], include_top=False, image_size=28,
                            distillation_token=recipe == "distill_token",
                            **{k: v for k, v in TINY["model"].items() if k != "variant"})
    weights = str(tmp_path / "encoder.npz")
    keras_vit.weights.checkpoint.save_npz(encoder, weights)
    options, jax_pipeline = RECIPES[recipe]
    if "distill" in options:  # a teacher of the dataset's classes, of another width
        teacher = keras_vit.vit("Ti/16", image_size=28, num_classes=10, **{
            **{k: v for k, v in TINY["model"].items() if k != "variant"}, "hidden_size": 32})
        randomise(teacher, seed=5, scale=0.2)
        options = dict(options, distill_teacher=str(tmp_path / "teacher.npz"))
        keras_vit.weights.checkpoint.save_npz(teacher, options["distill_teacher"])
    run = dict(total_steps=30, steps_per_loop=1, eval_every_steps=30,
               checkpoint_every_steps=30, warmup_steps=5, pretrained=weights, **options)
    losses = {}
    for backend in ("tensorflow", "jax"):
        workdir = str(tmp_path / backend)
        result = subprocess.run(jax_command(fake_fmnist, workdir, **run), cwd=REPO,
                                env=dict(fake_fmnist.env(), KERAS_BACKEND=backend),
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0 and "Started from " in result.stderr, \
            result.stderr[-3000:]
        losses[backend] = [r["loss"] for r in read_metrics(workdir) if "loss" in r]
        with open(os.path.join(workdir, "config.json")) as handle:
            pipeline = json.load(handle)["input_pipeline"]
        assert pipeline == ("tf.data" if backend == "tensorflow" else jax_pipeline)
    assert len(losses["jax"]) == len(losses["tensorflow"]) == 30
    assert max(abs(a - b) for a, b in zip(losses["jax"], losses["tensorflow"])) < 1e-3
    assert losses["jax"][-1] < losses["jax"][0]


@pytest.mark.parametrize("address, shown", [
    ("localhost:99999", "'localhost:99999': port 99999 is outside 1 to 65535"),
    ("localhost", "'localhost' is not a host:port address"),
])
def test_a_coordinator_address_that_cannot_be_is_refused_before_anything_starts(
        fake_fmnist, tmp_path, address, shown):
    result = run_jax(fake_fmnist, str(tmp_path / "run"), f"--coordinator_address={address}",
                     "--num_processes=2", "--process_id=0", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert shown in result.stderr and "HOST:PORT" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_model_axis_that_does_not_divide_the_widths_is_one_line(fake_fmnist, tmp_path):
    result = run_jax(fake_fmnist, str(tmp_path / "run"), "--cpu_devices=3", check=False,
                     model_parallel=3, batch_size=48, eval_batch_size=30)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "config.model_parallel=3 must divide the model's hidden_size (16)" in result.stderr


@pytest.mark.processes
@pytest.mark.parametrize("variant, fields", [("Ti/16", {}), ("Ti/16", {"distillation_token": True}),
                                             ("Axial-Ti/16", {})])
def test_remat_trains_as_without_it(fake_fmnist, tmp_path, variant, fields):
    """`--config.remat=blocks` on the JAX engine: 20 steps log the same losses as without
    it. A ViT's blocks, alike, run as one checkpointed loop, their dropout drawing the masks
    it draws unrolled (with DeiT's two heads after the loop too); Axial-ViT's row and column
    blocks, with stochastic depth, are checkpointed one by one, drawing masks of their own."""
    losses = {}
    axial = "Axial" in variant
    for remat in ("none", "blocks"):
        workdir = str(tmp_path / remat)
        model = dict(variant=variant, num_layers=2, dropout=0.1,
                     drop_path_rate=0.1 if axial else 0.0,
                     **({"classifier": "gap"} if axial else {}), **fields)
        run_jax(fake_fmnist, workdir, model=model, remat=remat, total_steps=20, steps_per_loop=1,
                eval_every_steps=20, checkpoint_every_steps=20)
        losses[remat] = [r["loss"] for r in read_metrics(workdir) if "loss" in r]
    assert len(losses["none"]) == 20
    if axial:  # masks of their own: the same course, not the same numbers
        np.testing.assert_allclose(losses["blocks"], losses["none"], rtol=0.2)
    else:
        np.testing.assert_allclose(losses["blocks"], losses["none"], atol=1e-4)


# What one process holds of the JAX engine's state, per device: a script run with 8 CPU devices.
STATE_BYTES = """
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
sys.path.insert(0, "tests")
from train_fixtures import FakeData, tiny_config
from train.engines import jax_engine
config = tiny_config(FakeData(sys.argv[1]), fsdp=sys.argv[2] == "fsdp", eval_batch_size=40,
                     model=dict(num_layers=2, hidden_size=32, mlp_dim=64))
engine = jax_engine.JaxEngine(config, sys.argv[3])
device = jax.devices()[0]
total = on_device = 0
whole = []
for kind in ("trainable", "optimizer"):
    variables = (engine.model.trainable_variables if kind == "trainable"
                 else engine.optimizer.variables)
    for variable, array in zip(variables, engine.state[kind]):
        total += array.nbytes
        held = sum(shard.data.nbytes for shard in array.addressable_shards
                   if shard.device == device)
        on_device += held
        if held == array.nbytes:
            whole.append((variable.path, array.shape, array.nbytes))
print(json.dumps({"total": total, "device_0": on_device, "whole": whole}))
engine.close()
"""


@pytest.mark.processes
def test_fsdp_holds_an_eighth_of_the_state_on_each_device(fake_fmnist, tmp_path):
    results = {}
    for layout in ("replicated", "fsdp"):
        result = subprocess.run(
            [sys.executable, "-c", STATE_BYTES, fake_fmnist.root, layout,
             str(tmp_path / layout)], cwd=REPO, env=dict(fake_fmnist.env(), KERAS_BACKEND="jax"),
            capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        results[layout] = json.loads(result.stdout.strip().splitlines()[-1])
    replicated, fsdp = results["replicated"], results["fsdp"]
    assert replicated["device_0"] == replicated["total"] == fsdp["total"]
    # Whole on every device: only arrays no dimension of which the 8 devices divide: here the
    # head's bias (10 classes) and its Adam moments, and the optimizer's scalars.
    whole = {path: (shape, size) for path, shape, size in fsdp["whole"]}
    assert all(all(side % 8 for side in shape) for shape, _ in whole.values()), whole
    assert {path for path, (shape, _) in whole.items() if shape} == {
        "head/bias", "adam_w/head_bias_momentum", "adam_w/head_bias_velocity"}, whole
    whole_bytes = sum(size for _, size in whole.values())
    assert fsdp["device_0"] <= (fsdp["total"] - whole_bytes) / 8 + whole_bytes, fsdp


@pytest.mark.processes
def test_fsdp_steps_equal_the_replicated_steps(fake_fmnist, tmp_path):
    """One step's updated weights within 1e-6 of the replicated run's on the same 8 devices;
    20 steps log the same losses within 1e-4."""
    runs = {}
    for layout, overrides in (("replicated", {}), ("fsdp", {"fsdp": True})):
        runs[layout] = str(tmp_path / layout)
        run_jax(fake_fmnist, runs[layout], "--cpu_devices=8", total_steps=20, steps_per_loop=1,
                checkpoint_every_steps=1, keep_checkpoints=20, eval_every_steps=20,
                eval_batch_size=40, **overrides)
    assert_close(saved_state(runs["fsdp"], step=1), saved_state(runs["replicated"], step=1),
                 rtol=1e-6, atol=1e-7)
    losses = {layout: [r["loss"] for r in read_metrics(workdir) if "loss" in r]
              for layout, workdir in runs.items()}
    assert len(losses["fsdp"]) == 20
    np.testing.assert_allclose(losses["fsdp"], losses["replicated"], atol=1e-4)


TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
SETTINGS_LINE = ("import json, sys; from train.engines import jax_engine; "
                 "print(jax_engine.cpu_settings_line(json.loads(sys.argv[1])))")


def test_on_cpu_the_engine_says_what_was_set_for_it_or_how_to_run_faster():
    """With the settings train.main restarts with and a step's compile options: names them;
    with none on glibc's malloc: how to run faster; with none and tcmalloc preloaded:
    nothing."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("LD_PRELOAD", "GLIBC_TUNABLES", "XLA_FLAGS",
                           jax_cpu_settings.SWITCH)}
    env.update(KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES="")
    dots = {jax_cpu_settings.YNN_OPTION: jax_cpu_settings.YNN_DOTS}

    def line(options=None, **environ):
        result = subprocess.run([sys.executable, "-c", SETTINGS_LINE, json.dumps(options or {})],
                                cwd=REPO, env=dict(env, **environ), capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip()

    assert "LD_PRELOAD=libtcmalloc_minimal.so.4" in line()
    both = line(dots, GLIBC_TUNABLES=jax_cpu_settings.TUNABLE)
    assert both == ("JAX on CPU: glibc's malloc keeping freed memory, set at start-up; YNNPACK "
                    "for XLA:CPU's matrix products only, for a hybrid's ResNet stem "
                    "(KERAS_VIT_JAX_CPU_SETTINGS=off leaves them out)."), both
    assert line(GLIBC_TUNABLES=jax_cpu_settings.TUNABLE) == (
        "JAX on CPU: glibc's malloc keeping freed memory, set at start-up "
        "(KERAS_VIT_JAX_CPU_SETTINGS=off leaves it out).")
    if not os.path.exists(TCMALLOC):
        pytest.skip("libtcmalloc-minimal4 is not installed here")
    assert line(LD_PRELOAD=TCMALLOC) == "None"

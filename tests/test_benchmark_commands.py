"""A benchmark script starts as the README gives it: from the repository root, reading a config
file the way the driver does (shipped configs import `from . import common`)."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from train_fixtures import REPO


def test_input_pipeline_benchmark_runs_the_quickstart_config(fake_fmnist, tmp_path):
    command = [sys.executable, "benchmarks/input_pipeline.py", "--config=configs/quickstart.py",
               f"--config.data_dir={fake_fmnist.data_dir}", "--config.shuffle_buffer=64",
               "--config.batch_size=32", "--batches=2", "--repeats=1"]
    result = subprocess.run(command, cwd=REPO, env=fake_fmnist.env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "fashion_mnist_local at 32px, batch 32" in result.stdout
    assert "images/s" in result.stdout


@pytest.mark.processes
def test_train_step_benchmark_times_the_quickstart_model(fake_fmnist):
    """`benchmarks/train_step.py --quickstart`: the driver's loop on the main job's config, with
    the stem's max-pool gradient computed by keras_vit and by XLA, side by side."""
    env = dict(fake_fmnist.env(), TFDS_DATA_DIR=fake_fmnist.data_dir)  # the fake's label names
    command = [sys.executable, "benchmarks/train_step.py", "--quickstart", "--steps=2",
               "--repeats=1"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "configs/quickstart.py: R+Ti/16 at 32px, batch 128, XLA on" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")
            and line.endswith("x |")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| keras_vit's (first maximum, 9 strided views)", "| XLA's (select-and-scatter)"]
    assert rows[1].endswith("| 1.00x |")


def test_step_parts_times_each_block_matmul_and_both_updates():
    """`benchmarks/step_parts.py` on TensorFlow: a row per training matmul of a block (3 per
    projection: Ti/16 at 32px, batch 2, is 10 rows of width 192), the update both ways, and the
    GELU and layer norm both ways."""
    env = dict(os.environ, BENCHMARK_PEAK_SIZE="256", KERAS_BACKEND="tensorflow")
    command = [sys.executable, "benchmarks/step_parts.py", "--variant=Ti/16", "--image_size=32",
               "--batch_size=2", "--repeats=1"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split(" | ") for line in result.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| matmul")]
    assert [row[1] for row in rows[:3]] == ["10 x 192 x 576", "10 x 576 x 192", "192 x 10 x 576"]
    assert [row[1] for row in rows[9:12]] == ["10 x 768 x 192", "10 x 192 x 768", "768 x 10 x 192"]
    assert rows[12][0] == "| all" and len(rows) == 13
    assert "AdamW's update of every weight, in a tf.function: Keras' ops " in result.stdout
    assert "ms, fused kernels " in result.stdout
    assert re.search(r"A block's GELU \(10 x 768\), forward and backward in a tf.function: "
                     r"ops [\d.]+ ms, XLA-fused [\d.]+ ms", result.stdout), result.stdout
    assert re.search(r"A block's layer norm \(10 x 192\), .*: ops [\d.]+ ms, XLA-fused",
                     result.stdout), result.stdout


def test_train_step_table_divides_by_the_highest_peak_of_the_compute_dtype():
    """benchmarks/train_step.py's rows from its two children's results: "% of peak" is images/s
    x training FLOPs over the higher backend's matmul peak in the policy's compute dtype (not
    float32's), "% of own peak" over the row's backend's, and the ratio is to the TensorFlow
    driver without XLA wherever its row is."""
    spec = importlib.util.spec_from_file_location(
        "train_step", os.path.join(REPO, "benchmarks", "train_step.py"))
    train_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_step)  # (imports no Keras: the children do)

    def result(backend, bfloat16_peak, rates):
        case = {"case": "B/16", "policy": "mixed_bfloat16", "compute_dtype": "bfloat16",
                "training_flops": 100e9, "rates": rates}
        return {"backend": backend, "peaks": {"bfloat16": bfloat16_peak, "float32": 1e15},
                "cases": [case]}

    rows = train_step.table_rows([
        result("tensorflow", 1000e9, {"keras-hub fit": 4.0, "keras_vit driver loop, XLA off": 2.0}),
        result("jax", 500e9, {"keras_vit JAX engine": 3.0})])
    expected = [("tensorflow", "keras-hub fit", 4.0, 0.4, 0.4, 2.0),
                ("tensorflow", "keras_vit driver loop, XLA off", 2.0, 0.2, 0.2, 1.0),
                ("jax", "keras_vit JAX engine", 3.0, 0.3, 0.6, 1.5)]
    assert [row[:2] for row in rows] == [("B/16", "mixed_bfloat16")] * 3
    assert [row[2:4] for row in rows] == [row[:2] for row in expected]
    assert [row[4:] for row in rows] == [pytest.approx(row[2:]) for row in expected]


def test_export_latency_benchmark_times_a_variant_with_changed_fields():
    """`benchmarks/export_latency.py` with the variant's fields overridden (a Ti/16 hybrid of
    width 8): every format is timed, and the files are that small model's, not Ti/16's."""
    command = [sys.executable, "benchmarks/export_latency.py", "--variant=R+Ti/16",
               "--image_size=16", "--patch_size=2", "--hidden_size=8", "--mlp_dim=16",
               "--num_heads=2", "--num_layers=1", "--num_classes=3", "--batch_size=2",
               "--repeats=1", "--tf2onnx_graph"]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split(" | ") for line in result.stdout.splitlines()
            if line.startswith("| R+Ti/16 |")]
    kinds = ("float32", "int8", "float32, tf2onnx's graph")  # the last: --tf2onnx_graph
    onnx = [f"ONNX Runtime {kind}" for kind in kinds
            if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("tf2onnx")]
    openvino = ([f"OpenVINO {kind}" for kind in kinds]
                if onnx and importlib.util.find_spec("openvino") else [])
    assert [row[1] for row in rows] == [
        "Keras (XLA-compiled call)", "SavedModel (TF)", "TFLite float32", "TFLite float16",
        "TFLite dynamic", "TFLite int8", *onnx, *openvino]
    # Ti/16's own float32 file is 22 MB; this one holds about 12k weights (0.05 MB).
    assert float(rows[2][2]) < 0.5, rows
    # Agreement with Keras: the float32 files give its logits (its own row, exactly).
    differences = {row[1]: float(row[6].rstrip(" |")) for row in rows}
    assert differences["Keras (XLA-compiled call)"] == 0
    for name in ["SavedModel (TF)", "TFLite float32", *[n for n in onnx + openvino
                                                       if "float32" in n]]:
        assert differences[name] < 1e-3, rows
    if onnx:  # both files' ops, as written: the rewrites' LayerNormalization in one only
        counts = [line for line in result.stdout.splitlines() if ", written: " in line]
        assert [("LayerNormalization" in line) for line in counts] == [False, True], counts


@pytest.mark.processes  # a process for each file
def test_export_latency_writes_each_file_in_a_process_of_its_own(tmp_path):
    """`--separate_processes`: a child loads the model's .keras file and writes the file, whose
    model computes the parent's logits; a child that fails stops the benchmark with one line."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import export_latency
    import keras_vit
    from litert_runner import tflite_runner

    model = keras_vit.vit("Ti/16", image_size=16, patch_size=8, hidden_size=8, mlp_dim=16,
                          num_heads=2, num_layers=1, num_classes=3)
    export_latency.perturbed(model)
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 16, 16, 3)).astype("float32")
    write = export_latency.writer(model, str(tmp_path), pixels, separate_processes=True)
    write("tflite", str(tmp_path / "none.tflite"))
    expected = model((pixels - 127.5) / 127.5)
    np.testing.assert_allclose(tflite_runner(str(tmp_path / "none.tflite"), 2, 1)(pixels),
                               expected, atol=1e-5)
    os.remove(tmp_path / "model.keras")
    with pytest.raises(SystemExit, match=r"Writing int8.tflite in its own process failed "
                                         r"\(exit code 1;"):
        write("tflite", str(tmp_path / "int8.tflite"), "int8")


@pytest.mark.processes  # simulated hosts on two formats and two pipelines
def test_input_scaling_benchmark_reads_about_one_share_per_host(tmp_path):
    """`benchmarks/input_scaling.py` on 512 tiny JPEGs and 1 or 4 simulated hosts: it writes the
    dataset in both formats and prints its three tables; 4 hosts together read far fewer than 4
    copies of the records (when every host read all of them: 4)."""
    command = [sys.executable, "benchmarks/input_scaling.py", "--records=512", "--image_size=32",
               "--files=8", "--hosts=1,4", "--batch_size=64", "--host_batch=8", "--batches=1",
               f"--data_dir={tmp_path}", "--tables=reads,first,speed", "--grain_workers=0"]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| ")
            and not line.startswith("| format")]
    reads = {(row[0][2:], int(row[1])): float(row[2]) for row in rows[:4]}
    assert sorted(reads) == [("array_record", 1), ("array_record", 4), ("tfrecord", 1),
                             ("tfrecord", 4)], rows
    assert all(1.0 <= amplification < 2.5 for amplification in reads.values()), reads
    # first batches: 3 cases x 2 host counts; images/s: tf.data on both formats and Grain on
    # ArrayRecord, x 2 host counts
    assert len(rows) == 4 + 6 + 6, rows
    timed = [("tfrecord", "tf.data"), ("array_record", "tf.data"), ("array_record", "grain")]
    assert [(row[0][2:], row[1]) for row in rows[-6:]] == [run for run in timed for _ in (1, 4)]


@pytest.mark.processes  # the JAX engine compiled in four configurations
def test_accelerator_benchmark_runs_its_tiny_model_on_the_cpu():
    """`benchmarks/accelerator.py --tiny`: the whole benchmark (the JAX engine's train step in
    four configurations, inference, timm where installed) on a small model, one table."""
    pytest.importorskip("jax")
    result = subprocess.run([sys.executable, "benchmarks/accelerator.py", "--tiny"], cwd=REPO,
                            env=dict(os.environ, KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES=""),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| keras_vit")]
    assert len(rows) == 5, result.stdout
    for row in rows[:4]:  # training: images/s and MFU
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert float(cells[2].replace(",", "")) > 0 and cells[3].endswith("%"), row
    assert "matmul peak measured" in result.stdout


@pytest.mark.processes
def test_memory_benchmark_plans_the_train_step_with_xla():
    """`benchmarks/memory_per_device.py --xla` on Ti/16: XLA's plan of the JAX engine's step per
    device, for every attention, remat and sharding; remat needs less, FSDP holds less."""
    pytest.importorskip("jax")
    result = subprocess.run(
        [sys.executable, "benchmarks/memory_per_device.py", "--xla", "--models=Ti/16",
         "--per_device_batch=8", "--cpu_devices=2", "--gib=0"],
        cwd=REPO, env=dict(os.environ, KERAS_BACKEND="jax"), capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {tuple(cells[1:4]): [float(cells[4]), float(cells[6])]
            for line in result.stdout.splitlines() if line.startswith("| Ti/16")
            for cells in [[cell.strip() for cell in line.strip("|").split("|")]]}
    assert len(rows) == 8, result.stdout
    for attention in ("explicit", "fused"):
        for sharding in ("replicated", "FSDP"):
            none, blocks = rows[(attention, "none", sharding)], rows[(attention, "blocks", sharding)]
            assert blocks[1] < none[1], (attention, sharding, rows)  # total per device
        for remat in ("none", "blocks"):  # arguments: the state, half of it on each device
            assert rows[(attention, remat, "FSDP")][0] < rows[(attention, remat, "replicated")][0]


def test_the_largest_batch_is_predicted_from_two_plans_and_checked():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import memory_per_device

    class Memory:  # what compiled.memory_analysis() gives, for a plan of `batch` images
        def __init__(self, batch):
            self.argument_size_in_bytes = 1000
            self.temp_size_in_bytes = 50 * batch + (5 * batch if batch > 100 else 0)

    planned_batches = []

    def planned(batch):
        planned_batches.append(batch)
        return Memory(batch), 0.0

    # 1000 + 50 b fits 8000 up to b = 140, but above 100 each image takes 55: b = 127.
    assert memory_per_device.largest_batch(planned, Memory(32), 32, 8000) == 127
    assert planned_batches[0] == 16 and len(planned_batches) <= 4



def _native_packing(fake_fmnist, *flags):
    """`benchmarks/native_packing.py` with `flags` on the fake data: its output lines."""
    fields = ["--", f"--config.data_dir={fake_fmnist.data_dir}", "--config.batch_size=32",
              "--config.pack_sequences=10", "--config.eval_batch_size=50",
              "--config.eval_split=test"]
    result = subprocess.run([sys.executable, "benchmarks/native_packing.py", *flags, *fields],
                            cwd=REPO, env=fake_fmnist.env(), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


# The benchmark's three modes are three tests, so that pytest-xdist can run them side by side.
@pytest.mark.processes
def test_native_packing_benchmark_compares_the_three_layouts(fake_fmnist):
    """A row per layout, packing's useful tokens above padding's."""
    lines = _native_packing(fake_fmnist, "--steps=3", "--engines=tensorflow")
    rows = {line.split(" | ")[1]: line.split(" | ") for line in lines
            if line.startswith("| tensorflow |")}
    assert sorted(rows) == ["packed", "padded", "square"]
    useful = {mode: float(row[2].rstrip("%")) for mode, row in rows.items()}
    assert useful["square"] == 100 and useful["packed"] > useful["padded"]
    assert rows["padded"][3] == "100.0%" and rows["padded"][6].strip() == "1.00x |"


@pytest.mark.processes
def test_native_packing_benchmark_times_the_step_alone_on_jax(fake_fmnist):
    """With --step_only, the step alone on JAX (one compilation per layout, the compiled
    step's memory) and the input alone."""
    lines = _native_packing(fake_fmnist, "--step_only", "--engines=jax", "--step_batches=2",
                            "--repeats=1")
    steps = {line.split(" | ")[1]: line.split(" | ") for line in lines
             if line.startswith("| jax |")}
    assert sorted(steps) == ["packed", "padded", "square"]
    assert steps["packed"][2] == "1,280" and steps["padded"][2] == "2,048"  # tokens a step
    assert steps["padded"][5] == "1.00x"
    assert all(row[8] == "1" and row[9].endswith(" MB") for row in steps.values())
    inputs = [line for line in lines if line.startswith(("| packed |", "| padded |",
                                                         "| square |"))]
    assert len(inputs) == 3


@pytest.mark.processes
def test_native_packing_benchmark_times_the_steps_on_their_live_pipelines(fake_fmnist):
    """With --with_input, the steps on their live pipelines (TensorFlow)."""
    lines = _native_packing(fake_fmnist, "--step_only", "--with_input", "--engines=tensorflow",
                            "--step_batches=2", "--repeats=1")
    assert "Each step reads its live tf.data pipeline (input and step, interleaved)." in lines
    steps = {line.split(" | ")[1]: line.split(" | ") for line in lines
             if line.startswith("| tensorflow |")}
    assert sorted(steps) == ["packed", "padded", "square"]
    assert steps["padded"][5] == "1.00x" and all(row[8] == "1" for row in steps.values())
    assert not any(line.startswith("| input alone") for line in lines)


def test_native_aspect_study_evaluates_each_run_at_each_aspect(fake_fmnist, tmp_path):
    """`benchmarks/native_aspect_study.py` on the fake data, on three untrained runs of
    configs/native_aspect.py made in-process (training them would take minutes): "padded" as
    the TensorFlow engine checkpoints it, "packed" and "square" as their export/model.keras
    (the script's two ways to a run's weights), on the canvas data. A row per run, a column per
    aspect ratio (those outside 1/3..3 marked), accuracies in [0, 1]; runs of two datasets
    refused."""
    import json

    import tensorflow as tf

    from configs import native_aspect
    from train.engines import tf_engine
    from train.run import objectives, run_config, run_files
    from train_fixtures import fashion_mnist_dir

    workdirs = {}
    for layout in ("packed", "padded", "square"):
        config = native_aspect.get_config(f"{layout},canvas")
        config.model.update(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1)
        config.update(data_dir=fake_fmnist.data_dir, batch_size=32, pack_sequences=10,
                      eval_batch_size=50, jit_compile=False)
        workdir = workdirs[layout] = str(tmp_path / layout)
        os.makedirs(run_files.export_dir(workdir))
        run_config.write(config, workdir)
        if layout == "padded":  # checkpoints/ckpt-0: model, optimizer and EMA, as a run's
            with fashion_mnist_dir(fake_fmnist.source):  # prepares fashion_mnist_canvas
                tf_engine.TFEngine(config, workdir, tf.distribute.get_strategy()).save()
        else:
            objective = objectives.make(config, 10)
            objective.encoder(objective.build()).save(run_files.model_file(workdir))
    output = tmp_path / "study.json"
    command = [sys.executable, "benchmarks/native_aspect_study.py", "--examples=20",
               "--aspects=1/6,1,6", f"--output={output}",
               *(f"--{layout}={workdir}" for layout, workdir in workdirs.items())]
    result = subprocess.run(command, cwd=REPO, env=fake_fmnist.env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "| run | own | 1/6 (out) | 1 | 6 (out) |" in lines
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines
            if line.startswith(("| packed ", "| padded ", "| square "))}
    assert sorted(rows) == ["packed", "padded", "square"]
    assert all(rows[run].count("%") == 4 for run in rows)
    report = json.loads(output.read_text())
    assert [column["outside_training"] for column in report["columns"]] == [
        False, True, False, True]
    assert report["runs"]["padded"]["weights"].endswith("ckpt-0")
    assert report["runs"]["square"]["weights"].endswith("model.keras")
    assert report["dataset"] == "fashion_mnist_canvas"
    for run in report["runs"].values():
        assert sorted(run["accuracy"]) == ["1", "1/6", "6", "own"]
        assert all(0 <= value <= 1 for value in run["accuracy"].values())
    # Runs of two datasets would see different test images: refused, naming them.
    config.dataset = "fashion_mnist_native"
    run_config.write(config, workdirs["square"])
    result = subprocess.run(command, cwd=REPO, env=fake_fmnist.env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0
    assert ("different data (--packed on fashion_mnist_canvas, --padded on fashion_mnist_canvas"
            ", --square on fashion_mnist_native)") in result.stderr


def _step_profile():
    spec = importlib.util.spec_from_file_location(
        "step_profile", os.path.join(REPO, "benchmarks", "step_profile.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # (imports no Keras: main does)
    return module


def test_step_profile_names_each_kernel_by_its_op_and_layer():
    step_profile = _step_profile()
    assert step_profile.tf_kind(
        "gradient_tape/vit_b16/encoderblock_0/MlpBlock_3/Dense_0/MatMul:_MklMatMul"
    ) == "_MklMatMul in MlpBlock, backward"
    assert step_profile.tf_kind("Adam/ResourceApplyAdam:ResourceApplyAdam") == (
        "ResourceApplyAdam in Adam")
    assert step_profile.jax_kind(
        "ynn_fusion.22",
        "jit(_step)/transpose(jvp(vit_b16))/encoderblock_3/MlpBlock_3/Dense_0/dot_general"
    ) == "ynn_fusion: encoderblock_N/MlpBlock_3/Dense_0/dot_general, backward"
    assert step_profile.jax_kind("multiply_add_fusion.4", "jit(_step)/adam_w/add") == (
        "multiply_add_fusion: the optimizer (adam_w)")
    assert step_profile.jax_kind("wrapped_reduce-window.3", "") == (
        "wrapped_reduce-window: (no op name)")
    # Overlapping and touching intervals count once; a gap does not count.
    assert step_profile.covered([(5, 9), (0, 2), (1, 3), (3, 4)]) == 8


@pytest.mark.parametrize("backend,rows", [
    ("tensorflow", (r"\w*MatMul in MlpBlock, backward", r"ResourceApplyAdam in Adam",
                    r"XLA \w+")),
    ("jax", (r"\w+: encoderblock_N/MlpBlock_3/Dense_0/dot_general, backward",
             r"\w+: the optimizer \(adam_w\)")),
])
def test_step_profile_tables_a_step_by_kernel(fake_fmnist, backend, rows):
    """`benchmarks/step_profile.py` on Ti/16 at 32px: the step's time, then a row per kind of
    kernel with its time per step, the largest first; on JAX the kernels named by the JAX ops
    they compute (read from the trace's compiled program) and the step's wall time split."""
    env = dict(fake_fmnist.env(), TFDS_DATA_DIR=fake_fmnist.data_dir,
               BENCHMARK_PEAK_SIZE="256", KERAS_BACKEND=backend)
    command = [sys.executable, "benchmarks/step_profile.py", "--variant=Ti/16",
               "--image_size=32", "--batch_size=2", "--top=200"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{backend}, Ti/16 at 32, batch 2, float32" in result.stdout
    assert re.search(r"step: [\d.]+ s, [\d.]+ images/s", result.stdout), result.stdout
    table = [line.split(" | ") for line in result.stdout.splitlines()
             if re.match(r"\| [\d.]+ \| [\d.]+% \| ", line)]
    seconds = [float(row[0][2:]) for row in table]
    assert seconds == sorted(seconds, reverse=True) and seconds[-1] >= 0
    kinds = [row[2][:-2] for row in table]
    for pattern in rows:
        assert any(re.fullmatch(pattern, kind) for kind in kinds), (pattern, kinds)
    walls = re.search(r"wall time per traced step: a YNNPACK matrix product ([\d.]+) s, "
                      r"another traced kernel only ([\d.]+) s, no traced kernel", result.stdout)
    assert (walls is not None) == (backend == "jax"), result.stdout


@pytest.mark.parametrize("flag,code,message", [
    ("--steps=0", 2, "--steps=0 must be at least 1."),
    ("--image_size=-8", 2, "--image_size=-8 must be at least 1."),
    ("--variant=X/99", 1, "Error: Invalid config value: config.model.variant='X/99': is not a "
                          "ViT variant; valid names: Ti/16,"),
])
def test_step_profile_refuses_bad_flags_in_a_line(fake_fmnist, flag, code, message):
    env = dict(fake_fmnist.env(), TFDS_DATA_DIR=fake_fmnist.data_dir, KERAS_BACKEND="tensorflow")
    result = subprocess.run([sys.executable, "benchmarks/step_profile.py", flag], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == code
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr

"""The workdir layout (train/run/run_files.py): the paths the trainer writes and the tools read."""

import os

from train.run import run_files


def test_layout_of_a_workdir(tmp_path):
    workdir = str(tmp_path)
    export = os.path.join(workdir, "export")
    assert run_files.config_file(workdir) == os.path.join(workdir, "config.json")
    assert run_files.metrics_file(workdir) == os.path.join(workdir, "metrics.jsonl")
    assert run_files.log_file(workdir) == os.path.join(workdir, "train.log")
    assert run_files.checkpoint_dir(workdir) == os.path.join(workdir, "checkpoints")
    assert run_files.export_dir(workdir) == export
    assert run_files.model_file(workdir) == os.path.join(export, "model.keras")
    assert run_files.encoder_file(workdir) == os.path.join(export, "encoder.npz")
    assert run_files.saved_model_dir(workdir) == os.path.join(export, "saved_model")
    assert run_files.tflite_file(workdir, "int8") == os.path.join(export, "model_int8.tflite")


def test_class_names_round_trip(tmp_path):
    workdir = str(tmp_path)
    assert run_files.read_class_names(workdir) is None  # none saved yet
    os.makedirs(run_files.export_dir(workdir))
    run_files.write_class_names(workdir, ["T-shirt/top", "ankle boot"])
    assert run_files.read_class_names(workdir) == ["T-shirt/top", "ankle boot"]
    assert os.listdir(run_files.export_dir(workdir)) == ["class_names.txt"]  # no temporaries

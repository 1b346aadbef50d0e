"""What `python -m train.main` prints (train/console/cli.py): by default our own progress lines,
warnings and errors, without the INFO lines of TensorFlow's C++ runtime or of TFDS, and in a log
file no progress bar; `--verbose` shows those too."""

import glob
import os
import re
import subprocess

import pytest

from train_fixtures import REPO, main_command

# absl's log line prefix, "I1121 18:07:31.471261 1399984 file.py:121] ", then the message.
INFO_LINE = re.compile(r"^I\d{4} [\d:.]+\s+\d+ ([\w.]+):\d+\] (.*)$", re.M)
# What TensorFlow's C++ libraries print before their INFO lines while they load.
ABSL_BANNER = "All log messages before absl::InitializeLog()"
OUR_FILES = {os.path.basename(path) for folder in ("train", "keras_vit")
             for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True)}


@pytest.fixture(scope="module")
def outputs(fake_fmnist, quickstart_run, tmp_path_factory):
    """{"default": output, "verbose": output} of one tiny run each, their output written to a
    file as in a log or CI. The default run (conftest's `quickstart_run`, which the docs' tests
    share) prepares the dataset (TFDS)."""
    env = fake_fmnist.env()
    del env["TF_CPP_MIN_LOG_LEVEL"]  # the test fixtures' quieting; the CLI's own is tested
    del env["CUDA_VISIBLE_DEVICES"]  # hid the GPUs, and with them TensorFlow's cuInit error
    root = tmp_path_factory.mktemp("cli_output")
    with open(root / "verbose.log", "w") as log:
        returncode = subprocess.run(
            main_command(fake_fmnist, str(root / "verbose"), "--config.export=True",
                         "--verbose"), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            timeout=600).returncode
    verbose = (root / "verbose.log").read_text()
    assert returncode == 0, f"verbose run failed:\n{verbose[-4000:]}"
    return {"default": quickstart_run.output, "verbose": verbose}


def _info_files(output):
    """The files that logged the INFO lines of `output` (x.cc for C++, x.py for Python)."""
    return {match.group(1) for match in INFO_LINE.finditer(output)}


def test_progress_lines_show_by_default(outputs):
    messages = [match.group(2) for match in INFO_LINE.finditer(outputs["default"])
                if match.group(1) == "loop.py"]
    assert [m.split()[1] for m in messages if m.startswith("step ")] == ["2/6", "4/6", "6/6"]


def test_no_tensorflow_or_tfds_info_lines_by_default(outputs):
    output = outputs["default"]
    assert _info_files(output) <= OUR_FILES, _info_files(output) - OUR_FILES
    assert ABSL_BANNER not in output


def test_no_terminal_escapes_in_a_log_file(outputs):
    """TFDS' progress bar (tqdm) redraws itself with \\r and \\x1b[A, garbage in a file: there
    the preparation shows as TFDS' plain lines instead."""
    output = outputs["default"]
    assert "\x1b[" not in output and "\r" not in output, repr(output[:2000])
    assert "Dataset fashion_mnist_local downloaded and prepared to " in output


def test_tflite_converter_routine_lines_only_with_verbose(outputs):
    for routine in ("Ignored output_format", "fully_quantize: "):
        assert routine not in outputs["default"] and routine in outputs["verbose"], routine
    assert "TFLite int8: " in outputs["default"]  # our own line about the conversion stays


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="a machine with an NVIDIA driver")
def test_no_cuda_error_without_a_gpu_by_default(outputs):
    """TensorFlow logs "failed call to cuInit" as an error on every machine without a GPU."""
    assert "cuInit" not in outputs["default"]


def test_verbose_shows_them(outputs):
    output = outputs["verbose"]
    files = _info_files(output)
    assert any(name.endswith((".cc", ".h")) for name in files), files  # TensorFlow's C++
    assert "dataset_builder.py" in files, files  # TFDS: "Reusing dataset fashion_mnist_local"
    assert "step 6/6" in output


def test_config_is_one_line_by_default_and_whole_with_verbose(outputs):
    summary = re.compile(r"\] \S+ on \S+, 6 steps of \d+; the whole config: \S+config\.json")
    assert summary.search(outputs["default"]) and "Config:\n" not in outputs["default"]
    assert "Config:\n" in outputs["verbose"] and "weight_decay: " in outputs["verbose"]

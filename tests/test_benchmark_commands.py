"""A benchmark script starts as the README gives it: from the repository root, reading a config
file the way the driver does (shipped configs import `from . import common`)."""

import subprocess
import sys

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


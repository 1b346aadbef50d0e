"""Training speed of one config in three set-ups: one process on one device, one process with the
CPU split into 2 replicas (`--cpu_devices=2`), and 2 worker processes on localhost (TF_CONFIG,
`--strategy=multi_worker`), all with the same global batch.

    python benchmarks/distributed_training.py --steps=300 --steps_per_loop=50

Each set-up is a fresh `python -m train.main` run in a temporary workdir; the rate is the median
of its loops' steps/s (from `metrics.jsonl`), the first loop (tracing) left out. On one machine
the 2 workers and the 2 replicas share its cores, so this measures the cost of the distribution,
not a speed-up.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags
from ml_collections import config_flags

import machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from train.run import config_flag  # noqa: E402

config_flag.define_config_flag("Experiment config (a shipped name or file.py).", "quickstart")
flags.DEFINE_integer("steps", 300, "Training steps per run.")
flags.DEFINE_integer("steps_per_loop", 50, "Steps per host call (one metrics record each).")
FLAGS = flags.FLAGS


def _command(workdir, *extra):
    config_file = config_flags.get_config_filename(FLAGS["config"])
    return [sys.executable, "-m", "train.main", f"--config={config_file}",
            f"--workdir={workdir}", f"--config.total_steps={FLAGS.steps}",
            f"--config.steps_per_loop={FLAGS.steps_per_loop}",
            f"--config.eval_every_steps={FLAGS.steps}",
            f"--config.checkpoint_every_steps={FLAGS.steps}", "--config.export=False",
            *(f"--config.{name}={value}"  # this command line's --config.field=value
              for name, value in config_flags.get_override_values(FLAGS["config"]).items()),
            *extra]


def _run(name, commands_and_envs):
    processes = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
                 for command, env in commands_and_envs]
    for process in processes:
        _, errors = process.communicate()
        if process.returncode:
            sys.exit(f"{name} failed ({process.returncode}):\n{errors[-3000:]}")


def _steps_per_second(workdir, batch_size):
    with open(os.path.join(workdir, "metrics.jsonl")) as handle:
        records = [json.loads(line) for line in handle if '"loss"' in line]
    rates = [record["images_per_second"] / batch_size for record in records[1:]]
    return statistics.median(rates)


def main(argv):
    del argv
    from train.engines.tf_strategy import local_cluster
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    batch_size = FLAGS.config.batch_size
    print(machine.describe())
    print(f"{config_flags.get_config_filename(FLAGS['config'])}, global batch {batch_size}, "
          f"{FLAGS.steps} steps")
    with tempfile.TemporaryDirectory() as root:
        workers = [dict(env, TF_CONFIG=tf_config) for tf_config in local_cluster(2)]
        setups = [  # name, workdir, the flags of its process(es), their environments
            ("1 process, 1 device", f"{root}/one", ["--strategy=one_device"], [env]),
            ("1 process, --cpu_devices=2", f"{root}/two",
             ["--strategy=mirrored", "--cpu_devices=2"], [env]),
            ("2 workers (TF_CONFIG)", f"{root}/workers", ["--strategy=multi_worker"], workers),
        ]
        print("| set-up | steps/s | images/s |\n|---|---|---|")
        for name, workdir, extra, envs in setups:
            _run(name, [(_command(workdir, *extra), process_env) for process_env in envs])
            rate = _steps_per_second(workdir, batch_size)
            print(f"| {name} | {rate:.2f} | {rate * batch_size:.0f} |", flush=True)


if __name__ == "__main__":
    app.run(main)

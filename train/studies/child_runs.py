"""Runs `python -m train.main` in a subprocess for the studies (train.studies.ablate and .mpp):
each run in a fresh TensorFlow, its output in `workdir/train.log`, resumable."""

import os
import shlex
import signal
import subprocess
import sys

from ..run import run_files

# The training tools' package (`train` in a checkout, `keras_vit.train` when installed), and
# where its top-level package lies (the checkout, or site-packages): the child imports this same
# package, under this same name.
_DRIVER = __package__.rpartition(".")[0]
_IMPORT_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(sys.modules[__package__.split(".")[0]].__file__)))


def run_main(arguments, workdir):
    """Runs (or resumes) `python -m train.main <arguments> --workdir=<workdir>`, its output
    appended to `workdir/train.log`; returns `(exit status, log path)`. On Ctrl-C or SIGTERM
    the run is sent SIGTERM (it saves a checkpoint and stops) and the exception goes on."""
    os.makedirs(workdir, exist_ok=True)
    command = [sys.executable, "-m", f"{_DRIVER}.main", *arguments, f"--workdir={workdir}"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_IMPORT_ROOT, env.get("PYTHONPATH")]))
    log_path = run_files.log_file(workdir)
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            returncode = process.wait()
        except BaseException:  # Ctrl-C or SIGTERM: the run saves a checkpoint and stops
            process.send_signal(signal.SIGTERM)
            process.wait()
            raise
    return returncode, log_path


def train(arguments, workdir, total_steps):
    """Runs (or resumes) `python -m train.main <arguments>` in `workdir` and returns the
    accuracy of its final evaluation. Raises UsageError, naming the run's last error and its
    log, when it fails."""
    from absl import app

    returncode, log_path = run_main(arguments, workdir)
    accuracy = final_accuracy(workdir, total_steps) if returncode == 0 else None
    if accuracy is None:
        raise app.UsageError(
            f"The run in {workdir} failed (exit status {returncode}): {last_error(log_path)} "
            f"Its log is {log_path}. Finished runs are kept: fix the problem and rerun the same "
            "command.")
    return accuracy


def final_accuracy(workdir, total_steps):
    """The accuracy of the run's final evaluation (at `total_steps`), or None if the run has
    not finished."""
    from ..run import metrics

    for record in reversed(metrics.read_records(workdir)):
        if record["step"] == total_steps and "eval_accuracy" in record:
            return record["eval_accuracy"]
    return None


def final_losses(workdir, total_steps):
    """`{"train_loss", "eval_loss"}` of the run's last training log line and its final
    evaluation (at `total_steps`); a value the run did not log is None."""
    from ..run import metrics

    losses = {"train_loss": None, "eval_loss": None}
    for record in metrics.read_records(workdir):
        if record["step"] == total_steps:
            losses["train_loss"] = record.get("loss", losses["train_loss"])
            losses["eval_loss"] = record.get("eval_loss", losses["eval_loss"])
    return losses


def last_error(log_path):
    """The last `Error:` line of a run's log (or its last line), ending with a full stop."""
    with open(log_path, errors="replace") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    text = errors[-1] if errors else (lines[-1] if lines else "no output")
    return text if text.endswith(".") else text + "."

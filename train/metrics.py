"""Where logged values go: absl log lines, TensorBoard scalars and `workdir/metrics.jsonl`."""

import json
import os

import tensorflow as tf


class MetricsWriter:
    """Writes each record `{"step": N, name: value, ...}` to TensorBoard and metrics.jsonl.

    The JSON-lines file is rewritten whole through `tf.io.gfile` (GCS has no append), via a
    temporary file and a rename. On resume, records after the restored step are dropped, so a
    run that crashed between a checkpoint and its next log leaves no duplicate steps.
    """

    def __init__(self, workdir, resume_step=0):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.lines = []
        if tf.io.gfile.exists(self.path):
            with tf.io.gfile.GFile(self.path) as handle:
                for line in handle:
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step:
                        self.lines.append(line.rstrip("\n"))
        self.summary = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

    def write(self, step, **values):
        values = {name: float(value) for name, value in values.items()}
        with self.summary.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)
        self.summary.flush()
        self.lines.append(json.dumps({"step": int(step), **values}))
        temporary = self.path + ".tmp"
        with tf.io.gfile.GFile(temporary, "w") as handle:
            handle.write("\n".join(self.lines) + "\n")
        tf.io.gfile.rename(temporary, self.path, overwrite=True)

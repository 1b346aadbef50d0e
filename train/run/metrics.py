"""Where logged values go: absl log lines, TensorBoard scalars and `workdir/metrics.jsonl`; and
`write_json`, for the tools' result files (analysis.json, the ablation studies' reports)."""

import json

from keras_vit import fileio
from . import run_files


class MetricsWriter:
    """Writes each record `{"step": N, name: value, ...}` to TensorBoard and metrics.jsonl.

    The JSON-lines file is rewritten whole (GCS has no append) by `fileio.write_atomically`.
    On resume, records after the restored step are dropped, so a run that crashed between a
    checkpoint and its next log leaves no duplicate steps; a record of the same step and the
    same names (an evaluation repeated on resume) replaces the older.
    Only the chief of a multi-worker run writes: elsewhere `active=False` makes it a no-op.
    """

    def __init__(self, workdir, resume_step=0, active=True):
        self.path = run_files.metrics_file(workdir)
        self.active = active
        self.records = []
        if not active:
            return
        self.records = [record for record in read_records(workdir)
                        if record.get("step", 0) <= resume_step]
        # TensorBoard's own writer, not tf.summary: a JAX run may have no TensorFlow. (Its file
        # access goes through TensorFlow's gfile where TensorFlow is installed: gs:// paths.)
        from tensorboard.summary import Writer

        self.summary = Writer(run_files.tensorboard_dir(workdir))

    def write(self, step, **values):
        if not self.active:
            return
        values = {name: float(value) for name, value in values.items()}
        for name, value in values.items():
            self.summary.add_scalar(name, value, step=int(step))
        self.summary.flush()
        record = {"step": int(step), **values}
        self.records = [old for old in self.records if old.keys() != record.keys()
                        or old["step"] != record["step"]] + [record]
        fileio.write_atomically(self.path,
                                "".join(json.dumps(record) + "\n" for record in self.records))


def read_records(workdir):
    """The records of `workdir/metrics.jsonl` in order; [] when there is none yet."""
    path = run_files.metrics_file(workdir)
    if not fileio.exists(path):
        return []
    with fileio.open_file(path, "r") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_json(path, values):
    """Writes `values` as indented JSON to `path` (local or gs://) atomically."""
    fileio.write_atomically(path, json.dumps(values, indent=2) + "\n")

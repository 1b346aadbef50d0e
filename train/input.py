"""Shows what one host of a multi-host run reads: the examples of its slice of each global batch.

    python -m train.input --config=configs/quickstart.py --num_hosts=4 --host=1 \
        --start_step=1000 --steps=3

prints one JSON line per step, `{"step": s, "ids": [...]}` (an example's id is its record
number in the train split), through the input pipeline the engine of KERAS_BACKEND uses
(`config.input_pipeline`: KERAS_BACKEND=jax shows the Grain pipeline's), then
`{"records_read": ..., "bytes_read": ..., "examples": ..., "seconds_to_first_batch": ...}`:
what this host's reader fetched (encoded image bytes, read-ahead included) against what it
handed on. On random-access storage (ArrayRecord, the offline default, image folders) the hosts'
ids at a step together are the 1-host batch, and each host reads about 1/num_hosts of the
records; on TFRecord each host reads a consecutive part of the split. tf.data decodes nothing
here, so it is fast on any dataset; Grain makes its batches whole.
"""

import json
import time

from absl import app, flags

from .console import cli
from .run import config_checks, config_flag

config_flag.define_config_flag("Config (a shipped name or file.py, [:arg]): the dataset, its "
                               "train split, batch_size, seed and shuffle_buffer.")
flags.DEFINE_integer("num_hosts", 1, "Hosts (input pipelines) the global batch is split over.")
flags.DEFINE_integer("host", 0, "The host to show, 0 to num_hosts - 1.")
flags.DEFINE_integer("start_step", 0, "The global step to start at, as a resumed run does.")
flags.DEFINE_integer("steps", 1, "Global steps to show.")
flags.declare_key_flag("verbose")  # defined in train/console/cli.py
FLAGS = flags.FLAGS

FIELDS = ("dataset", "data_dir", "train_split", "eval_split", "batch_size", "seed",
          "shuffle_buffer", "input_pipeline")


def read_counter():
    """`(observe, counts)`: a `train.data.records.Split` observer that counts the records and the
    encoded image bytes read, and its counts (tf.Variables)."""
    import tensorflow as tf

    counts = {"records_read": tf.Variable(0, dtype=tf.int64),
              "bytes_read": tf.Variable(0, dtype=tf.int64)}

    def observe(example):
        with tf.control_dependencies([
                counts["records_read"].assign_add(1),
                counts["bytes_read"].assign_add(
                    tf.cast(tf.strings.length(example["image"]), tf.int64))]):
            return {key: tf.identity(value) for key, value in example.items()}

    return observe, counts


def host_batches(config, num_hosts, host, start_step, steps, builder=None):
    """Yields `{"step", "ids"}` for each of `steps` global steps from `start_step`, then the
    read counts; the train stream is the driver's: through `config.input_pipeline` as the
    engine of KERAS_BACKEND chooses it (train.data.grain_pipeline.choose), Grain's
    (train.data.grain_pipeline.train_batches) or tf.data's
    (train.data.input_order.train_examples)."""
    from .data import grain_pipeline
    from .run import run_files

    if grain_pipeline.choose(config, run_files.current_engine()) == "grain":
        source = grain_pipeline.Counted(grain_pipeline.open_split(config, "train_split"))
        batches = (batch["id"] for batch in grain_pipeline.train_batches(
            source, config, start_step, num_hosts, host))
        counts = lambda: {"records_read": source.records_read,  # noqa: E731
                          "bytes_read": source.bytes_read}
    else:
        batches, counts = _tf_data_ids(config, num_hosts, host, start_step, builder)
    start = time.perf_counter()
    first_batch = None
    for step, ids in zip(range(start_step, start_step + steps), batches):
        first_batch = first_batch or time.perf_counter() - start
        yield {"step": step, "ids": ids.tolist()}
    yield {**counts(), "examples": steps * (config.batch_size // num_hosts),
           "seconds_to_first_batch": round(first_batch or 0.0, 3)}


def _tf_data_ids(config, num_hosts, host, start_step, builder):
    """(the ids of each batch, a function returning the read counts) through tf.data."""
    from .data import input_order, tf_pipeline, records

    builder = builder or tf_pipeline.get_builder(config)
    observe, counts = read_counter()
    split = records.Split(builder, config.train_split, observe=observe)
    stream = input_order.train_examples(split, config, start_step, num_hosts, host)
    batches = stream.map(lambda position, example: example["id"]).batch(
        config.batch_size // num_hosts)
    return batches.as_numpy_iterator(), lambda: {name: int(value.numpy())
                                                 for name, value in counts.items()}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = config_flag.loaded_config(FLAGS)
    if config is None:
        raise app.UsageError("Give --config=FILE: it names the dataset and the batch size.")
    config_checks.check(config, fields=FIELDS)
    if not 0 <= FLAGS.host < FLAGS.num_hosts:
        raise app.UsageError(f"--host={FLAGS.host}: the hosts are 0 to {FLAGS.num_hosts - 1} "
                             f"(--num_hosts={FLAGS.num_hosts}).")
    if FLAGS.start_step < 0 or FLAGS.steps < 1:
        raise app.UsageError("--start_step must be 0 or more and --steps 1 or more.")
    for line in host_batches(config, FLAGS.num_hosts, FLAGS.host, FLAGS.start_step,
                             FLAGS.steps):
        print(json.dumps(line), flush=True)


def run():
    cli.run(main)


if __name__ == "__main__":
    run()

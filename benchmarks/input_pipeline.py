"""Images per second the training input pipeline delivers on its own, for a config.

    python benchmarks/input_pipeline.py --config=configs/quickstart.py --batches=200
    python benchmarks/input_pipeline.py --config=augreg --config.augment=medium2

The config's augmentation is the pipeline's (`--config.augment`, `--config.cutmix_alpha`, ...:
train/data/augmentation.py). Compare with the `images_per_second` the training loop logs
(workdir/metrics.jsonl): the pipeline should deliver several times what the step consumes, so
training never waits on data.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import machine  # noqa: E402
from absl import app, flags  # noqa: E402

from train.run import config_flag  # noqa: E402

config_flag.define_config_flag("Experiment config (a shipped name or file.py).", "quickstart")
flags.DEFINE_integer("batches", 200, "Batches timed after warm-up.")
flags.DEFINE_integer("repeats", 3, "Timed passes; the median is reported.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import tensorflow as tf

    from train.data import tf_pipeline

    config = FLAGS.config
    builder = tf_pipeline.get_builder(config)
    dataset_fn = tf_pipeline.train_dataset_fn(builder, config)
    dataset = dataset_fn(tf.distribute.InputContext())
    iterator = iter(dataset)
    for _ in range(20):  # warm-up: fills the shuffle buffer and the prefetch queue
        next(iterator)
    rates = []
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        for _ in range(FLAGS.batches):
            next(iterator)
        rates.append(FLAGS.batches * config.batch_size / (time.perf_counter() - start))
    print(machine.describe())
    print(f"{config.dataset} at {config.image_size}px, batch {config.batch_size}, "
          f"{os.cpu_count()} CPU threads: {statistics.median(rates):.0f} images/s "
          f"(median of {FLAGS.repeats} x {FLAGS.batches} batches)")


if __name__ == "__main__":
    app.run(main)

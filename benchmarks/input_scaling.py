"""Input that scales with the hosts: N simulated hosts share one epoch of a JPEG
dataset that the benchmark writes twice, as TFRecord and as ArrayRecord files.

    python benchmarks/input_scaling.py                 # 49,152 224px JPEGs, N = 1, 4, 16, 64
    python benchmarks/input_scaling.py --records=5000 --hosts=1,8
    python benchmarks/input_scaling.py --tables=speed --hosts=1   # images/s only

For each format and host count N, hosts 0 to N-1 run one after the other in this process:
- read amplification over one epoch (`steps = records // batch_size` global batches): the
  records all hosts read (train.input's read counter, what TFDS hands on) and the bytes this
  process read from files (/proc/self/io `rchar`, which also counts what a reader reads to skip
  records inside a TFRecord file), over the records and encoded image bytes the hosts consumed.
  When every host read every record (the input pipeline until each host read its share), it
  was N. It also checks that no example repeats;
- time to the first batch of host 0 (no decoding) at step 0 and at mid-epoch, with what it read;
- images/s of host 0 with the training preprocessing (decode, inception crop, flip, resize to
  224px) through tf.data (train.data.tf_pipeline.train_dataset_fn) and, on ArrayRecord, through
  Grain without TensorFlow (train.data.grain_pipeline.train_batches); and the same for the
  quickstart (the offline default, 28px resized to 32, batch 128).
Counts taken when a host stops include what its pipeline had read ahead (in a run, the next
batches). The files are read from the page cache, and wall-clock figures depend on what else
the machine runs (the load average is printed); the record and byte counts do not.
"""

import argparse
import io
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402
from PIL import Image  # noqa: E402

from configs import common, quickstart  # noqa: E402
from machine import cpu_name  # noqa: E402
from train import input as train_input  # noqa: E402
from train.data import grain_pipeline, records, tf_pipeline  # noqa: E402
from train.data.sources import tfds_catalog  # noqa: E402

FORMATS = ("tfrecord", "array_record")


def synthetic_jpeg(index, size):
    """A JPEG of smooth colour gradients and sensor-like noise, drawn from `index` (about 15 KB
    on average at 224px, 4 to 35 KB; an ImageNet JPEG is larger, about 110 KB)."""
    rng = np.random.default_rng(index)
    cells = int(rng.integers(2, 7))
    grid = rng.integers(0, 256, (cells, cells, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(grid).resize((size, size), Image.BICUBIC), np.float32)
    image += rng.uniform(2, 12) * rng.standard_normal((size, size, 1), np.float32)
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
        out, "JPEG", quality=int(rng.integers(80, 96)))
    return out.getvalue()


class SyntheticJpegs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """`records` JPEGs of `image_size` pixels with 10 labels, one "train" split."""

    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, records, image_size, **kwargs):
        self.records, self.image_size = records, image_size
        super().__init__(**kwargs)

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(self.image_size, self.image_size, 3),
                                         encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=10)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        start = time.perf_counter()
        for index in range(self.records):
            if index and index % 10_000 == 0:
                print(f"  {index} images in {time.perf_counter() - start:.0f} s", flush=True)
            yield index, {"image": synthetic_jpeg(index, self.image_size), "label": index % 10}


def prepared(args, file_format):
    """The dataset in `file_format`, written under --data_dir unless it is there already."""
    data_dir = os.path.join(args.data_dir, f"{args.records}x{args.image_size}px_{args.files}files",
                            file_format)
    builder = SyntheticJpegs(args.records, args.image_size, data_dir=data_dir,
                             file_format=file_format)
    if not builder.is_prepared():
        print(f"Writing {args.records} JPEGs as {file_format} to {data_dir}", flush=True)
        start = time.perf_counter()
        builder.download_and_prepare(file_format=file_format,
                                     download_config=tfds.download.DownloadConfig(
                                         num_shards=args.files))
        print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
    return builder


def rchar():
    """Bytes this process has read through read() and its kin (files and pipes alike)."""
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("rchar:"))


def image_sizes(builder):
    """Encoded image bytes of every record, by record number (train.data.records' ordered read)."""
    split = records.Split(builder, "train")
    lengths = split.read_range(0, split.size).map(
        lambda example: tf.strings.length(example["image"])).batch(4096)
    return np.concatenate(list(lengths.as_numpy_iterator())).astype(np.int64)


def host_run(builder, config, hosts, host, start_step, steps):
    """`(ids consumed, read counts, bytes read, seconds to the first batch, seconds)` of one
    host's `steps` global batches from `start_step`, as `python -m train.input` reads them."""
    before, start = rchar(), time.perf_counter()
    ids, first = [], None
    for line in train_input.host_batches(config, hosts, host, start_step, steps, builder):
        if "ids" in line:
            ids += line["ids"]
            first = first or time.perf_counter() - start
        else:
            counts = line
    return ids, counts, rchar() - before, first, time.perf_counter() - start


def epoch_reads(builder, config, hosts, sizes):
    """Read amplification of one epoch shared by `hosts` hosts (records, bytes)."""
    steps = len(sizes) // config.batch_size
    consumed, read, read_bytes, seconds = [], 0, 0, 0.0
    for host in range(hosts):
        ids, counts, host_bytes, _, host_seconds = host_run(builder, config, hosts, host, 0,
                                                            steps)
        consumed += ids
        read, read_bytes, seconds = (read + counts["records_read"], read_bytes + host_bytes,
                                     seconds + host_seconds)
    if len(set(consumed)) != len(consumed) or len(consumed) != steps * config.batch_size:
        raise AssertionError(f"{hosts} hosts: {len(consumed)} examples consumed, "
                             f"{len(set(consumed))} distinct, expected {steps * config.batch_size}")
    return read / len(consumed), read_bytes / sizes[consumed].sum(), read_bytes, seconds


def first_batches(builder, config, hosts, steps_per_epoch, repeats=3):
    """For step 0 and mid-epoch: (step, median seconds, records read, MB read) of host 0's
    first batch."""
    rows = []
    for step in (0, steps_per_epoch // 2):
        runs = [host_run(builder, config, hosts, 0, step, 1) for _ in range(repeats)]
        _, counts, read_bytes, _, _ = runs[-1]
        seconds = statistics.median(run[4] for run in runs)
        rows.append((step, seconds, counts["records_read"], read_bytes / 1e6))
    return rows


def images_per_second(builder, config, hosts, batches, pipeline="tf.data", workers=0,
                      repeats=3):
    """Host 0 of `hosts` with the full training preprocessing through `pipeline` ("tf.data"
    or "grain", with `workers` processes), after 3 batches of warm-up: the median of `repeats`
    timings of `batches` batches. `builder` None: config.dataset's (Grain: its source)."""
    if pipeline == "grain":
        source = (grain_pipeline.open_split(config, "train_split") if builder is None
                  else tfds_catalog.ArrayRecords(builder, "train"))
        iterator = iter(grain_pipeline.train_batches(source, config, 0, hosts, 0, workers=workers))
    else:
        context = tf.distribute.InputContext(num_input_pipelines=hosts, input_pipeline_id=0,
                                             num_replicas_in_sync=hosts)
        builder = builder or tf_pipeline.get_builder(config)
        iterator = iter(tf_pipeline.train_dataset_fn(builder, config)(context))
    for _ in range(3):
        next(iterator)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batches):
            np.asarray(next(iterator)["image"])
        rates.append(batches * config.batch_size // hosts / (time.perf_counter() - start))
    if hasattr(iterator, "close"):  # Grain's worker processes
        iterator.close()
    return statistics.median(rates)


def read_amplification(builders, config, host_counts, sizes):
    print("Read amplification, one epoch over all hosts (when every host read everything: N)\n")
    print("| format | hosts N | records read / consumed | bytes read / consumed | MB read "
          "| s, all hosts |\n|---|---:|---:|---:|---:|---:|")
    for file_format, builder in builders.items():
        for hosts in host_counts:
            by_records, by_bytes, read_bytes, seconds = epoch_reads(builder, config, hosts, sizes)
            print(f"| {file_format} | {hosts} | {by_records:.3f} | {by_bytes:.3f} | "
                  f"{read_bytes / 1e6:.0f} | {seconds:.1f} |", flush=True)


def first_batch_times(builders, config, host_counts, args, steps, records_count):
    print("\nTime to host 0's first batch (encoded, no decoding), fresh and mid-epoch (median "
          "of 3); TFRecord also with a shuffle buffer of a tenth of the split\n")
    print("| format | shuffle buffer | hosts N | step 0: s | records | MB | step S: s | records "
          "| MB | time ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cases = [(file_format, args.shuffle_buffer) for file_format in FORMATS]
    cases.insert(1, ("tfrecord", records_count // 10))
    for file_format, config.shuffle_buffer in cases:
        for hosts in sorted({host_counts[0], host_counts[-1]}):
            (_, fresh, fresh_records, fresh_mb), (mid, resumed, mid_records, mid_mb) = (
                first_batches(builders[file_format], config, hosts, steps))
            buffer = config.shuffle_buffer if file_format == "tfrecord" else "-"
            print(f"| {file_format} | {buffer} | {hosts} | {fresh:.2f} | {fresh_records} | "
                  f"{fresh_mb:.1f} | {resumed:.2f} (S={mid}) | {mid_records} | {mid_mb:.1f} | "
                  f"{resumed / fresh:.2f} |", flush=True)
    config.shuffle_buffer = args.shuffle_buffer


def speed(builders, config, host_counts, args):
    print(f"\nImages/s of host 0 with decode + inception crop + flip + resize to "
          f"{config.image_size}px, {args.host_batch} per host batch\n")
    print("| format | pipeline | hosts N | images/s per host |\n|---|---|---:|---:|")
    runs = [(file_format, "tf.data", 0) for file_format in FORMATS] + [
        ("array_record", "grain", int(workers)) for workers in args.grain_workers.split(",")]
    for file_format, pipeline, workers in runs:
        for hosts in sorted({host_counts[0], host_counts[-1]}):
            config.batch_size = args.host_batch * hosts
            rate = images_per_second(builders[file_format], config, hosts, args.batches,
                                     pipeline, workers)
            name = f"{pipeline}, {workers} worker processes" if workers else pipeline
            print(f"| {file_format} | {name} | {hosts} | {rate:.0f} |", flush=True)


def quickstart_speed(args):
    print("\nImages/s of the quickstart's input (the offline default: 28px resized to 32, batch "
          "128), one host\n\n| pipeline | images/s |\n|---|---:|")
    config = quickstart.get_config()
    for pipeline in ("tf.data", "grain"):
        rate = images_per_second(None, config, 1, 5 * args.batches, pipeline)
        print(f"| {pipeline} | {rate:.0f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=49_152,
                        help="JPEG records written (49,152: 48 whole global batches of 1024).")
    parser.add_argument("--image_size", type=int, default=224, help="Stored image side, px.")
    parser.add_argument("--data_dir", default=os.path.expanduser(
        "~/.cache/keras_vit/input_scaling"), help="Where the datasets are kept for reuse.")
    parser.add_argument("--files", type=int, default=128,
                        help="Files each format is written as (ImageNet in TFDS: 1,024 train "
                        "files of about 1,250 records).")
    parser.add_argument("--hosts", default="1,4,16,64", help="Simulated host counts.")
    parser.add_argument("--batch_size", type=int, default=1024,
                        help="Global batch of the read tests (a multiple of every host count).")
    parser.add_argument("--shuffle_buffer", type=int, default=common.get_config().shuffle_buffer,
                        help="config.shuffle_buffer (TFRecord: per host, capped at its part).")
    parser.add_argument("--host_batch", type=int, default=64,
                        help="Per-host batch of the images/s test.")
    parser.add_argument("--batches", type=int, default=20, help="Batches timed for images/s.")
    parser.add_argument("--grain_workers", default="0,2",
                        help="config.input_workers of the Grain rows of the images/s table.")
    parser.add_argument("--tables", default="reads,first,speed,quickstart",
                        help="Which tables: reads (amplification), first (time to the first "
                        "batch), speed (images/s), quickstart (images/s on the offline "
                        "default, which needs its files).")
    args = parser.parse_args()
    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read its absl flags
    tables = set(args.tables.split(","))
    host_counts = [int(count) for count in args.hosts.split(",")]
    tfds.disable_progress_bar()
    config = common.get_config()
    config.batch_size, config.shuffle_buffer = args.batch_size, args.shuffle_buffer
    builders = {file_format: prepared(args, file_format) for file_format in FORMATS}
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; load average at start "
          f"{os.getloadavg()[0]:.1f}")
    sizes = image_sizes(builders["tfrecord"])
    steps = len(sizes) // config.batch_size
    print(f"{len(sizes)} records of {args.image_size}px JPEG, {sizes.mean() / 1e3:.1f} KB on "
          f"average ({sizes.sum() / 1e6:.0f} MB) in {args.files} files; global batch "
          f"{config.batch_size}, {steps} steps an epoch ({steps * config.batch_size} records "
          f"consumed); shuffle buffer {config.shuffle_buffer}\n")

    if "reads" in tables:
        read_amplification(builders, config, host_counts, sizes)
    if "first" in tables:
        first_batch_times(builders, config, host_counts, args, steps, len(sizes))
    if "speed" in tables:
        speed(builders, config, host_counts, args)
    if "quickstart" in tables:
        quickstart_speed(args)
    print(f"\nLoad average at the end {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()

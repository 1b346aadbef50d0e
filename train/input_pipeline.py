"""tf.data input for training and evaluation, from any TFDS dataset, a folder of images, or
the offline Fashion-MNIST default.

Train: pick records (still encoded) -> decode -> inception crop -> flip -> resize -> [-1, 1], in
a stream that is a pure function of (seed, step): augmentation uses stateless random ops keyed
by the example's position in the stream, so a resumed run sees exactly the batches an
uninterrupted one would. Eval: decode -> resize -> [-1, 1], padded with masked examples so every
example is counted exactly once with static batch shapes.

Several input pipelines (one per host of a multi-worker run or a TPU pod, one per replica on
several CPU devices): each reads only its own examples (train.records says how each storage
format is read). Random-access storage (ArrayRecord, the offline default, image folders) keeps
one global order, so 1 device, 2 replicas and 2 workers train on the same examples at every
step; TFRecord datasets are read as one consecutive part per pipeline. Sharding is by record,
not by file, so datasets with fewer files than hosts work.
"""

import dataclasses
import math
import re

import tensorflow as tf
import tensorflow_datasets as tfds

from keras_vit.preprocessing import decode_and_resize, decode_image, resize, scale_pixels
from . import records
from .config_checks import FOLDER_PREFIX

DEFAULT_DATASET = "fashion_mnist_local"

# tf.data's autotuning thread sleeps up to a minute between rounds, and deleting an iterator
# that a tf.function consumed can wait for it to wake (TensorFlow 2.21): at the end of the main
# job the process sat idle for 6 to 39 s. The training and evaluation pipelines run without it
# (their AUTOTUNE values then take tf.data's fixed defaults): the main job trained as fast.
WITHOUT_AUTOTUNING = tf.data.Options()
WITHOUT_AUTOTUNING.autotune.enabled = False


@dataclasses.dataclass
class Datasets:
    """What the trainer needs from the data."""

    # Distributed datasets (for one CPU replica the datasets themselves, see _distributed).
    train: object  # {"image", "label"} batches, repeated forever
    eval: object  # {"image", "label", "mask"}; one pass, padded
    eval_examples: int


def get_builder(config, for_training=True):
    """The TFDS builder (or ImageFolder) named by `config.dataset`, prepared if needed.

    Raises ValueError, before any model is built, when the dataset or its splits (train and
    eval) are missing or empty, when a folder dataset holds an unreadable image (named by
    path), or, `for_training`, when the train split is smaller than one batch.
    """
    name = config.dataset
    if name.startswith(FOLDER_PREFIX):
        builder = _folder_builder(name[len(FOLDER_PREFIX):], config)
    else:
        if name == DEFAULT_DATASET:
            from . import fashion_mnist  # noqa: F401  (registers the builder)
        try:
            builder = tfds.builder(name, data_dir=config.data_dir)
        except tfds.core.registered.DatasetNotFoundError as error:
            raise ValueError(
                f"Unknown dataset {name!r}: use a TFDS name (e.g. cifar10, imagenet2012), "
                f"'{FOLDER_PREFIX}/path/to/root' for a folder of images, or "
                f"'{DEFAULT_DATASET}' (offline Fashion-MNIST).") from error
        # The offline default is written as ArrayRecord, for random access (train.records);
        # a dataset already prepared keeps the format it has.
        builder.download_and_prepare(
            file_format="array_record" if name == DEFAULT_DATASET else None)
    check_splits(builder, config, for_training)
    return builder


def _folder_builder(root, config):
    if not tf.io.gfile.isdir(root):
        raise ValueError(f"dataset={config.dataset!r}: {root!r} is not a folder. A folder "
                         "dataset is root/<split>/<class>/<image files>.")
    builder = tfds.folder_dataset.ImageFolder(root)
    if not builder.info.splits:
        raise ValueError(f"dataset={config.dataset!r}: {root} holds no images. A folder "
                         "dataset is root/<split>/<class>/<image files> (.jpg, .jpeg, .png), "
                         f"e.g. {root}/{config.train_split}/cat/1.jpg.")
    check_image_files(sorted(example.image_path for examples in
                             getattr(builder, "_split_examples", {}).values()
                             for example in examples))
    return builder


def check_image_files(paths, threads=8):
    """Decodes every file once; raises ValueError naming the files that are not readable
    images (so that training does not stop on them hours later)."""
    import concurrent.futures
    import time

    from absl import logging

    def problem(path):
        try:
            decode_image(tf.io.read_file(path))
        except (tf.errors.OpError, ValueError) as error:
            message = getattr(error, "message", str(error)).splitlines()[0]
            message = re.sub(r"\{\{.*?\}\}|\[Op:.*$", "", message).strip()
            return f"{path} ({message})"
        return None

    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        bad = [found for found in pool.map(problem, paths) if found]
    logging.info("Checked %d image files in %.1f s.", len(paths), time.time() - start)
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"{len(bad)} of {len(paths)} image files cannot be decoded: {shown}. "
                         "Remove or replace them (PNG or JPEG).")


def check_splits(builder, config, for_training=True):
    """Raises ValueError unless the train and eval splits exist and hold examples (and, for
    training, at least one batch of train examples)."""
    info = builder.info
    sizes = {}
    for field in ("train_split", "eval_split"):
        split = config[field]
        try:
            sizes[field] = info.splits[split].num_examples  # also "train[:90%]" expressions
        except (KeyError, ValueError, AssertionError) as error:
            raise ValueError(f"config.{field}={split!r}: dataset {config.dataset!r} has no "
                             f"such split; it has {sorted(info.splits)} (split expressions "
                             "such as 'train[:90%]' work too).") from error
        if not sizes[field]:
            raise ValueError(f"config.{field}={split!r}: the split of dataset "
                             f"{config.dataset!r} has no examples.")
    if for_training and sizes["train_split"] < config.batch_size:
        raise ValueError(f"config.batch_size={config.batch_size}: the train split "
                         f"{config.train_split!r} has only {sizes['train_split']} examples, "
                         "fewer than one batch; lower batch_size.")


def resized_examples(builder, split, size, count):
    """The first `count` examples of `split` as (float32 image in 0..255 resized to `size`
    (height, width), label), in order: for calibration and analysis, not training."""
    examples = records.Split(builder, split).read_range(0, count)
    return examples.map(
        lambda example: (decode_and_resize(example["image"], size), example["label"]),
        num_parallel_calls=tf.data.AUTOTUNE)


def labelled_batches(builder, split, size, count, batch_size=256):
    """`(images in [-1, 1], labels)` batches of the first `count` examples of `split`, resized
    to `size`, in order: for few-shot features, not training."""
    examples = resized_examples(builder, split, size, count)
    return examples.map(lambda image, label: (to_model_range(image), label)).batch(batch_size)


def host_range(size, num_hosts, host):
    """Host `host`'s part of `size` records, `[start, stop)`: consecutive, sizes differing by
    at most one."""
    return host * size // num_hosts, (host + 1) * size // num_hosts


def share_positions(step, global_batch, num_hosts, host):
    """The stream positions of host `host`'s slice of global batch `step`: with N hosts (input
    pipelines) host p takes positions [p * B / N, (p + 1) * B / N) of each batch of B, the
    examples that a single pipeline would hand to the same replicas."""
    share = global_batch // num_hosts
    return step * global_batch + host * share + tf.range(share, dtype=tf.int64)


def shuffled_record(position, size, seed):
    """The record at `position` (a scalar) of the endless stream over a random-access split of
    `size` records: epoch after epoch, each a permutation of the split drawn from (seed, epoch)
    by `tf.random.experimental.index_shuffle`, so any position is found without reading the ones
    before it (a resume starts at once) and without knowing the number of hosts. (Scalar: the
    op's Python wrapper pads a [n, 2] seed matrix along the wrong axis, TensorFlow 2.21.)"""
    epoch, offset = position // size, position % size
    return tf.random.experimental.index_shuffle(
        offset, tf.stack([tf.constant(seed, tf.int64), epoch]), tf.constant(size - 1, tf.int64))


def to_model_range(image, dtype=tf.float32):
    """uint8 or float pixels in [0, 255] to [-1, 1], as the original (static shape kept)."""
    image = tf.ensure_shape(image, (image.shape[0], image.shape[1], 3))
    return tf.cast(scale_pixels(tf.cast(image, tf.float32)), dtype)


def preprocess_train(encoded, seed, image_size, crop_min_area, flip, dtype=tf.float32):
    """Inception crop (area in [crop_min_area, 1], aspect 3/4 to 4/3) + flip + resize.

    `seed` is a shape-[2] int tensor; the same seed gives the same augmentation.
    """
    image = decode_image(encoded)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_seed, min_object_covered=0.0, area_range=(crop_min_area, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3), max_attempts=10, use_image_if_no_bounding_boxes=True)
    image = tf.slice(image, begin, size)
    image = resize(image, (image_size, image_size))
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return to_model_range(image, dtype)


def preprocess_eval(encoded, image_size, dtype=tf.float32):
    """Decode + resize + [-1, 1]: what the exported SavedModel does to an image file."""
    return to_model_range(decode_and_resize(encoded, (image_size, image_size)), dtype)


# Folded into an example's seed for its patch corruption (masked patch prediction), so that
# the corruption is independent of the augmentation.
CORRUPTION_SEED_SALT = 0x4D5050


def with_corruption(example, seed, config, num_patches):
    """Adds the masked-patch-prediction inputs `corruption` and `source` to `example` (see
    train.masking), drawn from `seed`; unchanged when `num_patches` is None."""
    if num_patches is None:
        return example
    from . import masking

    corruption, source = masking.draw_corruption(
        tf.random.experimental.stateless_fold_in(seed, CORRUPTION_SEED_SALT), num_patches,
        config.mpp_corruption_rate, config.mpp_mask_rate, config.mpp_random_rate)
    return dict(example, corruption=corruption, source=source)


def global_seed(config):
    """The run's global random seed (`keras.utils.set_random_seed`), which the trainer sets and
    the train stream builds its shuffles under: `config.seed + 1`, the seed of earlier runs (a
    global seed of 0 once broke the stream's shuffles, which now set their own op seeds)."""
    return config.seed + 1


def train_dataset_fn(builder, config, start_step=0, dtype=tf.float32, num_patches=None):
    """Returns `fn(input_context)` for `strategy.distribute_datasets_from_function`.

    The global stream is epoch after epoch of the train split; global batch s is its positions
    [s * B, (s + 1) * B), and each input pipeline (host) reads only its slice of every batch
    (see `share_positions`). The example at position i gets augmentation seed (config.seed, i)
    (and, given `num_patches`, its patch corruption for masked patch prediction from the same
    seed), so the stream is a pure function of (config.seed, step).

    Random-access storage (ArrayRecord, image folders): each epoch is an index shuffle of the
    whole split (`shuffled_record`); the hosts read nothing but their own examples, the batches
    do not depend on the number of hosts, and starting at `start_step` costs nothing.
    TFRecord: each host reads its own consecutive part of the split (`host_range`), shuffled
    each epoch with a buffer of `config.shuffle_buffer` examples; the order then depends on the
    number of hosts, and starting at `start_step` reads (without decoding) up to one epoch of
    the host's part.
    """
    split = records.Split(builder, config.train_split)

    def dataset_fn(input_context):
        hosts, host = input_context.num_input_pipelines, input_context.input_pipeline_id
        per_replica = input_context.get_per_replica_batch_size(config.batch_size)
        stream = train_examples(split, config, start_step, hosts, host)

        def preprocess(position, example):
            seed = tf.stack([tf.constant(config.seed, tf.int64), position])
            image = preprocess_train(example["image"], seed, config.image_size,
                                     config.crop_min_area, config.flip, dtype)
            return with_corruption({"image": image, "label": tf.cast(example["label"], tf.int32)},
                                   seed, config, num_patches)

        stream = stream.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        stream = stream.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        return stream.with_options(WITHOUT_AUTOTUNING)

    return dataset_fn


def train_positions(config, start_step, hosts, host):
    """The global stream positions this host reads, from `start_step` on, one at a time."""
    steps = tf.data.Dataset.range(start_step, 2**62)
    return steps.map(lambda step: share_positions(step, config.batch_size, hosts, host)).unbatch()


def train_examples(split, config, start_step, hosts, host):
    """`(position, example)` of host `host` of `hosts` from global batch `start_step` on, the
    image still encoded: what `train_dataset_fn` preprocesses (and `python -m train.input`
    shows)."""
    check_host_share(split, config.batch_size, hosts, host)
    if split.random_access:
        return _global_order(split, config, start_step, hosts, host)
    return _host_order(split, config, start_step, hosts, host)


def _global_order(split, config, start_step, hosts, host):
    """`(position, example)` for this host's positions, read at random (`shuffled_record`)."""
    positions = train_positions(config, start_step, hosts, host)
    record_numbers = positions.map(lambda position: shuffled_record(position, split.size,
                                                                    config.seed))
    examples = split.read_at(record_numbers.batch(records.READ_CHUNK))
    return tf.data.Dataset.zip(positions, examples)


def _host_order(split, config, start_step, hosts, host):
    """`(position, example)` for this host from its own consecutive part of a sequential
    (TFRecord) split. Each epoch reads the part's file pieces in an order drawn from (seed,
    epoch, host), in windows of about `config.shuffle_buffer` records (several pieces read in
    turn), each shuffled on its own with a seed of its own. A start at any step reads its window
    from the beginning: about one shuffle buffer, what a fresh start reads before its first
    batch (more where one file holds more than a window)."""
    start, stop = host_range(split.size, hosts, host)
    pieces = split.pieces(start, stop)
    count, part_size = len(pieces.takes), stop - start
    per_window = max(1, min(count, round(config.shuffle_buffer / (part_size / count))))
    windows = math.ceil(count / per_window)
    seed = config.seed * 1_000_003 + host
    first = start_step * (config.batch_size // hosts)  # counted in this host's own stream
    first_epoch, offset = divmod(first, part_size)

    def piece_order(epoch):
        return tf.random.experimental.index_shuffle(
            tf.range(count, dtype=tf.int64), tf.stack([tf.constant(seed, tf.int64), epoch]),
            tf.constant(count - 1, tf.int64))

    def window_ends(order):  # the cumulative record counts of the epoch's windows
        sizes = tf.math.segment_sum(tf.gather(tf.constant(pieces.takes), order),
                                    tf.range(count, dtype=tf.int64) // per_window)
        return tf.cumsum(sizes)

    def window(epoch, order, index):
        chosen = order[index * per_window:(index + 1) * per_window]
        examples = tf.data.Dataset.from_tensor_slices(chosen).interleave(
            lambda piece: split.read_piece(pieces, piece), cycle_length=per_window,
            block_length=1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # The order depends on config.seed alone, not on the global seed of the caller
        # (tf.random.set_seed), which tf.data pairs with the op seed; with a global seed of 0
        # it even failed to build a shuffle of a tensor seed.
        tf.compat.v1.get_default_graph().seed = global_seed(config)
        return examples.shuffle(config.shuffle_buffer,
                                seed=(seed * 100_003 + epoch) * windows + index)

    def one_epoch(epoch, first_window):
        order = piece_order(epoch)
        return tf.data.Dataset.range(first_window, windows).flat_map(
            lambda index: window(epoch, order, index))

    # The window that holds the first position, and how far into it the position lies.
    ends = window_ends(piece_order(tf.constant(first_epoch, tf.int64)))
    first_window = tf.searchsorted(ends, tf.constant([offset], tf.int64), side="right",
                                   out_type=tf.int64)[0]
    skip = offset - tf.concat([[0], ends], 0)[first_window]
    epochs = tf.data.Dataset.range(first_epoch, 2**62)
    stream = epochs.flat_map(lambda epoch: one_epoch(
        epoch, tf.where(epoch == first_epoch, first_window, tf.constant(0, tf.int64))))
    positions = train_positions(config, start_step, hosts, host)
    return tf.data.Dataset.zip(positions, stream.skip(skip))


def check_host_share(split, global_batch, hosts, host):
    """Raises ValueError unless `host` is one of `hosts` and its part of `split` holds at least
    its share of one global batch."""
    if not 0 <= host < hosts:
        raise ValueError(f"Input host {host} does not exist: the hosts are 0 to {hosts - 1}.")
    if global_batch % hosts:
        raise ValueError(f"The global batch of {global_batch} does not divide over {hosts} "
                         "hosts (input pipelines): make it a multiple of their number.")
    start, stop = host_range(split.size, hosts, host)
    if stop - start < global_batch // hosts:
        raise ValueError(f"Split {split} has {split.size} examples, fewer than one global batch "
                         f"of {global_batch} ({global_batch // hosts} on each of {hosts} hosts): "
                         "lower batch_size or use a larger split.")


def eval_dataset_fn(builder, config, dtype=tf.float32, num_patches=None):
    """Returns `fn(input_context)`: every eval example once across all pipelines (each reads a
    consecutive part of the split, `host_range`), padded with `mask` 0 to whole global batches
    (given `num_patches`, with the same patch corruption at every evaluation).

    All input pipelines yield the same number of batches, so replicas stay in step.
    """
    split = records.Split(builder, config.eval_split)

    def dataset_fn(input_context):
        hosts, host = input_context.num_input_pipelines, input_context.input_pipeline_id
        per_replica = input_context.get_per_replica_batch_size(config.eval_batch_size)
        share = config.eval_batch_size // hosts
        steps = eval_steps(split.size, config.eval_batch_size, hosts)
        examples = split.read_range(*host_range(split.size, hosts, host))

        def preprocess(example):
            seed = tf.stack([tf.constant(config.seed, tf.int64), example["id"]])
            return with_corruption(
                {"image": preprocess_eval(example["image"], config.image_size, dtype),
                 "label": tf.cast(example["label"], tf.int32), "mask": tf.constant(1.0)},
                seed, config, num_patches)

        examples = examples.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        blank = with_corruption(
            {"image": tf.zeros((config.image_size, config.image_size, 3), dtype),
             "label": tf.constant(0, tf.int32), "mask": tf.constant(0.0)},
            tf.constant([0, 0], tf.int64), config, num_patches)
        padding = tf.data.Dataset.from_tensors(blank).repeat()
        examples = examples.concatenate(padding).take(steps * share)
        examples = examples.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        return examples.with_options(WITHOUT_AUTOTUNING)

    return dataset_fn


def eval_steps(size, global_batch, hosts):
    """Evaluation batches: enough for the largest host part of `size` examples."""
    return math.ceil(math.ceil(size / hosts) / (global_batch // hosts))


def _replicas_on_cpus(strategy):
    """Whether `strategy` runs in this process alone and all its replicas are CPUs."""
    if not isinstance(strategy, (tf.distribute.OneDeviceStrategy, tf.distribute.MirroredStrategy)):
        return False  # a TPU, several workers, or the default strategy (no devices to ask)
    return all(tf.DeviceSpec.from_string(device).device_type == "CPU"
               for device in strategy.extended.worker_devices)


def _distributed(strategy, dataset_fn):
    """`strategy.distribute_datasets_from_function(dataset_fn)`, without the pipeline per device
    that it adds to prefetch into device memory where the replicas are CPUs (they have none):
    that pipeline is autotuned (see WITHOUT_AUTOTUNING), and deleting its iterator at the end of
    a run with 2 CPU replicas waited 18 to 30 s. One CPU replica reads the dataset itself; several
    read a pipeline each, which keeps its share of every global batch."""
    if not _replicas_on_cpus(strategy):
        return strategy.distribute_datasets_from_function(dataset_fn)
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return dataset_fn(tf.distribute.InputContext())
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False)
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def get_datasets(config, strategy, start_step=0, dtype=tf.float32, builder=None,
                 num_patches=None):
    """Builds the distributed train and eval datasets for `strategy` (from `builder`, as
    `get_builder(config)` returns it, default the one `config.dataset` names). Given
    `num_patches` (masked patch prediction), every example carries its patch corruption."""
    for field in ("batch_size", "eval_batch_size"):
        if config[field] % strategy.num_replicas_in_sync:
            raise ValueError(f"{field} {config[field]} is not divisible by the "
                             f"{strategy.num_replicas_in_sync} replicas.")
    builder = builder or get_builder(config)  # get_builder checks the splits
    train_fn = train_dataset_fn(builder, config, start_step, dtype, num_patches)
    eval_fn = eval_dataset_fn(builder, config, dtype, num_patches)
    return Datasets(
        train=_distributed(strategy, train_fn),
        eval=_distributed(strategy, eval_fn),
        eval_examples=builder.info.splits[config.eval_split].num_examples,
    )


def get_process_datasets(config, num_processes, process_index, start_step=0, dtype=tf.float32,
                         builder=None, num_patches=None):
    """This process's train and eval datasets, for an engine that feeds its own devices (JAX):
    batches of its share of every global batch, `batch_size / num_processes` examples (the
    examples that tf.distribute gives the same process's replicas)."""
    for field in ("batch_size", "eval_batch_size"):
        if config[field] % num_processes:
            raise ValueError(f"config.{field}={config[field]} is not divisible by the "
                             f"{num_processes} processes.")
    builder = builder or get_builder(config)
    context = tf.distribute.InputContext(num_input_pipelines=num_processes,
                                         input_pipeline_id=process_index,
                                         num_replicas_in_sync=num_processes)
    return Datasets(
        train=train_dataset_fn(builder, config, start_step, dtype, num_patches)(context),
        eval=eval_dataset_fn(builder, config, dtype, num_patches)(context),
        eval_examples=builder.info.splits[config.eval_split].num_examples,
    )

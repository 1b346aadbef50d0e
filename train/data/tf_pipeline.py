"""tf.data input for training and evaluation, from any TFDS dataset, a folder of images, or
the offline Fashion-MNIST default.

Train: pick records (still encoded) -> decode -> inception crop -> flip -> resize [->
RandAugment] -> [-1, 1] [-> random erasing] -> batch [-> Mixup/CutMix of neighbouring pairs]
(the bracketed steps where the config asks: train/data/augmentation.py), in a stream that is a pure
function of (seed, step): augmentation uses stateless random ops keyed by the example's position
in the stream (a pair's by the pair's), so a resumed run sees exactly the batches an
uninterrupted one would. Eval: decode -> resize -> [-1, 1], padded with masked examples so every
example is counted exactly once with static batch shapes.

Several input pipelines (one per host of a multi-worker run or a TPU pod, one per replica on
several CPU devices): each reads only its own examples (train.data.records says how each storage
format is read). Random-access storage (ArrayRecord, the offline default, image folders) keeps
one global order, so 1 device, 2 replicas and 2 workers train on the same examples at every
step; TFRecord datasets are read as one consecutive part per pipeline. Sharding is by record,
not by file, so datasets with fewer files than hosts work.
"""

import dataclasses
import functools

import tensorflow as tf

from keras_vit.preprocessing import decode_and_resize, decode_image, resize, scale_pixels
from . import input_order, input_plan, records, settings, sources, stream, tf_native


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
    """The TFDS builder (or ImageFolder) of `config.dataset` (train.data.sources), prepared if
    needed.

    Raises ValueError, before any model is built, when the dataset or its splits (train and
    eval) are missing or empty, when a folder dataset holds an unreadable image (named by
    path), or, `for_training`, when the train split is smaller than one batch.
    """
    builder = sources.of(config).builder()
    check_splits(builder, config, for_training)
    return builder


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


def to_model_range(image, dtype=tf.float32):
    """uint8 or float pixels in [0, 255] to [-1, 1], as the original (static shape kept)."""
    image = tf.ensure_shape(image, (image.shape[0], image.shape[1], 3))
    return tf.cast(scale_pixels(tf.cast(image, tf.float32)), dtype)


# Folded into an example's seed for its RandAugment and random erasing, so that the crop and
# flip of a run without them stay what they were.
AUGMENT_SEED_SALT = 0x524155


def cropped(encoded, seed, crop_min_area, flip, draws=None):
    """The decoded image (uint8), cropped and flipped as `preprocess_train` does."""
    image = decode_image(encoded)
    if crop_min_area < 1.0 or flip:
        if draws is None:
            draws = crop_draws(seed[1:], seed[0])[0]
        top, left, height, width, flipped = crop_box(tf.shape(image), draws, crop_min_area)
        image = image[top:top + height, left:left + width]
        if flip:
            image = tf.cond(flipped, lambda: tf.reverse(image, [1]), lambda: image)
    return image


def preprocess_train(encoded, seed, image_size, crop_min_area, flip, dtype=tf.float32,
                     augmentation=None, draws=None):
    """Inception crop (area in [crop_min_area, 1], aspect 3/4 to 4/3) + flip + resize, then
    the `augmentation` (train.data.augmentation.Augmentation) of one image: RandAugment, and random
    erasing after the scaling to [-1, 1] (Mixup and CutMix mix batches: `mix_pairs`).

    `seed` is a shape-[2] int tensor (config.seed, stream position); the same seed gives the
    same augmentation. The crop and flip are `stream.crop_box` of the position's
    `stream.crop_draws` (`draws`, computed here when not given), as the Grain pipeline draws
    them.
    """
    image = resize(cropped(encoded, seed, crop_min_area, flip, draws), (image_size, image_size))
    if augmentation is None or not (augmentation.randaugment_layers
                                    or augmentation.random_erasing):
        return to_model_range(image, dtype)
    from . import randaugment

    augment_seed, erasing_seed = tf.unstack(tf.random.experimental.stateless_split(
        tf.random.experimental.stateless_fold_in(seed, AUGMENT_SEED_SALT), 2))
    if augmentation.randaugment_layers:
        image = randaugment.rand_augment(image, augment_seed, augmentation.randaugment_layers,
                                         augmentation.randaugment_magnitude)
    image = to_model_range(image)
    if augmentation.random_erasing:
        image = randaugment.random_erasing(image, erasing_seed, augmentation.random_erasing)
    return tf.cast(image, dtype)


def crop_draws(positions, seed):
    """`stream.crop_draws` of a vector of stream positions, in a TensorFlow graph."""
    draws = tf.numpy_function(lambda positions, seed: stream.crop_draws(positions, seed),
                              [positions, seed], tf.float64, stateful=False)
    return tf.ensure_shape(draws, [positions.shape[0], 4 * stream.CROP_TRIES + 1])


def crop_box(shape, draws, min_area):
    """`stream.crop_box` in TensorFlow ops (the same float64 arithmetic, so the same box): the
    int32 `(top, left, height, width)` and the flip of an image of `shape` [height, width, C]."""
    height, width = tf.cast(shape[0], tf.float64), tf.cast(shape[1], tf.float64)
    tries = tf.reshape(draws[:4 * stream.CROP_TRIES], [stream.CROP_TRIES, 4])
    area = (min_area + tries[:, 0] * (1.0 - min_area)) * height * width
    aspect = 3 / 4 + tries[:, 1] * (4 / 3 - 3 / 4)
    crop_height = tf.floor(tf.sqrt(area / aspect) + 0.5)
    crop_width = tf.floor(crop_height * aspect + 0.5)
    fits = ((crop_height >= 1) & (crop_height <= height) & (crop_width >= 1)
            & (crop_width <= width))
    first = tf.argmax(tf.cast(fits, tf.int32))  # the first that fits
    found = tf.reduce_any(fits)
    crop_height = tf.where(found, crop_height[first], height)
    crop_width = tf.where(found, crop_width[first], width)
    top = tf.where(found, tf.floor(tries[first, 2] * (height - crop_height + 1)), 0.0)
    left = tf.where(found, tf.floor(tries[first, 3] * (width - crop_width + 1)), 0.0)
    box = [tf.cast(value, tf.int32) for value in (top, left, crop_height, crop_width)]
    return (*box, draws[4 * stream.CROP_TRIES] < 0.5)


def preprocess_eval(encoded, image_size, dtype=tf.float32, preprocessing=None):
    """Decode + resize (as `preprocessing`, a keras_vit.EvalPreprocessing; None: keras_vit's
    own) + [-1, 1]: what the exported SavedModel does to an image file."""
    return to_model_range(decode_and_resize(encoded, (image_size, image_size), preprocessing),
                          dtype)


# Folded into an example's seed for its patch corruption (masked patch prediction), so that
# the corruption is independent of the augmentation.
CORRUPTION_SEED_SALT = 0x4D5050


def with_corruption(example, seed, config, num_patches):
    """Adds the masked-patch-prediction inputs `corruption` and `source` to `example` (see
    train.data.masking), drawn from `seed`; unchanged when `num_patches` is None."""
    if num_patches is None:
        return example
    from . import masking

    corruption, source = masking.draw_corruption(
        tf.random.experimental.stateless_fold_in(seed, CORRUPTION_SEED_SALT), num_patches,
        config.mpp_corruption_rate, config.mpp_mask_rate, config.mpp_random_rate)
    return dict(example, corruption=corruption, source=source)


def train_dataset_fn(builder, config, start_step=0, dtype=tf.float32, num_patches=None,
                     native=None):
    """Returns `fn(input_context)` for `strategy.distribute_datasets_from_function`.

    The global stream is epoch after epoch of the train split; global batch s is its positions
    [s * B, (s + 1) * B), and each input pipeline (host) reads only its slice of every batch
    (see `share_positions`). The example at position i gets augmentation seed (config.seed, i)
    (and, given `num_patches`, its patch corruption for masked patch prediction from the same
    seed), so the stream is a pure function of (config.seed, step).

    Random-access storage (ArrayRecord, image folders): each epoch is an index shuffle of the
    whole split (`input_order.shuffled_records`); the hosts read nothing but their own
    examples, the batches do not depend on the number of hosts, and starting at `start_step`
    costs nothing.
    TFRecord: each host reads its own consecutive part of the split (`records.Split.part`) in
    shuffled windows of about `config.shuffle_buffer` examples (`input_order._host_order`);
    the order then depends on the number of hosts, and starting at `start_step` reads one
    window.

    Given `native` (a train.data.native_input.Plan), each image keeps its aspect ratio within
    its budget of patches (train.data.tf_native), and "packed" packs each batch's images.
    """
    from . import augmentation, mixing

    split = records.Split(builder, config.train_split)
    chosen = augmentation.of(config)  # train.data.augmentation.Augmentation

    def dataset_fn(input_context):
        hosts, host = input_context.num_input_pipelines, input_context.input_pipeline_id
        per_replica = input_context.get_per_replica_batch_size(config.batch_size)
        if chosen.mixes and per_replica % 2:  # pairs of positions must share a batch
            raise ValueError(f"Mixup and CutMix need an even batch per replica, not "
                             f"{per_replica}: change config.batch_size.")
        examples = input_order.train_examples(split, config, start_step, hosts, host)
        if native is not None:
            examples = tf_native.with_budgets(examples, config.seed, native)
        if config.crop_min_area < 1.0 or config.flip:  # the crops' numbers, a chunk at a time
            examples = examples.batch(records.READ_CHUNK).map(
                lambda positions, chunk: (positions, chunk,
                                          crop_draws(positions, config.seed))).unbatch()

        def preprocess(position, example, draws=None):
            seed = tf.stack([tf.constant(config.seed, tf.int64), position])
            if native is not None:
                image = cropped(example["image"], seed, config.crop_min_area, config.flip, draws)
                return tf_native.pending(image, example["label"], native, example.get("budget"))
            image = preprocess_train(example["image"], seed, config.image_size,
                                     config.crop_min_area, config.flip, dtype, chosen, draws)
            example = {"image": image, "label": tf.cast(example["label"], tf.int32)}
            if chosen.mixes:
                example["mix_params"] = mixing.mix_params(
                    mixing.pair_seed(config.seed, position), config.image_size,
                    config.image_size, chosen)
            return with_corruption(example, seed, config, num_patches)

        examples = examples.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=True)
        if native is not None:
            examples = tf_native.sized(examples, native)
        batches = examples.batch(per_replica, drop_remainder=True)
        if native is not None and native.mode == "packed":
            batches = batches.map(functools.partial(tf_native.packed, plan=native),
                                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if chosen.mixes:
            batches = batches.map(mixing.mix_pairs, num_parallel_calls=tf.data.AUTOTUNE,
                                  deterministic=True)
        batches = batches.prefetch(tf.data.AUTOTUNE)
        return batches.with_options(WITHOUT_AUTOTUNING)

    return dataset_fn


def eval_dataset_fn(builder, config, dtype=tf.float32, num_patches=None, native=None):
    """Returns `fn(input_context)`: every eval example once across all pipelines (each reads a
    consecutive part of the split, `records.Split.part`), padded with `mask` 0 to whole global
    batches
    (given `num_patches`, with the same patch corruption at every evaluation).

    All input pipelines yield the same number of batches, so replicas stay in step.
    """
    split = records.Split(builder, config.eval_split)
    resize = settings.eval_preprocessing(config)

    def dataset_fn(input_context):
        hosts, host = input_context.num_input_pipelines, input_context.input_pipeline_id
        per_replica = input_context.get_per_replica_batch_size(config.eval_batch_size)
        share = config.eval_batch_size // hosts
        steps = input_order.eval_steps(split, config.eval_batch_size, hosts)
        examples = split.read_range(*split.part(hosts, host))

        def preprocess(example):
            seed = tf.stack([tf.constant(config.seed, tf.int64), example["id"]])
            if native is not None:  # each image alone, at the whole budget
                return tf_native.pending(decode_image(example["image"]), example["label"],
                                         native, mask=tf.constant(1.0))
            return with_corruption(
                {"image": preprocess_eval(example["image"], config.image_size, dtype, resize),
                 "label": tf.cast(example["label"], tf.int32), "mask": tf.constant(1.0)},
                seed, config, num_patches)

        examples = examples.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        if native is not None:
            examples = tf_native.sized(examples, native)
        blank = with_corruption(
            {"image": tf.zeros((config.image_size, config.image_size, 3), dtype),
             "label": tf.constant(0, tf.int32), "mask": tf.constant(0.0)},
            tf.constant([0, 0], tf.int64), config, num_patches)
        if native is not None:
            blank = dict(tf_native.blank(native), mask=tf.constant(0.0))
        padding = tf.data.Dataset.from_tensors(blank).repeat()
        examples = examples.concatenate(padding).take(steps * share)
        examples = examples.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        return examples.with_options(WITHOUT_AUTOTUNING)

    return dataset_fn


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
                 num_patches=None, native=None):
    """Builds the distributed train and eval datasets for `strategy` (from `builder`, as
    `get_builder(config)` returns it, default the one `config.dataset` names). Given
    `num_patches` (masked patch prediction), every example carries its patch corruption; given
    `native` (train.data.native_input.Plan), each image keeps its aspect ratio."""
    for field in ("batch_size", "eval_batch_size"):
        if config[field] % strategy.num_replicas_in_sync:
            raise ValueError(f"{field} {config[field]} is not divisible by the "
                             f"{strategy.num_replicas_in_sync} replicas.")
    builder = builder or get_builder(config)  # get_builder checks the splits
    if native is not None and native.mode == "packed" and (
            native.sequences % strategy.num_replicas_in_sync):
        raise ValueError(f"config.pack_sequences={native.sequences} is not divisible by the "
                         f"{strategy.num_replicas_in_sync} replicas.")
    train_fn = train_dataset_fn(builder, config, start_step, dtype, num_patches, native)
    eval_fn = eval_dataset_fn(builder, config, dtype, num_patches, native)
    return Datasets(
        train=_distributed(strategy, train_fn),
        eval=_distributed(strategy, eval_fn),
        eval_examples=builder.info.splits[config.eval_split].num_examples,
    )


def process_input(config, num_processes, process_index, builder=None):
    """This process's input for an engine that feeds its own devices (JAX), as
    `input_plan.ProcessInput`: NumPy batches of its share of every global batch,
    `batch_size / num_processes` examples (the examples that tf.distribute gives the same
    process's replicas)."""
    builder = builder or get_builder(config)
    context = tf.distribute.InputContext(num_input_pipelines=num_processes,
                                         input_pipeline_id=process_index,
                                         num_replicas_in_sync=num_processes)

    def train(start_step, num_patches=None, native=None):
        dataset_fn = train_dataset_fn(builder, config, start_step, num_patches=num_patches,
                                      native=native)
        return dataset_fn(context).as_numpy_iterator()

    @functools.cache  # built once: each evaluation is a new pass over it
    def eval_dataset(num_patches, native):
        return eval_dataset_fn(builder, config, num_patches=num_patches, native=native)(context)

    def evaluate(num_patches=None, native=None):
        return eval_dataset(num_patches, native).as_numpy_iterator()

    return input_plan.ProcessInput(
        class_names=input_plan.class_names(builder.info.features["label"]),
        eval_examples=builder.info.splits[config.eval_split].num_examples,
        train=train, eval=evaluate)

"""Which examples each host reads at each step: the order of the training stream and how
every global batch and the eval split are divided among the hosts (input pipelines).

Global batch s is positions [s * B, (s + 1) * B) of the stream; host k of N reads positions
[k * B / N, (k + 1) * B / N) of each batch (`share_positions`). On random-access storage the
position picks its record through an index shuffle of the whole split (`shuffled_records`), the
same for any N and the same as the Grain pipeline's (`train.data.stream`); on TFRecord each
host reads its own consecutive part (`records.Split.part`) in shuffled windows
(`_host_order`). Either way a start at any step needs no pass over
earlier positions.
"""

import math

import tensorflow as tf

from . import input_plan, records, stream


def share_positions(step, global_batch, num_hosts, host):
    """The stream positions of host `host`'s slice of global batch `step`: with N hosts (input
    pipelines) host p takes positions [p * B / N, (p + 1) * B / N) of each batch of B, the
    examples that a single pipeline would hand to the same replicas."""
    first = input_plan.first_position(step, global_batch, num_hosts, host)
    return first + tf.range(global_batch // num_hosts, dtype=tf.int64)


def shuffled_records(positions, size, seed):
    """The records at `positions` (a vector) of the endless stream over a random-access split
    of `size` records: `stream.records_at`, the order the Grain pipeline reads too, run as
    NumPy inside the tf.data graph (`tf.numpy_function`, on the host that reads the data: a
    TPU VM's or a worker's own Python process)."""
    records_at = tf.numpy_function(lambda positions: stream.records_at(positions, size, seed),
                                   [positions], tf.int64, stateful=False)
    return tf.ensure_shape(records_at, positions.shape)


def train_positions(config, start_step, hosts, host):
    """The global stream positions this host reads, from `start_step` on: a vector a step."""
    steps = tf.data.Dataset.range(start_step, 2**62)
    return steps.map(lambda step: share_positions(step, config.batch_size, hosts, host))


def train_examples(split, config, start_step, hosts, host):
    """`(position, example)` of host `host` of `hosts` from global batch `start_step` on, the
    image still encoded: what `train_dataset_fn` preprocesses (and `python -m train.input`
    shows)."""
    check_host_share(split, config.batch_size, hosts, host)
    if split.random_access:
        return _global_order(split, config, start_step, hosts, host)
    return _host_order(split, config, start_step, hosts, host)


def _global_order(split, config, start_step, hosts, host):
    """`(position, example)` for this host's positions, read at random (`shuffled_records`)."""
    positions = train_positions(config, start_step, hosts, host)
    record_numbers = positions.map(
        lambda step_positions: shuffled_records(step_positions, split.size, config.seed))
    examples = split.read_at(record_numbers.unbatch().batch(records.READ_CHUNK))
    return tf.data.Dataset.zip(positions.unbatch(), examples)


def _host_order(split, config, start_step, hosts, host):
    """`(position, example)` for this host from its own consecutive part of a sequential
    (TFRecord) split. Each epoch reads the part's file pieces in an order drawn from (seed,
    epoch, host), in windows of about `config.shuffle_buffer` records (several pieces read in
    turn), each shuffled on its own with a seed of its own. A start at any step reads its window
    from the beginning: about one shuffle buffer, what a fresh start reads before its first
    batch (more where one file holds more than a window)."""
    start, stop = split.part(hosts, host)
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
        tf.compat.v1.get_default_graph().seed = input_plan.global_seed(config)
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
    return tf.data.Dataset.zip(positions.unbatch(), stream.skip(skip))


def check_host_share(split, global_batch, hosts, host):
    """Raises ValueError unless `host` is one of `hosts` and its part of `split` holds at least
    its share of one global batch (see `input_plan.check_host_share`)."""
    input_plan.check_host_share(split, split.size, split.part_bounds(hosts), global_batch, hosts,
                                host)


def eval_steps(split, global_batch, hosts):
    """Evaluation batches: enough for the largest host part of `split`."""
    return input_plan.eval_steps(split.part_bounds(hosts), global_batch, hosts)

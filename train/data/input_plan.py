"""Which stream positions and records each host reads, in plain Python: the arithmetic that the
tf.data pipeline (train.data.input_order) and the TensorFlow-free Grain pipeline
(train.data.grain_pipeline) share, and what either hands the JAX engine (`ProcessInput`).

Global batch s is positions [s * B, (s + 1) * B) of the training stream; host k of N reads
positions [s * B + k * B / N, s * B + (k + 1) * B / N), the examples that a single pipeline
would hand to the same devices. Evaluation: host k reads its own consecutive part of the split.
"""

import dataclasses
import math
from typing import Callable


def global_seed(config):
    """The run's global random seed (`keras.utils.set_random_seed`), which the engines set and
    the tf.data train stream builds its shuffles under: `config.seed + 1`, the seed of earlier
    runs (a global seed of 0 once broke the stream's shuffles, which now set their own op
    seeds)."""
    return config.seed + 1


def class_names(label):
    """The class names of a TFDS `ClassLabel` feature; its indices as names where it has none."""
    return list(label.names) or [str(index) for index in range(label.num_classes)]


def first_position(step, global_batch, hosts, host):
    """The first stream position of host `host`'s share of global batch `step`."""
    return step * global_batch + host * (global_batch // hosts)


def equal_bounds(size, hosts):
    """Where each of `hosts` equal consecutive parts of `size` records starts, and the end
    (part sizes differ by at most one)."""
    return [k * size // hosts for k in range(hosts + 1)]


def eval_steps(bounds, global_batch, hosts):
    """Evaluation batches for parts `bounds`: enough for the largest part."""
    largest = max(high - low for low, high in zip(bounds, bounds[1:]))
    return math.ceil(largest / (global_batch // hosts))


def check_host_share(split_name, size, bounds, global_batch, hosts, host):
    """Raises ValueError unless `host` is one of `hosts`, the global batch divides over them
    and host `host`'s part (`bounds`) of split `split_name` (`size` records) holds at least its
    share of one global batch."""
    if not 0 <= host < hosts:
        raise ValueError(f"Input host {host} does not exist: the hosts are 0 to {hosts - 1}.")
    if global_batch % hosts:
        raise ValueError(f"The global batch of {global_batch} does not divide over {hosts} "
                         "hosts (input pipelines): make it a multiple of their number.")
    if bounds[host + 1] - bounds[host] < global_batch // hosts:
        raise ValueError(f"Split {split_name} has {size} examples, fewer than one global batch "
                         f"of {global_batch} ({global_batch // hosts} on each of {hosts} hosts): "
                         "lower batch_size or use a larger split.")


@dataclasses.dataclass
class ProcessInput:
    """What the JAX engine reads in one process, from either pipeline
    (`grain_pipeline.process_input`, `tf_pipeline.process_input`): the classes, and the
    process's share of every train and eval batch as NumPy dicts."""

    class_names: list
    eval_examples: int
    # train(start_step, num_patches, native) -> endless iterator of batches; num_patches: masked
    # patch prediction's corruption; native: a train.data.native_input.Plan.
    train: Callable
    eval: Callable  # eval(num_patches, native) -> the eval batches, one pass

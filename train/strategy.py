"""tf.distribute set-up: TPU, mirrored GPUs (or split CPUs), multi-worker, or one device."""

import tensorflow as tf
from absl import logging

STRATEGIES = ("tpu", "mirrored", "multi_worker", "one_device")


def split_cpu(num_devices):
    """Splits the CPU into `num_devices` logical devices; must run before TensorFlow starts.

    This is how a CPU-only machine runs the multi-replica code paths (tests, laptops).
    """
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as error:
        if len(tf.config.list_logical_devices("CPU")) != num_devices:
            raise RuntimeError(
                f"Cannot split the CPU into {num_devices} devices: TensorFlow was already "
                "initialised. Pass --cpu_devices before anything runs TensorFlow.") from error


def make_strategy(name="", tpu=""):
    """Returns the strategy `name` (one of STRATEGIES); "" picks TPU if `tpu` is given, else
    all local GPUs, else all local (logical) CPUs."""
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if not name:
        name = "tpu" if tpu else ("mirrored" if len(gpus) > 1 or len(cpus) > 1 else "one_device")
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; expected one of {STRATEGIES}.")
    if name == "tpu":
        if not tpu:
            raise ValueError("--strategy=tpu needs --tpu: a TPU name, a grpc:// address, "
                             "or 'local' on a TPU VM.")
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    elif name == "mirrored":
        devices = [d.name for d in (gpus or cpus)]
        strategy = tf.distribute.MirroredStrategy(devices)
    elif name == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # cluster from TF_CONFIG
    else:
        strategy = tf.distribute.OneDeviceStrategy((gpus or cpus)[0].name)
    logging.info("Strategy %s with %d replicas.", name, strategy.num_replicas_in_sync)
    return strategy


def is_tpu(strategy):
    return isinstance(strategy, (tf.distribute.TPUStrategy,))


def is_chief(strategy):
    """True on the one worker that writes exports (always, without a multi-worker cluster)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type or isinstance(strategy, tf.distribute.TPUStrategy):
        return True
    return task_type == "chief" or (task_type == "worker" and resolver.task_id == 0)

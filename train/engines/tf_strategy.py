"""tf.distribute set-up: TPU, mirrored GPUs (or split CPUs), multi-worker, or one device.

TensorFlow is imported by the functions that use it, not on import: train.main reads
`STRATEGIES` for its `--strategy` flag, and `TF_CONFIG` (`cluster_size`, `is_chief_task`),
before TensorFlow starts, and on the JAX engine without it.
"""

import json
import os
import re
import socket
import threading
import time

from absl import logging

from . import startup

# The tf.distribute strategies of train.main's --strategy ("" picks one: see make_strategy).
STRATEGIES = ("tpu", "mirrored", "multi_worker", "one_device")


def split_cpu(num_devices):
    """Splits the CPU into `num_devices` logical devices; must run before TensorFlow starts.

    This is how a CPU-only machine runs the multi-replica code paths (tests, laptops).
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as error:
        if len(tf.config.list_logical_devices("CPU")) != num_devices:
            raise RuntimeError(
                f"Cannot split the CPU into {num_devices} devices: TensorFlow was already "
                "initialised. Pass --cpu_devices before anything runs TensorFlow.") from error


def _tf_config():
    """The `TF_CONFIG` environment variable, parsed ({} when it is not set)."""
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}")
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}.") from error


def cluster_size():
    """How many tasks the `TF_CONFIG` environment variable names (0 when it is not set)."""
    return sum(len(tasks) for tasks in (_tf_config().get("cluster") or {}).values())


# The tasks MultiWorkerMirroredStrategy connects (an "evaluator" task runs on its own).
COORDINATED_JOBS = ("chief", "worker")


def cluster_task():
    """`(cluster, task type, task index)` of `TF_CONFIG`, checked here so that a mistake is
    one message naming TF_CONFIG's field (TensorFlow says "The `task_id` 2 exceeds the maximum
    id of worker."); None without a cluster."""
    spec = _tf_config()
    cluster = spec.get("cluster") or {}
    if not cluster:
        return None
    if not isinstance(cluster, dict) or not all(
            isinstance(tasks, list) and tasks for tasks in cluster.values()):
        raise ValueError('TF_CONFIG\'s "cluster" must map each job to a list of host:port '
                         'addresses, e.g. {"worker": ["host1:port", "host2:port"]}; got '
                         f"{json.dumps(cluster)}.")
    for job, tasks in cluster.items():
        for address in tasks:
            try:
                startup.split_address(address)
            except ValueError as error:
                raise ValueError(f'TF_CONFIG\'s cluster "{job}": {error} Each task is '
                                 "HOST:PORT, a port from 1 to 65535.") from None
    example = '"task": {"type": "worker", "index": N}'
    task = spec.get("task") or {}
    if not isinstance(task, dict) or not task:
        raise ValueError(f"TF_CONFIG names a cluster but not this process's task: add "
                         f"{example}, N this worker's place in the cluster's list.")
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type == "evaluator" and task_type not in cluster:  # TensorFlow allows it unlisted
        return cluster, task_type, index
    if task_type not in cluster:
        raise ValueError(f'TF_CONFIG\'s task "type" is {json.dumps(task_type)}, which is not a '
                         f"job of its cluster ({', '.join(map(json.dumps, cluster))}).")
    count = len(cluster[task_type])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        places = "0" if count == 1 else f"0 to {count - 1}"
        raise ValueError(f'TF_CONFIG\'s task "index" is {json.dumps(index)}, but its cluster has '
                         f'{count} "{task_type}" task{"s" if count > 1 else ""}: the index must '
                         f"be {places}, this process's place in that list.")
    return cluster, task_type, index


def is_chief_task():
    """Whether `TF_CONFIG` makes this process the chief (see `is_chief`), before any strategy
    exists; always true without a cluster."""
    checked = cluster_task()
    if checked is None:
        return True
    return _chief_rule(*checked)


def _chief_rule(cluster, task_type, task_id):
    """The chief writes the workdir: the "chief" task if the cluster has one, else worker 0."""
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and task_id == 0


def task_name(job, index):
    """"worker 1 (host:port)": how messages name a task of `TF_CONFIG`'s cluster."""
    checked = cluster_task()
    address = checked[0][job][index] if checked and index < len(checked[0].get(job, ())) else None
    return f"{job} {index}" + (f" ({address})" if address else "")


_PORTS_GIVEN = set()  # by local_cluster in this process: never handed out twice


def local_cluster(num_workers):
    """`TF_CONFIG` values, one per worker, for a cluster of `num_workers` processes on this
    machine (free localhost ports): for tests, benchmarks and trying multi-worker runs."""
    sockets, ports = [], []
    while len(ports) < num_workers:  # sockets stay open until all are picked: no repeats
        handle = socket.socket()
        handle.bind(("localhost", 0))
        sockets.append(handle)
        if handle.getsockname()[1] not in _PORTS_GIVEN:
            ports.append(handle.getsockname()[1])
    for handle in sockets:
        handle.close()
    _PORTS_GIVEN.update(ports)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            for index in range(num_workers)]


def make_strategy(name="", tpu="", startup_timeout=startup.DEFAULT_TIMEOUT):
    """Returns the strategy `name` (one of STRATEGIES); "" picks TPU if `tpu` is given, else
    multi-worker if `TF_CONFIG` names a cluster, else all local GPUs, else all local (logical)
    CPUs. A multi-worker strategy waits up to `startup_timeout` seconds for the other workers
    (raising `startup.StartupFailed`)."""
    import tensorflow as tf

    if not name:
        name = "tpu" if tpu else ("multi_worker" if cluster_size() > 1 else "")
    if name not in STRATEGIES + ("",):
        raise ValueError(f"Unknown strategy {name!r}; expected one of {STRATEGIES}.")
    if name == "multi_worker":
        # Before anything lists devices: collective ops must be configured at start-up.
        if not cluster_size():
            raise ValueError("--strategy=multi_worker needs TF_CONFIG on every worker, e.g. "
                             '{"cluster": {"worker": ["host1:port", "host2:port"]}, '
                             '"task": {"type": "worker", "index": 0}}.')
        strategy = _multi_worker_strategy(startup_timeout)
    elif name == "tpu":
        if not tpu:
            raise ValueError("--strategy=tpu needs --tpu: a TPU name, a grpc:// address, "
                             "or 'local' on a TPU VM.")
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            strategy = tf.distribute.TPUStrategy(resolver)
        except (tf.errors.OpError, ValueError, OSError, RuntimeError) as error:
            reason = getattr(error, "message", None) or str(error) or type(error).__name__
            reason = reason.splitlines()[0].split(". ")[0]
            raise ValueError(
                f"--tpu={tpu}: no TPU found or reachable ({reason}). "
                "On a TPU VM use --tpu=local with the TPU build of TensorFlow; elsewhere give "
                "the TPU's name or grpc:// address, or leave out --strategy=tpu and --tpu to "
                "train on this machine's GPUs or CPU.") from error
    else:
        gpus = tf.config.list_logical_devices("GPU")
        cpus = tf.config.list_logical_devices("CPU")
        if not name:
            name = "mirrored" if len(gpus) > 1 or len(cpus) > 1 else "one_device"
        if name == "mirrored":
            strategy = tf.distribute.MirroredStrategy([d.name for d in (gpus or cpus)])
        else:
            strategy = tf.distribute.OneDeviceStrategy((gpus or cpus)[0].name)
    logging.info("Strategy %s with %d replicas.", name, strategy.num_replicas_in_sync)
    return strategy


def _multi_worker_strategy(startup_timeout):
    """MultiWorkerMirroredStrategy, once every other worker of TF_CONFIG answers (see
    train/engines/startup.py for why it is not TensorFlow's own wait)."""
    import tensorflow as tf

    cluster, task_type, index = cluster_task()
    started = time.monotonic()
    if task_type in COORDINATED_JOBS:
        peers = {f"{job} {i}": address for job in COORDINATED_JOBS
                 for i, address in enumerate(cluster.get(job, ()))
                 if (job, i) != (task_type, index)}
        startup.wait_for_tf_workers(cluster[task_type][index], peers, startup_timeout)
    # Every worker answered; TensorFlow now connects them, in C++ and with no time limit. If a
    # worker stops meanwhile, this timer ends the wait (SIGTERM cannot: TensorFlow's handler
    # takes it).
    left = max(startup_timeout - (time.monotonic() - started), 0) + 10
    timer = threading.Timer(left, _connect_timed_out, (startup_timeout,))
    timer.daemon = True
    timer.start()
    try:
        return tf.distribute.MultiWorkerMirroredStrategy()  # the cluster from TF_CONFIG
    finally:
        timer.cancel()


def _connect_timed_out(startup_timeout):
    from ..console import cli

    cli.fail(f"TensorFlow did not connect the workers of TF_CONFIG within --startup_timeout="
             f"{startup_timeout} s, although all of them answered at first: one of them has "
             "probably stopped. Start all workers again with the same command.", now=True)


def lost_task(error):
    """The task of TF_CONFIG's cluster that TensorFlow's error `error` names as the remote end
    it lost ("worker 1 (host:port)"), or None."""
    checked = cluster_task()
    own = checked[1:] if checked else None
    for job, index in re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", str(error)):
        if (job, int(index)) != own:
            return task_name(job, int(index))
    return None


def is_tpu(strategy):
    import tensorflow as tf

    return isinstance(strategy, (tf.distribute.TPUStrategy,))


def is_chief(strategy):
    """True on the one worker that writes logs, `config.json` and exports: the "chief" task if
    the cluster has one, else worker 0 (always true without a multi-worker cluster; a TPU pod
    has one client)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type or is_tpu(strategy):
        return True
    return _chief_rule(resolver.cluster_spec().as_dict(), task_type, resolver.task_id)

"""The JAX engine: how a run steps, evaluates and saves on Keras' JAX backend.

The loop (train.run.loop) decides when; this module does it on every device of every process:

- The devices form a mesh of a batch axis and a model axis (train.engines.jax_mesh): the
  weights are split over the model axis as the model's layout map says (`config.model_parallel`)
  and, with `config.fsdp`, over the batch axis too; the optimizer's moments follow them.
- A step is one `jax.jit` function of the whole state (train.engines.jax_step), the arithmetic
  of train.run.step_math.
- Each process reads its own share of every global batch and hands it over with
  `jax.make_array_from_process_local_data`: through Grain without TensorFlow
  (train.data.grain_pipeline) where it can read the data, else through the TensorFlow engine's
  tf.data pipelines (`config.input_pipeline`).
- Checkpoints are orbax-checkpoint directories, `workdir/checkpoints/<step>/`: every process
  writes its shards, orbax renames a finished save into place (a kill leaves the previous one
  readable), and a restore reshards onto the current mesh, so a run saved on 4 devices resumes
  on 1 or on 2x2.
"""

import contextlib
import os
import re
import signal
import threading
import time

import jax
import keras
import numpy as np
from absl import logging

from ..data import settings
from ..run import config_checks, run_files, schedules, step_math
from ..run import starting_point
from ..run.engine import Engine
from ..run.loop import Stopped
from ..run.model_config import model_spec
from . import jax_cpu_settings, startup
from .jax_mesh import make_distribution
from .jax_step import JaxStep

def initialize(cpu_devices=1, coordinator_address="", num_processes=1, process_id=0,
               startup_timeout=startup.DEFAULT_TIMEOUT, heartbeat_timeout=30,
               guard_stderr=False):
    """Sets up JAX before its first use: `cpu_devices` logical CPU devices, and with
    `num_processes` > 1 the connection to the other processes through the coordinator at
    `coordinator_address` (process 0 hosts it).

    The wait for the others ends after `startup_timeout` seconds, or on SIGTERM or Ctrl-C, with
    a one-paragraph message and exit (see `_connect`). Once connected, JAX's heartbeats end
    every process within `heartbeat_timeout` seconds of one that stops answering (JAX's
    default is 100); `guard_stderr` turns JAX's C++ abort then into one paragraph
    (train/engines/jax_stderr.py). On a TPU VM slice JAX finds the other hosts by itself (give no
    address), and its own `initialization_timeout` bounds the wait."""
    if cpu_devices > 1:
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    if coordinator_address or num_processes > 1:
        if guard_stderr:
            from . import jax_stderr

            jax_stderr.guard(coordinator_address, num_processes, process_id)
        _connect(coordinator_address, num_processes, process_id, startup_timeout,
                 heartbeat_timeout)
        return
    try:  # a Cloud TPU VM slice (or another cluster JAX detects) names its hosts itself
        jax.distributed.initialize(initialization_timeout=startup_timeout,
                                   heartbeat_timeout_seconds=heartbeat_timeout)
    except ValueError:  # "coordinator_address should be defined": one process on its own
        pass


# JAX's own start-up timeout, a backstop this much later than ours: when it expires, JAX ends
# the process with a C++ abort instead of a message.
JAX_TIMEOUT_MARGIN = 60


def _connect(address, num_processes, process_id, startup_timeout, heartbeat_timeout):
    """`jax.distributed.initialize` in a thread, waited for by `startup.wait_for`: JAX's
    connect cannot be interrupted from Python and ends a timeout with a C++ abort, so the main
    thread keeps the deadline, the progress lines and the signals. A process other than 0
    first waits for the coordinator's port to answer, to say which peer it waits for."""
    from ..console import cli

    started = time.monotonic()
    check = (f"Check that all {num_processes} processes were started with "
             f"--coordinator_address={address} --num_processes={num_processes} and each its own "
             f"--process_id (0 to {num_processes - 1}), and that {address} is process 0's "
             "address and reachable from here (no firewall in between).")
    outcome = []

    def connect():
        try:
            jax.distributed.initialize(
                address, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_timeout,
                initialization_timeout=startup_timeout + JAX_TIMEOUT_MARGIN)
        except Exception as error:  # handed to the main thread
            outcome.append(error)

    try:
        if process_id != 0:
            coordinator = [f"process 0 (the coordinator) at {address}"]
            startup.wait_for(lambda: [] if startup.answers(address) else coordinator,
                             startup_timeout, check, started=started)
        thread = threading.Thread(target=connect, name="jax-distributed-initialize", daemon=True)
        thread.start()
        thread.join(1.0)  # connected by then when all are up: no "Waiting for" line
        if num_processes == 1:
            others, verb = "JAX's coordinator", f"start at {address}"
        elif process_id == 0:
            others = ("process 1" if num_processes == 2
                      else f"processes 1 to {num_processes - 1} (one or more of them)")
            verb = f"connect to this process's coordinator at {address}"
        else:
            others, verb = "the other processes", f"connect to the coordinator at {address}"
        startup.wait_for(lambda: [others] if thread.is_alive() else [], startup_timeout, check,
                         verb=verb, started=started)
    except startup.StartupFailed as failure:
        # The connecting thread is inside JAX's C++ code: leave without the exit handlers.
        cli.fail(failure, failure.exit_code, now=True)
    if outcome:
        raise outcome[0]


_LOST_PEER = re.compile(r"Gloo|Connection reset|Connection refused|Socket closed|UNAVAILABLE|"
                        r"heartbeat|coordination service", re.IGNORECASE)


def lost_peer(error):
    """Whether `error`, raised in a run of several processes, is a collective or the
    coordination service failing because another process is gone (gloo says "Connection
    reset by peer"; JAX's runtime "UNAVAILABLE")."""
    return (isinstance(error, (RuntimeError, ValueError))  # JaxRuntimeError is a RuntimeError
            and bool(_LOST_PEER.search(str(error))))


def is_chief_process():
    return jax.process_index() == 0


def cpu_settings_line(compile_options):
    """For a run on JAX's CPU devices, a line on what train.engines.jax_cpu_settings chose for
    it (at start-up, and the step's `compile_options`), or on how to run faster where it could
    not; None on other devices or with another allocator preloaded (tcmalloc, as on Cloud TPU
    VMs)."""
    if jax.devices()[0].platform != "cpu":
        return None
    settings = jax_cpu_settings.active(os.environ, compile_options)
    if settings:
        return (f"JAX on CPU: {'; '.join(settings)} ({jax_cpu_settings.SWITCH}=off leaves "
                f"{'it' if len(settings) == 1 else 'them'} out).")
    try:
        with open("/proc/self/maps") as handle:
            if "malloc" in handle.read():  # libtcmalloc*, libjemalloc, libmimalloc loaded
                return None
    except OSError:  # not Linux: nothing known to say
        return None
    return ("JAX on CPU runs this engine faster with tcmalloc: `sudo apt-get install "
            "libtcmalloc-minimal4`, then start the command with "
            "LD_PRELOAD=libtcmalloc_minimal.so.4 (Cloud TPU VMs preload tcmalloc already).")


class JaxEngine(Engine):
    """The state of a run on JAX and the compiled functions that advance it (train.run.engine's
    contract): the step (train.engines.jax_step), this process's input, orbax checkpoints."""

    def __init__(self, config, workdir, distribution=None, start=None):
        import orbax.checkpoint as ocp

        self.config, self.workdir = config, workdir
        # What the run starts from (train.run.starting_point.resolve), loaded unless it resumes.
        self.start = start or starting_point.StartingPoint(config.pretrained)
        self.distribution = distribution or make_distribution(config.model_parallel,
                                                              fsdp=config.fsdp)
        self.batch_devices = self.distribution.device_mesh.shape[0]
        config_checks.check(config, num_replicas=self.batch_devices)
        self.is_chief = is_chief_process()
        self.input = _process_input(config_checks.section(config, settings.FIELDS))
        self.class_names = self.input.class_names
        self.num_classes = len(self.class_names)
        spec = model_spec(config, self.num_classes)
        for field in ("hidden_size", "mlp_dim"):  # the widths the model axis splits
            if getattr(spec, field) % config.model_parallel:
                raise ValueError(f"config.model_parallel={config.model_parallel} must divide "
                                 f"the model's {field} ({getattr(spec, field)}).")
        self.jax_step = JaxStep(config, self.num_classes, self.distribution)
        line = cpu_settings_line(self.jax_step.compile_options)
        if line and is_chief_process():
            logging.info(line)
        self.objective, self.model = self.jax_step.objective, self.jax_step.model
        native = self.objective.native
        if native is not None and native.mode == "packed" and (
                native.sequences % self.batch_devices):
            raise ValueError(f"config.pack_sequences={native.sequences} is not divisible by the "
                             f"{self.batch_devices} devices of the batch axis.")
        self.optimizer, self.state = self.jax_step.optimizer, self.jax_step.state
        self.schedule = schedules.WarmupDecay(config.learning_rate, config.warmup_steps,
                                              config.total_steps, config.decay)
        self.checkpoints = ocp.CheckpointManager(
            os.path.abspath(run_files.checkpoint_dir(workdir)),
            options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints,
                                                 create=True))
        self._steps_done = 0  # counted here, so reading it needs no device
        self.saved_step = self._restore_newest()
        if self.saved_step is None and config.pretrained:
            self._load_pretrained()
        self.eval_examples = self.input.eval_examples
        self._train_iterator = self.input.train(self.step, self.objective.num_patches,
                                                self.objective.native)

    @property
    def step(self):
        return self._steps_done

    def learning_rate(self):
        return float(self.schedule(self.step))

    # Training and evaluation.

    def train_steps(self, steps):
        """Runs `steps` optimizer steps; returns the mean loss and the last gradient norm."""
        losses, grad_norm = [], None
        for _ in range(steps):  # dispatched asynchronously: read back once, at the end
            batch = self._global_batch(next(self._train_iterator))
            self.state, (loss, grad_norm) = self.jax_step.train_step(self.state, batch)
            losses.append(loss)
            self._steps_done += 1
        return float(np.mean([_host(loss) for loss in losses])), _host(grad_norm)

    def _global_batch(self, local):
        return {name: jax.make_array_from_process_local_data(self.jax_step.batch_sharding,
                                                             np.asarray(value))
                for name, value in local.items() if name != "id"}  # ids: for train.input

    def evaluate(self):
        """Top-1 accuracy (None without classes) and mean loss over the whole eval split."""
        batches = (self.jax_step.eval_step(self.state, self._global_batch(local))
                   for local in self.input.eval(self.objective.num_patches,
                                                self.objective.native))
        return step_math.eval_results(([_host(value) for value in sums] for sums in batches),
                                      self.eval_examples, self.objective.has_accuracy)

    # Checkpoints.

    def save(self):
        """Saves the state at the current step (every process writes its shards)."""
        import orbax.checkpoint as ocp

        step = self.step
        if step == self.saved_step:
            return
        self.checkpoints.save(step, args=ocp.args.StandardSave(self.state))
        self.checkpoints.wait_until_finished()
        self.saved_step = step
        logging.info("Saved checkpoint %s.",
                     os.path.join(run_files.checkpoint_dir(self.workdir), str(step)))

    def _restore_newest(self):
        import orbax.checkpoint as ocp

        step = self.checkpoints.latest_step()
        if step is None:
            return None
        target = jax.tree.map(
            lambda array: jax.ShapeDtypeStruct(array.shape, array.dtype,
                                               sharding=array.sharding), self.state)
        self.state = self.checkpoints.restore(step, args=ocp.args.StandardRestore(target))
        self._steps_done = step
        logging.info("Resumed from %s at step %d.",
                     os.path.join(run_files.checkpoint_dir(self.workdir), str(step)), self.step)
        return step

    def _load_pretrained(self):
        self.start.load(self.objective, self.model, self.config)
        self.state = self.jax_step.initial_state()

    def close(self):
        """Ends the input's worker processes (their shared memory freed) and the checkpoint
        manager's threads."""
        if hasattr(self._train_iterator, "close"):  # Grain's; tf.data's has none
            self._train_iterator.close()
        self.checkpoints.close()

    # Stopping.

    def preemption_watcher(self, save):
        return SigtermWatcher(save)

    # Export.

    @contextlib.contextmanager
    def exported_weights(self):
        """A copy of the model outside the mesh, holding the final (or EMA) weights on this
        host: what Keras can save (it cannot save arrays split over other processes). Every
        process must enter it together (gathering a split weight is a collective)."""
        weights = self.state["ema" if self.config.ema_decay else "trainable"]
        trainable = [_on_host(value) for value in weights]
        non_trainable = [_on_host(value) for value in self.state["non_trainable"]]
        distribution = keras.distribution.distribution()
        keras.distribution.set_distribution(None)
        try:
            model = self.objective.build()
            for variable, value in zip(model.trainable_variables, trainable):
                variable.assign(value)
            for variable, value in zip(model.non_trainable_variables, non_trainable):
                variable.assign(value)
            yield model
        finally:
            keras.distribution.set_distribution(distribution)


class SigtermWatcher:
    """SIGTERM on any process: every process saves at the same step, then stops.

    The flag is agreed across processes at each check (one tiny all-gather), so every process
    takes part in the same save."""

    def __init__(self, save):
        self._save = save
        self._requested = False
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        del signum, frame
        logging.warning("SIGTERM: saving a checkpoint after the current loop, then stopping.")
        self._requested = True

    def check(self):
        requested = self._requested
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            requested = bool(np.any(multihost_utils.process_allgather(
                np.array([requested]))))
        if requested:
            logging.warning("Stopping: saving a checkpoint that every process shares.")
            self._save()
            raise Stopped()

    def close(self):
        signal.signal(signal.SIGTERM, self._previous)


def _process_input(config):
    """This process's input through `config.input_pipeline` (chosen by
    `grain_pipeline.choose`); `config` is the input's section of the run's config."""
    if config.input_pipeline == "grain":
        from ..data import grain_pipeline

        return grain_pipeline.process_input(config, jax.process_count(), jax.process_index())
    from ..data import tf_pipeline

    return tf_pipeline.process_input(config, jax.process_count(), jax.process_index())


def _on_host(array):
    """The whole of a (possibly split) array as numpy on this host."""
    if array.is_fully_addressable:
        return np.asarray(array)
    if array.sharding.is_fully_replicated:  # a whole copy is on this host's devices
        return np.asarray(array.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def _host(value):
    """A replicated scalar as a float: this process's copy (the whole array may span other
    processes' devices, which it cannot read)."""
    return float(np.asarray(value.addressable_data(0)))


"""Stopping on SIGTERM (TPU maintenance, spot VMs, a cluster scheduler) without losing work.

All workers call `PreemptionWatcher.check()` at the same point of every loop. Once any worker has
received SIGTERM, every worker saves one common checkpoint at the same step and `check()` raises
`Stopped`; the command exits with `RESUMABLE_EXIT_CODE`, and rerunning it resumes.

Where TensorFlow supports it (one process, mirrored GPUs, multi-worker GPU/CPU clusters), this is
TensorFlow's own `tf.distribute.experimental.PreemptionCheckpointHandler`: the worker that gets
the signal picks the step, every worker acknowledges it through the coordination service, and all
save there. TensorFlow turns that handler off for TPUs on Cloud, so a `TPUStrategy` run (one
client process driving every TPU host) watches for SIGTERM itself.
"""

import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback

import tensorflow as tf
from absl import logging

from .tf_strategy import is_tpu

from ..run.loop import RESUMABLE_EXIT_CODE, Stopped  # noqa: F401  (train.main reads them here)


class PreemptionWatcher:
    """Watches for SIGTERM; `check()` saves with `save()` and raises `Stopped` when asked to stop.

    Args:
        strategy: the run's `tf.distribute` strategy.
        save: a function of no arguments that saves a checkpoint at the current step (every
            worker calls it, as multi-worker checkpointing requires).
        use_tf_handler: use TensorFlow's handler (default: everywhere but TPU).
    """

    def __init__(self, strategy, save, use_tf_handler=None):
        self._save = save
        self._requested = False
        self._handler = None
        self._handler_dir = None
        self._previous = signal.getsignal(signal.SIGTERM)
        if use_tf_handler is None:
            use_tf_handler = not is_tpu(strategy)
        if use_tf_handler:
            _quiet_lost_peer_in_handler_threads()
            # The handler keeps its own run counter in a checkpoint of its own; the run's
            # checkpoints are written by `save`. A local directory that does not exist makes
            # the counter start at 0 on every worker, so their counts agree after any restart.
            # (Only a non-chief worker's handler creates a folder in it.)
            self._handler_dir = os.path.join(tempfile.gettempdir(),
                                             f"keras_vit_preemption_{os.getpid()}")
            config = tf.distribute.experimental.TerminationConfig(
                exit_fn=self._raise_stopped, save_fn=self._save_once)
            self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
                getattr(strategy, "cluster_resolver", None), tf.train.Checkpoint(),
                checkpoint_dir=os.path.join(self._handler_dir, "counter"),
                termination_config=config)
        else:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        del signum, frame
        logging.warning("SIGTERM: saving a checkpoint after the current loop, then stopping.")
        self._requested = True

    def _save_once(self, *args, **kwargs):
        del args, kwargs
        logging.warning("Stopping: saving a checkpoint that every worker shares.")
        self._save()

    def _raise_stopped(self):
        raise Stopped()

    def check(self):
        """Call at the same point of every loop on every worker."""
        if self._handler is not None:
            self._handler.save_checkpoint_if_preempted()  # saves and raises when agreed
        elif self._requested:
            self._save_once()
            self._raise_stopped()

    def close(self):
        """Restores the previous SIGTERM handler and removes the handler's files."""
        signal.signal(signal.SIGTERM, self._previous)
        self._handler = None
        if self._handler_dir:
            shutil.rmtree(self._handler_dir, ignore_errors=True)


def _quiet_lost_peer_in_handler_threads():
    """Drops what TensorFlow's preemption handler prints when a multi-worker run loses a
    worker: its watcher thread's UnavailableError from the coordination service, and the
    handler's `__del__` failing to join that thread (it can run in the thread itself). The
    training loop fails on the same loss, and train.main says which worker in one paragraph.
    Installed once, for good: the thread may fail after the watcher is closed."""
    previous_thread_hook, previous_unraisable_hook = threading.excepthook, sys.unraisablehook
    if getattr(previous_thread_hook, "keras_vit_quiet", False):
        return
    lost = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)

    def in_handler(exc_traceback):
        return any("failure_handling" in frame.filename
                   for frame in traceback.extract_tb(exc_traceback))

    def thread_hook(args):
        if isinstance(args.exc_value, lost) and in_handler(args.exc_traceback):
            logging.debug("TensorFlow's preemption handler thread stopped: %s", args.exc_value)
            return
        previous_thread_hook(args)

    def unraisable_hook(args):
        if (isinstance(args.exc_value, (RuntimeError, *lost))
                and in_handler(args.exc_traceback)):
            logging.debug("TensorFlow's preemption handler failed to stop: %s", args.exc_value)
            return
        previous_unraisable_hook(args)

    thread_hook.keras_vit_quiet = True
    threading.excepthook, sys.unraisablehook = thread_hook, unraisable_hook

"""The start of a run of several processes: waiting for the others, with a deadline.

Every process of a multi-worker (TensorFlow) or multi-process (JAX) run waits for the others
before it trains. `wait_for` bounds that wait by `--startup_timeout`, logs what it is waiting
for every `PROGRESS_EVERY` seconds ("Waiting for worker 1 at host:port to answer, 20 s of 300
s"), and ends within a second on SIGTERM or Ctrl-C. Whatever ends the wait raises
`StartupFailed`, whose message names the peers that did not answer and what to check;
train.main prints it as one paragraph.

Why not the engines' own deadlines:
- TensorFlow: `MultiWorkerMirroredStrategy()` waits in C++ with no time limit ("Waiting for the
  cluster, timeout = inf"). The coordination service's `cluster_register_timeout_in_ms` (set
  through TensorFlow's internal `context.configure_coordination_service`) bounds only the
  other workers' registration: worker 0, which hosts the service, still waited past 60 s with
  an 8 s limit (TensorFlow 2.21). And TensorFlow's C++ SIGTERM handler swallows the signal
  while it waits. So `wait_for_tf_workers` checks that every other worker answers on its
  `TF_CONFIG` port before TensorFlow starts, while Python still handles the signals.
- JAX: `jax.distributed.initialize(initialization_timeout=...)` ends the wait with a C++ abort
  (a stack dump, not a message) and cannot be interrupted from Python while it connects. So
  train.engines.jax_engine runs it in a thread, with JAX's own timeout as a backstop set later than
  ours, and waits for that thread here.
"""

import contextlib
import signal
import socket
import threading
import time

from absl import logging

PROGRESS_EVERY = 10  # seconds between two "Waiting for ..." lines
POLL_EVERY = 0.5  # seconds between two checks of the peers
DEFAULT_TIMEOUT = 300  # --startup_timeout's default (JAX's initialization_timeout's too)
CTRL_C_EXIT_CODE = 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C


class StartupFailed(Exception):
    """The peers did not all answer in time, or a signal ended the wait: `exit_code` is 1 for
    a timeout, train.run.loop.RESUMABLE_EXIT_CODE (75) for SIGTERM (nothing was lost; the same
    command starts the run again), CTRL_C_EXIT_CODE for Ctrl-C."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def _signals_end_the_wait():
    """Meanwhile SIGTERM and Ctrl-C (SIGINT) are noted in the list this yields, for the wait
    to end at its next check (a handler that raised could land inside a logging call, which
    swallows exceptions); in the main thread only, the one Python lets handle signals."""
    received = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def note(signum, frame):
        del frame
        received.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_for(missing, timeout, what_to_check, verb="answer", started=None):
    """Calls `missing()` every POLL_EVERY seconds until it returns an empty list; it returns
    what is still awaited ("worker 1 at host:port"), each of which must `verb`. Logs them when
    the wait starts and every PROGRESS_EVERY seconds; raises StartupFailed `timeout` seconds
    after `started` (a `time.monotonic()`, default now), naming them, then `what_to_check`;
    or at its next check after SIGTERM or Ctrl-C."""
    started = time.monotonic() if started is None else started
    logged_at = None
    waiting = missing()
    with _signals_end_the_wait() as received:
        while waiting and not received:
            elapsed = time.monotonic() - started
            if elapsed >= timeout:
                raise StartupFailed(f"{_names(waiting)} did not {verb} within "
                                    f"--startup_timeout={timeout:g} s. {what_to_check}")
            if logged_at is None or elapsed - logged_at >= PROGRESS_EVERY:
                logged_at = elapsed if logged_at is None else logged_at + PROGRESS_EVERY
                logging.info("Waiting for %s to %s, %d s of %g s (--startup_timeout).",
                             _names(waiting), verb, round(elapsed), timeout)
            time.sleep(min(POLL_EVERY, max(0.0, timeout - elapsed)))
            if not received:
                waiting = missing()
    if received and received[0] == signal.SIGTERM:
        # Imported here: train.main imports this module before the flags are parsed, and
        # train.run.loop imports keras_vit, hence Keras and its backend.
        from ..run.loop import RESUMABLE_EXIT_CODE

        raise StartupFailed(f"Stopped by SIGTERM while waiting for {_names(waiting)}, before "
                            "training began; nothing was written. Run the same command to "
                            "start again.", RESUMABLE_EXIT_CODE)
    if received:
        raise StartupFailed(f"Stopped by Ctrl-C while waiting for {_names(waiting)}, before "
                            "training began; nothing was written.", CTRL_C_EXIT_CODE)


def _names(items):
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def split_address(address):
    """`host:port` (or `[v6]:port`) to (host, port); ValueError naming `address` otherwise (a
    port outside 1 to 65535 too)."""
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} is not a host:port address.")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r}: port {int(port)} is outside 1 to 65535.")
    return host.strip("[]"), int(port)


def answers(address, timeout=1.0):
    """Whether something accepts TCP connections at `address` (host:port)."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def answering(address):
    """Listens on `address`'s port meanwhile, so that the other workers, probing it as
    `wait_for_tf_workers` does, see this one started; the port is free again afterwards for
    TensorFlow's server. OSError naming the address if another program holds the port."""
    _, port = split_address(address)
    try:
        if socket.has_dualstack_ipv6():  # "localhost" may resolve to ::1 or 127.0.0.1
            server = socket.create_server(("", port), family=socket.AF_INET6,
                                          dualstack_ipv6=True)
        else:
            server = socket.create_server(("", port))
    except OSError as error:
        raise OSError(f"This worker's own TF_CONFIG address {address} cannot be used: port "
                      f"{port} is taken ({error.strerror or error}). Stop the program that "
                      "holds it (an earlier run?) or give this worker another port in every "
                      "worker's TF_CONFIG.") from None
    try:
        yield
    finally:
        server.close()


def wait_for_tf_workers(own_address, peers, timeout):
    """Waits until every peer ({"worker 1": "host:port", ...}) accepts connections on its
    TF_CONFIG address, answering on `own_address` meanwhile (see `answering`)."""
    with answering(own_address):
        wait_for(lambda: [f"{name} at {address}" for name, address in peers.items()
                          if not answers(address)],
                 timeout,
                 "Check that every worker was started with the same TF_CONFIG cluster and its "
                 "own task index, that the addresses and ports in TF_CONFIG are right, and that "
                 "no firewall blocks them.")

"""The start of a run of several processes, in-process (train/engines/startup.py,
train/engines/tf_strategy.py's TF_CONFIG checks), and the filter that turns JAX's fatal abort into
one paragraph (train/engines/jax_stderr.py) on the abort texts JAX 0.10 wrote when a peer was
killed. The runs of two real processes are in test_train_driver.py (TensorFlow) and
test_jax_engine.py (JAX)."""

import io
import json
import os
import signal
import socket
import threading
import time

import pytest

from train.engines import jax_stderr, startup, tf_strategy


def free_address():
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return f"localhost:{probe.getsockname()[1]}"


# --- The wait ---------------------------------------------------------------------------------

def test_the_wait_gives_up_after_the_timeout_naming_the_peer(monkeypatch):
    monkeypatch.setattr(startup, "PROGRESS_EVERY", 0.4)
    # Recorded at the call: earlier tests of the suite leave absl's level or handlers changed.
    logged = []
    monkeypatch.setattr(startup.logging, "info",
                        lambda message, *args: logged.append(message % args))
    started = time.monotonic()
    with pytest.raises(startup.StartupFailed) as failure:
        startup.wait_for(lambda: ["worker 1 at host:2"], 1, "Check the addresses.")
    assert 1 <= time.monotonic() - started < 2
    assert str(failure.value) == ("worker 1 at host:2 did not answer within "
                                  "--startup_timeout=1 s. Check the addresses.")
    assert failure.value.exit_code == 1
    progress = [line for line in logged if "Waiting for" in line]
    assert progress[0] == ("Waiting for worker 1 at host:2 to answer, 0 s of 1 s "
                           "(--startup_timeout).")
    assert len(progress) >= 2  # and again every PROGRESS_EVERY seconds


def test_the_wait_ends_when_the_peers_answer(monkeypatch):
    monkeypatch.setattr(startup, "POLL_EVERY", 0.01)
    answers = iter([["process 1"], ["process 1"], []])
    startup.wait_for(lambda: next(answers), 30, "")  # no exception: all there


def test_sigterm_and_ctrl_c_end_the_wait_at_once():
    previous = signal.getsignal(signal.SIGTERM)
    for signum, exit_code, words in ((signal.SIGTERM, 75, "Stopped by SIGTERM"),
                                     (signal.SIGINT, 130, "Stopped by Ctrl-C")):
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signum))
        timer.start()
        started = time.monotonic()
        with pytest.raises(startup.StartupFailed) as failure:
            startup.wait_for(lambda: ["worker 1 at host:2"], 60, "")
        assert time.monotonic() - started < 5
        assert failure.value.exit_code == exit_code
        assert str(failure.value).startswith(f"{words} while waiting for worker 1 at host:2")
    assert signal.getsignal(signal.SIGTERM) == previous  # restored


def test_workers_see_each_other_while_they_wait():
    """Each worker answers on its own port while it waits, so that two workers waiting for
    each other both go on; then the port is free for TensorFlow's server, which takes over
    (here a plain listener)."""
    addresses = [free_address(), free_address()]
    finished, done = [], threading.Event()

    def worker(index):
        own, peer = addresses[index], addresses[1 - index]
        startup.wait_for_tf_workers(own, {f"worker {1 - index}": peer}, 20)
        with socket.create_server(("", startup.split_address(own)[1])):  # "TensorFlow"
            finished.append(index)
            done.wait(20)

    threads = [threading.Thread(target=worker, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while len(finished) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    done.set()
    for thread in threads:
        thread.join(20)
    assert sorted(finished) == [0, 1]


def test_a_taken_port_is_named():
    address = free_address()
    with socket.create_server(("", startup.split_address(address)[1])):
        with pytest.raises(OSError, match=f"own TF_CONFIG address {address} cannot be used"):
            startup.wait_for_tf_workers(address, {}, 5)


# --- TF_CONFIG --------------------------------------------------------------------------------

CLUSTER = {"worker": ["host1:2222", "host2:2222"]}


@pytest.mark.parametrize("spec,words", [
    ({"cluster": CLUSTER, "task": {"type": "worker", "index": 2}},
     ['TF_CONFIG\'s task "index" is 2', '2 "worker" tasks', "must be 0 to 1"]),
    ({"cluster": CLUSTER, "task": {"type": "worker", "index": -1}},
     ['"index" is -1', "must be 0 to 1"]),
    ({"cluster": CLUSTER, "task": {"type": "wrker", "index": 0}},
     ['task "type" is "wrker"', 'not a job of its cluster ("worker")']),
    ({"cluster": CLUSTER}, ["names a cluster but not this process's task",
                            '"task": {"type": "worker", "index": N}']),
    ({"cluster": {"worker": "host1:2222"}, "task": {"type": "worker", "index": 0}},
     ['"cluster" must map each job to a list of host:port addresses']),
    ({"cluster": {"worker": ["host1:2222", "host2:99999"]}, "task": {"type": "worker"}},
     ['cluster "worker": \'host2:99999\': port 99999 is outside 1 to 65535']),
    ({"cluster": {"worker": ["host1"]}, "task": {"type": "worker"}},
     ["cluster \"worker\": 'host1' is not a host:port address"]),
])
def test_tf_config_mistakes_name_the_field_and_the_range(monkeypatch, spec, words):
    monkeypatch.setenv("TF_CONFIG", json.dumps(spec))
    with pytest.raises(ValueError) as error:
        tf_strategy.is_chief_task()
    for word in words:
        assert word in str(error.value)


def test_a_lost_task_is_named_with_its_address(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER,
                                                "task": {"type": "worker", "index": 1}}))
    error = ("recvmsg:Connection reset by peer\nAdditional GRPC error information from remote "
             "target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf")
    assert tf_strategy.lost_task(error) == "worker 0 (host1:2222)"
    assert tf_strategy.lost_task("/job:worker/replica:0/task:1 itself") is None


# --- JAX's fatal abort as one paragraph ------------------------------------------------------

# What the survivor wrote (JAX 0.10.2, TF_CPP_MIN_LOG_LEVEL=1), trimmed: process 0 when process
# 1 was killed (it stopped sending heartbeats), and process 1 when process 0, which hosts the
# coordinator, was killed.
HEARTBEATS_STOPPED = b"""\
I1125 17:33:29.636143 139945767312256 loop.py:95] step 22/100000  loss 2.2494
E1125 17:33:56.968104   21746 coordination_service.cc:1549] [16126845844549128127] Use error \
polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are \
unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. \
preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='']
E1125 17:33:56.968648   21757 coordination_service_agent.cc:289] Polled an error from \
coordination service (this can be an error from this or another task).
F1125 17:33:56.968787   21757 client.h:80] Terminating process because the JAX distributed \
service detected fatal errors. This most likely indicates that another task died; see the \
other task logs for more details. absl::Status: UNAVAILABLE: The following tasks are unhealthy \
(stopped sending heartbeats):
1
The tasks have crashed.
*** Check failure stack trace: ***
    @     0x7f47954040ee  xla::CoordinationServiceAgent::SetError()
Fatal Python error: Aborted

Thread 0x00007f47a9bf9b80 (most recent call first):
  File "/work/train/engines/jax_engine.py", line 372 in _host
"""
COORDINATOR_GONE = b"""\
I1125 17:06:57.000000 139945767312256 loop.py:95] step 8/100000  loss 2.2994
W1125 17:06:58.356982   17886 preemption_sync_manager.cc:147] Failed to retrieve preemption \
notice from coordination service: UNAVAILABLE: Socket closed
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Socket closed"}.
E1125 17:06:58.357030   17886 coordination_service_agent.cc:289] Polled an error from \
coordination service (this can be an error from this or another task).
F1125 17:06:58.357034   17886 client.h:80] Terminating process because the JAX distributed \
service detected fatal errors. absl::Status: UNAVAILABLE: Failed to send RPC to coordination \
service. Either the leader task was preempted/died/restarted unexpectedly or this task is \
experiencing network issues.
*** Check failure stack trace: ***
    @     0x7f538a1040ee  xla::CoordinationServiceAgent::SetError()
"""


def filtered(chunks, process_id, pauses=()):
    """What the filter writes for the stderr `chunks`, with `pauses` (seconds) after them."""
    read, write = os.pipe()

    def feed():
        for chunk, pause in zip(chunks, list(pauses) + [0] * len(chunks)):
            os.write(write, chunk)
            time.sleep(pause)
        os.close(write)

    thread = threading.Thread(target=feed)
    thread.start()
    out = io.BytesIO()
    jax_stderr.copy_until_fatal(
        read, out, lambda text: jax_stderr.message(text, "localhost:1234", 2, process_id),
        hold_seconds=0.5)
    thread.join()
    os.close(read)
    return out.getvalue().decode()


@pytest.mark.parametrize("split", [None, 7, 300])  # whole, or cut at any place
def test_the_abort_of_a_lost_process_is_one_paragraph(split):
    chunks = [HEARTBEATS_STOPPED] if split is None else [HEARTBEATS_STOPPED[:split],
                                                          HEARTBEATS_STOPPED[split:]]
    lines = filtered(chunks, process_id=0).splitlines()
    assert lines == [
        "I1125 17:33:29.636143 139945767312256 loop.py:95] step 22/100000  loss 2.2494",
        "Error: lost contact with process 1 of this run: it stopped answering JAX's "
        "coordinator at localhost:1234 (it died, was killed, or lost its network). Start all 2 "
        "processes again with the same command: the run resumes from the newest checkpoint."]


def test_the_abort_of_a_lost_coordinator_is_one_paragraph():
    lines = filtered([COORDINATOR_GONE], process_id=1).splitlines()
    assert len(lines) == 2 and lines[0].endswith("step 8/100000  loss 2.2994")
    assert lines[1].startswith("Error: lost contact with process 0, which runs JAX's "
                               "coordinator at localhost:1234, during the run")


def test_the_filter_copies_everything_else():
    warning = (b"E1125 17:06:58.357030   17886 coordination_service_agent.cc:289] an error "
               b"that ends nothing\n")
    chunks = [b"line\nprogress 1\rprogress 2\r", b"partial", b" line\n", warning, b"after\n",
              b"no newline at the end"]
    pauses = [0, 0, 0, 0.7]  # longer than the filter holds the warning back
    assert filtered(chunks, 0, pauses) == b"".join(chunks).decode()


def test_an_error_the_process_reported_itself_is_not_repeated():
    own = b"Error: lost contact with another process of this run (Gloo failed).\n"
    out = filtered([own, HEARTBEATS_STOPPED], 0)
    assert out.startswith(own.decode()) and out.count("Error:") == 1
    assert "Terminating process" not in out

"""JAX's fatal end of a run of several processes, as one paragraph.

When a process of a multi-process JAX run dies, JAX's coordination service ends every other
process from a C++ thread: a glog FATAL line ("Terminating process because the JAX distributed
service detected fatal errors ..."), a C++ stack trace and Python's dump of every thread, then
SIGABRT. At once when process 0, which hosts the coordinator, is gone; within the heartbeat
timeout for another process. Nothing in Python runs in between, and JAX's hook for it
(`missed_heartbeat_callback`) cannot be set from Python (jaxlib 0.10 fails to pass the status to
a Python function: std::bad_cast). So train.engines.jax_engine passes the process's stderr through
this script, a child process: it copies everything until that line, then prints instead the one
paragraph `message` makes of what JAX said, and drops the rest (with --verbose there is no
filter). The process still ends by SIGABRT (exit status 134); this runs as
`python jax_stderr.py COORDINATOR NUM_PROCESSES PROCESS_ID`, standard library only, so that
it starts fast and does not import the package.
"""

import os
import re
import select
import signal
import sys
import time

MARKER = b"Terminating process because the JAX distributed service detected fatal errors"
# The C++ log lines (warnings, errors) of the coordination service and its client that come
# just before the FATAL line: "E1125 17:33:56.968 21746 coordination_service.cc:1549] ...".
SUSPECT = re.compile(rb"^[WE]\d{4} [\d:.]+\s+\d+ (coordination_service\w*|preemption_\w+|"
                     rb"client)\.(cc|h):\d+\]", re.MULTILINE)
HOLD_SECONDS = 5.0


def message(text, coordinator, num_processes, process_id):
    """The paragraph for JAX's fatal status `text` (the FATAL line and what follows it)."""
    rerun = (f"Start all {num_processes} processes again with the same command: the run "
             "resumes from the newest checkpoint.")
    # A process other than this one stopped sending heartbeats: the coordinator lists them,
    # one id a line, after "stopped sending heartbeats):"; or says "Task N heartbeat timeout".
    listed = re.search(r"stopped sending heartbeats\):\s*((?:\S*?\d+\s+)+)", text)
    ids = re.findall(r"(\d+)\s", listed.group(1)) if listed else re.findall(
        r"Task (\d+) heartbeat timeout", text)
    ids = sorted({int(i) for i in ids} - {process_id})
    if ids:
        who = (f"process {ids[0]}" if len(ids) == 1
               else "processes " + ", ".join(str(i) for i in ids))
        return (f"Error: lost contact with {who} of this run: it stopped answering JAX's "
                f"coordinator at {coordinator} (it died, was killed, or lost its network). "
                f"{rerun}\n")
    if process_id != 0 and re.search(r"coordination service|leader task|RegisterTask", text):
        during = "before training began" if "RegisterTask" in text else "during the run"
        return (f"Error: lost contact with process 0, which runs JAX's coordinator at "
                f"{coordinator}, {during}: it died, was killed, or cannot be reached (address, "
                f"firewall). {rerun}\n")
    status = re.search(r"absl::Status: ([^\n]*)", text)
    reason = status.group(1).strip() if status else "no reason given"
    return (f"Error: JAX's coordination service ended this process ({reason}): another "
            f"process of the run probably stopped. {rerun}\n")


def copy_until_fatal(source, target, make_message, hold_seconds=HOLD_SECONDS):
    """Copies bytes from file descriptor `source` to binary stream `target` until JAX's FATAL
    line; from there on reads to the end and writes `make_message(rest as text)` instead
    (nothing, if the process had already written its own "Error: ..." paragraph).

    The coordination service's own log lines that come just before the FATAL line are
    dropped with it: from the first of them, output is held back for `hold_seconds`, and
    copied only if no FATAL line follows."""
    held = b""  # not copied yet: an unfinished line, or everything since a suspect line
    suspect_since = None
    reported = False  # an "Error: ..." paragraph of the process itself went out
    while True:
        wait = None if suspect_since is None else suspect_since + hold_seconds - time.monotonic()
        if wait is not None and not select.select([source], [], [], max(0.0, wait))[0]:
            suspect_since = None  # no FATAL line came: what was held is ordinary output
            held, reported = _copy_lines(held, target, reported)
            continue
        chunk = os.read(source, 1 << 16)
        if not chunk:
            break
        held += chunk
        found = held.find(MARKER)
        suspect = SUSPECT.search(held, 0, found if found >= 0 else len(held))
        if found >= 0:
            start = (0 if suspect_since is not None else suspect.start() if suspect
                     else held.rfind(b"\n", 0, found) + 1)
            _, reported = _copy_lines(held[:start], target, reported)
            rest = [held[start:]]
            while chunk:
                chunk = os.read(source, 1 << 16)
                rest.append(chunk)
            if not reported:
                target.write(make_message(b"".join(rest).decode(errors="replace")).encode())
                target.flush()
            return
        if suspect_since is None:
            if suspect:
                _, reported = _copy_lines(held[:suspect.start()], target, reported)
                held, suspect_since = held[suspect.start():], time.monotonic()
            else:
                held, reported = _copy_lines(held, target, reported)
    target.write(held)  # the end: an unfinished last line too
    target.flush()


def _copy_lines(held, target, reported):
    """Writes the whole lines (and progress bars, ended by \\r) of `held`; returns the rest,
    and whether an "Error: " paragraph has gone out (`reported`, or one of these lines)."""
    cut = max(held.rfind(b"\n"), held.rfind(b"\r")) + 1
    target.write(held[:cut])
    target.flush()
    return held[cut:], reported or re.search(rb"(^|\n)Error: ", held[:cut]) is not None


def guard(coordinator, num_processes, process_id):
    """From now on, this process's stderr (file descriptor 2, C++ and Python alike) goes
    through this script in a child process, to the stderr it had."""
    import subprocess

    sys.stderr.flush()
    read, write = os.pipe()
    subprocess.Popen([sys.executable, os.path.abspath(__file__), coordinator, str(num_processes),
                      str(process_id)], stdin=read, stdout=2, stderr=2)
    os.dup2(write, 2)
    os.close(write)
    os.close(read)


def main(argv):
    coordinator, num_processes, process_id = argv[1], int(argv[2]), int(argv[3])
    # The signals meant for the run (Ctrl-C reaches the whole process group) must not end the
    # copy; it ends when the run's stderr closes, that is when the run's process ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    copy_until_fatal(0, sys.stdout.buffer,
                     lambda text: message(text, coordinator, num_processes, process_id))


if __name__ == "__main__":
    main(sys.argv)

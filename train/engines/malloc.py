"""glibc's malloc backed by transparent huge pages for a run on Keras' JAX backend.

JAX's CPU runtime allocates a step's temporaries afresh at every call. glibc's malloc serves
large blocks from memory it maps and returns to the kernel when they are freed (and its
threads' arenas give back whole heaps), so the step page-faults on the same memory again at
every call: 7.6 million page faults in 300 steps of the README's main job on a 2-core Intel
Xeon. Asking glibc to back its memory with transparent huge pages (the tunable
`glibc.malloc.hugetlb=1`, glibc 2.35 and later; glibc's manual, "Memory Allocation Tunables":
https://sourceware.org/glibc/manual/latest/html_node/Memory-Allocation-Tunables.html) cut
them to 0.4 million and trained 1.17x as many images per second (docs/training.md, "The JAX
engine"). Keeping freed memory instead (the mmap and trim thresholds, `mallopt`'s
settings) did not help: the faults come from the arenas' heaps, which glibc frees whatever
the thresholds say, and one arena for every thread (`arena_max=1`) made the threads wait for
each other.

Tunables are read when a process starts, so the command restarts itself once
(`os.execv`: the same process id, arguments and environment plus the tunable) before
TensorFlow and JAX load. Left as it is: another allocator preloaded (tcmalloc, as on Cloud TPU
VMs, or jemalloc), a GLIBC_TUNABLES that sets the tunable already, a system other than Linux
with glibc 2.35+, transparent huge pages turned off, other backends, and KERAS_VIT_MALLOC=system.
Only the standard library here: it runs before anything else loads."""

import json
import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
SWITCH = "KERAS_VIT_MALLOC"  # "system": leave malloc alone; the restart sets "hugetlb"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def tunables_for(environ, libc, thp_mode, backend):
    """The GLIBC_TUNABLES the process should run with, or None to run as it is.

    Args:
        environ: the process's environment (a mapping).
        libc: `os.confstr("CS_GNU_LIBC_VERSION")`, e.g. "glibc 2.36"; None elsewhere.
        thp_mode: the kernel's transparent huge page mode ("always", "madvise", "never"), or
            None where unknown.
        backend: Keras' backend for the run.
    """
    if backend != "jax" or environ.get(SWITCH) or not thp_mode or thp_mode == "never":
        return None
    if not _glibc_at_least(libc, (2, 35)):
        return None
    if "malloc" in environ.get("LD_PRELOAD", ""):  # libtcmalloc*, libjemalloc, libmimalloc
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in current:
        return None
    return f"{current}:{TUNABLE}" if current else TUNABLE


def environment(environ, backend):
    """`environ` with the tunable added where `tunables_for` says so: the environment a
    process of Keras' `backend` should start with (train.main restarts into it; benchmarks
    start their JAX processes with it)."""
    tunables = tunables_for(environ, _libc(), _thp_mode(), backend)
    if tunables is None:
        return environ
    return dict(environ, GLIBC_TUNABLES=tunables, **{SWITCH: "hugetlb"})


def restart_with_huge_pages():
    """Restarts this command in `environment` where that differs (see the module doc); returns
    where the process runs as it is."""
    environ = environment(os.environ, _keras_backend())
    if environ is os.environ:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)


def _glibc_at_least(libc, version):
    name, _, number = (libc or "").partition(" ")
    try:
        return name == "glibc" and tuple(int(part) for part in number.split(".")[:2]) >= version
    except ValueError:
        return False


def _libc():
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or not glibc
        return None


def _thp_mode():
    """The bracketed word of the kernel's setting, e.g. "always [madvise] never"."""
    try:
        with open(_THP_MODE) as handle:
            text = handle.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _keras_backend():
    """Keras' backend as Keras will choose it: $KERAS_BACKEND, else keras.json's "backend" in
    $KERAS_HOME (default ~/.keras), else TensorFlow."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as handle:
            return json.load(handle).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"

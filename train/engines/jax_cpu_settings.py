"""What a run on Keras' JAX backend asks of its process before it starts, for JAX's CPU runtime:
glibc's malloc keeping the memory it frees, and XLA:CPU's YNNPACK kernels for matrix products.

Memory. JAX's CPU runtime allocates a step's temporaries afresh at every call. By default glibc's
malloc maps large blocks on their own and unmaps them when freed, and trims freed memory at the
top of its heaps, so the step page-faults on the same memory again at every call: 7.6 million
page faults in 300 steps of the README's main job. Two tunables (glibc 2.26 and later; glibc's
manual, "Memory Allocation Tunables":
https://sourceware.org/glibc/manual/latest/html_node/Memory-Allocation-Tunables.html) make it
keep that memory for the next step, as tcmalloc does: `glibc.malloc.mmap_max=0` (no block is
mapped on its own) and a `glibc.malloc.trim_threshold` of 1 TiB (no heap is trimmed or given
back). On a 2-core Intel Xeon with AMX, 3 runs of 100 of the main job's training steps each
(`/usr/bin/time`'s minor faults of the whole process, with the YNNPACK flag below):

| malloc | images/s | page faults | peak resident |
|---|---|---|---|
| `mmap_max=0`, `trim_threshold` 1 TiB (this module's) | 2,207-2,258 | 0.26 million | 1.42 GB |
| on huge pages (`hugetlb=1`, this module's before) | 1,905-2,002 | 0.38 million | 1.39 GB |
| `mmap_threshold` 32 MiB (glibc's cap), `trim_threshold` 4 GiB | 1,722-1,741 | 6.4 million | |

Huge pages also slowed B/16's step (batch 8) by a quarter once the process had been idle for
10 s, as a benchmark's processes are between their timed runs: 1.46-1.51 images/s against
1.95-2.0 back to back; 1.77-1.84 after the same pause with this module's tunables. One arena
for every thread (`arena_max=1`) made the threads wait for each other.

Matrix products. XLA:CPU can hand dot products to YNNPACK
(`--xla_cpu_experimental_ynn_fusion_type=dot`, an experimental XLA flag), which trained the
main job's model 1.3x as fast on a 2-core Intel Xeon with the same float32 results to 1.4e-6 of
the largest (B/16's features). On B/16 at batch 8 it costs about a tenth (1.9-2.15 against
2.1-2.25 images/s): naming "dot" replaces XLA's default list, which holds "reduce" in jaxlib
0.10 (though its help calls the list empty), and without YNNPACK's reductions XLA:CPU rewrites
each reduction (LayerNorm's, softmax's) into a tree of reduce-windows, ten times slower on
B/16's softmax. "dot,reduce" keeps B/16's speed but loses the main job's gain (1,390-1,460
against 1,740-1,920 images/s), and so does an empty list, no YNNPACK fusions at all (the main
job 1,556-1,634 against 1,743-1,838 images/s, alternated from a fresh clone, though B/16 ran
10-16% faster in three pairs of four), so the flag stays "dot". The flag is experimental: an
XLA that does not know it stops at start-up, so it is set only for the jaxlib releases it was
measured on (JAXLIB_WITH_FLAG).

Both are read when a process starts (the tunables by the dynamic loader, the flag when JAX
starts its CPU backend), so `python -m train.main` restarts itself once (`os.execve`: the same
process id and arguments, the environment plus these) before TensorFlow and JAX load. Each is
left as it is where it cannot help or is already decided: another allocator preloaded
(tcmalloc, as on Cloud TPU VMs, or jemalloc), a system other than Linux with glibc 2.26+, the
user's own GLIBC_TUNABLES naming any of malloc's tunables or XLA_FLAGS setting the same flag;
all of it on other Keras backends and with KERAS_VIT_JAX_CPU_SETTINGS=off. The standard library
only here: it runs before anything else loads."""

import json
import os
import sys
from importlib import metadata

TUNABLE = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"  # 1 TiB
XLA_FLAG = "--xla_cpu_experimental_ynn_fusion_type=dot"
JAXLIB_WITH_FLAG = ((0, 10), (0, 11))  # [first, last) jaxlib releases measured with XLA_FLAG
SWITCH = "KERAS_VIT_JAX_CPU_SETTINGS"  # "off": the process as it is; the restart sets "on"


def tunables_for(environ, libc):
    """The GLIBC_TUNABLES a JAX run should start with, or None to leave them.

    Args:
        environ: the process's environment (a mapping).
        libc: `os.confstr("CS_GNU_LIBC_VERSION")`, e.g. "glibc 2.36"; None elsewhere.
    """
    if not _version_at_least(libc, "glibc", (2, 26)):
        return None
    if "malloc" in environ.get("LD_PRELOAD", ""):  # libtcmalloc*, libjemalloc, libmimalloc
        return None
    # Any malloc tunable of the user's own means they chose malloc's behaviour: left alone.
    return _added(environ.get("GLIBC_TUNABLES", ""), TUNABLE, "glibc.malloc.", ":")


def xla_flags_for(environ, jaxlib_version):
    """The XLA_FLAGS a JAX run should start with, or None to leave them. `jaxlib_version`:
    the installed jaxlib's version string, or None where it is not installed."""
    first, last = JAXLIB_WITH_FLAG
    version = _release(jaxlib_version)
    if version is None or not first <= version < last:
        return None
    return _added(environ.get("XLA_FLAGS", ""), XLA_FLAG, "xla_cpu_experimental_ynn_fusion_type",
                  " ")


def environment(environ, backend):
    """`environ` with what `tunables_for` and `xla_flags_for` add, for a process of Keras'
    `backend` to start with (train.main restarts into it; benchmarks start their JAX processes
    with it); `environ` itself where they add nothing. ValueError for a switch that is
    neither "off" nor "on"."""
    switch = environ.get(SWITCH)
    if switch not in (None, "", "off", "on"):
        raise ValueError(f"{SWITCH}={switch!r} is not a setting: set it to 'off' to leave the "
                         "process as it is, or unset it.")
    if backend != "jax" or switch:
        return environ
    settings = {"GLIBC_TUNABLES": tunables_for(environ, _libc()),
                "XLA_FLAGS": xla_flags_for(environ, _jaxlib_version())}
    settings = {name: value for name, value in settings.items() if value is not None}
    if not settings:
        return environ
    return dict(environ, **settings, **{SWITCH: "on"})


def restart_with_settings():
    """Restarts this command in `environment` where that differs (see the module doc); returns
    where the process runs as it is, and exits with one line for a bad switch."""
    try:
        environ = environment(os.environ, _keras_backend())
    except ValueError as error:
        sys.exit(f"Error: {error}")
    if environ is os.environ:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)


def active(environ):
    """What of this module's settings `environ` holds, in words (for the run's log)."""
    words = []
    if TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        words.append("glibc's malloc keeping freed memory")
    if XLA_FLAG in environ.get("XLA_FLAGS", ""):
        words.append("XLA:CPU's YNNPACK matrix products")
    return words


def _added(current, setting, name, separator):
    """`current` (a variable's value) with `setting` after it, or None where `current` names
    `name` already: the user's own choice wins."""
    if name in current:
        return None
    return f"{current}{separator}{setting}" if current else setting


def _release(version):
    """(major, minor) of a version string such as "0.10.2" or "0.10.2.dev20260101"."""
    parts = (version or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _version_at_least(libc, name, version):
    """Whether `libc` ("glibc 2.36") is `name` at `version` or later."""
    found, _, number = (libc or "").partition(" ")
    release = _release(number)
    return found == name and release is not None and release >= version


def _libc():
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or not glibc
        return None


def _jaxlib_version():
    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


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

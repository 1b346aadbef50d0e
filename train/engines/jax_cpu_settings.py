"""What a run on Keras' JAX backend asks of JAX's CPU runtime: glibc's malloc keeping the memory
it frees (for the whole process, before it starts), and for hybrids YNNPACK for XLA:CPU's matrix
products only (for the training and evaluation steps, as they compile).

Memory. JAX's CPU runtime allocates a step's temporaries afresh at every call. By default glibc's
malloc maps large blocks on their own and unmaps them when freed, and trims freed memory at the
top of its heaps, so the step page-faults on the same memory again at every call: 7.6 million
page faults in 300 steps of the README's main job. Two tunables (glibc 2.26 and later; glibc's
manual, "Memory Allocation Tunables":
https://sourceware.org/glibc/manual/latest/html_node/Memory-Allocation-Tunables.html) make it
keep that memory for the next step, as tcmalloc does: `glibc.malloc.mmap_max=0` (no block is
mapped on its own) and a `glibc.malloc.trim_threshold` of 1 TiB (no heap is trimmed or given
back). On a 2-core Intel Xeon with AMX, 3 runs of 100 of the main job's training steps each
(`/usr/bin/time`'s minor faults of the whole process, with YNNPACK's products below):

| malloc | images/s | page faults | peak resident |
|---|---|---|---|
| `mmap_max=0`, `trim_threshold` 1 TiB (this module's) | 2,207-2,258 | 0.26 million | 1.42 GB |
| on huge pages (`hugetlb=1`, this module's before) | 1,905-2,002 | 0.38 million | 1.39 GB |
| `mmap_threshold` 32 MiB (glibc's cap), `trim_threshold` 4 GiB | 1,722-1,741 | 6.4 million | |

Huge pages also slowed B/16's step (batch 8) by a quarter once the process had been idle for
10 s, as a benchmark's processes are between their timed runs: 1.46-1.51 images/s against
1.95-2.0 back to back; 1.77-1.84 after the same pause with this module's tunables. One arena
for every thread (`arena_max=1`) made the threads wait for each other.

Matrix products. XLA:CPU hands some kernels to YNNPACK (the option
`xla_cpu_experimental_ynn_fusion_type`, an experimental XLA flag that a compilation can also set
for itself). Its default list in jaxlib 0.10 holds the matrix products, the reductions and the
convolutions (though its help calls the list empty); naming "dot" alone replaces it: YNNPACK
computes the matrix products, with the same float32 results to 1.4e-6 of the largest (B/16's
features), and XLA its own reductions (as trees of reduce-windows, ten times slower on B/16's
softmax) and convolutions.
Which is faster depends on the model. The engine's step on a 2-core Intel Xeon with AMX, the
option set per compilation, alternated in one hour, two rounds (one for R50+B/16), images/s:

| model (hidden size), image size, batch | "dot" | XLA's default |
|---|---|---|
| the main job's hybrid R+Ti (64), 32px, 128 | 1,754-1,849 | 1,037-1,110 |
| R50+B/16 (768), 224px, 8 | 0.816-0.823 | 0.751-0.777 |
| a plain ViT 64 wide (8x8 patches), 32px, 128 | 561-681 | 619-724 |
| Ti/16 (192), 32px, 128 | 379-504 | 427-501 |
| Ti/16 at 128 wide, 224px, 8 | 14.3-17.3 | 17.1-18.6 |
| Ti/16 (192), 224px, 8 | 10.5-12.4 | 11.2-13.1 |
| S/16 (384), 224px, 8 | 3.97-4.24 | 4.34-4.60 |
| B/16 (768), 224px, 8 | 1.35-1.54 | 1.61-1.73 |

The hybrid's ResNet stem is what differs: under the default list its convolutions and its
GroupNorms' reductions are YNNPACK's, and in the main job's traced step they took 46 ms of
120 (`benchmarks/step_profile.py`). So `compile_options` names "dot" for hybrids and leaves
XLA's default to plain ViTs. Until this choice per model, the process's flag set "dot" for every
model (B/16: 1.49-1.56 images/s in the same hour). The option is experimental and a jaxlib that
does not know it refuses to compile, so it is set for the jaxlib releases it was measured on
(JAXLIB_WITH_YNN_DOTS).

The tunables are read when a process starts (by the dynamic loader), so `python -m train.main`
restarts itself once (`os.execve`: the same process id and arguments, the environment plus
them) before TensorFlow and JAX load. Each setting is left as it is where it cannot help or is
already decided: another allocator preloaded (tcmalloc, as on Cloud TPU VMs, or jemalloc), a
system other than Linux with glibc 2.26+, devices other than CPUs, the user's own
GLIBC_TUNABLES naming any of malloc's tunables or XLA_FLAGS naming the option; all of it on
other Keras backends and with KERAS_VIT_JAX_CPU_SETTINGS=off. The standard library
only here: it runs before anything else loads."""

import json
import os
import sys
from importlib import metadata

TUNABLE = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"  # 1 TiB
YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"  # XLA's flag, also a compile option
YNN_DOTS = "LIBRARY_FUSION_TYPE_DOT"
JAXLIB_WITH_YNN_DOTS = ((0, 10), (0, 11))  # [first, last) jaxlib releases measured with it
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


def compile_options(environ, platform, hybrid):
    """XLA's compile options for the training and evaluation steps of a model on devices of
    `platform` ("cpu", "tpu", ...): on CPU, for a `hybrid` (a ResNet stem), YNNPACK for the
    matrix products only; {} otherwise (XLA's default), and {} where the user decided
    (KERAS_VIT_JAX_CPU_SETTINGS=off, or XLA_FLAGS naming the option) or for a jaxlib it was not
    measured on (one that does not know the option refuses to compile)."""
    first, last = JAXLIB_WITH_YNN_DOTS
    version = _release(_jaxlib_version())
    if (platform != "cpu" or not hybrid or environ.get(SWITCH) == "off"
            or YNN_OPTION in environ.get("XLA_FLAGS", "")
            or version is None or not first <= version < last):
        return {}
    return {YNN_OPTION: YNN_DOTS}


def environment(environ, backend):
    """`environ` with what `tunables_for` adds, for a process of Keras' `backend` to start with
    (train.main restarts into it; benchmarks start their JAX processes with it); `environ`
    itself where it adds nothing. ValueError for a switch that is neither "off" nor "on"."""
    switch = environ.get(SWITCH)
    if switch not in (None, "", "off", "on"):
        raise ValueError(f"{SWITCH}={switch!r} is not a setting: set it to 'off' to leave the "
                         "process as it is, or unset it.")
    if backend != "jax" or switch:
        return environ
    tunables = tunables_for(environ, _libc())
    if tunables is None:
        return environ
    return dict(environ, GLIBC_TUNABLES=tunables, **{SWITCH: "on"})


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


def active(environ, options):
    """What of this module's settings `environ` (the process's) and `options` (a step's
    `compile_options`) hold, in words (for the run's log)."""
    words = []
    if TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        words.append("glibc's malloc keeping freed memory, set at start-up")
    if options.get(YNN_OPTION) == YNN_DOTS:
        words.append("YNNPACK for XLA:CPU's matrix products only, for a hybrid's ResNet stem")
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

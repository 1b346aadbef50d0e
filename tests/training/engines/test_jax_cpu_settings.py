"""train.engines.jax_cpu_settings: what a run on the JAX backend restarts with (glibc's malloc
keeping freed memory, XLA:CPU's YNNPACK dots), and that `python -m train.main` restarts with
it."""

import os
import subprocess
import sys

import pytest

from train_fixtures import REPO
from train.engines import jax_cpu_settings as settings

GLIBC = "glibc 2.36"
TCMALLOC = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}


@pytest.mark.parametrize("environ, libc, expected", [
    ({}, GLIBC, settings.TUNABLE),
    ({}, "glibc 2.26", settings.TUNABLE),
    ({"GLIBC_TUNABLES": "glibc.cpu.x86_rep_movsb_threshold=4096"}, GLIBC,
     "glibc.cpu.x86_rep_movsb_threshold=4096:" + settings.TUNABLE),  # the user's tunables kept
    ({}, "glibc 2.25", None),  # no malloc tunables before 2.26
    ({}, None, None),  # not glibc (musl, macOS)
    ({}, "glibc 2.x", None),
    (TCMALLOC, GLIBC, None),  # Cloud TPU VMs
    ({"LD_PRELOAD": "libjemalloc.so.2"}, GLIBC, None),
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=4"}, GLIBC, None),  # the user's choice
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, GLIBC, None),  # of malloc: theirs alone
])
def test_tunables_for(environ, libc, expected):
    assert settings.tunables_for(environ, libc) == expected


FAULTS_OF_REUSE = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def touch_and_free(size):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
touch_and_free(48 << 20)  # a step's temporaries, the first time
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    touch_and_free(48 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_tunables_make_malloc_keep_freed_memory():
    """A 48 MiB block allocated, written and freed five more times: glibc's default maps and
    unmaps it each time (a page fault per 4 KiB page), with the tunables it is reused."""
    if settings.tunables_for({}, settings._libc()) is None:
        pytest.skip("not glibc 2.26 or later")
    env = {name: value for name, value in os.environ.items()
           if name not in ("LD_PRELOAD", "GLIBC_TUNABLES")}

    def faults(**environ):
        result = subprocess.run([sys.executable, "-c", FAULTS_OF_REUSE], env=dict(env, **environ),
                                capture_output=True, text=True, timeout=60, check=True)
        return int(result.stdout)

    assert faults() > 5 * (48 << 20) // 4096 // 2  # most pages fault again every time
    assert faults(GLIBC_TUNABLES=settings.TUNABLE) < 100


@pytest.mark.parametrize("environ, jaxlib, expected", [
    ({}, "0.10.2", settings.XLA_FLAG),
    ({}, "0.10.0.dev20260101", settings.XLA_FLAG),
    ({"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true"}, "0.10.2",
     "--xla_cpu_use_thunk_runtime=true " + settings.XLA_FLAG),  # the user's flags kept
    ({"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=eltwise"}, "0.10.2", None),
    ({}, "0.9.1", None),  # not measured: an XLA that does not know the flag would stop
    ({}, "0.11.0", None),
    ({}, "1.0", None),
    ({}, None, None),  # no jaxlib
    ({}, "unknown", None),
])
def test_xla_flags_for(environ, jaxlib, expected):
    assert settings.xla_flags_for(environ, jaxlib) == expected


def test_the_environment_adds_them_only_for_jax_and_not_when_switched_off(monkeypatch):
    monkeypatch.setattr(settings, "_libc", lambda: GLIBC)
    monkeypatch.setattr(settings, "_jaxlib_version", lambda: "0.10.2")
    environ = {"PATH": "/bin"}
    assert settings.environment(environ, "jax") == {
        "PATH": "/bin", "GLIBC_TUNABLES": settings.TUNABLE, "XLA_FLAGS": settings.XLA_FLAG,
        settings.SWITCH: "on"}
    assert settings.environment(dict(environ, **TCMALLOC), "jax") == dict(
        environ, **TCMALLOC, XLA_FLAGS=settings.XLA_FLAG, **{settings.SWITCH: "on"})
    for backend in ("tensorflow", "torch"):
        assert settings.environment(environ, backend) is environ
    for switch in ("off", "on"):  # turned off, or restarted already
        switched = dict(environ, **{settings.SWITCH: switch})
        assert settings.environment(switched, "jax") is switched
    monkeypatch.setattr(settings, "_jaxlib_version", lambda: "0.9.0")
    monkeypatch.setattr(settings, "_libc", lambda: None)
    assert settings.environment(environ, "jax") is environ
    assert settings.active(environ) == []
    assert settings.active({"GLIBC_TUNABLES": settings.TUNABLE, "XLA_FLAGS": settings.XLA_FLAG}) \
        == ["glibc's malloc keeping freed memory", "XLA:CPU's YNNPACK matrix products"]


@pytest.mark.parametrize("switch", ["no", "0", "OFF", "true", " off"])
def test_a_switch_that_is_not_off_is_refused_naming_it(switch):
    for backend in ("jax", "tensorflow"):
        with pytest.raises(ValueError, match=f"KERAS_VIT_JAX_CPU_SETTINGS='{switch}' is not a "
                                             "setting: set it to 'off'"):
            settings.environment({settings.SWITCH: switch}, backend)


def test_the_backend_is_read_as_keras_reads_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert settings._keras_backend() == "tensorflow"  # no keras.json: Keras' default
    (tmp_path / "keras.json").write_text('{"backend": "jax", "floatx": "float32"}')
    assert settings._keras_backend() == "jax"
    (tmp_path / "keras.json").write_text("{not json")
    assert settings._keras_backend() == "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert settings._keras_backend() == "torch"


def test_train_main_restarts_once_with_the_settings_on_jax(tmp_path):
    """Each start of the interpreter prints its GLIBC_TUNABLES and XLA_FLAGS (a sitecustomize
    on the path): `python -m train.main` on JAX starts twice, the second time with what
    `environment` adds, and parses its flags there; on TensorFlow, or with the switch off, it
    starts once."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nprint('start:', os.environ.get('GLIBC_TUNABLES'), "
        "os.environ.get('XLA_FLAGS'), flush=True)\n")
    kept = ("LD_PRELOAD", "GLIBC_TUNABLES", "XLA_FLAGS", settings.SWITCH)
    env = {name: value for name, value in os.environ.items() if name not in kept}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{REPO}"
    restarted = settings.environment(dict(env, KERAS_BACKEND="jax"), "jax")

    def starts(**environ):
        result = subprocess.run([sys.executable, "-m", "train.main", "--help"], cwd=REPO,
                                env=dict(env, **environ), capture_output=True, text=True,
                                timeout=300)
        assert "--workdir" in result.stdout, result.stderr[-2000:]  # absl's help exits 1
        return [line for line in result.stdout.splitlines() if line.startswith("start:")]

    if restarted.get(settings.SWITCH) != "on":
        pytest.skip("this machine's glibc, kernel and jaxlib leave the process as it is")
    second = f"start: {restarted.get('GLIBC_TUNABLES')} {restarted.get('XLA_FLAGS')}"
    assert starts(KERAS_BACKEND="jax") == ["start: None None", second]
    assert starts(KERAS_BACKEND="jax", **{settings.SWITCH: "off"}) == ["start: None None"]
    assert starts(KERAS_BACKEND="tensorflow") == ["start: None None"]
    bad = subprocess.run([sys.executable, "-m", "train.main", "--help"], cwd=REPO,
                         env=dict(env, KERAS_BACKEND="jax", **{settings.SWITCH: "no"}),
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert bad.stderr.strip() == ("Error: KERAS_VIT_JAX_CPU_SETTINGS='no' is not a setting: set "
                                  "it to 'off' to leave the process as it is, or unset it."), \
        bad.stderr

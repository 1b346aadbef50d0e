"""train.engines.malloc: when a run on the JAX backend restarts with glibc's malloc on
transparent huge pages, and that `python -m train.main` does restart with them."""

import os
import subprocess
import sys

import pytest

from train_fixtures import REPO
from train.engines import malloc

GLIBC = "glibc 2.36"
JAX_RUN = {"KERAS_BACKEND": "jax"}


@pytest.mark.parametrize("environ, libc, thp_mode, backend, expected", [
    (JAX_RUN, GLIBC, "madvise", "jax", malloc.TUNABLE),
    (JAX_RUN, "glibc 2.35", "always", "jax", malloc.TUNABLE),
    (dict(JAX_RUN, GLIBC_TUNABLES="glibc.malloc.tcache_count=0"), GLIBC, "madvise", "jax",
     "glibc.malloc.tcache_count=0:" + malloc.TUNABLE),  # the user's tunables kept
    (JAX_RUN, GLIBC, "madvise", "tensorflow", None),
    (JAX_RUN, GLIBC, "madvise", "torch", None),
    (JAX_RUN, "glibc 2.34", "madvise", "jax", None),  # no hugetlb tunable before 2.35
    (JAX_RUN, None, "madvise", "jax", None),  # not glibc (musl, macOS)
    (JAX_RUN, "glibc 2.x", "madvise", "jax", None),
    (JAX_RUN, GLIBC, "never", "jax", None),  # huge pages off: nothing to gain
    (JAX_RUN, GLIBC, None, "jax", None),
    (dict(JAX_RUN, LD_PRELOAD="/usr/lib/libtcmalloc_minimal.so.4"), GLIBC, "madvise", "jax",
     None),  # Cloud TPU VMs
    (dict(JAX_RUN, LD_PRELOAD="libjemalloc.so.2"), GLIBC, "madvise", "jax", None),
    (dict(JAX_RUN, KERAS_VIT_MALLOC="system"), GLIBC, "madvise", "jax", None),  # opted out
    (dict(JAX_RUN, KERAS_VIT_MALLOC="hugetlb"), GLIBC, "madvise", "jax", None),  # restarted
    (dict(JAX_RUN, GLIBC_TUNABLES="glibc.malloc.hugetlb=0"), GLIBC, "madvise", "jax", None),
])
def test_tunables_for(environ, libc, thp_mode, backend, expected):
    assert malloc.tunables_for(environ, libc, thp_mode, backend) == expected


def test_the_backend_is_read_as_keras_reads_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert malloc._keras_backend() == "tensorflow"  # no keras.json: Keras' default
    (tmp_path / "keras.json").write_text('{"backend": "jax", "floatx": "float32"}')
    assert malloc._keras_backend() == "jax"
    (tmp_path / "keras.json").write_text("{not json")
    assert malloc._keras_backend() == "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert malloc._keras_backend() == "torch"


def test_train_main_restarts_once_with_the_tunable_on_jax(tmp_path):
    """Each start of the interpreter prints its GLIBC_TUNABLES (a sitecustomize on the path):
    `python -m train.main` on JAX starts twice, the second time with the tunable, and parses
    its flags there; on TensorFlow, or with KERAS_VIT_MALLOC=system, it starts once."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nprint('start:', os.environ.get('GLIBC_TUNABLES'), flush=True)\n")
    expected = malloc.tunables_for(JAX_RUN, malloc._libc(), malloc._thp_mode(), "jax")

    def starts(**environ):
        env = {name: value for name, value in os.environ.items()
               if name not in ("LD_PRELOAD", "GLIBC_TUNABLES", malloc.SWITCH)}
        env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}", **environ)
        result = subprocess.run([sys.executable, "-m", "train.main", "--help"], cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=300)
        assert "--workdir" in result.stdout, result.stderr[-2000:]  # absl's help exits 1
        return [line for line in result.stdout.splitlines() if line.startswith("start:")]

    if expected is None:
        pytest.skip("this machine's glibc or kernel gives huge pages nothing to do")
    assert starts(KERAS_BACKEND="jax") == ["start: None", f"start: {malloc.TUNABLE}"]
    assert starts(KERAS_BACKEND="jax", KERAS_VIT_MALLOC="system") == ["start: None"]
    assert starts(KERAS_BACKEND="tensorflow") == ["start: None"]

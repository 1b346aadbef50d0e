"""train.engines.jax_cpu_settings: what a run on the JAX backend restarts with (glibc's malloc
keeping freed memory), that `python -m train.main` restarts with it, and which library computes
a step's kernels on CPU (YNNPACK's matrix products only, for a hybrid)."""

import json
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


DOTS = {settings.YNN_OPTION: settings.YNN_DOTS}


@pytest.mark.parametrize("environ, platform, hybrid, jaxlib, expected", [
    ({}, "cpu", True, "0.10.2", DOTS),
    ({}, "cpu", True, "0.10.0.dev20260101", DOTS),
    ({"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true"}, "cpu", True, "0.10.2", DOTS),
    ({}, "cpu", False, "0.10.2", {}),  # a plain ViT: XLA's default
    ({}, "tpu", True, "0.10.2", {}),
    ({}, "gpu", True, "0.10.2", {}),
    ({"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}, "cpu", False, "0.10.2", {}),
    ({"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}, "cpu", True, "0.10.2", {}),
    ({settings.SWITCH: "off"}, "cpu", True, "0.10.2", {}),
    ({settings.SWITCH: "on"}, "cpu", True, "0.10.2", DOTS),  # restarted
    ({}, "cpu", True, "0.9.1", {}),  # not measured: an XLA that does not know it would refuse
    ({}, "cpu", True, "0.11.0", {}),
    ({}, "cpu", True, None, {}),  # no jaxlib
    ({}, "cpu", True, "unknown", {}),
])
def test_compile_options(environ, platform, hybrid, jaxlib, expected, monkeypatch):
    monkeypatch.setattr(settings, "_jaxlib_version", lambda: jaxlib)
    assert settings.compile_options(environ, platform, hybrid) == expected


def test_the_environment_adds_them_only_for_jax_and_not_when_switched_off(monkeypatch):
    monkeypatch.setattr(settings, "_libc", lambda: GLIBC)
    environ = {"PATH": "/bin"}
    assert settings.environment(environ, "jax") == {
        "PATH": "/bin", "GLIBC_TUNABLES": settings.TUNABLE, settings.SWITCH: "on"}
    with_tcmalloc = dict(environ, **TCMALLOC)
    assert settings.environment(with_tcmalloc, "jax") is with_tcmalloc  # no restart
    for backend in ("tensorflow", "torch"):
        assert settings.environment(environ, backend) is environ
    for switch in ("off", "on"):  # turned off, or restarted already
        switched = dict(environ, **{settings.SWITCH: switch})
        assert settings.environment(switched, "jax") is switched
    monkeypatch.setattr(settings, "_libc", lambda: None)
    assert settings.environment(environ, "jax") is environ
    assert settings.active(environ, {}) == []
    assert settings.active({"GLIBC_TUNABLES": settings.TUNABLE}, DOTS) == [
        "glibc's malloc keeping freed memory, set at start-up",
        "YNNPACK for XLA:CPU's matrix products only, for a hybrid's ResNet stem"]


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


COMPILED_KERNELS = """
import json, re
import jax
from configs import common
from train.engines.jax_mesh import make_distribution
from train.engines.jax_step import JaxStep
# YNNPACK fusions of matrix products, and of anything else (XLA's default list: reductions).
PRODUCTS = re.compile('op_name="[^"]*dot_general"[^\\n]*"__ynn_fusion"')
OTHERS = re.compile('op_name="[^"]*(?<!dot_general)"[^\\n]*"__ynn_fusion"')
found = {}
for variant in ("R+Ti/16", "Ti/16"):
    config = common.get_config()
    config.model.update(variant=variant, hidden_size=64, mlp_dim=128, num_heads=2, num_layers=1)
    config.update(image_size=32, batch_size=4)
    step = JaxStep(config, 10, make_distribution(1), abstract=True)
    batch = step.batch_spec(4, 32)
    evaluated = dict(batch, mask=jax.ShapeDtypeStruct((4,), "float32"))  # padding's mask
    texts = [step.train_step.lower(step.state, batch).compile().as_text(),
             step.eval_step.lower(step.state, evaluated).compile().as_text()]
    found[variant] = [step.compile_options] + [
        [bool(PRODUCTS.search(text)), bool(OTHERS.search(text))] for text in texts]
print(json.dumps(found))
"""


def test_on_cpu_a_hybrid_gives_ynnpack_only_its_products_a_plain_vit_xlas_default_list():
    """The compiled training and evaluation steps on CPU: a hybrid's hold YNNPACK fusions of
    matrix products and of nothing else; a plain ViT's those of XLA's default list (products
    and reductions); with the switch off both the default."""
    pytest.importorskip("jax")
    if settings.compile_options({}, "cpu", True) == {}:
        pytest.skip("a jaxlib the option was not measured on")
    env = {name: value for name, value in os.environ.items()
           if name not in ("XLA_FLAGS", settings.SWITCH)}
    env.update(KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)

    def kernels(**environ):
        result = subprocess.run([sys.executable, "-c", COMPILED_KERNELS], cwd=REPO,
                                env=dict(env, **environ), capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.splitlines()[-1])

    default = [{}, [True, True], [True, True]]
    assert kernels() == {"R+Ti/16": [DOTS, [True, False], [True, False]], "Ti/16": default}
    assert kernels(**{settings.SWITCH: "off"}) == {"R+Ti/16": default, "Ti/16": default}

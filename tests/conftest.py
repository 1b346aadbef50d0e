"""Shared pytest set-up: quiet TensorFlow's C++ logging before anything imports it, and the
fixtures several test modules use."""

import collections
import os
import subprocess

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The benchmarks the tests start (and their children) measure the machine's matmul peak on a
# small matrix: the tests check that they run, not the peak (benchmarks/machine.py).
os.environ.setdefault("BENCHMARK_PEAK_SIZE", "256")


def pytest_collection_finish(session):
    """Moves every object alive after collection (TensorFlow's, Keras', JAX's modules: some
    400,000) out of the garbage collector's reach for the rest of the session: each full
    collection (the TFLite converter runs one per conversion) then scans only what the tests
    made. 0.33 s a full collection before, 0.09 s after; the library's tests took 5% less
    (https://docs.python.org/3/library/gc.html#gc.freeze)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_configure(config):
    # Raised inside Keras' TensorFlow backend when it converts variables to numpy (numpy 2 API
    # change); nothing keras_vit can act on.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning",
    )
    config.addinivalue_line(
        "markers", "slow: builds or installs the package (deselect with -m 'not slow')")
    config.addinivalue_line(
        "markers", "processes: starts several training processes (workers, JAX processes, a "
        "study's runs, simulated hosts, many commands at once) or kills and resumes one; not "
        "in the default run (pyproject.toml's "
        "addopts), run them with `python -m pytest -q -n auto tests -m processes`")


@pytest.fixture(scope="session")
def fake_fmnist(tmp_path_factory):
    """The fake Fashion-MNIST of train_fixtures, written and prepared (TFDS) once per session."""
    from train_fixtures import fake_fashion_mnist
    return fake_fashion_mnist(tmp_path_factory.mktemp("fake_fmnist"))


QuickstartRun = collections.namedtuple("QuickstartRun", "workdir output")


@pytest.fixture(scope="session")
def quickstart_run(fake_fmnist, tmp_path_factory):
    """A finished tiny quickstart run with its export, as `python -m train.main` leaves it
    (`workdir`) and prints it (`output`, written to a file as in a log or CI, with the quieting
    of these fixtures taken off). It prepares its own copy of the fake data, as a first run
    does. The docs' `trained:` blocks read the workdir, tests/training/console/test_cli_output.py
    the output; run once per session (`built_once`)."""
    from train_fixtures import REPO, built_once, main_command

    def run(folder):
        env = fake_fmnist.env()
        del env["TF_CPP_MIN_LOG_LEVEL"]  # the fixtures' quieting; the CLI's own is tested
        del env["CUDA_VISIBLE_DEVICES"]  # hid the GPUs, and with them TensorFlow's cuInit error
        command = main_command(fake_fmnist, str(folder / "vit_quickstart"),
                               "--config.export=True", f"--config.data_dir={folder / 'tfds'}")
        with open(folder / "output.log", "w") as log:
            returncode = subprocess.run(command, cwd=REPO, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, timeout=600).returncode
        output = (folder / "output.log").read_text()
        assert returncode == 0, f"the quickstart run failed:\n{output[-4000:]}"

    folder = built_once(tmp_path_factory, "quickstart_run", run)
    return QuickstartRun(str(folder / "vit_quickstart"), (folder / "output.log").read_text())


@pytest.fixture
def fresh_session():
    """Keras' global state cleared and its seed set, so a test does not depend on the ones
    before it (modules use it with `pytestmark = pytest.mark.usefixtures("fresh_session")`)."""
    import keras  # here, not at the top: some test modules never import TensorFlow
    keras.backend.clear_session(free_memory=False)  # cheap; big models free their own memory
    keras.utils.set_random_seed(0)
    yield

"""Shared pytest set-up: quiet TensorFlow's C++ logging before anything imports it, and the
fixtures several test modules use."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The benchmarks the tests start (and their children) measure the machine's matmul peak on a
# small matrix: the tests check that they run, not the peak (benchmarks/machine.py).
os.environ.setdefault("BENCHMARK_PEAK_SIZE", "256")


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


@pytest.fixture
def fresh_session():
    """Keras' global state cleared and its seed set, so a test does not depend on the ones
    before it (modules use it with `pytestmark = pytest.mark.usefixtures("fresh_session")`)."""
    import keras  # here, not at the top: some test modules never import TensorFlow
    keras.backend.clear_session(free_memory=False)  # cheap; big models free their own memory
    keras.utils.set_random_seed(0)
    yield

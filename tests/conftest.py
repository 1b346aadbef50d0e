"""Shared pytest set-up: quiet TensorFlow's C++ logging before anything imports it."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_configure(config):
    # Raised inside Keras' TensorFlow backend when it converts variables to numpy (numpy 2 API
    # change); nothing keras_vit can act on.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning",
    )

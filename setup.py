"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) for Keras 3 and TensorFlow."""

import re
from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
version = re.search(r'__version__ = "([^"]+)"', (here / "keras_vit" / "__init__.py").read_text())[1]

TENSORFLOW = "tensorflow>=2.19,<2.22"
# The training driver's tools, whichever engine: flags, configs, datasets, logs.
HUB = ["safetensors", "huggingface_hub"]
TRAIN_TOOLS = ["absl-py", "ml-collections", "tensorflow-datasets", "importlib_resources",
               "tensorboard"]

setup(
    name="keras_vit",
    version=version,
    description="Vision Transformer (ViT) for Keras 3: every released variant, faithful numerics.",
    long_description=(here / "README.md").read_text(),
    long_description_content_type="text/markdown",
    # The wheel installs one top-level name, keras_vit: the repository's train/ (with its
    # rooms, train/data/, train/engines/, ...) and configs/ folders go in as keras_vit.train
    # and keras_vit.configs (in a checkout they stay the top-level `train` and `configs`, for
    # `python -m train.main --config=configs/...`).
    packages=[*find_packages(include=["keras_vit", "keras_vit.*"]), "keras_vit.train",
              *(f"keras_vit.train.{room}" for room in find_packages(where="train")),
              "keras_vit.configs"],
    package_dir={"keras_vit.train": "train", "keras_vit.configs": "configs"},
    # timm's ViT architectures and their options, read by from_pretrained.
    package_data={"keras_vit.weights.torch_layouts": ["timm_architectures.json"]},
    entry_points={"console_scripts": [
        "keras-vit-train = keras_vit.train.main:run",
        "keras-vit-export = keras_vit.train.export:run",
        "keras-vit-analyze = keras_vit.train.analyze:run",
        "keras-vit-ablate = keras_vit.train.studies.ablate:run",
        "keras-vit-mpp-study = keras_vit.train.studies.mpp:run",
    ]},
    python_requires=">=3.10",
    # The model runs on every Keras backend; TensorFlow comes with the paths that need it (the
    # tf.distribute driver, export, serving), so a JAX machine installs none (".[jax]").
    install_requires=[
        "keras>=3.10",
        "numpy",
    ],
    extras_require={
        "tensorflow": [TENSORFLOW],
        "train": [TENSORFLOW, *TRAIN_TOOLS],
        "serving": [TENSORFLOW, "ai-edge-litert", "tensorflow-serving-api"],
        # ONNX export (keras_vit.export.export_onnx, train.export --onnx) and ONNX Runtime to
        # run the file; tf2onnx converts the model's TensorFlow graph.
        "onnx": [TENSORFLOW, "tf2onnx>=1.16", "onnx>=1.14", "onnxruntime"],
        "analysis": ["matplotlib"],
        # The JAX engine, without TensorFlow: KERAS_BACKEND=jax python -m train.main ... reads
        # ArrayRecord datasets and the offline default through Grain. On a TPU VM add
        # "jax[tpu]"; with ".[train]" too it also reads TFRecord datasets and image folders.
        "jax": ["jax", "orbax-checkpoint", "grain", "array_record", "pillow", "threadpoolctl",
                *TRAIN_TOOLS],
        # from_pretrained / save_pretrained: transformers' and timm's files, hub names.
        "hub": HUB,
        # pytest-xdist: the README's test commands run on every core (-n auto); OpenVINO runs
        # the ONNX files in the tests beside ONNX Runtime.
        "test": ["pytest>=7.3", "pytest-xdist", "matplotlib", "openvino", *HUB, *TRAIN_TOOLS],
        "benchmark": ["keras-hub"],
    },
    license="Apache-2.0",
)

"""What an installed package holds (setup.py): one top-level name, keras_vit, with the training
tools as keras_vit.train, the shipped configs as keras_vit.configs, and console scripts; and how
`--config` reads a bare config name (train/run/config_flag.py)."""

import configparser
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from train.run import config_flag

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONSOLE_SCRIPTS = {
    "keras-vit-train": "keras_vit.train.main:run",
    "keras-vit-export": "keras_vit.train.export:run",
    "keras-vit-analyze": "keras_vit.train.analyze:run",
    "keras-vit-ablate": "keras_vit.train.studies.ablate:run",
    "keras-vit-mpp-study": "keras_vit.train.studies.mpp:run",
}


def test_a_bare_name_is_the_shipped_config():
    assert config_flag.CONFIGS_PACKAGE == "configs"  # in a checkout; keras_vit.configs installed
    path = config_flag.config_file("quickstart")
    assert os.path.samefile(path, os.path.join(REPO, "configs", "quickstart.py"))
    assert config_flag.load_config_module(path).get_config().dataset == "fashion_mnist_local"
    assert "quickstart" in config_flag.shipped_config_names()
    assert "common" not in config_flag.shipped_config_names()
    # A path still works, and is the same module as the bare name.
    assert (config_flag.load_config_module("configs/finetune.py")
            is config_flag.load_config_module(config_flag.config_file("finetune")))


def test_an_unknown_config_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="no shipped config named 'quikstart'; give one of "
                                         "ablation, augreg, augreg_finetune, finetune, .*quickstart, or a "
                                         "config file"):
        config_flag.config_file("quikstart")


def test_a_copied_config_imports_the_shipped_common(tmp_path):
    """A user's edited copy of a shipped config, anywhere: its `from . import common` works."""
    copy = tmp_path / "my_experiment.py"
    shutil.copy(os.path.join(REPO, "configs", "quickstart.py"), copy)
    config = config_flag.load_config_module(str(copy)).get_config()
    assert config.model.variant == "R+Ti/16"


def test_train_cannot_be_imported_under_both_names():
    """`train` (imported here) loaded again as keras_vit.train would define every flag twice."""
    init = os.path.join(REPO, "train", "__init__.py")
    spec = importlib.util.spec_from_file_location("keras_vit.train", init)
    with pytest.raises(ImportError, match="keras_vit.train is train imported again"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


@pytest.mark.parametrize("old, new, flags, error", [
    ("train.ablate", "train.studies.ablate", ["--study=hybrid", "--steps=0"],
     "Error: --steps=0 must be at least 1."),
    ("train.mpp_study", "train.studies.mpp", ["--pretrain_workdir=run", "--seeds=0"],
     "Error: --seeds=0 must be at least 1."),
])
def test_the_old_study_commands_still_run(old, new, flags, error, tmp_path):
    """`python -m train.ablate` and `train.mpp_study` (the names before train/studies/) say
    the new name in one line, then run the new command with the same flags."""
    returncode, output = _run([sys.executable, "-m", old, *flags, f"--out={tmp_path}"],
                              cwd=REPO)
    assert returncode == 1, output
    lines = output.splitlines()
    assert lines[0] == (f"Warning: python -m {old} is deprecated; use python -m {new} (the same "
                        "flags)."), output
    assert error in lines, output


def _run(command, cwd, **env):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env))
    return result.returncode, result.stdout + result.stderr


@pytest.mark.slow
def test_the_wheel_installs_only_keras_vit(tmp_path):
    source = tmp_path / "source"  # a copy, so the build writes nothing into the checkout
    for folder in ("keras_vit", "train", "configs"):
        shutil.copytree(os.path.join(REPO, folder), source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(os.path.join(REPO, name), source / name)
    returncode, output = _run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                               "--no-build-isolation", "-w", str(tmp_path / "dist"), "."],
                              cwd=source)
    assert returncode == 0, output
    (wheel,) = (tmp_path / "dist").glob("keras_vit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = {name.split("/")[0] for name in names}
        assert top_level == {"keras_vit", wheel.name.split("-py")[0] + ".dist-info"}
        assert "keras_vit/train/main.py" in names and "keras_vit/configs/common.py" in names
        rooms = [name for name in sorted(os.listdir(os.path.join(REPO, "train")))
                 if os.path.isfile(os.path.join(REPO, "train", name, "__init__.py"))]
        assert {"run", "engines", "data", "studies"} <= set(rooms), rooms
        for room in rooms:  # every subpackage of train/, with its modules
            assert f"keras_vit/train/{room}/__init__.py" in names, room
        assert "keras_vit/train/data/sources/folder.py" in names
        # from_pretrained reads it
        assert "keras_vit/weights/torch_layouts/timm_architectures.json" in names
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(
            next(name for name in names if name.endswith(".dist-info/entry_points.txt")))
            .decode())
        assert {name: value.strip() for name, value in
                entry_points["console_scripts"].items()} == CONSOLE_SCRIPTS
        archive.extractall(tmp_path / "site")

    # The installed layout, run from outside the checkout: keras_vit.train reads a bare config
    # name from keras_vit/configs (here the config check refuses warmup_steps > total_steps).
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    command = [sys.executable, "-m", "keras_vit.train.main", f"--workdir={tmp_path / 'run'}"]
    returncode, output = _run([*command, "--config=quickstart", "--config.total_steps=2"],
                              cwd=outside, PYTHONPATH=str(tmp_path / "site"))
    assert returncode == 1, output
    assert "config.warmup_steps=100: must be at most config.total_steps=2" in output, output
    returncode, output = _run([*command, "--config=nope"], cwd=outside,
                              PYTHONPATH=str(tmp_path / "site"))
    assert returncode == 1, output
    assert "Error: flag --config=nope: no shipped config named 'nope'; give one of " in output
    # The studies' subpackage imports the driver's modules (keras_vit.train) from its place.
    returncode, output = _run([sys.executable, "-m", "keras_vit.train.studies.ablate",
                               "--study=hybrid", f"--out={tmp_path / 'study'}", "--steps=0"],
                              cwd=outside, PYTHONPATH=str(tmp_path / "site"))
    assert returncode == 1, output
    assert "Error: --steps=0 must be at least 1." in output, output

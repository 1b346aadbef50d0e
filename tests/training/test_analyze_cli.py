"""`python -m train.analyze` on a small model and the fake Fashion-MNIST: the PNG files it writes,
the numbers in analysis.json, the pre-trained checkpoint path, and its errors."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import cli_cases
import keras_vit
from train_fixtures import (FLAT_LAYOUT_CONFIG_JSON, REPO, TINY, override_flags, png_bytes,
                            tiny_config)

FIGURES = ("attention_rollout.png", "attention_distance.png", "position_embeddings.png",
           "embedding_filters.png", "few_shot.png")


@pytest.fixture(scope="module")
def workdir(fake_fmnist, tmp_path_factory):
    """A workdir as training leaves it: export/model.keras, class names and config.json."""
    from train.run import objectives

    root = tmp_path_factory.mktemp("analyze_workdir")
    config = tiny_config(fake_fmnist, model=dict(num_layers=2, representation_size=8))
    model = objectives.build_model(config, num_classes=10)
    os.makedirs(root / "export")
    model.save(root / "export" / "model.keras")
    (root / "export" / "class_names.txt").write_text(
        "\n".join(f"class {index}" for index in range(10)) + "\n")
    (root / "config.json").write_text(config.to_json_best_effort())
    keras_vit.weights.checkpoint.save_npz(model, root / "weights.npz")
    return root


def run_analyze(data, *args):
    env = dict(data.env())
    result = subprocess.run([sys.executable, "-m", "train.analyze", *map(str, args)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)
    return result


def png_size(path):
    import tensorflow as tf
    image = tf.io.decode_png(tf.io.read_file(str(path)))
    return tuple(image.shape[:2]), float(tf.math.reduce_std(tf.cast(image, tf.float32)))


# The flags of the two analyses below: two image files for the rollout, few draws.
ANALYSIS_FLAGS = ("--distance_images=16", "--shots=1,2", "--few_shot_train=200",
                  "--few_shot_test=100", "--draws=2")


@pytest.fixture(scope="module")
def analyses(fake_fmnist, workdir, tmp_path_factory):
    """The analysis of the workdir and of its model as a config naming the model and its .npz
    weights (no workdir), with the same flags: {"workdir": out folder, "npz": out folder}. The
    figures' test reads the first; both are compared below."""
    root = tmp_path_factory.mktemp("analyses")
    rng = np.random.default_rng(0)
    first, second = root / "shirt.png", root / "boot.jpg"
    first.write_bytes(png_bytes(rng.integers(0, 256, size=(40, 30, 1), dtype=np.uint8)))
    import tensorflow as tf
    second.write_bytes(tf.io.encode_jpeg(
        rng.integers(0, 256, size=(50, 60, 3), dtype=np.uint8)).numpy())
    sources = {"workdir": [f"--workdir={workdir}"],
               "npz": ["--config=configs/quickstart.py",
                       f"--config.data_dir={fake_fmnist.data_dir}", *override_flags(TINY),
                       "--config.model.num_layers=2",
                       f"--config.pretrained={workdir / 'weights.npz'}"]}
    outs = {}
    for source, extra in sources.items():
        outs[source] = root / source
        result = run_analyze(fake_fmnist, *extra, f"--out={outs[source]}",
                             f"--images={first},{second}", *ANALYSIS_FLAGS)
        assert result.returncode == 0, f"{source}: {result.stderr[-3000:]}"
    return outs


def test_cli_writes_the_figures(analyses):
    out = analyses["workdir"]
    # Figure sizes follow from plotting's layouts at 100 dpi: the rollout has a column per
    # image; the model has a 4x4 grid (28 px, patch 7) and 16 filters (15 components).
    expected = {"attention_rollout.png": (390, 380), "attention_distance.png": (420, 600),
                "position_embeddings.png": (380, 420), "embedding_filters.png": (470, 440),
                "few_shot.png": (360, 500)}
    for name in FIGURES:
        size, spread = png_size(out / name)
        assert size == expected[name], name
        assert spread > 10, f"{name} is blank"
        assert os.path.getsize(out / name) < 300_000
    results = json.loads((out / "analysis.json").read_text())
    assert results["grid"] == [4, 4] and results["pixel_pitch"] == [7.0, 7.0]
    distance = np.array(results["mean_attention_distance_pixels"])
    assert distance.shape == (2, 2) and np.all(distance > 0)
    assert set(results["few_shot"]["accuracy"]) == {"1", "2"}
    # The fake classes are bright bands: easy even for an untrained model's features.
    assert all(0.1 <= value <= 1.0 for value in results["few_shot"]["accuracy"].values())
    assert not list(out.glob("*.partial"))


def test_cli_on_a_checkpoint(analyses):
    """No workdir: the config names the model and its .npz weights; the same weights give the
    same attention distances and, through the checkpoint's pre-logits (which the config does
    not mention), the same few-shot features as the trained model in the workdir."""
    runs = {source: json.loads((out / "analysis.json").read_text())
            for source, out in analyses.items()}
    np.testing.assert_allclose(runs["npz"]["mean_attention_distance_pixels"],
                               runs["workdir"]["mean_attention_distance_pixels"], atol=1e-3)
    assert set(runs["npz"]["few_shot"]["accuracy"]) == {"1", "2"}
    assert runs["npz"]["few_shot"]["accuracy"] == pytest.approx(
        runs["workdir"]["few_shot"]["accuracy"], abs=1e-9)


def test_cli_on_a_workdir_written_before_config_model(fake_fmnist, workdir, tmp_path):
    """A run whose config.json has the flat model fields (`"model": "Ti/16"`, ...) is analysed
    as before."""
    old = tmp_path / "old_run"
    shutil.copytree(workdir, old)
    (old / "config.json").write_text(json.dumps(dict(
        FLAT_LAYOUT_CONFIG_JSON, data_dir=fake_fmnist.data_dir, num_layers=2,
        representation_size=8)))
    out = tmp_path / "out"
    result = run_analyze(fake_fmnist, f"--workdir={old}", f"--out={out}", "--shots=none",
                         "--num_images=1", "--distance_images=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "analysis.json").read_text())["distance_images"] == 4


ERROR_CASES = {
    # name: (arguments, words of the error)
    "not_an_image": (["--images={bad}"], "is not a PNG, JPEG, GIF or BMP image"),
    "missing_image": (["--images={missing}"], "does not exist"),
    "shots_not_numbers": (["--shots=1,x"], "give whole numbers"),
    "no_distance_images": (["--distance_images=0"], "--distance_images must be at least 1"),
    "l2_reg_zero": (["--l2_reg=0"], "--l2_reg must be > 0"),
    "too_few_examples": (["--shots=60", "--few_shot_train=50", "--num_images=1",
                          "--distance_images=2"], "60-shot needs 60 training examples"),
}


@pytest.fixture(scope="module")
def errors(fake_fmnist, workdir, tmp_path_factory):
    """{case: (result, out folder)} of the cases above, and of "no_model" (a config without
    weights), run in one process (tests/cli_cases.py: TensorFlow imported once)."""
    root = tmp_path_factory.mktemp("analyze_errors")
    bad = root / "bad.png"
    bad.write_bytes(b"not an image at all")
    cases = {name: [f"--workdir={workdir}", f"--out={root / name}",
                    *[arg.format(bad=bad, missing=root / "missing.png") for arg in args]]
             for name, (args, _) in ERROR_CASES.items()}
    cases["no_model"] = ["--config=configs/quickstart.py", f"--out={root / 'no_model'}"]
    results = cli_cases.run("train.analyze", list(cases.values()), env=fake_fmnist.env(),
                            cwd=REPO)
    return {name: (result, root / name) for name, result in zip(cases, results)}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_cli_errors(errors, name):
    result, out = errors[name]
    assert result.returncode != 0
    assert ERROR_CASES[name][1] in result.stderr
    if name == "too_few_examples":  # the figures and numbers before the few-shot step are kept
        assert (out / "analysis.json").exists()


def test_cli_needs_a_model(errors):
    result, _ = errors["no_model"]
    assert result.returncode != 0
    assert "Nothing to analyze" in result.stderr

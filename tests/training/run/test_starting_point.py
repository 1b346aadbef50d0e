"""What a run starts from (train/run/starting_point.py): `config.pretrained` naming any
checkpoint `keras_vit.from_pretrained` reads gives the run its architecture and weights. The
driver's model after loading holds the weights of `from_pretrained(<dir>, num_classes=N,
image_size=S)`, for directories in both libraries' layouts and every architecture option they
carry; the runs of both engines are in tests/training/engines/test_jax_engine.py."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

pytest.importorskip("safetensors")
import cli_cases  # noqa: E402
import keras_vit  # noqa: E402
from keras_vit.weights.hub import from_pretrained, save_pretrained  # noqa: E402
from model_fixtures import random_tiny_vit  # noqa: E402
from train.run import config_checks, objectives, starting_point  # noqa: E402
from train.run.model_config import model_spec  # noqa: E402
from train_fixtures import REPO, TINY, override_flags  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_session")

# Checkpoints of every option the driver must carry through (timm's layout holds them all;
# transformers' the plain ViT).
CHECKPOINTS = {
    "transformers_token": ("transformers", {}),
    "timm_registers_layerscale": ("timm", {"num_register_tokens": 2, "layer_scale_init": 0.1}),
    "timm_gap_fc_norm": ("timm", {"classifier": "gap", "final_norm": "pooled"}),
    "timm_map": ("timm", {"classifier": "map"}),
    "timm_deit_distilled": ("timm", {"distillation_token": True}),
    "transformers_deit_distilled": ("transformers", {"distillation_token": True}),
}


def write_checkpoint(directory, layout, fields, num_classes=5, preprocessing=None):
    model = random_tiny_vit(num_classes=num_classes, **fields)
    model.preprocessing = preprocessing
    save_pretrained(model, directory, format=layout)
    return model


def finetune_config(pretrained, **overrides):
    """configs/finetune.py on the offline default, small: the model left to the checkpoint."""
    from configs import finetune
    config = finetune.get_config("dataset=fashion_mnist_local")
    config.update({name: value for name, value in TINY.items() if name != "model"})
    config.image_size = 48  # 6x6 patches of 8: the checkpoint's 4x4 position grid resampled
    config.pretrained = str(pretrained)
    config.update(overrides)
    return config


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_the_run_takes_the_checkpoints_architecture_and_weights(tmp_path, name):
    layout, fields = CHECKPOINTS[name]
    write_checkpoint(tmp_path / "checkpoint", layout, fields)
    config, start = starting_point.resolve(finetune_config(tmp_path / "checkpoint"))
    assert {"model.hidden_size", "model.num_layers", "model.patch_size"} <= set(start.taken)
    config_checks.check(config)
    model = keras_vit.vit(model_spec(config, num_classes=10))
    for field, value in fields.items():
        assert getattr(model.spec, field) == value
    report = start.load(objectives.make(config, 10), model, config)
    assert report["new_head"] and report["resized"] and not report["missing"]
    expected = from_pretrained(str(tmp_path / "checkpoint"), num_classes=10, image_size=48)
    assert model.spec == expected.spec
    for mine, theirs in zip(model.weights, expected.weights):  # bit-equal, the head zeros
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine),
                                      keras.ops.convert_to_numpy(theirs), err_msg=mine.path)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_layer_decay_ema_and_augreg_take_every_architecture_loaded(tmp_path, name):
    from train.run import optimizers
    layout, fields = CHECKPOINTS[name]
    write_checkpoint(tmp_path / "checkpoint", layout, fields)
    config = finetune_config(tmp_path / "checkpoint", layer_decay=0.75, ema_decay=0.999,
                             augment="medium2", optimizer="adamw", weight_decay=0.05)
    config, _ = starting_point.resolve(config)
    config_checks.check(config)
    model = keras_vit.vit(model_spec(config, num_classes=10))
    scales = optimizers.layer_scales(model, model.trainable_variables, 0.75)
    depth = model.spec.num_layers
    assert len(scales) == len(model.trainable_variables)
    assert min(scales) == pytest.approx(0.75 ** (depth + 1)) and max(scales) == 1.0
    optimizers.build_optimizer(config, model).build(model.trainable_variables)


def test_a_rerun_takes_the_saved_architecture_without_reading_the_checkpoint(tmp_path):
    write_checkpoint(tmp_path / "checkpoint", "timm", {"num_register_tokens": 2})
    first, _ = starting_point.resolve(finetune_config(tmp_path / "checkpoint"))
    saved = json.loads(first.to_json_best_effort())
    (tmp_path / "checkpoint" / "model.safetensors").unlink()  # gone: not read again
    rerun, start = starting_point.resolve(finetune_config(tmp_path / "checkpoint"), saved)
    assert rerun.model.to_dict() == first.model.to_dict() and start.spec is None


def test_a_new_run_reads_its_checkpoint_once_and_leaves_the_given_config_as_it_is(
        tmp_path, monkeypatch):
    """The architecture and the weights come from one read (a hub download or a 4 GB file is
    fetched once); the config given is not edited (the run's is a new one); the weights are
    handed to the model once and not held after."""
    from keras_vit.weights import hub
    write_checkpoint(tmp_path / "checkpoint", "timm", {"num_register_tokens": 2})
    reads = []
    original = hub.read_checkpoint
    monkeypatch.setattr(hub, "read_checkpoint",
                        lambda *args, **kwargs: reads.append(args) or original(*args, **kwargs))
    given = finetune_config(tmp_path / "checkpoint")
    before = given.to_json_best_effort()
    config, start = starting_point.resolve(given)
    assert given.to_json_best_effort() == before and config is not given
    assert config.model.num_register_tokens == 2 and config.is_locked == given.is_locked
    model = keras_vit.vit(model_spec(config, num_classes=10))
    start.load(objectives.make(config, 10), model, config)
    assert len(reads) == 1, reads
    assert not start._weights  # given up to the model


def test_a_field_the_user_set_that_the_checkpoint_contradicts_names_both(tmp_path):
    write_checkpoint(tmp_path / "checkpoint", "timm", {})
    config = finetune_config(tmp_path / "checkpoint")
    config.model.num_layers = 4
    config.model.variant = "S/16"
    with pytest.raises(ValueError) as error:
        starting_point.resolve(config)
    message = str(error.value)
    assert "config.model.num_layers=4 but the checkpoint has 2" in message
    assert "config.model.hidden_size (of variant 'S/16')=384 but the checkpoint has 24" in message
    assert "Leave those fields out" in message
    # Fields the run decides itself may differ: dropout, stochastic depth.
    config = finetune_config(tmp_path / "checkpoint")
    config.model.drop_path_rate = 0.1
    config, _ = starting_point.resolve(config)
    assert config.model.drop_path_rate == 0.1 and config.model.num_layers == 2


def test_the_checkpoints_head_is_kept_only_when_asked_and_it_fits(tmp_path):
    write_checkpoint(tmp_path / "ten", "timm", {}, num_classes=10)
    config, start = starting_point.resolve(finetune_config(tmp_path / "ten",
                                                           pretrained_head=True))
    model = keras_vit.vit(model_spec(config, num_classes=10))
    report = start.load(objectives.make(config, 10), model, config)
    assert not report["new_head"]
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model.get_layer("head").kernel),
        keras.ops.convert_to_numpy(from_pretrained(str(tmp_path / "ten")).get_layer("head")
                                   .kernel))
    write_checkpoint(tmp_path / "five", "timm", {}, num_classes=5)
    config, start = starting_point.resolve(finetune_config(tmp_path / "five",
                                                           pretrained_head=True))
    with pytest.raises(ValueError, match="has no head for the dataset's 10 classes"):
        start.load(objectives.make(config, 10),
                   keras_vit.vit(model_spec(config, num_classes=10)), config)


def test_the_run_evaluates_with_the_checkpoints_resize_and_crop(fake_fmnist, tmp_path):
    """A timm checkpoint's crop_pct, interpolation and antialiasing become the run's eval_*
    fields where the user left them (the crop fraction set here stays), and the evaluation
    input resizes so; Grain, whose resize is plain bilinear, steps aside for tf.data."""
    import tensorflow as tf

    from keras_vit.preprocessing import EvalPreprocessing, decode_and_resize, scale_pixels
    from train.data import grain_pipeline, records, settings, tf_pipeline

    model = random_tiny_vit(num_classes=5)
    model.preprocessing = EvalPreprocessing("bicubic", 0.875, "center", True)
    save_pretrained(model, tmp_path / "checkpoint", format="timm")
    config = finetune_config(tmp_path / "checkpoint", data_dir=fake_fmnist.data_dir,
                             eval_crop_fraction=0.9)
    config, start = starting_point.resolve(config)
    taken = start.taken
    assert taken["eval_interpolation"] == "bicubic" and "eval_crop_fraction" not in taken
    chosen = settings.eval_preprocessing(config)
    assert chosen == EvalPreprocessing("bicubic", 0.9, "center", True)
    assert "evaluation resize" in grain_pipeline.unavailable(config, "jax")
    builder = tf_pipeline.get_builder(config)
    first = next(iter(tf_pipeline.eval_dataset_fn(builder, config)(tf.distribute.InputContext())))
    (example,) = records.Split(builder, config.eval_split).read_range(0, 1).take(1)

    def resized(preprocessing):
        return scale_pixels(decode_and_resize(example["image"], (48, 48), preprocessing)).numpy()

    np.testing.assert_allclose(first["image"][0], resized(chosen), atol=1e-6)
    assert np.abs(first["image"][0] - resized(EvalPreprocessing())).max() > 0.05


def test_a_checkpoint_that_cannot_be_read_is_one_paragraph_before_any_slow_work(tmp_path):
    (tmp_path / "not_a_model").mkdir()
    flags = ["--config=configs/finetune.py:dataset=fashion_mnist_local",
             f"--workdir={tmp_path / 'run'}",
             *override_flags({**{name: value for name, value in TINY.items() if name != "model"},
                              "image_size": 48})]
    cases = ((tmp_path / "not_a_model", "No config.json in"),
             ("timm:no_such_model_anywhere", "could not be downloaded"),
             (tmp_path / "missing", "is neither an existing file or directory"))
    results = cli_cases.run(  # one process for the three (tests/cli_cases.py)
        "train.main", [[*flags, f"--config.pretrained={pretrained}"] for pretrained, _ in cases],
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
             "PYTHONPATH": REPO}, cwd=REPO,
        timeout=120)
    for (_, shown), result in zip(cases, results):
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and shown in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_what_a_checkpoint_field_names_is_told_apart_from_nothing_in_process(tmp_path):
    """`names_something`, shared by config.pretrained's and config.distill_teacher's checks:
    published names, URLs, hub names and existing paths, not a missing path; `read` names the
    field that gave the checkpoint."""
    published = sorted(keras_vit.weights.pretrained.PUBLISHED)[0]
    for named in (str(tmp_path), published, "augreg/anything.npz", "gs://bucket/model.npz",
                  "https://example.com/model.npz", "hf:owner/name", "timm:vit_tiny.tag"):
        assert starting_point.names_something(named), named
    missing = str(tmp_path / "missing.npz")
    assert not starting_point.names_something(missing)
    with pytest.raises(ValueError, match="is neither an existing file or directory"):
        config_checks.check(finetune_config(missing))
    with pytest.raises(ValueError) as error:
        starting_point.read(str(tmp_path), field="distill_teacher")
    assert str(error.value).startswith(f"config.distill_teacher={str(tmp_path)!r} cannot be "
                                       "read: No config.json in")


def finetune_run(data, workdir, backend, **overrides):
    """`train.main` with configs/finetune.py on the fake data, TINY's run (not its model) at
    40 px (a size the default B/16's patches do not divide: the checkpoint's 8-pixel ones do)
    with the export, on `backend`; asserts that it succeeded and returns it."""
    overrides = {**{name: value for name, value in TINY.items() if name != "model"},
                 "image_size": 40, "export": True, **overrides}
    result = subprocess.run(
        [sys.executable, "-m", "train.main",
         "--config=configs/finetune.py:dataset=fashion_mnist_local", f"--workdir={workdir}",
         f"--config.data_dir={data.data_dir}", *override_flags(overrides)],
        cwd=REPO, env=dict(data.env(), KERAS_BACKEND=backend), capture_output=True,
        text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.processes
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_driver_starts_from_a_timm_directory_on_both_engines(fake_fmnist, tmp_path, backend):
    """The run's model after loading (one step at the warm-up's zero rate changes nothing) has
    the weights of from_pretrained(<dir>, num_classes=10, image_size=40), registers, LayerScale
    and attention pooling included, its config.json the checkpoint's architecture, and its
    export the checkpoint's evaluation resize and crop."""
    import os
    layout, fields = "timm", {"num_register_tokens": 2, "layer_scale_init": 0.1,
                              "classifier": "map"}
    write_checkpoint(tmp_path / "checkpoint", layout, fields,
                     preprocessing=keras_vit.EvalPreprocessing("bicubic", 0.875, "center"))
    workdir = tmp_path / "run"
    result = finetune_run(fake_fmnist, workdir, backend, total_steps=1, warmup_steps=1,
                          steps_per_loop=1, eval_every_steps=1, checkpoint_every_steps=1,
                          pretrained=str(tmp_path / "checkpoint"))
    assert "Started from " + str(tmp_path / "checkpoint") in result.stderr
    assert "2 registers" in result.stderr and "The head is new (zeros) for 10 classes" in \
        result.stderr
    assert "Evaluated as it was: bicubic resize, center crop of 0.875" in result.stderr
    run = json.loads((workdir / "config.json").read_text())
    saved = run["model"]
    assert (saved["hidden_size"], saved["classifier"], saved["num_register_tokens"]) == (
        24, "map", 2)
    assert (run["eval_crop_fraction"], run["input_pipeline"]) == (0.875, "tf.data")
    trained = keras.saving.load_model(os.path.join(workdir, "export", "model.keras"))
    expected = from_pretrained(str(tmp_path / "checkpoint"), num_classes=10, image_size=40)
    assert trained.preprocessing == expected.preprocessing  # served as evaluated
    assert len(trained.weights) == len(expected.weights)
    for mine, theirs in zip(trained.weights, expected.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine),
                                      keras.ops.convert_to_numpy(theirs), err_msg=mine.path)


@pytest.mark.processes
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_lora_through_the_driver_trains_adapters_and_exports_plain_weights(fake_fmnist, tmp_path,
                                                                          backend):
    """--config.lora_rank: from a timm directory, 6 steps train the adapters and the head; the
    export holds merged kernels and no adapters, and every weight LoRA does not adapt (biases,
    norms, embeddings, LayerScale) is the checkpoint's, bit for bit."""
    import os
    write_checkpoint(tmp_path / "checkpoint", "timm", {"layer_scale_init": 0.1})
    workdir = tmp_path / "run"
    finetune_run(fake_fmnist, workdir, backend, lora_rank=2, lora_alpha=4.0,
                 pretrained=str(tmp_path / "checkpoint"))
    trained = keras.saving.load_model(os.path.join(workdir, "export", "model.keras"))
    start = from_pretrained(str(tmp_path / "checkpoint"), num_classes=10, image_size=40)
    assert not any("lora" in variable.path for variable in trained.weights)
    adapted = {layer._kernel.path for layer in keras_vit.lora.adapted_layers(start)}
    changed = set()
    for mine, theirs in zip(trained.weights, start.weights):
        assert mine.path == theirs.path
        same = np.array_equal(keras.ops.convert_to_numpy(mine), keras.ops.convert_to_numpy(theirs))
        if not same:
            changed.add(mine.path)
    assert changed == adapted | {"head/kernel", "head/bias"}, changed ^ (adapted | {
        "head/kernel", "head/bias"})

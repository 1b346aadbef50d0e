"""User errors at every boundary of `train.main` and `train.analyze`: each is one paragraph
"Error: ..." naming the problem (field, value, valid range; file; folder), exit status 1, no
traceback, and found before any slow work.

(a) the config checks in-process, one case per rule class; (b) the command lines as
subprocesses, one per class of error, run concurrently.
"""

import json
import math
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from configs import common, finetune, pretrain, quickstart
from train.run import config_checks
from train_fixtures import REPO, TINY, main_command, write_image_folder


def _config(type_safe=True, **overrides):
    """configs/quickstart.py with TINY and `overrides`, locked as the driver locks it."""
    config = quickstart.get_config()
    config.update(TINY)
    if not type_safe:  # a config file can set any type; the command line cannot
        config = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
    config.update(overrides)
    config.lock()
    return config


# (a) The config checks: (overrides, replicas, words the message must hold).
BAD_CONFIGS = {
    # Counts and sizes: integers >= 1.
    "batch_size_0": (dict(batch_size=0), None, ["config.batch_size=0", ">= 1"]),
    "eval_batch_size_0": (dict(eval_batch_size=0), None, ["config.eval_batch_size=0", ">= 1"]),
    "keep_checkpoints_0": (dict(keep_checkpoints=0), None, ["config.keep_checkpoints=0"]),
    "total_steps_0": (dict(total_steps=0), None, ["config.total_steps=0", ">= 1"]),
    "steps_per_loop_0": (dict(steps_per_loop=0), None, ["config.steps_per_loop=0"]),
    "eval_every_negative": (dict(eval_every_steps=-5), None, ["config.eval_every_steps=-5"]),
    "checkpoint_every_0": (dict(checkpoint_every_steps=0), None,
                           ["config.checkpoint_every_steps=0"]),
    "shuffle_buffer_0": (dict(shuffle_buffer=0), None, ["config.shuffle_buffer=0"]),
    "accum_steps_0": (dict(accum_steps=0), None, ["config.accum_steps=0", ">= 1"]),
    "seed_negative": (dict(seed=-1), None, ["config.seed=-1", "[0, 2147483647]"]),
    "image_size_0": (dict(image_size=0), None, ["config.image_size=0", ">= 1"]),
    "patch_size_0": (dict(model=dict(patch_size=0)), None,
                     ["config.model.patch_size=0", "a positive integer"]),
    "num_layers_0": (dict(model=dict(num_layers=0)), None, ["config.model.num_layers=0"]),
    "mlp_dim_negative": (dict(model=dict(mlp_dim=-3)), None, ["config.model.mlp_dim=-3"]),
    "representation_size_0": (dict(model=dict(representation_size=0)), None,
                              ["config.model.representation_size=0", "or None"]),
    "layer_norm_epsilon_0": (dict(model=dict(layer_norm_epsilon=0.0)), None,
                             ["config.model.layer_norm_epsilon=0.0", "positive number"]),
    # Rates and coefficients: their intervals.
    "learning_rate_negative": (dict(learning_rate=-0.003), None,
                               ["config.learning_rate=-0.003", "> 0"]),
    "learning_rate_0": (dict(learning_rate=0.0), None, ["config.learning_rate=0.0", "> 0"]),
    "learning_rate_nan": (dict(learning_rate=math.nan), None,
                          ["config.learning_rate=nan", "finite"]),
    "dropout_1": (dict(model=dict(dropout=1.0)), None, ["config.model.dropout=1.0", "[0, 1)"]),
    "attention_dropout_negative": (dict(model=dict(attention_dropout=-0.1)), None,
                                   ["config.model.attention_dropout=-0.1"]),
    "drop_path_rate_1.5": (dict(model=dict(drop_path_rate=1.5)), None,
                           ["config.model.drop_path_rate=1.5"]),
    "label_smoothing_1": (dict(label_smoothing=1.0), None, ["config.label_smoothing=1.0"]),
    "ema_decay_1": (dict(ema_decay=1.0), None, ["config.ema_decay=1.0", "[0.0, 1.0)"]),
    "momentum_1": (dict(momentum=1.0), None, ["config.momentum=1.0", "[0.0, 1.0)"]),
    "beta_1_negative": (dict(beta_1=-0.1), None, ["config.beta_1=-0.1"]),
    "beta_2_1": (dict(beta_2=1.0), None, ["config.beta_2=1.0"]),
    "weight_decay_negative": (dict(weight_decay=-0.1), None, ["config.weight_decay=-0.1"]),
    "grad_clip_norm_negative": (dict(grad_clip_norm=-1.0), None,
                                ["config.grad_clip_norm=-1.0", ">= 0"]),
    "crop_min_area_0": (dict(crop_min_area=0.0), None, ["config.crop_min_area=0.0", "(0.0, 1.0]"]),
    "crop_min_area_1.5": (dict(crop_min_area=1.5), None, ["config.crop_min_area=1.5"]),
    # Known values.
    "optimizer": (dict(optimizer="lamb"), None, ["config.optimizer='lamb'", "'adamw'"]),
    "decay": (dict(decay="step"), None, ["config.decay='step'", "'cosine', 'linear'"]),
    "dtype_policy": (dict(dtype_policy="float16"), None,
                     ["config.dtype_policy='float16'", "'mixed_bfloat16'"]),
    "classifier": (dict(model=dict(classifier="cls")), None,
                   ["config.model.classifier='cls'", "'gap'"]),
    "variant": (dict(model=dict(variant="X/99")), None, ["config.model.variant='X/99'", "B/16"]),
    # A config file written for the layout before config.model held the model's fields.
    "model_field_at_the_top": (dict(patch_size=4), None,
                               ["config.patch_size=4", "config.model.patch_size"]),
    "dataset_empty": (dict(dataset=""), None, ["config.dataset=''", "non-empty"]),
    "dataset_missing_folder": (dict(dataset="folder:/no/such/root"), None,
                               ["config.dataset='folder:/no/such/root'", "not a folder"]),
    "train_split_empty": (dict(train_split=" "), None, ["config.train_split=' '"]),
    "pretrained_missing_file": (dict(pretrained="/no/such/weights.npz"), None,
                                ["config.pretrained='/no/such/weights.npz'", "imagenet21k"]),
    "pretrained_not_published": (dict(pretrained="imagenet21k"), None,
                                 ["config.pretrained='imagenet21k'", "'Ti/16'", "B/16"]),
    # Combinations.
    "warmup_longer_than_run": (dict(warmup_steps=7), None,
                               ["config.warmup_steps=7", "config.total_steps=6"]),
    "warmup_negative": (dict(warmup_steps=-1), None, ["config.warmup_steps=-1", ">= 0"]),
    "batch_over_replicas": (dict(batch_size=33, accum_steps=1), 2,
                            ["config.batch_size=33", "2 replicas"]),
    "eval_batch_over_replicas": (dict(eval_batch_size=51), 2,
                                 ["config.eval_batch_size=51", "2 replicas"]),
    "accum_steps_per_replica": (dict(accum_steps=3), 2,
                                ["config.accum_steps=3", "per-replica batch 16"]),
    "accum_steps_batch": (dict(accum_steps=5), None, ["config.accum_steps=5", "batch_size=32"]),
    "heads_do_not_divide_width": (dict(model=dict(hidden_size=16, num_heads=3)), None,
                                  ["config.model.hidden_size=16", "config.model.num_heads=3"]),
    "image_not_whole_patches": (dict(image_size=30), None,
                                ["config.image_size=30", "multiple of 7", "28"]),
    "image_not_whole_hybrid_patches": (dict(model=dict(variant="R+Ti/16", patch_size=1),
                                            image_size=30),
                                       None, ["config.image_size=30", "multiple of 4",
                                              "stride 4"]),
    # Types a config file could set (the command line's parser refuses them itself).
    "flip_not_bool": (dict(type_safe=False, flip="yes"), None,
                      ["config.flip='yes'", "True or False"]),
    "batch_size_float": (dict(type_safe=False, batch_size=32.0), None,
                         ["config.batch_size=32.0", "an integer"]),
    "learning_rate_str": (dict(type_safe=False, learning_rate="0.1"), None,
                          ["config.learning_rate='0.1'", "number"]),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_config_check_names_field_value_and_range(name):
    overrides, replicas, words = BAD_CONFIGS[name]
    config = _config(**overrides)
    with pytest.raises(ValueError) as error:
        config_checks.check(config, replicas)
    message = str(error.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert "\n" not in message and "--config." in message


def test_every_common_field_has_a_rule():
    assert set(config_checks.rules()) == set(common.get_config())


@pytest.mark.parametrize("config", [
    quickstart.get_config(), _config(), common.get_config(),
    *[finetune.get_config(f"dataset={name}") for name in finetune.TOTAL_STEPS],
    finetune.get_config("model=R50+B/16"), pretrain.get_config(),
    pretrain.get_config("model=L/16,dataset=imagenet21k")],
    ids=lambda config: f"{config.model.variant}-{config.dataset}-{config.optimizer}")
def test_shipped_configs_pass(config):
    config_checks.check(config)
    replicas = 8 if config.batch_size % 8 == 0 and config.eval_batch_size % 8 == 0 else 2
    config_checks.check(config, num_replicas=replicas)


def test_every_problem_is_reported_at_once():
    config = _config(batch_size=0, eval_batch_size=0, learning_rate=-0.003, keep_checkpoints=0)
    with pytest.raises(ValueError) as error:
        config_checks.check(config)
    message = str(error.value)
    for word in ("batch_size=0", "eval_batch_size=0", "learning_rate=-0.003",
                 "keep_checkpoints=0"):
        assert word in message
    assert message.startswith("Invalid config values: ")


def test_trainer_check_config_uses_the_checks():
    from train.engines import tf_engine
    with pytest.raises(ValueError, match=r"config\.keep_checkpoints=0"):
        tf_engine.check_config(_config(keep_checkpoints=0), 1)
    tf_engine.check_config(_config(), 2)


@pytest.mark.parametrize("field, value, shown", [
    ("fsdp", True, "config.fsdp=True splits the weights over the devices of the JAX engine"),
    ("model_parallel", 2, "config.model_parallel=2 splits the blocks' matrices over devices "
                          "on the JAX engine"),
])
def test_the_tensorflow_engine_refuses_the_jax_engines_sharding(field, value, shown):
    """Not a data-parallel run that ignores the option and exits 0."""
    from train.engines import tf_engine
    with pytest.raises(ValueError, match=shown + r".*Run on JAX, or set it to"):
        tf_engine.check_config(_config(**{field: value}), 2)


def test_analyze_checks_only_what_it_reads():
    config = _config(batch_size=0, image_size=30)
    with pytest.raises(ValueError) as error:
        config_checks.check(config, fields=config_checks.ANALYZE_FIELDS)
    assert "image_size=30" in str(error.value) and "batch_size" not in str(error.value)
    # A config.json of another version may lack fields: those are skipped (the model's take
    # the spec's defaults).
    config_checks.check(ml_collections.ConfigDict({"model": {"variant": "B/16"},
                                                   "image_size": 224}),
                        fields=config_checks.ANALYZE_FIELDS)


def test_a_variant_name_as_config_model_says_where_it_goes():
    """`config.model = "B/16"` (the layout before config.model held the model's fields), in a
    config that is not type safe: one problem naming config.model.variant."""
    config = ml_collections.ConfigDict(dict(_config().to_dict(), model="B/16"), type_safe=False)
    with pytest.raises(ValueError, match=r"config\.model='B/16': .*config\.model\.variant="):
        config_checks.check(config)


def test_output_folder_checks(tmp_path, monkeypatch):
    from absl import app
    file = tmp_path / "file"
    file.write_text("x")
    config_checks.check_output_folder(str(tmp_path / "new" / "run"), "workdir")
    config_checks.check_output_folder(str(tmp_path), "workdir")
    with pytest.raises(app.UsageError, match="--workdir=.*file is a file, not a folder"):
        config_checks.check_output_folder(str(file), "workdir")
    with pytest.raises(app.UsageError, match="cannot be created: .*file is a file"):
        config_checks.check_output_folder(str(file / "run" / "deeper"), "out")
    # Read-only (tests run as root, who may write anywhere: pretend).
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(app.UsageError, match="is not writable"):
        config_checks.check_output_folder(str(tmp_path), "workdir")
    with pytest.raises(app.UsageError, match="cannot be created: .* is not writable"):
        config_checks.check_output_folder(str(tmp_path / "new"), "workdir")


def test_unreadable_images_are_named(tmp_path):
    from train.data.sources import folder
    root = tmp_path / "images"
    write_image_folder(str(root), np.random.default_rng(0))
    broken = [root / "train" / "cat" / "broken.jpg", root / "test" / "dog" / "empty.png"]
    broken[0].write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    broken[1].write_bytes(b"")
    paths = sorted(str(path) for path in root.rglob("*.*g"))
    with pytest.raises(ValueError) as error:
        folder.check_image_files(paths)
    message = str(error.value)
    assert f"2 of {len(paths)} image files cannot be decoded" in message
    assert str(broken[0]) in message and str(broken[1]) in message


# (b) The command lines, as a user runs them.

def _analyze_command(*args):
    return [sys.executable, "-m", "train.analyze", *args]


# `python -m train.main ARGS` whose writes of metrics.jsonl fail as on a full disk (the write
# raises ENOSPC, naming no file, as the kernel's error does).
FULL_DISK_MAIN = """
import errno, runpy
from keras_vit import fileio

real_open = fileio.open_file


class Full:
    def __init__(self, handle):
        self.handle = handle

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.handle.close()

    def write(self, content):
        raise OSError(errno.ENOSPC, "No space left on device")


def open_file(path, mode="rb"):
    handle = real_open(path, mode)
    return Full(handle) if "metrics.jsonl" in str(path) and "w" in mode else handle


fileio.open_file = open_file
runpy.run_module("train.main", run_name="__main__")
"""


def _cases(data, root):
    """name: (command, words expected in the error, workdir that must stay absent[, options:
    `env`, more environment variables; `unseen`, words that must not be in the output])."""
    workdir = str(root / "run")
    full_disk_workdir = str(root / "full_disk_run")
    a_file = root / "a_file"
    a_file.write_text("not a folder")
    empty = root / "empty_dataset"
    (empty / "train").mkdir(parents=True)
    corrupt = root / "corrupt_dataset"
    write_image_folder(str(corrupt), np.random.default_rng(0))
    bad_jpeg = corrupt / "train" / "dog" / "truncated.jpg"
    bad_jpeg.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")
    folder = dict(batch_size=4, eval_batch_size=3, image_size=28)
    old_config = root / "old_layout.py"  # a config file written for the flat model fields
    old_config.write_text("from configs import common\n\n\ndef get_config():\n"
                          "    config = common.get_config()\n"
                          "    config.model = 'Ti/16'\n    return config\n")
    return {
        "misspelt_field": (main_command(data, workdir, "--config.model.pach_size=3"),
                           ["pach_size", "patch_size"], workdir),
        # The overrides of the layout before config.model held the model's fields.
        "variant_as_config_model": (main_command(data, workdir, "--config.model=B/16"),
                                    ["--config.model=B/16", "--config.model.variant=B/16"],
                                    workdir),
        "model_field_at_the_top": (main_command(data, workdir, "--config.patch_size=4"),
                                   ["--config.patch_size=4", "--config.model.patch_size=4"],
                                   workdir),
        "variant_as_config_model_in_a_file": (
            [sys.executable, "-m", "train.main", f"--config={old_config}",
             f"--workdir={workdir}"], ["config.model holds the model's fields",
                                       "config.model.variant"], workdir),
        "out_of_range_values": (
            main_command(data, workdir, batch_size=0, learning_rate=-0.003,
                         keep_checkpoints=0),
            ["config.batch_size=0", "config.learning_rate=-0.003",
             "config.keep_checkpoints=0"], workdir),
        "missing_config_file": (
            [sys.executable, "-m", "train.main", "--config=configs/nope.py",
             f"--workdir={workdir}"], ["no config file configs/nope.py"], workdir),
        "workdir_cannot_be_created": (
            main_command(data, str(a_file / "run")), ["cannot be created", str(a_file)],
            str(a_file / "run")),
        "no_tpu": (main_command(data, workdir, "--strategy=tpu", "--tpu=local"),
                   ["--tpu=local", "no TPU found"], workdir),
        "empty_folder_dataset": (
            main_command(data, workdir, dataset=f"folder:{empty}", **folder),
            ["holds no images", str(empty)], workdir),
        "corrupt_jpeg": (main_command(data, workdir, dataset=f"folder:{corrupt}", **folder),
                         ["cannot be decoded", str(bad_jpeg)], workdir,
                         dict(unseen=["Improper call to JPEG library", "Local rendezvous"])),
        "unknown_field": (main_command(data, workdir, "--config.no_such_field=3"),
                          ["--config.no_such_field=3", "has no field 'no_such_field'",
                           "the nearest name is --config."], workdir),
        "tf_config_index_out_of_range": (
            main_command(data, workdir, "--strategy=multi_worker"),
            ['TF_CONFIG\'s task "index" is 2', '2 "worker" tasks', "must be 0 to 1"], workdir,
            dict(env={"TF_CONFIG": json.dumps({
                "cluster": {"worker": ["localhost:2222", "localhost:2223"]},
                "task": {"type": "worker", "index": 2}})})),
        "disk_full_during_training": (  # a workdir of its own: it gets config.json
            [sys.executable, "-c", FULL_DISK_MAIN, *main_command(data, full_disk_workdir)[3:]],
            ["No space left on the disk of", os.path.join(full_disk_workdir, "metrics.jsonl"),
             "run the same command again"], None),
        "analyze_missing_workdir": (
            _analyze_command(f"--workdir={root / 'nowhere'}", f"--out={root / 'plots'}"),
            ["--workdir=", "does not exist"], str(root / "plots")),
        "analyze_out_is_a_file": (
            _analyze_command("--config=configs/quickstart.py", f"--out={a_file}"),
            [f"--out={a_file} is a file"], None),
        "analyze_bad_config_value": (
            _analyze_command("--config=configs/quickstart.py", "--config.image_size=30",
                             "--config.pretrained=x.npz", f"--out={root / 'plots'}"),
            ["config.image_size=30", "config.pretrained='x.npz'"], str(root / "plots")),
    }


@pytest.mark.processes  # 18 commands at once: most of a minute on 2 cores
def test_user_errors_are_one_line_without_traceback(fake_fmnist, tmp_path):
    cases = _cases(fake_fmnist, tmp_path)
    processes = {name: subprocess.Popen(command, cwd=REPO,
                                        env=dict(fake_fmnist.env(), **options.get("env", {})),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
                 for name, (command, _, _, *more) in cases.items()
                 for options in [more[0] if more else {}]}
    failures = []
    for name, process in processes.items():
        try:
            stdout, stderr = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        output = stdout + stderr
        _, words, absent, *more = cases[name]
        unseen = more[0].get("unseen", []) if more else []
        errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
        problems = []
        if process.returncode != 1:
            problems.append(f"exit status {process.returncode}")
        if "Traceback" in output:
            problems.append("a traceback")
        if len(errors) != 1:
            problems.append(f"{len(errors)} 'Error:' lines")
        problems += [f"no {word!r}" for word in words if not any(word in e for e in errors)]
        problems += [f"{word!r} shown" for word in unseen if word in output]
        if absent and os.path.exists(absent):
            problems.append(f"{absent} was created")
        if problems:
            failures.append(f"{name}: {', '.join(problems)}\n{stderr[-2000:]}")
    assert not failures, "\n\n".join(failures)

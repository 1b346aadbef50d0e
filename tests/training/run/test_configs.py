"""Experiment configs (configs/*.py) and the learning-rate schedule (train/run/schedules.py)."""

import ast
import io
import os
import re
import subprocess
import sys
import tokenize

import numpy as np
import pytest

import keras_vit
from configs import (ablation, augreg, augreg_finetune, common, finetune, native_aspect,
                     pretrain, quickstart)
from train.run import model_config
from train_fixtures import FLAT_LAYOUT_CONFIG_JSON, TINY

from train_fixtures import REPO  # noqa: E402
CONFIGS = os.path.join(REPO, "configs")


def _all_configs():
    return {
        "common": common.get_config(),
        "quickstart": quickstart.get_config(),
        "finetune": finetune.get_config("model=B/16,dataset=cifar10"),
        "finetune default": finetune.get_config(),
        "finetune L/16 pets": finetune.get_config("model=L/16,dataset=oxford_iiit_pet"),
        "pretrain": pretrain.get_config(),
        "pretrain L/16 i21k": pretrain.get_config("model=L/16,dataset=imagenet21k"),
        "ablation": ablation.get_config(),
        "augreg": augreg.get_config(),
        "augreg_finetune": augreg_finetune.get_config("model=S/16,dataset=oxford_iiit_pet"),
        **{f"native_aspect:{arg}": native_aspect.get_config(arg) for arg in native_aspect.ARGS},
        **{f"native_aspect:{arg},canvas": native_aspect.get_config(f"{arg},canvas")
           for arg in native_aspect.ARGS},
    }


def test_native_aspect_takes_a_layout_and_the_data():
    assert native_aspect.get_config("padded").dataset == "fashion_mnist_native"
    config = native_aspect.get_config("square,canvas")
    assert (config.dataset, config.native) == ("fashion_mnist_canvas", "none")
    assert native_aspect.get_config("packed,stretched").dataset == "fashion_mnist_native"
    for bad in ("canvas", "packed,", "packed,canvas,x", "packed,photos", "Packed"):
        with pytest.raises(ValueError, match="LAYOUT,DATA with LAYOUT one of .* and DATA one "
                                             f"of .*'canvas'.*got '{bad}'"):
            native_aspect.get_config(bad)


def test_every_config_loads_with_the_common_fields():
    fields = set(common.get_config())
    for name, config in _all_configs().items():
        assert set(config) == fields, f"{name} adds or drops fields: {set(config) ^ fields}"
        assert config.optimizer in ("sgd", "adam", "adamw"), name
        assert config.decay in ("cosine", "linear"), name
        assert 0 <= config.warmup_steps <= config.total_steps, name
        for field in ("total_steps", "steps_per_loop", "eval_every_steps",
                      "checkpoint_every_steps", "batch_size", "eval_batch_size"):
            assert config[field] > 0, (name, field)


def test_augreg_finetune_recipe():
    """AugReg's transfer settings (google-research/vision_transformer,
    vit_jax/configs/augreg.py): SGD 0.9 at 0.03, no weight decay, no dropout, no augmentation,
    100 warm-up steps, from the AugReg ImageNet-21k checkpoint of the variant."""
    from train.data import augmentation
    from train.run import config_checks
    config = augreg_finetune.get_config("model=S/16,dataset=cifar100")
    assert (config.optimizer, config.momentum, config.weight_decay) == ("sgd", 0.9, 0.0)
    assert (config.learning_rate, config.warmup_steps, config.total_steps) == (0.03, 100, 10_000)
    assert (config.model.dropout, config.model.drop_path_rate) == (0.0, 0.0)
    assert not augmentation.of(config).active and config.layer_decay == 1.0
    assert (config.pretrained, config.model.variant, config.image_size) == ("augreg-i21k",
                                                                            "S/16", 384)
    config_checks.check(config)
    with pytest.raises(ValueError, match="no such checkpoint was published for model 'L/32'"):
        config_checks.check(augreg_finetune.get_config("model=L/32"))


def test_finetune_recipe():
    config = finetune.get_config("model=B/16,dataset=cifar10")
    assert (config.model.variant, config.dataset, config.eval_split) == ("B/16", "cifar10",
                                                                         "test")
    assert (config.optimizer, config.momentum, config.weight_decay) == ("sgd", 0.9, 0.0)
    assert (config.batch_size, config.grad_clip_norm, config.image_size) == (512, 1.0, 384)
    # The paper sweeps {0.001, 0.003, 0.01, 0.03} (appendix B.1.1, Table 4); the public configs
    # default to 0.03 (google-research/vision_transformer, vit_jax/configs/common.py, base_lr).
    assert config.learning_rate == 0.03
    assert (config.decay, config.warmup_steps, config.pretrained) == ("cosine", 500,
                                                                      "imagenet21k")
    # Steps of the published runs (paper appendix B.1.1, Table 4).
    expected = {"cifar10": 10_000, "cifar100": 10_000, "imagenet2012": 20_000,
                "oxford_iiit_pet": 500, "oxford_flowers102": 500}
    for dataset, steps in expected.items():
        config = finetune.get_config(f"model=B/16,dataset={dataset}")
        assert config.total_steps == steps, dataset
    assert finetune.get_config("dataset=imagenet2012").eval_split == "validation"
    assert finetune.get_config("model=L/16,dataset=cifar100").model.variant == "L/16"


def test_pretrain_recipe():
    """Paper section 4.1 and Table 3 (arXiv 2010.11929): Adam b1=0.9, b2=0.999, batch 4096, 10k
    warm-up steps, clipping at global norm 1 for ImageNet; on ImageNet-1k 300 epochs at base
    learning rate 3e-3, cosine decay, weight decay 0.3, dropout 0.1."""
    config = pretrain.get_config()
    # "adamw": Keras' Adam would ignore config.weight_decay; the paper's weight decay is
    # decoupled from the gradient, as in AdamW.
    assert (config.optimizer, config.beta_1, config.beta_2) == ("adamw", 0.9, 0.999)
    assert (config.batch_size, config.warmup_steps, config.grad_clip_norm) == (4096, 10_000, 1.0)
    assert (config.learning_rate, config.decay, config.weight_decay) == (3e-3, "cosine", 0.3)
    assert (config.model.dropout, config.image_size, config.total_steps) == (0.1, 224, 93_834)
    assert config.dataset == "imagenet2012" and config.eval_split == "validation"
    assert config.model.representation_size == 768  # B/16: the tanh pre-logits head


def test_pretrain_imagenet21k_recipe():
    """Paper Table 3: 90 epochs of ImageNet-21k, learning rate 1e-3, linear decay, weight
    decay 0.03."""
    config = pretrain.get_config("model=B/16,dataset=imagenet21k")
    assert (config.dataset, config.total_steps) == ("imagenet21k", 300_000)
    assert (config.learning_rate, config.decay, config.weight_decay) == (1e-3, "linear", 0.03)


def test_pretrain_on_other_data_uses_section_4_1_defaults():
    """Section 4.1: "a high weight decay of 0.1", linear decay (Table 3's JFT-300M rows)."""
    config = pretrain.get_config("model=B/16,dataset=places365_small")
    assert (config.learning_rate, config.decay, config.weight_decay) == (1e-3, "linear", 0.1)


@pytest.mark.parametrize("model, hidden", [("L/16", 1024), ("H/14", 1280)])
def test_pretrain_pre_logits_for_every_model(model, hidden):
    """Pre-training uses a head with one hidden tanh (pre-logits) layer of the model's width
    (paper section 3.1), for the paper's L and H models too."""
    assert pretrain.get_config(f"model={model}").model.representation_size == hidden


@pytest.mark.parametrize("arg", ["modle=B/16", "model", "model=B/16,datset=cifar10"])
def test_bad_config_argument_raises(arg):
    with pytest.raises(ValueError, match=re.escape(arg.split(",")[-1].split("=")[0])):
        finetune.get_config(arg)
    with pytest.raises(ValueError):
        pretrain.get_config(arg)


def test_misspelt_override_on_the_command_line_fails(tmp_path):
    command = [sys.executable, "-m", "train.main", "--config=configs/quickstart.py",
               f"--workdir={tmp_path / 'run'}", "--config.model.pach_size=3"]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "pach_size" in result.stderr
    assert not (tmp_path / "run").exists()  # rejected before anything ran


def _common_assignments():
    """(field, line) of every `config.<field> = ...` in configs/common.py, and the comments."""
    with open(os.path.join(CONFIGS, "common.py")) as handle:
        source = handle.read()
    comments = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT}
    fields = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if (isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name)
                            and element.value.id == "config"):
                        fields.append((element.attr, node.lineno, node.end_lineno))
    return fields, comments


def test_every_common_field_has_a_comment():
    fields, comments = _common_assignments()
    assert {name for name, _, _ in fields} == set(common.get_config())
    undocumented = [name for name, first, last in fields
                    if not any(line in comments for line in range(first, last + 1))]
    assert not undocumented, f"fields without a comment in configs/common.py: {undocumented}"


def test_no_dead_config_fields():
    """Every field is read somewhere in train/: a field nobody reads is a setting that silently
    does nothing. The model's fields all go to keras_vit.ViTConfig (model_config.model_spec)."""
    text = ""
    for root, _, names in os.walk(os.path.join(REPO, "train")):  # train/studies/ too
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(root, name)) as handle:
                    text += handle.read()
    used = (set(re.findall(r"config\.(\w+)", text)) | set(re.findall(r'config\["(\w+)"\]', text))
            | set(re.findall(r'config\.get\("(\w+)"', text)))
    assert not set(common.get_config()) - used


def test_config_model_is_every_spec_field_but_the_three_set_elsewhere():
    """config.model is made from keras_vit.ViTConfig: all its fields but image_size (the
    config's own, shared with the input pipeline), num_classes (the dataset's) and include_top
    (the objective's), at the spec's defaults; a training config builds exactly that spec."""
    import dataclasses
    fields = {field.name: field.default for field in dataclasses.fields(keras_vit.ViTConfig)}
    model = common.get_config().model
    assert set(model) == set(fields) - {"image_size", "num_classes", "include_top"}
    assert dict(model) == {name: fields[name] for name in model}
    config = quickstart.get_config()
    spec = model_config.model_spec(config, num_classes=10)
    assert spec == keras_vit.ViTConfig.from_variant(
        "R+Ti/16", patch_size=2, hidden_size=64, mlp_dim=128, num_heads=4, num_layers=4,
        image_size=32, num_classes=10)
    assert not model_config.model_spec(config, 10, include_top=False).include_top


# The position-embedding fields and the Axial models (configs/common.py,
# train/run/config_checks.py).

KINDS = keras_vit.architecture.spec.POSITION_EMBEDDINGS
PLACEMENTS = keras_vit.architecture.spec.PLACEMENTS


def test_each_field_has_one_owner_whose_choices_the_checks_read():
    from train.data import augmentation, native_input, settings
    from train.run import (config_checks, distillation, engine, export, loop, objectives,
                           optimizers, schedules, starting_point)
    owners = [loop.RULES, export.RULES, objectives.RULES, settings.RULES, augmentation.RULES,
              optimizers.RULES, engine.RULES, starting_point.RULES, distillation.RULES,
              native_input.RULES]
    names = [name for rules in owners for name in rules]
    assert len(names) == len(set(names))  # no field has two owners
    rules = config_checks.rules()
    assert set(rules) == set(names) | {"model"}
    assert rules["mpp_target"] == ("choice", keras_vit.masked_patches.TARGETS)
    assert rules["objective"] == ("choice", objectives.OBJECTIVES)
    assert rules["decay"] == ("choice", schedules.DECAYS)
    assert rules["optimizer"] == ("choice", optimizers.OPTIMIZERS)


def test_a_section_holds_its_fields_only():
    from train.run import config_checks, optimizers
    section = config_checks.section(common.get_config(), optimizers.FIELDS)
    assert section.learning_rate == 0.03 and section["total_steps"] == 10_000
    assert set(section) == set(optimizers.FIELDS)
    with pytest.raises(AttributeError, match="config.batch_size is not in this section"):
        section.batch_size
    with pytest.raises(AttributeError, match="read-only"):
        section.learning_rate = 1.0


def _small(**model):
    """configs/ablation.py with a small model (2 blocks: every_layer adds one embedding) and the
    fields `model` of config.model."""
    config = ablation.get_config()
    config.model.update(dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2,
                             patch_size=7))
    config.model.update(model)
    config.lock()
    return config


def test_position_embedding_defaults_are_the_original_vit():
    config = common.get_config()
    assert (config.model.position_embedding, config.model.position_embedding_placement) == (
        "learned", "stem")
    assert config.model.classifier is None  # the variant's: a class token, GAP for Axial-*
    assert model_config.model_spec(config, 10).classifier == "token"
    assert model_config.model_spec(_small(variant="Axial-Ti/16"), 10).classifier == "gap"


BAD_POSITION_CONFIGS = {
    "unknown_kind": (dict(position_embedding="sinusoidal"),
                     ["config.model.position_embedding='sinusoidal'", "'learned_2d'",
                      "'relative_2d'"]),
    "unknown_placement": (dict(position_embedding_placement="everywhere"),
                          ["config.model.position_embedding_placement='everywhere'",
                           "'every_layer_shared'"]),
    "every_layer_relative": (dict(position_embedding="relative",
                                  position_embedding_placement="every_layer"),
                             ["config.model.position_embedding_placement='every_layer'",
                              "'learned' or 'learned_2d'",
                              "config.model.position_embedding='relative'"]),
    "every_layer_shared_none": (dict(position_embedding="none",
                                     position_embedding_placement="every_layer_shared"),
                                ["config.model.position_embedding_placement='every_layer_shared'",
                                 "config.model.position_embedding='none'"]),
    "learned_2d_odd_width": (dict(position_embedding="learned_2d", hidden_size=15, num_heads=3),
                             ["config.model.position_embedding='learned_2d'", "even hidden_size",
                              "config.model.hidden_size=15"]),
    "axial_with_class_token": (dict(variant="Axial-Ti/16", classifier="token"),
                               ["config.model.classifier='token'", "Axial-Ti/16",
                                "classifier='gap'"]),
    "axial_relative": (dict(variant="Axial-Ti/16", position_embedding="relative_2d"),
                       ["config.model.position_embedding='relative_2d'", "Axial-Ti/16"]),
    "axial_hybrid": (dict(variant="Axial-R+Ti/16"),
                     ["config.model.variant='Axial-R+Ti/16'",
                      "'Axial-' before any plain ViT name"]),
}


@pytest.mark.parametrize("name", list(BAD_POSITION_CONFIGS))
def test_position_and_axial_rules(name):
    from train.run import config_checks
    overrides, words = BAD_POSITION_CONFIGS[name]
    with pytest.raises(ValueError) as error:
        config_checks.check(_small(**overrides))
    for word in words:
        assert word in str(error.value), f"{word!r} not in {str(error.value)!r}"


# Of the 42 combinations, those the model API builds: for ViT the learned kinds at every
# placement and the others at the stem, with either classifier; for Axial-ViT only with "gap",
# and no relative kinds.
@pytest.mark.parametrize("model, buildable", [("Ti/16", 22), ("Axial-Ti/16", 8)])
def test_config_checks_refuse_what_the_model_refuses(model, buildable):
    """Every kind x placement x classifier: config_checks passes exactly the combinations that
    keras_vit.vit() builds, so a run never fails after its slow start."""
    from train.run import config_checks, objectives
    built = 0
    for kind in KINDS:
        for placement in PLACEMENTS:
            for classifier in ("token", "gap"):
                config = _small(variant=model, classifier=classifier, position_embedding=kind,
                                position_embedding_placement=placement)
                case = (model, kind, placement, classifier)
                try:
                    objectives.build_model(config, num_classes=10)
                except ValueError:
                    with pytest.raises(ValueError):
                        config_checks.check(config)
                else:
                    config_checks.check(config)
                    built += 1
                    assert classifier == "gap" or not model.startswith("Axial"), case
    assert built == buildable


def test_build_model_passes_the_position_fields():
    from train.run import objectives

    def names(config):
        return {layer.name for layer in objectives.build_model(config, 10).layers}

    assert {"posembed_input", "posembed_1"} <= names(_small(
        position_embedding_placement="every_layer"))
    assert "posembed_1" not in names(_small(position_embedding_placement="every_layer_shared"))
    model = objectives.build_model(_small(position_embedding="none"), 10)
    assert not [weight for weight in model.weights if "pos_embedding" in weight.path]
    axial = names(_small(variant="Axial-Ti/16"))
    assert {"encoderblock_0_row", "encoderblock_0_column"} <= axial


def test_runs_saved_before_the_position_fields_existed_still_resume(tmp_path):
    """A config.json without the new fields describes a run with their defaults (learned, at
    the stem); another position embedding is another run."""
    import json
    from train.run import run_config
    assert not {"model", "position_embedding", "position_embedding_placement"} & set(
        run_config.MAY_CHANGE_ON_RESUME)
    config = _small()
    saved = json.loads(config.to_json_best_effort())
    del saved["model"]["position_embedding"], saved["model"]["position_embedding_placement"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    run_config.check_resume(config, str(tmp_path))
    with pytest.raises(run_config.ConfigMismatchError, match="model.position_embedding: "
                       "'learned' -> 'learned_2d'"):
        run_config.check_resume(_small(position_embedding="learned_2d"), str(tmp_path))


def test_a_run_saved_while_remat_was_a_model_field_resumes_with_it_moved(tmp_path):
    """A config.json of `model.remat` and `model.attention_impl` (before they became run
    fields, how a model runs) reads them as `remat` and `attention_impl`: the same config
    resumes it, and the spec it builds has neither."""
    import json
    from train.run import run_config
    config = _small()
    saved = json.loads(config.to_json_best_effort())
    del saved["remat"], saved["attention_impl"]
    saved["model"].update(remat="blocks", attention_impl="fused")
    (tmp_path / "config.json").write_text(json.dumps(saved))
    read = run_config.saved(str(tmp_path))
    assert read["remat"] == "blocks" and read["attention_impl"] == "fused"
    assert "remat" not in read["model"] and "attention_impl" not in read["model"]
    assert not run_config.differences(config, str(tmp_path))  # they may change on resume
    from train.run.model_config import model_spec
    assert model_spec(read, num_classes=10) == model_spec(config, num_classes=10)


def _tiny_quickstart(**model):
    """What train_fixtures.FLAT_LAYOUT_CONFIG_JSON describes, in today's layout."""
    from configs import quickstart
    config = quickstart.get_config()
    config.update(TINY)
    config.update(data_dir=FLAT_LAYOUT_CONFIG_JSON["data_dir"], export=True, model=model)
    config.lock()
    return config


def test_config_json_in_the_flat_layout_is_read_with_config_model(tmp_path):
    """A config.json written before config.model held the model's fields (`"model": "Ti/16"`
    beside `"patch_size": 7`, ...; without the fields the spec added since) is read in today's
    layout: the same config resumes it, a changed model field is named as `model.<field>`, and
    it builds the same model (as train.analyze and train.studies.mpp build it)."""
    import json
    import ml_collections
    from train.run import config_checks, run_config
    (tmp_path / "config.json").write_text(json.dumps(FLAT_LAYOUT_CONFIG_JSON, indent=2))
    saved = run_config.saved(str(tmp_path))
    assert saved["model"] == {
        "variant": "Ti/16", "patch_size": 7, "hidden_size": 16, "mlp_dim": 32, "num_heads": 2,
        "num_layers": 1, "classifier": "token", "position_embedding": "learned",
        "position_embedding_placement": "stem", "representation_size": None, "dropout": 0.0,
        "attention_dropout": 0.0, "drop_path_rate": 0.0}
    assert not set(saved) - set(common.get_config())  # no model field left at the top
    assert saved["image_size"] == 28 and saved["batch_size"] == 32
    config = _tiny_quickstart()
    # config.model.classifier and dropout are None (the variant's): the same model as the
    # saved "token" and 0.0, so the run resumes.
    assert config.model.classifier is None and config.model.dropout is None
    run_config.check_resume(config, str(tmp_path))
    with pytest.raises(run_config.ConfigMismatchError) as error:
        run_config.check_resume(_tiny_quickstart(hidden_size=32, classifier="gap"),
                                str(tmp_path))
    # (The class token goes with the token classifier, so it is named too.)
    assert ("(model.class_token: True -> False, model.classifier: 'token' -> 'gap', "
            "model.hidden_size: 16 -> 32)") in str(error.value)
    assert model_config.model_spec(ml_collections.ConfigDict(saved), 10) == \
        model_config.model_spec(config, 10)
    config_checks.check(ml_collections.ConfigDict(saved))


# The learning-rate schedule.

def _rates(schedule, steps):
    return np.array([float(schedule(step)) for step in steps])


def test_schedule_cosine_reference_values():
    from train.run.schedules import WarmupDecay
    schedule = WarmupDecay(0.03, 500, 10_000, "cosine")
    np.testing.assert_allclose(_rates(schedule, [0, 250, 500, 5250, 10_000, 12_000]),
                               [0.0, 0.015, 0.03, 0.015, 0.0, 0.0], atol=1e-7)
    middle = _rates(schedule, [2875])  # a quarter of the decay: 0.03 * (1 + cos(pi/4)) / 2
    np.testing.assert_allclose(middle, [0.03 * (1 + np.cos(np.pi / 4)) / 2], rtol=1e-5)
    rates = _rates(schedule, range(0, 10_001, 250))
    assert np.all(np.diff(rates[:3]) > 0) and np.all(np.diff(rates[2:]) < 0)


def test_schedule_linear_values():
    from train.run.schedules import WarmupDecay
    schedule = WarmupDecay(0.03, 500, 10_000, "linear")
    np.testing.assert_allclose(
        _rates(schedule, [0, 100, 500, 2875, 5250, 7625, 10_000, 20_000]),
        [0.0, 0.006, 0.03, 0.0225, 0.015, 0.0075, 0.0, 0.0], atol=1e-7)
    no_warmup = WarmupDecay(1.0, 0, 100, "linear")
    np.testing.assert_allclose(_rates(no_warmup, [0, 50, 100]), [1.0, 0.5, 0.0], atol=1e-7)


def test_schedule_serializes_and_works_in_an_optimizer():
    import keras
    from train.run.schedules import WarmupDecay
    schedule = WarmupDecay(0.03, 500, 10_000, "linear")
    again = WarmupDecay.from_config(schedule.get_config())
    assert again.get_config() == schedule.get_config()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert float(restored(5250)) == pytest.approx(0.015)
    optimizer = keras.optimizers.SGD(schedule)
    optimizer.iterations.assign(250)
    assert float(optimizer.learning_rate) == pytest.approx(0.015)


@pytest.mark.parametrize("args", [
    (0.03, 500, 10_000, "step"),  # unknown decay
    (0.03, 20_000, 10_000, "cosine"),  # warm-up past the end
    (0.03, -1, 10_000, "cosine"),
    (0.03, 0, 0, "linear"),
    (0.03, 0, -5, "linear"),
])
def test_schedule_bad_arguments_raise(args):
    from train.run.schedules import WarmupDecay
    with pytest.raises(ValueError):
        WarmupDecay(*args)


def test_a_run_saved_with_approximate_gelu_resumes_as_its_activation(tmp_path):
    """Runs written before `activation` replaced `approximate_gelu` keep their GELU: the exact
    one resumes only with activation="gelu", and builds the same model."""
    import json
    import ml_collections
    from train.run import run_config
    today = json.loads(json.dumps(run_config._as_json(_tiny_quickstart())))
    model = dict(today["model"])
    del model["activation"]
    model["approximate_gelu"] = False
    (tmp_path / "config.json").write_text(json.dumps({**today, "model": model}))
    saved = run_config.saved(str(tmp_path))
    assert saved["model"]["activation"] == "gelu" and "approximate_gelu" not in saved["model"]
    run_config.check_resume(_tiny_quickstart(activation="gelu"), str(tmp_path))
    with pytest.raises(run_config.ConfigMismatchError,
                       match="model.activation: 'gelu' -> 'gelu_tanh'"):
        run_config.check_resume(_tiny_quickstart(), str(tmp_path))
    assert model_config.model_spec(ml_collections.ConfigDict(saved), 10).activation == "gelu"


# LoRA's fields (config.lora_rank, lora_alpha, lora_norms): checked with the model's shape before
# any slow work, as keras_vit.lora.enable would refuse them later.

def _small_lora(model=None, **fields):
    """`_small` with the run's `fields` set (config.lora_alpha = 16.0, ...)."""
    config = _small(**(model or {}))
    for name, value in fields.items():
        config[name] = value
    return config


@pytest.mark.parametrize("fields, shown", [
    (dict(lora_alpha=16.0), "config.lora_alpha=16.0"),
    (dict(lora_norms=True), "config.lora_norms=True"),
    (dict(lora_alpha=16.0, lora_norms=True), "config.lora_alpha=16.0, config.lora_norms=True")])
def test_lora_scale_or_norms_without_a_rank_are_refused(fields, shown):
    """Without a rank the run trains every weight: the other LoRA fields would do nothing."""
    from train.run import config_checks
    with pytest.raises(ValueError) as error:
        config_checks.check(_small_lora(**fields))
    message = str(error.value)
    assert f"config.lora_rank=0: {shown} given" in message, message
    assert "set config.lora_rank" in message and "8 is common" in message, message
    config_checks.check(_small_lora(lora_rank=4, **fields))


def test_a_lora_rank_above_the_models_kernels_is_refused_before_any_slow_work():
    """configs/quickstart.py's kernels are 64 wide (hidden_size 64, mlp_dim 128)."""
    from train.run import config_checks
    config = quickstart.get_config()
    config.lora_rank = 4096
    with pytest.raises(ValueError) as error:
        config_checks.check(config)
    message = str(error.value)
    for words in ("config.lora_rank=4096: must be at most 64", "config.model.hidden_size=64",
                  "config.model.mlp_dim=128", "<= 64"):
        assert words in message, message
    config.lora_rank = 64
    config_checks.check(config)


@pytest.mark.parametrize("model", [{}, {"mlp_dim": 8}], ids=["hidden_narrower", "mlp_narrower"])
def test_the_lora_rank_check_passes_exactly_the_ranks_the_model_takes(model):
    from train.run import config_checks, objectives
    limit = min(16, model.get("mlp_dim", 32))
    for rank in (limit, limit + 1):
        config = _small_lora(model, lora_rank=rank)
        try:
            objectives.build_model(config, num_classes=10)
        except ValueError:
            assert rank == limit + 1
            with pytest.raises(ValueError, match=f"config.lora_rank={rank}: must be at most "
                                                 f"{limit}"):
                config_checks.check(config)
        else:
            assert rank == limit
            config_checks.check(config)


@pytest.mark.parametrize("value, words", [
    ("int4,float32", ["config.export_onnx='int4,float32'", "Unknown config.export_onnx kind(s) "
                      "'int4'", "'none', 'all', or a comma list of float32, int8", "no int4"]),
    ("float32,all", ["'all'", "stand alone"]),
    ("fp32", ["fp32 is float32"]),
    ("float16", ["'float16'", "comma list of float32, int8"]),
])
def test_unknown_onnx_kinds_are_refused(value, words):
    from train.run import config_checks
    config = _small()
    config.export_onnx = value
    with pytest.raises(ValueError) as error:
        config_checks.check(config)
    for word in words:
        assert word in str(error.value), str(error.value)


def test_onnx_files_without_the_onnx_packages_are_refused_before_training(monkeypatch):
    """A run that would export ONNX files without tf2onnx or onnx installed is refused at the
    start, naming the extra, not after training; a run that does not export needs none."""
    import importlib.util

    from train.run import config_checks
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "onnx" else find_spec(name, *args))
    config = _small()
    config.export, config.export_onnx = True, "all"
    with pytest.raises(ValueError) as error:
        config_checks.check(config)
    message = str(error.value)
    assert "config.export_onnx='all': asks for ONNX files" in message, message
    assert 'needs onnx, not installed: pip install "keras_vit[onnx]"' in message, message
    config.export = False
    config_checks.check(config)

"""DeiT's distillation in the driver (train/run/distillation.py): the losses, the frozen teacher
inside the trained model, the checks; both engines' runs are in tests/training/engines/test_jax_engine.py."""

import tempfile

import keras
import numpy as np
import pytest

import keras_vit
from model_fixtures import randomise
from train.run import config_checks, distillation, objectives
from train_fixtures import tiny_config

pytestmark = pytest.mark.usefixtures("fresh_session")


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def write_teacher(path, num_classes=10, seed=4, **fields):
    """A random TINY-sized classifier of the fake data's classes, as an .npz with its spec."""
    teacher = keras_vit.vit("Ti/16", hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1,
                            patch_size=7, image_size=28, num_classes=num_classes, **fields)
    randomise(teacher, seed=seed)  # a head that is not all zeros
    keras_vit.weights.checkpoint.save_npz(teacher, str(path))
    return teacher


def batch(count=8, seed=0):
    rng = np.random.default_rng(seed)
    return {"image": rng.uniform(-1, 1, (count, 28, 28, 3)).astype("float32"),
            "label": rng.integers(0, 10, count).astype("int32")}


def test_soft_distillation_from_the_student_itself_at_temperature_one_adds_nothing():
    logits = keras.ops.convert_to_tensor(np.random.default_rng(1).normal(0, 3, (16, 10)),
                                         "float32")
    np.testing.assert_allclose(to_np(distillation.losses("soft", logits, logits, 1.0)), 0.0,
                               atol=1e-6)
    other = keras.ops.convert_to_tensor(np.random.default_rng(2).normal(0, 3, (16, 10)),
                                        "float32")
    assert (to_np(distillation.losses("soft", logits, other, 1.0)) > 0).all()


def test_hard_distillation_is_cross_entropy_on_the_teachers_choice():
    rng = np.random.default_rng(3)
    student, teacher = rng.normal(0, 3, (16, 10)), rng.normal(0, 3, (16, 10))
    choice = teacher.argmax(-1)
    shifted = student - student.max(-1, keepdims=True)
    expected = -(shifted[np.arange(16), choice] - np.log(np.exp(shifted).sum(-1)))
    got = distillation.losses("hard", keras.ops.convert_to_tensor(student, "float32"),
                              keras.ops.convert_to_tensor(teacher, "float32"), 4.0)
    np.testing.assert_allclose(to_np(got), expected, rtol=1e-5)


def test_the_objective_mixes_the_labels_and_the_teacher_by_the_weight(fake_fmnist, tmp_path):
    teacher = write_teacher(tmp_path / "teacher.npz")
    config = tiny_config(fake_fmnist, distill="soft", distill_teacher=str(tmp_path /
                                                                        "teacher.npz"),
                         distill_weight=0.25, distill_temperature=1.0)
    objective = objectives.make(config, 10)
    model = objective.build()
    assert isinstance(model, distillation.StudentAndTeacher)
    assert not model.teacher.trainable_variables and model.trainable_variables == \
        model.student.trainable_variables
    for mine, theirs in zip(model.teacher.weights, teacher.weights):
        np.testing.assert_array_equal(to_np(mine), to_np(theirs))
    # The student as its own teacher: soft distillation at T = 1 adds a zero term.
    model.teacher.set_weights(model.student.get_weights())
    data = batch()
    losses, _, _ = objective.item_losses(model, data, training=True)
    plain = objectives.cross_entropy(data["label"], model(data["image"]), 10, 0.0)
    np.testing.assert_allclose(to_np(losses), 0.75 * to_np(plain), rtol=1e-5, atol=1e-6)
    evaluated, _, _ = objective.item_losses(model, data, training=False)  # the student alone
    np.testing.assert_allclose(to_np(evaluated), to_np(plain), rtol=1e-5, atol=1e-6)
    assert objective.encoder(model) is model.student


def test_a_distillation_token_learns_the_teacher_and_the_class_token_the_labels(
        fake_fmnist, tmp_path):
    """DeiT's token (section 5.1): the class head's logits meet the labels, the distillation
    head's the teacher's choice; evaluation reads their mean."""
    write_teacher(tmp_path / "teacher.npz")
    config = tiny_config(fake_fmnist, distill="hard", distill_teacher=str(tmp_path /
                                                                        "teacher.npz"),
                         distill_weight=0.25, model=dict(distillation_token=True))
    objective = objectives.make(config, 10)
    model = objective.build()
    assert model.has_distillation_head
    randomise(model.student, seed=6)  # two heads that differ
    data = batch()
    class_logits, token_logits = (to_np(logits) for logits in
                                  keras_vit.distillation_heads(model.student)(data["image"]))
    assert np.abs(class_logits - token_logits).max() > 0.1
    teacher_choice = to_np(model.teacher(data["image"])).argmax(-1)
    expected = 0.75 * to_np(objectives.cross_entropy(data["label"], class_logits, 10, 0.0)) + \
        0.25 * to_np(objectives.cross_entropy(teacher_choice, token_logits, 10, 0.0))
    losses, _, correct = objective.item_losses(model, data, training=True)
    np.testing.assert_allclose(to_np(losses), expected, rtol=1e-5)
    mean = (class_logits + token_logits) / 2
    np.testing.assert_array_equal(to_np(correct), mean.argmax(-1) == data["label"])
    np.testing.assert_allclose(to_np(model(data["image"])), mean, rtol=1e-5, atol=1e-6)


def test_training_leaves_the_teacher_bit_unchanged(fake_fmnist, tmp_path):
    import tensorflow as tf

    from train.engines import tf_engine
    write_teacher(tmp_path / "teacher.npz")
    config = tiny_config(fake_fmnist, distill="hard", distill_teacher=str(tmp_path /
                                                                        "teacher.npz"),
                         warmup_steps=0)
    with tempfile.TemporaryDirectory() as workdir:
        run = tf_engine.TFEngine(config, workdir, tf.distribute.OneDeviceStrategy("/cpu:0"))
        teacher = [to_np(variable) for variable in run.model.teacher.weights]
        student = [to_np(variable) for variable in run.model.student.weights]
        data = {name: tf.constant(value) for name, value in batch(32).items()}
        run.train_loop(iter(tf.data.Dataset.from_tensors(data).repeat()), tf.constant(3))
        for before, variable in zip(teacher, run.model.teacher.weights):
            np.testing.assert_array_equal(to_np(variable), before)
        assert any(not np.array_equal(to_np(variable), before)
                   for before, variable in zip(student, run.model.student.weights))
        assert len(run.optimizer.variables) <= 2 + 2 * len(run.model.student.trainable_variables)


def test_a_teacher_of_other_classes_or_no_teacher_is_one_error(fake_fmnist, tmp_path):
    write_teacher(tmp_path / "five.npz", num_classes=5)
    config = tiny_config(fake_fmnist, distill="soft", distill_teacher=str(tmp_path / "five.npz"))
    with pytest.raises(ValueError, match="has 5 classes, the dataset 10"):
        objectives.make(config, 10).build()
    for fields, shown in (({"distill": "soft"}, "config.distill='soft' needs a teacher"),
                          ({"distill_teacher": "x.npz"}, "say how to distill from it"),
                          ({"distill": "warm"}, "config.distill='warm'")):
        with pytest.raises(ValueError, match=shown):
            config_checks.check(tiny_config(fake_fmnist, **fields))


def test_a_missing_or_unreadable_teacher_is_named_as_config_distill_teacher(fake_fmnist,
                                                                             tmp_path):
    """A path that does not exist is said to be missing (by the config checks, before any slow
    work, and by the loading); an empty directory cannot be read, named as the teacher."""
    missing = str(tmp_path / "nowhere" / "teacher.npz")
    config = tiny_config(fake_fmnist, distill="soft", distill_teacher=missing)
    for refuse in (config_checks.check, lambda config: objectives.make(config, 10).build()):
        with pytest.raises(ValueError) as error:
            refuse(config)
        message = str(error.value)
        assert f"config.distill_teacher={missing!r}: does not exist" in message, message
        assert "architecture is unknown" not in message, message
    (tmp_path / "empty").mkdir()
    empty = str(tmp_path / "empty")
    config = tiny_config(fake_fmnist, distill="soft", distill_teacher=empty)
    config_checks.check(config)  # it exists: what it holds is read when the run starts
    with pytest.raises(ValueError) as error:
        objectives.make(config, 10).build()
    message = str(error.value)
    assert f"config.distill_teacher={empty!r} cannot be read: No config.json" in message, message
    assert "config.pretrained" not in message, message


def test_lora_trains_a_distillation_tokens_head_on_the_teacher_and_exports_it(
        fake_fmnist, tmp_path, monkeypatch):
    """--config.lora_rank with --config.distill=soft and a distillation-token student: its
    `head_dist` (zeros at the start) learns the teacher, and the exported model.keras holds it."""
    import os

    import tensorflow as tf

    from train.engines import tf_engine
    from train.run import export
    monkeypatch.setattr(export, "export_model", lambda *args, **kwargs: None)  # no serving
    write_teacher(tmp_path / "teacher.npz")
    config = tiny_config(fake_fmnist, distill="soft", distill_teacher=str(tmp_path /
                                                                        "teacher.npz"),
                         lora_rank=2, model=dict(distillation_token=True), total_steps=2,
                         steps_per_loop=1, warmup_steps=0, eval_every_steps=2,
                         checkpoint_every_steps=2, export=True)
    workdir = str(tmp_path / "run")
    tf_engine.train_and_evaluate(config, workdir, tf.distribute.OneDeviceStrategy("/cpu:0"))
    exported = keras.saving.load_model(os.path.join(workdir, "export", "model.keras"))
    assert not any("lora" in variable.path for variable in exported.weights)
    for head in ("head", "head_dist"):
        kernel = to_np(exported.get_layer(head).kernel)
        assert np.abs(kernel).max() > 0, f"{head}/kernel is still all zeros"

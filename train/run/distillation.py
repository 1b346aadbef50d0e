"""Knowledge distillation as DeiT trains it (Touvron et al., 2021, "Training data-efficient image
transformers & distillation through attention", section 5.1): a trained teacher's logits on the
student's own batch, augmented and mixed, join the labels in the loss.

    soft: (1 - w) CE(labels, s) + w T^2 KL(softmax(t / T) || softmax(s / T))
    hard: (1 - w) CE(labels, s) + w CE(argmax t, s)     (DeiT: w = 1/2)

A student with DeiT's distillation token (`config.model.distillation_token=True`, section 5.1,
"distillation through attention") learns the labels with its class token's head and the teacher
with its distillation token's head: s is the class head's logits in the first term and the
distillation head's in the second; it is evaluated, and exported, on their mean.

The teacher (`config.distill_teacher`: any checkpoint `config.pretrained` takes that says its
architecture, or a run's workdir, whose export is read) is built at the run's image size and
frozen inside the model the engines train (`StudentAndTeacher`): it runs in the same compiled
step, its weights are the model's non-trainable ones (placed and sharded as the student's, kept
in the run's checkpoints) and the optimizer never sees them. Evaluation and the export are the
student's alone.
"""

import os

import keras
from keras import ops

import keras_vit

from . import starting_point

KINDS = ("none", "soft", "hard")
RULES = {
    "distill": ("choice", KINDS),
    "distill_teacher": ("any_str", None),  # a checkpoint or a run's workdir: `check`
    "distill_weight": ("float", (0.0, 1.0, True)),
    "distill_temperature": ("float_above", (0.0, None, False)),
}


# What a teacher that names nothing is told (the config checks and `load_teacher`).
MISSING_TEACHER = ("does not exist: give a checkpoint that says its architecture (a directory, "
                   "hub name, model.keras or an .npz with its spec) or a trained run's workdir")


def check(config, report):
    """Adds to `report` (train.run.config_checks) a distillation without its teacher, a
    teacher without distillation, one for another objective than classification, and a
    teacher that names no file, directory, hub name or URL."""
    if not report.ok("distill", "distill_teacher", "objective"):
        return
    if config.distill != "none" and not config.distill_teacher:
        report.add("distill_teacher", "config.distill_teacher=''",
                   f"config.distill={config.distill!r} needs a teacher: a checkpoint (as "
                   "config.pretrained takes) or a trained run's workdir")
    elif config.distill == "none" and config.distill_teacher:
        report.add("distill", "config.distill='none'",
                   f"config.distill_teacher={config.distill_teacher!r} is given: say how to "
                   "distill from it, 'soft' or 'hard'")
    elif config.distill != "none" and config.objective != "classification":
        report.add("distill", f"config.distill={config.distill!r}",
                   "distils a classifier's logits; masked patch prediction has none: set it "
                   "to 'none'")
    elif config.distill != "none" and not starting_point.names_something(config.distill_teacher):
        report.add("distill_teacher", f"config.distill_teacher={config.distill_teacher!r}",
                   MISSING_TEACHER)


def teacher_source(path):
    """The checkpoint of `config.distill_teacher`: a run's workdir stands for its exported
    `model.keras`."""
    exported = os.path.join(path, "export", "model.keras")
    return exported if os.path.isfile(exported) else path


def load_teacher(config, num_classes):
    """The teacher of `config`, built at the run's image size and compute dtype without
    dropout, its weights the checkpoint's, frozen. A ValueError names a teacher whose
    architecture is unknown or whose head has other classes than the dataset's, and one that
    does not exist or cannot be read."""
    if not starting_point.names_something(config.distill_teacher):
        raise ValueError(f"config.distill_teacher={config.distill_teacher!r}: "
                         f"{MISSING_TEACHER}.")
    source = teacher_source(config.distill_teacher)
    found = (starting_point.read(source, field="distill_teacher")
             if starting_point.has_architecture(source) else None)
    if found is None or found.spec is None:
        raise ValueError(f"config.distill_teacher={config.distill_teacher!r}: its architecture "
                         "is unknown (an original .npz has no spec); give a checkpoint that "
                         "says it (a directory, hub name, model.keras or an .npz with its "
                         "spec) or a trained run's workdir.")
    if not found.spec.include_top or found.spec.num_classes != num_classes:
        classes = found.spec.num_classes if found.spec.include_top else "no"
        raise ValueError(f"config.distill_teacher={config.distill_teacher!r} has {classes} "
                         f"classes, the dataset {num_classes}: a teacher classifies the "
                         "student's classes. Fine-tune it on the dataset first.")
    teacher = keras_vit.vit(found.spec.replace(image_size=config.image_size, dropout=0.0,
                                               attention_dropout=0.0, drop_path_rate=0.0),
                            dtype=config.dtype_policy, name="teacher")
    keras_vit.weights.checkpoint.load_npz(teacher, found.arrays)
    teacher.trainable = False
    return teacher


class StudentAndTeacher(keras.Model):
    """The model a distilling run trains: called, the student's logits; `teacher_logits` the
    frozen teacher's. To the optimizer and the engines it is the student (`decays`,
    `layer_indices`, `num_blocks`, `get_layout_map` are the student's)."""

    def __init__(self, student, teacher, **kwargs):
        super().__init__(**kwargs)
        self.student, self.teacher = student, teacher

    def call(self, images, training=False):
        return self.student(images, training=training)

    @property
    def has_distillation_head(self):
        return self.student.spec.distillation_token

    def student_heads(self, images, training=False):
        """The student's class and distillation logits (a student with a distillation
        token). A functional model of the student's own layers, made where it is called:
        kept as an attribute, Keras would track its weights twice."""
        return keras_vit.distillation_heads(self.student)(images, training=training)

    def teacher_logits(self, images):
        return ops.stop_gradient(ops.cast(self.teacher(images, training=False), "float32"))

    def layer_indices(self, variables):
        return self.student.layer_indices(variables)

    @property
    def num_blocks(self):
        return self.student.num_blocks

    @property
    def decays(self):
        return self.student.decays

    @property
    def get_layout_map(self):
        return self.student.get_layout_map


def losses(kind, student_logits, teacher_logits, temperature):
    """Each example's distillation loss: `kind` "soft" (KL divergence of the softened
    distributions, times T^2 so that its gradients keep their scale, Hinton et al., 2015) or
    "hard" (cross-entropy on the teacher's choice)."""
    if kind == "hard":
        choice = ops.argmax(teacher_logits, axis=-1)
        return keras.losses.sparse_categorical_crossentropy(choice, student_logits,
                                                            from_logits=True)
    teacher_log = ops.log_softmax(teacher_logits / temperature, axis=-1)
    student_log = ops.log_softmax(student_logits / temperature, axis=-1)
    return temperature**2 * ops.sum(ops.exp(teacher_log) * (teacher_log - student_log), axis=-1)

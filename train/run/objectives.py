"""What the driver trains (`config.objective`): image classification, or masked patch prediction
(the paper's self-supervised pre-training, section 4.6).

An objective builds the model to train and, for a batch, gives the loss of every item (an
example, or a patch), each item's weight in the mean loss (1, or 0 for a patch the loss
ignores) and how right each item was, in `keras.ops`, so that both engines (tf.distribute and
JAX) train the same objective. Their steps, evaluation and checkpoints are the same for both.
"""

import keras
from keras import ops

import keras_vit
from keras_vit import masked_patches

from ..data import native_input
from . import distillation
from .model_config import model_spec

OBJECTIVES = ("classification", "masked_patch_prediction")
# float32 everywhere, or bfloat16 compute with float32 weights (TPU, CPUs with AMX). No float16:
# the step has no loss scaling, so float16 gradients would underflow.
DTYPE_POLICIES = ("float32", "mixed_bfloat16")

# The objective's config fields and their rules (as train.run.config_checks reads them);
# `check` adds what masked patch prediction needs of the model.
RULES = {
    "objective": ("choice", OBJECTIVES),
    "mpp_target": ("choice", masked_patches.TARGETS),
    "label_smoothing": ("float", (0.0, 1.0, False)),
    "dtype_policy": ("choice", DTYPE_POLICIES),
    # LoRA (keras_vit.lora): adapters of this rank on the blocks' attention and MLP kernels; 0
    # trains every weight. Alpha scales them by alpha / rank (None: the rank, a scale of 1).
    "lora_rank": ("int", (0, None)),
    "lora_alpha": ("optional_float_above", (0.0, None, False)),
    "lora_norms": ("bool", None),  # the LayerNorms train too
}


def check(config, report, spec):
    """Adds to `report` (train.run.config_checks) what LoRA, keras_vit.MaskedPatchPredictor
    and the corruption draw need of the model `spec` (a keras_vit.ViTConfig) and its
    patches."""
    _check_lora_without_rank(config, report)
    _check_lora_rank(config, report, spec)
    if not report.ok("objective"):
        return
    if report.ok("lora_rank") and config.lora_rank and config.objective != "classification":
        report.add("lora_rank", f"config.lora_rank={config.lora_rank}",
                   "adapts a classifier being fine-tuned; masked patch prediction trains every "
                   "weight: set it to 0")
    if config.objective != "masked_patch_prediction":
        return
    patch_pixels, cells = spec.total_stride, masked_patches.DOWNSCALED_CELLS
    if spec.dynamic_image_size:
        report.add("model.dynamic_image_size", "config.model.dynamic_image_size=True",
                   "masked patch prediction trains at one image size (its targets are the "
                   "patches of that grid): set it to False, and build a model of any size to "
                   "fine-tune")
    if (report.ok("mpp_target") and config.mpp_target == "downscaled_color"
            and patch_pixels % cells):
        report.add("mpp_target", f"config.mpp_target={config.mpp_target!r}",
                   f"averages each patch over {cells}x{cells} cells, so it needs patches of a "
                   f"multiple of {cells} pixels, not {patch_pixels} (use 'mean_color' or "
                   "'pixels')")
    if report.ok("mpp_random_rate") and config.mpp_random_rate > 0 and (
            config.image_size // patch_pixels) ** 2 < 2:
        report.add("mpp_random_rate", f"config.mpp_random_rate={config.mpp_random_rate}",
                   "replaces a patch by another patch of the image, but the image is one "
                   "patch: set it to 0")


# LoRA's optional fields, as they are when not given (configs/common.py).
LORA_OPTIONS = {"lora_alpha": None, "lora_norms": False}


def _check_lora_without_rank(config, report):
    """Adds to `report` LoRA's scale or norms given without its rank: a run without a rank
    trains every weight, and they would do nothing (as a teacher without config.distill)."""
    if not report.ok("lora_rank", *LORA_OPTIONS) or config.lora_rank:
        return
    given = [f"config.{name}={config[name]!r}" for name, unset in LORA_OPTIONS.items()
             if config[name] is not unset]
    if given:
        report.add("lora_rank", f"config.lora_rank={config.lora_rank!r}",
                   f"{', '.join(given)} given, but without a rank the run trains every weight "
                   "and no LoRA: set config.lora_rank to the adapters' rank (8 is common), or "
                   f"leave {'them' if len(given) > 1 else 'it'} out")


def _check_lora_rank(config, report, spec):
    """Adds to `report` a LoRA rank above what the kernels of the model `spec` take
    (keras_vit.lora.max_rank), which keras_vit.lora.enable would refuse once the run is
    set up."""
    if not report.ok("lora_rank") or not config.lora_rank:
        return
    limit = keras_vit.lora.max_rank(spec)
    if config.lora_rank > limit:
        report.add("lora_rank", f"config.lora_rank={config.lora_rank!r}",
                   f"must be at most {limit}, the smaller side of the narrowest kernel LoRA "
                   f"adapts (config.model.hidden_size={spec.hidden_size}, "
                   f"config.model.mlp_dim={spec.mlp_dim}): a larger rank makes adapters larger "
                   f"than those kernels and adapts them no better; give a rank <= {limit}")


def build_model(config, num_classes, include_top=True):
    """The ViT of `config` (with its classification head, or `include_top=False`: the encoder
    that returns the pooled representation), as `model_config.model_spec` describes it, adapted
    by LoRA where `config.lora_rank` asks."""
    model = keras_vit.vit(model_spec(config, num_classes, include_top), dtype=config.dtype_policy,
                          attention_impl=config.attention_impl, remat=config.remat)
    if config.lora_rank:  # before any weight is loaded or restored: the adapters are weights
        keras_vit.lora.enable(model, config.lora_rank, config.lora_alpha, config.lora_norms)
    return model


def cross_entropy(labels, logits, num_classes, label_smoothing):
    targets = ops.one_hot(labels, num_classes)
    return keras.losses.categorical_crossentropy(
        targets, ops.cast(logits, "float32"), from_logits=True, label_smoothing=label_smoothing)


def image_batch_shapes(images, image_size):
    """`{name: (shape, dtype)}` of a batch of `images` square images and their labels."""
    return {"image": ((images, image_size, image_size, 3), "float32"),
            "label": ((images,), "int32")}


class Classification:
    """Supervised: the class of each image (the batch's `label`; in training, mixed with the
    batch's `mix_label` by `mix_weight` where the input pipeline mixed the images). With
    `config.native`, each image at its own aspect ratio (`native`, a
    train.data.native_input.Plan): the model is `keras_vit.native.NaFlexViT` of the classifier,
    and a packed batch's labels and outputs are one per slot, empty slots of weight 0."""

    has_accuracy = True
    num_patches = None  # the input pipeline adds no corruption

    def __init__(self, config, num_classes):
        self.config, self.num_classes = config, num_classes
        spec = model_spec(config, num_classes) if config.get("native", "none") != "none" else None
        self.native = spec and native_input.plan(
            config, spec.patch_size, spec.grid_size[0] * spec.grid_size[1])

    def batch_shapes(self, images, image_size):
        """`{name: (shape, dtype)}` of a training batch of `images` images."""
        if self.native is not None:
            return self.native.train_shapes(images)
        return image_batch_shapes(images, image_size)

    def build(self):
        """The classifier; with `config.distill`, with its frozen teacher beside it; with
        `config.native`, as a NaFlexViT."""
        student = build_model(self.config, self.num_classes)
        if self.native is not None:
            from keras_vit.native import NaFlexViT

            return NaFlexViT(student)
        if self.config.distill == "none":
            return student
        return distillation.StudentAndTeacher(
            student, distillation.load_teacher(self.config, self.num_classes))

    def item_losses(self, model, batch, training):
        """`(losses, weights, correct)`, one of each per example."""
        distilling = training and self.config.distill != "none"
        if distilling and model.has_distillation_head:  # DeiT's token: a head for each term
            label_logits, teacher_term_logits = (
                ops.cast(logits, "float32")
                for logits in model.student_heads(batch["image"], training=True))
            logits = (label_logits + teacher_term_logits) / 2.0
        elif self.native is not None:
            return self._native_losses(model, batch, training)
        else:
            logits = ops.cast(model(batch["image"], training=training), "float32")
            label_logits = teacher_term_logits = logits
        smoothing = self.config.label_smoothing if training else 0.0
        losses = cross_entropy(batch["label"], label_logits, self.num_classes, smoothing)
        if training and "mix_label" in batch:  # Mixup/CutMix (train.data.mixing): mixed targets
            weight = ops.cast(batch["mix_weight"], "float32")
            losses = weight * losses + (1.0 - weight) * cross_entropy(
                batch["mix_label"], label_logits, self.num_classes, smoothing)
        if distilling:  # the teacher sees the same images
            weight = self.config.distill_weight
            losses = (1.0 - weight) * losses + weight * distillation.losses(
                self.config.distill, teacher_term_logits, model.teacher_logits(batch["image"]),
                self.config.distill_temperature)
        predicted = ops.cast(ops.argmax(logits, -1), "int32")
        correct = ops.cast(ops.equal(predicted, ops.cast(batch["label"], "int32")), "float32")
        return losses, ops.ones_like(losses), correct

    def _native_losses(self, model, batch, training):
        """`item_losses` of a NaFlexViT: one item per image (per slot of a packed batch)."""
        logits = ops.cast(model(batch, training=training), "float32")
        logits = ops.reshape(logits, (-1, logits.shape[-1]))
        labels = ops.reshape(batch["label"], (-1,))
        smoothing = self.config.label_smoothing if training else 0.0
        losses = cross_entropy(labels, logits, self.num_classes, smoothing)
        weights = (ops.reshape(ops.cast(batch["label_weight"], "float32"), (-1,))
                   if "label_weight" in batch else ops.ones_like(losses))
        predicted = ops.cast(ops.argmax(logits, -1), "int32")
        correct = ops.cast(ops.equal(predicted, ops.cast(labels, "int32")), "float32")
        return losses, weights, correct

    def encoder(self, model):
        """The model that the run exports: the classifier (a distilling run's student; a
        NaFlexViT's classic model, the same weights)."""
        model = getattr(model, "student", model)
        return getattr(model, "vit", model)


class MaskedPatchPrediction:
    """Self-supervised: predict the target of every corrupted patch (keras_vit.masked_patches)
    from the batch's `image` and its `corruption` and `source`, which the input pipeline draws
    (train.data.masking). The labels are not used."""

    native = None  # square images (train.data.native_input.check refuses the others)

    def __init__(self, config, num_classes):
        del num_classes  # no classes: the head predicts patch targets
        self.config = config
        self.has_accuracy = config.mpp_target != "pixels"
        self.num_patches = None  # known once the model is built

    def batch_shapes(self, images, image_size):
        """`{name: (shape, dtype)}` of a training batch of `images` images, with their
        patches' corruption."""
        shapes = image_batch_shapes(images, image_size)
        for name in ("corruption", "source"):
            shapes[name] = ((images, self.num_patches), "int32")
        return shapes

    def build(self):
        encoder = build_model(self.config, num_classes=1, include_top=False)
        model = masked_patches.MaskedPatchPredictor(encoder, target=self.config.mpp_target,
                                                    name="masked_patch_predictor")
        self.num_patches = model.num_patches
        return model

    def item_losses(self, model, batch, training):
        """`(losses, weights, correct)`, one of each per patch; only corrupted patches have
        weight (`correct` is None for the "pixels" target)."""
        images = batch["image"]
        predictions = model({"images": images, "corruption": batch["corruption"],
                             "source": batch["source"]}, training=training)
        targets = model.targets(images)
        losses = model.patch_losses(predictions, targets)
        weights = ops.cast(ops.not_equal(batch["corruption"], masked_patches.NOT_CORRUPTED),
                           "float32")
        return losses, weights, model.patch_accuracy(predictions, targets)

    def encoder(self, model):
        return model.encoder


def make(config, num_classes):
    kinds = dict(zip(OBJECTIVES, (Classification, MaskedPatchPrediction)))
    return kinds[config.objective](config, num_classes)

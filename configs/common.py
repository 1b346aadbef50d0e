"""Defaults shared by every experiment config; each field is documented here, the model's
(`config.model`) in the docstring of keras_vit.ViTConfig.

Experiment files (`quickstart.py`, `finetune.py`, `pretrain.py`) start from `get_config()` and
change what they need. The driver locks the result, so a misspelt `--config.field` is an error.
"""

import dataclasses
import typing

import ml_collections
from ml_collections.config_dict import placeholder

from keras_vit.architecture.spec import ViTConfig

# The ViTConfig fields that are not in config.model: the image size is the input pipeline's too
# (config.image_size), the classes are the dataset's, and the objective decides on the head.
NOT_MODEL_FIELDS = ("image_size", "num_classes", "include_top")


def get_config():
    config = ml_collections.ConfigDict()
    config.seed = 0  # seeds the model initialisation, the data order and the augmentation

    # The model: config.model holds every field of keras_vit.ViTConfig, whose docstring
    # documents each (variant, patch_size, ..., position_embedding, dropout, ...). It is made
    # from the dataclass (`model_fields`), so a model option added to the spec needs no edit
    # here; None (the default of the variant's table fields, classifier and dropout) takes the
    # variant's. E.g. --config.model.variant=Ti/16 --config.model.hidden_size=64.
    config.model = model_fields(variant="B/16")  # variant e.g. "Ti/16", "R50+B/16", "Axial-B/16"
    # What the run starts from: "" (from scratch), a published name or .npz (the config's
    # architecture), or a checkpoint that says its own: a hub name (hf:..., timm:...), a
    # transformers or timm directory, an .npz with its spec, an exported model.keras; its
    # architecture fills the config.model fields left at their defaults.
    config.pretrained = ""  # "": from scratch (docs/training.md#starting-from-a-checkpoint)
    config.pretrained_head = False  # keep the checkpoint's head (the dataset's classes)
    # LoRA: low-rank adapters on the blocks' attention and MLP kernels, which stay frozen with
    # every other weight but the heads (train/run/objectives.py); 0 trains every weight.
    config.lora_rank = 0  # the adapters' rank (8 is common); 0: no LoRA
    config.lora_alpha = placeholder(float)  # scales the adapters by alpha / rank; None: rank
    config.lora_norms = False  # the LayerNorms train too
    # DeiT's distillation (train/run/distillation.py): a trained teacher's logits on the same
    # batch join the labels in the loss.
    config.distill = "none"  # "none", "soft" (KL at a temperature) or "hard" (its arg-max)
    config.distill_teacher = ""  # a checkpoint, as config.pretrained, or a trained run's workdir
    config.distill_weight = 0.5  # w: (1 - w) x the labels' loss + w x the teacher's
    config.distill_temperature = 1.0  # T of soft distillation (DeiT's soft runs: 3.0)

    # Objective: supervised, or the paper's self-supervised pre-training (section 4.6,
    # configs/mpp.py): masked patches of each image, with targets from their pixels, no labels.
    config.objective = "classification"  # or "masked_patch_prediction"
    config.mpp_target = "mean_color"  # "mean_color" (512 classes), "downscaled_color", "pixels"
    config.mpp_corruption_rate = 0.5  # share of each image's patches corrupted and predicted
    config.mpp_mask_rate = 0.8  # of the corrupted: replaced by the learned [mask] embedding
    config.mpp_random_rate = 0.1  # of the corrupted: another patch's embedding; the rest stay

    # Data.
    config.dataset = "fashion_mnist_local"  # a TFDS name, "folder:/path/to/root" or the default
    config.data_dir = placeholder(str)  # TFDS data_dir (gs://)
    config.train_split = "train"  # TFDS split expression for training
    config.eval_split = "test"  # TFDS split expression for evaluation (all of it is used)
    config.image_size = 224  # training and evaluation resolution (square)
    config.crop_min_area = 0.05  # inception crop: smallest fraction of the image kept
    config.flip = True  # random horizontal flips in training
    # How evaluation images are resized to image_size (keras_vit.EvalPreprocessing): keras_vit's
    # own straight resize by default; config.pretrained's (e.g. timm's crop_pct) fills those
    # left at these defaults. The export's SavedModel resizes the same way.
    config.eval_interpolation = "bilinear"  # bilinear, bicubic or nearest
    config.eval_crop_fraction = 1.0  # resize to image_size / this, then crop the centre
    config.eval_crop_mode = "squash"  # squash (each side to its size) or center (keep aspect)
    config.eval_antialias = False  # filter when downscaling, as PIL does
    config.shuffle_buffer = 50_000  # TFRecord only: examples in a host's shuffle window
    # Images at their own aspect ratios (train/data/native_input.py, docs/native.md).
    config.native = "none"  # "none" (squares), "padded" (one per sequence) or "packed" (several)
    config.native_patches = 0  # each image's budget of patches; 0: (image_size / patch)^2
    config.native_min_patches = 0  # training budgets drawn from [this, native_patches]; 0: fixed
    config.pack_sequence_length = 0  # packed: patches per sequence; 0: 4 x native_patches
    config.pack_images = 8  # packed: at most this many images per sequence
    config.pack_sequences = 0  # packed: sequences per step; 0: as many tokens as padding
    # Augmentation beyond crop and flip (train/data/augmentation.py): an AugReg level sets
    # RandAugment and Mixup; a field below given a value replaces the level's (None: the level's).
    config.augment = "none"  # none, light1, light2, medium1, medium2, strong1 or strong2
    config.randaugment_layers = placeholder(int)  # RandAugment operations per image; 0 off
    config.randaugment_magnitude = placeholder(float)  # their strength, 0 to 30
    config.mixup_alpha = placeholder(float)  # Mixup's Beta(alpha, alpha); 0 off
    config.cutmix_alpha = 0.0  # CutMix's Beta(alpha, alpha); 0 off (DeiT: 1.0)
    config.cutmix_switch_prob = 0.5  # with both on: the chance a pair is cut rather than mixed
    config.random_erasing = 0.0  # the chance an image has a box erased to noise (DeiT: 0.25)
    config.input_pipeline = "auto"  # "tf.data", "grain" (JAX only, no TensorFlow) or "auto"
    config.input_workers = 0  # Grain: processes making batches (0: threads of this process)

    # Optimisation.
    config.batch_size = 512  # global batch, split evenly across replicas
    config.eval_batch_size = 512  # global evaluation batch
    config.total_steps = 10_000  # optimizer steps
    config.optimizer = "sgd"  # "sgd" (with momentum), "adam" or "adamw"
    config.learning_rate = 0.03  # base learning rate, reached at the end of warm-up
    config.warmup_steps = 500  # linear warm-up from 0
    config.decay = "cosine"  # after warm-up: "cosine" or "linear" decay to 0 at total_steps
    config.momentum = 0.9  # SGD momentum
    config.beta_1 = 0.9  # Adam
    config.beta_2 = 0.999  # Adam
    config.weight_decay = 0.0  # decoupled weight decay (adamw), of kernels only
    config.layer_decay = 1.0  # fine-tuning: block i of D learns at rate x decay^(D - i)
    config.grad_clip_norm = 1.0  # clip the global gradient norm; 0 to turn off
    config.accum_steps = 1  # gradient accumulation: micro-batches per optimizer step
    config.label_smoothing = 0.0  # of the one-hot targets
    config.dtype_policy = "float32"  # or "mixed_bfloat16" (TPU, and CPUs with AMX)
    config.ema_decay = 0.0  # Polyak averaging of the weights for evaluation; 0 turns it off

    # Loop, evaluation, checkpoints, export.
    config.steps_per_loop = 100  # steps run on the device per host call (one log line each)
    config.eval_every_steps = 1000  # also evaluated at the end
    config.checkpoint_every_steps = 1000  # also saved at the end and on SIGTERM
    config.keep_checkpoints = 3  # newest checkpoints kept in workdir/checkpoints
    config.jit_compile = False  # compile the train step with XLA (on TPU it always is)
    # How the model runs (keras_vit.architecture.execution), not what it is: kept out of the
    # model's files.
    config.attention_impl = "auto"  # "fused" (dot_product_attention), "explicit" or "auto"
    config.remat = "none"  # "blocks": each block computed again in the backward pass
    # JAX engine (KERAS_BACKEND=jax): devices of the mesh's model axis, over which each block's
    # attention and MLP matrices are split; the batch axis takes the other devices.
    config.model_parallel = 1  # 1: data parallel only
    config.fsdp = False  # JAX engine: weights and optimizer state also split over the batch axis
    config.export = True  # at the end, write the trained model into workdir/export
    # "none", "all" or a comma list of "float32", "int8" (uint8 pixels of any size in; needs the
    # "onnx" extra), as python -m train.export --onnx.
    config.export_onnx = "none"  # ONNX files the export writes too
    return config


def model_fields(**values):
    """`config.model`: a ConfigDict of every keras_vit.ViTConfig field but NOT_MODEL_FIELDS, at
    the spec's defaults (a typed placeholder where the default is None), then `values`."""
    types = typing.get_type_hints(ViTConfig)
    model = ml_collections.ConfigDict()
    for field in dataclasses.fields(ViTConfig):
        if field.name not in NOT_MODEL_FIELDS:
            default = field.default
            model[field.name] = placeholder(types[field.name]) if default is None else default
    model.update(values)
    return model

"""ViT weights where users keep them: `from_pretrained` reads a directory of Hugging Face
transformers' or timm's files (`config.json` + `model.safetensors`: their ViTs, DeiT's
distilled models, DINOv2, and the vision towers of CLIP and SigLIP), a name on the Hugging
Face hub, or an original `.npz`; `save_pretrained` writes a model for either library.

    model = keras_vit.from_pretrained("hf:google/vit-base-patch16-224")
    model = keras_vit.from_pretrained("timm:vit_base_patch16_224.augreg2_in21k_ft_in1k",
                                      num_classes=10, image_size=384)
    keras_vit.save_pretrained(model, "out/", format="transformers")   # or format="timm"

The checkpoint's evaluation resize and crop come along as the model's `preprocessing`
(`keras_vit.prepare_images` and the exported SavedModel apply it). Weights are read as
safetensors (never a pickled `pytorch_model.bin`) with the `safetensors` package's NumPy API,
and names on the hub download through `huggingface_hub` (cached; offline, the cached copy):
both come with `pip install "keras_vit[hub]"` and load only when used.
"""

import dataclasses
import importlib
import json
import math
import os
import warnings

import numpy as np

from keras_vit import fileio

from keras_vit.native import NaFlexViT
from keras_vit.weights import checkpoint, npz_architecture, torch_layouts
from keras_vit.weights.torch_layouts import (timm_naflex, transformers_aimv2, transformers_siglip,
                                             transformers_siglip2)
from keras_vit.model import build
from keras_vit.preprocessing import EvalPreprocessing

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PREPROCESSOR_FILE = "preprocessor_config.json"  # transformers' image mean and std
PREFIXES = {"hf:": "", "timm:": "timm/"}  # a hub name's prefix -> its repository's owner part
RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's codes, in preprocessor_config


def _import(module):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"Reading and writing transformers' and timm's files needs "
                          f"{module.split('.')[0]}: pip install \"keras_vit[hub]\".") from error


def local_directory(source, cache_dir=None):
    """The local directory of `source`: a directory, or "hf:<owner>/<name>" and
    "timm:<architecture>.<tag>" downloaded from the Hugging Face hub (config.json,
    model.safetensors and preprocessor_config.json only) into its cache, or found there when
    offline."""
    for prefix, owner in PREFIXES.items():
        if source.startswith(prefix):
            repo_id = owner + source[len(prefix):]
            hub = _import("huggingface_hub")
            try:  # the hub's own progress bars and cache; HF_HUB_OFFLINE=1 reads the cache only
                return hub.snapshot_download(
                    repo_id, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, PREPROCESSOR_FILE],
                    cache_dir=cache_dir)
            except Exception as error:  # the hub raises many types for a name it cannot get
                raise checkpoint.CheckpointError(
                    f"{source!r} could not be downloaded or found in the Hugging Face cache "
                    f"({type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}). "
                    "Check the name and the network (or HF_HUB_OFFLINE and the cache), or pass "
                    "a local directory.") from error
    if not os.path.isdir(source):
        raise FileNotFoundError(
            f"{source!r} is not a directory, an .npz file, or a hub name (hf:<owner>/<name>, "
            "timm:<architecture>.<tag>).")
    return source


def read_directory(directory):
    """`(config, state)`: a directory's `config.json` and its safetensors weights, by name,
    as numbers (`checkpoint.numeric_arrays`: bfloat16 as float32)."""
    config_path = os.path.join(directory, CONFIG_FILE)
    weights_path = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"No {CONFIG_FILE} in {directory!r}: a transformers or timm "
                                "model directory holds config.json and model.safetensors.")
    if not os.path.exists(weights_path):
        pickled = [name for name in ("pytorch_model.bin", "pytorch_model.bin.index.json")
                   if os.path.exists(os.path.join(directory, name))]
        raise FileNotFoundError(
            f"No {WEIGHTS_FILE} in {directory!r}" + (
                f" (only {pickled[0]}: pickled weights, which keras_vit never loads; convert "
                "them with the library that wrote them, e.g. save_pretrained(..., "
                "safe_serialization=True))" if pickled else "") + ".")
    try:
        with open(config_path) as handle:
            config = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise checkpoint.CheckpointError(f"{config_path} is not JSON: {error}") from error
    safetensors = _import("safetensors.numpy")
    try:
        state = safetensors.load_file(weights_path)
    except Exception as error:  # the reader raises its own types for a damaged file
        raise checkpoint.CheckpointError(
            f"{weights_path} is not a readable safetensors file: {error}") from error
    # bfloat16 widened to float32 now: the normalisation folds into the patch embedding in it.
    return config, checkpoint.numeric_arrays(state, weights_path)


def from_pretrained(source, *, dtype=None, name=None, cache_dir=None, preprocessing=None,
                    **fields):
    """A keras_vit model with the weights of `source`, and its evaluation preprocessing.

    Args:
        source: a directory holding transformers' or timm's `config.json` and
            `model.safetensors`, a hub name ("hf:google/vit-base-patch16-224",
            "timm:vit_base_patch16_224.augreg2_in21k_ft_in1k"), an `.npz` file (its
            architecture from the spec `checkpoint.save_npz` writes beside it, or for the
            paper's files, which have none, from its tensors: `keras_vit.weights.npz_architecture`,
            with the original's tanh GELU and LayerNorm epsilon 1e-6), or a keras_vit
            `.keras` model (loaded in safe mode).
        dtype, name: as `keras_vit.vit`.
        cache_dir: the Hugging Face cache (default: huggingface_hub's).
        preprocessing: a `keras_vit.EvalPreprocessing` to use instead of the checkpoint's
            (timm's `pretrained_cfg` interpolation, crop_pct and crop_mode; transformers'
            `preprocessor_config.json` resample), which the model's `preprocessing` holds.
        **fields: `ViTConfig` fields to change: `num_classes` (a new zero-initialised head
            where it differs), `image_size` (position embeddings resampled, bicubic for timm's
            weights as timm does it), `dynamic_image_size`, dropout rates...; for a
            `CLIPModel` (`MetaClip2Model`, `Aimv2Model`), `include_top=True` keeps its
            `visual_projection` as the head (its `image_embeds`; the tower alone otherwise).

    Every tensor is loaded strictly: a missing, extra or mis-shaped one is an error that
    names it, and nothing is loaded. The config says which GELU and which LayerNorm epsilon
    (transformers' default is 1e-12, timm's 1e-6). transformers' `ViTForImageClassification`
    gives its logits, its `ViTModel` the pooler's output, its `Dinov2Model` (and
    `Dinov2WithRegistersModel`) its `pooler_output`, the final LayerNorm's class token, their
    `...ForImageClassification` their logits (classifier "token_gap");
    `CLIPVisionModelWithProjection` its `image_embeds` (the projection as the head);
    `CLIPVisionModel`, `MetaClip2VisionModel` and `SiglipVisionModel` (and the vision tower of
    `CLIPModel`, `MetaClip2Model` and `SiglipModel`, the rest left out with a log line) their
    `pooler_output`; `IJepaModel` the mean of its `last_hidden_state` (classifier "gap"
    without a class token), its `IJepaForImageClassification` its logits; `Aimv2VisionModel`
    (and `Aimv2Model`'s vision tower) its `pooler_output` (without `use_head`, the mean of
    its `last_hidden_state`); with `include_top=True`, `Aimv2Model`'s `get_image_features`.
    DeiT's distilled models (timm's `VisionTransformerDistilled`, transformers'
    `DeiTForImageClassificationWithTeacher`) give the mean of their two heads' logits, as both
    libraries evaluate them;
    `keras_vit.distillation_heads(model)` gives each head's. NaFlex models (transformers'
    `Siglip2VisionModel`, timm's `NaFlexVit`) load as a `keras_vit.native.NaFlexViT`.
    """
    if preprocessing is not None and not isinstance(preprocessing, EvalPreprocessing):
        raise TypeError(f"preprocessing must be a keras_vit.EvalPreprocessing or None (the "
                        f"checkpoint's), got {type(preprocessing).__name__}.")
    # include_top=True asks for a CLIPModel's projection, the top of its image encoder.
    found = read_checkpoint(source, cache_dir, preprocessing,
                            projection=fields.get("include_top") is True)
    if found.spec is None:  # an .npz always has one (its sidecar's or its tensors')
        raise checkpoint.CheckpointError(
            f"{source!r} has no keras_vit spec, so its architecture is unknown: build the model "
            "with keras_vit.vit(variant, ...) and load the weights with "
            "keras_vit.weights.checkpoint.load_npz(model, path).")
    model = build(found.spec.replace(**fields), dtype=dtype, name=name)
    checkpoint.load_npz(model, found.arrays)
    model.preprocessing = found.preprocessing
    return NaFlexViT(model) if found.native else model


@dataclasses.dataclass
class Checkpoint:
    """What `read_checkpoint` found: the architecture (`spec`; for an `.npz` without a spec
    beside it, the one its tensors say), the weights as `.npz` arrays for keras_vit's [-1, 1]
    inputs (the checkpoint's normalisation folded in) and its evaluation resize and crop."""

    spec: object
    arrays: dict
    preprocessing: EvalPreprocessing
    # A NaFlex model's (SigLIP 2's, timm's NaFlexVit): images at their own aspect ratios
    # (keras_vit.native).
    native: bool = False


def read_checkpoint(source, cache_dir=None, preprocessing=None, projection=False):
    """The `Checkpoint` of `source`, as `from_pretrained` reads it, without building a model:
    a directory in transformers' or timm's layout, a hub name ("hf:...", "timm:..."), an
    `.npz` (its spec from the file `save_npz` writes beside it, or where there is none, as
    for the paper's files, read from its tensors and logged: `npz_architecture.spec_from_npz`),
    or a keras_vit `.keras` model (loaded in Keras' safe mode). `preprocessing`, when given,
    replaces the checkpoint's. `projection`: a CLIPModel's image encoder with its
    `visual_projection` as the head (its `image_embeds`), not the tower alone."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a directory, a hub name, an .npz or a .keras path, "
                        f"got {type(source).__name__}.")
    source = os.fspath(source)
    if source.endswith(".npz"):  # the original's preprocessing: bilinear, straight to the size
        arrays = checkpoint.read_npz(source)
        spec = checkpoint.read_spec(source)  # the spec save_npz wrote says it all
        if spec is None:  # the paper's files: their tensors say the architecture
            spec = npz_architecture.spec_from_npz(arrays, source)
        return Checkpoint(spec, arrays, preprocessing or EvalPreprocessing())
    if source.endswith(".keras"):
        model = checkpoint.read_keras_model(source)
        return Checkpoint(getattr(model, "spec", None), checkpoint.model_arrays(model),
                          preprocessing or model.preprocessing)
    source_directory = local_directory(source, cache_dir)
    config, state = read_directory(source_directory)
    layout = torch_layouts.detect(config)
    native = torch_layouts.is_native(config)  # SigLIP 2's, timm's NaFlexVit
    config, state = torch_layouts.vision_tower(  # CLIPModel's, SiglipModel's, SigLIP 2's
        config, state, projection=projection)
    processor = _processor(source_directory)
    preprocessing = preprocessing or _eval_preprocessing(config, layout, processor)
    if layout == "transformers":
        spec = torch_layouts.spec_from_transformers(config, state)
    else:
        spec = torch_layouts.spec_from_timm(config, state)
    arrays = torch_layouts.to_npz_arrays(state, spec, layout, config)
    _fold_normalization(arrays, *_normalization(config, processor))
    return Checkpoint(spec, arrays, preprocessing, native)


def _processor(directory):
    """transformers' `preprocessor_config.json` in `directory`, or {}."""
    path = os.path.join(directory, PREPROCESSOR_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def _eval_preprocessing(config, layout, processor):
    """How the checkpoint's library resizes evaluation images: timm's `pretrained_cfg` (where
    it is silent, timm's defaults: bicubic, crop_pct 0.875, centre crop), or the `resample` of
    transformers' `preprocessor_config.json`, `processor` (its ViTImageProcessor resizes
    straight to the size; DeiT's resizes, then crops the centre; no file: keras_vit's own).
    Both libraries resize with PIL, which filters when downscaling: antialias."""
    if layout == "timm":
        cfg = config.get("pretrained_cfg") or {}
        fields = {"interpolation": cfg.get("interpolation") or "bicubic",
                  "crop_fraction": cfg.get("crop_pct") or 0.875,
                  "crop_mode": cfg.get("crop_mode") or "center"}
        where = "config.json's pretrained_cfg"
    else:
        if not processor:
            return EvalPreprocessing()
        resample = processor.get("resample", 2)
        fields = {"interpolation": RESAMPLE.get(resample, f"PIL resample {resample}"),
                  **_processor_crop(processor)}
        where = PREPROCESSOR_FILE
    try:
        return EvalPreprocessing(antialias=True, **fields)
    except ValueError as error:
        raise checkpoint.CheckpointError(
            f"The checkpoint's evaluation preprocessing ({where}) is not one keras_vit has: "
            f"{error} Pass preprocessing=keras_vit.EvalPreprocessing(...) to from_pretrained "
            "to choose the nearest one.") from error


def _sides(size):
    """A transformers size (an int, or a dict of height and width) as [height, width]."""
    if isinstance(size, dict):
        return [size.get("height"), size.get("width")]
    return [size, size]


def _processor_crop(processor):
    """The crop_mode and crop_fraction of a transformers image processor that resizes, then
    crops the centre (DeiT's: to 256x256, then 224x224, timm's "squash"; to a shortest edge,
    timm's "center"); {} for one that resizes straight to the size."""
    if not (processor.get("do_center_crop") and processor.get("do_resize", True)):
        return {}
    size, crop = processor.get("size"), _sides(processor.get("crop_size"))
    if isinstance(size, int) and _processor_type(processor).startswith("CLIP"):
        size = {"shortest_edge": size}  # CLIP's older files: an int is the shortest edge
    if isinstance(size, dict) and "shortest_edge" in size:
        mode, resized = "center", [size["shortest_edge"]] * 2
    else:
        mode, resized = "squash", _sides(size)
    fraction = _fraction(crop, resized) if mode == "squash" or crop[0] == crop[1] else None
    if fraction is None:
        raise checkpoint.CheckpointError(
            f"{PREPROCESSOR_FILE} resizes to {size} and crops {processor.get('crop_size')}, "
            "which is not a resize-and-crop keras_vit has (one crop fraction for both sides). "
            "Pass preprocessing=keras_vit.EvalPreprocessing(...) to from_pretrained to choose "
            "the nearest one.")
    return {"crop_mode": mode, "crop_fraction": fraction}


def _processor_type(processor):
    return processor.get("image_processor_type") or processor.get("feature_extractor_type") or ""


def _fraction(crop, resized):
    """The crop fraction f for which keras_vit resizes each side of `crop` to
    floor(crop / f) == `resized`, or None."""
    if not all(isinstance(side, int) and side > 0 for side in [*crop, *resized]):
        return None
    fraction = crop[0] / resized[0]
    for candidate in (fraction, math.nextafter(fraction, 0)):  # crop / (crop / resized) < resized
        if candidate <= 1 and all(math.floor(side / candidate) == target
                                  for side, target in zip(crop, resized)):
            return candidate
    return None


def _normalization(config, processor):
    """The per-channel (mean, std) the weights were trained with, on pixels in [0, 1]: timm's
    `pretrained_cfg`, transformers' `preprocessor_config.json` (`processor`); (0.5, 0.5) where
    neither says (the original's [-1, 1], which is also what both libraries' ViT configs
    default to)."""
    cfg = config.get("pretrained_cfg") or {}
    mean, std = cfg.get("mean"), cfg.get("std")
    processor = processor if mean is None else {}
    if processor.get("do_normalize", True):
        mean, std = processor.get("image_mean", mean), processor.get("image_std", std)
    mean = np.broadcast_to(np.asarray(mean if mean is not None else 0.5, np.float64), (3,))
    std = np.broadcast_to(np.asarray(std if std is not None else 0.5, np.float64), (3,))
    return mean, std


def _fold_normalization(arrays, mean, std):
    """Makes weights trained on `(pixels / 255 - mean) / std` take keras_vit's inputs,
    `pixels / 127.5 - 1` (one preprocessing for every checkpoint): the patch embedding is
    linear, so the normalisation folds into its kernel and bias exactly."""
    if np.allclose(mean, 0.5) and np.allclose(std, 0.5):
        return
    if "conv_root/kernel" in arrays:  # a hybrid: a ResNet, not the patch embedding, comes first
        raise torch_layouts.LayoutError(
            f"The checkpoint's weights take pixels normalised by mean {list(mean)} and std "
            f"{list(std)}, which fold into a patch embedding but not into a hybrid's ResNet "
            "(its weight-standardised convolution and GroupNorm are not linear in them): "
            "keras_vit's hybrids take preprocess_inputs' [-1, 1] (mean and std 0.5) only.")
    # The first convolution: the patch embedding's, or MobileCLIP's stem's (no bias, unpadded:
    # the shift is a constant per channel, which its BatchNorm subtracts as a moving mean).
    first, bias, sign = "embedding/kernel", "embedding/bias", 1.0
    if "conv_stem/conv_0/kernel" in arrays:
        first, bias, sign = "conv_stem/conv_0/kernel", "conv_stem/bn_0/moving_mean", -1.0
    kernel = arrays[first].astype(np.float64)  # [p, p, 3, D]
    # x = pixels / 127.5 - 1 gives pixels / 255 = (x + 1) / 2, so their input is
    # x / (2 std) + (0.5 - mean) / std.
    arrays[bias] = (arrays[bias] + sign * np.einsum(
        "hwcd,c->d", kernel, (0.5 - mean) / std)).astype(arrays[bias].dtype)
    arrays[first] = (kernel / (2.0 * std)[:, None]).astype(arrays[first].dtype)


def _preprocessor_config(spec, preprocessing, architecture):
    """transformers' image processor for keras_vit's [-1, 1] inputs: its ViTImageProcessor,
    which resizes straight to the size and cannot crop (a warning says so for a model that
    crops), or for a model with DeiT's distillation token its DeiTImageProcessor, for one
    written as DINOv2 its BitImageProcessor, as CLIP its CLIPImageProcessor, which crop the
    centre after resizing as timm does (a warning for timm's crops of non-square images that
    keep the aspect ratio); as SigLIP, its SiglipImageProcessor, which cannot crop either."""
    height, width = spec.image_size
    resample = {name: code for code, name in RESAMPLE.items()}[preprocessing.interpolation]
    common = {"do_resize": True, "resample": resample, "do_rescale": True,
              "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5]}
    cropping = {"DeiTForImageClassificationWithTeacher": "DeiTImageProcessor",
                "Dinov2Model": "BitImageProcessor", "Dinov2WithRegistersModel": "BitImageProcessor",
                "Dinov2ForImageClassification": "BitImageProcessor",
                "Dinov2WithRegistersForImageClassification": "BitImageProcessor",
                "CLIPVisionModel": "CLIPImageProcessor",
                "CLIPVisionModelWithProjection": "CLIPImageProcessor",
                "Aimv2VisionModel": "CLIPImageProcessor"}  # as AIMv2's own files
    straight = {"SiglipVisionModel": "SiglipImageProcessor",  # else ViT's; none crops
                "DINOv3ViTModel": "DINOv3ViTImageProcessor"}
    if architecture in cropping:  # `architecture`: the config.json's transformers class
        return {"image_processor_type": cropping[architecture], **common,
                **_resize_then_crop(preprocessing, height, width, cropping[architecture])}
    if preprocessing.crop_mode != "squash" or preprocessing.crop_fraction != 1.0:
        _warn_uncropped(f"{straight.get(architecture, 'ViTImageProcessor')} resizes straight "
                        "to the size and does not crop", preprocessing, stacklevel=4)
    return {"image_processor_type": straight.get(architecture, "ViTImageProcessor"), **common,
            "size": {"height": height, "width": width}}


def _resize_then_crop(preprocessing, height, width, processor):
    """The size and centre crop of transformers' image `processor` (DeiT's, DINOv2's, CLIP's:
    they resize, then crop) for `preprocessing` (the sizes keras_vit's resize computes:
    floor(side / crop_fraction), the shorter side's for "center")."""
    scale = [math.floor(side / preprocessing.crop_fraction) for side in (height, width)]
    crops = preprocessing.crop_fraction != 1.0 or preprocessing.crop_mode != "squash"
    if preprocessing.crop_mode == "squash":
        size = {"height": scale[0], "width": scale[1]}
    elif height == width:  # torchvision's Resize(int), as transformers' shortest_edge
        size = {"shortest_edge": scale[0]}
    else:  # timm's ResizeKeepRatio, which transformers has no size for
        _warn_uncropped(f"{processor} cannot keep the aspect ratio of a non-square crop",
                        preprocessing, stacklevel=5)
        size, crops = {"height": height, "width": width}, False
    return {"size": size, "do_center_crop": crops,
            "crop_size": {"height": height, "width": width}}


def _warn_uncropped(why, preprocessing, stacklevel):
    """A warning, at save_pretrained's caller (`stacklevel`), that transformers will not crop."""
    warnings.warn(
        f"transformers' {why}: {PREPROCESSOR_FILE} keeps the model's "
        f"{preprocessing.interpolation} resize but not its crop (crop_fraction "
        f"{preprocessing.crop_fraction}, crop_mode {preprocessing.crop_mode!r}); crop images "
        "before transformers' pipelines, or save with format=\"timm\", which keeps it.",
        stacklevel=stacklevel)


def _check_native_writable(model, format):
    """A LayoutError unless `model`, a NaFlexViT, is one transformers' Siglip2VisionModel
    expresses (SigLIP's options; a square grid), or, for timm, its NaFlexVit, before anything
    is written."""
    spec = model.spec
    if format == "timm":
        timm_naflex.check_writable(spec, f"Model {model.name!r}")
        return
    transformers_aimv2.refuse_options(spec, "transformers' Siglip2VisionModel")
    if not transformers_siglip.writes(spec) or spec.include_top:
        raise torch_layouts.LayoutError(
            f"Model {model.name!r} cannot be written as transformers' Siglip2VisionModel: that "
            "class has SigLIP's options (attention pooling of the normed tokens, "
            "classifier='map', final_norm='tokens', no class token, no head). Save model.vit "
            "as a classic ViT instead.")


def save_pretrained(model, directory, format="transformers"):
    """Writes `model` (built by keras_vit) as `format`'s `config.json` + `model.safetensors` in
    a new `directory`, which `transformers.AutoModel...from_pretrained(directory)` or
    `timm.create_model("local-dir:" + directory, pretrained=True)` loads with equal outputs.
    The directory appears complete or not at all. What the library cannot express (a hybrid,
    relative or 2-D position embeddings; for transformers GAP beside a class token, attention
    pooling, registers, LayerScale without DINOv2's form and timm's other options; pre_logits
    with a head) is a
    `LayoutError` naming it, before anything is written. A model with DeiT's distillation token
    is written as timm's `VisionTransformerDistilled` or transformers'
    `DeiTForImageClassificationWithTeacher`; for transformers, one with LayerScale and no head
    as its `Dinov2Model` (with registers, `Dinov2WithRegistersModel`), with a head on
    classifier "token_gap" as `Dinov2ForImageClassification` (...WithRegisters...); one of
    CLIP's options (pre_norm, the pooled class token normed) as `CLIPVisionModel`, with a head
    of zero bias as `CLIPVisionModelWithProjection`; one of SigLIP's
    (attention pooling of normed tokens, no head) as `SiglipVisionModel`; one of GAP without a
    class token as `IJepaModel` (with a head, `IJepaForImageClassification`); one with AIMv2's
    norm of the patch tokens (`patch_norm`) as `Aimv2VisionModel`. A
    `keras_vit.native.NaFlexViT` is written as transformers' `Siglip2VisionModel` or timm's
    `NaFlexVit`. The
    model's `preprocessing` goes into timm's `pretrained_cfg` (interpolation, crop_pct,
    crop_mode) or transformers' `preprocessor_config.json` (resample; its ViTImageProcessor
    cannot crop: a warning; DeiT's crops as timm does)."""
    if format not in torch_layouts.FORMATS:
        raise ValueError(f"format must be one of {torch_layouts.FORMATS}, got {format!r}.")
    native = isinstance(model, NaFlexViT)
    if native:
        _check_native_writable(model, format)
        model = model.vit
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError(f"Model {getattr(model, 'name', model)!r} has no keras_vit spec; "
                         "save_pretrained takes a model built by keras_vit.vit().")
    preprocessing = getattr(model, "preprocessing", None) or EvalPreprocessing()
    arrays = checkpoint.model_arrays(model)  # Eva's and DINOv3's configs depend on the key bias
    timm_native = native and format == "timm"  # timm's NaFlexVit
    config = (torch_layouts.transformers_config(spec, arrays) if format == "transformers"
              else torch_layouts.timm_config(spec, preprocessing, arrays, native=timm_native))
    processor = (_preprocessor_config(spec, preprocessing, config["architectures"][0])
                 if format == "transformers" else None)
    state = torch_layouts.from_npz_arrays(arrays, spec, format, native=timm_native)
    if native and format == "transformers":
        config, state = transformers_siglip2.from_siglip(config, state)
        processor = transformers_siglip2.processor_config(config)
    safetensors = _import("safetensors.numpy")
    directory = os.fspath(directory)
    with fileio.atomic_directory(directory) as temporary:
        with open(os.path.join(temporary, CONFIG_FILE), "w") as handle:
            json.dump(config, handle, indent=2)
        if processor is not None:  # for transformers' image pipelines
            with open(os.path.join(temporary, PREPROCESSOR_FILE), "w") as handle:
                json.dump(processor, handle, indent=2)
        safetensors.save_file(state, os.path.join(temporary, WEIGHTS_FILE),
                              metadata={"format": "pt"})
    return directory

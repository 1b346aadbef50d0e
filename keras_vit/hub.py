"""ViT weights where users keep them: `from_pretrained` reads a directory of Hugging Face
transformers' or timm's files (`config.json` + `model.safetensors`), a name on the Hugging Face
hub, or an original `.npz`; `save_pretrained` writes a model for either library.

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
import os
import warnings

import numpy as np

from keras_vit import checkpoint, fileio, torch_layouts
from keras_vit.model import vit
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
    """`(config, state)`: a directory's `config.json` and its safetensors weights, by name."""
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
    return config, state


def from_pretrained(source, *, dtype=None, name=None, cache_dir=None, preprocessing=None,
                    **fields):
    """A keras_vit model with the weights of `source`, and its evaluation preprocessing.

    Args:
        source: a directory holding transformers' or timm's `config.json` and
            `model.safetensors`, a hub name ("hf:google/vit-base-patch16-224",
            "timm:vit_base_patch16_224.augreg2_in21k_ft_in1k"), or an original `.npz` file
            written by `checkpoint.save_npz` (its spec sidecar says the architecture), or a
            keras_vit `.keras` model (loaded in safe mode).
        dtype, name: as `keras_vit.vit`.
        cache_dir: the Hugging Face cache (default: huggingface_hub's).
        preprocessing: a `keras_vit.EvalPreprocessing` to use instead of the checkpoint's
            (timm's `pretrained_cfg` interpolation, crop_pct and crop_mode; transformers'
            `preprocessor_config.json` resample), which the model's `preprocessing` holds.
        **fields: `ViTConfig` fields to change: `num_classes` (a new zero-initialised head
            where it differs), `image_size` (position embeddings resampled, bicubic for timm's
            weights as timm does it), `dynamic_image_size`, dropout rates...

    Every tensor is loaded strictly: a missing, extra or mis-shaped one is an error that
    names it, and nothing is loaded. The config says which GELU and which LayerNorm epsilon
    (transformers' default is 1e-12, timm's 1e-6). transformers' `ViTForImageClassification`
    gives its logits, its `ViTModel` the pooler's output.
    """
    if preprocessing is not None and not isinstance(preprocessing, EvalPreprocessing):
        raise TypeError(f"preprocessing must be a keras_vit.EvalPreprocessing or None (the "
                        f"checkpoint's), got {type(preprocessing).__name__}.")
    found = read_checkpoint(source, cache_dir, preprocessing)
    if found.spec is None:
        raise checkpoint.CheckpointError(
            f"{source!r} has no spec beside it ({checkpoint.spec_file(source)}), so its "
            "architecture is unknown: load it with keras_vit.vit(variant, weights=path).")
    model = vit(found.spec.replace(**fields), dtype=dtype, name=name)
    checkpoint.load_npz(model, found.arrays)
    model.preprocessing = found.preprocessing
    return model


@dataclasses.dataclass
class Checkpoint:
    """What `read_checkpoint` found: the architecture (`spec`, None for an original `.npz`
    without a spec beside it), the weights as `.npz` arrays for keras_vit's [-1, 1] inputs (the
    checkpoint's normalisation folded in) and its evaluation resize and crop."""

    spec: object
    arrays: dict
    preprocessing: EvalPreprocessing


def read_checkpoint(source, cache_dir=None, preprocessing=None):
    """The `Checkpoint` of `source`, as `from_pretrained` reads it, without building a model:
    a directory in transformers' or timm's layout, a hub name ("hf:...", "timm:..."), an
    `.npz` (its spec from the file `save_npz` writes beside it), or a keras_vit `.keras` model
    (loaded in Keras' safe mode). `preprocessing`, when given, replaces the checkpoint's."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a directory, a hub name, an .npz or a .keras path, "
                        f"got {type(source).__name__}.")
    source = os.fspath(source)
    if source.endswith(".npz"):  # the original's preprocessing: bilinear, straight to the size
        return Checkpoint(checkpoint.read_spec(source), checkpoint.read_npz(source),
                          preprocessing or EvalPreprocessing())
    if source.endswith(".keras"):
        model = checkpoint.read_keras_model(source)
        return Checkpoint(getattr(model, "spec", None), checkpoint.model_arrays(model),
                          preprocessing or model.preprocessing)
    source_directory = local_directory(source, cache_dir)
    config, state = read_directory(source_directory)
    layout = torch_layouts.detect(config)
    processor = _processor(source_directory)
    preprocessing = preprocessing or _eval_preprocessing(config, layout, processor)
    if layout == "transformers":
        spec = torch_layouts.spec_from_transformers(config, state)
    else:
        spec = torch_layouts.spec_from_timm(config, state)
    arrays = torch_layouts.to_npz_arrays(state, spec, layout)
    _fold_normalization(arrays, *_normalization(config, processor))
    return Checkpoint(spec, arrays, preprocessing)


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
    straight to the size; no file: keras_vit's own). Both libraries resize with PIL, which
    filters when downscaling: antialias."""
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
        fields = {"interpolation": RESAMPLE.get(resample, f"PIL resample {resample}")}
        where = PREPROCESSOR_FILE
    try:
        return EvalPreprocessing(antialias=True, **fields)
    except ValueError as error:
        raise checkpoint.CheckpointError(
            f"The checkpoint's evaluation preprocessing ({where}) is not one keras_vit has: "
            f"{error} Pass preprocessing=keras_vit.EvalPreprocessing(...) to from_pretrained "
            "to choose the nearest one.") from error


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
    kernel = arrays["embedding/kernel"].astype(np.float64)  # [p, p, 3, D]
    # x = pixels / 127.5 - 1 gives pixels / 255 = (x + 1) / 2, so their input is
    # x / (2 std) + (0.5 - mean) / std.
    arrays["embedding/bias"] = (arrays["embedding/bias"] + np.einsum(
        "hwcd,c->d", kernel, (0.5 - mean) / std)).astype(arrays["embedding/bias"].dtype)
    arrays["embedding/kernel"] = (kernel / (2.0 * std)[:, None]).astype(
        arrays["embedding/kernel"].dtype)


def _preprocessor_config(spec, preprocessing):
    """transformers' ViTImageProcessor for keras_vit's [-1, 1] inputs; it resizes straight to
    the size and cannot crop (a warning says so for a model that crops)."""
    if preprocessing.crop_mode != "squash" or preprocessing.crop_fraction != 1.0:
        warnings.warn(
            f"transformers' ViTImageProcessor resizes straight to the size and does not crop: "
            f"{PREPROCESSOR_FILE} keeps the model's {preprocessing.interpolation} resize but not "
            f"its crop (crop_fraction {preprocessing.crop_fraction}, crop_mode "
            f"{preprocessing.crop_mode!r}); crop images before transformers' pipelines, or save "
            "with format=\"timm\", which keeps it.", stacklevel=3)
    height, width = spec.image_size
    resample = {name: code for code, name in RESAMPLE.items()}[preprocessing.interpolation]
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": height, "width": width}, "resample": resample,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def save_pretrained(model, directory, format="transformers"):
    """Writes `model` (built by keras_vit) as `format`'s `config.json` + `model.safetensors` in
    a new `directory`, which `transformers.AutoModel...from_pretrained(directory)` or
    `timm.create_model("local-dir:" + directory, pretrained=True)` loads with equal outputs.
    The directory appears complete or not at all. What the library cannot express (a hybrid,
    relative or 2-D position embeddings; for transformers GAP, attention pooling, registers,
    LayerScale and timm's other options; pre_logits with a head) is a `LayoutError` naming it,
    before anything is written. The model's `preprocessing` goes into
    timm's `pretrained_cfg` (interpolation, crop_pct, crop_mode) or transformers'
    `preprocessor_config.json` (resample; its ViTImageProcessor cannot crop: a warning)."""
    if format not in torch_layouts.FORMATS:
        raise ValueError(f"format must be one of {torch_layouts.FORMATS}, got {format!r}.")
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError(f"Model {getattr(model, 'name', model)!r} has no keras_vit spec; "
                         "save_pretrained takes a model built by keras_vit.vit().")
    preprocessing = getattr(model, "preprocessing", None) or EvalPreprocessing()
    config = (torch_layouts.transformers_config(spec) if format == "transformers"
              else torch_layouts.timm_config(spec, preprocessing))
    processor = _preprocessor_config(spec, preprocessing) if format == "transformers" else None
    state = torch_layouts.from_npz_arrays(checkpoint.model_arrays(model), spec, format)
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

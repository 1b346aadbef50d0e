"""Reads and writes the original ViT `.npz` checkpoints (the layout of the JAX release).

A checkpoint is a flat numpy archive whose keys are '/'-joined Flax paths such as
`Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel`. Keras weights are named after the same
tree, so each key maps mechanically to one model variable (`checkpoint_key`), with two layout
changes: attention kernels are stored as `(D, heads, D/heads)` (Keras keeps `(D, D)`), and old
hybrid files store GroupNorm parameters as `(1, 1, 1, C)`. Files written by the current vit_jax
code number a block's layers per class (`MlpBlock_0` for the released `MlpBlock_3`); loading
accepts both namings, saving writes the released one.

Loading checks everything before assigning anything, so a failed load leaves the model as it was:
the keys, the shapes, the dtypes (numbers: float16, bfloat16 and float32 files load; strings do
not), the finiteness of every array, and of every value in the model's dtype.
`save_npz` also writes the model's `keras_vit.ViTConfig` beside the file (`<file>.json`).
"""

import io
import json
import logging
import os
import zipfile

import keras
import numpy as np

from keras_vit import fileio, lora
from keras_vit import layers as vit_layers
from keras_vit.layers import resample
# Also public here, where it lived before keras_vit.layers.resample.
from keras_vit.layers.resample import resize_position_embeddings  # noqa: F401

logger = logging.getLogger(__name__)

# (relative_position: the encoder's relative-position MLP that every block shares.)
_TRANSFORMER_LAYERS = ("posembed_", "encoderblock_", "encoder_norm", "relative_position")
_HEAD_KEYS = ("head/kernel", "head/bias", "head_dist/kernel", "head_dist/bias")
_PRE_LOGITS_KEYS = ("pre_logits/kernel", "pre_logits/bias")
_PROJECTIONS = ("query", "key", "value", "out")  # stored per head: (D, heads, D / heads)
# Weights whose first axis is a grid axis (learned_2d), or the offsets along one (relative).
_GRID_TABLES = ("row_embedding", "column_embedding")
_OFFSET_TABLES = ("offset_embedding", "row_offset_embedding", "column_offset_embedding")
# A block's layers as the current vit_jax code names them (Flax Linen numbers each class on its
# own) -> as the released files do (one counter per block, in call order). vit_jax's
# checkpoint.load reads both (flax.training.checkpoints.convert_pre_linen); so does load_npz.
_LINEN_BLOCK_NAMES = {"MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
                      "LayerNorm_1": "LayerNorm_2", "MlpBlock_0": "MlpBlock_3"}
# What the refusals of non-numeric arrays say weights may be.
_NUMBERS = "float16, bfloat16, float32 or float64 (or integer) arrays"


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model, or a file that is not a checkpoint."""


def checkpoint_key(variable_path):
    """Maps a Keras variable path of a `keras_vit` model to its key in the original `.npz`.

    >>> checkpoint_key("encoderblock_3/LayerNorm_0/gamma")
    'Transformer/encoderblock_3/LayerNorm_0/scale'
    """
    parts = variable_path.split("/")
    if parts[0] == "resnet_root":  # the ResNet root lives at the top of the original tree
        parts = parts[1:]
    if parts in (["cls", "cls"], ["dist", "dist"]):  # the class and distillation tokens
        parts = parts[:1]
    parts[-1] = {"gamma": "scale", "beta": "bias"}.get(parts[-1], parts[-1])
    if parts[0].startswith(_TRANSFORMER_LAYERS):
        parts = ["Transformer"] + parts
    return "/".join(parts)


def _checkpoint_shape(key, keras_shape, head_dim):
    """The shape the original stores for a variable of `keras_shape`: the attention's
    projections per head of `head_dim` channels (grouped-query attention's keys and values
    have fewer heads than its queries)."""
    parts = key.split("/")
    if "MultiHeadDotProductAttention_1" not in parts or parts[-2] not in _PROJECTIONS:
        return tuple(keras_shape)  # also the relative position tables, stored as they are
    if "/out/" in key:
        if key.endswith("kernel"):
            return (keras_shape[0] // head_dim, head_dim, keras_shape[-1])
        return tuple(keras_shape)
    width = keras_shape[-1]
    if key.endswith("kernel"):
        return (keras_shape[0], width // head_dim, head_dim)
    return (width // head_dim, head_dim)


def _model_variables(model):
    """Yields `(checkpoint key, variable, checkpoint shape)` for every weight of `model` (of a
    model adapted by keras_vit.lora: the base kernels, not the adapters)."""
    head_dims = {}
    for layer in model.layers:
        if isinstance(layer, vit_layers.EncoderBlock):
            head_dims[layer.name] = layer.attention.head_dim
    for variable in model.weights:
        if lora.is_adapter(variable):
            continue
        key = checkpoint_key(variable.path)
        head_dim = head_dims.get(variable.path.split("/")[0])
        yield key, variable, _checkpoint_shape(key, variable.shape, head_dim)


def _unreachable(path, error):
    return CheckpointError(
        f"The checkpoint {path!r} could not be reached ({type(error).__name__}: "
        f"{str(error).strip().splitlines()[0] if str(error).strip() else error!r}). Check the "
        "path, the network and the credentials, or copy the file to a local path.")


def read_npz(path):
    """Reads an `.npz` checkpoint into a dict of numpy arrays of numbers (`numeric_arrays`:
    JAX's bfloat16 as float32), with clear errors for files that are missing, truncated or not
    numpy archives. Never unpickles.

    Raises `FileNotFoundError` for a missing file, and `CheckpointError` naming the path for a
    directory, a file that could not be reached (a `gs://` path without network or access:
    TensorFlow's error, e.g. an unresolvable host, is wrapped), one that is not an `.npz`, or
    one holding arrays of anything but numbers (strings, structures).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path or a gs:// path, got {path!r} "
                        f"({type(path).__name__}).")
    path = os.fspath(path)
    unreachable = fileio.remote_errors(path)
    try:
        exists = fileio.exists(path)
        is_directory = exists and fileio.isdir(path)
    except unreachable as error:
        raise _unreachable(path, error) from error
    if not exists:
        raise FileNotFoundError(f"No checkpoint file at {path!r}.")
    if is_directory:
        raise CheckpointError(
            f"{path!r} is a directory, not an .npz checkpoint file; pass the path of the "
            ".npz file inside it.")
    try:
        handle = fileio.open_file(path, "rb")
        # np.load reads through GFile for gs://; a network failure mid-read is an OpError.
        arrays = _read_archive(path, handle)
    except unreachable as error:
        raise _unreachable(path, error) from error
    return numeric_arrays(arrays, path)


def read_weights(path):
    """The arrays of a checkpoint, by key: an `.npz` (`read_npz`), or a keras_vit `.keras`
    model file (loaded in Keras' safe mode), e.g. the encoder a pre-training run exported."""
    if os.fspath(path).endswith(".keras"):
        return model_arrays(read_keras_model(path))
    return read_npz(path)


def read_keras_model(path):
    """A keras_vit `.keras` model file, loaded in Keras' safe mode, uncompiled; a
    `FileNotFoundError` or `CheckpointError` naming the path when it cannot be, or when it
    holds another Keras model than keras_vit's (whose weights have no place in a ViT)."""
    import keras

    if not os.path.exists(path) and "://" not in os.fspath(path):
        raise FileNotFoundError(f"No model file at {os.fspath(path)!r}.")
    try:
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
    except (OSError, ValueError, TypeError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{os.fspath(path)!r} is not a loadable keras_vit .keras "
                              f"model: {error}") from error
    # keras_vit's ViTModel (keras_vit.model, which imports this module) by what it carries.
    if not (hasattr(model, "spec") and hasattr(model, "preprocessing")):
        raise CheckpointError(
            f"{os.fspath(path)!r} is a Keras model of class {type(model).__name__}, not a "
            "keras_vit model, so its weights have no place in a ViT. keras_vit reads the .keras "
            "files of models keras_vit built (keras_vit.vit(...).save(path), a run's "
            "model.keras), original .npz checkpoints, and transformers' or timm's models: a "
            "directory of config.json and model.safetensors, or a hub name "
            "(hf:<owner>/<name>, timm:<architecture>.<tag>).")
    return model


def model_arrays(model):
    """A keras_vit model's weights as the arrays of its `.npz` checkpoint, by key (LoRA's
    adapters merged into their kernels)."""
    merged = lora.merged_kernels(model)
    return {key: np.asarray(keras.ops.convert_to_numpy(merged.get(variable.path, variable)))
            .reshape(shape) for key, variable, shape in _model_variables(model)}


def _read_archive(path, handle):
    with handle:
        try:
            archive = np.load(handle, allow_pickle=False)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
            raise CheckpointError(
                f"{path!r} is not a readable .npz checkpoint (truncated or corrupt?): {error}"
            ) from error
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise CheckpointError(
                f"{path!r} holds a single numpy array, not an .npz checkpoint archive.")
        with archive:
            try:
                return {key: archive[key] for key in archive.files}
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
                raise CheckpointError(
                    f"{path!r} is not a readable .npz checkpoint (truncated, corrupt, or "
                    f"holding pickled objects, which are never loaded): {error}"
                ) from error


def numeric_arrays(arrays, where="the arrays given"):
    """`arrays` (by key) as numpy arrays of numbers: floats and integers as they are, bfloat16
    (ml_dtypes', as JAX's and safetensors' arrays convert, or the 2-byte voids numpy reads an
    `.npz`'s back as) widened to float32, exactly. A `CheckpointError` naming `where` and
    every array of anything else (strings, objects, structures), before anything is used."""
    numbers, refused = {}, []
    for key, value in arrays.items():
        array = _as_numbers(value)
        if array is None:
            refused.append(f"{key} (dtype {_dtype_of(value)})")
        else:
            numbers[key] = array
    if refused:
        raise CheckpointError(
            f"The checkpoint {where!r} holds {len(refused)} array(s) that are not numbers: "
            f"{', '.join(refused[:10])}{', ...' if len(refused) > 10 else ''}. Weights are "
            f"{_NUMBERS}. Nothing was loaded. Remove those arrays from the file (or pass "
            "load_npz a dict of the others).")
    return numbers


def _as_numbers(value):
    """`value` as a numpy array of floats or integers (`numeric_arrays`), or None."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # e.g. ragged nested lists
        return None
    dtype = array.dtype
    if dtype.kind in "fiu":
        return array
    if dtype.name == "bfloat16":
        return array.astype(np.float32)
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.names is None:
        # bfloat16 stored by a writer with ml_dtypes ('|V2' in the .npy header): its bits are
        # the high half of a float32's.
        return (array.view("<u2").astype(np.uint32) << 16).view(np.float32)
    return None


def _dtype_of(value):
    dtype = getattr(value, "dtype", None)
    return type(value).__name__ if dtype is None else str(dtype)


def _released_layout(arrays, where="the arrays given"):
    """`arrays` with the encoder blocks' keys in the released files' naming (`LayerNorm_0`,
    `MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3`); files written by the current
    vit_jax code name them `LayerNorm_0`, `MultiHeadDotProductAttention_0`, `LayerNorm_1`,
    `MlpBlock_0`. A file that uses both namings raises `CheckpointError`: which array belongs
    where would be a guess."""
    linen, released, renamed = set(), set(), {}
    for key, value in arrays.items():
        parts = key.split("/")
        if len(parts) > 3 and parts[0] == "Transformer" and parts[1].startswith("encoderblock_"):
            if parts[2] in _LINEN_BLOCK_NAMES:
                linen.add(parts[2])
                parts[2] = _LINEN_BLOCK_NAMES[parts[2]]
            elif parts[2] in _LINEN_BLOCK_NAMES.values():
                released.add(parts[2])
        renamed["/".join(parts)] = value
    if linen and released:
        raise CheckpointError(
            f"The checkpoint {where!r} names encoder-block layers both as the current vit_jax "
            f"code does ({', '.join(sorted(linen))}) and as the released files do "
            f"({', '.join(sorted(released))}); a file uses one naming. Nothing was loaded.")
    return renamed


def _nonfinite_keys(arrays):
    """Keys of the floating-point arrays that hold a NaN or an infinity."""
    return sorted(key for key, value in arrays.items()
                  if np.issubdtype(np.asarray(value).dtype, np.inexact)
                  and not np.all(np.isfinite(value)))


def _resizable(key, value, shape):
    """Whether `value` is a weight of another grid (or patch size) that `_resized` maps to
    `shape`: same rank, and the same sizes on every axis but the grid's."""
    name = key.rsplit("/", 1)[-1]
    if key == "embedding/kernel":
        return value.ndim == 4 and value.shape[2:] == shape[2:]
    if name == "pos_embedding":  # resize_position_embeddings names what does not fit
        return True
    if name in _GRID_TABLES + _OFFSET_TABLES:
        return value.ndim == len(shape) and value.shape[1:] == shape[1:]
    return False


def _resized(key, value, shape, position, file_prefix):
    """`value` resampled to `shape`: see `load_npz`. Raises ValueError naming the problem."""
    name = key.rsplit("/", 1)[-1]
    interpolation = position.interpolation
    if key == "embedding/kernel":
        return resample.resize_patch_embedding(value, shape[:2])
    if name == "pos_embedding":
        if file_prefix != position.num_embedded_prefix:
            raise ValueError(f"the file has {file_prefix} rows for class, distillation and "
                             f"register tokens, the model {position.num_embedded_prefix} "
                             "(classifier 'token' vs 'gap', distillation_token, or another "
                             "num_register_tokens)")
        return resize_position_embeddings(value, position.grid_size,
                                          num_prefix_tokens=file_prefix,
                                          interpolation=interpolation)
    if name in _GRID_TABLES:
        return resample.resample_axis(value.astype(np.float64), shape[0], 0,
                                      interpolation).astype(value.dtype)
    has_prefix_row = position.num_prefix_tokens > 0  # relative tables: offsets (+ prefix row)
    old_offsets, new_offsets = (size - has_prefix_row for size in (value.shape[0], shape[0]))
    if old_offsets % 2 == 0 or new_offsets % 2 == 0:
        raise ValueError(f"file {value.shape}, model {shape}: not tables of 2n - 1 offsets")
    return resample.resize_offset_table(value.astype(np.float64), (new_offsets + 1) // 2,
                                        has_prefix_row, interpolation).astype(value.dtype)


def _file_prefix_rows(arrays, position):
    """Rows for prefix tokens in the file's position embeddings: its class, distillation and
    register tokens, where the model embeds prefix tokens (it cannot tell otherwise)."""
    if position is None or not position.embed_prefix:
        return 0
    registers = arrays.get("reg/registers")
    return (int("cls" in arrays) + int("dist" in arrays)
            + (0 if registers is None else registers.shape[1]))


def _position_layer(model):
    for layer in model.layers:
        if isinstance(layer, vit_layers.AddPositionEmbs):
            return layer
    return None


def load_npz(model, path, *, strict=True, new_head=False, allow_nonfinite=False):
    """Loads an original `.npz` checkpoint into a model built by `keras_vit`.

    The file may name the encoder blocks' layers as the released files do or as the current
    vit_jax code does (see `_LINEN_BLOCK_NAMES`). Weights of another grid are resampled to the
    model's (see `keras_vit.layers.resample`): position embeddings when the model's patch grid
    differs from the file's (a square grid is assumed for the file's; learned_2d tables and relative
    position tables too), with the model's `position_embedding_interpolation`, and the
    patch-embedding kernel of another patch size with FlexiViT's pseudo-inverse resize. The
    head is zero-initialised (the paper's transfer recipe) when the file has none, when its
    number of classes differs from the model's, or when `new_head=True`. A `pre_logits` layer
    in the file is used when the model has one and dropped otherwise.

    Args:
        model: a model from `keras_vit.vit()` or a named builder.
        path: local path or `gs://` path of the `.npz` file (or of a keras_vit `.keras`
            model, whose weights are used), or a dict of arrays.
        strict: if True (default), keys the model needs but the file lacks, keys the file has
            that the model cannot use, and shape mismatches raise one `CheckpointError` naming
            them all, and nothing is assigned. If False, what matches is loaded and the rest is
            logged.
        new_head: start the head from zeros even when the file's head would fit.
        allow_nonfinite: if False (default), a file whose arrays hold NaN or infinities raises
            a `CheckpointError` naming those arrays and nothing is assigned (such weights make
            every output NaN). True loads them as they are (e.g. to inspect a diverged run).

    Arrays may be of any float dtype (float16, bfloat16 as JAX and big_vision write it,
    float32, float64) or integers; each is cast to its variable's dtype. Every check is made,
    and every value cast, before the first weight is assigned: a load that raises leaves the
    model as it was.

    Raises:
        CheckpointError: the file does not fit the model (with `strict=True`), holds non-finite
            values or values beyond the range of the model's dtype (with
            `allow_nonfinite=False`), holds arrays that are not numbers, mixes the two namings
            of block layers, is a directory, could not be reached, is not an `.npz` archive,
            or is a `.keras` file of another model than keras_vit's. `FileNotFoundError` for a
            missing file.

    Returns:
        A dict with lists `loaded`, `missing`, `unexpected`, `mismatched` and `resized` keys.
    """
    where = path if not isinstance(path, dict) else "the arrays given"
    arrays = _checked_arrays(dict(path) if isinstance(path, dict) else read_weights(path),
                             where, allow_nonfinite)
    position = _position_layer(model)
    assignments, report, shapes = _matched(model, arrays, position, new_head)
    _check_fit(model, report, strict, len(assignments))
    if not allow_nonfinite:
        _check_model_dtypes(assignments, where)
    # All checked above: numbers (numeric_arrays) that fit their dtypes, or allowed not to,
    # so no cast can stop the assignments halfway.
    with np.errstate(over="ignore"):
        for _, variable, value in assignments:
            variable.assign(value.astype(_numpy_dtype(variable.dtype)))
    _log_changes(report, arrays, shapes, position)
    return report


def _checked_arrays(arrays, where, allow_nonfinite):
    """The file's `arrays` as numbers in the released layout, after refusing non-finite
    values (unless `allow_nonfinite`)."""
    arrays = _released_layout(numeric_arrays(arrays, where), where)
    bad = [] if allow_nonfinite else _nonfinite_keys(arrays)
    if bad:
        raise CheckpointError(
            f"The checkpoint {where!r} holds NaN or infinite values in {len(bad)} "
            f"array(s): {', '.join(bad[:10])}{', ...' if len(bad) > 10 else ''}. Nothing "
            "was loaded (such weights make every output NaN). Pass allow_nonfinite=True "
            "to load them anyway.")
    return arrays


def _matched(model, arrays, position, new_head):
    """`(assignments, report, shapes)`: `(key, variable, value)` for each of the model's
    weights the file gives (resampled to the model's grid where it differs), zeros for a new
    head; `load_npz`'s report of what was loaded, resized, new, missing, unexpected or
    mismatched; and the model's weights' shapes by checkpoint key."""
    file_prefix = _file_prefix_rows(arrays, position)
    report = {"loaded": [], "missing": [], "unexpected": [], "mismatched": [], "resized": [],
              "new_head": []}
    assignments, used = [], set()
    entries = list(_model_variables(model))
    shapes = {key: shape for key, _, shape in entries}
    # The head is kept or replaced as a whole. A head trained on top of pre_logits is useless
    # once the model drops pre_logits, even when its shape happens to fit.
    replace_head = new_head or any(
        key not in arrays or arrays[key].shape != shapes[key]
        for key in _HEAD_KEYS if key in shapes
    ) or any(key in arrays and key not in shapes for key in _PRE_LOGITS_KEYS)
    for key, variable, shape in entries:
        value = arrays.get(key)
        if key in _HEAD_KEYS and replace_head:
            used.add(key)
            report["new_head"].append(key)
            assignments.append((key, variable, np.zeros(variable.shape)))
            continue
        if value is None:
            report["missing"].append(key)
            continue
        used.add(key)
        if value.shape != shape and position is not None and _resizable(key, value, shape):
            try:
                value = _resized(key, value, shape, position, file_prefix)
            except ValueError as error:
                report["mismatched"].append(f"{key}: {error}")
                continue
            report["resized"].append(key)
        elif value.ndim == 4 and value.shape[:3] == (1, 1, 1) and len(shape) == 1:
            value = value.reshape(-1)  # GroupNorm parameters of old hybrid files
        if value.shape != shape:
            report["mismatched"].append(f"{key}: file {value.shape}, model {shape}")
            continue
        assignments.append((key, variable, value.reshape(variable.shape)))
        report["loaded"].append(key)
    # Head and pre-logits the model does not have are dropped by design, not errors.
    droppable = set(_HEAD_KEYS) | set(_PRE_LOGITS_KEYS)
    report["unexpected"] = sorted(set(arrays) - used - droppable)
    return assignments, report, shapes


def _check_fit(model, report, strict, count):
    """What the file and the model do not share: a CheckpointError with `strict`, else a
    warning beside the `count` weights that do fit."""
    problems = [(name, report[name]) for name in ("missing", "unexpected", "mismatched")
                if report[name]]
    if not problems:
        return
    text = "; ".join(f"{name} ({len(keys)}): {', '.join(keys)}" for name, keys in problems)
    if strict:
        raise CheckpointError(
            f"The checkpoint does not fit model {model.name!r}: {text}. Nothing was loaded. "
            "Pass strict=False to load the weights that fit.")
    logger.warning("Loaded %d weights into %s; skipped %s", count, model.name, text)


def _log_changes(report, arrays, shapes, position):
    """What the load changed beside copying: a resized patch embedding, resampled grids, a
    new head."""
    if "embedding/kernel" in report["resized"]:
        # Not an error (it is how a model changes its patch size), but far from free: say so.
        logger.warning(
            "Resized the patch embedding from %sx%s-pixel patches (the file's) to %sx%s (the "
            "model's) with FlexiViT's pseudo-inverse resize: a model trained at one patch size "
            "loses accuracy at another until it is fine-tuned.",
            *arrays["embedding/kernel"].shape[:2], *shapes["embedding/kernel"][:2])
    if report["resized"]:
        logger.info("Resampled %s to the model's %s grid.", ", ".join(report["resized"]),
                    position.grid_size)
    if report["new_head"]:
        logger.info("Started a new zero-initialised head (%s).", ", ".join(report["new_head"]))


def _check_model_dtypes(assignments, where):
    """A CheckpointError naming the arrays (of `(key, variable, value)` assignments) whose
    finite values their variable's dtype cannot hold: float16 ends at 65504, and the values
    beyond would be infinities."""
    overflowed, dtypes = [], set()
    for key, variable, value in assignments:
        dtype = _numpy_dtype(variable.dtype)
        if np.can_cast(value.dtype, dtype, "safe") or not np.all(np.isfinite(value)):
            continue  # widened exactly, or non-finite already (and allowed)
        with np.errstate(over="ignore"):  # the overflow is what is looked for
            if not np.all(np.isfinite(value.astype(dtype))):
                overflowed.append(key)
                dtypes.add(str(dtype))
    if overflowed:
        raise CheckpointError(
            f"The checkpoint {where!r} holds values beyond the range of the model's "
            f"{' and '.join(sorted(dtypes))} in {len(overflowed)} array(s): "
            f"{', '.join(overflowed[:10])}{', ...' if len(overflowed) > 10 else ''}. Nothing "
            "was loaded (they would be infinities, and every output NaN). Build the model in "
            "float32 or bfloat16 (keras_vit.vit(..., dtype=...)), or pass allow_nonfinite=True "
            "to load them anyway.")


def _numpy_dtype(name):
    """The numpy dtype of a Keras dtype name (numpy has no bfloat16 of its own)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if str(name) == "bfloat16" else np.dtype(str(name))


def save_npz(model, path):
    """Writes a model's weights as an `.npz` in the original layout (JAX code can read it).

    The file is written to a temporary name and renamed, so an interrupted save leaves any
    previous file at `path` intact. `path` may be local or `gs://`. A local path whose directory
    is missing, is not a directory or is not writable raises `FileNotFoundError`,
    `NotADirectoryError` or `PermissionError` naming the directory before anything is written.
    Non-finite weights are written as they are (`load_npz` refuses them by default).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path or a gs:// path, got {path!r} "
                        f"({type(path).__name__}).")
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    if not fileio.is_remote(path):  # object stores have no directories to check
        if not os.path.exists(directory):
            raise FileNotFoundError(
                f"Cannot save the checkpoint {path!r}: its directory {directory!r} does not "
                "exist; create it first.")
        if not os.path.isdir(directory):
            raise NotADirectoryError(
                f"Cannot save the checkpoint {path!r}: {directory!r} is not a directory.")
        if os.path.isdir(path):
            raise IsADirectoryError(
                f"Cannot save the checkpoint {path!r}: it is a directory; pass a file path "
                "such as model.npz.")
        if not os.access(directory, os.W_OK):
            raise PermissionError(
                f"Cannot save the checkpoint {path!r}: the directory {directory!r} is not "
                "writable.")
    buffer = io.BytesIO()  # zip needs a seekable file; GFile writers are not
    np.savez(buffer, **model_arrays(model))
    written = fileio.write_atomically(path, buffer.getvalue())
    spec = getattr(model, "spec", None)
    if spec is not None:  # the sidecar says what the arrays are (JAX code reads the .npz alone)
        fileio.write_atomically(spec_file(path), json.dumps(spec.to_dict(), indent=2))
    elif fileio.exists(spec_file(path)):
        fileio.remove(spec_file(path))  # it described an earlier file at this path
    return written


def spec_file(path):
    """The sidecar `save_npz` writes beside `path`: the model's `ViTConfig` as JSON."""
    return os.fspath(path) + ".json"


def read_spec(path):
    """The `keras_vit.ViTConfig` recorded beside the `.npz` at `path`, or None if none is."""
    from keras_vit.architecture.spec import ViTConfig

    if not fileio.exists(spec_file(path)):
        return None
    with fileio.open_file(spec_file(path), "r") as handle:
        text = handle.read()
    try:
        return ViTConfig.from_dict(json.loads(text))
    except (json.JSONDecodeError, TypeError, ValueError) as error:
        raise CheckpointError(f"{spec_file(path)} is not a keras_vit spec ({error}); remove it "
                              "or write it again with save_npz.") from error

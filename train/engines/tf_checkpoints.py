"""The TensorFlow engine's training checkpoints (train.engines.tf_engine), made to survive damage,
killed saves and full disks. (The original pre-trained `.npz` weights are
keras_vit.weights.checkpoint's.)

The engine saves `tf.train.Checkpoint(model=..., optimizer=..., ema=[...])` through a
`tf.train.CheckpointManager`, which writes `ckpt-N.index`, `ckpt-N.data-?????-of-?????` and the
index file `checkpoint` (the list of checkpoints, newest last). This module adds what the manager
lacks:

- `restore_newest` resumes from the newest checkpoint that reads, moving unreadable ones into
  `corrupt/` (never deleting them) and repairing a missing or stale `checkpoint` index file.
- `save` turns a failed save (disk full, any write error) into a one-line `CheckpointWriteError`,
  removes the failed save's partial files, and clears what killed saves left behind.

What TensorFlow 2.21 raises when it restores a damaged checkpoint (measured by truncating every
file at every length and flipping every byte of a small checkpoint):

- data file truncated (any length): `IndexError("Read less bytes than requested")`, raised
  while reading the object graph, before any variable is assigned;
- data file missing: `tf.errors.OpError` (the base class, code UNKNOWN) naming the file;
- data bytes flipped: `tf.errors.DataLossError` (a variable's checksum) or `OpError`/UNKNOWN
  (the object graph's checksum);
- index file truncated or garbage: `OpError`/UNKNOWN ("not an sstable (bad magic number)",
  "file is too short to be an sstable", "block checksum mismatch"), rarely `IndexError`;
- index file missing: `tf.errors.NotFoundError`.

A checkpoint written by another model or optimizer raises `ValueError` (a shape differs) or
`AssertionError` (from `assert_existing_objects_matched`: objects without values); those are not
damage, and no damaged file produced them, so they stop the run instead of moving anything.

All file operations use `tf.io.gfile`, so the directory may be on GCS (`gs://...`).
"""

import os
import re

import tensorflow as tf
from absl import logging

from keras_vit import fileio

CORRUPT_DIR = "corrupt"
INDEX_FILE = "checkpoint"  # the CheckpointManager's list of checkpoints
_PREFIX = "ckpt"
_INDEX_NAME = re.compile(rf"^{_PREFIX}-(\d+)\.index$")
# Killed saves leave TensorFlow's temporaries: `ckpt-N_temp/` (the shards before they are
# merged) and `checkpoint.tmp<hex>` (the index file before it is renamed into place); a killed
# `repair_index` leaves fileio's `checkpoint.partial-*`.
_LEFTOVER_PATTERNS = (f"{_PREFIX}-*_temp*", f"{INDEX_FILE}.tmp*",
                      f"{INDEX_FILE}{fileio.PARTIAL_MARKER}*")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the message is one line that says what to do."""


class NoReadableCheckpointError(RuntimeError):
    """Checkpoints exist, but none can be restored; nothing was moved."""


class CheckpointMismatchError(NoReadableCheckpointError):
    """A checkpoint reads, but holds another model or optimizer than the one being restored."""


# ----------------------------------------------------------------------------------------------
# Listing
# ----------------------------------------------------------------------------------------------

def checkpoint_steps(directory):
    """The steps N with a `ckpt-N.index` in `directory`, newest first.

    Temporaries of killed saves (`ckpt-N_temp*`) and anything in `corrupt/` are not listed; a
    missing directory has no checkpoints.
    """
    names = (os.path.basename(path) for path in
             tf.io.gfile.glob(os.path.join(directory, f"{_PREFIX}-*.index")))
    return sorted((int(match.group(1)) for match in map(_INDEX_NAME.match, names) if match),
                  reverse=True)


def _prefix(directory, step):
    return os.path.join(directory, f"{_PREFIX}-{step}")


def _files_of(directory, step):
    """The files of checkpoint `step`: its index and its data shards ("ckpt-1.*" does not match
    ckpt-10's files)."""
    return sorted(tf.io.gfile.glob(_prefix(directory, step) + ".*"))


# ----------------------------------------------------------------------------------------------
# Restoring
# ----------------------------------------------------------------------------------------------

def _is_damage(error):
    """True for the errors a damaged checkpoint raises (see the module doc). Errors of access or
    of the network (PermissionDenied, Unavailable, DeadlineExceeded, ...) are not damage: they say
    nothing about the files, and moving a good checkpoint aside because of them would lose it."""
    if isinstance(error, IndexError):
        return True
    if isinstance(error, (tf.errors.DataLossError, tf.errors.NotFoundError,
                          tf.errors.OutOfRangeError)):
        return True
    return isinstance(error, tf.errors.OpError) and error.error_code == tf.errors.UNKNOWN


def _reason(error):
    """The first line of a TensorFlow error, without the op wrapper around it."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else ""
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:\w+\]$", "", text)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _bad_files(directory, step, error):
    """Which files of checkpoint `step` are to blame for `error`, as names within `directory`."""
    prefix = _prefix(directory, step)
    # TensorFlow names the file for some damage (a missing data shard, for one).
    named = re.findall(re.escape(prefix) + r"\.(?:index|data-\d+-of-\d+)", str(error))
    if named:
        return sorted({os.path.basename(path) for path in named})
    index = prefix + ".index"
    try:
        tf.train.load_checkpoint(prefix)  # reads the index only, the data files lazily
    except (tf.errors.OpError, IndexError):
        return [os.path.basename(index)]
    return [os.path.basename(path) for path in _files_of(directory, step) if path != index]


def _try_restore(checkpoint, directory, step):
    """Restores checkpoint `step` into `checkpoint`; returns None, or a line saying why it is
    unreadable. Raises when the failure is not damage of the files."""
    prefix = _prefix(directory, step)
    try:
        checkpoint.restore(prefix).assert_existing_objects_matched()
        return None
    except (AssertionError, ValueError) as error:
        raise CheckpointMismatchError(
            f"{prefix} does not match this model and optimizer ({_reason(error)}). Resume with "
            "the code and config that wrote it, or use a new workdir.") from error
    except (tf.errors.OpError, IndexError) as error:
        if not _is_damage(error):
            raise NoReadableCheckpointError(
                f"Could not read {prefix} ({_reason(error)}); nothing was moved. Fix the access "
                "to the directory, or retry.") from error
        return f"{', '.join(_bad_files(directory, step, error))}: {_reason(error)}"


def restore_newest(checkpoint, directory, writable=True):
    """Restores the newest readable checkpoint of `directory` into `checkpoint`.

    Tries the checkpoints newest first with `checkpoint.restore(prefix)
    .assert_existing_objects_matched()`. An unreadable one gets one warning line naming its bad
    file(s) and the reason, and the next older one is tried. Once one restores, and when
    `writable`, the unreadable newer ones are moved into `directory/corrupt/` (never deleted) and
    the `checkpoint` index file is rewritten if it does not list exactly the checkpoints left, so
    that a `CheckpointManager` created afterwards rotates them and names the right latest one.
    Create the manager after this call: it reads the index file when it is created.

    A restore that fails halfway does no harm. A damaged variable tensor fails its whole batch
    before any assignment, but `save_counter` is restored in a later batch, so damage to it
    leaves every other variable holding the newer checkpoint's values (measured). The next,
    older restore assigns every variable again: `assert_existing_objects_matched` fails unless
    each existing object got a value from that checkpoint, so no value of the failed attempt can
    survive. (Objects created after the restore are not covered; build them first, as the
    trainer does with the optimizer and the EMA.)

    Args:
      checkpoint: the `tf.train.Checkpoint` to restore into.
      directory: where the checkpoints are (local or gs://).
      writable: False on workers that share the directory with a writing chief: then nothing in
        `directory` is moved or written.

    Returns:
      The step N of the restored `ckpt-N`, or None when there is no checkpoint at all.

    Raises:
      NoReadableCheckpointError: checkpoints exist but none restores (nothing is moved, so a
        rerun cannot silently start from scratch), or a file could not be read for another
        reason than damage (access, network).
      CheckpointMismatchError: a checkpoint holds another model or optimizer.
      CheckpointWriteError: the repaired index file could not be written.
    """
    steps = checkpoint_steps(directory)
    if not steps:
        if writable:
            repair_index(directory)
        return None
    unreadable = {}
    for step in steps:
        problem = _try_restore(checkpoint, directory, step)
        if problem is None:
            break
        unreadable[step] = problem
        logging.warning("Checkpoint %s is unreadable (%s); trying the next older one.",
                        _prefix(directory, step), problem)
    else:
        listing = "; ".join(f"{_PREFIX}-{step}: {problem}" for step, problem in unreadable.items())
        raise NoReadableCheckpointError(
            f"None of the {len(steps)} checkpoints in {directory} is readable ({listing}). "
            "Nothing was moved. Move the damaged files away (or use a new workdir) to start "
            "from scratch.")
    if writable:
        for bad_step in unreadable:
            move_aside(directory, bad_step)
        repair_index(directory)
    return step


def move_aside(directory, step):
    """Moves the files of checkpoint `step` into `directory/corrupt/`, keeping their names (a
    `.1`, `.2`, ... suffix when an earlier damaged checkpoint of that step is already there).
    Returns the new paths."""
    corrupt = os.path.join(directory, CORRUPT_DIR)
    tf.io.gfile.makedirs(corrupt)
    sources = _files_of(directory, step)
    names = [os.path.basename(path) for path in sources]
    suffix, attempt = "", 0
    while any(tf.io.gfile.exists(os.path.join(corrupt, name + suffix)) for name in names):
        attempt += 1
        suffix = f".{attempt}"
    targets = [os.path.join(corrupt, name + suffix) for name in names]
    for source, target in zip(sources, targets):
        try:
            tf.io.gfile.rename(source, target)
        except (tf.errors.OpError, OSError) as error:
            raise CheckpointWriteError(
                f"Could not move the unreadable {source} to {corrupt} ({_reason(error)}). Move "
                f"the files of {_PREFIX}-{step} there yourself, then rerun.") from error
    logging.warning("Moved %s to %s (kept for inspection; delete them when no longer needed).",
                    ", ".join(names), corrupt)
    return targets


# ----------------------------------------------------------------------------------------------
# The `checkpoint` index file
# ----------------------------------------------------------------------------------------------

def _read_index(directory):
    """The parsed `checkpoint` index file, or None when it is missing or unreadable."""
    try:
        # Logs a warning itself for a file that does not parse.
        return tf.train.get_checkpoint_state(directory)
    except ValueError:  # parses, but names no latest checkpoint (e.g. an empty file)
        return None


def _index_lists(state, names):
    """True when the index `state` lists exactly `names` (oldest first) as checkpoints that a
    CheckpointManager manages: ones with a timestamp after `last_preserved_timestamp`."""
    if state is None:
        return False
    listed = [os.path.basename(path) for path in state.all_model_checkpoint_paths]
    stamps = list(state.all_model_checkpoint_timestamps)
    return (os.path.basename(state.model_checkpoint_path) == names[-1] and listed == names
            and len(stamps) == len(names)
            and all(stamp > state.last_preserved_timestamp for stamp in stamps))


def repair_index(directory):
    """Makes the `checkpoint` index file list exactly the checkpoints in `directory`, newest as
    the latest; rewrites it (atomically) only when it is missing or says something else.

    Keeps the save times the index file had; a checkpoint it did not list gets its index file's
    modification time. Checkpoints kept by `keep_checkpoint_every_n_hours` become managed ones
    again (the trainer does not use that option).
    """
    steps = sorted(checkpoint_steps(directory))
    path = os.path.join(directory, INDEX_FILE)
    if not steps:
        if tf.io.gfile.exists(path):  # it names checkpoints that are gone
            tf.io.gfile.remove(path)
            logging.warning("Removed %s: it listed checkpoints that are gone.", path)
        return
    names = [f"{_PREFIX}-{step}" for step in steps]
    state = _read_index(directory)
    if _index_lists(state, names):
        return
    known = {} if state is None else {
        os.path.basename(name): stamp for name, stamp in
        zip(state.all_model_checkpoint_paths, state.all_model_checkpoint_timestamps)}
    stamps = [known.get(name) or _modified(os.path.join(directory, name + ".index"))
              for name in names]
    # The CheckpointManager only rotates checkpoints saved after this time.
    preserved = min(stamps) - 1.0
    lines = [f'model_checkpoint_path: "{names[-1]}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    lines += [f"all_model_checkpoint_timestamps: {stamp!r}" for stamp in stamps]
    lines += [f"last_preserved_timestamp: {preserved!r}"]
    _write_atomically(path, "\n".join(lines) + "\n")
    logging.warning("Rewrote %s to list %s (it was %s).", path, ", ".join(names),
                    "missing or unreadable" if state is None else "out of date")


def _modified(path):
    """The modification time of `path` in seconds since the epoch."""
    return tf.io.gfile.stat(path).mtime_nsec / 1e9


def _write_atomically(path, text):
    """`fileio.write_atomically`, with a write error turned into a CheckpointWriteError."""
    try:
        fileio.write_atomically(path, text)
    except (tf.errors.OpError, OSError) as error:
        raise CheckpointWriteError(
            f"Could not write {path} ({_reason(error)}); the checkpoints beside it are intact. "
            "Free space or fix the error, then rerun.") from error


# ----------------------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------------------

def _remove(path):
    """Removes a file or a directory tree; one that is already gone is fine."""
    try:
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


def _leftovers(directory):
    return sorted(path for pattern in _LEFTOVER_PATTERNS
                  for path in tf.io.gfile.glob(os.path.join(directory, pattern)))


def remove_leftovers(directory):
    """Removes what killed saves left in `directory`: `ckpt-N_temp*` files and directories and
    `checkpoint.tmp*` files. Call it only while no save is running in `directory`. Returns the
    removed paths."""
    removed = _leftovers(directory)
    for path in removed:
        _remove(path)
    if removed:
        logging.info("Removed leftovers of interrupted saves: %s.",
                     ", ".join(os.path.basename(path) for path in removed))
    return removed


def _remove_failed_save(directory, step):
    """Removes every file of `ckpt-{step}` and the temporaries of saves. A checkpoint of the same
    step saved earlier goes too: the failed save may have overwritten part of it."""
    paths = (tf.io.gfile.glob(_prefix(directory, step) + ".*")
             + tf.io.gfile.glob(_prefix(directory, step) + "_temp*") + _leftovers(directory))
    for path in sorted(set(paths)):
        try:
            _remove(path)
        except (tf.errors.OpError, OSError) as error:  # the save's error is the one to raise
            logging.warning("Could not remove %s of the failed save: %s", path, _reason(error))


def save(manager, step):
    """Saves checkpoint `ckpt-{step}` with `manager` and removes the leftovers of killed saves.

    Returns the saved prefix. On any write error (disk full, ...) removes the partial files of
    this save (all of `ckpt-{step}`) and raises CheckpointWriteError, whose one-line message
    names the directory, the step and the operating system's reason. The earlier checkpoints and
    the index file stay as they were: the manager writes the index file only after a complete
    save, and rotates old checkpoints only after that.
    """
    directory = manager.directory
    try:
        path = manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as error:
        _remove_failed_save(directory, step)
        raise CheckpointWriteError(
            f"Could not save the checkpoint of step {step} in {directory}: {_reason(error)}. The "
            "earlier checkpoints there are intact; free space (or fix the error) and rerun the "
            "same command to resume from the newest one.") from error
    remove_leftovers(directory)
    return path

"""Faults of training checkpoints (train/engines/tf_checkpoints.py): damaged files, a lost index
file, leftovers of killed saves, a full disk, and read-only workers.

Every test saves a few checkpoints of a tiny state shaped like the trainer's (a Keras model, its
built Adam optimizer and an EMA list) with every variable set to the step number, damages them,
and checks which values come back and what the directory holds afterwards.

A full disk is produced without privileges in two ways: in-process, the merged index file of the
save is a symbolic link to /dev/full, so the kernel answers ENOSPC exactly as on a full disk; and,
for a write error at the first byte past a size, in a subprocess whose RLIMIT_FSIZE is below the
data file's size (EFBIG, "File too large"), with SIGXFSZ ignored. A small tmpfs would need root
or a user namespace, and a read-only parent directory does not stop root, which CI runs as.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit import fileio
from train.engines import tf_checkpoints
from train_fixtures import REPO
from train.engines.tf_checkpoints import (CheckpointMismatchError, CheckpointWriteError,
                                  NoReadableCheckpointError)

DATA = "ckpt-{}.data-00000-of-00001"
INDEX = "ckpt-{}.index"
# A save_counter value whose 8 bytes occur nowhere else in a data file.
SAVE_COUNTER_MARK = 0x5A17C0DE5A17C0DE


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

class State:
    """A model, its optimizer and an EMA list in a tf.train.Checkpoint, like the trainer's."""

    def __init__(self, units=2):
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
        self.optimizer = keras.optimizers.Adam(0.1)
        self.optimizer.build(self.model.trainable_variables)
        self.ema = [tf.Variable(v, trainable=False, name="ema")
                    for v in self.model.trainable_variables]
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              ema=self.ema)

    @property
    def variables(self):
        return list(self.model.trainable_variables) + self.ema + list(self.optimizer.variables)

    def fill(self, value):
        for variable in self.variables:
            variable.assign(tf.cast(tf.fill(variable.shape, value), variable.dtype))

    def assert_holds(self, value):
        for variable in self.variables:
            np.testing.assert_array_equal(variable.numpy(), np.full(variable.shape, value),
                                          err_msg=variable.name)


def write_checkpoints(directory, steps=(1, 2, 3), max_to_keep=5):
    """Saves checkpoint N with every variable equal to N; returns the state and its manager."""
    state = State()
    manager = tf.train.CheckpointManager(state.checkpoint, str(directory), max_to_keep=max_to_keep)
    for step in steps:
        state.fill(step)
        tf_checkpoints.save(manager, step)
    return state, manager


def names(directory):
    return sorted(os.listdir(directory))


def snapshot(directory):
    """Every path under `directory` with its size and modification time."""
    found = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            found[os.path.relpath(path, directory)] = (info.st_size, info.st_mtime_ns)
    return found


def index_lists(directory):
    """(latest, all) checkpoint names of the `checkpoint` index file."""
    state = tf.train.get_checkpoint_state(str(directory))
    return (os.path.basename(state.model_checkpoint_path),
            [os.path.basename(path) for path in state.all_model_checkpoint_paths])


def warnings_text(caplog):
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def flip_bytes(path, offset, count):
    data = bytearray(path.read_bytes())
    for index in range(offset, offset + count):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


# Each kind of damage to the newest checkpoint (ckpt-3) and the file the warning must name.
DAMAGE = {
    "data truncated": (lambda d: truncate(d / DATA.format(3)), DATA.format(3)),
    "data emptied": (lambda d: truncate(d / DATA.format(3), keep=0), DATA.format(3)),
    "data bytes flipped": (lambda d: flip_bytes(d / DATA.format(3), 20, 4), DATA.format(3)),
    "data missing": (lambda d: (d / DATA.format(3)).unlink(), DATA.format(3)),
    "index truncated": (lambda d: truncate(d / INDEX.format(3)), INDEX.format(3)),
    "index garbage": (lambda d: (d / INDEX.format(3)).write_bytes(
        np.random.default_rng(0).bytes((d / INDEX.format(3)).stat().st_size)), INDEX.format(3)),
}


# ----------------------------------------------------------------------------------------------
# Listing and the plain cases
# ----------------------------------------------------------------------------------------------

def test_checkpoint_steps_are_newest_first_without_leftovers_or_corrupt(tmp_path):
    write_checkpoints(tmp_path, steps=(1, 2, 10))
    (tmp_path / "ckpt-11_temp").mkdir()
    (tmp_path / "ckpt-11_temp" / "part-00000-of-00001.index").write_bytes(b"x")
    (tmp_path / "ckpt-12_temp.index").write_bytes(b"x")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / INDEX.format(13)).write_bytes(b"x")
    assert tf_checkpoints.checkpoint_steps(str(tmp_path)) == [10, 2, 1]
    assert tf_checkpoints.checkpoint_steps(str(tmp_path / "missing")) == []


def test_no_checkpoint_restores_nothing_and_creates_nothing(tmp_path):
    directory = tmp_path / "checkpoints"
    assert tf_checkpoints.restore_newest(State().checkpoint, str(directory)) is None
    assert not directory.exists()


def test_index_file_of_checkpoints_that_are_gone_is_removed_by_the_writer_only(tmp_path):
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n')
    before = snapshot(tmp_path)
    assert tf_checkpoints.restore_newest(State().checkpoint, str(tmp_path), writable=False) is None
    assert snapshot(tmp_path) == before
    assert tf_checkpoints.restore_newest(State().checkpoint, str(tmp_path)) is None
    assert names(tmp_path) == []


def test_intact_checkpoints_restore_the_newest_and_keep_the_index_file(tmp_path):
    write_checkpoints(tmp_path)
    before = snapshot(tmp_path)
    state = State()
    assert tf_checkpoints.restore_newest(state.checkpoint, str(tmp_path)) == 3
    state.assert_holds(3)
    assert snapshot(tmp_path) == before  # nothing to repair: the index file is not rewritten


# ----------------------------------------------------------------------------------------------
# Unreadable newest checkpoint
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_unreadable_newest_checkpoint_is_moved_aside_and_the_older_one_restored(
        tmp_path, caplog, capfd, damage):
    write_checkpoints(tmp_path)
    spoil, bad_file = DAMAGE[damage]
    spoil(tmp_path)
    left_of_ckpt_3 = [name for name in names(tmp_path) if name.startswith("ckpt-3.")]

    state = State()
    state.fill(99.0)
    with caplog.at_level(logging.WARNING):
        assert tf_checkpoints.restore_newest(state.checkpoint, str(tmp_path)) == 2
    state.assert_holds(2)

    # One warning line names the checkpoint, the bad file and the reason.
    (warning,) = [text for text in warnings_text(caplog) if " is unreadable (" in text]
    assert str(tmp_path / "ckpt-3") in warning and bad_file in warning and "\n" not in warning
    assert "Traceback" not in capfd.readouterr().err
    # The files are kept, under their names, in corrupt/; the index file lists the survivors.
    assert names(tmp_path / "corrupt") == left_of_ckpt_3
    assert not [name for name in names(tmp_path) if name.startswith("ckpt-3")]
    assert index_lists(tmp_path) == ("ckpt-2", ["ckpt-1", "ckpt-2"])


def test_restore_that_fails_halfway_is_overwritten_by_the_older_checkpoint(tmp_path):
    """save_counter is restored after the other variables: damage to it fails the restore when
    every other variable already holds the newer checkpoint's values."""
    state, manager = write_checkpoints(tmp_path, steps=(1, 2))
    state.fill(3)
    state.checkpoint.save_counter.assign(SAVE_COUNTER_MARK - 1)  # the save adds one
    tf_checkpoints.save(manager, 3)
    data_file = tmp_path / DATA.format(3)
    mark = np.int64(SAVE_COUNTER_MARK).tobytes()
    assert data_file.read_bytes().count(mark) == 1
    flip_bytes(data_file, data_file.read_bytes().index(mark), len(mark))

    restored = State()
    restored.fill(99.0)
    with pytest.raises(tf.errors.DataLossError):
        restored.checkpoint.restore(str(tmp_path / "ckpt-3")).assert_existing_objects_matched()
    restored.assert_holds(3)  # the failed attempt did assign the variables

    assert tf_checkpoints.restore_newest(restored.checkpoint, str(tmp_path)) == 2
    restored.assert_holds(2)
    assert names(tmp_path / "corrupt") == [DATA.format(3), INDEX.format(3)]


def test_no_readable_checkpoint_raises_and_moves_nothing(tmp_path):
    write_checkpoints(tmp_path, steps=(1, 2))
    truncate(tmp_path / DATA.format(2))
    (tmp_path / INDEX.format(1)).write_bytes(b"garbage")
    before = snapshot(tmp_path)
    with pytest.raises(NoReadableCheckpointError) as error:
        tf_checkpoints.restore_newest(State().checkpoint, str(tmp_path))
    message = str(error.value)
    assert str(tmp_path) in message and "ckpt-2" in message and "ckpt-1" in message
    assert DATA.format(2) in message and INDEX.format(1) in message
    assert snapshot(tmp_path) == before


def test_checkpoint_of_another_model_raises_without_moving_anything(tmp_path):
    write_checkpoints(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointMismatchError, match="ckpt-3 does not match"):
        tf_checkpoints.restore_newest(State(units=4).checkpoint, str(tmp_path))
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------------
# The `checkpoint` index file
# ----------------------------------------------------------------------------------------------

INDEX_FAULTS = {
    "missing": lambda path: path.unlink(),
    "empty": lambda path: path.write_text(""),
    "garbage": lambda path: path.write_text("not {{ a checkpoint state"),
    "stale": lambda path: path.write_text(
        'model_checkpoint_path: "ckpt-1"\nall_model_checkpoint_paths: "ckpt-1"\n'),
}


@pytest.mark.parametrize("fault", sorted(INDEX_FAULTS))
def test_lost_index_file_is_rebuilt_so_rotation_goes_on(tmp_path, fault):
    write_checkpoints(tmp_path, max_to_keep=3)
    INDEX_FAULTS[fault](tmp_path / "checkpoint")

    state = State()
    assert tf_checkpoints.restore_newest(state.checkpoint, str(tmp_path)) == 3
    state.assert_holds(3)
    assert index_lists(tmp_path) == ("ckpt-3", ["ckpt-1", "ckpt-2", "ckpt-3"])

    # A manager created now knows every checkpoint: saving two more deletes the two oldest.
    manager = tf.train.CheckpointManager(state.checkpoint, str(tmp_path), max_to_keep=3)
    assert manager.latest_checkpoint == str(tmp_path / "ckpt-3")
    assert [os.path.basename(path) for path in manager.checkpoints] == [
        "ckpt-1", "ckpt-2", "ckpt-3"]
    for step in (4, 5):
        tf_checkpoints.save(manager, step)
    assert tf_checkpoints.checkpoint_steps(str(tmp_path)) == [5, 4, 3]
    assert index_lists(tmp_path) == ("ckpt-5", ["ckpt-3", "ckpt-4", "ckpt-5"])


def test_index_file_that_cannot_be_rewritten_is_a_one_line_error(tmp_path, monkeypatch):
    write_checkpoints(tmp_path)
    (tmp_path / "checkpoint").unlink()
    before = snapshot(tmp_path)

    def disk_full(path, content):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio, "write_atomically", disk_full)
    with pytest.raises(CheckpointWriteError, match="No space left on device") as error:
        tf_checkpoints.restore_newest(State().checkpoint, str(tmp_path))
    assert str(tmp_path / "checkpoint") in str(error.value) and "\n" not in str(error.value)
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------------------

def test_save_removes_leftovers_of_killed_saves(tmp_path):
    state, manager = write_checkpoints(tmp_path, steps=(1,))
    # What killed saves leave (names as TensorFlow 2.21 writes them): shards not yet merged,
    # and an index file not yet renamed into place.
    (tmp_path / "ckpt-2_temp").mkdir()
    (tmp_path / "ckpt-2_temp" / "part-00000-of-00001.index").write_bytes(b"x")
    (tmp_path / "ckpt-2_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(
        b"x")
    (tmp_path / "ckpt-7_temp").write_bytes(b"x")
    (tmp_path / "checkpoint.tmp0123456789abcdef").write_text("half")
    (tmp_path / "checkpoint.partial-999-0123abcd").write_text("half")  # a killed repair_index
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "ckpt-0_temp").write_bytes(b"x")  # corrupt/ is not touched
    assert tf_checkpoints.checkpoint_steps(str(tmp_path)) == [1]

    state.fill(2)
    assert tf_checkpoints.save(manager, 2) == str(tmp_path / "ckpt-2")
    assert names(tmp_path) == sorted(["checkpoint", "corrupt", DATA.format(1), INDEX.format(1),
                                      DATA.format(2), INDEX.format(2)])
    assert names(tmp_path / "corrupt") == ["ckpt-0_temp"]
    restored = State()
    assert tf_checkpoints.restore_newest(restored.checkpoint, str(tmp_path)) == 2
    restored.assert_holds(2)


def assert_failed_save_left_no_trace(directory, error, before, reason):
    """The CheckpointWriteError of a failed save of step 4, and what it left."""
    message = str(error.value)
    assert "\n" not in message
    assert str(directory) in message and "step 4" in message and reason in message
    assert "earlier checkpoints there are intact" in message
    assert isinstance(error.value.__cause__, tf.errors.OpError)
    assert names(directory) == before  # the partial files of ckpt-4 are gone
    assert index_lists(directory) == ("ckpt-3", ["ckpt-1", "ckpt-2", "ckpt-3"])
    restored = State()
    assert tf_checkpoints.restore_newest(restored.checkpoint, str(directory)) == 3
    restored.assert_holds(3)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_disk_full_during_save_raises_one_line_and_keeps_earlier_checkpoints(tmp_path):
    state, manager = write_checkpoints(tmp_path)
    before = names(tmp_path)
    # TensorFlow writes the merged index at its final name (the shards go through ckpt-4_temp/
    # and are renamed): through this link every write gets ENOSPC, as on a full disk.
    os.symlink("/dev/full", tmp_path / INDEX.format(4))
    state.fill(4)
    with pytest.raises(CheckpointWriteError) as error:
        tf_checkpoints.save(manager, 4)
    assert os.path.exists("/dev/full")  # the link was removed, not its target
    assert_failed_save_left_no_trace(tmp_path, error, before, "No space left on device")


FILE_SIZE_LIMITED_SAVE = textwrap.dedent("""
    import json, resource, signal, sys
    import tensorflow as tf
    from train.engines import tf_checkpoints
    from test_checkpoint_faults import State

    state = State()
    state.fill(4)
    manager = tf.train.CheckpointManager(state.checkpoint, sys.argv[1], max_to_keep=5)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    try:
        tf_checkpoints.save(manager, 4)
    except tf_checkpoints.CheckpointWriteError as error:
        print(json.dumps({"message": str(error), "cause": type(error.__cause__).__name__}))
""")


def test_write_error_during_save_raises_one_line_and_keeps_earlier_checkpoints(tmp_path):
    write_checkpoints(tmp_path)
    before = names(tmp_path)
    here = os.path.dirname(os.path.abspath(__file__))  # the child imports this module
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO, os.path.join(REPO, "tests"), here, os.environ.get("PYTHONPATH", "")]))
    limit = (tmp_path / DATA.format(3)).stat().st_size // 2  # the data file cannot be written
    result = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMITED_SAVE, str(tmp_path),
                             str(limit)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    message = report["message"]
    assert "\n" not in message and str(tmp_path) in message and "step 4" in message
    assert "File too large" in message and "earlier checkpoints there are intact" in message
    assert report["cause"] == "OutOfRangeError"
    assert names(tmp_path) == before
    restored = State()
    assert tf_checkpoints.restore_newest(restored.checkpoint, str(tmp_path)) == 3
    restored.assert_holds(3)


# ----------------------------------------------------------------------------------------------
# Read-only workers
# ----------------------------------------------------------------------------------------------

def test_read_only_worker_restores_the_newest_readable_and_changes_nothing(tmp_path, caplog):
    write_checkpoints(tmp_path)
    truncate(tmp_path / DATA.format(3))
    (tmp_path / "checkpoint").unlink()
    (tmp_path / "ckpt-4_temp").mkdir()  # a leftover stays too
    before = snapshot(tmp_path)

    state = State()
    with caplog.at_level(logging.WARNING):
        assert tf_checkpoints.restore_newest(state.checkpoint, str(tmp_path), writable=False) == 2
    state.assert_holds(2)
    assert any(DATA.format(3) in text for text in warnings_text(caplog))
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "corrupt").exists() and not (tmp_path / "checkpoint").exists()

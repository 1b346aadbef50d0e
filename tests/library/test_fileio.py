"""keras_vit.fileio: the one atomic writer, on local paths without TensorFlow."""

import os

import pytest

from keras_vit import fileio


def test_write_atomically_replaces_the_file(tmp_path):
    path = str(tmp_path / "a.txt")
    fileio.write_atomically(path, "first")
    fileio.write_atomically(path, b"second")
    with open(path, "rb") as handle:
        assert handle.read() == b"second"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_failed_write_keeps_the_previous_file_and_leaves_no_partial(tmp_path, monkeypatch):
    path = str(tmp_path / "a.txt")
    fileio.write_atomically(path, "good")
    real_open = fileio.open_file

    class Broken:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *args):
            self.handle.close()

        def write(self, content):
            self.handle.write(content[:2])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio, "open_file", lambda p, mode="rb": Broken(real_open(p, mode)))
    with pytest.raises(OSError, match="No space") as error:
        fileio.write_atomically(path, "a much longer text")
    # Named: the write's own error names no file ("[Errno 28] No space left on device").
    assert error.value.errno == 28 and error.value.filename == path
    with open(path) as handle:
        assert handle.read() == "good"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_atomic_directory_appears_only_when_complete(tmp_path):
    final = str(tmp_path / "1")
    with fileio.atomic_directory(final) as temporary:
        assert not os.path.exists(final)
        with open(os.path.join(temporary, "f"), "w") as handle:
            handle.write("x")
    assert os.listdir(final) == ["f"]
    with pytest.raises(RuntimeError):
        with fileio.atomic_directory(str(tmp_path / "2")) as temporary:
            raise RuntimeError("killed mid-export")
    assert sorted(os.listdir(tmp_path)) == ["1"]
    with pytest.raises(FileExistsError):
        with fileio.atomic_directory(final):
            pass


def test_atomic_directory_of_a_bare_relative_name_stays_in_the_working_directory(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with fileio.atomic_directory("1") as temporary:
        assert os.path.dirname(temporary) == ""  # beside "1", not under the file system root
        assert os.path.isdir(os.path.join(tmp_path, temporary))
    assert os.listdir(tmp_path) == ["1"]


def test_remove_partial_files_removes_only_partials(tmp_path):
    (tmp_path / "model.npz").write_bytes(b"x")
    (tmp_path / f"model.npz{fileio.PARTIAL_MARKER}12-ab").write_bytes(b"x")
    (tmp_path / f".1{fileio.PARTIAL_MARKER}12-cd").mkdir()
    removed = fileio.remove_partial_files(str(tmp_path))
    assert len(removed) == 2
    assert os.listdir(tmp_path) == ["model.npz"]


def test_remote_paths_are_told_apart():
    assert fileio.is_remote("gs://bucket/model.npz")
    assert not fileio.is_remote("/tmp/model.npz")
    assert not fileio.is_remote("relative/model.npz")


def test_local_paths_have_no_remote_errors_to_catch():
    assert fileio.remote_errors("/tmp/model.npz") == ()  # `except ()` catches nothing

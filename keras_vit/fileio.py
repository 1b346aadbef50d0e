"""File access for local paths and remote ones (gs://...), and the one atomic writer.

Local paths use Python's own file functions, so reading and writing checkpoints and plots works
on every Keras backend without TensorFlow. Remote paths (any `scheme://`) go through
`tf.io.gfile`, which needs TensorFlow.

Every file keras_vit writes goes through `write_atomically` or `atomic_directory`: the content is
written under a temporary name beside the target (`<name>.partial-<pid>-<random>`) and renamed
over it, so a crash mid-write leaves the previous copy whole and never a truncated file under the
real name. `remove_partial_files` clears what a killed writer left behind.
"""

import contextlib
import os
import shutil
import uuid

PARTIAL_MARKER = ".partial-"


def is_remote(path):
    """True for `scheme://...` paths (gs://, s3://, hdfs://), which need `tf.io.gfile`."""
    return "://" in str(path)


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def remote_errors(path):
    """The exceptions a remote file system raises for an unreachable path (TensorFlow's
    `OpError`), to catch and explain; an empty tuple, which catches nothing, for local paths."""
    if not is_remote(path):
        return ()
    import tensorflow as tf

    return (tf.errors.OpError,)


def open_file(path, mode="rb"):
    """`open(path, mode)`, through `tf.io.gfile.GFile` for remote paths."""
    if is_remote(path):
        return _gfile().GFile(path, mode)
    return open(path, mode)


def exists(path):
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path):
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def makedirs(path):
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def listdir(path):
    return _gfile().listdir(path) if is_remote(path) else os.listdir(path)


def remove(path):
    """Removes a file or a directory tree; a missing path is not an error."""
    if is_remote(path):
        gfile = _gfile()
        if gfile.isdir(path):
            gfile.rmtree(path)
        elif gfile.exists(path):
            gfile.remove(path)
    elif os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _temporary_name(path):
    return f"{path}{PARTIAL_MARKER}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def write_atomically(path, content):
    """Writes `content` (bytes or str) to `path` through a temporary file and a rename.

    On any error the temporary file is removed and the error raised; `path` keeps its previous
    content (or stays absent). An OSError that names no file (a write into a full disk: "[Errno
    28] No space left on device") is raised again naming `path`."""
    temporary = _temporary_name(path)
    mode = "w" if isinstance(content, str) else "wb"
    try:
        with open_file(temporary, mode) as handle:
            handle.write(content)
        if is_remote(path):
            _gfile().rename(temporary, path, overwrite=True)
        else:
            os.replace(temporary, path)
    except OSError as error:
        remove(temporary)
        if error.filename is None and error.errno is not None:
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise
    except BaseException:
        remove(temporary)
        raise
    return path


@contextlib.contextmanager
def atomic_directory(path):
    """Yields a new, empty temporary directory beside `path` to fill; renamed to `path` when
    the block ends without an error, removed otherwise. `path` must not exist yet (a
    directory cannot be replaced in one rename)."""
    if exists(path):
        raise FileExistsError(f"{path!r} exists already.")
    # A dot-name beside `path`: TF Serving and directory scans skip it until it is complete.
    if is_remote(path):
        parent, name = path.rstrip("/").rsplit("/", 1)
        temporary = _temporary_name(f"{parent}/.{name}")
    else:
        parent, name = os.path.split(os.path.normpath(path))
        temporary = _temporary_name(os.path.join(parent, f".{name}"))  # parent "" is the cwd
    try:
        makedirs(temporary)
        yield temporary
        if is_remote(path):
            _gfile().rename(temporary, path)
        else:
            os.rename(temporary, path)
    except BaseException:
        remove(temporary)
        raise


def remove_partial_files(directory):
    """Removes the temporary files and directories that killed writers left in `directory`;
    returns their names."""
    if not isdir(directory):
        return []
    removed = [name for name in listdir(directory) if PARTIAL_MARKER in name.rstrip("/")]
    for name in removed:
        remove(f"{directory.rstrip('/')}/{name.rstrip('/')}")
    return removed

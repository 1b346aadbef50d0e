"""How the command-line tools (train.main, train.export, train.analyze) end on a user's error.

An error the user can fix prints one short paragraph, "Error: <what is wrong and how to fix it>",
and exits with status 1, without a Python traceback (`--verbose` shows it). That covers bad flag
values and misspelt `--config.field` overrides (found while parsing the flags), and what the
tool raises as `UsageError`, `ValueError`, `TypeError` or `OSError` (missing, unreadable or
unwritable files). Other exceptions are bugs or failures of the environment and keep their
traceback.

It also owns how much the tools log. By default the terminal shows our own progress lines
(INFO from train/ and keras_vit/) and everyone's warnings and errors; the INFO lines of
TensorFlow's C++ runtime and of Python libraries (TFDS, TensorFlow) are hidden, and so are the
routine lines of its start-up and TFLite converter (train.console.native_output), and, when stderr
is not a terminal (a log file, CI), tqdm's progress bars. `--verbose` shows them all. An explicit
TF_CPP_MIN_LOG_LEVEL or TQDM_DISABLE in the environment always wins.
"""

import errno
import importlib.abc
import importlib.util
import logging
import os
import sys
import traceback

from absl import app, flags
from absl import logging as absl_logging

from . import native_output

flags.DEFINE_bool("verbose", False, "Show the Python traceback of an error, and the INFO log "
                  "lines of TensorFlow and TFDS (hidden by default).")

USER_ERRORS = (app.UsageError, ValueError, TypeError, OSError)


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Runs `import tensorflow`, wherever it happens (config files import keras_vit), inside
    `native_output.dropped()`."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once, and not for the look-up below
        spec = importlib.util.find_spec(name)
        if spec is None:  # not installed: the usual ModuleNotFoundError
            return None
        exec_module = spec.loader.exec_module

        def quiet_exec_module(module):
            with native_output.dropped():
                exec_module(module)
                if native_output.NO_NVIDIA_DRIVER:  # its cuInit error: now, not later
                    module.config.list_physical_devices()

        spec.loader.exec_module = quiet_exec_module
        return spec


# TensorFlow's C++ runtime reads TF_CPP_MIN_LOG_LEVEL when it starts, which can be while the
# flags are parsed (config files import keras_vit), so both are set up when the entry module
# imports this one. "1": warnings and errors only.
if not native_output.verbose_in(sys.argv):
    if (os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1") != "0"
            and "tensorflow" not in sys.modules):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
    if not sys.stderr.isatty():  # tqdm's bars (TFDS preparing a dataset) redraw with \r and
        os.environ.setdefault("TQDM_DISABLE", "1")  # \x1b[A: garbage in a log file


def tensorflow_installed():
    """Whether TensorFlow can be imported, found without importing it."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):  # an import hook that refuses it, or None in sys.modules
        return False


def _package_folder(name):
    spec = importlib.util.find_spec(name)  # finds the package without importing it
    return os.path.dirname(os.path.abspath(spec.origin)) + os.sep


# Whose INFO lines the terminal shows by default: ours (the trainer's progress, "Saved ..."):
# this package (`train`, or `keras_vit.train` when installed) and keras_vit.
OUR_FOLDERS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
               _package_folder("keras_vit"))


class _OursOrImportant(logging.Filter):
    """Passes warnings and errors, and INFO lines logged from our own packages."""

    def filter(self, record):
        return (record.levelno >= logging.WARNING
                or os.path.abspath(record.pathname).startswith(OUR_FOLDERS))


def quiet_logs(verbose):
    """Hides other libraries' INFO lines unless `verbose` (absl routes all Python logging, TFDS
    included, through its one handler on the root logger)."""
    handler = absl_logging.get_absl_handler()
    for old in [f for f in handler.filters if isinstance(f, _OursOrImportant)]:
        handler.removeFilter(old)
    if not verbose:
        handler.addFilter(_OursOrImportant())


def fail(message, exit_code=1, now=False):
    """Prints `Error: message` (one paragraph) to stderr and exits with `exit_code`; `now`
    skips the interpreter's exit handlers, for when a thread is stuck inside a C++ library
    (JAX's would wait for processes that are gone, then abort with a stack dump)."""
    text = " ".join(str(message).split())  # one paragraph, whatever the message's layout
    print(f"Error: {text}", file=sys.stderr)
    if now:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    sys.exit(exit_code)


def _message(error):
    if isinstance(error, OSError) and error.errno == errno.ENOSPC and error.filename:
        return (f"No space left on the disk of {error.filename}: free some space there (or give "
                "another folder) and run the same command again; a training run resumes from "
                "its newest checkpoint.")
    text = str(error).strip()
    if isinstance(error, (AttributeError, KeyError)):
        # ml_collections quotes its message, escapes included: 'field'\nDid you mean ...
        text = text.strip("'\"").replace("\\n", " ").replace("\\'", "'")
    return text or type(error).__name__


def _parse_flags(argv):
    quiet_logs(native_output.verbose_in(argv))  # config files may log while they load
    try:
        remaining = flags.FLAGS(argv)
        quiet_logs(flags.FLAGS.verbose)  # the parsed value (e.g. from a --flagfile)
        return remaining
    except flags.Error as error:
        fail(f"{str(error).rstrip('.')}. Run with --helpshort to see the flags.")
    except (AttributeError, KeyError, *USER_ERRORS) as error:  # --config.<misspelt>=...
        if native_output.verbose_in(argv):
            traceback.print_exc()
        fail(f"--config: {_message(error)}")


def run(main, argv=None):
    """`absl.app.run(main, argv)` that reports user errors as one paragraph (see the module
    doc); `argv` defaults to sys.argv."""

    def reporting_main(argv):
        try:
            return main(argv)
        except USER_ERRORS as error:
            if flags.FLAGS.verbose:
                traceback.print_exc()
            fail(_message(error))

    if main.__module__ != "__main__":  # a console script: `--help` lists the key flags of
        for flag in flags.FLAGS.get_key_flags_for_module(main.__module__):  # the script's name
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(reporting_main, argv=argv, flags_parser=_parse_flags)

"""Several runs of one command-line tool in one Python process, each as `python -m MODULE ARGS`
would end: its exit status and what it wrote to stdout and stderr (file descriptors 1 and 2, so
C++ lines too). The tests of a tool's error cases use it to import TensorFlow once (3 seconds a
process) instead of once per case; a test of what a fresh process imports still starts its own.

    results = cli_cases.run("train.export", [["--workdir=/missing"], ...], env=env, cwd=REPO)

Between runs every flag goes back to its default (`FlagValues.unparse_flags`) and the flags a
run defined (ml_collections' `--config.field` overrides) are removed, as in a new process; the
tool's `main` runs under `train.console.cli.run`, as its `run()` does.
"""

import json
import os
import subprocess
import sys
import tempfile
import types

REPLY_PREFIX = "cli_cases reply: "


def run(module, cases, env, cwd, timeout=300):
    """The results (`returncode`, `stdout`, `stderr`) of `module` run with each argument list
    of `cases`, in order, in one new process with environment `env` (its PYTHONPATH naming the checkout) and
    directory `cwd`."""
    child = subprocess.run([sys.executable, os.path.abspath(__file__), module],
                           input=json.dumps([list(map(str, args)) for args in cases]),
                           env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    replies = [line[len(REPLY_PREFIX):] for line in child.stdout.splitlines()
               if line.startswith(REPLY_PREFIX)]
    assert child.returncode == 0 and len(replies) == 1, (
        f"cli_cases {module} ended with status {child.returncode}:\n"
        f"{(child.stdout + child.stderr)[-4000:]}")
    return [types.SimpleNamespace(**result) for result in json.loads(replies[0])]


def _run_one(module, args):
    # Here, not at the top: the tests import this module, and train.console.cli changes how
    # the process that imports it logs.
    from absl import flags

    from train.console import cli

    flags.FLAGS.unparse_flags()
    defined = set(flags.FLAGS)
    argv = [module.__name__, *args]
    sys.argv = argv  # as in a new process: ml_collections finds `--config.x` overrides there
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        _flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            cli.run(module.main, argv=argv)
            returncode = 0
        except SystemExit as exit_:
            code = exit_.code
            returncode = code if isinstance(code, int) else (0 if code is None else 1)
        finally:
            _flush()
            for descriptor, copy in zip((1, 2), saved):
                os.dup2(copy, descriptor)
                os.close(copy)
            for name in set(flags.FLAGS) - defined:  # ml_collections' `--config.x` overrides
                delattr(flags.FLAGS, name)
        out.seek(0)
        err.seek(0)
        return {"returncode": returncode, "stdout": out.read(), "stderr": err.read()}


def _flush():
    sys.stdout.flush()
    sys.stderr.flush()


def _main(name):
    import importlib

    module = importlib.import_module(name)
    if hasattr(module, "define_flags"):  # flags defined by its run(), not at import
        module.define_flags()
    results = [_run_one(module, args) for args in json.loads(sys.stdin.read())]
    print(REPLY_PREFIX + json.dumps(results), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1])

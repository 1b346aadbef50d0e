"""Every code block of README.md and docs/*.md runs here, so the docs cannot drift from the code.

A block is a fence at the start of a line tagged ```python or ```bash (no other kind is allowed).
HTML comments right above the fence (GitHub does not show them) say how it is tested, one
directive per comment, `<!-- test: NAME: ARGUMENT -->`, which may span lines:

    skip: REASON       Not run (gcloud, docker, pip, a live server). The reason is required and
                       shows in pytest's skip report (`-rs`). Nothing else goes with it.
    replace: A => B    Every A in the block becomes B before it runs; A must occur. This is how
                       a command gets the tiny flags: `--workdir=/tmp/x => --workdir=/tmp/x $TINY`.
                       The shell variables below are expanded in B first (so also inside quotes).
    setup: CODE        Code in the block's language run first, unseen by readers: it makes the
                       files and names the example assumes (`uint8_images`, a checkpoint, ...).
    check: CODE        Code run after the block, asserting on what it made (a shell check fails
                       by its exit status).
    tiny               (Python) While the block, its setup and check run, every transformer size
                       of the variant table is width 16, MLP 32, 2 heads, 1 layer (ViT_L16()
                       builds in a blink); patches and ResNet stems keep their size.
    trained: PATH      (shell) PATH holds a finished tiny quickstart run (trained once per test
                       session, with its export) when the block starts: for commands that read
                       a trained workdir.
    flags-only         (shell) Each command runs with `--help` appended: absl and argparse parse,
                       and check, every flag before it (the config file, its argument and the
                       `--config.field` overrides included), then exit without running. For
                       studies and benchmarks that take minutes or need a TPU's dataset (leading
                       `NAME=value` words set the environment).
    processes          (shell) The block starts several training processes (workers, JAX
                       processes, a study's runs): its test is marked `processes`, and runs
                       with `pytest -m processes`, not in the default run (tests/conftest.py).

How a block runs:
- Python: the blocks of a page run in order in one namespace (a later block uses an earlier one's
  `model`), as one test per page, in a fresh temporary working directory with $KERAS_HOME inside
  it. The namespace starts with `np`, `os`, `keras_vit` and `docs`, tests/docs_fixtures.py
  (random images, fake published checkpoints, a fake TF Serving REST endpoint). Tracebacks name
  the page and line.
- Shell: one test per block, `bash -euo pipefail` in a fresh temporary directory that links the
  checkout's configs/, benchmarks/ and tests/, so relative outputs (runs/, plots/) stay out of
  the checkout (a test also fails if the checkout changed). `python` is this interpreter, and
  PATH has the console scripts (`keras-vit-train`, ...) running this checkout's code. The
  environment has $TINY (flags that make any config a few-second run on the fake Fashion-MNIST
  of train_fixtures: its TINY overrides and data_dir; later flags win, so flags after $TINY
  are tested as written), $REPO, $PORT_0 and $PORT_1 (free localhost ports), and
  $FASHION_MNIST_DIR and $TFDS_DATA_DIR pointing at the fake data.
- In both, absolute paths under /tmp/, /models/ and /data/ move under the temporary directory.

The other tests hold the pages together: the README keeps the two commands CI and newcomers paste,
its map of the code names every folder of code, every relative link and #anchor resolves, and
docs/index.md links every page.
"""

import glob
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from train_fixtures import REPO

PAGES = ["README.md"] + sorted(os.path.relpath(path, REPO)
                              for path in glob.glob(os.path.join(REPO, "docs", "*.md")))
LANGUAGES = ("python", "bash")
MAIN_JOB = "python -m train.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart"
TEST_COMMAND = "python -m pytest -q -n auto tests"  # .ci/run runs exactly this
PROCESSES_COMMAND = "python -m pytest -q -n auto tests -m processes"  # and this
README_MAX_LINES = 250  # a five-minute read
CODE_FOLDERS = ("keras_vit", "train", "configs", "benchmarks", "tests")
MIRRORED_TESTS = (os.path.join("tests", "library"), os.path.join("tests", "training"))
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~$-])/(tmp|models|data)/")
_DIRECTIVE = re.compile(r"<!--\s*test:\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->", re.DOTALL)


@dataclass
class Block:
    page: str
    line: int  # of the first line of code, 1-based
    language: str
    code: str
    skip: str = None
    replace: list = field(default_factory=list)
    setup: str = ""
    check: str = ""
    tiny: bool = False
    trained: str = None
    flags_only: bool = False
    processes: bool = False

    @property
    def name(self):
        return f"{self.page}:{self.line}"

    def text(self, tmp, variables=None):
        """The code to run: paths moved under `tmp`, then the replacements made, with the
        `$NAME`s of `variables` in them expanded."""
        code = _moved(self.code, tmp)
        for old, new in self.replace:
            new = string.Template(_moved(new, tmp)).safe_substitute(variables or {})
            code = code.replace(_moved(old, tmp), new)
        return code


def _apply(block, name, argument, problems):
    where = f"{block.page}:{block.line}"
    if name == "skip":
        if not argument:
            problems.append(f"{where}: skip needs a reason")
        block.skip = argument
    elif name == "replace":
        old, arrow, new = (argument or "").partition(" => ")
        if not arrow or not old:
            problems.append(f"{where}: replace needs 'OLD => NEW'")
        elif old not in block.code:
            problems.append(f"{where}: replace: {old!r} is not in the block")
        else:
            block.replace.append((old, new))
    elif name in ("setup", "check"):
        if not argument:
            problems.append(f"{where}: {name} needs code")
        setattr(block, name, getattr(block, name) + (argument or "") + "\n")
    elif name == "tiny" and block.language == "python" and not argument:
        block.tiny = True
    elif name == "trained" and block.language == "bash" and argument:
        block.trained = argument
    elif name == "flags-only" and block.language == "bash" and not argument:
        block.flags_only = True
    elif name == "processes" and block.language == "bash" and not argument:
        block.processes = True
    else:
        problems.append(f"{where}: unknown directive {name!r} (with {argument!r}) for a "
                        f"{block.language} block")


def parse(page):
    """The code blocks of `page` (a path relative to the checkout), and the problems found:
    untagged or unknown fences, unknown or malformed directives, directives with no block."""
    with open(os.path.join(REPO, page), encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    blocks, problems, pending, index = [], [], [], 0
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith("<!-- test"):
            start = index
            while "-->" not in lines[index] and index + 1 < len(lines):
                index += 1
            text = "\n".join(lines[start:index + 1])
            match = _DIRECTIVE.fullmatch(text.strip())
            if match is None:
                problems.append(f"{page}:{start + 1}: malformed directive {text!r}")
            else:
                pending.append((match.group(1), match.group(2), start + 1))
            index += 1
            continue
        if line.lstrip().startswith("```"):
            if line.startswith(" "):
                problems.append(f"{page}:{index + 1}: indented code block (not tested)")
            language = line.strip()[3:].strip()
            end = index + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            block = Block(page, index + 2, language, "\n".join(lines[index + 1:end]) + "\n")
            if language not in LANGUAGES:
                problems.append(f"{page}:{index + 1}: code block tagged {language!r}; tag "
                                f"it one of {LANGUAGES}")
            for name, argument, _ in pending:
                _apply(block, name, argument, problems)
            if block.skip is not None and len(pending) > 1:
                problems.append(f"{block.name}: a skipped block takes no other directive")
            blocks.append(block)
            pending, index = [], end + 1
            continue
        if pending and line.strip():
            problems.append(f"{page}:{pending[0][2]}: directive not directly above a code block")
            pending = []
        index += 1
    if pending:
        problems.append(f"{page}:{pending[0][2]}: directive not directly above a code block")
    return blocks, problems


PARSED = {page: parse(page) for page in PAGES}
BLOCKS = [block for page in PAGES for block in PARSED[page][0]]


def _moved(text, tmp):
    """Absolute /tmp/, /models/ and /data/ paths moved under `tmp`."""
    return _ABSOLUTE_PATH.sub(lambda match: f"{tmp}/{match.group(1)}/", text)


# ---------------------------------------------------------------------------------------------
# The rules every page follows (no TensorFlow needed).

def test_every_block_is_run_or_skipped_with_a_reason():
    problems = [problem for page in PAGES for problem in PARSED[page][1]]
    assert not problems, "\n".join(problems)
    assert len(PAGES) > 5 and len(BLOCKS) > 20  # found the pages and their blocks
    skipped = [block for block in BLOCKS if block.skip is not None]
    assert len(skipped) < len(BLOCKS) / 3, [block.name for block in skipped]


def test_the_readme_gives_the_main_job_and_the_test_command_exactly():
    codes = [block.code.strip() for block in PARSED["README.md"][0]]
    assert MAIN_JOB in codes
    assert TEST_COMMAND in codes and PROCESSES_COMMAND in codes
    with open(os.path.join(REPO, ".ci", "run")) as handle:
        ci = handle.read()
    assert f"\n{TEST_COMMAND}\n" in ci and f"\n{PROCESSES_COMMAND}\n" in ci


def test_the_readme_is_a_short_read():
    with open(os.path.join(REPO, "README.md")) as handle:
        assert len(handle.read().splitlines()) <= README_MAX_LINES


def test_the_readme_maps_every_folder_of_code():
    with open(os.path.join(REPO, "README.md")) as handle:
        text = handle.read()
    mapped = text[text.index("## Map of the code"):text.index("## Documentation")]
    linked = {path.rstrip("/") for path in re.findall(r"\]\(([\w./]+/)\)", mapped)}
    folders = {os.path.relpath(os.path.dirname(path), REPO)
               for top in CODE_FOLDERS
               for path in glob.glob(os.path.join(REPO, top, "**", "*.py"), recursive=True)
               if "__pycache__" not in path}
    # A folder of tests/library or tests/training is named by the room it mirrors
    # (tests/test_layout.py holds them to that), so the map names only their parents.
    folders = {folder for folder in folders if os.path.dirname(folder) not in MIRRORED_TESTS}
    assert sorted(folders - linked) == [], "folders of code missing from the README's map"
    assert sorted(linked - folders) == [], "the README's map names folders without code"


def _anchors(path):
    """GitHub's anchors of a markdown file's headings."""
    anchors, seen = set(), {}
    with open(path, encoding="utf-8") as handle:
        text = re.sub(r"```.*?```", "", handle.read(), flags=re.DOTALL)
    for heading in re.findall(r"^#+\s+(.*)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_every_link_resolves():
    broken = []
    for page in PAGES:
        with open(os.path.join(REPO, page), encoding="utf-8") as handle:
            text = handle.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (os.path.normpath(os.path.join(REPO, os.path.dirname(page), path))
                        if path else os.path.join(REPO, page))
            if not os.path.exists(resolved):
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_index_lists_every_page():
    with open(os.path.join(REPO, "docs", "index.md")) as handle:
        linked = set(re.findall(r"\]\(([\w-]+\.md)\)", handle.read()))
    pages = {os.path.basename(page) for page in PAGES if page.startswith("docs/")}
    assert sorted(pages - linked - {"index.md"}) == []


# ---------------------------------------------------------------------------------------------
# Running the blocks.

@pytest.fixture
def no_change_to_the_checkout():
    """Fails the test if the checkout's files changed while it ran (a block writing into it)."""
    def status():
        result = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                                cwd=REPO, capture_output=True, text=True)
        return result.stdout if result.returncode == 0 else None
    before = status()
    yield
    assert status() == before, "a doc block changed files in the checkout"


def _skip_params(language):
    params = []
    for block in BLOCKS:
        if block.language != language:
            continue
        marks = [pytest.mark.skip(reason=f"{block.name}: {block.skip}")] if block.skip else []
        if block.processes:
            marks.append(pytest.mark.processes)
        params.append(pytest.param(block, id=block.name, marks=marks))
    return params


PYTHON_PAGES = sorted({block.page for block in BLOCKS
                       if block.language == "python" and block.skip is None})


@pytest.mark.parametrize("block", [param for param in _skip_params("python") if param.marks])
def test_skipped_python_block(block):
    """Never runs: lists each skipped Python block, with its reason, in the skip report."""


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_python_blocks(page, tmp_path, monkeypatch, fresh_session, no_change_to_the_checkout):
    import numpy as np

    import docs_fixtures
    import keras_vit

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    namespace = {"np": np, "os": os, "keras_vit": keras_vit, "docs": docs_fixtures,
                 "__name__": "__docs__"}
    ran = 0
    for block in PARSED[page][0]:
        if block.language != "python" or block.skip is not None:
            continue
        with (docs_fixtures.tiny_variants() if block.tiny else _nothing()):
            for code in (_moved(block.setup, tmp_path), block.text(tmp_path),
                         _moved(block.check, tmp_path)):
                # Padded so that a traceback names the page's own line.
                source = "\n" * (block.line - 1) + code
                exec(compile(source, os.path.join(REPO, page), "exec"), namespace)
        ran += 1
    assert ran


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


def _tiny_flags(data):
    from train_fixtures import flags
    return [flag for flag in flags(data, "unused")
            if not flag.startswith(("--config=", "--workdir="))]


def _console_scripts(bin_dir):
    """`python` and one script per console script of setup.py, running this checkout's code
    (`keras_vit.train.X:run` installed is `train.X:run` here)."""
    os.makedirs(bin_dir)
    # A script, not a link: a link to a virtual environment's interpreter starts Python
    # outside that environment (it finds no pyvenv.cfg beside the link).
    with open(os.path.join(bin_dir, "python"), "w") as handle:
        handle.write(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    os.chmod(os.path.join(bin_dir, "python"), 0o755)
    with open(os.path.join(REPO, "setup.py")) as handle:
        scripts = re.findall(r'"(keras-vit-[\w-]+) = keras_vit\.train\.([\w.]+):run"',
                             handle.read())
    assert scripts
    for name, module in scripts:
        path = os.path.join(bin_dir, name)
        with open(path, "w") as handle:
            handle.write(f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; sys.argv[0] = '
                         f"'{name}'; from train.{module} import run; run()\" \"$@\"\n")
        os.chmod(path, 0o755)


TEST_VARIABLES = ("TINY", "REPO", "PORT_0", "PORT_1")


def _shell_env(tmp_path, data):
    from train.engines.tf_strategy import local_cluster
    import json

    _console_scripts(str(tmp_path / "bin"))
    workers = json.loads(local_cluster(2)[0])["cluster"]["worker"]
    ports = [address.rsplit(":", 1)[1] for address in workers]
    env = data.env()
    env.update(PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}",
               PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]),
               TINY=" ".join(_tiny_flags(data)), REPO=REPO, PORT_0=ports[0], PORT_1=ports[1],
               TFDS_DATA_DIR=data.data_dir, KERAS_HOME=str(tmp_path / "keras"))
    return env


def _commands(code):
    """The commands of a flags-only block, one per logical line, as argument lists."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def _run_flags_only(block, cwd, env):
    """Each command with --help, all at once (each spends seconds importing TensorFlow)."""
    variables = {name: env[name] for name in TEST_VARIABLES}
    started = []
    for words in _commands(block.text(cwd, variables)):
        assignments = {}  # leading NAME=value words, as the shell reads them
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        assert words and (words[0] == "python" or words[0].startswith("keras-vit-")), (
            f"{block.name}: flags-only runs python and keras-vit-* commands, not {words!r}")
        started.append((words, subprocess.Popen(
            [*words, "--help"], cwd=cwd, env={**env, **assignments}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)))
    for words, process in started:
        stdout, stderr = process.communicate(timeout=120)
        output = stdout + stderr
        helped = ((process.returncode == 0 and "usage:" in stdout) or  # argparse
                  (process.returncode == 1 and "Try --helpfull" in stdout))  # absl
        assert helped and not re.search(r"^Error:", output, flags=re.MULTILINE), (
            f"{block.name}: {shlex.join(words)} --help (status {process.returncode}):\n"
            f"{output[-3000:]}")


@pytest.mark.parametrize("block", _skip_params("bash"))
def test_shell_block(block, tmp_path, fake_fmnist, request, no_change_to_the_checkout):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for folder in ("configs", "benchmarks", "tests"):
        os.symlink(os.path.join(REPO, folder), cwd / folder)
    env = _shell_env(tmp_path, fake_fmnist)
    if block.trained:
        # A finished tiny quickstart run with its export (conftest.py's, shared with the CLI
        # output's tests).
        source = request.getfixturevalue("quickstart_run").workdir
        shutil.copytree(source, _moved(block.trained, cwd))
    if block.flags_only:
        _run_flags_only(block, str(cwd), env)
        return
    variables = {name: env[name] for name in TEST_VARIABLES}
    script = "\n".join([_moved(block.setup, cwd), block.text(cwd, variables),
                        _moved(block.check, cwd)])
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        f"{block.name} exited with status {result.returncode}:\n{script}\n"
        f"{(result.stdout + result.stderr)[-4000:]}")

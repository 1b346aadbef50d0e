"""`python -m train.studies.ablate` (train/studies/ablate.py, train/studies/ablations.py): the
studies' arms, the report's table from given results, one tiny study end to end (table, plot,
JSON), a rerun that skips the finished runs, a stopped study that resumes, changed settings
refused, one-line errors, and the deprecated `python -m train.ablate` that runs it.

The end-to-end study is `hybrid` (two arms, one seed, a tiny model on the fake Fashion-MNIST):
it also checks the matched-FLOPs steps against keras_vit.analysis.flops.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from configs import ablation
from train.run import config_checks
from train.studies import ablations
from train_fixtures import REPO, TINY as TINY_RUN, override_flags, read_metrics

STEPS = 2  # of the costlier arm (R+ViT); the ViT gets more, for the same FLOPs
# The tiny model and short loops of the other training tests, as overrides of
# configs/ablation.py; the study itself picks the models, patch sizes and steps.
TINY = {name: TINY_RUN[name] for name in (
    "batch_size", "eval_batch_size", "shuffle_buffer", "steps_per_loop", "checkpoint_every_steps")}
TINY["model"] = {name: TINY_RUN["model"][name] for name in (
    "hidden_size", "mlp_dim", "num_heads", "num_layers")}
TIMEOUT = 300


def ablate(data, out, *flags, study="hybrid", steps=STEPS, seeds=1):
    args = [f"--study={study}", f"--out={out}", f"--config.data_dir={data.data_dir}"]
    if steps is not None:
        args.append(f"--steps={steps}")
    if seeds is not None:
        args.append(f"--seeds={seeds}")
    args += override_flags(TINY)
    return subprocess.run([sys.executable, "-m", "train.studies.ablate", *args, *flags], cwd=REPO,
                          env=data.env(), capture_output=True, text=True, timeout=TIMEOUT)


def progress(result):
    return [line for line in result.stdout.splitlines() if line.startswith("[")]


def error_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("Error: ")]


def file_times(folder):
    return {os.path.join(root, name): os.path.getmtime(os.path.join(root, name))
            for root, _, names in os.walk(folder) for name in names}


@pytest.fixture(scope="module")
def study(fake_fmnist, tmp_path_factory):
    """The hybrid study, run once: (out folder, the finished process)."""
    out = tmp_path_factory.mktemp("ablations") / "out"
    result = ablate(fake_fmnist, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result


# ----------------------------------------------------------------------------------------------
# The studies as data.

def test_position_study_has_the_sensible_arms():
    arms = {arm.name: arm.fields for arm in ablations.STUDIES["position_embedding"].arms}
    assert sorted(arms) == sorted([
        "none-stem", "relative-stem", "learned-stem", "learned-every_layer",
        "learned-every_layer_shared", "learned_2d-stem", "learned_2d-every_layer",
        "learned_2d-every_layer_shared"])
    assert arms["learned_2d-every_layer"] == {"model.position_embedding": "learned_2d",
                                              "model.position_embedding_placement": "every_layer"}


@pytest.mark.parametrize("name", list(ablations.STUDIES))
def test_every_arm_passes_the_config_checks(name):
    for arm in ablations.STUDIES[name].arms:
        config = ablation.get_config()
        config.update_from_flattened_dict(arm.fields)
        config_checks.check(config)
    assert len({arm.name for arm in ablations.STUDIES[name].arms}) >= 2


def test_learning_rate_sweep_and_pick():
    assert ablations.sweep_learning_rates(3e-3) == [0.001, 0.003, 0.009]
    sweep = [{"learning_rate": 0.001, "accuracy": 0.5}, {"learning_rate": 0.003, "accuracy": 0.7},
             {"learning_rate": 0.009, "accuracy": 0.7}]
    assert ablations.pick_learning_rate(sweep) == 0.003  # a tie goes to the lower rate
    sweep[2]["accuracy"] = 0.71
    assert ablations.pick_learning_rate(sweep) == 0.009


def test_each_study_runs_on_its_base_config_unless_one_is_given():
    # In a process of its own: the command's flags would clash with other tools' in this one.
    code = ("from train.studies import ablate\n"
            "for argv in ([], ['--study=axial'], ['--study=augreg'], ['--study', 'layer_decay'],"
            " ['--study=augreg', '--config=quickstart']):\n"
            "    print(ablate.with_default_config(['ablate', *argv]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "['ablate', '--config=ablation']",
        "['ablate', '--config=ablation', '--study=axial']",
        "['ablate', '--config=augreg', '--study=augreg']",
        "['ablate', '--config=mpp_finetune:labels=6000', '--study', 'layer_decay']",
        "['ablate', '--study=augreg', '--config=quickstart']"]


def test_augreg_table_names_each_level_and_its_losses():
    runs = [{"accuracy": 0.8, "train_loss": 0.1, "eval_loss": 0.6},
            {"accuracy": 0.82, "train_loss": 0.3, "eval_loss": 0.5}]
    table = ablations.augreg_table({
        "medium2": {"fields": {"augment": "medium2"}, "runs": runs},
        "none": {"fields": {"augment": "none"}, "runs": [{"accuracy": 0.7}]}})
    assert "| `medium2` | 2 x 15 | 0.5 | 0.200 | 0.550 | 81.00 ± 1.41 |" in table
    assert "| `none` | – | – | – | – | 70.00 |" in table


def test_matched_steps():
    steps = ablations.matched_steps(300, {"vit": 16_000_000, "r_vit": 20_000_000})
    assert steps == {"vit": 375, "r_vit": 300}


# ----------------------------------------------------------------------------------------------
# The report from given results.

def _arm(*accuracies, **extra):
    return {"runs": [{"accuracy": value} for value in accuracies], **extra}


def test_accuracy_cell():
    assert ablations.accuracy_cell([0.80, 0.82]) == "81.00 ± 1.41"  # sample std, in percent
    assert ablations.accuracy_cell([0.7512]) == "75.12"  # one seed: no spread to show
    assert ablations.accuracy_cell([]) == "–"


def test_position_table_layout():
    arms = {"none-stem": _arm(0.61, 0.62), "learned-stem": _arm(0.80, 0.82),
            "learned-every_layer": _arm(0.79, 0.79), "relative-stem": _arm(0.75)}
    lines = ablations.position_table(arms).splitlines()
    assert lines[0] == ("| Pos. Emb. | Default/Stem (`stem`) | Every Layer (`every_layer`) | "
                        "Every Layer-Shared (`every_layer_shared`) |")
    assert lines[1] == "|---|---|---|---|"
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")[1:]
            for line in lines[2:]}
    assert rows == {
        "No Pos. Emb. (`none`)": ["61.50 ± 0.71", "N/A", "N/A"],
        "1-D Pos. Emb. (`learned`)": ["81.00 ± 1.41", "79.00 ± 0.00", "–"],
        "2-D Pos. Emb. (`learned_2d`)": ["–", "–", "–"],  # sensible, but not run
        "Rel. Pos. Emb. (`relative`)": ["75.00", "N/A", "N/A"],
    }


def test_classifier_table_bolds_the_picked_rate():
    sweep = [{"learning_rate": rate, "accuracy": accuracy}
             for rate, accuracy in ((0.001, 0.70), (0.003, 0.72), (0.009, 0.71))]
    arms = {"token": _arm(0.80, 0.81, label="class token", fields={"model.classifier": "token"},
                          sweep=sweep, learning_rate=0.003)}
    lines = ablations.classifier_table(arms).splitlines()
    assert lines[0] == ("| Classifier | held-out, lr 0.001 | held-out, lr 0.003 | held-out, lr "
                        "0.009 | picked lr | test top-1 (%) |")
    assert lines[2] == ("| class token (`token`) | 70.00 | **72.00** | 71.00 | 0.003 | "
                        "80.50 ± 0.71 |")


def test_summaries_with_the_flat_model_fields_are_drawn_the_same():
    """Summaries written before the model's fields moved into config.model name an arm's fields
    flat (`classifier`); their tables are the same."""
    arm = _arm(0.80, label="GAP", sweep=[{"learning_rate": 0.003, "accuracy": 0.7}],
               learning_rate=0.003)
    new = ablations.classifier_table({"gap": dict(arm, fields={"model.classifier": "gap"})})
    assert new == ablations.classifier_table({"gap": dict(arm, fields={"classifier": "gap"})})
    assert "| GAP (`gap`) |" in new


@pytest.mark.parametrize("study", list(ablations.STUDIES))
def test_the_checked_in_tables_are_redrawn_from_their_json(study):
    """docs/ablations/<study>.json (written with the flat fields) still draws the table of its
    <study>.md."""
    folder = os.path.join(REPO, "docs", "ablations")
    with open(os.path.join(folder, f"{study}.json")) as handle:
        summary = json.load(handle)
    with open(os.path.join(folder, f"{study}.md")) as handle:
        assert ablations.table(summary) in handle.read()


# ----------------------------------------------------------------------------------------------
# A tiny study end to end.

@pytest.mark.processes
def test_study_writes_the_report_plot_and_json(study):
    out, result = study
    lines = progress(result)
    assert len(lines) == 4 and all("/2] hybrid: " in line for line in lines)
    assert [line.rsplit(": ", 1)[1].split(" ")[0] for line in lines[::2]] == ["training"] * 2
    assert all(line.endswith(" s") and "%" in line for line in lines[1::2])
    summary = json.loads((out / "hybrid.json").read_text())
    assert summary["complete"] and summary["seeds"] == [0]
    arms = summary["arms"]
    assert list(arms) == ["vit", "r_vit"]
    # Matched compute: the costlier R+ViT gets --steps, the ViT proportionally more.
    assert arms["r_vit"]["forward_flops"] > arms["vit"]["forward_flops"]
    assert arms["r_vit"]["steps"] == STEPS
    assert arms["vit"]["steps"] == round(
        STEPS * arms["r_vit"]["forward_flops"] / arms["vit"]["forward_flops"])
    for name, arm in arms.items():
        (run,) = arm["runs"]
        workdir = out / run["workdir"]
        assert run["workdir"] == f"runs/hybrid/{name}/seed0"
        saved = json.loads((workdir / "config.json").read_text())
        assert saved["total_steps"] == arm["steps"] and saved["model"]["hidden_size"] == 16
        final = [record for record in read_metrics(str(workdir)) if "eval_accuracy" in record]
        assert final[-1]["step"] == arm["steps"]
        assert run["accuracy"] == final[-1]["eval_accuracy"] and run["seconds"] > 0
    report = (out / "hybrid.md").read_text()
    assert report.startswith("# Ablation: ViT against the hybrid R+ViT")
    assert f"Budget of every run: {STEPS} steps for the costlier model" in report
    assert "batch 32" in report and "28x28 pixels" in report
    assert "Seeds: 1 (0)" in report and "all 100 images of `test`" in report
    assert "| R+ViT | `R+Ti/16` |" in report and f"| {arms['vit']['steps']} |" in report
    assert ablations.table(summary) in report  # the table is redrawn from the JSON alone
    assert "python -m train.studies.ablate --study=hybrid" in report and "--steps=2" in report
    png = (out / "hybrid.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert not [name for name in os.listdir(out) if name.endswith((".tmp", ".partial"))]


@pytest.mark.processes
def test_rerun_skips_the_finished_runs(fake_fmnist, study):
    out, _ = study
    before = file_times(out / "runs")
    result = ablate(fake_fmnist, out)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = progress(result)
    assert len(lines) == 2 and all(": finished before, " in line for line in lines)
    assert file_times(out / "runs") == before  # no run started: nothing in a workdir changed
    summary = json.loads((out / "hybrid.json").read_text())
    assert all(arm["runs"][0]["seconds"] > 0 for arm in summary["arms"].values())  # kept


@pytest.mark.processes
def test_a_stopped_study_resumes_its_unfinished_run(fake_fmnist, study, tmp_path):
    """As if killed during the R+ViT run after its last checkpoint: only that run runs again,
    and train.main resumes it from the checkpoint."""
    out = tmp_path / "copy"
    shutil.copytree(study[0], out)
    (out / "hybrid.md").unlink()
    stopped = out / "runs" / "hybrid" / "r_vit" / "seed0"
    records = [record for record in read_metrics(str(stopped)) if "eval_accuracy" not in record]
    (stopped / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    finished = file_times(out / "runs" / "hybrid" / "vit")
    result = ablate(fake_fmnist, out)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = progress(result)
    assert "vit seed 0: finished before" in lines[0]
    assert "r_vit seed 0: training" in lines[1] and "%" in lines[2]
    log = (stopped / "train.log").read_text()
    assert log.count("$ ") == 2 and "Resumed from" in log
    assert file_times(out / "runs" / "hybrid" / "vit") == finished
    assert (out / "hybrid.md").exists()


@pytest.mark.processes
def test_changed_settings_are_refused(fake_fmnist, study):
    out, _ = study
    before = file_times(out)
    result = ablate(fake_fmnist, out, steps=STEPS + 1)
    assert result.returncode == 1
    (error,) = error_lines(result)
    assert "Traceback" not in result.stderr
    assert str(out / "runs" / "hybrid") in error and "total_steps: " in error
    assert "another --out" in error and "delete" in error
    assert file_times(out) == before


# ----------------------------------------------------------------------------------------------
# Flags: one line each, before any training.

BAD_FLAGS = {
    "unknown_study": (dict(study="patches"), [], ["--study", "position_embedding", "axial"]),
    "steps_0": (dict(steps=0), [], ["--steps=0 must be at least 1"]),
    "seeds_0": (dict(seeds=0), [], ["--seeds=0 must be at least 1"]),
    "seed_override": ({}, ["--config.seed=3"], ["--config.seed is set by --seeds"]),
    "arm_field_override": (dict(study="position_embedding"),
                           ["--config.model.position_embedding=none"],
                           ["--config.model.position_embedding is set by the arms"]),
    "datasets_disagree": ({}, ["--dataset=cifar10", "--config.dataset=mnist"],
                          ["--dataset=cifar10", "--config.dataset=mnist", "give one"]),
    "misspelt_override": ({}, ["--config.model.hiden_size=8"], ["hiden_size"]),
    "bad_config_value": ({}, ["--config.model.position_embedding_placement=everywhere"],
                         ["config.model.position_embedding_placement='everywhere'"]),
    "variant_as_config_model": ({}, ["--config.model=R+Ti/16"],
                                ["--config.model.variant=R+Ti/16"]),
    "classifier_split_expression": (dict(study="classifier"), ["--config.train_split=train[:50%]"],
                         ["plain split name"]),
    "layer_decay_without_pretrained": (dict(study="layer_decay"), [],
                                       ["fine-tunes a pre-trained encoder",
                                        "--config.pretrained=FILE"]),
}


@pytest.mark.processes  # a command per bad flag, at once
def test_bad_flags_are_one_line_errors(fake_fmnist, tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    cases = dict(BAD_FLAGS, out_is_a_file=({}, [f"--out={file}"], ["is a file"]))
    processes = {}
    for name, (keywords, extra, _) in cases.items():
        args = [f"--study={keywords.get('study', 'hybrid')}",
                f"--steps={keywords.get('steps', 2)}", f"--seeds={keywords.get('seeds', 1)}"]
        if not any(flag.startswith("--out=") for flag in extra):
            args.append(f"--out={tmp_path / name}")
        processes[name] = subprocess.Popen(
            [sys.executable, "-m", "train.studies.ablate", *args, *extra], cwd=REPO,
            env=fake_fmnist.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for name, process in processes.items():
        _, stderr = process.communicate(timeout=TIMEOUT)
        assert process.returncode == 1, (name, stderr[-2000:])
        assert "Traceback" not in stderr, name
        errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1, (name, stderr[-2000:])
        for word in cases[name][2]:
            assert word in errors[0], (name, word, errors[0])
        assert not (tmp_path / name / "runs").exists(), name  # nothing trained


"""Training throughput: keras_vit's two engines (the TensorFlow driver's loop and the JAX engine)
against Keras' own `fit` and `train_on_batch` on the same architecture, on each backend.

    python benchmarks/train_step.py --variant=quickstart --variant=B/16 --image_size=224 \
        --batch_size=8 --repeats=3

A case is a `--variant` at `--image_size` and `--batch_size` (AdamW, global-norm clipping at 1.0,
10 classes), or `quickstart`: configs/quickstart.py as the main job runs it (its model, 32px,
batch 128, its optimizer). Every contender trains the case on one synthetic batch (contenders
and the peer, keras-hub's `ViTImageClassifier` or keras_vit's own model for hybrids, in
benchmarks/train_contenders.py). The Keras backend is fixed per process, so each `--backend`
runs in its own child process (train_contenders.py), one after the other; within a process the
contenders are interleaved (each repeat times every contender once), and the table gives the
median of `--repeats` timed runs of `--steps` optimizer steps each, after one untimed run that
compiles. Ratios across backends compare processes run back to back, not interleaved runs.

FLOPs: `keras_vit.flops.training_flops`, 3x the forward pass's (2 per multiply-add; the backward
pass as twice the forward; elementwise ops and the optimizer update not counted), the same count
for every contender of a case. The matmul peak is measured in each child by its own library
(`machine.matmul_peak`, a 4096^3 matmul in the policy's compute dtype, TensorFlow's and XLA's
CPU kernels differ): "% of peak" divides by the higher of the backends' peaks (the machine's best
measured), "% of own peak" by the contender's backend's.

    python benchmarks/train_step.py --quickstart

times the TensorFlow driver's loop on the main job's model and batch (configs/quickstart.py, XLA)
with the ResNet stem's max-pool gradient as keras_vit computes it and as XLA does for
`ops.max_pool`. Both modes need the Fashion-MNIST files the main job uses (the engines read their
label names; the timed batches are synthetic); keras-hub (`pip install keras-hub`) for its rows.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "train_contenders.py")
RESULT_PREFIX = "train_contenders result: "  # train_contenders.RESULT_PREFIX (no Keras here)
BACKENDS = ("tensorflow", "jax")
BASELINE = ("tensorflow", "keras_vit driver loop, XLA off")
QUICKSTART_STEPS = 100  # the main job's steps_per_loop


def child_spec(args):
    """What every child measures, as JSON-ready data."""
    cases = args.variant or ["S/16"]
    return {"cases": cases, "policies": args.dtype or ["float32"],
            "image_size": args.image_size, "batch_size": args.batch_size,
            "steps": {case: args.steps or (QUICKSTART_STEPS if case == "quickstart" else 3)
                      for case in cases},
            "repeats": args.repeats, "peak_size": 4096}


def run_child(backend, spec):
    """train_contenders.py's result on `backend`, from a process of its own."""
    env = dict(os.environ, KERAS_BACKEND=backend)
    result = subprocess.run([sys.executable, CHILD, "--spec=" + json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, text=True)  # stderr: its progress, shown
    lines = [line for line in result.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if result.returncode or not lines:
        raise RuntimeError(f"The {backend} measurement failed (exit status "
                           f"{result.returncode}); its output is above.\n{result.stdout[-2000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def machine_peaks(results):
    """The highest matmul peak any backend measured, by compute dtype."""
    peaks = {}
    for result in results:
        for dtype, peak in result["peaks"].items():
            peaks[dtype] = max(peak, peaks.get(dtype, 0.0))
    return peaks


def table_rows(results):
    """One row per case, policy, backend and contender: `(case, policy, backend, name, images/s,
    fraction of the machine's peak, fraction of its backend's peak, ratio to the baseline)`.
    The baseline is the TensorFlow driver's loop without XLA, else the case's first row."""
    peaks = machine_peaks(results)
    measured = {}  # (case, policy) -> [(backend, case result, name, rate)]
    for result in results:
        for case in result["cases"]:
            for name, rate in case["rates"].items():
                measured.setdefault((case["case"], case["policy"]), []).append(
                    (result, case, name, rate))
    rows = []
    for (case_name, policy), found in measured.items():
        rates = {(result["backend"], name): rate for result, _, name, rate in found}
        baseline = rates.get(BASELINE, found[0][3])
        for result, case, name, rate in found:
            achieved = rate * case["training_flops"]
            dtype = case["compute_dtype"]
            rows.append((case_name, policy, result["backend"], name, rate,
                         achieved / peaks[dtype], achieved / result["peaks"][dtype],
                         rate / baseline))
    return rows


def describe_cases(results):
    """One line per case: what it trains and its FLOPs per image."""
    lines, seen = [], set()
    for case in results[0]["cases"]:
        if case["case"] in seen:
            continue
        seen.add(case["case"])
        what = ("configs/quickstart.py, " if case["case"] == "quickstart" else "") + (
            f"{case['variant']} at {case['image_size']}px, batch {case['batch_size']}, "
            f"{case['steps']} steps per run")
        lines.append(f"- {case['case']}: {what}; training FLOPs per image "
                     f"{case['training_flops'] / 1e9:.4g} G")
    return lines


def print_table(results, repeats):
    peaks = ", ".join(
        f"{dtype} " + ", ".join(f"{r['backend']} {r['peaks'][dtype] / 1e9:.0f}" for r in results)
        for dtype in sorted(machine_peaks(results)))
    print(f"CPU: {machine.cpu_name()}, {os.cpu_count()} cores; measured 4096^3 matmul peak "
          f"GFLOP/s: {peaks}")
    versions = {}
    for result in results:
        versions.update(result["versions"])
    print(", ".join(f"{name} {version}" for name, version in versions.items())
          + ("" if "keras-hub" in versions else "; keras-hub not installed (`pip install "
             "keras-hub`)"))
    print("\n".join(describe_cases(results)))
    print(f"Median of {repeats} timed runs. Each backend ran in its own process, one after the "
          f"other ({', then '.join(r['backend'] for r in results)}), its contenders interleaved: "
          "ratios across backends compare separate processes. FLOPs: 3x the forward pass "
          "(keras_vit.flops.training_flops); % of peak: of the highest matmul peak measured, "
          "% of own peak: of the contender's backend's.\n")
    print("| model | dtype policy | backend | trainer | images/s | % of peak | % of own peak "
          "| vs TF driver (XLA off) |")
    print("|---|---|---|---|---|---|---|---|")
    for case, policy, backend, name, rate, fraction, own, ratio in table_rows(results):
        print(f"| {case} | {policy} | {backend} | {name} | {rate:.2f} | {100 * fraction:.1f}% | "
              f"{100 * own:.1f}% | {ratio:.2f}x |")


def measure_quickstart(steps, repeats):
    """The stem pool-gradient table, in this process, on TensorFlow."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tempfile

    import keras
    import tensorflow as tf

    import train_contenders as contenders

    config = contenders.case_config("quickstart", None, None, "float32")
    batch = contenders.synthetic_batch(config.batch_size, config.image_size)
    print(machine.describe(["float32"]))
    with tempfile.TemporaryDirectory() as workdir:
        runs = {}
        for custom, name in ((True, "keras_vit's (first maximum, 9 strided views)"),
                             (False, "XLA's (select-and-scatter)")):
            runs[name] = contenders.quickstart_contender(custom, batch,
                                                         os.path.join(workdir, str(custom)))
        rates = contenders.interleaved_rates(runs, steps, config.batch_size, repeats)
    print(f"configs/quickstart.py: {config.model.variant} at {config.image_size}px, batch "
          f"{config.batch_size}, XLA {'on' if config.jit_compile else 'off'}; {steps} steps per "
          f"run, median of {repeats}; TF {tf.__version__}, Keras {keras.__version__}\n")
    print("| stem max-pool gradient | images/s | vs XLA's |")
    print("|---|---|---|")
    baseline = rates["XLA's (select-and-scatter)"]
    for name, rate in rates.items():
        print(f"| {name} | {rate:.0f} | {rate / baseline:.2f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append",
                        help="repeat for several (default S/16); `quickstart`: the main job's")
    parser.add_argument("--dtype", action="append", help="dtype policies (default float32)")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--steps", type=int,
                        help=f"optimizer steps per timed run (default 3; {QUICKSTART_STEPS} for "
                             "the quickstart)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", action="append", choices=BACKENDS,
                        help="repeat for both (default: both, jax when installed)")
    parser.add_argument("--quickstart", action="store_true",
                        help="time the stem's max-pool gradients on the main job's model instead")
    args = parser.parse_args()
    if args.quickstart:
        measure_quickstart(args.steps or QUICKSTART_STEPS, args.repeats)
        return
    backends = args.backend or [backend for backend in BACKENDS
                                if backend != "jax" or importlib.util.find_spec("jax")]
    spec = child_spec(args)
    print_table([run_child(backend, spec) for backend in backends], args.repeats)


if __name__ == "__main__":
    main()

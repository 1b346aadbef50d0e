"""Training throughput: keras_vit's two engines (the TensorFlow driver's loop and the JAX engine)
against Keras' own `fit` and `train_on_batch` on the same architecture, on each backend.

    python benchmarks/train_step.py --variant=quickstart --variant=B/16 --image_size=224 \
        --batch_size=8 --repeats=3

A case is a `--variant` at `--image_size` and `--batch_size` (AdamW, global-norm clipping at 1.0,
10 classes), or `quickstart`: configs/quickstart.py as the main job runs it (its model, 32px,
batch 128, its optimizer). Every contender trains the case on one synthetic batch; the
contenders, and the peer under Keras' loops (keras-hub's `ViTImageClassifier`, or keras_vit's own
model for hybrids), are in benchmarks/train_contenders.py. The Keras backend is fixed per
process, so each `--backend` runs in a process of its own (JAX's with the settings
`python -m train.main` restarts with: train/engines/jax_cpu_settings.py); both stay up and this
script interleaves their timed runs (each repeat times every contender of every backend once,
one process working at a time), so that a slower moment of a shared machine does not fall on
one backend only. The table gives the fastest of `--repeats` timed runs of `--steps` optimizer steps
each (other work on a shared machine only slows a run), after one untimed run that compiles.

FLOPs: `keras_vit.analysis.flops.training_flops`, 3x the forward pass's (2 per multiply-add; the
backward pass as twice the forward; elementwise ops and the optimizer update not counted), the same
count for every contender of a case. The matmul peak is measured in each child by its own library
(`machine.matmul_peak`, a 4096^3 matmul in the policy's compute dtype, TensorFlow's and XLA's
CPU kernels differ), at the start and after every repeat, the highest kept: "% of peak" divides by
the higher of the backends' peaks (the machine's best measured), "% of own peak" by the
contender's backend's. The header gives the 1-minute load average at the start and the end, and
"cores used" each fastest run's CPU seconds per second: what other work left it, or the step used.

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
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import machine  # noqa: E402
from train.engines import jax_cpu_settings  # noqa: E402  (no Keras: the standard library)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "train_contenders.py")
REPLY_PREFIX = "train_contenders reply: "  # train_contenders.REPLY_PREFIX (no Keras here)
BACKENDS = ("tensorflow", "jax")
BASELINE = ("tensorflow", "keras_vit driver loop, XLA off")
QUICKSTART_STEPS = 100  # the main job's steps_per_loop


class Child:
    """A train_contenders.py process on `backend`, answering one request at a time."""

    def __init__(self, backend):
        self.backend = backend
        self.process = subprocess.Popen(  # its stderr (progress, logs) shows
            [sys.executable, CHILD], env=jax_cpu_settings.environment(
                dict(os.environ, KERAS_BACKEND=backend), backend),  # as train.main runs it
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, op, **request):
        self.process.stdin.write(json.dumps(dict(request, op=op)) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(REPLY_PREFIX):
                return json.loads(line[len(REPLY_PREFIX):])
            sys.stderr.write(line)  # printed by a library, not a reply
        raise RuntimeError(f"The {self.backend} process ended (exit status "
                           f"{self.process.wait()}) before answering {op!r}; see above.")

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def measure(backends, cases, policies, image_size, batch_size, steps, repeats):
    """Each backend's results: its versions and peaks, and per case and policy its
    contenders' images/s and cores used in their fastest run, every repeat timing every
    contender of every backend once."""
    children = [Child(backend) for backend in backends]
    try:
        dtypes = sorted({"bfloat16" if "bfloat16" in policy else
                         "float16" if "float16" in policy else "float32" for policy in policies})
        results = [dict(child.ask("hello"), cases=[]) for child in children]
        measure_peaks(children, results, dtypes)  # once every child has started
        for case in cases:
            case_steps = steps or (QUICKSTART_STEPS if case == "quickstart" else 3)
            for policy in policies:
                setups = [child.ask("setup", case=case, policy=policy, image_size=image_size,
                                    batch_size=batch_size, steps=case_steps)
                          for child in children]
                times = [{name: [] for name in setup["names"]} for setup in setups]
                for _ in range(repeats):
                    for child, child_times in zip(children, times):
                        for name, runs in child_times.items():
                            reply = child.ask("time", name=name, steps=case_steps)
                            runs.append((reply["seconds"], reply["cpu_seconds"]))
                    measure_peaks(children, results, dtypes)
                for result, setup, child_times in zip(results, setups, times):
                    fastest = {name: min(runs) for name, runs in child_times.items()}
                    rates = {name: case_steps * setup["batch_size"] / seconds
                             for name, (seconds, _) in fastest.items()}
                    cores = {name: cpu_seconds / seconds
                             for name, (seconds, cpu_seconds) in fastest.items()}
                    result["cases"].append(dict(setup, case=case, policy=policy,
                                                steps=case_steps, rates=rates, cores=cores))
        return results
    finally:
        for child in children:
            child.close()


def measure_peaks(children, results, dtypes):
    """Each backend's matmul peak: the highest of its measurements (at the start and after
    every repeat), as other work on a shared machine only ever lowers it."""
    for child, result in zip(children, results):
        peaks = child.ask("peaks", dtypes=dtypes, peak_size=machine.PEAK_SIZE)
        result["peaks"] = {dtype: max(peak, result.get("peaks", {}).get(dtype, 0.0))
                           for dtype, peak in peaks.items()}
        result["peak_samples"] = result.get("peak_samples", 0) + 1


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


def print_table(results, repeats, load):
    peaks = ", ".join(
        f"{dtype} " + ", ".join(f"{r['backend']} {r['peaks'][dtype] / 1e9:.0f}" for r in results)
        for dtype in sorted(machine_peaks(results)))
    print(f"CPU: {machine.cpu_name()}, {os.cpu_count()} cores; 4096^3 matmul peak GFLOP/s (the "
          f"highest of {results[0]['peak_samples']} measurements): {peaks}; load average "
          f"(1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    versions = {}
    for result in results:
        versions.update(result["versions"])
    print(", ".join(f"{name} {version}" for name, version in versions.items())
          + ("" if "keras-hub" in versions else "; keras-hub not installed (`pip install "
             "keras-hub`)"))
    print("\n".join(describe_cases(results)))
    print(f"Fastest of {repeats} timed runs. Each backend runs in a process of its own "
          f"({', '.join(r['backend'] for r in results)}); every repeat times each contender of "
          "each process once, one process working at a time. FLOPs: 3x the forward pass "
          "(keras_vit.analysis.flops.training_flops); % of peak: of the highest matmul peak "
          "measured in the compute dtype, % of own peak: of the contender's backend's; cores "
          "used: CPU "
          f"seconds per second of the fastest run (below {os.cpu_count()} when other work took "
          "cores, or the step left some idle).\n")
    baseline = ("TF driver (XLA off)" if any(r["backend"] == BASELINE[0] for r in results)
                else "first row")
    cores = {(case["case"], case["policy"], result["backend"], name): used
             for result in results for case in result["cases"]
             for name, used in case["cores"].items()}
    print("| model | dtype policy | backend | trainer | images/s | % of peak | % of own peak "
          f"| vs {baseline} | cores used |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case, policy, backend, name, rate, fraction, own, ratio in table_rows(results):
        print(f"| {case} | {policy} | {backend} | {name} | {rate:.2f} | {100 * fraction:.1f}% | "
              f"{100 * own:.1f}% | {ratio:.2f}x | {cores[case, policy, backend, name]:.2f} |")


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
    load = [os.getloadavg()[0]]  # other work on the machine slows every contender
    results = measure(backends, args.variant or ["S/16"], args.dtype or ["float32"],
                      args.image_size, args.batch_size, args.steps, args.repeats)
    load.append(os.getloadavg()[0])
    print_table(results, args.repeats, load)


if __name__ == "__main__":
    main()

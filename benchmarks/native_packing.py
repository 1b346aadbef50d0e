"""Packing against padding against square images, on the native-aspect data at equal budgets:
useful tokens per step, images per second of the whole training loop and the time an epoch
takes, on each engine.

    python benchmarks/native_packing.py                       # 60 steps each, both engines
    python benchmarks/native_packing.py --steps=200 --engines=jax --rounds=3

Three runs of configs/native_aspect.py per engine, the same 128 images a step, each image's budget
drawn from 16 to 64 patches (`config.native_min_patches`): "packed" (40 sequences of 128 patches),
"padded" (the same images, each padded to 64 patches: 128 sequences) and "square" (each image
squashed to 32x32, 64 patches). Useful tokens are the patches of images over the tokens the
model runs, trained the share of the step's images that found a place (the same for both
engines: one input pipeline); images per second is the median of the loop's own rate
(`metrics.jsonl`) after the compiling loop, times that share; with `--rounds`, the three runs
take turns that many times, and the table gives each layout's median rate and the median of the
rounds' own ratios to padding (a shared machine's load shifts neighbouring runs together). Extra
`--config.FIELD=VALUE` flags after `--` go to every run (the test runs it on the fake data that
way). On JAX a native run reads through Grain unless `--config.input_pipeline=tf.data`.

    python benchmarks/native_packing.py --step_only           # the step and the input apart

`--step_only` measures instead the two halves of the loop apart, on each engine. The step alone:
`--step_batches` training batches of each layout from the real input pipeline, cached in memory,
then each engine's own compiled training step on them (the TensorFlow engine's loop,
`TFEngine.train_loop`, over the cached batches; the JAX engine's `JaxStep.train_step`, the
batches on the device already), the layouts' runs interleaved (packed, padded, square, packed...)
`--repeats` times in one process: the median time of a step, the images it trains per second,
and against padding the median of the repeats' ratios (each repeat's runs are neighbours in time,
which a shared machine's load shifts together); the same for the process's CPU time a step (all
its threads: steadier than the wall clock where other work takes the cores). Beside them the
compilations across all the runs (one per layout: static shapes; TensorFlow: the loop's
tracings) and, on JAX, the compiled step's memory
(`jax.jit(...).lower(...).compile().memory_analysis()`: temporaries, arguments, outputs) and
XLA's count of its FLOPs. The input alone: each layout's tf.data pipeline with nothing else
running, images per second and CPU time an image (medians of 3 interleaved reads of batches 3
to 12 of a fresh pipeline).

    python benchmarks/native_packing.py --step_only --with_input   # the loop, interleaved

`--with_input` has each step read its layout's live tf.data pipeline instead of the cached
batches (on JAX too: the engine's tf.data path, batches put on the device as it does): the
loop's input and step together, without its evaluation and logging, and the layouts' runs
interleaved in one process as above, so a shared machine's load falls on all three alike
where the whole loop's separate runs each meet their own (and the CPU time counts the input's
threads too). Each timed run follows 4 untimed steps of the same layout, which use up what its
pipeline made while the others ran.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import machine  # noqa: E402

MODES = {"packed": ("packed", []), "padded": ("padded", ["--config.native_min_patches=16"]),
         "square": ("square", [])}


def layout_config(mode, extra):
    """configs/native_aspect.py for `mode`, with the mode's and the `extra` flags."""
    from configs import native_aspect

    config = native_aspect.get_config(MODES[mode][0])
    for flag in MODES[mode][1] + extra:  # --config.a.b=value, as the runs take them
        path, value = flag.removeprefix("--config.").split("=", 1)
        *parents, name = path.split(".")
        section = config
        for parent in parents:
            section = section[parent]
        current = section[name]
        section[name] = (value == "True" if isinstance(current, bool)
                         else value if current is None else type(current)(value))
    return config


def training_input(mode, extra):
    """`(config, builder, native plan, tf.data training dataset)` of `mode`."""
    import tensorflow as tf

    from train.data import tf_pipeline
    from train.run import objectives

    config = layout_config(mode, extra)
    builder = tf_pipeline.get_builder(config)
    plan = objectives.make(config, 10).native
    dataset = tf_pipeline.train_dataset_fn(builder, config, native=plan)(
        tf.distribute.InputContext())
    return config, builder, plan, dataset


def input_alone(extra, rounds=3, batches=12, skipped=2):
    """Each layout's tf.data training pipeline alone: `{mode: (images per second, CPU
    microseconds an image)}`, medians of `rounds` interleaved reads of a fresh pipeline's
    batches after its first `skipped` (its start)."""
    found = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            config, _, _, dataset = training_input(mode, extra)
            iterator = iter(dataset.take(batches))
            for _ in range(skipped):
                next(iterator)
            start, cpu = time.perf_counter(), time.process_time()
            images = sum(config.batch_size for _ in iterator)
            found[mode].append((images / (time.perf_counter() - start),
                                (time.process_time() - cpu) / images * 1e6))
    return {mode: tuple(statistics.median(values) for values in zip(*runs))
            for mode, runs in found.items()}


def useful_tokens(mode, extra, batches=20):
    """`(patches of images over tokens, images placed over images)` of `batches` training
    batches of `mode`."""
    config, builder, plan, dataset = training_input(mode, extra)
    used = total = placed = 0
    for batch in dataset.take(batches).as_numpy_iterator():
        if plan is None:  # squares: every token is a patch
            return 1.0, 1.0
        valid = batch["segment_ids"] if plan.mode == "packed" else batch["pixel_attention_mask"]
        used += int((valid > 0).sum())
        total += valid.size
        placed += float(batch["label_weight"].sum()) if "label_weight" in batch else len(valid)
    return used / total, placed / (batches * config.batch_size)


def images_per_second(mode, engine, steps, extra):
    """The median loop rate of `steps` steps of `mode` on `engine`, first loop left out."""
    loop = max(1, steps // 3)
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, "-m", "train.main",
                   f"--config=configs/native_aspect.py:{MODES[mode][0]}", f"--workdir={workdir}",
                   f"--config.total_steps={steps}", f"--config.steps_per_loop={loop}",
                   f"--config.warmup_steps={loop}", f"--config.eval_every_steps={steps}",
                   f"--config.checkpoint_every_steps={steps}", "--config.export=False",
                   "--config.eval_split=test[:1000]", *MODES[mode][1], *extra]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                env=dict(os.environ, KERAS_BACKEND=engine))
        if result.returncode:
            sys.exit(f"{mode} on {engine} failed:\n{result.stderr[-3000:]}")
        with open(os.path.join(workdir, "metrics.jsonl")) as handle:
            rates = [record["images_per_second"] for record in map(json.loads, handle)
                     if "images_per_second" in record]
    return statistics.median(rates[1:] or rates)


STEP_REPLY = "native_packing step: "  # the line of the child's figures


def cached_batches(mode, extra, count):
    """`(config, classes, batches)`: the first `count` training batches of `mode` from the
    real input pipeline, NumPy arrays in memory."""
    from train.data import input_plan

    config, builder, _, dataset = training_input(mode, extra)
    batches = list(dataset.take(count).as_numpy_iterator())
    classes = len(input_plan.class_names(builder.info.features["label"]))
    return config, classes, batches


class JaxLayout:
    """The JAX engine's step (`JaxStep.train_step`) of one layout over its cached batches,
    already on the device, or as many from `source` (its live tf.data pipeline), each put on
    the device as it comes."""

    def __init__(self, config, classes, batches, source=None):
        from train.engines import jax_mesh, jax_step

        self.step = jax_step.JaxStep(config, classes, jax_mesh.make_distribution())
        self.batches = [self._on_device(batch) for batch in batches]
        self.state = self.step.state
        self.live = None if source is None else source.as_numpy_iterator()

    def _on_device(self, batch):
        import jax

        return {name: jax.device_put(value, self.step.batch_sharding)
                for name, value in batch.items()}

    def run(self, steps):
        batches = self.batches[:steps] if self.live is None else (
            self._on_device(next(self.live)) for _ in range(steps))
        for batch in batches:
            self.state, (loss, _) = self.step.train_step(self.state, batch)
        return float(loss)  # waits for the steps

    def figures(self):
        """The compiled step's memory (bytes) and XLA's FLOPs (the program the runs used:
        lowering it again compiles nothing new)."""
        compiled = self.step.train_step.lower(self.state, self.batches[0]).compile()
        memory, cost = compiled.memory_analysis(), compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return {"temp": memory.temp_size_in_bytes, "arguments": memory.argument_size_in_bytes,
                "outputs": memory.output_size_in_bytes, "flops": cost.get("flops")}


class TFLayout:
    """The TensorFlow engine's compiled loop (`TFEngine.train_loop`) of one layout over its
    cached batches, all of them in one call, or as many from `source` (its live tf.data
    pipeline)."""

    def __init__(self, config, classes, batches, source=None):
        import numpy as np
        import tensorflow as tf

        from train.engines import tf_engine, tf_strategy

        self.workdir = tempfile.TemporaryDirectory()
        self.engine = tf_engine.TFEngine(config, self.workdir.name, tf_strategy.make_strategy())
        if source is None:
            stacked = {name: np.stack([batch[name] for batch in batches]) for name in batches[0]}
            source = tf.data.Dataset.from_tensor_slices(stacked).repeat()
        self.iterator = iter(source)

    def run(self, steps):
        import tensorflow as tf

        loss, _ = self.engine.train_loop(self.iterator, tf.constant(steps))  # no new tracing
        return float(loss)

    def figures(self):
        return {"traces": self.engine.train_loop.experimental_get_tracing_count()}


# --with_input: steps of each run left untimed. A pipeline keeps making batches while the other
# layouts run (its buffers: some 3 batches); timed at once, a run would count its predecessor's
# input work and not its own.
LIVE_WARM_STEPS = 4


def step_figures(step_batches, repeats, extra, with_input=False):
    """In an engine's process: each layout's step alone on its cached batches, or
    `with_input` on its live tf.data pipeline (module docstring), the layouts' runs
    interleaved."""
    import keras

    kind = JaxLayout if keras.config.backend() == "jax" else TFLayout
    compiles = machine.jax_compile_counter()
    layouts, results = {}, {}

    def run(mode, steps=step_batches):  # counts the compilations of each layout's own runs
        before = len(compiles)
        layouts[mode].run(steps)
        results[mode]["compiles"] += len(compiles) - before

    for mode in MODES:
        config, classes, batches = cached_batches(mode, extra, step_batches)
        source = training_input(mode, extra)[3] if with_input else None
        layouts[mode] = kind(config, classes, batches, source)
        results[mode] = {"images": statistics.mean(trained_images(batch, config)
                                                   for batch in batches),
                         "tokens": tokens_a_step(batches[0], config), "seconds": [], "cpu": [],
                         "compiles": 0}
    for _ in range(2):  # compiles; then a round as the timed ones (TensorFlow's first run of
        for mode in MODES:  # a layout after another layout's took 10x longer)
            run(mode)
    for _ in range(repeats):
        for mode in MODES:
            if with_input:  # untimed: the batches its pipeline made while the others ran,
                run(mode, LIVE_WARM_STEPS)  # and the others' refills, fall in these steps
            start, cpu = time.perf_counter(), time.process_time()
            run(mode)
            results[mode]["seconds"].append((time.perf_counter() - start) / step_batches)
            results[mode]["cpu"].append((time.process_time() - cpu) / step_batches)
    for mode, layout in layouts.items():
        results[mode].update(layout.figures())
        if "traces" in results[mode]:  # TensorFlow: the loop's tracings (one per program)
            results[mode]["compiles"] = results[mode].pop("traces")
    return results


def trained_images(batch, config):
    """The images a step trains on: those with a place in a packed batch, else all."""
    if "label_weight" in batch:
        return float(batch["label_weight"].sum())
    return config.batch_size


def tokens_a_step(batch, config):
    """The tokens the model runs on a batch: its sequences' positions (squares: patches)."""
    for name in ("segment_ids", "pixel_attention_mask"):
        if name in batch:
            return batch[name].size
    return config.batch_size * (config.image_size // config.model.patch_size) ** 2


def step_alone(engine, step_batches, repeats, extra, with_input=False):
    """`step_figures` on `engine`, in a process of its own (the Keras backend is fixed per
    process)."""
    command = [sys.executable, os.path.abspath(__file__), "--child",
               f"--step_batches={step_batches}", f"--repeats={repeats}",
               *(["--with_input"] if with_input else []), "--", *extra]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, KERAS_BACKEND=engine))
    for line in result.stdout.splitlines():
        if line.startswith(STEP_REPLY):
            return json.loads(line[len(STEP_REPLY):])
    sys.exit(f"The step alone on {engine} failed:\n{result.stderr[-3000:]}")


def print_step_table(engine, results):
    def against_padding(mode, times):
        """The median of the repeats' own ratios of images/s (neighbours in time)."""
        padded = results["padded"]
        return statistics.median((results[mode]["images"] / mine) / (padded["images"] / theirs)
                                 for mine, theirs in zip(results[mode][times], padded[times]))

    for mode, result in results.items():
        seconds = statistics.median(result["seconds"])
        memory = ("-", "-", "-", "-")
        if "temp" in result:
            memory = tuple(f"{result[name] / 2**20:.1f} MB"
                           for name in ("temp", "arguments", "outputs")) + (
                f"{result['flops'] / 1e9:.2f}" if result.get("flops") else "-",)
        print(f"| {engine} | {mode} | {result['tokens']:,} | {seconds * 1000:.0f} ms | "
              f"{result['images'] / seconds:.0f} | {against_padding(mode, 'seconds'):.2f}x | "
              f"{statistics.median(result['cpu']) * 1000:.0f} ms | "
              f"{against_padding(mode, 'cpu'):.2f}x | {result['compiles']} | "
              + " | ".join(memory) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="steps of each run")
    parser.add_argument("--engines", default="tensorflow,jax", help="Keras backends to run")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of the three layouts in turn, on each engine (medians)")
    parser.add_argument("--step_only", action="store_true",
                        help="the step alone and the input alone, not the whole loop")
    parser.add_argument("--step_batches", type=int, default=10,
                        help="--step_only: cached batches of each layout (a run's steps)")
    parser.add_argument("--repeats", type=int, default=7,
                        help="--step_only: interleaved runs of each layout")
    parser.add_argument("--with_input", action="store_true",
                        help="--step_only: each step reads its live tf.data pipeline")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="--config.FIELD=VALUE for every run")
    args = parser.parse_args()
    if args.child:
        print(STEP_REPLY + json.dumps(step_figures(args.step_batches, args.repeats, args.extra,
                                                   args.with_input)))
        return
    print(machine.describe())
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.1f}")
    if args.step_only:
        print("Each step reads its live tf.data pipeline (input and step, interleaved)."
              if args.with_input else "Each step on cached batches (the step alone).")
        print("| engine | images | tokens a step | step | images/s | vs padded | CPU a step | "
              "CPU vs padded | compilations | temporaries | arguments | outputs | "
              "XLA GFLOP a step |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for engine in args.engines.split(","):
            print_step_table(engine, step_alone(engine, args.step_batches, args.repeats,
                                                args.extra, args.with_input))
    if args.step_only and not args.with_input:
        rates = input_alone(args.extra)
        print("| input alone (tf.data) | images/s | CPU an image | vs padded |")
        print("|---|---|---|---|")
        for mode, (rate, cpu) in rates.items():
            print(f"| {mode} | {rate:.0f} | {cpu:.0f} us | {rate / rates['padded'][0]:.2f}x |")
    elif not args.step_only:
        tokens = {mode: useful_tokens(mode, args.extra) for mode in MODES}
        print("| engine | images | useful tokens | trained | images/s | epoch of 60,000 | "
              "vs padded |")
        print("|---|---|---|---|---|---|---|")
        for engine in args.engines.split(","):
            rounds = [{mode: images_per_second(mode, engine, args.steps, args.extra)
                       * tokens[mode][1] for mode in MODES} for _ in range(args.rounds)]
            for mode in MODES:
                useful, trained = tokens[mode]
                rate = statistics.median(found[mode] for found in rounds)
                # Against padding: the median of the rounds' own ratios (neighbours in time),
                # and their range (a shared machine's load moves them).
                ratios = [found[mode] / found["padded"] for found in rounds]
                spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(rounds) > 1 else ""
                print(f"| {engine} | {mode} | {useful:.1%} | {trained:.1%} | {rate:.0f} | "
                      f"{60_000 / rate / 60:.1f} min | {statistics.median(ratios):.2f}x{spread} |")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""Packing against padding against square images, on the native-aspect data at equal budgets:
useful tokens per step, images per second of the whole training loop and the time an epoch
takes, on each engine.

    python benchmarks/native_packing.py                       # 60 steps each, both engines
    python benchmarks/native_packing.py --steps=200 --engines=jax

Three runs of configs/native_aspect.py per engine, the same 128 images a step, each image's budget
drawn from 16 to 64 patches (`config.native_min_patches`): "packed" (40 sequences of 128 patches),
"padded" (the same images, each padded to 64 patches: 128 sequences) and "square" (each image
squashed to 32x32, 64 patches). Useful tokens are the patches of images over the tokens the
model runs, trained the share of the step's images that found a place (the same for both
engines: one input pipeline); images per second is the median of the loop's own rate
(`metrics.jsonl`) after the compiling loop, times that share. Extra `--config.FIELD=VALUE` flags
after `--` go to every run (the test runs it on the fake data that way).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import machine  # noqa: E402

MODES = {"packed": ("packed", []), "padded": ("padded", ["--config.native_min_patches=16"]),
         "square": ("square", [])}


def useful_tokens(mode, extra, batches=20):
    """`(patches of images over tokens, images placed over images)` of `batches` training
    batches of `mode`."""
    import tensorflow as tf

    from configs import native_aspect
    from train.data import tf_pipeline
    from train.run import objectives

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
    builder = tf_pipeline.get_builder(config)
    plan = objectives.make(config, 10).native
    dataset = tf_pipeline.train_dataset_fn(builder, config, native=plan)(
        tf.distribute.InputContext())
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="steps of each run")
    parser.add_argument("--engines", default="tensorflow,jax", help="Keras backends to run")
    parser.add_argument("extra", nargs="*", help="--config.FIELD=VALUE for every run")
    args = parser.parse_args()
    print(machine.describe())
    tokens = {mode: useful_tokens(mode, args.extra) for mode in MODES}
    print("| engine | images | useful tokens | trained | images/s | epoch of 60,000 | "
          "vs padded |")
    print("|---|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        rates = {mode: images_per_second(mode, engine, args.steps, args.extra) * tokens[mode][1]
                 for mode in MODES}
        for mode, rate in rates.items():
            useful, trained = tokens[mode]
            print(f"| {engine} | {mode} | {useful:.1%} | {trained:.1%} | {rate:.0f} | "
                  f"{60_000 / rate / 60:.1f} min | {rate / rates['padded']:.2f}x |")


if __name__ == "__main__":
    main()

r"""Accuracy at aspect ratios a model did not train on: runs of configs/native_aspect.py evaluated
on Fashion-MNIST's test split at fixed aspect ratios.

    python benchmarks/native_aspect_study.py --packed=runs/native --padded=runs/padded \
        --square=runs/square --output=aspect_study.json
    python benchmarks/native_aspect_study.py --square=runs/square --examples=1000

Each test image is resampled as the runs' data resamples it (train/data/fashion_mnist.py), only
at a fixed aspect ratio, height / width (`--aspects`): `fashion_mnist_native`'s runs see it
`stretched` to that ratio at its own drawn scale, `fashion_mnist_canvas`'s see it undistorted at
its drawn scale and relative position on a canvas of that ratio (`on_canvas`); the runs given
must share their data. The training data's ratios are 1/3 to 3, so 1/6, 1/4, 4 and 6 lie outside
it. The "own" column is the runs' test split itself (each image at its drawn ratio): it repeats
each run's final evaluation. A native run ("packed", "padded") sees each image alone at its whole
budget (config.native_patches) through keras_vit.native.NaFlexViT, as its evaluation does
(train.data.tf_native.example); a square run sees each image squashed to its `image_size` by its
evaluation's resize. The model is the run's export/model.keras, or else the newest checkpoint of
a TensorFlow run (EMA weights if it kept them); nothing is written into the workdirs.

It prints a markdown table (a row per run, a column per aspect ratio, "(out)" on those outside
the training range), the best run at each ratio and each run's mean inside and outside the
range; `--output` writes the same as JSON (accuracies in [0, 1]). Measured: docs/native.md.
"""

import json
import os
import sys
import time
from fractions import Fraction

# The TensorFlow engine's checkpoints are restored and the images prepared by tf.data.
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app, flags  # noqa: E402

from machine import cpu_name  # noqa: E402
from train.console import cli  # noqa: E402  (one-line errors, quiet TensorFlow start-up)
from train.data import fashion_mnist  # noqa: E402

LAYOUTS = {"packed": "packed", "padded": "padded", "square": "none"}  # flag: config.native
for _name in LAYOUTS:
    flags.DEFINE_string(_name, None, f"Workdir of a `configs/native_aspect.py:{_name}` run.")
flags.DEFINE_list("aspects", ["1/6", "1/4", "1/2", "1", "2", "4", "6"],
                  "Fixed aspect ratios (height / width) to evaluate at, e.g. 1/6,2,4.5.")
flags.DEFINE_integer("examples", 10_000, "The first this many test images (of 10,000).")
flags.DEFINE_string("output", None, "JSON file for the results (optional).")
flags.declare_key_flag("verbose")  # defined in train/console/cli.py
FLAGS = flags.FLAGS

OWN = "own"  # the column of each image at its own drawn aspect ratio
NUM_CLASSES = len(fashion_mnist.CLASS_NAMES)
# The study's test images are theirs; a run of the plain 28x28 images takes the stretched ones.
DATASETS = (*fashion_mnist.RESAMPLED, "fashion_mnist_local")


# ----------------------------------------------------------------------------------------------
# Flags

def parse_aspect(text):
    """`(name, height / width)` of an `--aspects` item: "1/6", "4" or "0.25"."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        value = None
    if value is None or value <= 0:
        raise app.UsageError(f"--aspects: {text!r} is not a positive aspect ratio (height / "
                             "width, e.g. 1/6, 2 or 0.25).")
    return text.strip(), float(value)


def outside_training(aspect):
    """Whether `aspect` lies outside the training data's ratios (fashion_mnist.NATIVE_ASPECT)."""
    low, high = fashion_mnist.NATIVE_ASPECT
    return not low - 1e-9 <= aspect <= high + 1e-9


def checked_flags():
    """`({run: workdir}, [(name, aspect)])` of the flags, or a UsageError naming the bad one."""
    runs = {name: getattr(FLAGS, name) for name in LAYOUTS if getattr(FLAGS, name)}
    if not runs:
        raise app.UsageError("Give at least one run: --packed=DIR, --padded=DIR and/or "
                             "--square=DIR (workdirs of configs/native_aspect.py runs).")
    for name, workdir in runs.items():
        if not os.path.isfile(os.path.join(workdir, "config.json")):
            raise app.UsageError(f"--{name}={workdir} is not a training run's workdir (no "
                                 "config.json there).")
    aspects = [parse_aspect(text) for text in FLAGS.aspects]
    if not aspects:
        raise app.UsageError("--aspects is empty: give aspect ratios such as 1/6,1,6.")
    if not 1 <= FLAGS.examples <= 10_000:
        raise app.UsageError(f"--examples={FLAGS.examples} must be 1 to 10,000 (the test "
                             "split's images).")
    folder = os.path.dirname(os.path.abspath(FLAGS.output or "."))
    if FLAGS.output and not os.path.isdir(folder):  # now, not after the minutes of the study
        raise app.UsageError(f"--output={FLAGS.output}: the folder {folder} does not exist.")
    return runs, aspects


# ----------------------------------------------------------------------------------------------
# Runs

def run_config(name, workdir):
    """The run's config (its config.json), checked to be the layout its flag says, trained on
    Fashion-MNIST."""
    import ml_collections

    from train.run import run_config as saved_configs

    config = ml_collections.ConfigDict(saved_configs.saved(workdir))
    if config.dataset not in DATASETS:
        raise ValueError(f"--{name}={workdir} trained on {config.dataset!r}; the study "
                         "evaluates on Fashion-MNIST's test split: give a run of one of "
                         f"{DATASETS}.")
    layout = config.get("native", "none")
    if layout != LAYOUTS[name]:
        flag = next(flag for flag, native in LAYOUTS.items() if native == layout)
        raise ValueError(f"--{name}={workdir} is a run of config.native={layout!r}, not "
                         f"{LAYOUTS[name]!r}: give it as --{flag}={workdir}.")
    return config


def study_data(configs):
    """The dataset whose resampling the study's columns take: the runs' own, which they must
    share (`fashion_mnist_native` for runs of the plain images alone)."""
    resampled = sorted({config.dataset for config in configs.values()} & set(
        fashion_mnist.RESAMPLED))
    if len(resampled) > 1:
        named = ", ".join(f"--{name} on {config.dataset}" for name, config in configs.items())
        raise ValueError(f"The runs trained on different data ({named}): give runs of one "
                         "dataset, so that every run sees the same test images.")
    return resampled[0] if resampled else "fashion_mnist_native"


def trained_classifier(config, workdir):
    """`(the run's classic classifier, where its weights came from)`: export/model.keras, or
    the newest TensorFlow checkpoint."""
    from keras_vit import fileio
    from train.run import export, run_files

    path = run_files.model_file(workdir)
    if fileio.exists(path):
        return export.load_trained_model(path, workdir), path
    engine = run_files.checkpoint_engine(workdir)
    if engine != "tensorflow":
        found = f"its checkpoints are the {engine} engine's" if engine else "no checkpoint"
        raise ValueError(f"{workdir} has no {path}, and {found}: rerun its training command "
                         "with --config.export=True to write the model.")
    return restored_classifier(config, workdir)


def restored_classifier(config, workdir):
    """The model of the newest checkpoint in `workdir`, built and restored as the TensorFlow
    engine builds and resumes it (train.engines.tf_engine), nothing in `workdir` written."""
    import tensorflow as tf

    from train.engines import tf_checkpoints
    from train.run import config_checks, objectives, optimizers, run_files

    objective = objectives.make(config, NUM_CLASSES)
    model = objective.build()
    # The whole state the engine saves, so that every value of the checkpoint finds its
    # variable; the engine evaluates and exports the EMA weights where it kept them.
    optimizer = optimizers.build_optimizer(config_checks.section(config, optimizers.FIELDS),
                                           model)
    optimizer.build(model.trainable_variables)
    ema = [tf.Variable(v, trainable=False, name="ema") for v in model.trainable_variables
           ] if config.ema_decay else []
    directory = run_files.checkpoint_dir(workdir)
    step = tf_checkpoints.restore_newest(
        tf.train.Checkpoint(model=model, optimizer=optimizer, ema=ema), directory,
        writable=False)
    if step is None:
        raise ValueError(f"{directory} holds no checkpoint to evaluate.")
    for average, variable in zip(ema, model.trainable_variables):
        variable.assign(average)
    return objective.encoder(model), os.path.join(directory, f"ckpt-{step}")


def evaluator(config, classifier):
    """`(model, preprocess)`: what each run's evaluation feeds its model, from a uint8
    `[height, width, 3]` image and its label."""
    import tensorflow as tf

    from keras_vit import native
    from keras_vit.preprocessing import resize
    from train.data import settings, tf_native, tf_pipeline
    from train.run import objectives

    plan = objectives.make(config, NUM_CLASSES).native  # the budget, the patch size
    if plan is not None:  # each image alone, at the whole budget (NaFlex)
        return native.NaFlexViT(classifier), lambda image, label: tf_native.example(
            image, label, plan)
    size, preprocessing = (config.image_size,) * 2, settings.eval_preprocessing(config)
    return classifier, lambda image, label: {  # tf_pipeline.preprocess_eval, decoded
        "image": tf_pipeline.to_model_range(resize(image, size, preprocessing)),
        "label": tf.cast(label, tf.int32)}


# ----------------------------------------------------------------------------------------------
# Evaluation

def fashion_mnist_test(examples):
    """The first `examples` test images (uint8 [28, 28]) and labels of Fashion-MNIST."""
    images, labels = fashion_mnist.read_split("test")
    return images[:examples], labels[:examples].astype("int32")


def resampled(images, aspect, dataset):
    """Each test image as `dataset` resamples it: at its drawn aspect ratio (`aspect` None) or
    at `aspect`, at its drawn scale."""
    resample = fashion_mnist.RESAMPLED[dataset]
    return [resample(image, "test", index, aspect) for index, image in enumerate(images)]


def accuracy(step, images, labels, batch_size):
    """Top-1 accuracy on grayscale `images` of `step` (`compiled`'s)."""
    import tensorflow as tf

    predict, prepare = step
    dataset = tf.data.Dataset.from_generator(
        lambda: zip(images, labels), output_signature=(
            tf.TensorSpec([None, None], tf.uint8), tf.TensorSpec([], tf.int32)))
    dataset = dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    correct = sum(int(predict(batch)) for batch in
                  dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE))
    return correct / len(images)


def compiled(model, preprocess, config):
    """`(predict, prepare)`: a batch's count of right answers, compiled as the run's steps
    were (config.jit_compile); a grayscale image and its label as `preprocess` prepares them,
    traced once for all the columns."""
    import tensorflow as tf

    @tf.function(jit_compile=config.jit_compile, reduce_retracing=True, autograph=False)
    def predict(batch):
        inputs = dict(batch)
        label = inputs.pop("label")
        inputs = inputs.get("image", inputs)  # square images, or NaFlex's arrays
        predicted = tf.argmax(model(inputs, training=False), -1, output_type=tf.int32)
        return tf.reduce_sum(tf.cast(predicted == label, tf.int32))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.uint8),
                                  tf.TensorSpec([], tf.int32)], autograph=False)
    def prepare(image, label):
        # Three equal channels, as decode_image gives the dataset's grayscale PNGs.
        return preprocess(tf.image.grayscale_to_rgb(image[..., None]), label)

    return predict, prepare


# ----------------------------------------------------------------------------------------------
# Report

def header(name, aspect):
    return f"{name} (out)" if aspect is not None and outside_training(aspect) else name


def table(results, columns):
    """The markdown table: a row per run, a column per aspect ratio."""
    names = [header(name, aspect) for name, aspect in columns]
    lines = ["| run | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for run, accuracies in results.items():
        lines.append(f"| {run} | " + " | ".join(f"{accuracies[name]:.2%}"
                                              for name, _ in columns) + " |")
    return lines


def best(results, column):
    """The run with the highest accuracy at `column`, or the tied runs ("a = b")."""
    top = max(results[run][column] for run in results)
    return " = ".join(run for run in results if results[run][column] == top)


def verdict(results, columns):
    """Which run wins at each aspect ratio, and the mean accuracy inside and outside the
    training range: the study's answer, whichever way it goes."""
    lines = ["Best: " + ", ".join(f"{name} {best(results, name)}" for name, _ in columns)]
    for where, outside in (("inside", False), ("outside", True)):
        chosen = [name for name, aspect in columns
                  if aspect is not None and outside_training(aspect) == outside]
        if chosen:
            means = {run: sum(results[run][name] for name in chosen) / len(chosen)
                     for run in results}
            ranked = sorted(means, key=means.get, reverse=True)
            lines.append(f"Mean {where} the training range ({', '.join(chosen)}): " + ", ".join(
                f"{run} {means[run]:.2%}" for run in ranked))
    return lines


def tf_version():
    import tensorflow as tf

    return tf.__version__


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}: every option is a flag.")
    runs, aspects = checked_flags()
    start = time.perf_counter()
    configs = {name: run_config(name, workdir) for name, workdir in runs.items()}
    dataset = study_data(configs)
    steps, sources = {}, {}
    for name, config in configs.items():
        classifier, sources[name] = trained_classifier(config, runs[name])
        steps[name] = compiled(*evaluator(config, classifier), config)
    images, labels = fashion_mnist_test(FLAGS.examples)
    columns = [(OWN, None)] + aspects
    results = {name: {} for name in runs}
    for column, aspect in columns:
        column_images = resampled(images, aspect, dataset)  # once for every run
        for name, step in steps.items():
            batch = min(configs[name].eval_batch_size, len(images))
            results[name][column] = accuracy(step, column_images, labels, batch)
        print(f"{column}: " + ", ".join(f"{name} {results[name][column]:.2%}" for name in runs)
              + f" ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)  # progress
    seconds = time.perf_counter() - start
    low, high = fashion_mnist.NATIVE_ASPECT
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; TensorFlow {tf_version()}")
    for name in runs:
        print(f"{name}: {sources[name]} (config.native_patches="
              f"{configs[name].native_patches}, image_size {configs[name].image_size})")
    print(f"\n{len(images):,} Fashion-MNIST test images as {dataset} makes them; aspect ratio "
          f"= height / width; (out): outside the training data's "
          f"{Fraction(low).limit_denominator()} to {high:g}; {OWN}: each image at its own drawn "
          f"ratio ({dataset}'s test split).\n")
    print("\n".join(table(results, columns)))
    print("\n" + "\n".join(verdict(results, columns)))
    print(f"Wall time: {seconds:.0f} s")
    if FLAGS.output:
        write_json(FLAGS.output, runs, sources, columns, results, len(images), seconds, dataset)


def write_json(path, runs, sources, columns, results, examples, seconds, dataset):
    report = {
        "cpu": cpu_name(), "cores": os.cpu_count(), "examples": examples, "dataset": dataset,
        "training_aspects": list(fashion_mnist.NATIVE_ASPECT),
        "columns": [{"name": name, "aspect": aspect,
                     "outside_training": aspect is not None and outside_training(aspect)}
                    for name, aspect in columns],
        "runs": {name: {"workdir": runs[name], "weights": sources[name],
                        "accuracy": results[name]} for name in runs},
        "seconds": round(seconds, 1)}
    with open(path, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"Wrote {path}")


if __name__ == "__main__":
    cli.run(main)

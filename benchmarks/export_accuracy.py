"""Accuracy and speed of a trained model in Keras, of every TFLite kind of it, and with the "onnx"
extra of its ONNX files (float32, int8) in ONNX Runtime and OpenVINO, on its whole evaluation
split: top-1, top-1 agreement with the Keras model (`model.predict`), the largest logit
difference, size, batch-1 latency and batched throughput (Keras: its call compiled by XLA;
LiteRT on XNNPack).

    python -m train.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart
    python benchmarks/export_accuracy.py --workdir=/tmp/vit_quickstart --threads=2

The files are converted afresh from `<workdir>/export/model.keras` with keras_vit's exporter,
int8 calibrated on the same training images as the driver's export. Latencies are the median
of `--repeats` single-image runs, interleaved over the kinds (runners shared with
export_latency.py: benchmarks/runtimes.py).
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import machine  # noqa: E402
import runtimes  # noqa: E402
from litert_runner import tflite_runner  # noqa: E402
from keras_vit.deploy import export  # noqa: E402
from keras_vit.preprocessing import scale_pixels  # noqa: E402
from train.data import tf_pipeline  # noqa: E402
from train.run import run_config, run_files  # noqa: E402
from train.run import export as run_export  # noqa: E402  (a run's export; keras_vit's is `export`)


def evaluation_split(builder, config):
    """All of the eval split: images in 0..255 at the model's size, and labels."""
    count = builder.info.splits[config.eval_split].num_examples
    examples = tf_pipeline.resized_examples(
        builder, config.eval_split, (config.image_size, config.image_size), count)
    images, labels = zip(*examples.as_numpy_iterator())
    return np.stack(images).astype(np.float32), np.array(labels)


def logits_of(content, images, batch, threads):
    run = tflite_runner(content, batch, threads)
    whole = len(images) // batch * batch
    parts = [run(images[start:start + batch]) for start in range(0, whole, batch)]
    if whole < len(images):
        parts.append(tflite_runner(content, len(images) - whole, threads)(images[whole:]))
    return np.concatenate(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="a train.main workdir with export/")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=500, help="for throughput")
    parser.add_argument("--repeats", type=int, default=300, help="batch-1 runs per kind")
    parser.add_argument("--calibration_images", type=int, default=200)
    args = parser.parse_args()
    config = ml_collections.ConfigDict(run_config.saved(args.workdir))
    model = run_export.load_trained_model(run_files.model_file(args.workdir), args.workdir)
    builder = tf_pipeline.get_builder(config, for_training=False)
    images, labels = evaluation_split(builder, config)
    calibration = run_export.calibration_images(builder, config.train_split, config.image_size,
                                                args.calibration_images)
    reference = model.predict(scale_pixels(images), batch_size=1000, verbose=0)
    print(machine.describe())
    print(f"{config.model.variant} at {config.image_size}px, {len(images)} {config.eval_split} "
          f"images, {args.threads} threads, TF {tf.__version__}, {runtimes.versions()}, "
          f"load average {os.getloadavg()[0]:.1f} at the start\n")
    print("| format | size MB | top-1 % | agreement with Keras % | max logit difference | "
          f"batch-1 ms | batch-{args.batch_size} images/s |")
    print("|---|---|---|---|---|---|---|")
    # {format: (size in bytes or None, run on one image, logits of all the images)}
    keras_run = runtimes.keras_runner(model)
    notes = []  # what could not be timed
    formats = {"Keras (XLA-compiled call)": (
        None, keras_run, lambda: batched(keras_run, images, args.batch_size))}
    for kind, quantization in run_export.TFLITE_KINDS.items():
        content = export.tflite_bytes(model, quantization, calibration)
        formats[f"TFLite {kind}"] = (
            len(content), tflite_runner(content, 1, args.threads),
            lambda content=content: logits_of(content, images, args.batch_size, args.threads))
    if runtimes.onnx_available():
        with tempfile.TemporaryDirectory() as folder:
            for kind, quantization in run_export.ONNX_KINDS.items():
                path = os.path.join(folder, f"model_{kind}.onnx")
                export.export_onnx(model, path, quantization=quantization,
                                   representative_data=calibration)
                size = os.path.getsize(path)
                runs = {"ONNX Runtime": runtimes.onnx_runtime_runner(path, args.threads)}
                if runtimes.openvino_available():  # compiled here, while the file exists
                    run, why = runtimes.openvino_runner_or_why(path, args.threads)
                    if run is None:
                        notes.append(f"OpenVINO {kind}: {why}")
                    else:
                        runs["OpenVINO"] = run
                for runtime, run in runs.items():
                    formats[f"{runtime} {kind}"] = (
                        size, run, lambda run=run: batched(run, images, args.batch_size))
    latencies = runtimes.interleaved_medians(  # a test image after another, each round
        {name: run for name, (_, run, _) in formats.items()},
        [image[None] for image in images[:args.repeats]], args.repeats)
    for name, (size, _, run_all) in formats.items():
        start = time.perf_counter()
        logits = run_all()
        throughput = len(images) / (time.perf_counter() - start)
        agree, difference = runtimes.agreement(logits, reference)
        size = "–" if size is None else f"{size / 2**20:.2f}"
        print(f"| {name} | {size} | {np.mean(logits.argmax(1) == labels) * 100:.2f} | "
              f"{agree:.2f} | {difference:.3f} | {latencies[name] * 1000:.3f} | "
              f"{throughput:.0f} |", flush=True)
    for note in notes:
        print(f"\n{note}")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


def batched(run, images, batch):
    """run(...) on `images` in batches of `batch` (the last one smaller), concatenated."""
    return np.concatenate([run(images[start:start + batch])
                           for start in range(0, len(images), batch)])


if __name__ == "__main__":
    main()

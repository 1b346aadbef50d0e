"""Accuracy and speed of every TFLite kind of a trained model, and with the "onnx" extra of its
ONNX files (float32, int8) in ONNX Runtime, on its whole evaluation split: top-1, top-1
agreement with the Keras model, the largest logit difference, size, batch-1 latency and batched
throughput in LiteRT (XNNPack) and ONNX Runtime.

    python -m train.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart
    python benchmarks/export_accuracy.py --workdir=/tmp/vit_quickstart --threads=2

The files are converted afresh from `<workdir>/export/model.keras` with keras_vit's exporter,
int8 calibrated on the same training images as the driver's export. Latencies are the median
of `--repeats` single-image runs, interleaved over the kinds.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import machine  # noqa: E402
from litert_runner import tflite_runner  # noqa: E402
from keras_vit.deploy import export  # noqa: E402
from keras_vit.preprocessing import scale_pixels  # noqa: E402
from train.data import tf_pipeline
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
          f"images, LiteRT threads {args.threads}, TF {tf.__version__}\n")
    print("| format | size MB | top-1 % | agreement with Keras % | max logit difference | "
          f"batch-1 ms | batch-{args.batch_size} images/s |")
    print("|---|---|---|---|---|---|---|")
    print(f"| Keras | – | {np.mean(reference.argmax(1) == labels) * 100:.2f} | – | – | – | – |")
    # {format: (size in bytes, run on one image, logits of all the images)}
    formats = {}
    for kind, quantization in run_export.TFLITE_KINDS.items():
        content = export.tflite_bytes(model, quantization, calibration)
        formats[f"TFLite {kind}"] = (
            len(content), tflite_runner(content, 1, args.threads),
            lambda content=content: logits_of(content, images, args.batch_size, args.threads))
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("tf2onnx"):
        for kind, quantization in run_export.ONNX_KINDS.items():
            formats[f"ONNX Runtime {kind}"] = onnx_runner(model, quantization, calibration,
                                                          images, args)
    latencies = {name: [] for name in formats}
    for _, run, _ in formats.values():  # warm up
        run(images[:1])
    for index in range(args.repeats):  # interleaved: drifts in machine load hit every kind
        for name, (_, run, _) in formats.items():
            start = time.perf_counter()
            run(images[index % len(images)][None])
            latencies[name].append(time.perf_counter() - start)
    for name, (size, _, run_all) in formats.items():
        start = time.perf_counter()
        logits = run_all()
        throughput = len(images) / (time.perf_counter() - start)
        predictions = logits.argmax(1)
        print(f"| {name} | {size / 2**20:.2f} | "
              f"{np.mean(predictions == labels) * 100:.2f} | "
              f"{np.mean(predictions == reference.argmax(1)) * 100:.2f} | "
              f"{np.abs(logits - reference).max():.3f} | "
              f"{statistics.median(latencies[name]) * 1000:.3f} | {throughput:.0f} |", flush=True)


def onnx_runner(model, quantization, calibration, images, args):
    """(size, run on one image, logits of all `images`) of the model's ONNX file in ONNX
    Runtime, on `args.threads` threads; the file takes the model's own input (no resize)."""
    import tempfile

    import onnxruntime

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.onnx")
        export.export_onnx(model, path, quantization=quantization,
                           representative_data=calibration)
        with open(path, "rb") as handle:
            content = handle.read()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    session = onnxruntime.InferenceSession(content, options, providers=["CPUExecutionProvider"])

    def run(batch):
        return session.run(None, {"images": scale_pixels(batch)})[0]

    def run_all():
        return np.concatenate([run(images[start:start + args.batch_size])
                               for start in range(0, len(images), args.batch_size)])

    return len(content), run, run_all


if __name__ == "__main__":
    main()

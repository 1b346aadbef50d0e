"""Latency and throughput of the exported models: the SavedModel's `serving_images` signature,
each TFLite variant in LiteRT (XNNPack), and with the "onnx" extra the ONNX file in ONNX Runtime
(float32 and int8) and in OpenVINO (when installed), for a variant at one image size.

    python benchmarks/export_latency.py --variant=Ti/16 --variant=B/16 --threads=2

The variant's fields can be changed (`--hidden_size`, `--num_layers`, ...), to time the
model you will deploy, e.g. the quickstart's architecture:

    python benchmarks/export_latency.py --variant=R+Ti/16 --image_size=32 --patch_size=2 \
        --hidden_size=64 --mlp_dim=128 --num_heads=4 --num_layers=4 --num_classes=10 \
        --repeats=1000

Batch-1 latency (median of repeats) and batch-32 throughput; model sizes on disk. Weights are
random (latency does not depend on their values); int8 calibrates on random images. The ONNX
files take the model's own input (images scaled to [-1, 1], as `export_onnx(preprocess=None)`
writes them), the TFLite files pixels they scale: the same model either way, no resize.
"""

import argparse
import importlib
import importlib.util
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
import machine  # noqa: E402
from litert_runner import tflite_runner  # noqa: E402
from keras_vit.deploy import export  # noqa: E402
from keras_vit.architecture.spec import TABLE_FIELDS, ViTConfig  # noqa: E402


def median_seconds(function, repeats):
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def directory_size(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def measure(model, image_size, batch, threads, repeats, workdir):
    rng = np.random.default_rng(0)
    one = rng.uniform(0, 255, (1, image_size, image_size, 3)).astype(np.float32)
    many = rng.uniform(0, 255, (batch, image_size, image_size, 3)).astype(np.float32)
    rows = []
    saved = export.export_saved_model(model, os.path.join(workdir, "saved_model"))
    signature = tf.saved_model.load(saved).signatures["serving_images"]
    latency = median_seconds(lambda: signature(images=tf.constant(one)), repeats)
    throughput = batch / median_seconds(lambda: signature(images=tf.constant(many)), repeats)
    rows.append(("SavedModel (TF)", directory_size(saved), latency, throughput))
    calibration = rng.uniform(0, 255, (8, image_size, image_size, 3)).astype(np.float32)
    for quantization in export.QUANTIZATIONS:
        path = os.path.join(workdir, f"{quantization}.tflite")
        export.export_tflite(model, path, quantization, representative_data=calibration)
        run_one = tflite_runner(path, 1, threads)
        run_many = tflite_runner(path, batch, threads)
        latency = median_seconds(lambda: run_one(one), repeats)
        throughput = batch / median_seconds(lambda: run_many(many), repeats)
        name = "float32" if quantization == "none" else quantization
        rows.append((f"TFLite {name}", os.path.getsize(path), latency, throughput))
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("tf2onnx"):
        rows += onnx_rows(model, one, many, calibration, threads, repeats, workdir)
    return rows


def onnx_rows(model, one, many, calibration, threads, repeats, workdir):
    """ONNX Runtime (float32, int8) and OpenVINO (float32) rows, on `threads` threads."""
    import onnxruntime

    from keras_vit.preprocessing import scale_pixels

    one, many = scale_pixels(one), scale_pixels(many)  # the files' input, `images`
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    rows, paths = [], {}
    for quantization in ("none", "int8"):
        paths[quantization] = path = os.path.join(workdir, f"{quantization}.onnx")
        export.export_onnx(model, path, quantization=quantization,
                           representative_data=calibration)
        session = onnxruntime.InferenceSession(path, options,
                                               providers=["CPUExecutionProvider"])
        latency = median_seconds(lambda: session.run(None, {"images": one}), repeats)
        throughput = len(many) / median_seconds(lambda: session.run(None, {"images": many}),
                                                repeats)
        name = "float32" if quantization == "none" else quantization
        rows.append((f"ONNX Runtime {name}", os.path.getsize(path), latency, throughput))
    if importlib.util.find_spec("openvino"):
        import openvino

        core = openvino.Core()
        compiled = core.compile_model(core.read_model(paths["none"]), "CPU",
                                      {"INFERENCE_NUM_THREADS": threads})
        latency = median_seconds(lambda: compiled(one), repeats)
        throughput = len(many) / median_seconds(lambda: compiled(many), repeats)
        rows.append(("OpenVINO float32", os.path.getsize(paths["none"]), latency, throughput))
    return rows


def runtimes():
    """The versions of the runtimes that time the ONNX files, or why there are none."""
    found = []
    for name in ("onnxruntime", "openvino"):
        if importlib.util.find_spec(name):
            found.append(f"{name} {importlib.import_module(name).__version__}")
    return ", ".join(found) or 'no ONNX rows (pip install "keras_vit[onnx]")'


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", help="repeat for several (default Ti/16)")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num_classes", type=int, default=1000)
    for field in TABLE_FIELDS:
        parser.add_argument(f"--{field}", type=int, help="instead of the variant's")
    args = parser.parse_args()
    overrides = {field: getattr(args, field) for field in TABLE_FIELDS
                 if getattr(args, field) is not None}
    print(machine.describe())
    print(f"{args.image_size}px, {args.num_classes} classes, {overrides or 'no overrides'}, "
          f"{args.threads} threads, TF {tf.__version__}, {runtimes()}, median of "
          f"{args.repeats}\n")
    print(f"| variant | format | size MB | batch-1 latency ms | batch-{args.batch_size} images/s |")
    print("|---|---|---|---|---|")
    for variant in args.variant or ["Ti/16"]:
        model = keras_vit.vit(ViTConfig.from_variant(
            variant, image_size=args.image_size, num_classes=args.num_classes, **overrides))
        with tempfile.TemporaryDirectory() as workdir:
            for name, size, latency, throughput in measure(
                    model, args.image_size, args.batch_size, args.threads, args.repeats,
                    workdir):
                print(f"| {variant} | {name} | {size / 2**20:.2f} | {latency * 1000:.3f} | "
                      f"{throughput:.1f} |", flush=True)


if __name__ == "__main__":
    main()

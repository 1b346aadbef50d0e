"""Latency and throughput of a model in every runtime it leaves for, timed interleaved in one
process: the Keras model itself (its call compiled by XLA), the SavedModel's `serving_images`
signature, each TFLite variant in LiteRT (XNNPack), and with the "onnx" extra the ONNX file in
ONNX Runtime (float32 and int8) and in OpenVINO (the same two files), for a variant at one image
size; beside each, its agreement with Keras.

    python benchmarks/export_latency.py --variant=Ti/16 --variant=B/16 --threads=2

(`--separate_processes` writes each file in a process of its own: the converters keep memory
they do not give back, and B/16's files written in one process outgrow a 24 GB machine.)

The variant's fields can be changed (`--hidden_size`, `--num_layers`, ...), to time the
model you will deploy, e.g. the quickstart's architecture:

    python benchmarks/export_latency.py --variant=R+Ti/16 --image_size=32 --patch_size=2 \
        --hidden_size=64 --mlp_dim=128 --num_heads=4 --num_layers=4 --num_classes=10 \
        --repeats=1000

Batch-1 latency (median of `--repeats` rounds, each round timing every runtime once) and
batch-32 throughput (the same, `--batch_repeats` rounds; runtimes.interleaved_medians: each
runtime runs twice a round, the second timed); model sizes on disk. With
`--tf2onnx_graph`, the float32 ONNX file as tf2onnx writes it too (`onnx_model(rewrite=False)`:
each LayerNorm as separate ops, reshapes computed from shapes), timed in the same rounds, and
both files' op counts. Weights are the initial ones plus
N(0, 0.02) noise: latency does not depend on their values, but zero biases would be folded away
by the converters (a lighter graph than a trained model's) and a zero head would make every
logit equal. "Agreement with Keras" is on the batch's random images: top-1 agreement and the
largest logit difference (for accuracy on real images: export_accuracy.py). int8 calibrates on
random images. The ONNX files take the model's own input (images scaled to [-1, 1], as
`export_onnx(preprocess=None)` writes them), the TFLite files pixels they scale: the same model
either way, no resize.
"""

import argparse
import collections
import multiprocessing
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
import machine  # noqa: E402
import runtimes  # noqa: E402
from litert_runner import tflite_runner  # noqa: E402
from keras_vit.deploy import export, onnx_export  # noqa: E402
from keras_vit.architecture.spec import TABLE_FIELDS, ViTConfig  # noqa: E402


def directory_size(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def perturbed(model, seed=0, scale=0.02):
    """`model` with N(0, scale) noise added to every weight (module docstring)."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = np.asarray(variable)
        variable.assign((value + rng.normal(0, scale, value.shape)).astype(value.dtype))
    return model


def _write(model, kind, path, quantization, calibration):
    """Writes one file of `model` at `path`: kind "saved_model" (version 1 below `path`),
    "tflite", "onnx", or "tf2onnx" (the float32 ONNX file without keras_vit's rewrites)."""
    if kind == "saved_model":
        export.export_saved_model(model, path, version=1)
    elif kind == "tflite":
        export.export_tflite(model, path, quantization, representative_data=calibration)
    elif kind == "onnx":
        export.export_onnx(model, path, quantization=quantization,
                           representative_data=calibration)
    else:
        with open(path, "wb") as handle:
            handle.write(onnx_export.onnx_model(model, rewrite=False).SerializeToString())


def _write_in_child(model_path, kind, path, quantization, calibration_path):
    import keras
    _write(keras.saving.load_model(model_path), kind, path, quantization,
           np.load(calibration_path))


def writer(model, workdir, calibration, separate_processes):
    """A function (kind, path, quantization) that writes one file of `model` (`_write`): in
    this process, or with `separate_processes` each in a process of its own that loads the
    model from a .keras file, so that the memory the converters keep is returned after each
    file (B/16's files, written in one process, outgrow a 24 GB machine)."""
    if not separate_processes:
        return lambda kind, path, quantization="none": _write(
            model, kind, path, quantization, calibration)
    model_path = os.path.join(workdir, "model.keras")
    calibration_path = os.path.join(workdir, "calibration.npy")
    model.save(model_path)
    np.save(calibration_path, calibration)
    context = multiprocessing.get_context("spawn")

    def write(kind, path, quantization="none"):
        process = context.Process(target=_write_in_child,
                                  args=(model_path, kind, path, quantization, calibration_path))
        process.start()
        process.join()
        if process.exitcode:
            raise SystemExit(f"Writing {os.path.basename(path)} in its own process failed "
                             f"(exit code {process.exitcode}; -9 is a kill, as the kernel's "
                             "when memory runs out).")
    return write


def runners(model, image_size, batch, threads, workdir, notes, tf2onnx_graph=False,
            separate_processes=False):
    """{format: (size in bytes, runner for one image, runner for `batch`)}, every runner taking
    float32 pixels in 0..255 and returning logits; lines to print after the table in `notes`."""
    rng = np.random.default_rng(1)
    calibration = rng.uniform(0, 255, (8, image_size, image_size, 3)).astype(np.float32)
    write = writer(model, workdir, calibration, separate_processes)
    keras_run = runtimes.keras_runner(model)
    formats = {"Keras (XLA-compiled call)": (None, keras_run, keras_run)}
    write("saved_model", os.path.join(workdir, "saved_model"))
    saved = os.path.join(workdir, "saved_model", "1")
    signature = tf.saved_model.load(saved).signatures["serving_images"]

    def saved_run(pixels):
        return signature(images=tf.constant(pixels))["logits"].numpy()

    formats["SavedModel (TF)"] = (directory_size(saved), saved_run, saved_run)
    for quantization in export.QUANTIZATIONS:
        path = os.path.join(workdir, f"{quantization}.tflite")
        write("tflite", path, quantization)
        name = "float32" if quantization == "none" else quantization
        formats[f"TFLite {name}"] = (os.path.getsize(path), tflite_runner(path, 1, threads),
                                     tflite_runner(path, batch, threads))
    if not runtimes.onnx_available():
        return formats
    paths = {}
    for name, quantization in (("float32", "none"), ("int8", "int8")):
        paths[name] = path = os.path.join(workdir, f"{quantization}.onnx")
        write("onnx", path, quantization)
        run = runtimes.onnx_runtime_runner(path, threads)
        formats[f"ONNX Runtime {name}"] = (os.path.getsize(path), run, run)
    if tf2onnx_graph:
        paths["float32, tf2onnx's graph"] = path = os.path.join(workdir, "tf2onnx.onnx")
        write("tf2onnx", path)
        run = runtimes.onnx_runtime_runner(path, threads)
        formats["ONNX Runtime float32, tf2onnx's graph"] = (os.path.getsize(path), run, run)
        notes += op_counts({name: paths[name] for name in ("float32, tf2onnx's graph",
                                                           "float32")})
    if runtimes.openvino_available():
        for name, path in paths.items():  # OpenVINO runs the int8 file's QDQ ops in int8
            run, why = runtimes.openvino_runner_or_why(path, threads)
            if run is None:  # a file it cannot compile: said, not timed
                notes.append(f"OpenVINO {name}: {why}")
                continue
            formats[f"OpenVINO {name}"] = (os.path.getsize(path), run, run)
    return formats


def op_counts(paths):
    """Lines: the ops of each ONNX file, as written and as ONNX Runtime runs them after its
    own fusions at load (its default level)."""
    import onnx
    import onnxruntime

    lines = []
    for name, path in paths.items():
        options = onnxruntime.SessionOptions()
        options.optimized_model_filepath = path + ".loaded.onnx"
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        for when, file in (("written", path), ("as ONNX Runtime runs it", path + ".loaded.onnx")):
            counts = collections.Counter(node.op_type for node in onnx.load(file).graph.node)
            lines.append(f"{name}, {when}: {sum(counts.values())} ops: " + ", ".join(
                f"{op} {count}" for op, count in counts.most_common()))
    return lines


def measure(model, image_size, batch, threads, repeats, workdir, batch_repeats=None,
            tf2onnx_graph=False, separate_processes=False):
    """[(format, size in bytes or None, batch-1 seconds, batch images/s, top-1 agreement with
    Keras %, largest logit difference)], [lines to print after the table]."""
    rng = np.random.default_rng(0)
    one = rng.uniform(0, 255, (1, image_size, image_size, 3)).astype(np.float32)
    many = rng.uniform(0, 255, (batch, image_size, image_size, 3)).astype(np.float32)
    notes = []
    formats = runners(model, image_size, batch, threads, workdir, notes, tf2onnx_graph,
                      separate_processes)
    latency = runtimes.interleaved_medians(
        {name: run for name, (_, run, _) in formats.items()}, [one], repeats)
    seconds = runtimes.interleaved_medians(
        {name: run for name, (_, _, run) in formats.items()}, [many], batch_repeats or repeats)
    reference = formats["Keras (XLA-compiled call)"][2](many)
    # Random weights on random images: logits close together, where int8's top-1 flips easily
    notes.append(f"Keras' largest |logit| on the batch {np.abs(reference).max():.3g}, its "
                 f"top-2 margin {np.median(np.diff(np.sort(reference)[:, -2:])):.2g} (median)")
    rows = []
    for name, (size, _, run) in formats.items():
        rows.append((name, size, latency[name], batch / seconds[name],
                     *runtimes.agreement(run(many), reference)))
    return rows, notes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", help="repeat for several (default Ti/16)")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="batch-1 rounds")
    parser.add_argument("--batch_repeats", type=int, help="batch rounds (default --repeats)")
    parser.add_argument("--tf2onnx_graph", action="store_true",
                        help="also time the ONNX file without keras_vit's rewrites")
    parser.add_argument("--separate_processes", action="store_true",
                        help="write each file in a process of its own (B/16 on 24 GB)")
    parser.add_argument("--num_classes", type=int, default=1000)
    for field in TABLE_FIELDS:
        parser.add_argument(f"--{field}", type=int, help="instead of the variant's")
    args = parser.parse_args()
    args.batch_repeats = args.batch_repeats or args.repeats
    for name in ("batch_size", "threads", "repeats", "batch_repeats", "image_size",
                 "num_classes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    overrides = {field: getattr(args, field) for field in TABLE_FIELDS
                 if getattr(args, field) is not None}
    print(machine.describe())
    print(f"{args.image_size}px, {args.num_classes} classes, {overrides or 'no overrides'}, "
          f"{args.threads} threads, TF {tf.__version__}, {runtimes.versions()}, median of "
          f"{args.repeats} (batch 1) and {args.batch_repeats} (batch {args.batch_size}) "
          f"interleaved rounds, load average {os.getloadavg()[0]:.1f} at the "
          "start\n")
    print(f"| variant | format | size MB | batch-1 latency ms | batch-{args.batch_size} images/s "
          f"| top-1 agreement with Keras % | max logit difference |")
    print("|---|---|---|---|---|---|---|")
    notes = []
    for variant in args.variant or ["Ti/16"]:
        model = perturbed(keras_vit.vit(ViTConfig.from_variant(
            variant, image_size=args.image_size, num_classes=args.num_classes, **overrides)))
        with tempfile.TemporaryDirectory() as workdir:
            rows, variant_notes = measure(model, args.image_size, args.batch_size, args.threads,
                                          args.repeats, workdir, args.batch_repeats,
                                          args.tf2onnx_graph, args.separate_processes)
            notes += [f"{variant}: {line}" for line in variant_notes]
            for name, size, latency, throughput, agree, difference in rows:
                size = "–" if size is None else f"{size / 2**20:.2f}"
                print(f"| {variant} | {name} | {size} | {latency * 1000:.3f} | "
                      f"{throughput:.1f} | {agree:.1f} | {difference:.2g} |", flush=True)
    print("", *notes, f"load average {os.getloadavg()[0]:.1f} at the end", sep="\n")


if __name__ == "__main__":
    main()

"""What export_latency.py and export_accuracy.py share: a runner per runtime (Keras, ONNX
Runtime, OpenVINO; LiteRT's is litert_runner.py), each `run(pixels) -> logits` on float32
pixels [N, H, W, 3] in 0..255, their timing interleaved, and the agreement with Keras."""

import importlib
import importlib.util
import statistics
import time

import numpy as np

from keras_vit.preprocessing import scale_pixels


def onnx_available():
    return bool(importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("tf2onnx"))


def openvino_available():
    return onnx_available() and bool(importlib.util.find_spec("openvino"))


def versions():
    """The runtimes' versions, or why the ONNX rows are missing."""
    found = []
    for name in ("ai_edge_litert", "onnxruntime", "openvino"):
        if importlib.util.find_spec(name):
            module = importlib.import_module(name)
            found.append(f"{name} {getattr(module, '__version__', '?')}")
    if not onnx_available():
        found.append('no ONNX rows (pip install "keras_vit[onnx]")')
    return ", ".join(found)


def keras_runner(model):
    """The Keras model's own call, traced once per batch shape and compiled by XLA (as
    `model.predict` runs it with jit_compile, without its per-call overhead)."""
    import tensorflow as tf

    call = tf.function(lambda images: model(images, training=False), jit_compile=True)

    def run(pixels):
        return np.asarray(call(tf.constant(scale_pixels(pixels))))

    return run


def onnx_runtime_runner(model_file, threads):
    """ONNX Runtime (CPU, `threads` intra-op threads) on an ONNX file (path or bytes) that takes
    the model's own input, `images` scaled to [-1, 1] (export_onnx(preprocess=None))."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(model_file, options,
                                           providers=["CPUExecutionProvider"])

    def run(pixels):
        return session.run(None, {"images": scale_pixels(pixels)})[0]

    return run


def openvino_runner(path, threads):
    """OpenVINO's CPU plugin on the same ONNX file, read as it is (`read_model`), latency hint:
    one inference at a time, as the batch-1 rows measure. In float32: on a CPU with bfloat16
    instructions (AMX, AVX-512 BF16) the plugin otherwise computes in bfloat16
    (`INFERENCE_PRECISION_HINT`'s default there), which moved logits by 1e-3 of the largest."""
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU",
                                  {"INFERENCE_NUM_THREADS": threads,
                                   "PERFORMANCE_HINT": "LATENCY",
                                   "INFERENCE_PRECISION_HINT": "f32"})
    output = compiled.output(0)

    def run(pixels):
        return compiled(scale_pixels(pixels))[output]

    return run


def openvino_runner_or_why(path, threads):
    """(`openvino_runner`, None), or (None, why) for a file OpenVINO cannot compile (2026.4's
    low-precision ReshapeTransformation fails on some int8 QDQ files, e.g. Ti/16's): the
    benchmarks say so under their table instead of stopping."""
    try:
        return openvino_runner(path, threads), None
    except RuntimeError as error:
        reason = [line for line in str(error).splitlines() if line.strip()]
        return None, f"compile_model failed: {reason[-1][:200]}"


def interleaved_medians(runs, inputs, repeats):
    """{name: median seconds of a run} over `repeats` rounds, each round running every runner
    (so that a change in the machine's load hits all of them) on the round's input, the next of
    the list `inputs` (cycled). Each runner runs twice in a row and the second run is timed: the
    runtimes' thread pools spin a while after a run (ONNX Runtime's, OpenVINO's), and on a
    machine of 2 shared cores that slowed whichever runner came next by up to 2x."""
    times = {name: [] for name in runs}
    for index in range(repeats):
        for name, run in runs.items():
            run(inputs[index % len(inputs)])
            start = time.perf_counter()
            run(inputs[index % len(inputs)])
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def agreement(logits, reference):
    """(top-1 agreement in %, largest absolute logit difference) with the reference's."""
    logits, reference = np.asarray(logits), np.asarray(reference)
    return (float(np.mean(logits.argmax(-1) == reference.argmax(-1)) * 100),
            float(np.abs(logits - reference).max()))

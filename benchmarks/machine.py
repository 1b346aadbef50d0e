"""What every benchmark prints first: the CPU it ran on and that CPU's measured matmul peak, so
that numbers from different machines are never compared as if they were one; and what the
benchmarks that time compiled steps count beside them, XLA's compilations on JAX."""

import os
import statistics
import time

# The side of the square matmul whose speed is the peak. The tests, which run benchmarks to see
# that they work and not what they measure, set BENCHMARK_PEAK_SIZE small: six 4096^3 matmuls
# take 20 s of CPU on 2 cores, more than the rest of a small benchmark.
PEAK_SIZE = int(os.environ.get("BENCHMARK_PEAK_SIZE", "4096"))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def matmul_peak(compute_dtype="float32", size=None, repeats=5, library="tensorflow"):
    """FLOP/s of a `size`^3 matmul (default PEAK_SIZE) in `compute_dtype`, median of `repeats`,
    by TensorFlow or by JAX (`library="jax"`: XLA's CPU matmul, which the JAX contenders' steps
    run on)."""
    size = size or PEAK_SIZE
    if library == "jax":
        import jax

        a = jax.random.normal(jax.random.key(0), (size, size)).astype(compute_dtype)
        matmul = jax.jit(lambda x: x @ x)

        def run():
            matmul(a).block_until_ready()
    else:
        import tensorflow as tf

        a = tf.cast(tf.random.normal((size, size), dtype=tf.float32), compute_dtype)
        matmul = tf.function(lambda x: tf.matmul(x, x))

        def run():
            matmul(a).numpy()
    return 2 * size**3 / statistics.median(run_times(run, repeats))


def run_times(run, repeats):
    """Seconds of each of `repeats` calls of `run`, after one untimed call (it compiles)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def describe(dtypes=("float32",)):
    """One line: the CPU, its cores, and its measured matmul peak in each of `dtypes`."""
    peaks = ", ".join(f"{dtype} {matmul_peak(dtype) / 1e9:.0f}" for dtype in dtypes)
    return (f"CPU: {cpu_name()}, {os.cpu_count()} cores; measured {PEAK_SIZE}^3 matmul peak "
            f"GFLOP/s: {peaks}")


def jax_compile_counter():
    """A list that gets an entry whenever XLA compiles for JAX (stays empty on other Keras
    backends): a step that compiles again inside a timed run is not a steady state."""
    compiles = []
    import keras

    if keras.config.backend() == "jax":
        import jax

        def listener(event, duration_secs, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                compiles.append(duration_secs)

        jax.monitoring.register_event_duration_secs_listener(listener)
    return compiles

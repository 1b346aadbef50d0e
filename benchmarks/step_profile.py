"""Where a whole training step's time goes, by the backend's own profiler: the TensorFlow
driver's loop under `tf.profiler`, or the JAX engine's step under `jax.profiler` (with the
settings `python -m train.main` starts JAX with, train/engines/jax_cpu_settings.py).

    python benchmarks/step_profile.py --variant=B/16 --image_size=224 --batch_size=8
    KERAS_BACKEND=jax python benchmarks/step_profile.py --variant=B/16 --image_size=224 \
        --batch_size=8

It prints the step's time (the fastest of `--repeats` untraced runs of `--steps` steps), then
the kernels' time per step in the traced steps, the largest first, grouped by what ran them:
- TensorFlow: the op's type and the model's layer that holds it (`_MklMatMul` in `MlpBlock`;
  "backward" for the gradient tape's ops). TensorFlow runs independent ops side by side, so the
  times add up to more than the step.
- JAX: the JAX operation that each XLA kernel computes, from the compiled program's metadata
  (`encoderblock_N` for every block; "backward" for `transpose(jvp(...))`), and the kernel's kind:
  `ynn_fusion` a YNNPACK matrix product, `dot` one of XLA's own (Eigen's, run on XLA's thread pool
  apart from the traced kernel, so its time shows short), the rest element-wise loops and
  reductions. One line per step also gives the wall time with a YNNPACK product running, with
  another traced kernel running, and with neither.

`benchmarks/step_parts.py` times the same step's pieces one by one, at their own shapes.
"""

import argparse
import collections
import glob
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from train.engines import jax_cpu_settings  # noqa: E402  (the standard library only)

TF_LAYERS = ("MultiHeadDotProductAttention", "MlpBlock", "LayerNorm", "PatchEmbed", "Adam")


def tf_kind(name):
    """`"_MklMatMul in MlpBlock, backward"` from a TensorFlow op event's name
    ("gradient_tape/vit_b16/encoderblock_0/MlpBlock_3/Dense_0/MatMul:_MklMatMul")."""
    scope, _, op_type = name.rpartition(":")
    layer = next((word for word in TF_LAYERS if word in scope), None)
    kind = op_type if layer is None else f"{op_type} in {layer}"
    return kind + (", backward" if "gradient_tape" in scope else "")


def jax_kind(instruction, op_name):
    """`"ynn_fusion: encoderblock_N/MlpBlock_3/Dense_0/dot_general, backward"` from an XLA
    instruction's name ("ynn_fusion.22") and its JAX op_name
    ("jit(_step)/transpose(jvp(vit_b16))/encoderblock_3/MlpBlock_3/Dense_0/dot_general")."""
    kind = re.sub(r"\.\d+$", "", instruction)
    backward = "transpose(" in op_name
    path = re.sub(r"^jit\([^)]*\)/", "", op_name)
    path = re.sub(r"^(transpose\()?(jvp\()?[\w.-]+\)+/", "", path)  # the model's own name
    path = re.sub(r"encoderblock_\d+", "encoderblock_N", path)
    path = re.sub(r"^(adam_w|adam|sgd|lion)/.*", r"the optimizer (\1)", path)
    # XLA's rewrites (of a reduction into reduce-windows) keep no op_name.
    return f"{kind}: {path or '(no op name)'}" + (", backward" if backward else "")


def xplane(logdir):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        sys.exit(f"Error: the profiler wrote no trace under {logdir}.")
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as handle:
        space.ParseFromString(handle.read())
    return space


def events(space, line_filter):
    """(name, start_ps, duration_ps, {stat name: value}) of every event on the host's lines
    whose name `line_filter` accepts."""
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line_filter(line.name):
                continue
            for event in line.events:
                stats = {}
                for stat in event.stats:
                    key = plane.stat_metadata[stat.metadata_id].name
                    stats[key] = (plane.stat_metadata[stat.ref_value].name if stat.ref_value
                                  else stat.str_value or stat.int64_value)
                yield (plane.event_metadata[event.metadata_id].name,
                       line.timestamp_ns * 1000 + event.offset_ps, event.duration_ps, stats)


def hlo_op_names(space):
    """{(module name, instruction name): JAX op_name} from the compiled programs the trace
    holds (the metadata plane's "Hlo Proto" stats)."""
    from tensorflow.compiler.xla.service import hlo_pb2

    names = {}
    for plane in space.planes:
        if plane.name != "/host:metadata":
            continue
        for metadata in plane.event_metadata.values():
            for stat in metadata.stats:
                if plane.stat_metadata[stat.metadata_id].name != "Hlo Proto":
                    continue
                proto = hlo_pb2.HloProto()
                proto.ParseFromString(stat.bytes_value)
                module = proto.hlo_module
                for computation in module.computations:
                    for instruction in computation.instructions:
                        names[(module.name, instruction.name)] = instruction.metadata.op_name
    return names


def covered(intervals):
    """The time that a union of (start, end) intervals covers."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def tf_table(space, steps):
    totals = collections.Counter()
    for name, _, duration, stats in events(space, lambda line: line.startswith("tf_Compute")):
        if stats.get("hlo_op"):  # a kernel of an XLA computation (keras_vit/layers/fusion.py)
            totals["XLA " + re.sub(r"\.\d+$", "", name)] += duration
        elif ":" in name.replace("::", ""):  # an op, "scope:type"; not the executor's "A::B"
            totals[tf_kind(name)] += duration
    return {kind: seconds / 1e12 / steps for kind, seconds in totals.items()}, None


def jax_table(space, steps):
    op_names = hlo_op_names(space)
    totals = collections.Counter()
    products, others = [], []
    for name, start, duration, stats in events(space, lambda line: "XLAEigen" in line):
        instruction = stats.get("hlo_op")
        if not instruction:  # the executor's own events, not a kernel
            continue
        op_name = op_names.get((stats.get("hlo_module"), instruction), "")
        totals[jax_kind(instruction, op_name)] += duration
        (products if instruction.startswith("ynn_fusion") else others).append(
            (start, start + duration))
    if not totals:
        sys.exit("Error: the trace holds no XLA kernel of the step; this JAX names them "
                 "otherwise.")
    every = products + others
    span = max(stop for _, stop in every) - min(start for start, _ in every)
    both, in_products = covered(every), covered(products)
    walls = {"a YNNPACK matrix product": in_products,
             "another traced kernel only": both - in_products,
             "no traced kernel (Eigen's products, the host)": span - both}
    return ({kind: seconds / 1e12 / steps for kind, seconds in totals.items()},
            {what: seconds / 1e12 / steps for what, seconds in walls.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2, help="steps per run, traced and not")
    parser.add_argument("--repeats", type=int, default=2, help="untraced runs, the fastest kept")
    parser.add_argument("--top", type=int, default=25, help="rows of the table")
    args = parser.parse_args()
    for flag in ("image_size", "batch_size", "steps", "repeats", "top"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag}={getattr(args, flag)} must be at least 1.")
    jax_cpu_settings.restart_with_settings()

    import keras

    import machine
    import train_contenders

    backend = keras.config.backend()
    if backend not in ("tensorflow", "jax"):
        sys.exit(f"Error: step_profile.py profiles TensorFlow's or JAX's step, not {backend}'s.")
    config = train_contenders.case_config(args.variant, args.image_size, args.batch_size,
                                          "float32")
    batch = train_contenders.synthetic_batch(args.batch_size, args.image_size)
    contender = (train_contenders.driver_contender if backend == "tensorflow"
                 else train_contenders.jax_engine_contender)
    try:  # the engines check the config (variant, sizes) before they build anything
        run = contender(config, batch, tempfile.mkdtemp(prefix="step_profile_"))
    except ValueError as error:
        sys.exit(f"Error: {error}")
    print(machine.describe())
    print(f"{backend}, {args.variant} at {args.image_size}, batch {args.batch_size}, float32")
    # run_times calls `run` once untimed first, which compiles.
    seconds = min(machine.run_times(lambda: run(args.steps), args.repeats)) / args.steps
    print(f"step: {seconds:.3f} s, {args.batch_size / seconds:.2f} images/s (fastest of "
          f"{args.repeats} runs of {args.steps} steps)")

    logdir = tempfile.mkdtemp(prefix="step_profile_trace_")
    if backend == "tensorflow":
        import tensorflow as tf

        tf.profiler.experimental.start(logdir)
        run(args.steps)
        tf.profiler.experimental.stop()
        kinds, walls = tf_table(xplane(logdir), args.steps)
    else:
        import jax

        jax.profiler.start_trace(logdir)
        run(args.steps)
        jax.profiler.stop_trace()
        kinds, walls = jax_table(xplane(logdir), args.steps)
    if walls:
        print("wall time per traced step: " + ", ".join(
            f"{what} {value:.3f} s" for what, value in walls.items()))
    what = "op" if walls is None else "kernel: operation"
    print(f"\n| kernel time per step, s | share of the step | {what} |")
    print("|---|---|---|")
    for kind, value in sorted(kinds.items(), key=lambda item: -item[1])[:args.top]:
        print(f"| {value:.4f} | {value / seconds:.1%} | {kind} |")


if __name__ == "__main__":
    main()

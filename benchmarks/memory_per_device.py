"""Training memory per device on the JAX engine: what XLA plans for the compiled train step, and
the formula of the weights and optimizer state by mesh.

    KERAS_BACKEND=jax python benchmarks/memory_per_device.py --xla   # XLA's plan, 8 devices
    python benchmarks/memory_per_device.py                           # the formula's table
    KERAS_BACKEND=jax python benchmarks/memory_per_device.py --measure --cpu_devices=4

`--xla` compiles the JAX engine's real train step (train.engines.jax_step.JaxStep: the model,
AdamW, clipping, the update) for B/16, L/16, H/14 and a ViT-g/14-sized model at 224 px,
mixed_bfloat16, 32 images per device, on `--cpu_devices` virtual CPU devices, by attention
(explicit, fused) x remat (none, blocks) x sharding (replicated: data parallel; FSDP over all
devices), and prints XLA's own count per device (`compiled.memory_analysis()`): arguments (the
state and the batch; the outputs reuse them, donated), temporaries, and their sum; the time to
compile; and the largest batch per device whose step fits `--gib` GiB (predicted from plans at
two batch sizes, the temporaries growing about linearly with the batch, and checked by a plan
at the prediction). The model is abstract (shapes and
layouts, no weights in memory: Keras defers the variables' initialisation), so a model larger
than this machine's memory is planned all the same; the numbers are XLA's plan of the same
program for CPU devices, whose fusions differ somewhat from a TPU's or a GPU's.

The formula: `config.model_parallel` M splits each block's attention (q, k, v, out) and MLP
matrices over M devices (keras_vit.ViTModel.get_layout_map); everything else is on every device
unless `config.fsdp` splits it over the batch axis too. Activations depend on the batch and are
not counted. `--measure` builds a small model and its AdamW state under the engine's
distribution on virtual CPU devices and reads what device 0 holds, against the formula.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (hidden D, MLP M, layers L, patch) of the paper's plain ViTs, and ViT-22B's width and depth
# (Dehghani et al., 2023) at the same 224px input.
SIZES = {"Ti/16": (192, 768, 12, 16), "S/16": (384, 1536, 12, 16), "B/16": (768, 3072, 12, 16),
         "L/16": (1024, 4096, 24, 16), "H/14": (1280, 5120, 32, 14),
         "22B-width/14": (6144, 24576, 48, 14)}
# Copies of each weight that training keeps: the weight, its gradient, the optimizer's moments.
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}
# The models XLA plans: a variant, with the fields that make ViT-g/14 (Zhai et al., 2022:
# width 1408, 40 blocks, MLP 6144, 16 heads) from H/14.
PLANNED = {"Ti/16": {"variant": "Ti/16"}, "S/16": {"variant": "S/16"},
           "B/16": {"variant": "B/16"}, "L/16": {"variant": "L/16"}, "H/14": {"variant": "H/14"},
           "g/14": {"variant": "H/14", "hidden_size": 1408, "mlp_dim": 6144, "num_heads": 16,
                    "num_layers": 40}}
DEFAULT_PLANNED = tuple(PLANNED)


def parameters(hidden, mlp, layers, patch, image_size=224, classes=1000):
    """(split, whole): the parameters split over the model axis and those on every device."""
    split = layers * (4 * hidden * hidden + 3 * hidden + 2 * hidden * mlp + mlp)
    tokens = (image_size // patch) ** 2 + 1
    whole = (layers * 6 * hidden + patch * patch * 3 * hidden + hidden + hidden
             + tokens * hidden + 2 * hidden + hidden * classes + classes)
    return split, whole


def bytes_per_device(split, whole, model_parallel, optimizer="adamw", ema=False):
    copies = 2 + OPTIMIZER_SLOTS[optimizer] + int(ema)  # weight, gradient, slots, EMA
    return 4 * copies * (whole + split / model_parallel)


def table(meshes=(1, 2, 4, 8, 16)):
    print("| model | parameters | " + " | ".join(f"M={m}" for m in meshes) + " |")
    print("|---|---|" + "---|" * len(meshes))
    for name, size in SIZES.items():
        split, whole = parameters(*size)
        cells = [f"{bytes_per_device(split, whole, m) / 2**30:.2f} GiB" for m in meshes]
        print(f"| {name} | {split + whole:,} | " + " | ".join(cells) + " |")


def measure(model_parallel, cpu_devices):
    import jax

    jax.config.update("jax_num_cpu_devices", cpu_devices)
    import keras

    import keras_vit
    from train.engines.jax_mesh import make_distribution

    hidden, mlp, layers, patch = 64, 256, 2, 16
    keras.distribution.set_distribution(make_distribution(model_parallel))
    model = keras_vit.vit("Ti/16", hidden_size=hidden, mlp_dim=mlp, num_layers=layers,
                          num_heads=4, patch_size=patch)
    optimizer = keras.optimizers.AdamW()
    optimizer.build(model.trainable_variables)
    device = jax.devices()[0]
    held = 0
    for variable in model.weights + optimizer.variables:
        for shard in variable.value.addressable_shards:
            if shard.device == device and variable.path != "adamw/iteration":
                held += shard.data.nbytes
    split, whole = parameters(hidden, mlp, layers, patch)
    weights_and_slots = bytes_per_device(split, whole, model_parallel) * 3 / 4  # no gradient
    scalars = 4  # the optimizer's learning rate, a float32 scalar on every device
    print(f"Ti/16 at width {hidden}, {layers} blocks, M={model_parallel} on {cpu_devices} "
          f"devices: device 0 holds {held:,} bytes of weights and AdamW slots; the formula "
          f"gives {weights_and_slots + scalars:,.0f}.")
    return held, weights_and_slots + scalars


def planned_step(model_fields, attention, remat, fsdp, per_device_batch, image_size):
    """(memory_analysis of the compiled step, seconds to compile) for one configuration."""
    import jax

    from configs import common
    from train.engines.jax_mesh import make_distribution
    from train.engines.jax_step import JaxStep

    config = common.get_config()
    config.model.update(model_fields)
    config.update(dict(image_size=image_size, dtype_policy="mixed_bfloat16", optimizer="adamw",
                       weight_decay=0.05, fsdp=fsdp, attention_impl=attention, remat=remat))
    step = JaxStep(config, 1000, make_distribution(1, fsdp=fsdp), abstract=True)
    batch = step.batch_spec(per_device_batch * jax.device_count(), image_size)
    lowered = step.train_step.lower(step.state, batch)
    start = time.perf_counter()
    compiled = lowered.compile()
    return compiled.memory_analysis(), time.perf_counter() - start


def _total(memory):
    return memory.argument_size_in_bytes + memory.temp_size_in_bytes


def largest_batch(planned, memory, batch, limit):
    """The largest batch per device whose step XLA plans within `limit` bytes: the temporaries
    grow about linearly with the batch, so two plans predict it (`memory`, the plan at `batch`,
    and one at half of it); a plan at the prediction checks it and, with the first, predicts
    again from two points further apart; the largest batch that fitted is the answer."""
    known = {batch: _total(memory), batch // 2: _total(planned(batch // 2)[0])}
    fitted = max((size for size, total in known.items() if total <= limit), default=0)
    for _ in range(3):
        (small, low), (large, high) = sorted(known.items())[0], sorted(known.items())[-1]
        per_image = (high - low) / (large - small)
        if per_image <= 0:
            break
        guess = int((limit - (high - per_image * large)) // per_image)
        if guess < 1 or guess in known:
            break
        known[guess] = _total(planned(guess)[0])
        if known[guess] <= limit:
            fitted = max(fitted, guess)
    return fitted


def plan(args):
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    from machine import cpu_name

    print(f"{cpu_name()}, {os.cpu_count()} cores (the compile times are this CPU's)")
    gib = 2**30
    print(f"XLA's plan of one train step per device, {args.cpu_devices} CPU devices, "
          f"{args.image_size}px, mixed_bfloat16, AdamW, {args.per_device_batch} images per "
          f"device (GiB; the outputs reuse the arguments):\n")
    print(f"| model | attention | remat | sharding | arguments | temporaries | total | "
          f"compile | largest batch in {args.gib:g} GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for attention in ("explicit", "fused"):
            for remat in ("none", "blocks"):
                for fsdp in (False, True):
                    def planned(batch):
                        return planned_step(PLANNED[name], attention, remat, fsdp, batch,
                                            args.image_size)

                    memory, seconds = planned(args.per_device_batch)
                    largest = (largest_batch(planned, memory, args.per_device_batch,
                                             args.gib * gib) if args.gib else "-")
                    total = memory.argument_size_in_bytes + memory.temp_size_in_bytes
                    print(f"| {name} | {attention} | {remat} | "
                          f"{'FSDP' if fsdp else 'replicated'} | "
                          f"{memory.argument_size_in_bytes / gib:.2f} | "
                          f"{memory.temp_size_in_bytes / gib:.2f} | {total / gib:.2f} | "
                          f"{seconds:.0f} s | {largest} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--xla", action="store_true", help="XLA's plan of the compiled step")
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--cpu_devices", type=int, default=None,
                        help="virtual CPU devices (default 8 with --xla, 4 with --measure)")
    parser.add_argument("--models", default=",".join(DEFAULT_PLANNED),
                        help=f"with --xla, a comma list of {', '.join(PLANNED)}")
    parser.add_argument("--per_device_batch", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--gib", type=float, default=16.0,
                        help="device memory for the largest batch (16: a TPU v5e chip; 0: "
                        "no search)")
    args = parser.parse_args()
    unknown = set(args.models.split(",")) - set(PLANNED)
    if unknown:
        parser.error(f"--models: unknown {sorted(unknown)}; known: {', '.join(PLANNED)}")
    if args.per_device_batch < 2:
        parser.error("--per_device_batch must be at least 2 (a second plan at half of it)")
    if args.xla:
        args.cpu_devices = args.cpu_devices or 8
        plan(args)
    elif args.measure:
        args.cpu_devices = args.cpu_devices or 4
        for model_parallel in (1, 2, 4):
            if args.cpu_devices % model_parallel == 0:
                measure(model_parallel, args.cpu_devices)
    else:
        table()


if __name__ == "__main__":
    main()

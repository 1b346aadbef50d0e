"""Training memory per device on the JAX engine, by mesh: weights, gradients and optimizer
state, float32, for every plain ViT size of the paper and a ViT-22B-sized example.

    python benchmarks/memory_per_device.py                    # the computed table
    KERAS_BACKEND=jax python benchmarks/memory_per_device.py --measure --cpu_devices=4

`config.model_parallel` M splits each block's attention (q, k, v, out) and MLP matrices over M
devices (keras_vit.ViTModel.get_layout_map); everything else (embeddings, norms, biases
of the second matrices, the head) is on every device, and the batch axis does not change a device's
share of the weights. Activations depend on the batch and are not counted. `--measure` builds a
small model and its AdamW state under the engine's distribution on virtual CPU devices and
reads what device 0 holds, against the same formula.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (hidden D, MLP M, layers L, patch) of the paper's plain ViTs, and ViT-22B's width and depth
# (Dehghani et al., 2023) at the same 224px input.
SIZES = {"Ti/16": (192, 768, 12, 16), "S/16": (384, 1536, 12, 16), "B/16": (768, 3072, 12, 16),
         "L/16": (1024, 4096, 24, 16), "H/14": (1280, 5120, 32, 14),
         "22B-width/14": (6144, 24576, 48, 14)}
# Copies of each weight that training keeps: the weight, its gradient, the optimizer's moments.
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--cpu_devices", type=int, default=4)
    args = parser.parse_args()
    if args.measure:
        for model_parallel in (1, 2, 4):
            if args.cpu_devices % model_parallel == 0:
                measure(model_parallel, args.cpu_devices)
    else:
        table()


if __name__ == "__main__":
    main()

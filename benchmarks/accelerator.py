"""ViT-B/16 on one accelerator: the JAX engine's real train step (explicit and fused attention,
with and without remat, at the largest batch that fits), its inference, and timm's B/16 on the
same card (bf16 autocast, PyTorch's scaled_dot_product_attention, and `torch.compile` where it
works), measured in one run and printed as one table, with each training speed as model-FLOP
utilisation: training FLOPs per image (3 x keras_vit.flops.forward_flops, the same for both:
one architecture) x images/s over the card's bfloat16 matmul peak measured here.

On a GPU machine with JAX (CUDA), PyTorch and timm and no Keras, TensorFlow or package registry,
from a checkout (the wheels downloaded first, where a registry is reachable, into the ignored
folder .whl/, then carried with the checkout):

    pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux2014_x86_64 -d .whl -r benchmarks/accelerator_wheels.txt
    pip install --no-index --no-deps --target .whl/site .whl/*.whl   # on the GPU machine
    PYTHONPATH=.whl/site KERAS_BACKEND=jax python benchmarks/accelerator.py

It finishes in a few minutes on one GPU. `--tiny` runs the same code on the CPU with a small
model in seconds (what the test suite runs).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What is trained and measured: B/16 at 224 px on 1000 classes, or with --tiny a small model.
FULL = dict(model={"variant": "B/16"}, image_size=224, batches=(256, 512, 1024), steps=20,
            timm=dict(model_name="vit_base_patch16_224"), matmul=8192)
TINY = dict(model={"variant": "Ti/16", "hidden_size": 32, "mlp_dim": 64, "num_heads": 2,
                   "num_layers": 2, "patch_size": 8},
            image_size=32, batches=(8,), steps=2,
            timm=dict(model_name="vit_tiny_patch16_224", img_size=32, patch_size=8,
                      embed_dim=32, depth=2, num_heads=2),
            matmul=512)
NUM_CLASSES = 1000
MEMORY_USE = 0.9  # of the device's memory, for the largest batch that fits


def matmul_peak(size):
    """bfloat16 FLOP/s of a `size`^3 matmul on the first device, the best of 5."""
    import jax

    a = jax.random.normal(jax.random.key(0), (size, size)).astype("bfloat16")
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def device_memory():
    """Bytes of memory of the first device (None where the backend does not say: the CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def keras_vit_config(setup, attention, remat, batch):
    from configs import common

    config = common.get_config()
    config.model.update(dict(setup["model"], attention_impl=attention, remat=remat))
    config.update(dict(image_size=setup["image_size"], batch_size=batch, eval_batch_size=batch,
                       optimizer="adamw", learning_rate=1e-3, weight_decay=0.05,
                       warmup_steps=0, total_steps=1_000_000, grad_clip_norm=1.0,
                       dtype_policy="mixed_bfloat16"))
    return config


def keras_vit_training(setup, attention, remat):
    """(batch, images/s, the model, its trained state) of the JAX engine's train step at the
    largest of the setup's batches whose plan fits the device (the smallest where nothing is
    known)."""
    import jax
    import numpy as np

    from train.engines.jax_mesh import make_distribution
    from train.engines.jax_step import JaxStep

    limit = device_memory()
    candidates = sorted(setup["batches"], reverse=True) if limit else [min(setup["batches"])]
    for batch in candidates:
        step = JaxStep(keras_vit_config(setup, attention, remat, batch), NUM_CLASSES,
                       make_distribution(1))
        images = step.batch_spec(batch, setup["image_size"])
        compiled = step.train_step.lower(step.state, images).compile()
        memory = compiled.memory_analysis()
        if limit and memory.argument_size_in_bytes + memory.temp_size_in_bytes > (
                MEMORY_USE * limit) and batch != candidates[-1]:
            continue
        rng = np.random.default_rng(0)
        size = setup["image_size"]
        data = {"image": rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32"),
                "label": rng.integers(0, NUM_CLASSES, batch).astype("int32")}
        data = {name: jax.device_put(value, step.batch_sharding) for name, value in data.items()}
        state = step.state
        state, (loss, _) = compiled(state, data)  # warm-up
        loss.block_until_ready()
        start = time.perf_counter()
        for _ in range(setup["steps"]):
            state, (loss, _) = compiled(state, data)
        loss.block_until_ready()
        return batch, setup["steps"] * batch / (time.perf_counter() - start), step.model, state
    raise AssertionError("unreachable: the last candidate is always measured")


def keras_vit_inference(setup, model, state, batch):
    """Images/s of the model's forward pass (bfloat16, jitted) with the weights of `state` (the
    train step's: the variables' own were donated to it) on a batch of `batch`."""
    import jax
    import numpy as np

    @jax.jit
    def forward(images):
        return model.stateless_call(state["trainable"], state["non_trainable"], images)[0]

    size = setup["image_size"]
    images = np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)).astype("float32")
    forward(images).block_until_ready()
    start = time.perf_counter()
    for _ in range(setup["steps"]):
        out = forward(images)
    out.block_until_ready()
    return setup["steps"] * batch / (time.perf_counter() - start)


def timm_speeds(setup, batch):
    """{row name: images/s} of timm's model: training (AdamW, clipping, bf16 autocast) and
    inference, eager and under `torch.compile`; {} where PyTorch or timm is not installed."""
    try:
        import timm
        import torch
    except ImportError:
        return {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = timm.create_model(**setup["timm"], num_classes=NUM_CLASSES).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    size = setup["image_size"]
    images = torch.randn(batch, 3, size, size, device=device)
    labels = torch.randint(0, NUM_CLASSES, (batch,), device=device)

    def synchronize():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(run):
        run()  # warm-up (and compilation)
        synchronize()
        start = time.perf_counter()
        for _ in range(setup["steps"]):
            run()
        synchronize()
        return setup["steps"] * batch / (time.perf_counter() - start)

    def speeds(forward):
        def train():
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(forward(images), labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        @torch.no_grad()
        def infer():
            with torch.autocast(device, dtype=torch.bfloat16):
                forward(images)

        return timed(train), timed(infer)

    results = {}
    results["timm"] = speeds(model)
    try:
        results["timm, torch.compile"] = speeds(torch.compile(model))
    except Exception as error:  # noqa: BLE001  (its backends fail in many ways; say which)
        results["timm, torch.compile"] = f"failed: {type(error).__name__}"
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a small model on the CPU, seconds")
    args = parser.parse_args()
    setup = TINY if args.tiny else FULL
    import jax

    from keras_vit import flops

    device = jax.devices()[0]
    peak = matmul_peak(setup["matmul"])
    print(f"{device.device_kind} ({device.platform}), bfloat16 matmul peak measured "
          f"{peak / 1e12:.1f} TFLOP/s")
    rows, training_flops = [], None
    best = {}
    for attention in ("explicit", "fused"):
        for remat in ("none", "blocks"):
            batch, speed, model, state = keras_vit_training(setup, attention, remat)
            training_flops = 3 * flops.forward_flops(model)
            rows.append((f"keras_vit, JAX engine, {attention} attention, remat {remat}",
                         batch, speed, None))
            if remat == "none" and speed > best.get("speed", 0):
                best = dict(speed=speed, batch=batch, model=model, state=state)
    inference = keras_vit_inference(setup, best["model"], best["state"], best["batch"])
    rows.append(("keras_vit inference (the faster attention)", best["batch"], None, inference))
    for name, measured in timm_speeds(setup, best["batch"]).items():
        if isinstance(measured, str):
            rows.append((f"{name} ({measured})", best["batch"], None, None))
        else:
            rows.append((name, best["batch"], *measured))
    print(f"\n| contender | batch | training images/s | training MFU | inference images/s |")
    print("|---|---|---|---|---|")
    for name, batch, train, infer in rows:
        mfu = f"{train * training_flops / peak:.1%}" if train else "-"
        print(f"| {name} | {batch} | {f'{train:,.0f}' if train else '-'} | {mfu} | "
              f"{f'{infer:,.0f}' if infer else '-'} |")


if __name__ == "__main__":
    main()

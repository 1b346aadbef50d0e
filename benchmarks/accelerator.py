"""ViT-B/16 on one accelerator: the JAX engine's real train step (explicit and fused attention,
with and without remat, at the largest batch that fits), its inference, and timm's B/16 on the
same card (bf16 autocast, PyTorch's scaled_dot_product_attention, and `torch.compile` where it
works), measured in one run and printed as one table, with each training speed as model-FLOP
utilisation: training FLOPs per image (3 x keras_vit.analysis.flops.forward_flops, the same
for both: one architecture) x images/s over the card's bfloat16 matmul peak measured here.

On a GPU machine with JAX (CUDA), PyTorch and timm and no Keras, TensorFlow or package registry,
from a checkout (the wheels downloaded first, where a registry is reachable, into the ignored
folder .whl/, then carried with the checkout):

    pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux2014_x86_64 -d .whl -r benchmarks/accelerator_wheels.txt
    pip install --no-index --no-deps --target .whl/site .whl/*.whl   # on the GPU machine
    PYTHONPATH=.whl/site KERAS_BACKEND=jax python benchmarks/accelerator.py

(On an image that has some of them already, install only the missing ones: on the H200 image of
docs/speed.md, keras, ml_collections, namex and optree.) JAX and PyTorch each run in a process
of their own, one after the other: JAX keeps most of the device's memory until its process
ends. It finishes in about 3.5 minutes on one H200. `--tiny` runs the same code on the CPU
with a small model in seconds (what the test suite runs).
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
# JAX takes 75% of a GPU's memory by default; the largest batch that fits wants more (PyTorch
# runs in a process of its own).
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
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


def matmul_peak(size, chained=10):
    """bfloat16 FLOP/s of `chained` `size`^3 matmuls in one program on the first device (one
    launch's overhead spread over them), the best of 5."""
    import jax

    a = jax.random.normal(jax.random.key(0), (size, size)).astype("bfloat16")
    w = (jax.random.normal(jax.random.key(1), (size, size)) / size**0.5).astype("bfloat16")
    matmuls = jax.jit(lambda x: jax.lax.fori_loop(0, chained, lambda _, y: y @ w, x))
    matmuls(a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        matmuls(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return chained * 2 * size**3 / best


def device_memory():
    """Bytes of memory of the first device (None where the backend does not say: the CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def keras_vit_config(setup, attention, remat, batch):
    from configs import common

    config = common.get_config()
    config.model.update(setup["model"])
    config.update(dict(attention_impl=attention, remat=remat,
                       image_size=setup["image_size"], batch_size=batch, eval_batch_size=batch,
                       optimizer="adamw", learning_rate=1e-3, weight_decay=0.05,
                       warmup_steps=0, total_steps=1_000_000, grad_clip_norm=1.0,
                       dtype_policy="mixed_bfloat16"))
    return config


def keras_vit_training(setup, attention, remat):
    """(batch, images/s, the model, its trained state, whether cuDNN's flash attention runs in
    it) of the JAX engine's train step at the
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
        speed = setup["steps"] * batch / (time.perf_counter() - start)
        flash = "__cudnn$fmha" in compiled.as_text()  # cuDNN's fused attention in the program
        return batch, speed, step.model, state, flash
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
    # On the device once: a host array would be copied to it at every call (600 MB at 1,024).
    images = jax.device_put(
        np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)).astype("float32"))
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
    contenders = {"timm": lambda: model, "timm, torch.compile": lambda: torch.compile(model)}
    for name, make in contenders.items():
        try:
            results[name] = speeds(make())
        # Out of memory, or a backend's failure: a row that says which.
        except Exception as error:  # noqa: BLE001
            results[name] = f"failed: {type(error).__name__}"
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def jax_rows(setup):
    """The keras_vit rows, the matmul peak and the batch timm is measured at, each training row
    printed (to stderr) as soon as it is measured, so a run cut short still says something."""
    import jax

    from keras_vit.analysis import flops

    device = jax.devices()[0]
    peak = matmul_peak(setup["matmul"])
    print(f"{device.device_kind} ({device.platform}), bfloat16 matmul peak measured "
          f"{peak / 1e12:.1f} TFLOP/s", file=sys.stderr, flush=True)
    rows, best = [], {}
    for attention in ("explicit", "fused"):
        for remat in ("none", "blocks"):
            name = f"keras_vit, JAX engine, {attention} attention, remat {remat}"
            try:
                batch, speed, model, state, flash = keras_vit_training(setup, attention, remat)
            except Exception as error:  # noqa: BLE001  (a row that says so, then the others)
                rows.append((f"{name} (failed: {type(error).__name__}: {error})"[:160],
                             None, None, None))
                print(rows[-1], file=sys.stderr, flush=True)
                continue
            rows.append((f"{name}{' (cuDNN flash)' if flash else ''}", batch, speed, None))
            print(rows[-1], file=sys.stderr, flush=True)
            if remat == "none" and speed > best.get("speed", 0):
                best = dict(speed=speed, batch=batch, model=model, state=state)
    inference = keras_vit_inference(setup, best["model"], best["state"], best["batch"])
    rows.append(("keras_vit inference (the faster attention)", best["batch"], None, inference))
    return dict(device=f"{device.device_kind} ({device.platform})", peak=peak,
                training_flops=3 * flops.forward_flops(best["model"]), batch=best["batch"],
                rows=rows)


def timm_rows(setup, batch):
    """timm's rows at `batch`, each printed (to stderr) as soon as it is measured."""
    rows = []
    for name, measured in timm_speeds(setup, batch).items():
        rows.append((f"{name} ({measured})", batch, None, None) if isinstance(measured, str)
                    else (name, batch, *measured))
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def in_child(setup_name, part, batch=0):
    """One part's result, measured in a process of its own: JAX keeps most of the device's
    memory for itself until its process ends, and PyTorch would find too little left."""
    command = [sys.executable, os.path.abspath(__file__), f"--part={part}", f"--batch={batch}"]
    if setup_name == "tiny":
        command.append("--tiny")
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode:
        sys.exit(f"benchmarks/accelerator.py: the {part} part failed (exit "
                 f"{result.returncode}); its output is above.")
    return json.loads(result.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a small model on the CPU, seconds")
    parser.add_argument("--part", choices=("jax", "timm"), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup = TINY if args.tiny else FULL
    if args.part == "jax":
        print(json.dumps(jax_rows(setup)))
        return
    if args.part == "timm":
        print(json.dumps(timm_rows(setup, args.batch)))
        return
    setup_name = "tiny" if args.tiny else "full"
    measured = in_child(setup_name, "jax")
    rows = measured["rows"] + in_child(setup_name, "timm", measured["batch"])
    peak = measured["peak"]
    print(f"{measured['device']}, bfloat16 matmul peak measured {peak / 1e12:.1f} TFLOP/s")
    print("\n| contender | batch | training images/s | training MFU | inference images/s |")
    print("|---|---|---|---|---|")
    for name, batch, train, infer in rows:
        mfu = f"{train * measured['training_flops'] / peak:.1%}" if train else "-"
        print(f"| {name} | {batch or '-'} | {f'{train:,.0f}' if train else '-'} | {mfu} | "
              f"{f'{infer:,.0f}' if infer else '-'} |")


if __name__ == "__main__":
    main()

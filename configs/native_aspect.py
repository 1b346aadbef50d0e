"""Native resolution on the offline native-aspect data: Fashion-MNIST with each image resampled to
its own aspect ratio (1/3 to 3) and size (`fashion_mnist_native`, train/data/fashion_mnist.py),
and a small plain ViT that sees each image at its own aspect ratio (keras_vit.native).

    python -m train.main --config=configs/native_aspect.py --workdir=runs/native     # packed
    python -m train.main --config=configs/native_aspect.py:padded --workdir=runs/padded
    python -m train.main --config=configs/native_aspect.py:square --workdir=runs/square
    python -m train.main --config=configs/native_aspect.py:packed,canvas --workdir=runs/canvas

An optional second word names the data: "stretched" (the default, `fashion_mnist_native`: each
image stretched to its aspect ratio) or "canvas" (`fashion_mnist_canvas`: each image undistorted
on a canvas of its aspect ratio, where squashing to a square distorts the object).

The argument says how images become sequences (docs/native.md): "packed" (several images in
each sequence of 128 patches, NaViT's packing, each image's budget drawn from 16 to 64
patches), "padded" (one image per sequence, each at the whole budget of 64) or "square"
(every image squashed to 32x32 pixels, the classic model: 64 patches). The model's learned
grid is 8x8 patches of 4 pixels, resized to each image's grid.

Packing's sizes, measured on the first 20 batches (128 images each): 40 sequences of 128
patches run 5,120 tokens a step, 92.6% of them patches of images, and leave out 0.2% of the
images; 24 sequences of 256 ran 77.3% patches, 36 of 128 95.5% but left out 6.4%.
"""

from . import common

ARGS = ("packed", "padded", "square")
DATA = {"stretched": "fashion_mnist_native", "canvas": "fashion_mnist_canvas"}


def get_config(arg="packed"):
    layout, comma, data = arg.partition(",")
    data = data if comma else "stretched"
    if layout not in ARGS or data not in DATA:
        raise ValueError(f"configs/native_aspect.py takes LAYOUT or LAYOUT,DATA with LAYOUT one "
                         f"of {ARGS} and DATA one of {tuple(DATA)}, got {arg!r}.")
    config = common.get_config()
    config.model.variant = "Ti/16"  # a plain ViT: the sizes below replace all of Ti/16's
    config.image_size = 32  # the learned 8x8 grid (and the square images of "square")
    config.model.patch_size = 4
    config.model.hidden_size = 64
    config.model.mlp_dim = 128
    config.model.num_heads = 4
    config.model.num_layers = 4
    config.model.classifier = "map"  # no class token: packed images pool their own patches
    config.model.class_token = False
    config.dataset = DATA[data]
    config.crop_min_area = 1.0
    config.flip = False
    config.native = "none" if layout == "square" else layout
    config.native_patches = 64
    if layout == "packed":
        config.native_min_patches = 16  # each image's budget drawn from 16 to 64 patches
        config.pack_sequence_length = 128
        config.pack_images = 8
        config.pack_sequences = 40  # 5,120 patches for 128 images (padding: 8,192)
    config.optimizer = "adamw"
    config.learning_rate = 3e-3
    config.weight_decay = 0.05
    config.batch_size = 128
    config.eval_batch_size = 1000
    config.total_steps = 2_000
    config.warmup_steps = 100
    config.steps_per_loop = 100
    config.eval_every_steps = 1_000
    config.checkpoint_every_steps = 1_000
    config.jit_compile = True
    return config

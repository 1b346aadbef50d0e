"""What FlexiViT's resize of the patch embedding is worth: a trained model evaluated at other
patch sizes, its kernel resized with the pseudo-inverse (`keras_vit.layers.resample.
resize_patch_embedding`, what loading with another `patch_size` does) or as an image (the naive
baseline), its position embeddings resampled to the new grid either way.

    python -m train.main --config=configs/quickstart.py --config.model.variant=Ti/16 \\
        --config.image_size=96 --config.model.patch_size=16 --workdir=/tmp/vit_p16
    python benchmarks/patch_resize.py --workdir=/tmp/vit_p16 --patch_sizes=8,12,16,24,32

Test accuracy on the run's evaluation split (the offline Fashion-MNIST's 10,000 test images,
resized as the run's input pipeline does). Prints a Markdown table.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

# keras_vit (and with it Keras and TensorFlow) and the driver's modules are imported where they
# are used, after the flags are read: `--help` and a bad flag answer at once.


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="a finished run of a plain ViT")
    parser.add_argument("--patch_sizes", default="8,12,16,24,32",
                        help="comma-separated patch sides; each must divide the image size")
    parser.add_argument("--examples", type=int, default=10_000, help="test images to evaluate")
    parser.add_argument("--batch_size", type=int, default=500)
    return parser.parse_args(argv)


def accuracy(model, images, labels, batch_size):
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model.predict_on_batch(images[start:start + batch_size])
        correct += int((np.argmax(logits, -1) == labels[start:start + batch_size]).sum())
    return correct / len(images)


def at_patch_size(spec, arrays, patch_size, pseudo_inverse):
    """The trained model (`spec`, its `.npz` `arrays`) with another patch size: the position
    embeddings resampled to the new grid, the kernel resized with the pseudo-inverse or as an
    image."""
    import keras_vit
    from keras_vit.layers import resample
    from keras_vit.weights import checkpoint

    model = keras_vit.vit(spec.replace(patch_size=patch_size))
    arrays = {**arrays, "embedding/kernel": resample.resize_patch_embedding(
        arrays["embedding/kernel"], patch_size, pseudo_inverse=pseudo_inverse)}
    checkpoint.load_npz(model, arrays)
    return model


def main(argv=None):
    args = parse_args(argv)
    from keras_vit.weights import checkpoint
    from train.data import fashion_mnist, grain_pipeline
    from train.run import run_files
    from train.run.export import load_trained_model

    trained = load_trained_model(run_files.model_file(args.workdir), args.workdir)
    spec = trained.spec
    if spec is None or spec.is_hybrid:
        sys.exit(f"{args.workdir} holds no plain ViT (a hybrid's patches are cut from its "
                 "ResNet's features, not from pixels); train one as the docstring shows.")
    patch_sizes = [int(size) for size in args.patch_sizes.split(",")]
    side = spec.image_size[0]  # the driver trains square images
    bad = [size for size in patch_sizes if side % size]
    if bad:
        sys.exit(f"--patch_sizes {bad} do not divide the image size {side}.")
    arrays = checkpoint.model_arrays(trained)  # once: every row starts from these
    images, labels = fashion_mnist.read_split("test")
    images = grain_pipeline.preprocess_eval(list(images[:args.examples]), side)
    labels = labels[:args.examples]
    print(f"{args.workdir}: {spec.variant}, patch {spec.patch_size}, image "
          f"{spec.image_size[0]}x{spec.image_size[1]}, {len(labels)} test images")
    print("| patch | grid | pseudo-inverse resize | kernel resized as an image |")
    print("|---:|---:|---:|---:|")
    for size in patch_sizes:
        grid = "x".join(str(side // size) for side in spec.image_size)
        results = [accuracy(at_patch_size(spec, arrays, size, pinv), images, labels,
                            args.batch_size) for pinv in (True, False)]
        print(f"| {size} | {grid} | {results[0]:.2%} | {results[1]:.2%} |", flush=True)


if __name__ == "__main__":
    main()

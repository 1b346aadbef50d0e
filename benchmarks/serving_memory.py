"""Disk size and serving memory of the exported SavedModel, against the weights it holds.

    python benchmarks/serving_memory.py --variant=Ti/16 --variant=B/16

For each variant (random weights, 224px): the SavedModel's size on disk and its variables'
elements against `count_params()`, then the peak resident memory of a fresh process that loads
the SavedModel (`tf.saved_model.load`, as TF Serving loads it) and answers one request of one
image, beside a process that only imports TensorFlow.
"""

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

# Run in a fresh interpreter: prints the peak resident memory in MB after the work.
SERVE = """
import resource, sys
import numpy as np, tensorflow as tf
if sys.argv[1] != "-":
    signature = tf.saved_model.load(sys.argv[1]).signatures["serving_images"]
    size = int(sys.argv[2])
    signature(images=tf.constant(np.zeros((1, size, size, 3), np.float32)))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def peak_memory_mb(saved_model, image_size):
    result = subprocess.run([sys.executable, "-c", SERVE, saved_model, str(image_size)],
                            capture_output=True, text=True, check=True)
    return float(result.stdout.split()[-1])


def directory_size(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", help="repeat for several (default Ti/16)")
    parser.add_argument("--image_size", type=int, default=224)
    args = parser.parse_args()
    import tensorflow as tf

    import keras_vit

    import machine

    print(machine.describe())
    baseline = peak_memory_mb("-", args.image_size)
    print(f"{args.image_size}px, TF {tf.__version__}; a process that only imports TensorFlow "
          f"peaks at {baseline:.0f} MB\n")
    print("| variant | parameters | float32 weights MB | SavedModel MB | variable elements / "
          "parameters | serving process peak MB |")
    print("|---|---|---|---|---|---|")
    for variant in args.variant or ["Ti/16"]:
        model = keras_vit.vit(variant, image_size=args.image_size)
        with tempfile.TemporaryDirectory() as workdir:
            saved = keras_vit.deploy.export.export_saved_model(model, os.path.join(workdir, "vit"))
            elements = sum(int(np.prod(shape)) for name, shape in tf.train.list_variables(
                os.path.join(saved, "variables", "variables"))
                if name != "_CHECKPOINTABLE_OBJECT_GRAPH")
            peak = peak_memory_mb(saved, args.image_size)
            print(f"| {variant} | {model.count_params():,} | {model.count_params() * 4 / 1e6:.1f} "
                  f"| {directory_size(saved) / 1e6:.1f} | {elements / model.count_params():.2f} "
                  f"| {peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()

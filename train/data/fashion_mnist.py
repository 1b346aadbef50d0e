"""Fashion-MNIST from local IDX files (Debian's `dataset-fashion-mnist`) as TFDS datasets.

Defining the builders registers them, so `tfds.builder("fashion_mnist_local")` prepares the real
60,000 + 10,000 images offline and the rest of the pipeline is the one every TFDS dataset takes.
`fashion_mnist_native` is the same images, each resampled to its own aspect ratio and size
(`stretched`): data for models that see images at their own aspect ratios (keras_vit.native), made
from the one image dataset on the machine. `fashion_mnist_canvas` (`on_canvas`) keeps each item's
shape: the item, scaled but undistorted, lies on a black canvas of its own aspect ratio, so the
frame's aspect ratio varies and the object's does not (synthetic, as the other). The files are
looked up in `$FASHION_MNIST_DIR`, default `/usr/share/datasets/fashion-mnist`.
"""

import gzip
import math
import os

import numpy as np
import tensorflow_datasets as tfds

from .grain_pipeline import antialiased_weights

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot")
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IMAGE_MAGIC, _LABEL_MAGIC = 2051, 2049
SPLITS = tuple(_FILES)


def source_dir():
    return os.environ.get("FASHION_MNIST_DIR", DEFAULT_DIR)


def read_idx(path, magic):
    """Reads a gzipped IDX file (the MNIST format) into a uint8 array, checking its header."""
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    if len(data) < 8 or int.from_bytes(data[:4], "big") != magic:
        raise ValueError(f"{path} is not an IDX file with magic number {magic}.")
    rank = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: expected {np.prod(shape)} values, "
                         f"found {body.size}.")
    return body.reshape(shape)


class FashionMnistLocal(tfds.core.GeneratorBasedBuilder):
    """Fashion-MNIST (Xiao et al., 2017) read from local files; no download."""

    VERSION = tfds.core.Version("1.2.0")
    RELEASE_NOTES = {"1.1.0": "The driver prepares it as ArrayRecord (random access).",
                     "1.2.0": "Record i is image i of the IDX files, as the Grain pipeline "
                              "reads them (TFDS' shuffling of the records off)."}

    def _info(self):
        return self.dataset_info_from_configs(
            description="Fashion-MNIST, 28x28 grayscale, 10 classes, from local IDX files.",
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(28, 28, 1)),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
            }),
            supervised_keys=("image", "label"),
            # In the IDX files' order: both input pipelines then number the records alike.
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {split: self._generate_examples(split) for split in SPLITS}

    def _generate_examples(self, split):
        images, labels = read_split(split)
        for index, (image, label) in enumerate(zip(images, labels)):
            yield index, {"image": image[..., None], "label": int(label)}


def read_split(split):
    """`(images uint8 [n, 28, 28], labels uint8 [n])` of "train" or "test" from the files in
    `source_dir()`; a missing file is a FileNotFoundError that says how to install them."""
    folder = source_dir()
    missing = [name for files in _FILES.values() for name in files
               if not os.path.exists(os.path.join(folder, name))]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST files {missing} are not in {folder}. Install them with "
            "`sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or set "
            "FASHION_MNIST_DIR to a folder holding the four .gz files.")
    images_path, labels_path = (os.path.join(folder, name) for name in _FILES[split])
    images = read_idx(images_path, _IMAGE_MAGIC)
    labels = read_idx(labels_path, _LABEL_MAGIC)
    if len(images) != len(labels):
        raise ValueError(f"{images_path} has {len(images)} images but {labels_path} "
                         f"has {len(labels)} labels.")
    return images, labels


# `fashion_mnist_native`: each image's aspect ratio (height / width) log-uniform in [1/3, 3] and
# its scale in [0.75, 2] (sides of 14 to 97 pixels), drawn from this seed and the image's split
# and index, so that every run, and both input pipelines, see the same dataset.
NATIVE_SEED = 52
NATIVE_ASPECT, NATIVE_SCALE = (1 / 3, 3.0), (0.75, 2.0)


def _draws(split, index):
    """`(aspect, scale, rng)` of image `index` of `split`: its drawn aspect ratio and scale, and
    the generator for any further draws (`on_canvas`'s position)."""
    rng = np.random.default_rng([NATIVE_SEED, SPLITS.index(split), int(index)])
    aspect = math.exp(rng.uniform(*map(math.log, NATIVE_ASPECT)))  # drawn first: the scale
    scale = math.exp(rng.uniform(*map(math.log, NATIVE_SCALE)))  # is the second draw either way
    return aspect, scale, rng


def native_size(split, index, aspect=None):
    """`(height, width)` of image `index` of `split` in `fashion_mnist_native`; given `aspect`
    (height / width), the image's size at that aspect ratio instead of its drawn one (its drawn
    scale: benchmarks/native_aspect_study.py's fixed aspect ratios)."""
    drawn, scale, _ = _draws(split, index)
    aspect = drawn if aspect is None else aspect
    return (max(1, round(28 * scale * math.sqrt(aspect))),
            max(1, round(28 * scale / math.sqrt(aspect))))


def stretched(image, split, index, aspect=None, size=None):
    """Image `index` of `split` (uint8 [28, 28]) resampled to its `native_size` (at `aspect`,
    if given), or to `size` (height, width); antialiased bilinear, in float64, rounded, uint8."""
    height, width = size or native_size(split, index, aspect)
    rows = antialiased_weights(image.shape[0], height)
    columns = antialiased_weights(image.shape[1], width)
    return np.clip(np.rint(rows @ image.astype(np.float64) @ columns.T), 0, 255).astype(np.uint8)


# `fashion_mnist_canvas`: the same draws of aspect ratio and scale, now the canvas's aspect ratio
# and the item's scale (a square of 21 to 56 pixels a side, as 28 * scale rounds), the canvas's
# shorter side CANVAS_MARGIN times the item's; two more draws place the item on the canvas.
CANVAS_MARGIN = 1.25


def canvas_layout(split, index, aspect=None):
    """`(height, width, top, left, side)` of image `index` of `split` in `fashion_mnist_canvas`:
    the canvas, the item's top-left corner on it and the item's side; given `aspect` (height /
    width), the canvas at that ratio instead of its drawn one, the item's size and its relative
    position the drawn ones (benchmarks/native_aspect_study.py's fixed aspect ratios)."""
    drawn, scale, rng = _draws(split, index)
    aspect = drawn if aspect is None else aspect
    side = round(28 * scale)
    short = round(CANVAS_MARGIN * side)
    height, width = ((round(short * aspect), short) if aspect >= 1 else
                     (short, round(short / aspect)))
    down, across = rng.uniform(size=2)  # fractions of the room, so any canvas takes them
    return height, width, round(down * (height - side)), round(across * (width - side)), side


def on_canvas(image, split, index, aspect=None):
    """Image `index` of `split` (uint8 [28, 28]) resized to a square of its `canvas_layout`'s
    side (antialiased bilinear, as `stretched`: the same scale both ways, so undistorted) on a
    black canvas (Fashion-MNIST's own background) of its layout, uint8."""
    height, width, top, left, side = canvas_layout(split, index, aspect)
    canvas = np.zeros((height, width), np.uint8)
    canvas[top:top + side, left:left + side] = stretched(image, split, index, size=(side, side))
    return canvas


class FashionMnistNative(tfds.core.GeneratorBasedBuilder):
    """Fashion-MNIST with each image at its own aspect ratio and size (`stretched`)."""

    VERSION = tfds.core.Version("1.0.0")
    DESCRIPTION = ("Fashion-MNIST, each image resampled to a random aspect ratio (1/3 to 3) and "
                   "scale (0.75 to 2): grayscale of 14 to 97 pixels a side.")
    resample = staticmethod(stretched)

    def _info(self):
        return self.dataset_info_from_configs(
            description=self.DESCRIPTION,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 1)),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
            }),
            supervised_keys=("image", "label"),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {split: self._generate_examples(split) for split in SPLITS}

    def _generate_examples(self, split):
        images, labels = read_split(split)
        for index, (image, label) in enumerate(zip(images, labels)):
            yield index, {"image": self.resample(image, split, index)[..., None],
                          "label": int(label)}


class FashionMnistCanvas(FashionMnistNative):
    """Fashion-MNIST with each item undistorted on a canvas of its own aspect ratio
    (`on_canvas`)."""

    DESCRIPTION = ("Synthetic: each Fashion-MNIST image resized to a square of 21 to 56 pixels "
                   "(scale 0.75 to 2, undistorted) at a random position on a black canvas of a "
                   "random aspect ratio (1/3 to 3) whose shorter side is 1.25 times the item's.")
    resample = staticmethod(on_canvas)


# The resampling of each dataset that resamples Fashion-MNIST (the Grain pipeline's).
RESAMPLED = {"fashion_mnist_native": stretched, "fashion_mnist_canvas": on_canvas}

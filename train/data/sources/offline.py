"""The offline default, `config.dataset = "fashion_mnist_local"`: the real Fashion-MNIST from
Debian's `dataset-fashion-mnist` files (train.data.fashion_mnist), prepared as a TFDS dataset
in ArrayRecord files for tf.data, and read straight from its IDX files for Grain; and
`"fashion_mnist_native"`, the same images each at its own aspect ratio and size, and
`"fashion_mnist_canvas"`, each undistorted on a canvas of its own aspect ratio."""

import dataclasses

import numpy as np

from . import DataSource

NAME = "fashion_mnist_local"
NATIVE_NAME = "fashion_mnist_native"
CANVAS_NAME = "fashion_mnist_canvas"


class FashionMnistOffline(DataSource):
    described = (f"'{NAME}' (offline Fashion-MNIST), '{NATIVE_NAME}' (the same at random "
                 f"aspect ratios), '{CANVAS_NAME}' (the same on canvases of random aspect ratios)")

    @classmethod
    def matches(cls, dataset):
        return dataset in (NAME, NATIVE_NAME, CANVAS_NAME)

    def builder(self):
        import tensorflow_datasets as tfds

        from .. import fashion_mnist  # noqa: F401  (defining the builder registers it)

        builder = tfds.builder(self.dataset, data_dir=self.data_dir)
        # ArrayRecord, for random access (train.data.records).
        builder.download_and_prepare(file_format="array_record")
        return builder

    def grain_problem(self):
        return ""

    def grain_split(self, split):
        from .. import fashion_mnist

        return OfflineArrays(split, resample=fashion_mnist.RESAMPLED.get(self.dataset))


class OfflineArrays:
    """The offline default's `split` (any TFDS split expression) read from its IDX files:
    record i of "train" is image i of train-images-idx3-ubyte.gz (`resample`d, given one of
    `fashion_mnist.RESAMPLED`, as that dataset's TFDS builder does)."""

    def __init__(self, split, resample=None):
        import tensorflow_datasets as tfds

        from .. import fashion_mnist

        self.class_names = list(fashion_mnist.CLASS_NAMES)
        arrays = {name: fashion_mnist.read_split(name) for name in fashion_mnist.SPLITS}
        sizes = {name: _SplitSize(len(images)) for name, (images, _) in arrays.items()}
        parts = tfds.core.ReadInstruction.from_spec(split).to_absolute(sizes)
        self.images = np.concatenate([arrays[part.splitname][0][part.from_:part.to]
                                      for part in parts])[..., None]
        # Each record's split and index there, which its resampling is drawn from.
        self.resample, self.origins = resample, None
        if resample:
            self.origins = [(part.splitname, index) for part in parts for index in
                            range(len(arrays[part.splitname][1]))[part.from_:part.to]]
        self.labels = np.concatenate([arrays[part.splitname][1][part.from_:part.to]
                                      for part in parts]).astype(np.int64)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index]
        if self.resample is not None:
            image = self.resample(image[..., 0], *self.origins[index])[..., None]
        return image, int(self.labels[index]), index


@dataclasses.dataclass
class _SplitSize:  # what TFDS' ReadInstruction.to_absolute reads of a split
    num_examples: int

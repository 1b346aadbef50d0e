"""A folder of images as a dataset: `config.dataset = "folder:/path/to/root"`, laid out as
root/<split>/<class>/<image files> (TFDS' `ImageFolder`), every file decoded once before
training so that a bad one is named now, not hours later."""

import os
import re

from . import DataSource

PREFIX = "folder:"


class Folder(DataSource):
    described = f"'{PREFIX}/path/to/root' for a folder of images"

    @classmethod
    def matches(cls, dataset):
        return dataset.startswith(PREFIX)

    @property
    def root(self):
        return self.dataset[len(PREFIX):]

    def problems(self):
        if "://" not in self.root and not os.path.isdir(self.root):
            return [f"config.dataset={self.dataset!r}: {self.root!r} is not a folder. A folder "
                    "dataset is root/<split>/<class>/<image files>"]
        return []

    def builder(self):
        import tensorflow as tf
        import tensorflow_datasets as tfds

        if not tf.io.gfile.isdir(self.root):
            raise ValueError(f"dataset={self.dataset!r}: {self.root!r} is not a folder. A "
                             "folder dataset is root/<split>/<class>/<image files>.")
        builder = tfds.folder_dataset.ImageFolder(self.root)
        if not builder.info.splits:
            raise ValueError(f"dataset={self.dataset!r}: {self.root} holds no images. A folder "
                             "dataset is root/<split>/<class>/<image files> (.jpg, .jpeg, "
                             f".png), e.g. {self.root}/train/cat/1.jpg.")
        check_image_files(sorted(example.image_path for examples in
                                 getattr(builder, "_split_examples", {}).values()
                                 for example in examples))
        return builder

    def grain_problem(self):
        return "a folder of images is listed and checked with TensorFlow (TFDS' ImageFolder)"


def check_image_files(paths, threads=8):
    """Decodes every file once; raises ValueError naming the files that are not readable
    images (so that training does not stop on them hours later)."""
    import concurrent.futures
    import time

    import tensorflow as tf
    from absl import logging

    from keras_vit.preprocessing import decode_image

    from ...console import native_output

    def problem(path):
        try:
            decode_image(tf.io.read_file(path))
        except (tf.errors.OpError, ValueError) as error:
            message = getattr(error, "message", str(error)).splitlines()[0]
            message = re.sub(r"\{\{.*?\}\}|\[Op:.*$", "", message).strip()
            return f"{path} ({message})"
        return None

    start = time.time()
    # libjpeg's own lines ("Improper call to JPEG library") dropped: the error names each file.
    with native_output.dropped(), concurrent.futures.ThreadPoolExecutor(threads) as pool:
        bad = [found for found in pool.map(problem, paths) if found]
    logging.info("Checked %d image files in %.1f s.", len(paths), time.time() - start)
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"{len(bad)} of {len(paths)} image files cannot be decoded: {shown}. "
                         "Remove or replace them (PNG or JPEG).")

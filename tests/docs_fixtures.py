"""What the code blocks of README.md and docs/*.md assume exists, made small (tests/test_docs.py).

Their `setup:` and `check:` code calls these as `docs.NAME(...)`; shell setups run
`python -m docs_fixtures images a.jpg b.png`. Nothing here downloads: a published checkpoint is
a tiny file put where Keras' download cache would hold it, and TF Serving is the SavedModel
loaded in this process, answering the REST body the way the server does.
"""

import base64
import contextlib
import os
import sys

import numpy as np

# The size every transformer of the variant table takes under `tiny_variants()`:
# (hidden_size, mlp_dim, num_heads, num_layers).
TINY_SIZE = (16, 32, 2, 1)


def random_images(count, size, seed=0):
    """`count` uint8 RGB images of `size` x `size` pixels."""
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def labelled_images(count, size, classes=10, seed=0):
    """`(images, labels)`: `count` images scaled to [-1, 1] as a model takes them, and labels
    cycling through `classes` (so a k-shot draw finds k examples of each)."""
    images = random_images(count, size, seed).astype(np.float32) / 127.5 - 1.0
    return images, np.arange(count) % classes


@contextlib.contextmanager
def tiny_variants():
    """Every transformer size of the variant table is TINY_SIZE while this is active, so
    `keras_vit.ViT_L16()` builds in milliseconds; patch sizes and ResNet stems are unchanged."""
    from keras_vit.architecture import variants

    sizes = variants.TRANSFORMER_SIZES
    saved = dict(sizes)
    sizes.update({name: TINY_SIZE for name in sizes})
    try:
        yield
    finally:
        sizes.update(saved)


def save_tiny_npz(variant, path, **kwargs):
    """Writes the original checkpoint layout of `keras_vit.vit(variant, **kwargs)` (at the sizes
    in force, tiny under `tiny_variants()`) to `path`, creating its folder."""
    import keras_vit

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    keras_vit.weights.checkpoint.save_npz(keras_vit.vit(variant, **kwargs), path)
    return path


def fake_published(name, variant):
    """Puts a tiny `variant` checkpoint where `weights=name` finds it already downloaded:
    `$KERAS_HOME/models/keras_vit/`, under the file name keras_vit.weights.pretrained caches it
    as."""
    from keras_vit.weights import pretrained

    cache = os.path.join(os.environ["KERAS_HOME"], "models", "keras_vit")
    return save_tiny_npz(variant, os.path.join(cache, pretrained.PUBLISHED[name][variant]
                                               .replace("/", "--")))


def write_image_files(*paths, size=40):
    """Small RGB image files, in the format their extension names (.png, .jpg, ...)."""
    from PIL import Image  # not TensorFlow: a shell setup starts in a blink

    for index, path in enumerate(paths):
        Image.fromarray(random_images(1, size, seed=index)[0]).save(path)


class FakeRestServer:
    """Stands in for `requests` against TF Serving's REST predict endpoint: `post(url, json=body)`
    runs the body's instances (`{"b64": ...}` decoded to bytes, as the server does) through the
    SavedModel's signature and answers in the row ("predictions") format."""

    def __init__(self, export_dir):
        import tensorflow as tf

        self._loaded = tf.saved_model.load(export_dir)

    def post(self, url, json):
        import tensorflow as tf

        body = json
        signature = self._loaded.signatures[body.get("signature_name", "serving_default")]
        (name, spec), = signature.structured_input_signature[1].items()
        instances = [base64.b64decode(item["b64"]) if isinstance(item, dict) else item
                     for item in body["instances"]]
        outputs = {key: value.numpy() for key, value in
                   signature(**{name: tf.constant(instances, dtype=spec.dtype)}).items()}
        predictions = [{key: _jsonable(value[row]) for key, value in outputs.items()}
                       for row in range(len(instances))]
        return _Response({"predictions": predictions})


class _Response:
    def __init__(self, content):
        self._content = content

    def json(self):
        return self._content


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return [_jsonable(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value.item()


def main(argv):
    """`python -m docs_fixtures images FILE...`: writes small image files (for shell blocks)."""
    if len(argv) < 2 or argv[0] != "images":
        sys.exit("usage: python -m docs_fixtures images FILE...")
    write_image_files(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])

"""Names of the published ViT checkpoints and how `weights=` finds the file.

`weights` may be a local path, an `https://` or `file://` URL, a `gs://` path, or a name
from `PUBLISHED` such as "imagenet21k". Downloads go through `keras.utils.get_file` (cached in
`~/.keras/models/keras_vit/`, with a progress bar).
"""

import os

BUCKET_URL = "https://storage.googleapis.com/vit_models/"

# The recommended AugReg ImageNet-21k checkpoints ("How to train your ViT?", Steiner et al.).
_AUGREG_I21K = {
    "Ti/16": "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "S/16": "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
    "S/32": "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0",
    "B/8": "B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0",
    "B/16": "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "B/32": "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
    "L/16": "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0",
}


def _paper_file(variant):
    """"B/16" -> "ViT-B_16", "R50+B/16" -> "R50+ViT-B_16"."""
    resnet, _, vit_name = variant.rpartition("+")
    return f"{resnet + '+' if resnet else ''}ViT-{vit_name.replace('/', '_')}"


# name -> {variant: path under the bucket}
PUBLISHED = {
    "imagenet21k": {v: f"imagenet21k/{_paper_file(v)}.npz" for v in (
        "B/8", "B/16", "B/32", "L/16", "L/32", "H/14", "R50+B/16")},
    "imagenet21k+imagenet2012": {v: f"imagenet21k+imagenet2012/{_paper_file(v)}.npz"
                                 for v in ("B/16", "B/32", "L/16", "L/32")},
    "imagenet21k+imagenet2012-224": {
        v: f"imagenet21k+imagenet2012/{_paper_file(v)}-224.npz" for v in ("B/16", "L/16")},
    "augreg-i21k": {v: f"augreg/{name}.npz" for v, name in _AUGREG_I21K.items()},
}


def published_url(name, variant):
    """The download URL of a published checkpoint for a variant."""
    if name not in PUBLISHED:
        raise ValueError(
            f"Unknown weights {name!r}: pass a file path, a URL, a gs:// path, or one of "
            f"{sorted(PUBLISHED)}.")
    if variant not in PUBLISHED[name]:
        raise ValueError(
            f"No {name!r} checkpoint was published for ViT {variant}; it exists for "
            f"{sorted(PUBLISHED[name])}.")
    return BUCKET_URL + PUBLISHED[name][variant]


def resolve_weights(weights, variant, cache_dir=None):
    """Returns a local path (or gs:// path) for `weights`, downloading into the cache if needed.

    Args:
        weights: a path, an `https://`/`http://`/`file://` URL, a `gs://` path, or a name
            from `PUBLISHED`.
        variant: the model's variant name, to pick the file of a published name.
        cache_dir: the Keras cache directory (default `$KERAS_HOME` or `~/.keras`).
    """
    import keras

    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            f"weights must be a published name (one of {sorted(PUBLISHED)}), a file path, a "
            f"URL or a gs:// path, got {weights!r} ({type(weights).__name__}).")
    weights = os.fspath(weights)
    if weights.startswith("gs://") or os.path.exists(weights):
        return weights  # read in place: tf.io.gfile reads gs:// directly
    if weights in PUBLISHED:
        weights = published_url(weights, variant)
    elif weights.startswith("augreg/"):
        weights = BUCKET_URL + (weights if weights.endswith(".npz") else weights + ".npz")
    if not weights.startswith(("https://", "http://", "file://")):
        raise FileNotFoundError(
            f"weights={weights!r} is neither an existing file, a URL, a gs:// path, nor a "
            f"published name ({', '.join(sorted(PUBLISHED))}).")
    # Keep the bucket folder in the cached name: imagenet21k/ and imagenet21k+imagenet2012/
    # hold files of the same name.
    relative = weights[len(BUCKET_URL):] if weights.startswith(BUCKET_URL) else None
    # Keras reads KERAS_HOME once at import; read it now so a later setting counts.
    cache_dir = cache_dir or os.environ.get("KERAS_HOME")
    fname = (relative or weights.rstrip("/").rsplit("/", 1)[-1]).replace("/", "--")
    try:
        return keras.utils.get_file(fname=fname, origin=weights,
                                    cache_subdir=os.path.join("models", "keras_vit"),
                                    cache_dir=cache_dir)
    except Exception as error:  # get_file raises a bare Exception for network failures
        from keras_vit.weights.checkpoint import CheckpointError

        raise CheckpointError(
            f"The checkpoint {weights!r} could not be downloaded ({error}). Check the URL and "
            "the network, or pass a local path.") from error

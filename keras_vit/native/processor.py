"""Images of any sizes to the arrays a NaFlex model takes, each image at its own aspect ratio
within a budget of patches (SigLIP 2's NaFlex; transformers' `Siglip2ImageProcessor` makes the
same arrays under the same names):

- `pixel_values` `[batch, max_num_patches, P * P * 3]` float32 in [-1, 1]: each image resized
  to `image_size_for_budget`, cut into P x P patches, each patch (P, P, 3) flattened, the
  patches row-major, zeros after the last;
- `pixel_attention_mask` `[batch, max_num_patches]` int32, 1 for a patch, 0 for padding;
- `spatial_shapes` `[batch, 2]` int32, the rows and columns of each image's patch grid.
"""

import math
import types

import numpy as np

from keras_vit.architecture.variants import _describe, check_int

# transformers' `get_image_size_for_max_num_patches`: a binary search on one scale for both
# sides, from eps / 10 to 100 until the interval is narrower than eps. The interval halves
# each step whichever side moves, so every image takes the same 24 steps: written as a fixed
# loop, the one search runs on Python floats and on TensorFlow tensors (whole batches) alike.
EPS = 1e-5
_LOW, _HIGH = EPS / 10, 100.0
STEPS = math.ceil(math.log2((_HIGH - _LOW) / EPS))


# The search on Python floats (IEEE doubles, as NumPy's float64): for one image, 67 us against
# 269 us on NumPy scalars (2-core AMD EPYC).
_PYTHON = types.SimpleNamespace(ceil=math.ceil, maximum=max,
                                where=lambda fits, yes, no: yes if fits else no)


def _search(heights, widths, patch_size, max_num_patches, xp):
    """The budget search on float64 values in `xp`: Python floats (`_PYTHON`), or TensorFlow's
    ops through a namespace with `ceil`, `maximum`, `where`."""
    def scaled(scale, size):  # a multiple of the patch, at least one patch
        return xp.maximum(xp.ceil(size * scale / patch_size) * patch_size, float(patch_size))

    low = heights * 0.0 + _LOW
    high = heights * 0.0 + _HIGH
    for _ in range(STEPS):
        scale = (low + high) / 2
        patches = (scaled(scale, heights) / patch_size) * (scaled(scale, widths) / patch_size)
        fits = patches <= max_num_patches
        low, high = xp.where(fits, scale, low), xp.where(fits, high, scale)
    return scaled(low, heights), scaled(low, widths)


def _check_budget(patch_size, max_num_patches):
    check_int("patch_size", patch_size)
    check_int("max_num_patches", max_num_patches)


def image_size_for_budget(height, width, patch_size, max_num_patches):
    """`(height, width)` in pixels of the largest resize of a `height` x `width` image whose
    sides are multiples of `patch_size` (at least one patch each) and whose patches number at
    most `max_num_patches`, both sides scaled alike: transformers'
    `get_image_size_for_max_num_patches`, the same sizes for every image and budget."""
    _check_budget(patch_size, max_num_patches)
    check_int("height", height)
    check_int("width", width)
    sizes = _search(float(height), float(width), patch_size, max_num_patches, _PYTHON)
    return tuple(int(size) for size in sizes)


def image_sizes_for_budget_tf(heights, widths, patch_size, max_num_patches):
    """`image_size_for_budget` of tensors of heights and widths, as int32 tensors: for
    tf.data and the SavedModel, the same search in TensorFlow ops. `max_num_patches` may be a
    tensor of budgets too."""
    import tensorflow as tf

    if tf.is_tensor(max_num_patches):
        check_int("patch_size", patch_size)
        max_num_patches = tf.cast(max_num_patches, tf.float64)
    else:
        _check_budget(patch_size, max_num_patches)
    ops = types.SimpleNamespace(ceil=tf.math.ceil, maximum=tf.maximum, where=tf.where)
    heights, widths = (tf.cast(side, tf.float64) for side in (heights, widths))
    return tuple(tf.cast(size, tf.int32)
                 for size in _search(heights, widths, patch_size, max_num_patches, ops))


def patchify(image, patch_size):
    """`[rows * columns, P * P * C]`: an `[height, width, C]` image (sides multiples of P) cut
    into P x P patches, each (P, P, C) flattened, the patches row-major."""
    height, width, channels = image.shape
    rows, columns = height // patch_size, width // patch_size
    patches = np.reshape(image, (rows, patch_size, columns, patch_size, channels))
    return np.reshape(np.transpose(patches, (0, 2, 1, 3, 4)), (rows * columns, -1))


def _checked_image(index, image):
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] != 3 or min(image.shape[:2]) < 1:
        raise ValueError(f"Image {index} must be [height, width, 3] RGB pixels, got shape "
                         f"{image.shape}.")
    if image.dtype != np.uint8:
        raise TypeError(f"Image {index} must hold uint8 pixels 0..255, got {image.dtype} "
                        "(decoded image files are uint8).")
    return image


def _image_list(images):
    if isinstance(images, np.ndarray) and images.ndim == 4:
        images = list(images)
    if not isinstance(images, (list, tuple)) or not images:
        raise TypeError(f"images must be a non-empty list of [height, width, 3] uint8 arrays, "
                        f"got {_describe(images)}.")
    return images


def image_patches(image, patch_size, max_num_patches, index=0):
    """`(patches, (rows, columns))`: a uint8 `[height, width, 3]` image resized (bilinear,
    antialiased, in `keras.ops`) to its `image_size_for_budget`, scaled to [-1, 1] (as
    transformers' mean = std = 0.5 after 1/255) and cut into `[rows * columns, P * P * 3]`
    patches. `index` names the image in errors."""
    import keras

    from keras_vit.preprocessing import scale_pixels

    image = _checked_image(index, image)
    size = image_size_for_budget(*image.shape[:2], patch_size, max_num_patches)
    pixels = image.astype(np.float32)
    if size != image.shape[:2]:
        pixels = keras.ops.convert_to_numpy(keras.ops.image.resize(
            pixels[None], size, interpolation="bilinear", antialias=True))[0]
    return patchify(scale_pixels(pixels), patch_size), (size[0] // patch_size,
                                                        size[1] // patch_size)


def prepare(images, patch_size=16, max_num_patches=256):
    """The NaFlex arrays (module docstring) of `images`, a list of uint8 `[height, width, 3]`
    arrays of any sizes: each image's `image_patches`, padded to `max_num_patches`. NumPy
    arrays out, for any backend and for Grain."""
    _check_budget(patch_size, max_num_patches)
    images = _image_list(images)
    values = np.zeros((len(images), max_num_patches, patch_size * patch_size * 3), np.float32)
    mask = np.zeros((len(images), max_num_patches), np.int32)
    shapes = np.zeros((len(images), 2), np.int32)
    for index, image in enumerate(images):
        patches, shapes[index] = image_patches(image, patch_size, max_num_patches, index)
        values[index, :len(patches)] = patches
        mask[index, :len(patches)] = 1
    return {"pixel_values": values, "pixel_attention_mask": mask, "spatial_shapes": shapes}


def pack(images, patch_size=16, max_num_patches=256, sequence_length=1024, max_images=8):
    """Several images in each sequence (NaViT's packing: Dehghani et al., "Patch n' Pack",
    2023): each image's `image_patches` within its own budget of `max_num_patches`, packed by
    `pack_patches` into as many sequences as they need. NumPy arrays out (`pack_patches`)."""
    _check_budget(patch_size, max_num_patches)
    _check_packing(max_num_patches, sequence_length, max_images)
    found = [image_patches(image, patch_size, max_num_patches, index)
             for index, image in enumerate(_image_list(images))]
    return pack_patches([patches for patches, _ in found], [grid for _, grid in found],
                        sequence_length, max_images)


def _check_packing(max_num_patches, sequence_length, max_images):
    check_int("sequence_length", sequence_length)
    check_int("max_images", max_images)
    if sequence_length < max_num_patches:
        raise ValueError(f"sequence_length {sequence_length} is shorter than max_num_patches "
                         f"{max_num_patches}: an image of the whole budget would fit no "
                         "sequence.")


def _first_fit(counts, sequence_length, max_images, sequences):
    """Per sequence, the indices of the images it holds: each image, in order, goes into the
    first sequence with room for its `counts[i]` patches and fewer than `max_images` images
    (first fit). With `sequences` given, that many sequences and an image that fits none is
    left out; otherwise as many as the images need."""
    rows = len(counts) if sequences is None else sequences
    if not rows:
        return []
    # Each sequence's room in patches, -1 once its slots are full; the sequences not yet opened
    # have all of it, so the first with room is an open one, else the next to open.
    room = np.full(rows, sequence_length)
    placed = [[] for _ in range(rows)]
    for index, count in enumerate(counts):
        row = int(np.argmax(room >= count))
        if room[row] < count:
            continue  # fits none of the `sequences`: left out
        placed[row].append(index)
        room[row] = room[row] - count if len(placed[row]) < max_images else -1
    if sequences is None:
        placed = placed[:sum(1 for indices in placed if indices)]
    return placed


def pack_patches(patches, grids, sequence_length, max_images, sequences=None):
    """The images' `patches` (each `[rows * columns, P * P * 3]`, or longer with padding
    rows after them) of `grids` (rows, columns) packed into sequences (`_first_fit`). NumPy
    arrays out:

    - `pixel_values` `[sequences, sequence_length, P * P * 3]`, zeros where no image is;
    - `segment_ids` `[sequences, sequence_length]` int32: 0 for padding, k for the sequence's
      k-th image (its slot);
    - `patch_coords` `[sequences, sequence_length, 2]` int32: each patch's row and column;
    - `spatial_shapes` `[sequences, max_images, 2]` int32: each slot's grid, (0, 0) if empty;
    - `image_index` `[sequences, max_images]` int32: which image each slot holds, -1 if none
      (a `NaFlexViT` gives one output per slot; an image in no slot was left out).
    """
    grids = np.asarray(grids, np.int64).reshape(-1, 2)
    counts = grids[:, 0] * grids[:, 1]
    if counts.size and counts.max() > sequence_length:
        raise ValueError(f"An image of {counts.max()} patches fits no sequence of "
                         f"{sequence_length}.")
    placed = _first_fit(counts.tolist(), sequence_length, max_images, sequences)
    count, width = len(placed), patches[0].shape[-1] if len(patches) else 0
    arrays = {"pixel_values": np.zeros((count, sequence_length, width), np.float32),
              "segment_ids": np.zeros((count, sequence_length), np.int32),
              "patch_coords": np.zeros((count, sequence_length, 2), np.int32),
              "spatial_shapes": np.zeros((count, max_images, 2), np.int32),
              "image_index": np.full((count, max_images), -1, np.int32)}
    # Where each placed image goes, then every patch at once: one scatter per array, not a few
    # NumPy calls per image (a batch of 128 images packed 5x faster).
    images = [index for indices in placed for index in indices]
    if not images:
        return arrays
    rows = np.repeat(np.arange(count), [len(indices) for indices in placed])
    slots = np.concatenate([np.arange(len(indices)) for indices in placed])
    arrays["spatial_shapes"][rows, slots] = grids[images]
    arrays["image_index"][rows, slots] = images
    sizes = counts[images]
    offsets = np.cumsum(sizes) - sizes  # each image's first patch, all rows end to end
    starts = offsets - offsets[np.searchsorted(rows, rows)]  # ... in its row (rows ascend)
    patch = np.arange(sizes.sum()) - np.repeat(offsets, sizes)  # its place in its image
    token_row, position = np.repeat(rows, sizes), np.repeat(starts, sizes) + patch
    arrays["pixel_values"][token_row, position] = np.concatenate(
        [patches[index][:size] for index, size in zip(images, sizes)])
    arrays["segment_ids"][token_row, position] = np.repeat(slots + 1, sizes)
    columns = np.repeat(grids[images, 1], sizes)
    arrays["patch_coords"][token_row, position] = np.stack([patch // columns, patch % columns], -1)
    return arrays


def image_patches_tf(image, patch_size, max_num_patches):
    """`image_patches` in TensorFlow ops, for tf.data: `(patches, grid)` of a uint8 `[height,
    width, 3]` image, the patches `[rows * columns, P * P * 3]` (the caller pads them).
    `max_num_patches` may be a scalar tensor (a budget drawn per image); both are checked by
    `image_sizes_for_budget_tf`."""
    import tensorflow as tf

    height, width = image_sizes_for_budget_tf(tf.shape(image)[0], tf.shape(image)[1],
                                              patch_size, max_num_patches)
    return resized_patches_tf(image, height, width, patch_size)


def resized_patches_tf(image, height, width, patch_size):
    """`image_patches_tf` of an image whose size for its budget is known (`height`, `width`:
    `image_sizes_for_budget_tf`'s, which a pipeline runs on many images at once): the image
    resized to it (bilinear, antialiased), scaled to [-1, 1] and cut into patches."""
    import tensorflow as tf

    from keras_vit.preprocessing import scale_pixels

    pixels = tf.image.resize(tf.cast(image, tf.float32), tf.stack([height, width]),
                             method="bilinear", antialias=True)
    rows, columns = height // patch_size, width // patch_size
    patches = tf.reshape(scale_pixels(pixels), [rows, patch_size, columns, patch_size, 3])
    patches = tf.reshape(tf.transpose(patches, [0, 2, 1, 3, 4]), [rows * columns, -1])
    return patches, tf.stack([rows, columns])

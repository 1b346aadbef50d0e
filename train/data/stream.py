"""The training stream as arithmetic, one function of (seed, position) for every pipeline: which
record of a random-access split each stream position reads (`records_at`), the random
numbers of its crop and flip (`crop_draws`, `crop_box`), and its budget of patches at native
resolution (`budget_draws`). Plain NumPy: the Grain pipeline calls
it directly and the tf.data pipeline through `tf.numpy_function`, once a batch, so that a config
and seed train on the same examples, cropped and flipped alike, on either engine, either
pipeline and any number of hosts.

The order: epoch e is a permutation of the split's n records keyed by (seed, e), found for any
position without the positions before it: a 4-round Feistel network over the smallest even
number of bits that holds n, cycle-walked into [0, n) (Black and Rogaway, "Ciphers with
Arbitrary Finite Domains", CT-RSA 2002), the construction of TensorFlow's `index_shuffle`, with
SplitMix64's finaliser as its round function (Steele, Lea and Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014).
"""

import numpy as np

ROUNDS = 4
CROP_TRIES = 10  # as Inception's crop (and tf.image.sample_distorted_bounding_box) tries
# Salts that keep the order's keys, the crop's numbers and the budgets apart for one seed.
ORDER_SALT, CROP_SALT, BUDGET_SALT = 0x4F52444552, 0x43524F50, 0x4E4146
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x):
    """SplitMix64's finaliser: a bijection of uint64 whose output bits each depend on all input
    bits (integer arithmetic wraps modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash(a, b):
    """A uint64 hash of two uint64 arrays (broadcast)."""
    return _mix(_mix(a) ^ (b * _GOLDEN))


def _uint64(values):
    """int arrays (negative seeds too) as uint64, modulo 2**64."""
    return np.asarray(values, np.int64).astype(np.uint64)


def records_at(positions, size, seed):
    """The record numbers (int64, the shape of `positions`) that the stream positions
    `positions` read of a split of `size` records: position p is record `permutation(seed,
    p // size)[p % size]`, each epoch a new permutation."""
    positions = np.asarray(positions, np.int64)
    if size < 1 or (positions < 0).any():
        raise ValueError(f"Stream positions are >= 0 over a split of >= 1 record; got size {size}"
                         f" and positions from {positions.min(initial=0)}.")
    epochs, offsets = np.divmod(positions, size)
    with np.errstate(over="ignore"):
        epoch_keys = _hash(_hash(_uint64(seed), _uint64(ORDER_SALT)), _uint64(epochs))
        keys = [_hash(epoch_keys, np.uint64(round_)) for round_ in range(ROUNDS)]
        half_bits = max(1, (int(size - 1).bit_length() + 1) // 2)
        result = _feistel(offsets.astype(np.uint64), keys, half_bits)
        outside = result >= size  # cycle-walk: apply again until inside the split
        while outside.any():
            result[outside] = _feistel(result[outside], [key[outside] for key in keys],
                                       half_bits)
            outside = result >= size
    return result.astype(np.int64)


def _feistel(values, keys, half_bits):
    """A bijection of [0, 4**half_bits): `len(keys)` Feistel rounds over two halves of
    `half_bits` bits each, round r mixing in `keys[r]` (arrays the shape of `values`)."""
    values = np.array(values, np.uint64, ndmin=1)
    keys = [np.broadcast_to(key, values.shape) for key in keys]
    shift, mask = np.uint64(half_bits), np.uint64((1 << half_bits) - 1)
    left, right = values >> shift, values & mask
    for key in keys:
        left, right = right, left ^ (_hash(right, key) & mask)
    return (left << shift) | right


def crop_draws(positions, seed):
    """float64 [len(positions), 4 * CROP_TRIES + 1] uniform numbers in [0, 1) of the stream
    positions' crops and flips (`crop_box` reads them), a function of (seed, position)."""
    positions = np.asarray(positions, np.int64).reshape(-1, 1)
    columns = np.arange(4 * CROP_TRIES + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        keys = _hash(_hash(_uint64(seed), _uint64(CROP_SALT)), _uint64(positions))
        bits = _hash(keys, columns)
    return _uniform(bits)


def _uniform(bits):
    """uint64 hashes to float64 uniform numbers in [0, 1): their top 53 bits."""
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def budget_draws(positions, seed, low, high):
    """int64 budgets of patches (the shape of `positions`), each uniform in [low, high] and a
    function of (seed, stream position): `config.native_min_patches`' draw (NaViT's resolution
    sampling), the same number in every pipeline."""
    positions = np.asarray(positions, np.int64)
    with np.errstate(over="ignore"):
        bits = _hash(_hash(_uint64(seed), _uint64(BUDGET_SALT)), _uint64(positions))
    return low + np.floor(_uniform(bits) * (high - low + 1)).astype(np.int64)


def crop_box(height, width, draws, min_area):
    """`(top, left, crop_height, crop_width, flip)` of one image from its `crop_draws` row:
    Inception's crop, the first of CROP_TRIES tries whose area in [min_area, 1] of the image's
    and aspect ratio in [3/4, 4/3] fits, else the whole image; flip when the last draw is below
    0.5. tf_pipeline.crop_box is the same arithmetic in TensorFlow ops (a test holds them
    equal)."""
    tries = np.asarray(draws[:4 * CROP_TRIES], np.float64).reshape(CROP_TRIES, 4)
    area = (min_area + tries[:, 0] * (1.0 - min_area)) * height * width
    aspect = 3 / 4 + tries[:, 1] * (4 / 3 - 3 / 4)
    crop_height = np.floor(np.sqrt(area / aspect) + 0.5)
    crop_width = np.floor(crop_height * aspect + 0.5)
    fits = (crop_height >= 1) & (crop_height <= height) & (crop_width >= 1) & (crop_width <= width)
    flip = bool(draws[4 * CROP_TRIES] < 0.5)
    if not fits.any():
        return 0, 0, height, width, flip
    first = int(np.argmax(fits))
    crop_height, crop_width = int(crop_height[first]), int(crop_width[first])
    top = int(np.floor(tries[first, 2] * (height - crop_height + 1)))
    left = int(np.floor(tries[first, 3] * (width - crop_width + 1)))
    return top, left, crop_height, crop_width, flip

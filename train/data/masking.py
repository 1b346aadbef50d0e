"""Draws the corruption of one image's patches for masked patch prediction (paper appendix
B.1.2), in the input pipeline.

Of an image's N patches, `corruption_rate` are corrupted (the count is rounded up or down at
random, so that the expected share is exactly the rate); each corrupted patch is then, at random,
MASKED with probability `mask_rate`, REPLACED by another patch of the same image with
probability `random_rate`, and otherwise KEPT as it is (still predicted). The draw is a pure
function of its seed (stateless random ops), so a resumed run and a run on more replicas
corrupt every example exactly as an uninterrupted run on one device does.
"""

import tensorflow as tf

from keras_vit.masked_patches import KEPT, MASKED, NOT_CORRUPTED, REPLACED


def draw_corruption(seed, num_patches, corruption_rate, mask_rate, random_rate):
    """Returns `(corruption, source)`, int32 `[num_patches]` each: the codes of
    `keras_vit.masked_patches` and, for REPLACED patches, the index of the other patch whose
    embedding replaces theirs (every other patch its own index). `seed`: shape-[2] int."""
    count_seed, order_seed, kind_seed, source_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 4))
    count = tf.cast(tf.floor(corruption_rate * num_patches
                             + tf.random.stateless_uniform([], count_seed)), tf.int32)
    # The `count` patches that come first in a random order are corrupted.
    order = tf.argsort(tf.random.stateless_uniform([num_patches], order_seed))
    corrupted = tf.argsort(order) < count
    kind = tf.random.stateless_uniform([num_patches], kind_seed)
    corruption = tf.where(kind < mask_rate, MASKED,
                          tf.where(kind < mask_rate + random_rate, REPLACED, KEPT))
    corruption = tf.where(corrupted, corruption, NOT_CORRUPTED)
    positions = tf.range(num_patches)
    if num_patches > 1:  # any other patch: a shift of 1 .. N-1 places, wrapping around
        shift = tf.random.stateless_uniform([num_patches], source_seed, minval=1,
                                            maxval=num_patches, dtype=tf.int32)
        source = tf.where(corruption == REPLACED, (positions + shift) % num_patches, positions)
    else:
        source = positions
    return corruption, source

"""Mixup and CutMix on pairs of neighbouring images of the training stream (positions 2k and
2k + 1), as stateless TensorFlow ops.

Mixup ("mixup: Beyond Empirical Risk Minimization", Zhang et al., 2018) blends two images by a
weight drawn from Beta(alpha, alpha); CutMix ("CutMix: Regularization Strategy to Train Strong
Classifiers with Localizable Features", Yun et al., 2019) pastes a box of one into the other,
the box's area drawn the same way. The labels are mixed by what each image contributes. With
both on, a pair is cut with probability `cutmix_switch_prob`, else mixed (DeiT, timm's `Mixup`).

Each pair draws its own mixing from (seed, pair), as timm's "pair" mode, so every batch is a
pure function of (seed, step) and does not depend on how the global batch is split over
replicas and hosts (pairs never straddle two replicas' shares: their batches are even). Both
images of a pair swap the same region, and each keeps at least half of itself under Mixup (the
weight is max(w, 1 - w), as big_vision's Mixup).

An example carries its pair's mixing as `mix_params` (five numbers: a weight and CutMix's box)
until its batch is formed; `mix_pairs` then mixes the batch and replaces them by `mix_label` (the
partner's label) and `mix_weight` (the share of its own label: the mean of its own image's
weight over the pixels, so CutMix's label weight is the box's true area after clipping at the
edges). The loss is
mix_weight * CE(label) + (1 - mix_weight) * CE(mix_label), the cross-entropy of the mixed
one-hot targets (train.run.objectives).

Why not Keras' `MixUp` and `CutMix` layers (Keras 3.15): their draws come from a
`SeedGenerator` whose state advances with every call (batch k depends on the batches before
it), they draw a partner by shuffling the batch a replica holds, which changes with the
number of replicas, and Keras' CutMix draws its Beta's alpha itself uniformly in (0, factor).
"""

import tensorflow as tf

from .randaugment import box_mask, random_point

# Folded into the pair's seed: the mixing is independent of the images' own augmentation.
MIXING_SEED_SALT = 0x4D4958


def pair_seed(seed, position):
    """The seed of the pair that stream `position` belongs to (shape-[2] int64)."""
    return tf.random.experimental.stateless_fold_in(
        tf.stack([tf.constant(seed, tf.int64), position // 2]), MIXING_SEED_SALT)


def _beta(seed, alpha):
    """One draw of Beta(alpha, alpha), from two Gamma draws."""
    gammas = tf.random.stateless_gamma([2], seed, alpha=alpha)
    return gammas[0] / tf.maximum(gammas[0] + gammas[1], 1e-12)


def mix_params(seed, height, width, augmentation):
    """The mixing of a pair, drawn from its `seed`: float32 [weight, top, left, bottom, right],
    an image's own weight outside the box rows [top, bottom) x columns [left, right) and 0
    inside it. Mixup: its weight and no box; CutMix: weight 1 and a box of about (1 - w) of
    the image, sides sqrt(1 - w) of the image's centred anywhere in it, clipped at the edges
    (timm's `rand_bbox`). The same for both images of the pair."""
    switch_seed, mixup_seed, cutmix_seed, box_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 4))
    choices = []
    if augmentation.mixup_alpha > 0:
        weight = _beta(mixup_seed, augmentation.mixup_alpha)
        choices.append(tf.stack([tf.maximum(weight, 1.0 - weight), 0.0, 0.0, 0.0, 0.0]))
    if augmentation.cutmix_alpha > 0:
        ratio = tf.sqrt(1.0 - _beta(cutmix_seed, augmentation.cutmix_alpha))
        half = tf.cast(tf.cast([height, width], tf.float32) * ratio, tf.int32) // 2
        centre = random_point(box_seed, height, width)
        box = tf.cast(tf.concat([tf.maximum(centre - half, 0),
                                 tf.minimum(centre + half, [height, width])], 0), tf.float32)
        choices.append(tf.concat([[1.0], box], 0))
    if len(choices) == 1:
        return choices[0]
    cut = tf.random.stateless_uniform([], switch_seed) < augmentation.cutmix_switch_prob
    return tf.where(cut, choices[1], choices[0])


def _masks(params, height, width):
    """Each image's own weight at each pixel, [batch, height, width, 1], from `mix_params`."""
    weight = params[:, 0, None, None]
    top, left, bottom, right = [tf.cast(params[:, index, None, None], tf.int32)
                                for index in range(1, 5)]
    return tf.where(box_mask(height, width, top, left, bottom, right), 0.0, weight)[..., None]


def _swap_pairs(values):
    """Each element of a batch replaced by its pair's other element (0 <-> 1, 2 <-> 3, ...)."""
    pairs = tf.reshape(values, tf.concat([[-1, 2], tf.shape(values)[1:]], 0))
    return tf.reshape(tf.reverse(pairs, [1]), tf.shape(values))


def mix_pairs(batch):
    """A batch of examples with `mix_params` (an even number, pairs in order) mixed: `image`
    blended with its partner's pixel by pixel, `mix_label` and `mix_weight` added,
    `mix_params` dropped. The other entries are unchanged."""
    batch = dict(batch)
    images = batch["image"]
    mask = _masks(batch.pop("mix_params"), images.shape[1], images.shape[2])
    pixels = tf.cast(images, tf.float32)
    mixed = mask * pixels + (1.0 - mask) * _swap_pairs(pixels)
    batch["image"] = tf.cast(mixed, images.dtype)
    batch["mix_label"] = _swap_pairs(batch["label"])
    batch["mix_weight"] = tf.reduce_mean(mask, axis=[1, 2, 3])
    return batch

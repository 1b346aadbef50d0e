"""The paper's few-shot linear metric (section 4.1): a ridge classifier on frozen,
standardised features, closed form, over several draws of k examples per class."""

import keras
import numpy as np

from keras_vit.analysis.attention import check_images, check_naflex_inputs, _run_batch
from keras_vit.native import NaFlexViT


DEFAULT_SHOTS = (1, 5, 10, 25)


# Between the best two of 2^-10..2^14 (2^6 and 2^8, mean over k = 1, 5, 10, 25) measured on
# the quickstart model; features are standardised first, so it does not depend on their scale.
DEFAULT_L2_REG = 128.0


_STD_EPSILON = 1e-5  # keeps a constant feature from dividing by zero when standardising


def ridge_classifier(features, labels, num_classes, l2_reg=DEFAULT_L2_REG):
    """The regularised least-squares map from features to {-1, 1}^K targets, in closed form.

    Solves min_{W, b} |X W + b - Y|^2 + l2_reg |W|^2 (the bias is not regularised) and returns
    `(W [d, K], b [K])`. Uses the d x d normal equations or, with fewer examples than
    features, the equal n x n dual form.
    """
    x = np.asarray(features, np.float64)
    labels = _class_indices(labels, "labels", num_classes)
    _check_pairs(x, labels, "train")
    if not l2_reg > 0:
        raise ValueError(f"l2_reg must be > 0 (the fit is regularised), got {l2_reg}.")
    targets = 2.0 * np.eye(num_classes)[labels] - 1.0
    x_mean, y_mean = x.mean(axis=0), targets.mean(axis=0)
    xc, yc = x - x_mean, targets - y_mean
    n, d = xc.shape
    if n >= d:
        weights = np.linalg.solve(xc.T @ xc + l2_reg * np.eye(d), xc.T @ yc)
    else:
        weights = xc.T @ np.linalg.solve(xc @ xc.T + l2_reg * np.eye(n), yc)
    return weights, y_mean - x_mean @ weights


def _standardiser(features):
    mean = features.mean(axis=0)
    std = features.std(axis=0) + _STD_EPSILON
    return lambda x: (x - mean) / std


def few_shot_from_features(train_features, train_labels, test_features, test_labels,
                           shots=DEFAULT_SHOTS, l2_reg=DEFAULT_L2_REG, draws=5, seed=0,
                           num_classes=None):
    """Few-shot linear accuracy of fixed features.

    For each k in `shots` and each of `draws` random draws, k training examples per class are
    picked, standardised with their own mean and std per feature, fitted with
    `ridge_classifier`, and the test examples classified by the largest output.

    Returns:
        `{k: mean test accuracy over the draws}`.
    """
    train_features = np.asarray(train_features, np.float64)
    test_features = np.asarray(test_features, np.float64)
    train_labels = _class_indices(train_labels, "train labels", num_classes)
    test_labels = _class_indices(test_labels, "test labels", num_classes)
    _check_pairs(train_features, train_labels, "train")
    _check_pairs(test_features, test_labels, "test")
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}.")
    if not l2_reg > 0:
        raise ValueError(f"l2_reg must be > 0 (the fit is regularised), got {l2_reg}.")
    by_class = [np.flatnonzero(train_labels == label) for label in range(num_classes)]
    rng = np.random.default_rng(seed)
    results = {}
    for k in shots:
        if k < 1:
            raise ValueError(f"shots must be positive, got {k}.")
        short = {label: len(indices) for label, indices in enumerate(by_class)
                 if len(indices) < k}
        if short:
            raise ValueError(f"{k}-shot needs {k} training examples of every class; these "
                             f"classes have fewer: {short}. Give more training examples or "
                             "smaller shots.")
        accuracies = []
        for _ in range(draws):
            chosen = np.concatenate([rng.choice(indices, k, replace=False)
                                     for indices in by_class])
            standardise = _standardiser(train_features[chosen])
            weights, bias = ridge_classifier(standardise(train_features[chosen]),
                                             train_labels[chosen], num_classes, l2_reg)
            predicted = (standardise(test_features) @ weights + bias).argmax(axis=1)
            accuracies.append(float(np.mean(predicted == test_labels)))
        results[int(k)] = float(np.mean(accuracies))
    return results


def _class_indices(labels, what, num_classes=None):
    """`labels` as int64 class indices, or a ValueError naming what is wrong."""
    labels = np.asarray(labels)
    if labels.size and (labels.dtype.kind not in "iuf" or not np.all(labels == np.round(labels))
                        or labels.min() < 0):
        raise ValueError(f"{what} must be class indices (whole numbers >= 0), got "
                         f"{labels.dtype} values such as {labels.ravel()[:3]}.")
    labels = labels.astype(np.int64)
    if num_classes is not None and labels.size and labels.max() >= num_classes:
        raise ValueError(f"{what} go up to {labels.max()}, but num_classes={num_classes}.")
    return labels


def _check_pairs(features, labels, what):
    if features.ndim != 2 or labels.shape != (features.shape[0],) or not len(labels):
        raise ValueError(f"{what} features {features.shape} and labels {labels.shape} must be "
                         "[n, d] and [n] with n > 0.")
    if not np.all(np.isfinite(features)):
        raise ValueError(f"{what} features contain NaN or infinity; the model's outputs "
                         "overflowed or its weights are broken.")


def feature_model(model):
    """A model sharing `model`'s layers that outputs its representation: the pre-logits layer
    if it has one, else the pooled token, normalised where the model normalises it (what the
    paper's few-shot evaluation uses). Of a NaFlexViT, a model of its input dict to its
    `representation` (one per image; per slot, `[batch, slots, D]`, for packed images)."""
    if isinstance(model, NaFlexViT):
        return _NaFlexRepresentation(model)
    names = {layer.name for layer in model.layers}
    for name in ("pre_logits", "fc_norm", "MAPHead_0", "pool"):  # the last before the head
        if name in names:
            return keras.Model(model.inputs, model.get_layer(name).output,
                               name=f"{model.name}_features")
    raise ValueError(f"Model {model.name!r} has no 'pre_logits' or 'pool' layer; the few-shot "
                     "evaluation takes a model built by keras_vit.vit().")


class _NaFlexRepresentation(keras.Model):
    """A NaFlexViT's `representation` as a model of its input dict (its layers, its weights)."""

    def __init__(self, naflex, **kwargs):
        kwargs.setdefault("name", f"{naflex.name}_features")
        super().__init__(**kwargs)
        self.naflex = naflex

    def call(self, inputs):
        return self.naflex.representation(inputs)


def representations(model, data, batch_size=256, progress=None):
    """Features (`feature_model`) and labels of every example in `data`.

    `data` is a tuple `(images, labels)` of arrays, or an iterable (e.g. a `tf.data.Dataset`) of
    `(images, labels)` batches or of `{"image", "label"}` batches, optionally with a "mask"
    (examples with mask 0 are padding and dropped). Images must be scaled to [-1, 1] as the
    model takes them.
    For a NaFlexViT the images are its input dict (`keras_vit.native.prepare`'s arrays): a
    tuple `(inputs, labels)`, `(inputs, labels)` batches, or dict batches holding the inputs,
    "label" and optionally "mask" (or the training pipeline's "label_weight"). Packed inputs
    (`native.pack`) take a label per slot, `[sequences, slots]`; empty slots (a (0, 0) grid)
    are dropped.
    `progress`, if given, is called with the number of examples done after each batch.
    """
    features_of = feature_model(model)
    features, labels, done = [], [], 0
    for images, batch_labels, mask in _batches(data, batch_size, isinstance(model, NaFlexViT)):
        batch_features, batch_labels = _batch_features(model, features_of, images,
                                                       batch_labels, mask)
        if len(batch_features):
            features.append(batch_features)
            labels.append(batch_labels)
        done += len(batch_features)
        if progress is not None:
            progress(done)
    if not features:
        raise ValueError("data yielded no examples.")
    return np.concatenate(features), np.concatenate(labels)


def _batch_features(model, features_of, images, labels, mask):
    """`(features [n, D] float64, labels [n])` of one batch, its masked examples dropped."""
    labels = np.asarray(labels)
    if isinstance(model, NaFlexViT):
        return _naflex_batch_features(model, features_of, images, labels, mask)
    images = check_images(model, images)
    if mask is not None:
        images, labels = images[mask], labels[mask]
    if not len(images):
        return np.zeros((0, 0)), labels.reshape(-1)
    return (np.asarray(features_of.predict_on_batch(images), np.float64), labels.reshape(-1))


def _naflex_batch_features(model, features_of, inputs, labels, mask):
    """`_batch_features` of a NaFlexViT: one feature per image, or per filled slot (packed)."""
    inputs = check_naflex_inputs(model, inputs)
    features = np.asarray(_run_batch(features_of, inputs), np.float64)
    images = features.shape[:-1]  # [sequences], or [sequences, slots] packed
    keep = np.ones(images, bool) if mask is None else mask
    if labels.shape != images or keep.shape != images:
        raise ValueError(f"labels {labels.shape} (and a mask, {keep.shape}) must give one "
                         f"value per image of the NaFlex batch: {images} (packed: one per "
                         "slot).")
    if features.ndim == 3:  # an empty slot's grid is (0, 0): no image, its output means nothing
        keep = keep & (inputs["spatial_shapes"].prod(axis=-1) > 0)
    return features[keep], labels[keep]


def _batches(data, batch_size, naflex=False):
    """Yields `(images, labels, mask or None)`; a NaFlexViT's images are its input dict."""
    if isinstance(data, tuple):
        images, labels = data
        images = dict(images) if naflex and isinstance(images, dict) else np.asarray(images)
        labels = np.asarray(labels)
        count = len(next(iter(images.values()))) if isinstance(images, dict) else len(images)
        if count != len(labels):
            raise ValueError(f"{count} images but {len(labels)} labels.")
        for start in range(0, count, batch_size):
            rows = slice(start, start + batch_size)
            part = ({name: value[rows] for name, value in images.items()}
                    if isinstance(images, dict) else images[rows])
            yield part, labels[rows], None
        return
    for batch in data:
        if isinstance(batch, dict):
            mask = batch.get("mask", batch.get("label_weight") if naflex else None)
            mask = None if mask is None else np.asarray(mask).astype(bool)
            images = ({name: value for name, value in batch.items()
                       if name not in ("label", "mask", "label_weight")}
                      if naflex else np.asarray(batch["image"]))
            yield images, np.asarray(batch["label"]), mask
        else:
            images, labels = batch[:2]
            yield images if naflex else np.asarray(images), np.asarray(labels), None


def few_shot_accuracy(model, train_data, test_data, shots=DEFAULT_SHOTS,
                      l2_reg=DEFAULT_L2_REG, draws=5, seed=0, batch_size=256, progress=None):
    """The paper's few-shot linear accuracy of `model`'s frozen representation.

    `train_data` is the pool the k-shot subsets are drawn from and `test_data` the examples
    scored (see `representations` for the accepted forms). Returns `{k: accuracy}`; see
    `few_shot_from_features`.
    """
    train = representations(model, train_data, batch_size, progress)
    # The progress count runs on through the test examples.
    test_progress = None if progress is None else (
        lambda done: progress(len(train[1]) + done))
    test = representations(model, test_data, batch_size, test_progress)
    num_classes = int(max(train[1].max(), test[1].max())) + 1
    return few_shot_from_features(*train, *test, shots=shots, l2_reg=l2_reg, draws=draws,
                                  seed=seed, num_classes=num_classes)

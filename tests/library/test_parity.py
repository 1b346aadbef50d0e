"""Parity of the Keras ViT with an independent numpy reference written from the paper.

Every variable of a small model gets random values (the defaults would hide bugs: the head is
zero-initialised, the class token is zero, the last GroupNorm of each bottleneck has scale zero),
then the Keras model (float32) and `tests/numpy_reference.py` (float64) run on the same inputs
and must agree to 1e-5. A second pass builds the Keras models with the float64 policy and checks
the same weights to a tighter tolerance, which also catches small constant errors (epsilons).

Float32 noise: the ViT cases and the stem-only hybrid differ from the float64 reference by
about 5e-7; R26+S/32 (8 bottleneck units, fan-in up to 4608) is the worst, 4e-6 to 9e-6 over the
seeds tried (4e-6 with SEED below), from ordinary float32 rounding (each unit adds about 5 ulp).
"""

import functools

import numpy as np
import pytest

import keras_vit
import numpy_reference
from model_fixtures import TINY_VIT, assign_reference_weights, keras_forward

SEED = 1
BATCH = 2
ATOL = 1e-5
# Keras in float64 against the float64 reference: limited by the float32 softmax of the
# attention (about 5e-8), except where a ResNet is present: StdConv2D standardises its kernel in
# float32 under every policy, which costs about 2e-6 at the output of R26+S/32.
ATOL_FLOAT64 = {"hybrid_r26": 1e-5}
ATOL_FLOAT64_DEFAULT = 1e-6

_SMALL = dict(TINY_VIT, patch_size=8, num_classes=5)
_HYBRID = dict(TINY_VIT, num_classes=5)

# name: (variant, vit() keyword arguments)
CASES = {
    "token": ("B/16", dict(image_size=32, **_SMALL)),
    "gap": ("B/16", dict(image_size=32, classifier="gap", **_SMALL)),
    "pre_logits": ("B/16", dict(image_size=32, representation_size=16, **_SMALL)),
    "exact_gelu": ("B/16", dict(image_size=32, approximate_gelu=False, **_SMALL)),
    "non_square": ("B/16", dict(image_size=(32, 48), **_SMALL)),
    "hybrid_stem": ("R+Ti/16", dict(_HYBRID, image_size=64)),
    "hybrid_r26": ("R26+S/32", dict(_HYBRID, image_size=64, num_layers=1)),
}


@functools.lru_cache(maxsize=None)
def built(case):
    """(model, weights, images, kwargs) for a case, built once per session."""
    variant, kwargs = CASES[case]
    rng = np.random.default_rng([SEED, list(CASES).index(case)])
    model = keras_vit.vit(variant, **kwargs)
    weights = assign_reference_weights(model, rng)
    size = kwargs["image_size"]
    height, width = (size, size) if isinstance(size, int) else size
    images = rng.uniform(-1.0, 1.0, (BATCH, height, width, 3)).astype(np.float32)
    return model, weights, images, kwargs


def reference_forward(weights, images, kwargs):
    return numpy_reference.vit_forward(
        weights, images, num_heads=kwargs["num_heads"],
        classifier=kwargs.get("classifier", "token"),
        approximate_gelu=kwargs.get("approximate_gelu", True))


@functools.lru_cache(maxsize=None)
def outputs(case):
    model, weights, images, kwargs = built(case)
    return keras_forward(model, images), reference_forward(weights, images, kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_matches_numpy_reference(case):
    got, want = outputs(case)
    assert got.shape == want.shape == (BATCH, CASES[case][1]["num_classes"])
    # The comparison is only meaningful if the outputs are O(1) and differ between samples.
    assert np.std(want) > 0.1, f"degenerate reference output {want}"
    assert np.max(np.abs(want[0] - want[1])) > 1e-2, "outputs do not depend on the input"
    diff = np.max(np.abs(got - want))
    assert diff <= ATOL, f"{case}: max |keras - numpy| = {diff:.3g}\nkeras={got}\nnumpy={want}"


@pytest.mark.parametrize("case", list(CASES))
def test_matches_numpy_reference_float64(case):
    variant, kwargs = CASES[case]
    _, weights, images, _ = built(case)
    model = keras_vit.vit(variant, dtype="float64", **kwargs)
    for variable in model.weights:
        variable.assign(weights[variable.path])
    got = keras_forward(model, images.astype(np.float64))
    _, want = outputs(case)
    diff = np.max(np.abs(got - want))
    assert diff <= ATOL_FLOAT64.get(case, ATOL_FLOAT64_DEFAULT), (
        f"{case} (float64 policy): max |keras - numpy| = {diff:.3g}")


def test_reference_uses_every_weight():
    """Perturbing any single variable changes the reference output (no weight is ignored).

    The key bias is the one exception, by the mathematics: it adds q . b_k, the same constant,
    to every logit of a row, and the softmax removes it.
    """
    for case in ("token", "hybrid_stem"):
        _, weights, images, kwargs = built(case)
        base = reference_forward(weights, images, kwargs)
        for path, value in weights.items():
            if path.endswith("/key/bias"):
                continue
            perturbed = dict(weights)
            perturbed[path] = value + 0.1 * np.sign(value + 1e-3)
            change = np.max(np.abs(reference_forward(perturbed, images, kwargs) - base))
            assert change > 100 * ATOL, f"{case}: output insensitive to {path} ({change:.3g})"


@pytest.mark.parametrize("path", [
    "encoderblock_1/MultiHeadDotProductAttention_1/key/kernel",
    "posembed_input/pos_embedding",
    "cls/cls",
    "encoderblock_0/MlpBlock_3/Dense_0/bias",
])
def test_parity_check_can_fail(path):
    """One perturbed weight on the reference side breaks the parity by far more than ATOL."""
    _, weights, images, kwargs = built("token")
    got, _ = outputs("token")
    perturbed = dict(weights)
    value = perturbed[path].copy()
    value.flat[value.size // 2] += 0.5
    perturbed[path] = value
    diff = np.max(np.abs(got - reference_forward(perturbed, images, kwargs)))
    assert diff > 100 * ATOL, f"perturbing {path} changed the output by only {diff:.3g}"


def test_approximate_and_exact_gelu_differ():
    """The GELU flag matters: the same weights give different outputs with the other GELU."""
    _, weights, images, kwargs = built("exact_gelu")
    got, _ = outputs("exact_gelu")
    approx = numpy_reference.vit_forward(weights, images, num_heads=kwargs["num_heads"],
                                         approximate_gelu=True)
    assert np.max(np.abs(got - approx)) > 10 * ATOL


def test_numpy_reference_building_blocks():
    """Checks of the reference's own pieces against hand-computable cases."""
    ref = numpy_reference
    # TF SAME padding: 7x7/2 on 64 -> 32 outputs, 5 pixels padded, 2 before, 3 after.
    assert ref.same_padding(64, 7, 2) == (2, 3)
    assert ref.same_padding(16, 3, 2) == (0, 1)
    assert ref.same_padding(5, 1, 1) == (0, 0)
    # im2col conv equals a direct loop on a tiny example.
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((1, 5, 6, 2))
    k = rng.standard_normal((3, 3, 2, 4))
    padded = ref.pad_same(x, 3, 2)
    direct = np.zeros((1, 3, 3, 4))
    for i in range(3):
        for j in range(3):
            patch = padded[0, 2 * i:2 * i + 3, 2 * j:2 * j + 3, :]
            direct[0, i, j] = np.einsum("hwc,hwco->o", patch, k)
    np.testing.assert_allclose(ref.conv2d_same(x, k, 2), direct, atol=1e-12)
    # Max pool never picks the -inf padding.
    pooled = ref.max_pool_same(-np.ones((1, 4, 4, 1)) - 5.0, 3, 2)
    np.testing.assert_array_equal(pooled, -6.0)
    # Patches are row-major and flattened (row, column, channel).
    img = np.arange(4 * 6 * 1, dtype=np.float64).reshape(1, 4, 6, 1)
    patches = ref.patchify(img, 2)
    np.testing.assert_array_equal(patches[0, 1], [2, 3, 8, 9])
    np.testing.assert_array_equal(patches[0, 3], [12, 13, 18, 19])
    # GELU values.
    assert abs(ref.gelu_exact(np.array([1.0]))[0] - 0.8413447460685429) < 1e-12
    assert abs(ref.gelu_tanh(np.array([1.0]))[0] - 0.8411919906082768) < 1e-12
    # Weight standardisation: zero mean, unit population std per output channel.
    ws = ref.standardize_kernel(k)
    np.testing.assert_allclose(ws.mean(axis=(0, 1, 2)), 0.0, atol=1e-12)
    np.testing.assert_allclose(ws.std(axis=(0, 1, 2)), 1.0, atol=1e-4)

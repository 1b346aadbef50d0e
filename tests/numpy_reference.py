"""A pure-numpy forward pass of the Vision Transformer, written from the paper's equations.

This is an independent reference for the Keras model: it imports nothing from Keras or from
`keras_vit`, computes in float64, and builds every operation from numpy primitives (patch
embedding as reshape + matmul, convolutions as im2col + matmul, and so on).

Weights are a flat dict of numpy arrays keyed by the Keras variable paths of a model built by
`keras_vit.vit()`, e.g. `embedding/kernel` (P, P, C, D) HWIO, `cls/cls` (1, 1, D),
`posembed_input/pos_embedding` (1, N, D), `encoderblock_{i}/LayerNorm_0/gamma`, dense kernels
in (in, out) layout; for the hybrids `resnet_root/conv_root/kernel`,
`block{s}/unit{u}/conv{1,2,3}/kernel`, `block{s}/unit{u}/gn{1,2,3}/gamma`, ...

Equations (arXiv 2010.11929, section 3.1, equations 1-4):
    z0 = [x_class; x_p1 E; ...; x_pN E] + E_pos
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}
    z_l = MLP(LN(z'_l)) + z'_l
    y = LN(z_L)^0   (or the mean of all tokens for "gap"), [tanh pre_logits], head.
"""

import math
import re

import numpy as np

LAYER_NORM_EPSILON = 1e-6
GROUP_NORM_EPSILON = 1e-6
GROUP_NORM_GROUPS = 32
WEIGHT_STANDARDIZATION_EPSILON = 1e-5


# ----------------------------------------------------------------------------------------------
# Elementary functions
# ----------------------------------------------------------------------------------------------

def layer_norm(x, gamma, beta, eps=LAYER_NORM_EPSILON):
    """Normalises over the last axis: (x - mean) / sqrt(var + eps) * gamma + beta."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rms_norm(x, gamma, eps=LAYER_NORM_EPSILON):
    """Scales over the last axis by the root mean square: x / sqrt(mean(x^2) + eps) * gamma."""
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps) * gamma


def gelu_tanh(x):
    """GELU, tanh approximation (the Flax default): 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_exact(x):
    """GELU, exact: 0.5 x (1 + erf(x / sqrt(2)))."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def dense(x, kernel, bias=None):
    """x @ kernel (+ bias), kernel in (in, out) layout."""
    y = x @ kernel
    if bias is not None:
        y = y + bias
    return y


def relu(x):
    return np.maximum(x, 0.0)


# ----------------------------------------------------------------------------------------------
# Transformer parts
# ----------------------------------------------------------------------------------------------

def patchify(images, patch_size):
    """[B, H, W, C] -> [B, (H/P)*(W/P), P*P*C]: non-overlapping patches in row-major order,
    each flattened in (row, column, channel) order to match an HWIO kernel reshaped to
    (P*P*C, D)."""
    b, h, w, c = images.shape
    p = patch_size
    assert h % p == 0 and w % p == 0, (images.shape, p)
    x = images.reshape(b, h // p, p, w // p, p, c)
    x = x.transpose(0, 1, 3, 2, 4, 5)  # [B, gh, gw, P, P, C]
    return x.reshape(b, (h // p) * (w // p), p * p * c)


def patch_embedding(images, kernel, bias):
    """The paper's x_p E: patches flattened and multiplied by E (the HWIO kernel, flattened)."""
    p, p2, c, d = kernel.shape
    assert p == p2
    patches = patchify(images, p)
    return patches @ kernel.reshape(p * p * c, d) + bias


def multi_head_self_attention(x, w, prefix, num_heads, logit_bias=None):
    """MSA (paper eqs. 5-8): per head A = softmax(q k^T / sqrt(D_h)), SA = A v; the heads are
    concatenated and projected by `out`. `logit_bias(q)`, if given, maps the scaled queries
    `[B, h, N, Dh]` to logits added before the softmax (relative positions, masks)."""
    b, n, d = x.shape
    assert d % num_heads == 0
    head_dim = d // num_heads

    def project(name):
        y = dense(x, w[f"{prefix}/{name}/kernel"], w[f"{prefix}/{name}/bias"])
        return y.reshape(b, n, num_heads, head_dim).transpose(0, 2, 1, 3)  # [B, h, N, Dh]

    q, k, v = project("query"), project("key"), project("value")
    q = q / math.sqrt(head_dim)
    logits = q @ k.transpose(0, 1, 3, 2)  # [B, h, N, N]
    if logit_bias is not None:
        logits = logits + logit_bias(q)
    attention = softmax(logits, axis=-1)
    heads = attention @ v  # [B, h, N, Dh]
    concatenated = heads.transpose(0, 2, 1, 3).reshape(b, n, d)
    return dense(concatenated, w[f"{prefix}/out/kernel"], w[f"{prefix}/out/bias"])


def mlp_block(x, w, prefix, approximate_gelu=True):
    """Dense(mlp_dim) -> GELU -> Dense(D) (dropout is the identity at inference)."""
    gelu = gelu_tanh if approximate_gelu else gelu_exact
    h = gelu(dense(x, w[f"{prefix}/Dense_0/kernel"], w[f"{prefix}/Dense_0/bias"]))
    return dense(h, w[f"{prefix}/Dense_1/kernel"], w[f"{prefix}/Dense_1/bias"])


def encoder_block(x, w, index, num_heads, approximate_gelu=True, logit_bias=None):
    """Pre-norm block: z' = MSA(LN(z)) + z; z = MLP(LN(z')) + z'."""
    p = index if isinstance(index, str) else f"encoderblock_{index}"
    y = layer_norm(x, w[f"{p}/LayerNorm_0/gamma"], w[f"{p}/LayerNorm_0/beta"])
    x = x + multi_head_self_attention(y, w, f"{p}/MultiHeadDotProductAttention_1", num_heads,
                                      logit_bias)
    y = layer_norm(x, w[f"{p}/LayerNorm_2/gamma"], w[f"{p}/LayerNorm_2/beta"])
    return x + mlp_block(y, w, f"{p}/MlpBlock_3", approximate_gelu)


# ----------------------------------------------------------------------------------------------
# ResNet-v2 ("BiT") parts of the hybrids
# ----------------------------------------------------------------------------------------------

def same_padding(size, kernel, stride):
    """TF-style SAME padding along one axis: (before, after), the extra pixel after."""
    out = -(-size // stride)  # ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x, kernel, stride, value=0.0):
    """Pads [B, H, W, C] for a SAME convolution / pool with the given kernel and stride."""
    _, h, w, _ = x.shape
    ph, pw = same_padding(h, kernel, stride), same_padding(w, kernel, stride)
    return np.pad(x, ((0, 0), ph, pw, (0, 0)), mode="constant", constant_values=value)


def windows(x, kernel, stride, out_h, out_w):
    """All kernel x kernel windows of an already padded [B, H, W, C] array, as
    [B, out_h, out_w, kernel, kernel, C] (im2col without the final reshape)."""
    rows = []
    for i in range(kernel):
        cols = []
        for j in range(kernel):
            cols.append(x[:, i:i + stride * (out_h - 1) + 1:stride,
                          j:j + stride * (out_w - 1) + 1:stride, :])
        rows.append(np.stack(cols, axis=3))  # [B, oh, ow, kw, C]
    return np.stack(rows, axis=3)  # [B, oh, ow, kh, kw, C]


def conv2d_same(x, kernel, stride=1):
    """SAME convolution by im2col: x [B, H, W, C], kernel HWIO [k, k, C, O], no bias."""
    k, k2, c, o = kernel.shape
    assert k == k2 and x.shape[-1] == c, (x.shape, kernel.shape)
    b, h, w, _ = x.shape
    out_h, out_w = -(-h // stride), -(-w // stride)
    cols = windows(pad_same(x, k, stride), k, stride, out_h, out_w)
    cols = cols.reshape(b, out_h, out_w, k * k * c)
    return cols @ kernel.reshape(k * k * c, o)


def standardize_kernel(kernel, eps=WEIGHT_STANDARDIZATION_EPSILON):
    """Weight standardisation per output channel over the spatial and input axes:
    (w - mean) / (std + eps), population std."""
    mean = kernel.mean(axis=(0, 1, 2), keepdims=True)
    std = np.sqrt(((kernel - mean) ** 2).mean(axis=(0, 1, 2), keepdims=True))
    return (kernel - mean) / (std + eps)


def std_conv(x, kernel, stride=1):
    return conv2d_same(x, standardize_kernel(kernel), stride)


def group_norm(x, gamma, beta, groups=GROUP_NORM_GROUPS, eps=GROUP_NORM_EPSILON):
    """GroupNorm over [B, H, W, C]: channels split into `groups` contiguous groups, each
    normalised over (H, W, C / groups); then the per-channel affine."""
    b, h, w, c = x.shape
    assert c % groups == 0, (c, groups)
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = ((g - mean) ** 2).mean(axis=(1, 2, 4), keepdims=True)
    g = (g - mean) / np.sqrt(var + eps)
    return g.reshape(b, h, w, c) * gamma + beta


def max_pool_same(x, size=3, stride=2):
    """SAME max pool: padding with -inf so that it never wins."""
    b, h, w, c = x.shape
    out_h, out_w = -(-h // stride), -(-w // stride)
    cols = windows(pad_same(x, size, stride, value=-np.inf), size, stride, out_h, out_w)
    return cols.max(axis=(3, 4))


def resnet_root(x, w):
    """7x7/2 StdConv -> GroupNorm -> ReLU -> 3x3/2 SAME max pool."""
    x = std_conv(x, w["resnet_root/conv_root/kernel"], stride=2)
    x = relu(group_norm(x, w["resnet_root/gn_root/gamma"], w["resnet_root/gn_root/beta"]))
    return max_pool_same(x, 3, 2)


def bottleneck_unit(x, w, prefix, stride):
    """1x1 -> GN -> ReLU -> 3x3 (stride) -> GN -> ReLU -> 1x1 (4x width) -> GN;
    residual = GN(1x1 projection (stride)) when present, else x; out = relu(residual + y)."""
    residual = x
    if f"{prefix}/conv_proj/kernel" in w:
        residual = std_conv(x, w[f"{prefix}/conv_proj/kernel"], stride)
        residual = group_norm(residual, w[f"{prefix}/gn_proj/gamma"], w[f"{prefix}/gn_proj/beta"])
    y = std_conv(x, w[f"{prefix}/conv1/kernel"])
    y = relu(group_norm(y, w[f"{prefix}/gn1/gamma"], w[f"{prefix}/gn1/beta"]))
    y = std_conv(y, w[f"{prefix}/conv2/kernel"], stride)
    y = relu(group_norm(y, w[f"{prefix}/gn2/gamma"], w[f"{prefix}/gn2/beta"]))
    y = std_conv(y, w[f"{prefix}/conv3/kernel"])
    y = group_norm(y, w[f"{prefix}/gn3/gamma"], w[f"{prefix}/gn3/beta"])
    return relu(residual + y)


def resnet_stages(w):
    """{stage: number of units} found in the weights (stages `block1`, `block2`, ...)."""
    stages = {}
    for key in w:
        match = re.match(r"^block(\d+)/unit(\d+)/", key)
        if match:
            s, u = int(match.group(1)), int(match.group(2))
            stages[s] = max(stages.get(s, 0), u)
    return dict(sorted(stages.items()))


def resnet(x, w):
    """The hybrid's ResNet: root, then stages; the first unit of every stage after the first
    has stride 2, all other units stride 1."""
    x = resnet_root(x, w)
    for stage, units in resnet_stages(w).items():
        for unit in range(1, units + 1):
            stride = 2 if (stage > 1 and unit == 1) else 1
            x = bottleneck_unit(x, w, f"block{stage}/unit{unit}", stride)
    return x


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------

def vit_forward(weights, images, num_heads, classifier="token", approximate_gelu=True,
                include_top=True):
    """Forward pass of ViT (or a ResNet + ViT hybrid) in float64.

    Args:
        weights: flat dict {keras variable path: numpy array}.
        images: [B, H, W, 3] in [-1, 1].
        num_heads: attention heads (not recoverable from the weight shapes).
        classifier: "token" (class token) or "gap" (mean of the tokens, no class token).
        approximate_gelu: tanh-approximate GELU when True, exact when False.
        include_top: apply the head when True (pre_logits is applied whenever present).

    Returns:
        float64 array [B, num_classes] (or the representation when include_top is False).
    """
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    x = np.asarray(images, dtype=np.float64)

    if "resnet_root/conv_root/kernel" in w:
        x = resnet(x, w)

    z = patch_embedding(x, w["embedding/kernel"], w["embedding/bias"])  # [B, N, D]
    if classifier == "token":
        cls = np.broadcast_to(w["cls/cls"], (z.shape[0], 1, z.shape[2]))
        z = np.concatenate([cls, z], axis=1)
    elif classifier != "gap":
        raise ValueError(f"unknown classifier {classifier!r}")
    z = z + w["posembed_input/pos_embedding"]

    num_layers = 0
    while f"encoderblock_{num_layers}/LayerNorm_0/gamma" in w:
        num_layers += 1
    for index in range(num_layers):
        z = encoder_block(z, w, index, num_heads, approximate_gelu)

    z = layer_norm(z, w["encoder_norm/gamma"], w["encoder_norm/beta"])
    y = z[:, 0] if classifier == "token" else z.mean(axis=1)

    if "pre_logits/kernel" in w:
        y = np.tanh(dense(y, w["pre_logits/kernel"], w["pre_logits/bias"]))
    if include_top:
        y = dense(y, w["head/kernel"], w["head/bias"])
    return y

"""Shared by the model tests: the tiny ViT's size, `randomise`, `random_tiny_vit`, the option
families that every tool is tried on (`OPTION_FAMILIES`), and the weights and forward pass of
the parity tests against NumPy references (`assign_reference_weights`, `keras_forward`)."""

import keras
import numpy as np

if keras.backend.backend() == "tensorflow":
    # On Ampere+ GPUs TensorFlow runs float32 matmuls and convolutions in TF32 (10-bit
    # mantissa) by default, far outside a 1e-5 parity; make float32 mean float32.
    import tensorflow as tf
    tf.config.experimental.enable_tensor_float_32_execution(False)


# Width 24 (3 heads of 8), MLP 48, 2 blocks: small enough for fast tests, with several heads
# and blocks. Tests add image_size, patch_size and num_classes, or override num_layers.
TINY_VIT = dict(hidden_size=24, mlp_dim=48, num_heads=3, num_layers=2)

# A model of each family of spec options, each with the fields that shape its weights or its
# computation: the tools (export, `.keras`, `.npz`, LoRA, remat, fused attention, any image
# size) are tried on every one (tests/test_option_matrix.py, tests/library/deploy/test_export.py). A new
# option family joins here.
OPTION_FAMILIES = {
    "learned": {},
    "distillation_token": {"distillation_token": True},
    "swiglu_layer_scale": {"activation": "swiglu", "layer_scale_init": 0.1},
    "rope": {"rope": "axial"},
    "rope_normalized": {"rope": "axial_normalized"},
    "rope_mixed": {"rope": "mixed"},
    "relative_mlp_token_gap": {"position_embedding": "relative_mlp",
                               "classifier": "token_gap"},
    "inner_norms": {"mlp_inner_norm": True, "attention_inner_norm": True, "classifier": "gap",
                    "class_token": True},
    "relative_2d_gap": {"position_embedding": "relative_2d", "classifier": "gap"},
    "map_registers": {"classifier": "map", "num_register_tokens": 2},
    "post_norm_pooled": {"residual_post_norm": True, "final_norm": "pooled",
                         "classifier": "gap"},
    "learned_2d_every_layer": {"position_embedding": "learned_2d",
                               "position_embedding_placement": "every_layer"},
    "remat_fused_relative": {"remat": "blocks", "attention_impl": "fused",
                             "position_embedding": "relative"},
    # Sapiens2's: RMSNorms, normed queries and keys, grouped-query attention (one key and
    # value head for the 3 query heads: an int, as tools change num_layers), with RoPE.
    "rms_qk_norm_gqa": {"norm_layer": "rms_norm", "qk_norm": True, "num_kv_heads": 1,
                        "rope": "axial_normalized", "num_register_tokens": 1},
    # RMSNorm in every other place a norm can be: before the blocks, inside the MLP and the
    # attention, the attention pooling's and the pooled vector's; qk_norm and grouped-query
    # attention without RoPE (which NaFlex models take).
    "rms_everywhere_map": {"norm_layer": "rms_norm", "pre_norm": True, "mlp_inner_norm": True,
                           "attention_inner_norm": True, "classifier": "map",
                           "final_norm": "pooled", "qk_norm": True, "num_kv_heads": 1},
    # AIMv2's: a norm of the patch tokens, no biases but the patch embedding's and the
    # pooling's, SiLU-gated MLPs, attention pooling without its LayerNorm and MLP.
    "aimv2": {"norm_layer": "rms_norm", "activation": "swiglu", "patch_norm": True,
              "qkv_bias": False, "proj_bias": False, "classifier": "map", "map_mlp_dim": 0},
    # timm's vit_srelpos_*: one relative-position MLP whose logits every block adds (here with
    # a class token, whose pairs get none).
    "relative_mlp_shared": {"position_embedding": "relative_mlp", "relative_mlp_shared": True,
                            "relative_mlp_dim": 16, "classifier": "gap", "class_token": True,
                            "final_norm": "pooled"},
    # MobileCLIP's: convolutions with BatchNorm and GELU before the patch embedding.
    "conv_stem": {"conv_stem": True, "prefix_position_embeddings": False},
    # timm's DiffParallelScalingBlock: differential attention (normed queries and keys of half
    # a head) beside the MLP, one norm and one LayerScale a block; registers and GAP as its
    # sbb models'.
    "differential_parallel": {"attention_layer": "differential", "parallel_blocks": True,
                              "qk_norm": True, "layer_scale_init": 0.1, "classifier": "gap",
                              "num_register_tokens": 1},
}


def randomise(layer, seed=1, scale=0.3):
    """Gives every weight of `layer` (or model) N(0, scale) values (BatchNorm's moving variances
    1 + |N(0, scale)|), so that zero initialisations (head, class token, the last GroupNorm of a
    unit) cannot hide bugs."""
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        values = rng.normal(0.0, scale, size=tuple(variable.shape))
        if variable.path.endswith("moving_variance"):  # BatchNorm's: positive
            values = 1.0 + np.abs(values)
        variable.assign(values.astype(variable.dtype))


def random_tiny_vit(**fields):
    """A TINY_VIT classifier of 32 px in 8-pixel patches and 5 classes (`fields` change any
    of that), its weights random (`randomise`)."""
    import keras_vit

    model = keras_vit.vit("Ti/16", **{**TINY_VIT, "image_size": 32, "patch_size": 8,
                                      "num_classes": 5, **fields})
    randomise(model)
    return model


def order_one(model):
    """A PyTorch model's weights N(0, 0.3), LayerNorm scales 1 + N(0, 0.1): activations of
    order 1 (so that a wrong GELU or LayerNorm epsilon shows), in evaluation mode."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            norm = "norm" in name
            parameter.copy_(torch.randn_like(parameter) * (0.1 if norm else 0.3)
                            + float(norm and name.endswith("weight")))
    return model.eval()


def random_value(path, shape, rng):
    """A random value for the variable at `path` that keeps activations O(1)."""
    name = path.rsplit("/", 1)[-1]
    if name == "gamma":  # LayerNorm / GroupNorm scale
        return 1.0 + 0.2 * rng.standard_normal(shape)
    if name in ("beta", "bias"):
        return 0.2 * rng.standard_normal(shape)
    if name in ("cls", "pos_embedding"):
        return 0.5 * rng.standard_normal(shape)
    if name == "kernel":
        fan_in = int(np.prod(shape[:-1]))
        return rng.standard_normal(shape) / np.sqrt(fan_in)
    raise AssertionError(f"no randomisation rule for variable {path!r} {shape}")


def assign_reference_weights(model, rng):
    """Assigns random values to every variable; returns them as a float64 numpy dict."""
    weights = {}
    for variable in model.weights:
        value = random_value(variable.path, tuple(variable.shape), rng)
        variable.assign(value.astype(np.float32))
        # The reference gets exactly the float32 values the model holds.
        weights[variable.path] = value.astype(np.float32).astype(np.float64)
    assert len(weights) == len(model.weights), "duplicate variable paths"
    return weights


def keras_forward(model, images):
    return np.asarray(keras.ops.convert_to_numpy(model(images, training=False)), np.float64)

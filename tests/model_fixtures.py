"""Shared by the model tests: the tiny ViT's size, `randomise`, `random_tiny_vit`, and the
option families that every tool is tried on (`OPTION_FAMILIES`)."""

import numpy as np

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
    # timm's DiffParallelScalingBlock: differential attention (normed queries and keys of half
    # a head) beside the MLP, one norm and one LayerScale a block; registers and GAP as its
    # sbb models'.
    "differential_parallel": {"attention_layer": "differential", "parallel_blocks": True,
                              "qk_norm": True, "layer_scale_init": 0.1, "classifier": "gap",
                              "num_register_tokens": 1},
}


def randomise(layer, seed=1, scale=0.3):
    """Gives every weight of `layer` (or model) N(0, scale) values, so that zero initialisations
    (head, class token, the last GroupNorm of a unit) cannot hide bugs."""
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.normal(0.0, scale, size=tuple(variable.shape)).astype(variable.dtype))


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

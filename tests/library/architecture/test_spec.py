"""keras_vit.ViTConfig: the one architecture spec. Its defaults and JSON round trip, that it
reports every problem at once, that it needs no Keras, that `vit()` and the builders build from
it, and that every file the package writes records it."""

import dataclasses
import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import keras_vit
from keras_vit import builders
from keras_vit.architecture import variants
from keras_vit.architecture.spec import FIELDS, ViTConfig
from model_fixtures import randomise

from train_fixtures import REPO  # noqa: E402
def python_output(code):
    """What `code` prints in a new Python process, in the checkout."""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, check=True)
    return result.stdout.strip()


TINY = dict(image_size=32, patch_size=16, hidden_size=16, mlp_dim=32, num_heads=2,
            num_layers=1, num_classes=3)


def test_a_variant_fills_its_table_fields_and_the_upstream_defaults():
    spec = ViTConfig.from_variant("R50+B/16", num_classes=37, image_size=384)
    assert (spec.hidden_size, spec.mlp_dim, spec.num_heads, spec.num_layers) == (
        768, 3072, 12, 12)
    assert spec.patch_size == 1 and spec.resnet_units == (3, 4, 9) and spec.total_stride == 16
    assert spec.image_size == (384, 384) and spec.grid_size == (24, 24)
    assert ViTConfig.from_variant("L/16").dropout == 0.1  # the upstream configuration's
    assert ViTConfig.from_variant("L/16", dropout=0.0).dropout == 0.0
    axial = ViTConfig.from_variant("Axial-B/16")
    assert axial.axial and axial.classifier == "gap" and axial.num_prefix_tokens == 0
    assert ViTConfig().variant == "B/16" and ViTConfig(variant="Ti/16").hidden_size == 192


@pytest.mark.parametrize("variant", list(keras_vit.VARIANT_NAMES))
def test_json_round_trip(variant):
    stride = ViTConfig.from_variant(variant).total_stride
    spec = ViTConfig.from_variant(variant, image_size=(2 * stride, 3 * stride),
                                  representation_size=8, layer_norm_epsilon=1e-12)
    text = json.dumps(spec.to_dict())
    assert ViTConfig.from_dict(json.loads(text)) == spec
    assert set(json.loads(text)) == set(FIELDS)


def test_a_spec_is_frozen_and_replace_checks_again():
    spec = ViTConfig.from_variant("Ti/16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.hidden_size = 64
    assert spec.replace(num_classes=10).num_classes == 10
    with pytest.raises(ValueError, match=r"num_heads=5: num_heads must divide hidden_size"):
        spec.replace(num_heads=5)
    with pytest.raises(TypeError, match="Unknown ViTConfig fields \\['hidden'\\]"):
        spec.replace(hidden=8)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError) as info:
        ViTConfig(variant="B/16", dropout=1.5, num_heads=5, image_size=100, classifier="mean")
    text = str(info.value)
    assert text.startswith("Invalid ViT architecture: ")
    for part in ("dropout=1.5: must be a rate in [0, 1)", "classifier='mean': must be one of",
                 "hidden_size=768, num_heads=5", "its height 100 must be a multiple of 16"):
        assert part in text, text
    problems = ViTConfig.problems(variant="B/16", dropout=1.5, num_heads=5, no_such_field=1)
    assert sorted(field for p in problems for field in p.fields) == [
        "dropout", "hidden_size", "no_such_field", "num_heads"]
    shown = [p.describe(lambda field: f"config.model.{field}") for p in problems]
    assert "config.model.dropout=1.5: must be a rate in [0, 1)" in shown, shown


def test_type_problems_alone_raise_a_type_error():
    with pytest.raises(TypeError, match=r"num_layers=1.0 \(float\): must be a positive integer"):
        ViTConfig(num_layers=1.0)
    with pytest.raises(TypeError, match=r"variant=16 \(int\): must be a variant name.*Ti/16"):
        ViTConfig(variant=16)
    with pytest.raises(ValueError, match=r"layer_norm_epsilon=0.0: must be a positive number"):
        ViTConfig(layer_norm_epsilon=0.0)


def test_the_spec_module_imports_without_keras():
    # The spec is pure Python: configuration checks can use it before TensorFlow starts.
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('keras_vit', "
            "'keras_vit/__init__.py', submodule_search_locations=['keras_vit'])\n"
            "package = importlib.util.module_from_spec(spec)\n"
            "sys.modules['keras_vit'] = package  # the package, without running its __init__\n"
            "from keras_vit.architecture.spec import ViTConfig\n"
            "ViTConfig.from_variant('R50+B/16', image_size=384)\n"
            "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'numpy') "
            "if m in sys.modules))\n")
    assert python_output(code) == "[]"


def test_vit_builds_a_spec_and_keeps_it():
    spec = ViTConfig.from_variant("Ti/16", **TINY)
    model = keras_vit.vit(spec)
    assert model.spec == spec and model.name == "vit_ti16"
    assert model.output_shape == (None, 3)
    changed = keras_vit.vit(spec, num_classes=5, include_top=False)
    assert changed.spec == spec.replace(num_classes=5, include_top=False)
    assert changed.output_shape == (None, 16)
    same = keras_vit.vit("Ti/16", **TINY)
    assert same.spec == spec and same.count_params() == model.count_params()


def test_layer_norm_epsilon_reaches_every_layer_norm():
    model = keras_vit.vit("Ti/16", **TINY, layer_norm_epsilon=1e-12)
    norms = [layer for layer in model._flatten_layers() if "LayerNorm" in type(layer).__name__
             or layer.name.startswith(("LayerNorm", "encoder_norm"))]
    assert len(norms) == 3  # LayerNorm_0 and LayerNorm_2 of the block, encoder_norm
    assert {layer.epsilon for layer in norms} == {1e-12}
    assert keras_vit.vit("Ti/16", **TINY).get_layer("encoder_norm").epsilon == 1e-6


def test_the_spec_survives_keras_saving(tmp_path):
    import keras

    model = keras_vit.vit("Ti/16", **TINY, position_embedding="learned_2d")
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert loaded.spec == model.spec


def test_save_npz_writes_the_spec_beside_the_file(tmp_path):
    model = keras_vit.vit("Ti/16", **TINY, classifier="gap")
    path = tmp_path / "model.npz"
    keras_vit.weights.checkpoint.save_npz(model, path)
    assert keras_vit.weights.checkpoint.read_spec(path) == model.spec
    assert set(np.load(path, allow_pickle=False)) == set(
        keras_vit.weights.checkpoint.model_arrays(model))
    model.spec = None  # a model that does not know its spec leaves no stale sidecar
    keras_vit.weights.checkpoint.save_npz(model, path)
    assert keras_vit.weights.checkpoint.read_spec(path) is None
    (tmp_path / "model.npz.json").write_text('{"variant": "B/17"}')
    with pytest.raises(keras_vit.weights.checkpoint.CheckpointError, match="model.npz.json"):
        keras_vit.weights.checkpoint.read_spec(path)


def test_saved_model_carries_the_spec(tmp_path):
    import keras

    if keras.config.backend() != "tensorflow":
        with pytest.raises(RuntimeError, match="KERAS_BACKEND=tensorflow"):
            keras_vit.deploy.export.export_saved_model(keras_vit.vit("Ti/16", **TINY),
                                                       str(tmp_path))
        return
    model = keras_vit.vit("Ti/16", **TINY)
    folder = keras_vit.deploy.export.export_saved_model(model, str(tmp_path / "served"))
    with open(os.path.join(folder, keras_vit.deploy.export.SPEC_ASSET)) as handle:
        assert ViTConfig.from_dict(json.load(handle)) == model.spec


def test_builders_are_plain_functions_one_per_variant():
    names = {name for name, value in vars(builders).items()
             if inspect.isfunction(value) and value.__module__ == builders.__name__
             and not name.startswith("_")}
    assert names == set(variants.VARIANT_NAMES.values()) | {"vit"} == set(builders.__all__)
    for variant, name in variants.VARIANT_NAMES.items():
        function = getattr(keras_vit, name)
        assert f"ViT {variant} (" in function.__doc__ and "parameters)" in function.__doc__
        source = inspect.getsource(function)
        assert source.startswith(f"def {name}(**kwargs):"), source
        assert f'vit("{variant}", **kwargs)' in source, source


def test_tool_modules_load_on_first_use():
    code = ("import sys, keras_vit\n"
            "tools = ('analysis', 'checkpoint', 'export', 'flops', 'hub', 'plotting', "
            "'pretrained', 'serving')\n"
            "before = [t for t in tools if 'keras_vit.' + t in sys.modules]\n"
            "keras_vit.weights.checkpoint.save_npz\n"
            "print(before, 'keras_vit.weights.checkpoint' in sys.modules)\n")
    assert python_output(code).splitlines()[-1] == "[] True"


def test_later_vit_options_are_checked_with_the_rest():
    spec = ViTConfig.from_variant("S/16", num_register_tokens=4, classifier="gap",
                                  layer_scale_init=1e-5, final_norm="pooled")
    assert spec.num_prefix_tokens == 4  # registers, no class token
    assert ViTConfig.from_variant("S/16", num_register_tokens=4).num_prefix_tokens == 5
    assert ViTConfig.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError) as error:
        ViTConfig.from_variant("S/16", num_register_tokens=-1, final_norm="after",
                               layer_scale_init=0.0)
    for field in ("num_register_tokens=-1", "final_norm='after'", "layer_scale_init=0.0"):
        assert field in str(error.value)
    with pytest.raises(ValueError, match="placement 'stem' or prefix_position_embeddings"):
        ViTConfig.from_variant("S/16", prefix_position_embeddings=False,
                               position_embedding_placement="every_layer")
    with pytest.raises(ValueError, match="num_register_tokens=0"):
        ViTConfig.from_variant("Axial-S/16", num_register_tokens=1)
    with pytest.raises(TypeError, match="qkv_bias"):
        ViTConfig.from_variant("S/16", qkv_bias="no")
    assert ViTConfig.from_variant("S/16", distillation_token=True).num_prefix_tokens == 2
    for fields, shown in (({"classifier": "gap"}, "classifier='token'"),
                          ({"num_register_tokens": 4}, "num_register_tokens=0"),
                          ({"final_norm": "pooled"}, "final_norm='tokens'"),
                          ({"representation_size": 8}, "representation_size=None"),
                          ({"variant": "Axial-S/16"}, "classifier='token'")):
        with pytest.raises(ValueError, match=shown):
            ViTConfig(**{"variant": "S/16", **fields, "distillation_token": True})


@pytest.mark.parametrize("fields, extra", [
    # D = 16, 1 block, a 2x2 grid: what each option adds to the plain model's weights.
    ({"qkv_bias": False}, -3 * 16),
    ({"layer_scale_init": 1e-5}, 2 * 16),
    ({"num_register_tokens": 3}, 3 * 16 + 3 * 16),  # the tokens and their position rows
    ({"num_register_tokens": 3, "prefix_position_embeddings": False}, 3 * 16 - 1 * 16),
    ({"pre_norm": True}, 2 * 16),
    ({"final_norm": "pooled"}, 0),
    ({"final_norm": "none"}, -2 * 16),
    # DeiT's token, its position row, and its head (16 x 3 + 3).
    ({"distillation_token": True}, 16 + 16 + 16 * 3 + 3),
    ({"activation": "swiglu"}, 16 * 32 + 32),  # SwiGLU's gate: one more 16 x 32 projection
    ({"classifier": "gap"}, -16 - 16),  # no class token, nor its position row
    ({"classifier": "gap", "class_token": True}, 0),
    ({"mlp_inner_norm": True}, 2 * 32),  # a LayerNorm of the 32 hidden units
    ({"attention_inner_norm": True}, 2 * 16),
    ({"rope": "axial", "rope_grid_offset": 1.0, "rope_reference_grid": (4, 4)}, 0),
    ({"rope": "mixed"}, 2 * 2 * 4),  # a row and a column frequency per head and channel pair
    ({"classifier": "token_gap"}, 16 * 3),  # a head on 2 x 16 features
    # Its MLP (2 -> 8 -> 2 heads) in place of the position embeddings (16 x 5 tokens).
    ({"position_embedding": "relative_mlp", "relative_mlp_dim": 8},
     (2 * 8 + 8) + (8 * 2 + 2) - 16 * 5),
    ({"residual_post_norm": True}, 0),  # the same norms, elsewhere
    # Attention pooling with Perception Encoder's own MLP width (16 -> 8 -> 16): its probe,
    # attention, LayerNorm and MLP, less the class token and its position row.
    ({"classifier": "map", "map_num_heads": 1, "map_mlp_dim": 8},
     16 + 4 * (16 * 16 + 16) + 2 * 16 + (16 * 8 + 8 + 8 * 16 + 16) - 2 * 16),
    # RMSNorm: the scales of the blocks' two norms and the final norm, no biases.
    ({"norm_layer": "rms_norm"}, -3 * 16),
    ({"qk_norm": True}, 2 * 2 * 8),  # a LayerNorm of each head's 8 query and key channels
    # One key and value head of 8 in place of two: half their kernels and biases.
    ({"num_kv_heads": 1}, -2 * (16 * 8 + 8)),
    ({"num_kv_heads": (2,)}, 0),
    # AIMv2's: a LayerNorm of the patch tokens; no biases in the attention's output (16) and
    # the MLP's two layers (32 + 16); attention pooling without its LayerNorm and MLP (the
    # probe and the four projections, less the class token and its position row).
    ({"patch_norm": True}, 2 * 16),
    ({"proj_bias": False}, -(16 + 32 + 16)),
    ({"classifier": "map", "map_mlp_dim": 0}, 16 + 4 * (16 * 16 + 16) - 2 * 16),
    # MobileCLIP's stem (4 channels): a 4x4 and a 2x2 convolution, each with a BatchNorm's
    # scale, bias, moving mean and variance, then a 2x2 patch embedding for the 16x16 one.
    ({"conv_stem": True}, 4 * 4 * 3 * 4 + 4 * 4 + 2 * 2 * 4 * 4 + 4 * 4
     + 2 * 2 * 4 * 16 - 16 * 16 * 3 * 16),
    # Differential attention: lambda's four vectors of half a head (4) and each head's RMSNorm.
    ({"attention_layer": "differential"}, 4 * 4 + 8),
    ({"attention_layer": "differential", "qk_norm": True}, 4 * 4 + 8 + 2 * 2 * 4),
    ({"parallel_blocks": True}, -2 * 16),  # one norm a block: no LayerNorm_2
    ({"parallel_blocks": True, "layer_scale_init": 0.1}, -2 * 16 + 16),  # one LayerScale
], ids=["no_qkv_bias", "layer_scale", "registers", "registers_no_prefix_embeddings",
        "pre_norm", "pooled_norm", "no_final_norm", "distillation_token", "swiglu", "gap",
        "gap_with_class_token", "mlp_inner_norm", "attention_inner_norm", "rope", "rope_mixed",
        "token_gap", "relative_mlp", "residual_post_norm", "map_of_its_own_size", "rms_norm",
        "qk_norm", "multi_query", "kv_heads_per_block", "patch_norm", "no_proj_bias",
        "map_without_mlp", "conv_stem", "differential", "differential_qk_norm", "parallel",
        "parallel_layer_scale"])
def test_each_later_option_adds_exactly_its_weights(fields, extra):
    plain = keras_vit.vit("S/16", **TINY).count_params()
    model = keras_vit.vit("S/16", **TINY, **fields)
    assert model.count_params() - plain == extra


def test_a_class_token_beside_mean_pooling_attends_but_is_left_out_of_the_mean():
    """timm's class_token=True with global_pool="avg" (DINOv3, EVA-02): the class token is in
    every block's attention, and the output is the mean of the normed patch tokens only."""
    spec = ViTConfig.from_variant("S/16", **TINY, classifier="gap", class_token=True,
                                  num_register_tokens=1)
    assert spec.num_prefix_tokens == 2 and ViTConfig.from_dict(spec.to_dict()) == spec
    assert ViTConfig.from_variant("S/16", classifier="gap").class_token is False
    assert ViTConfig.from_variant("S/16").class_token is True
    model = keras_vit.vit(spec.replace(include_top=False))
    randomise(model, scale=0.5)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tokens = np.asarray(keras_vit.features(model, layers=-1, norm=True)(images))
    assert tokens.shape == (2, 2 + 4, 16)
    np.testing.assert_allclose(np.asarray(model(images)), tokens[:, 2:].mean(axis=1),
                               rtol=1e-5, atol=1e-6)
    # The class token matters: changing it changes the patches' output.
    cls = model.get_layer("cls")
    before = np.asarray(model(images))
    cls.cls.assign(np.ones(cls.cls.shape, "float32"))
    assert np.abs(np.asarray(model(images)) - before).max() > 1e-3
    with pytest.raises(ValueError, match="class_token=True \\(or None\\)"):
        ViTConfig.from_variant("S/16", class_token=False)
    with pytest.raises(ValueError, match="class_token=None"):
        ViTConfig.from_variant("Axial-S/16", class_token=True)


def test_token_gap_puts_the_class_token_beside_the_patches_mean():
    """DINOv2's linear classifier (transformers' Dinov2ForImageClassification): the head reads
    the normed class token and the mean of the normed patch tokens (registers left out),
    concatenated."""
    spec = ViTConfig.from_variant("S/16", **TINY, classifier="token_gap", num_register_tokens=2)
    assert spec.class_token and spec.num_prefix_tokens == 3
    model = keras_vit.vit(spec.replace(include_top=False))
    randomise(model, scale=0.5)
    images = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tokens = np.asarray(keras_vit.features(model, layers=-1, norm=True)(images))
    expected = np.concatenate([tokens[:, 0], tokens[:, 3:].mean(axis=1)], axis=-1)
    np.testing.assert_allclose(np.asarray(model(images)), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="final_norm 'tokens'"):
        ViTConfig.from_variant("S/16", classifier="token_gap", final_norm="pooled")
    with pytest.raises(ValueError, match="token_gap classifier reads the class token"):
        ViTConfig.from_variant("S/16", classifier="token_gap", class_token=False)


def test_attention_pooling_of_the_prefix_too():
    """Eva's attention pooling (Perception Encoder) attends to the class token as well as the
    patches: the pooled vector is the pooling of every normed token, and differs from the
    patches-only pooling of the same weights."""
    spec = ViTConfig.from_variant("S/16", **{**TINY, "include_top": False}, classifier="map",
                                  class_token=True, map_include_prefix=True, map_num_heads=1)
    model = keras_vit.vit(spec)
    randomise(model, scale=0.5)
    images = np.random.default_rng(3).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tokens = keras_vit.features(model, layers=-1, norm=True)(images)
    pool = model.get_layer("MAPHead_0")
    assert pool.num_prefix_tokens == 0 and pool.num_heads == 1
    np.testing.assert_allclose(np.asarray(model(images)), np.asarray(pool(tokens)), atol=1e-6)
    patches_only = keras_vit.vit(spec.replace(map_include_prefix=False))
    patches_only.set_weights(model.get_weights())
    assert np.abs(np.asarray(patches_only(images)) - np.asarray(model(images))).max() > 1e-3
    with pytest.raises(ValueError, match="set classifier='map'"):
        ViTConfig.from_variant("S/16", map_num_heads=4)
    with pytest.raises(ValueError, match="layer_scale_init=None with residual_post_norm"):
        ViTConfig.from_variant("S/16", residual_post_norm=True, layer_scale_init=0.1)


def test_later_options_reach_the_tools():
    model = keras_vit.vit("S/16", **TINY, num_register_tokens=2,
                          prefix_position_embeddings=False, final_norm="pooled")
    images = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    tokens = np.asarray(keras_vit.features(model, layers=1)(images))
    maps = np.asarray(keras_vit.features(model, layers=1, output="maps")(images))
    assert tokens.shape == (1, 3 + 4, 16)  # class token, 2 registers, 2x2 patches
    np.testing.assert_array_equal(maps.reshape(1, 4, 16), tokens[:, 3:])
    with pytest.raises(ValueError, match="final_norm='pooled'"):
        keras_vit.features(model, layers=1, norm=True)
    from keras_vit import analysis
    similarity = analysis.position_embedding_similarity(model)  # the patches' rows only
    assert similarity.shape == (4, 2, 2)
    np.testing.assert_allclose(similarity.reshape(4, 4).diagonal(), 1.0, rtol=1e-6)
    from keras_vit.masked_patches import MaskedPatchPredictor
    encoder = keras_vit.vit("S/16", **{**TINY, "include_top": False}, final_norm="none")
    with pytest.raises(ValueError, match="final_norm='tokens'"):
        MaskedPatchPredictor(encoder)


def test_every_field_is_described_once_and_the_docs_table_is_made_from_it():
    descriptions = keras_vit.architecture.spec.field_descriptions()
    assert sorted(descriptions) == sorted(FIELDS)
    with open(os.path.join(REPO, "docs", "models.md")) as handle:
        page = handle.read()
    shown = page.split("<!-- ViTConfig fields: start -->\n")[1].split(
        "\n<!-- ViTConfig fields: end -->")[0]
    assert shown == keras_vit.architecture.spec.fields_table(), (
        "docs/models.md's table of fields differs from ViTConfig's docstring: put the output "
        "of `python -c 'import keras_vit.architecture.spec as s; print(s.fields_table())'` "
        "between its markers")
    # vit() takes every field, and points at the spec rather than listing them again.
    assert "ViTConfig" in keras_vit.vit.__doc__


@pytest.mark.parametrize("fields, error, message", [
    ({"norm_layer": "rms"}, ValueError, r"norm_layer='rms': must be one of \('layer_norm', "
                                        r"'rms_norm'\)"),
    ({"norm_layer": None}, TypeError, "norm_layer=None.*: must be one of"),
    ({"qk_norm": 1}, TypeError, r"qk_norm=1 \(int\): must be True or False"),
    ({"num_kv_heads": 5}, ValueError, r"num_kv_heads=5, num_heads=6: .*must divide num_heads "
                                      r"\(\[5\] do not\): choose among \[1, 2, 3, 6\]"),
    ({"num_kv_heads": (6, 4, 3)}, ValueError, r"\[4\] do not"),
    ({"num_kv_heads": (6, 3)}, ValueError, r"num_kv_heads=\(6, 3\), num_layers=3: give one "
                                           "number of key and value heads per block \\(3\\)"),
    ({"num_kv_heads": 0}, ValueError, "num_kv_heads=0: must be None, a positive integer"),
    ({"num_kv_heads": (3, 0, 3)}, ValueError, "its entry 1 is 0"),
    ({"num_kv_heads": 2.0}, TypeError, "num_kv_heads=.*must be None, a positive integer"),
    ({"num_kv_heads": ()}, ValueError, "it is empty"),
    ({"num_kv_heads": 3, "rope": "mixed"}, ValueError, "rope 'mixed' learns frequencies for "
                                                       "each query head"),
    ({"patch_norm": 1}, TypeError, r"patch_norm=1 \(int\): must be True or False"),
    ({"proj_bias": "no"}, TypeError, r"proj_bias='no' \(str\): must be True or False"),
    ({"map_mlp_dim": -1, "classifier": "map"}, ValueError, "map_mlp_dim=-1: .*>= 0"),
    ({"map_mlp_dim": 0}, ValueError, "map_mlp_dim=0: these shape the attention pooling of "
                                     "classifier 'map': set classifier='map'"),
    ({"relative_mlp_shared": 1, "position_embedding": "relative_mlp"}, TypeError,
     r"relative_mlp_shared=1 \(int\): must be True or False"),
    ({"relative_mlp_shared": True}, ValueError,
     "relative_mlp_shared=True, position_embedding='learned': shares the MLP of "
     "position_embedding 'relative_mlp' between the blocks: set "
     "position_embedding='relative_mlp' too"),
    ({"relative_mlp_shared": True, "position_embedding": "relative"}, ValueError,
     "position_embedding='relative': shares the MLP"),
    ({"conv_stem": "yes"}, TypeError, r"conv_stem='yes' \(str\): must be True or False"),
    ({"conv_stem": True, "patch_size": 14}, ValueError, r"patch_size=14, conv_stem=True: its "
     r"first convolution steps patch_size / 4 pixels, then two of 2, so patch_size must be a "
     r"multiple of 4 with conv_stem: use 12, or conv_stem=False"),
], ids=["unknown_norm", "norm_none", "qk_norm_int", "kv_not_dividing", "one_block_not_dividing",
        "kv_per_block_count", "kv_zero", "kv_entry_zero", "kv_float", "kv_empty", "mixed_rope",
        "patch_norm_int", "proj_bias_str", "map_mlp_dim_negative", "map_mlp_dim_without_map",
        "relative_mlp_shared_int", "relative_mlp_shared_without_mlp",
        "relative_mlp_shared_with_tables",
        "conv_stem_str", "conv_stem_patch"])
def test_norm_qk_norm_and_kv_heads_refuse_bad_values_naming_the_field_and_fix(fields, error,
                                                                             message):
    with pytest.raises(error, match=message):
        ViTConfig.from_variant("S/16", hidden_size=24, num_heads=6, num_layers=3, **fields)


def test_relative_mlp_shared_is_one_mlp_for_every_block():
    """timm's shared_rel_pos: one MLP (2 -> 8 -> 2 heads) of the model's, none in the blocks,
    where a model without it has one per block; the spec round-trips."""
    fields = dict(TINY, num_layers=3, position_embedding="relative_mlp", relative_mlp_dim=8)
    each = keras_vit.vit("S/16", **fields)
    shared = keras_vit.vit("S/16", relative_mlp_shared=True, **fields)
    assert each.count_params() - shared.count_params() == 2 * ((2 * 8 + 8) + (8 * 2 + 2))
    assert sorted(v.path for v in shared.weights if "relative" in v.path) == [
        f"relative_position/fc{index}/{kind}" for index in (1, 2) for kind in ("bias", "kernel")]
    assert ViTConfig.from_dict(shared.spec.to_dict()) == shared.spec


def test_a_conv_stem_needs_a_width_that_4_divides_and_no_resnet():
    with pytest.raises(ValueError, match=r"hidden_size=18, conv_stem=True: its convolutions "
                       r"have hidden_size / 4 channels, .* use 16, or conv_stem=False"):
        ViTConfig.from_variant("S/16", hidden_size=18, num_heads=6, conv_stem=True)
    with pytest.raises(ValueError, match=r"variant='R50\+B/16', conv_stem=True: a hybrid's "
                       r"ResNet already makes the patches' map: use a plain ViT variant"):
        ViTConfig.from_variant("R50+B/16", conv_stem=True)


def test_kv_heads_per_block_round_trip_and_build_each_block_its_own():
    """num_kv_heads per block (Sapiens2: every head in the first and last blocks, fewer in
    between), from a JSON list as from a tuple; each block's key and value are its width."""
    spec = ViTConfig.from_variant("S/16", **{**TINY, "num_layers": 3},
                                  num_kv_heads=[2, 1, 2], qk_norm=True, norm_layer="rms_norm")
    assert spec.num_kv_heads == (2, 1, 2) and [spec.kv_heads(i) for i in range(3)] == [2, 1, 2]
    assert ViTConfig.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert ViTConfig.from_variant("S/16").kv_heads(0) == 6
    assert spec.grouped_query and not spec.replace(num_kv_heads=2).grouped_query
    assert not ViTConfig.from_variant("S/16").grouped_query
    model = keras_vit.vit(spec)
    widths = [model.get_layer(f"encoderblock_{i}").attention.key.kernel.shape[1]
              for i in range(3)]
    assert widths == [16, 8, 16]


@pytest.mark.parametrize("fields, error, message", [
    ({"attention_layer": "diff"}, ValueError, r"attention_layer='diff': must be one of "
                                              r"\('softmax', 'differential'\)"),
    ({"attention_layer": None}, TypeError, "attention_layer=None.*: must be one of"),
    ({"parallel_blocks": "yes"}, TypeError, r"parallel_blocks='yes' \(str\): must be True or "
                                            "False"),
    ({"attention_layer": "differential", "num_heads": 8}, ValueError,
     r"hidden_size=24, num_heads=8, attention_layer='differential': .*each head's width "
     r"\(hidden_size / num_heads\) must be even"),
    ({"attention_layer": "differential", "num_kv_heads": 2}, ValueError,
     "num_kv_heads=2, attention_layer='differential': .*use num_kv_heads=None"),
    ({"attention_layer": "differential", "rope": "axial"}, ValueError,
     "rope='axial', attention_layer='differential': .*use rope=None"),
    ({"attention_layer": "differential", "position_embedding": "relative"}, ValueError,
     "position_embedding='relative', attention_layer='differential': .*'learned'"),
    ({"parallel_blocks": True, "residual_post_norm": True}, ValueError,
     "residual_post_norm=True, parallel_blocks=True: .*use residual_post_norm=False"),
    ({"variant": "Axial-S/16", "parallel_blocks": True}, ValueError,
     "variant='Axial-S/16', parallel_blocks=True: .*use parallel_blocks=False"),
    ({"variant": "Axial-S/16", "attention_layer": "differential"}, ValueError,
     "variant='Axial-S/16', attention_layer='differential': .*use attention_layer='softmax'"),
], ids=["unknown_attention", "attention_none", "parallel_str", "odd_head_width", "kv_heads",
        "rope", "relative", "post_norm", "axial_parallel", "axial_differential"])
def test_differential_and_parallel_refuse_bad_values_naming_the_field_and_fix(fields, error,
                                                                               message):
    fields = {"variant": "S/16", "hidden_size": 24, "num_heads": 6, "num_layers": 3, **fields}
    with pytest.raises(error, match=message):
        ViTConfig(**fields)


def test_differential_lambda_init_rises_with_depth_as_the_paper_says():
    """lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) of layer l = 1..L (Ye et al. 2024, 2.1)."""
    model = keras_vit.vit("S/16", **{**TINY, "num_layers": 3}, attention_layer="differential")
    got = [model.get_layer(f"encoderblock_{i}").attention.differential_lambda_init
           for i in range(3)]
    np.testing.assert_allclose(got, [0.2, 0.8 - 0.6 * np.exp(-0.3), 0.8 - 0.6 * np.exp(-0.6)])

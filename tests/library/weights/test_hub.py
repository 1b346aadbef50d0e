"""`from_pretrained` and `save_pretrained` on directories the tests write: round trips through
transformers' and timm's layouts, hub names read from a Hugging Face cache offline, and the
errors. Against the libraries themselves: tests/library/weights/test_timm_parity.py (its own CI leg)."""

import json
import os

import keras
import numpy as np
import pytest

pytest.importorskip("safetensors")
import keras_vit  # noqa: E402
from keras_vit.weights import checkpoint, torch_layouts  # noqa: E402
from keras_vit.weights.hub import from_pretrained, save_pretrained  # noqa: E402
from model_fixtures import random_tiny_vit  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_session")


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


tiny = random_tiny_vit


def pixels(size=32):
    return np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype("float32")


@pytest.mark.parametrize("layout", torch_layouts.FORMATS)
@pytest.mark.parametrize("fields", [{}, {"activation": "gelu"}, {"include_top": False},
                                    {"classifier": "gap"}],
                         ids=["token", "exact_gelu", "no_head", "gap"])
def test_a_model_saved_for_a_library_loads_back_equal(tmp_path, layout, fields):
    # (GAP for transformers: its I-JEPA, transformers_ijepa)
    if layout == "transformers" and fields.get("include_top") is False:
        fields = {**fields, "representation_size": 24}  # ViTModel's pooler
    model = tiny(**fields)
    save_pretrained(model, tmp_path / "saved", format=layout)
    assert sorted(os.listdir(tmp_path / "saved")) == sorted(
        ["config.json", "model.safetensors"]
        + (["preprocessor_config.json"] if layout == "transformers" else []))
    loaded = from_pretrained(str(tmp_path / "saved"))
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-6)
    assert loaded.spec.activation == model.spec.activation


def test_a_new_head_and_another_size_on_load(tmp_path):
    save_pretrained(tiny(), tmp_path / "saved", format="timm")
    model = from_pretrained(str(tmp_path / "saved"), num_classes=3, image_size=48)
    assert model.spec.num_classes == 3 and model.spec.image_size == (48, 48)
    assert not np.any(to_np(model.get_layer("head").kernel))  # zero-initialised
    assert model.spec.position_embedding_interpolation == "bicubic"  # timm's resampling
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 37, 24)


def test_hub_names_read_the_hugging_face_cache_offline(tmp_path, monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants")
    snapshot = tmp_path / "cache" / "models--timm--vit_tiny_patch8_32.test" / "snapshots" / "c0"
    save_pretrained(tiny(), snapshot, format="timm")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("c0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets
    model = from_pretrained("timm:vit_tiny_patch8_32.test", cache_dir=str(tmp_path / "cache"))
    assert model.spec.num_classes == 5
    with pytest.raises(checkpoint.CheckpointError, match="could not be downloaded or found"):
        from_pretrained("hf:google/not-cached", cache_dir=str(tmp_path / "cache"))


def test_an_npz_with_its_spec_loads_by_path(tmp_path):
    model = tiny()
    checkpoint.save_npz(model, tmp_path / "model.npz")
    loaded = from_pretrained(str(tmp_path / "model.npz"))
    np.testing.assert_array_equal(to_np(loaded(pixels())), to_np(model(pixels())))
    os.remove(checkpoint.spec_file(tmp_path / "model.npz"))  # read from its tensors instead
    np.testing.assert_array_equal(to_np(from_pretrained(str(tmp_path / "model.npz"))(pixels())),
                                  to_np(model(pixels())))


def test_what_a_library_cannot_express_is_refused_before_writing(tmp_path):
    for fields, layout, message in (
            ({"classifier": "gap", "class_token": True}, "transformers",
             "pooled otherwise .*without a class token is its I-JEPA's"),
            ({"classifier": "map", "final_norm": "none"}, "transformers", "final_norm='none'"),
            ({"classifier": "map"}, "transformers", "SiglipVisionModel, which has no head"),
            ({"position_embedding": "relative"}, "timm", "no equivalent there"),
            ({"representation_size": 16}, "timm", "pre_logits"),
            ({"layer_norm_epsilon": 1e-4}, "timm", "epsilon"),
            ({"num_register_tokens": 1}, "transformers", "num_register_tokens=1"),
            ({"activation": "swiglu", "classifier": "map"}, "timm", "plain MLP"),
            ({"activation": "swiglu", "residual_post_norm": True}, "timm",
             "No VisionTransformer architecture of timm's has ResPostBlock blocks "
             r"\(residual_post_norm\) and SwiGLU MLPs"),
            ({"residual_post_norm": True, "layer_norm_epsilon": 1e-5}, "timm",
             "VisionTransformer architectures of ResPostBlock blocks .* epsilon 1e-06"),
            ({"rope": "axial", "activation": "gelu", "layer_norm_epsilon": 1e-4}, "timm",
             "timm's Eva architectures have LayerNorms of epsilon 1e-05 or 1e-06, the model "
             "0.0001; timm's model_args cannot name another"),
            ({"classifier": "map", "map_include_prefix": True, "class_token": True}, "timm",
             "Eva, which has no attention pooling with activation='gelu_tanh'"),
            ({"activation": "swiglu"}, "transformers", "SwiGLU"),
            ({"residual_post_norm": True}, "transformers", "no post-norm blocks"),
            ({"classifier": "map", "map_num_heads": 1}, "transformers",
             "map_num_heads, map_mlp_dim, map_include_prefix"),
            ({"pre_norm": True}, "transformers", "pre_norm=True"),
            ({"include_top": False, "representation_size": 8}, "transformers", "pooler")):
        with pytest.raises(torch_layouts.LayoutError, match=message):
            save_pretrained(tiny(**fields), tmp_path / "never", format=layout)
    hybrid = keras_vit.vit("R26+S/32", num_layers=1, image_size=64, resnet_numerics="timm",
                           layer_norm_epsilon=1e-4)
    with pytest.raises(torch_layouts.LayoutError,
                       match=r"timm's hybrids of this ResNet \(R26\+S/32\) have LayerNorms of "
                             "epsilon 1e-06, the model 0.0001"):
        save_pretrained(hybrid, tmp_path / "never", format="timm")
    assert not os.path.exists(tmp_path / "never")
    with pytest.raises(ValueError, match="format must be one of"):
        save_pretrained(tiny(), tmp_path / "never", format="onnx")
    for convert in (torch_layouts.to_npz_arrays, torch_layouts.from_npz_arrays):
        with pytest.raises(ValueError, match="layout must be one of"):
            convert({}, tiny().spec, "onnx")


def test_a_weight_the_layout_has_no_place_for_is_refused_before_writing(tmp_path, monkeypatch):
    """A weight of the model that the chosen layout's pairs do not write (as a future option's
    would be) is named, and nothing is written, rather than silently dropped."""
    model = tiny()
    arrays = checkpoint.model_arrays(model)
    extra = "Transformer/encoderblock_1/future_option/scale"
    monkeypatch.setattr(checkpoint, "model_arrays",
                        lambda model: {**arrays, extra: np.ones(24, "float32")})
    for layout in torch_layouts.FORMATS:
        with pytest.raises(torch_layouts.LayoutError,
                           match=f"{layout} layout of this model has no place for 1 of its "
                                 f"weights: {extra}"):
            save_pretrained(model, tmp_path / "never", format=layout)
    assert not os.path.exists(tmp_path / "never")


def test_weights_that_do_not_fit_are_named_and_nothing_loads(tmp_path):
    from safetensors.numpy import load_file, save_file
    save_pretrained(tiny(), tmp_path / "saved", format="transformers")
    weights = tmp_path / "saved" / "model.safetensors"
    state = load_file(weights)
    state.pop("vit.encoder.layer.1.output.dense.bias")
    state["vit.encoder.layer.1.extra"] = np.zeros(3, "float32")
    save_file(state, weights)
    with pytest.raises(torch_layouts.LayoutError,
                       match=r"missing \(1\): vit.encoder.layer.1.output.dense.bias; "
                             r"unexpected \(1\): vit.encoder.layer.1.extra"):
        from_pretrained(str(tmp_path / "saved"))


def test_directories_that_are_not_models_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory, an .npz file, or a hub name"):
        from_pretrained(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="No config.json"):
        from_pretrained(str(tmp_path / "empty"))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="pickled weights, which keras_vit never loads"):
        from_pretrained(str(pickled))
    other = tmp_path / "other"
    save_pretrained(tiny(), other, format="timm")
    (other / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(torch_layouts.LayoutError, match="neither transformers' ViT"):
        from_pretrained(str(other))
    for architecture, message in (
            ("vit_small_patch16_18x2_224", "needs block_fn='<ParallelThingsBlock>', which "
                                           "keras_vit has no option for yet"),
            ("vit_relpos_base_patch16_224", "model.safetensors has no "
                                            "'blocks.0.attn.rel_pos.mlp.fc1.weight'"),
            ("vit_made_up", "not one keras_vit knows")):
        (other / "config.json").write_text(json.dumps({"architecture": architecture}))
        with pytest.raises(torch_layouts.LayoutError, match=message):
            from_pretrained(str(other))
    (other / "config.json").write_text(json.dumps(
        {"architecture": "vit_base_patch16_224", "model_args": {"norm_layer": "rmsnorm"}}))
    with pytest.raises(torch_layouts.LayoutError, match="needs norm_layer='rmsnorm'"):
        from_pretrained(str(other))
    (other / "config.json").write_text(json.dumps(  # DINOv2 giant's GluMlp made a GeGLU
        {"architecture": "vit_giant_patch14_dinov2", "model_args": {"act_layer": "gelu"}}))
    with pytest.raises(torch_layouts.LayoutError,
                       match="needs mlp_layer=GluMlp with act_layer='gelu' .*SwiGLU: SiLU"):
        from_pretrained(str(other))


@pytest.mark.parametrize("layout, field, value, shown", [
    ("transformers", "patch_size", 4, "config.json says patch_size 4, but model.safetensors "
                                      "holds 8x8 patch kernels"),
    ("transformers", "image_size", 64, r"config.json says image_size 64 \(8x8 patches of 8 "
                                       r"pixels\), but model.safetensors holds position "
                                       "embeddings for 4x4 patches"),
    ("timm", "img_size", 64, r"config.json says img_size 64 \(8x8 patches of 8 pixels\), "
                             "but model.safetensors holds position embeddings for 4x4"),
])
def test_a_config_that_contradicts_its_weights_names_both_values(tmp_path, layout, field,
                                                                 value, shown):
    """Nothing is resized unless asked: a file that contradicts itself is an error."""
    save_pretrained(tiny(), tmp_path / "saved", format=layout)
    path = tmp_path / "saved" / "config.json"
    config = json.loads(path.read_text())
    if layout == "timm":
        config["model_args"][field] = value
    else:
        config[field] = value
    path.write_text(json.dumps(config))
    with pytest.raises(torch_layouts.LayoutError, match=shown):
        from_pretrained(str(tmp_path / "saved"))
    # What the user asks for is resized, from the consistent files.
    save_pretrained(tiny(), tmp_path / "good", format=layout)
    asked = from_pretrained(str(tmp_path / "good"), image_size=64, patch_size=4)
    assert asked.spec.image_size == (64, 64) and asked.spec.patch_size == 4


def test_one_librarys_config_beside_the_others_weights_is_a_layout_error(tmp_path):
    save_pretrained(tiny(), tmp_path / "timm", format="timm")
    save_pretrained(tiny(), tmp_path / "transformers", format="transformers")
    for config_from, weights_from in (("timm", "transformers"), ("transformers", "timm")):
        mixed = tmp_path / f"{config_from}_config"
        mixed.mkdir()
        (mixed / "config.json").write_text((tmp_path / config_from / "config.json").read_text())
        (mixed / "model.safetensors").write_bytes(
            (tmp_path / weights_from / "model.safetensors").read_bytes())
        with pytest.raises(torch_layouts.LayoutError,
                           match=f"config.json is {config_from}'s, but model.safetensors has "
                                 "no '.*patch.*' \\(it holds '.*patch.*'"):
            from_pretrained(str(mixed))


def test_a_checkpoints_normalisation_folds_into_the_patch_embedding(tmp_path):
    """Weights trained on ImageNet's mean and std take keras_vit's [-1, 1] inputs: the same
    tokens as the original kernel on the normalised pixels."""
    model = tiny()
    save_pretrained(model, tmp_path / "saved", format="timm")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    config["pretrained_cfg"].update(mean=mean.tolist(), std=std.tolist())
    (tmp_path / "saved" / "config.json").write_text(json.dumps(config))
    folded = from_pretrained(str(tmp_path / "saved"))
    pixels_255 = np.random.default_rng(1).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    ours = folded.get_layer("embedding")(keras_vit.preprocess_inputs(pixels_255))
    theirs = model.get_layer("embedding")(((pixels_255 / 255 - mean) / std).astype("float32"))
    np.testing.assert_allclose(to_np(ours), to_np(theirs), rtol=1e-5, atol=1e-4)


LATER_OPTIONS = {
    "dinov2_registers": dict(num_register_tokens=4, prefix_position_embeddings=False,
                             layer_scale_init=1e-5),
    "clip": dict(pre_norm=True, layer_norm_epsilon=1e-5),
    "registers_gap": dict(num_register_tokens=2, classifier="gap", final_norm="pooled",
                          prefix_position_embeddings=False),
    "no_qkv_bias_no_final_norm": dict(qkv_bias=False, final_norm="none"),
    "attention_pooling": dict(classifier="map"),
    "quick_gelu": dict(activation="quick_gelu"),
    # timm architectures are chosen by epsilon, and their own options overridden
    "epsilon_1e-5_no_pre_norm": dict(layer_norm_epsilon=1e-5),
    "swiglu_layer_scale": dict(activation="swiglu", layer_scale_init=0.5),  # DINOv2 giant's
    "residual_post_norm_gap": dict(residual_post_norm=True, classifier="gap"),  # ResPostBlock
    "eva_attention_pooling": dict(classifier="map", class_token=True, map_include_prefix=True,
                                  map_num_heads=1, map_mlp_dim=40, activation="gelu"),
}


@pytest.mark.parametrize("fields", LATER_OPTIONS.values(), ids=LATER_OPTIONS)
def test_later_options_go_through_timms_layout_and_back(tmp_path, fields):
    model = tiny(**fields)  # random weights, patch bias included (folded for pre_norm)
    save_pretrained(model, tmp_path / "saved", format="timm")
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert {name: getattr(loaded.spec, name) for name in fields} == fields
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)


def test_a_timm_config_without_model_args_takes_its_architectures_options(tmp_path):
    """timm's hub files name the architecture; its options (here DINOv2 with registers:
    LayerScale, 4 registers without position embeddings, 6 heads) come from timm's table."""
    model = tiny(**LATER_OPTIONS["dinov2_registers"], patch_size=14, image_size=28,
                 hidden_size=384, num_heads=6, mlp_dim=64, num_layers=1,
                 activation="gelu")  # timm's default GELU, as the table's DINOv2
    save_pretrained(model, tmp_path / "saved", format="timm")
    config = {"architecture": "vit_small_patch14_reg4_dinov2.lvd142m", "num_classes": 5,
              "pretrained_cfg": {"input_size": [3, 28, 28]}}
    (tmp_path / "saved" / "config.json").write_text(json.dumps(config))
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert (loaded.spec.num_register_tokens, loaded.spec.layer_scale_init,
            loaded.spec.num_heads, loaded.spec.prefix_position_embeddings) == (4, 1e-5, 6, False)
    np.testing.assert_allclose(to_np(loaded(pixels(28))), to_np(model(pixels(28))),
                               rtol=1e-5, atol=1e-5)


def test_transformers_query_key_value_without_biases(tmp_path):
    model = tiny(qkv_bias=False)
    save_pretrained(model, tmp_path / "saved", format="transformers")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["qkv_bias"] is False
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert not loaded.spec.qkv_bias
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)


def _edit_json(path, **changes):
    values = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    path.write_text(json.dumps(values))


def test_timms_resize_and_crop_travel_with_the_model(tmp_path):
    """A timm checkpoint's evaluation transform (bicubic, crop_pct 0.9, timm's default centre
    crop where the cfg has no crop_mode) is the model's preprocessing, and goes back out."""
    save_pretrained(tiny(), tmp_path / "saved", format="timm")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    cfg = {**config["pretrained_cfg"], "interpolation": "bicubic", "crop_pct": 0.9}
    cfg.pop("crop_mode", None)
    _edit_json(tmp_path / "saved" / "config.json", pretrained_cfg=cfg)
    model = from_pretrained(str(tmp_path / "saved"))
    assert model.preprocessing == keras_vit.EvalPreprocessing("bicubic", 0.9, "center",
                                                              antialias=True)
    save_pretrained(model, tmp_path / "timm", format="timm")
    written = json.loads((tmp_path / "timm" / "config.json").read_text())["pretrained_cfg"]
    assert (written["interpolation"], written["crop_pct"], written["crop_mode"]) == (
        "bicubic", 0.9, "center")
    with pytest.warns(UserWarning, match="does not crop.*crop_fraction 0.9"):
        save_pretrained(model, tmp_path / "transformers", format="transformers")
    processor = json.loads((tmp_path / "transformers" / "preprocessor_config.json").read_text())
    assert processor["resample"] == 3  # PIL's bicubic


def test_keras_vits_own_resize_is_written_as_such(tmp_path):
    """A keras_vit model resizes straight to the size, bilinearly: timm's squash mode."""
    model = tiny()
    save_pretrained(model, tmp_path / "timm", format="timm")
    cfg = json.loads((tmp_path / "timm" / "config.json").read_text())["pretrained_cfg"]
    assert (cfg["interpolation"], cfg["crop_pct"], cfg["crop_mode"]) == ("bilinear", 1.0, "squash")
    save_pretrained(model, tmp_path / "transformers", format="transformers")
    processor = json.loads((tmp_path / "transformers" / "preprocessor_config.json").read_text())
    assert processor["resample"] == 2  # PIL's bilinear


def test_transformers_resample_is_read_and_no_file_is_keras_vits_own(tmp_path):
    save_pretrained(tiny(), tmp_path / "saved", format="transformers")
    _edit_json(tmp_path / "saved" / "preprocessor_config.json", resample=3)
    assert from_pretrained(str(tmp_path / "saved")).preprocessing == keras_vit.EvalPreprocessing(
        "bicubic", antialias=True)
    os.remove(tmp_path / "saved" / "preprocessor_config.json")
    assert from_pretrained(str(tmp_path / "saved")).preprocessing == keras_vit.EvalPreprocessing()


def test_a_preprocessing_keras_vit_lacks_is_named_with_the_way_round(tmp_path):
    save_pretrained(tiny(), tmp_path / "saved", format="timm")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    _edit_json(tmp_path / "saved" / "config.json",
               pretrained_cfg={**config["pretrained_cfg"], "crop_mode": "border"})
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"pretrained_cfg\) is not one keras_vit has: .*crop_mode='border'.*"
                             r"Pass preprocessing=keras_vit.EvalPreprocessing"):
        from_pretrained(str(tmp_path / "saved"))
    chosen = keras_vit.EvalPreprocessing("bicubic", 0.9, "center", antialias=True)
    assert from_pretrained(str(tmp_path / "saved"), preprocessing=chosen).preprocessing == chosen
    save_pretrained(tiny(), tmp_path / "transformers", format="transformers")
    _edit_json(tmp_path / "transformers" / "preprocessor_config.json", resample=1)
    with pytest.raises(checkpoint.CheckpointError, match="'PIL resample 1'"):
        from_pretrained(str(tmp_path / "transformers"))
    with pytest.raises(TypeError, match="preprocessing must be a keras_vit.EvalPreprocessing"):
        from_pretrained(str(tmp_path / "saved"), preprocessing="bicubic")


# DeiT's distilled models (Touvron et al. 2021): timm's VisionTransformerDistilled,
# transformers' DeiTForImageClassificationWithTeacher.
@pytest.mark.parametrize("layout", torch_layouts.FORMATS)
@pytest.mark.parametrize("include_top", [True, False], ids=["heads", "no_heads"])
def test_a_distilled_model_saved_for_a_library_loads_back_equal(tmp_path, layout, include_top):
    model = tiny(distillation_token=True, include_top=include_top)
    save_pretrained(model, tmp_path / "saved", format=layout)
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    if layout == "timm":
        assert torch_layouts.timm_architectures()[config["architecture"]]["class"] == (
            "VisionTransformerDistilled")
    else:  # no heads: num_labels 0, where transformers' heads are identities
        assert (config["model_type"], config["architectures"], len(config["id2label"])) == (
            "deit", ["DeiTForImageClassificationWithTeacher"], 5 if include_top else 0)
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert loaded.spec.distillation_token and loaded.spec.include_top == include_top
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-6)
    if include_top:  # each head in its place, not only their mean
        for ours, theirs in zip(keras_vit.distillation_heads(loaded)(pixels()),
                                keras_vit.distillation_heads(model)(pixels())):
            np.testing.assert_allclose(to_np(ours), to_np(theirs), rtol=1e-5, atol=1e-6)


def test_what_deits_classes_cannot_express_is_refused(tmp_path):
    for fields, layout, message in (
            ({"layer_norm_epsilon": 1e-5}, "timm",
             "VisionTransformerDistilled architectures have LayerNorms of epsilon 1e-06, the "
             "model 1e-05"),
            ({"prefix_position_embeddings": False}, "timm", "even with no_embed_class"),
            ({"layer_scale_init": 0.1}, "transformers", "transformers' DeiT has no "
                                                        "layer_scale_init=0.1")):
        with pytest.raises(torch_layouts.LayoutError, match=message):
            save_pretrained(tiny(distillation_token=True, **fields), tmp_path / "never",
                            format=layout)
    assert not os.path.exists(tmp_path / "never")


def test_deit_files_keras_vit_has_no_model_of_are_refused(tmp_path):
    save_pretrained(tiny(distillation_token=True), tmp_path / "transformers",
                    format="transformers")
    path = tmp_path / "transformers" / "config.json"
    for architecture, reason in (("DeiTForImageClassification", "the class token alone"),
                                 ("DeiTModel", "its pooler reads the class token alone")):
        _edit_json(path, architectures=[architecture])
        with pytest.raises(torch_layouts.LayoutError,
                           match=f"transformers' {architecture} has no keras_vit equivalent "
                                 f"yet: .*{reason}"):
            from_pretrained(str(tmp_path / "transformers"))
    save_pretrained(tiny(distillation_token=True), tmp_path / "timm", format="timm")
    config = json.loads((tmp_path / "timm" / "config.json").read_text())
    _edit_json(tmp_path / "timm" / "config.json",
               model_args={**config["model_args"], "no_embed_class": True})
    with pytest.raises(torch_layouts.LayoutError,
                       match="needs no_embed_class=True with a distillation token"):
        from_pretrained(str(tmp_path / "timm"))


@pytest.mark.parametrize("crop_mode, size", [("squash", {"height": 40, "width": 40}),
                                             ("center", {"shortest_edge": 40})])
def test_deits_resize_and_crop_travel_through_transformers(tmp_path, crop_mode, size):
    """DeiT's image processor resizes, then crops the centre (timm's eval transform, which
    `save_pretrained` writes for a distilled model and `from_pretrained` reads back)."""
    model = tiny(distillation_token=True)
    model.preprocessing = keras_vit.EvalPreprocessing("bicubic", 0.8, crop_mode, antialias=True)
    save_pretrained(model, tmp_path / "saved", format="transformers")
    processor = json.loads((tmp_path / "saved" / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "DeiTImageProcessor"
    assert (processor["size"], processor["crop_size"], processor["do_center_crop"]) == (
        size, {"height": 32, "width": 32}, True)
    assert from_pretrained(str(tmp_path / "saved")).preprocessing == model.preprocessing


def test_the_hubs_deit_image_processor_is_read_as_its_crop():
    """facebook/deit-*-224's preprocessor_config.json: resize to 256x256, crop 224x224."""
    from keras_vit.weights import hub
    processor = {"crop_size": 224, "do_center_crop": True, "do_normalize": True,
                 "do_resize": True, "feature_extractor_type": "DeiTFeatureExtractor",
                 "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
                 "resample": 3, "size": 256}
    assert hub._eval_preprocessing({}, "transformers", processor) == (
        keras_vit.EvalPreprocessing("bicubic", 0.875, "squash", antialias=True))
    uneven = {**processor, "size": {"height": 256, "width": 320}}
    with pytest.raises(checkpoint.CheckpointError, match="one crop fraction for both sides"):
        hub._eval_preprocessing({}, "transformers", uneven)


def test_a_crop_deits_processor_cannot_express_is_a_warning(tmp_path):
    model = tiny(distillation_token=True, image_size=(32, 48))
    model.preprocessing = keras_vit.EvalPreprocessing("bicubic", 0.9, "center")
    with pytest.warns(UserWarning, match="cannot keep the aspect ratio.*crop_fraction 0.9"):
        save_pretrained(model, tmp_path / "saved", format="transformers")
    processor = json.loads((tmp_path / "saved" / "preprocessor_config.json").read_text())
    assert (processor["size"], processor["do_center_crop"]) == (
        {"height": 32, "width": 48}, False)


# DINOv2 (Oquab et al. 2023) and its registers form (Darcet et al. 2024): transformers'
# Dinov2Model and Dinov2WithRegistersModel, for models with LayerScale and no head.
DINOV2_OPTIONS = {
    "dinov2": dict(layer_scale_init=0.5),
    "registers": dict(layer_scale_init=0.5, num_register_tokens=2,
                      prefix_position_embeddings=False),
    "registers_with_prefix_rows": dict(layer_scale_init=0.5, num_register_tokens=2),
    "tanh_gelu_no_qkv_bias": dict(layer_scale_init=0.5, activation="gelu_tanh", qkv_bias=False),
}


@pytest.mark.parametrize("fields", DINOV2_OPTIONS.values(), ids=DINOV2_OPTIONS)
def test_a_model_with_layer_scale_goes_through_transformers_dinov2_and_back(tmp_path, fields):
    model = tiny(include_top=False, **fields)
    save_pretrained(model, tmp_path / "saved", format="transformers")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    registers = fields.get("num_register_tokens", 0)
    assert (config["model_type"], config["architectures"]) == (
        ("dinov2_with_registers", ["Dinov2WithRegistersModel"]) if registers
        else ("dinov2", ["Dinov2Model"]))
    processor = json.loads((tmp_path / "saved" / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "BitImageProcessor"
    from safetensors.numpy import load_file
    state = load_file(tmp_path / "saved" / "model.safetensors")
    assert not np.any(state["embeddings.mask_token"])  # transformers' initial value
    assert state["embeddings.position_embeddings"].shape == (1, 1 + 16, 24)  # cls, patches
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert (loaded.spec.layer_scale_init, loaded.spec.num_register_tokens,
            loaded.spec.activation, loaded.spec.qkv_bias) == (
        0.5, registers, model.spec.activation, model.spec.qkv_bias)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)
    tokens = [keras_vit.features(m, layers=-1, norm=True)(pixels()) for m in (loaded, model)]
    np.testing.assert_allclose(to_np(tokens[0]), to_np(tokens[1]), rtol=1e-5, atol=1e-5)


def test_what_transformers_dinov2_cannot_express_is_refused(tmp_path):
    for fields, message in (
            ({}, "head on classifier='token'.*'token_gap'"),
            ({"include_top": False, "classifier": "gap"}, "output on classifier='gap'"),
            ({"include_top": False, "classifier": "token_gap"}, "classifier='token_gap'"),
            ({"include_top": False, "pre_norm": True}, "pre_norm=True"),
            ({"include_top": False, "image_size": (32, 48)}, "square grid"),
            ({"include_top": False, "mlp_dim": 36}, "mlp_dim 36")):
        with pytest.raises(torch_layouts.LayoutError,
                           match="^A model with LayerScale is written as transformers' "
                                 r"Dinov2Model \(with a head, Dinov2ForImageClassification\), "
                                 "which has no .*" + message):
            save_pretrained(tiny(layer_scale_init=0.5, **fields), tmp_path / "never",
                            format="transformers")
    assert not os.path.exists(tmp_path / "never")


@pytest.mark.parametrize("registers", [0, 2], ids=["dinov2", "registers"])
def test_a_token_gap_model_with_layer_scale_goes_through_dinov2s_classifier(tmp_path,
                                                                            registers):
    """A head on the class token beside the patches' mean (classifier "token_gap") is
    transformers' Dinov2ForImageClassification (Dinov2WithRegistersForImageClassification)."""
    model = tiny(classifier="token_gap", layer_scale_init=0.5, num_register_tokens=registers,
                 num_classes=3)
    save_pretrained(model, tmp_path / "saved", format="transformers")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["architectures"] == [
        "Dinov2WithRegistersForImageClassification" if registers
        else "Dinov2ForImageClassification"]
    assert len(config["id2label"]) == 3
    from safetensors.numpy import load_file
    state = load_file(tmp_path / "saved" / "model.safetensors")
    prefix = "dinov2_with_registers." if registers else "dinov2."
    assert state["classifier.weight"].shape == (3, 2 * 24)
    assert not np.any(state[prefix + "embeddings.mask_token"])
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert (loaded.spec.classifier, loaded.spec.num_classes, loaded.spec.num_register_tokens) == (
        "token_gap", 3, registers)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)


def test_a_swiglu_model_with_layerscale_round_trips_as_dinov2_giants_layout(tmp_path):
    """DINOv2 giant's SwiGLU MLP: mlp_dim two thirds of an int mlp_ratio x width, up to a
    multiple of 8 (at width 24, ratio 4: 64); another mlp_dim has no DINOv2 config (timm's
    layout, DINOv2 giant's SwiGLUPacked, takes any)."""
    fields = dict(include_top=False, layer_scale_init=0.5, activation="swiglu")
    with pytest.raises(torch_layouts.LayoutError, match="mlp_dim 50"):
        save_pretrained(tiny(**fields, mlp_dim=50), tmp_path / "never", format="transformers")
    odd = tiny(**fields, mlp_dim=50)
    save_pretrained(odd, tmp_path / "timm", format="timm")
    np.testing.assert_allclose(to_np(from_pretrained(str(tmp_path / "timm"))(pixels())),
                               to_np(odd(pixels())), atol=1e-5)
    model = tiny(**fields, mlp_dim=64)
    save_pretrained(model, tmp_path / "saved", format="transformers")
    with open(tmp_path / "saved" / "config.json") as handle:
        config = json.load(handle)
    assert (config["use_swiglu_ffn"], config["mlp_ratio"]) == (True, 4)
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert (loaded.spec.activation, loaded.spec.mlp_dim) == ("swiglu", 64)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), atol=1e-5)


def test_the_hubs_dinov2_image_processor_is_read_as_its_crop_and_normalisation():
    """facebook/dinov2-*'s preprocessor_config.json (BitImageProcessor): the shortest edge to
    256, crop 224x224, bicubic, ImageNet's mean and std."""
    from keras_vit.weights import hub
    processor = {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True,
                 "do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
                 "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
                 "image_processor_type": "BitImageProcessor",
                 "image_std": [0.229, 0.224, 0.225], "resample": 3,
                 "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 256}}
    assert hub._eval_preprocessing({}, "transformers", processor) == (
        keras_vit.EvalPreprocessing("bicubic", 0.875, "center", antialias=True))
    mean, std = hub._normalization({"model_type": "dinov2"}, processor)
    np.testing.assert_array_equal(mean, [0.485, 0.456, 0.406])
    np.testing.assert_array_equal(std, [0.229, 0.224, 0.225])


# CLIP's vision tower (Radford et al. 2021) and SigLIP's (Zhai et al. 2023): transformers'
# CLIPVisionModel and SiglipVisionModel, for models with their options and no head.
TOWER_OPTIONS = {
    "clip": dict(include_top=False, pre_norm=True, final_norm="pooled",
                 activation="quick_gelu", layer_norm_epsilon=1e-5),
    "siglip": dict(include_top=False, classifier="map", final_norm="tokens"),
}


@pytest.mark.parametrize("family", TOWER_OPTIONS)
def test_clip_and_siglip_options_go_through_their_vision_models_and_back(tmp_path, family):
    model = tiny(**TOWER_OPTIONS[family])
    save_pretrained(model, tmp_path / "saved", format="transformers")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    clip = family == "clip"
    assert (config["model_type"], config["architectures"]) == (
        ("clip_vision_model", ["CLIPVisionModel"]) if clip
        else ("siglip_vision_model", ["SiglipVisionModel"]))
    processor = json.loads((tmp_path / "saved" / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == ("CLIPImageProcessor" if clip
                                                 else "SiglipImageProcessor")
    from safetensors.numpy import load_file
    state = load_file(tmp_path / "saved" / "model.safetensors")
    # CLIP's patch convolution has no bias: it is in the patches' position rows.
    assert ("embeddings.patch_embedding.bias" in state) is not clip
    assert state["embeddings.position_embedding.weight"].shape == (int(clip) + 16, 24)
    if not clip:
        assert state["head.attention.in_proj_weight"].shape == (3 * 24, 24)
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert loaded.spec == model.spec.replace(variant=loaded.spec.variant, num_classes=1)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)
    tokens = [keras_vit.features(m, layers=-1)(pixels()) for m in (loaded, model)]
    np.testing.assert_allclose(to_np(tokens[0]), to_np(tokens[1]), rtol=1e-5, atol=1e-5)


# Whole image-text models -> their class (MetaCLIP 2's is CLIP's layout).
WHOLE_MODELS = {"clip": "CLIPModel", "metaclip_2": "MetaClip2Model", "siglip": "SiglipModel"}


@pytest.mark.parametrize("family", WHOLE_MODELS)
def test_the_vision_tower_of_a_full_clip_or_siglip_loads_without_the_text_tower(
        tmp_path, family, caplog):
    from safetensors.numpy import load_file, save_file
    clip = family != "siglip"
    model = tiny(**TOWER_OPTIONS["clip" if clip else family])
    save_pretrained(model, tmp_path / "tower", format="transformers")
    vision_config = json.loads((tmp_path / "tower" / "config.json").read_text())
    state = {"vision_model." + key: value
             for key, value in load_file(tmp_path / "tower" / "model.safetensors").items()}
    state.update({"text_model.embeddings.token_embedding.weight": np.ones((10, 8), "float32"),
                  "logit_scale": np.ones((), "float32")})
    if clip:
        state["visual_projection.weight"] = np.ones((4, 24), "float32")
    (tmp_path / "full").mkdir()
    save_file(state, str(tmp_path / "full" / "model.safetensors"))
    (tmp_path / "full" / "config.json").write_text(json.dumps(
        {"model_type": family, "architectures": [WHOLE_MODELS[family]],
         "vision_config": {key: value for key, value in vision_config.items()
                           if key not in ("model_type", "architectures")},
         "text_config": {"hidden_size": 8}}))
    with caplog.at_level("INFO", logger="keras_vit.weights.torch_layouts"):
        loaded = from_pretrained(str(tmp_path / "full"))
    assert "left out logit_scale, text_model" in caplog.text
    assert ("visual_projection" in caplog.text) is clip
    assert WHOLE_MODELS[family] in caplog.text
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("head", [False, True], ids=["vision_model", "with_projection"])
def test_metaclip_2_vision_models_load_as_clips(tmp_path, head):
    """MetaClip2VisionModel and MetaClip2VisionModelWithProjection are CLIP's classes under
    other names: CLIP's files renamed load with the same outputs."""
    model = tiny(**{**TOWER_OPTIONS["clip"], "include_top": head, "num_classes": 16})
    if head:  # a projection has no bias
        model.get_layer("head").bias.assign(np.zeros(16, "float32"))
    save_pretrained(model, tmp_path / "saved", format="transformers")
    _edit_json(tmp_path / "saved" / "config.json", model_type="metaclip_2_vision_model",
               architectures=["MetaClip2VisionModel" + ("WithProjection" if head else "")])
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert loaded.spec == model.spec.replace(variant=loaded.spec.variant,
                                             num_classes=loaded.spec.num_classes)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)


def test_what_clip_and_siglip_cannot_express_is_refused(tmp_path):
    for family, fields, message in (
            ("siglip", {"include_top": True}, "head: save a model with include_top=False"),
            ("clip", {"prefix_position_embeddings": False}, "prefix_position_embeddings"),
            ("siglip", {"num_register_tokens": 2}, "register tokens"),
            ("siglip", {"dropout": 0.1}, "dropout 0.1"),
            ("siglip", {"image_size": (32, 48)}, "square grid")):
        name = "CLIPVisionModel" if family == "clip" else "SiglipVisionModel"
        with pytest.raises(torch_layouts.LayoutError,
                           match=f"^A model with {name[:-11]}'s options is written as "
                                 f"transformers' {name}, which has no .*{message}"):
            save_pretrained(tiny(**{**TOWER_OPTIONS[family], **fields}), tmp_path / "never",
                            format="transformers")
    assert not os.path.exists(tmp_path / "never")


def test_a_clip_tower_with_a_head_of_zero_bias_is_clip_vision_model_with_projection(tmp_path):
    """CLIP's visual_projection is a Linear without bias: a head whose bias is zero is written
    as it, another refused naming the bias."""
    model = tiny(**{**TOWER_OPTIONS["clip"], "include_top": True, "num_classes": 16})
    with pytest.raises(torch_layouts.LayoutError,
                       match="CLIPVisionModelWithProjection, whose visual_projection has no "
                             "bias, but this head's bias is not zero"):
        save_pretrained(model, tmp_path / "never", format="transformers")
    assert not os.path.exists(tmp_path / "never")
    model.get_layer("head").bias.assign(np.zeros(16, "float32"))
    save_pretrained(model, tmp_path / "saved", format="transformers")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (config["architectures"], config["projection_dim"]) == (
        ["CLIPVisionModelWithProjection"], 16)
    from safetensors.numpy import load_file
    state = load_file(tmp_path / "saved" / "model.safetensors")
    assert state["visual_projection.weight"].shape == (16, 24)
    assert "vision_model.post_layernorm.weight" in state
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert loaded.spec == model.spec.replace(variant=loaded.spec.variant)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)


def test_the_hubs_clip_and_siglip_image_processors_are_read():
    """openai/clip-vit-base-patch32's preprocessor_config.json (an int size is CLIP's shortest
    edge), and google/siglip-base-patch16-224's (straight to the size)."""
    from keras_vit.weights import hub
    clip = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
            "feature_extractor_type": "CLIPFeatureExtractor",
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224}
    assert hub._eval_preprocessing({}, "transformers", clip) == (
        keras_vit.EvalPreprocessing("bicubic", 1.0, "center", antialias=True))
    mean, std = hub._normalization({"model_type": "clip"}, clip)
    np.testing.assert_array_equal(mean, clip["image_mean"])
    np.testing.assert_array_equal(std, clip["image_std"])
    siglip = {"do_normalize": True, "do_rescale": True, "do_resize": True,
              "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "SiglipImageProcessor",
              "image_std": [0.5, 0.5, 0.5], "resample": 3,
              "rescale_factor": 0.00392156862745098, "size": {"height": 224, "width": 224}}
    assert hub._eval_preprocessing({}, "transformers", siglip) == (
        keras_vit.EvalPreprocessing("bicubic", 1.0, "squash", antialias=True))


def test_a_siglip_without_its_head_is_refused(tmp_path):
    save_pretrained(tiny(**TOWER_OPTIONS["siglip"]), tmp_path / "saved", format="transformers")
    _edit_json(tmp_path / "saved" / "config.json", vision_use_head=False)
    with pytest.raises(torch_layouts.LayoutError, match="vision_use_head=False.*features"):
        from_pretrained(str(tmp_path / "saved"))


# I-JEPA (Assran et al. 2023): transformers' IJepaModel and IJepaForImageClassification, ViT's
# layout without a class token, for models of classifier "gap" without one; against transformers
# itself: tests/library/weights/test_library_parity.py.
@pytest.mark.parametrize("include_top", [True, False], ids=["classifier", "model"])
def test_gap_without_a_class_token_goes_through_transformers_ijepa_and_back(tmp_path,
                                                                            include_top):
    from safetensors.numpy import load_file
    model = tiny(classifier="gap", include_top=include_top, activation="gelu")
    save_pretrained(model, tmp_path / "saved", format="transformers")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    architecture = "IJepaForImageClassification" if include_top else "IJepaModel"
    assert (config["model_type"], config["architectures"]) == ("ijepa", [architecture])
    assert len(config.get("id2label", {})) == (5 if include_top else 0)
    state = load_file(tmp_path / "saved" / "model.safetensors")
    prefix = "ijepa." if include_top else ""
    assert not any("cls_token" in key for key in state)
    assert state[prefix + "embeddings.position_embeddings"].shape == (1, 16, 24)  # patches only
    assert ("classifier.weight" in state) is include_top
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert loaded.spec == model.spec.replace(variant=loaded.spec.variant,
                                             num_classes=loaded.spec.num_classes)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)
    tokens = [keras_vit.features(m, layers=-1, norm=True)(pixels()) for m in (loaded, model)]
    np.testing.assert_allclose(to_np(tokens[0]), to_np(tokens[1]), rtol=1e-5, atol=1e-5)


def test_ijepa_tensors_its_from_pretrained_never_builds_are_dropped(tmp_path, caplog):
    """IJepaModel's pooler (add_pooling_layer=True) and mask token (use_mask_token=True), which
    transformers' from_pretrained leaves unbuilt, are dropped with a log line; an
    IJepaForImageClassification of num_labels 0 (an identity classifier) loads as its
    IJepaModel."""
    from safetensors.numpy import load_file, save_file
    model = tiny(classifier="gap", include_top=False)
    save_pretrained(model, tmp_path / "saved", format="transformers")
    state = load_file(tmp_path / "saved" / "model.safetensors")
    save_file({**state, "pooler.dense.weight": np.ones((24, 24), "float32"),
               "pooler.dense.bias": np.ones(24, "float32"),
               "embeddings.mask_token": np.zeros((1, 1, 24), "float32")},
              str(tmp_path / "saved" / "model.safetensors"))
    with caplog.at_level("INFO", logger="keras_vit.weights.torch_layouts"):
        loaded = from_pretrained(str(tmp_path / "saved"))
    assert ("Dropped embeddings.mask_token, pooler.dense.bias, pooler.dense.weight"
            in caplog.text)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)
    save_file({"ijepa." + key: value for key, value in state.items()},
              str(tmp_path / "saved" / "model.safetensors"))
    _edit_json(tmp_path / "saved" / "config.json", architectures=["IJepaForImageClassification"])
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert not loaded.spec.include_top
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)


def test_what_transformers_ijepa_cannot_express_is_refused(tmp_path):
    for fields, message in (
            ({"final_norm": "pooled"}, "final_norm='pooled'"),
            ({"final_norm": "none"}, "final_norm='none'"),
            ({"representation_size": 16}, r"pre_logits layer \(representation_size\)"),
            ({"num_register_tokens": 2}, "register tokens"),
            ({"pre_norm": True}, "pre_norm=True"),
            ({"position_embedding": "sincos_2d"}, "has learned 1-D position")):
        with pytest.raises(torch_layouts.LayoutError,
                           match="transformers' IJepaModel.*" + message):
            save_pretrained(tiny(classifier="gap", **fields), tmp_path / "never",
                            format="transformers")
    assert not os.path.exists(tmp_path / "never")


# AIMv2 (Fini et al. 2024): transformers' Aimv2VisionModel, for models of its options (patch_norm,
# RMSNorms, SiLU-gated MLPs, its attention pooling: classifier "map" of map_mlp_dim 0, or
# without one "gap"); against transformers itself: tests/library/weights/test_library_parity.py.
AIMV2 = dict(include_top=False, norm_layer="rms_norm", activation="swiglu", patch_norm=True,
             layer_norm_epsilon=1e-5)


@pytest.mark.parametrize("fields", [
    {"classifier": "map", "map_mlp_dim": 0, "qkv_bias": False, "proj_bias": False},
    {"classifier": "map", "map_mlp_dim": 0},  # biases everywhere: written as qkv_bias, mlp_bias
    {"classifier": "gap", "qkv_bias": False, "proj_bias": False},  # use_head=False
], ids=["head", "biases", "no_head"])
def test_aimv2s_options_go_through_transformers_aimv2_and_back(tmp_path, fields):
    from safetensors.numpy import load_file
    model = tiny(**AIMV2, **fields)
    save_pretrained(model, tmp_path / "saved", format="transformers")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (
        "aimv2_vision_model", ["Aimv2VisionModel"])
    assert (config["use_head"], config["qkv_bias"], config["mlp_bias"]) == (
        fields["classifier"] == "map", model.spec.proj_bias, model.spec.proj_bias)
    state = load_file(tmp_path / "saved" / "model.safetensors")
    assert state["embeddings.position_embedding.weight"].shape == (16, 24)  # patches only
    assert ("head.k_proj.bias" in state) is model.spec.proj_bias
    loaded = from_pretrained(str(tmp_path / "saved"))
    assert loaded.spec == model.spec.replace(variant=loaded.spec.variant, num_classes=1)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-5)
    tokens = [keras_vit.features(m, layers=-1, norm=True)(pixels()) for m in (loaded, model)]
    np.testing.assert_allclose(to_np(tokens[0]), to_np(tokens[1]), rtol=1e-5, atol=1e-5)


def test_what_transformers_aimv2_cannot_express_is_refused(tmp_path):
    aimv2 = {**AIMV2, "classifier": "map", "map_mlp_dim": 0}
    for fields, message in (
            ({"norm_layer": "layer_norm"}, "norm_layer='layer_norm'"),
            ({"activation": "gelu"}, "activation='gelu'"),
            ({"classifier": "token", "map_mlp_dim": None}, "classifier=.token.*class, distil"),
            ({"include_top": True}, "head: save a model with include_top=False"),
            ({"num_register_tokens": 1}, "register tokens"),
            ({"final_norm": "none"}, "final_norm='none'"),
            ({"qk_norm": True}, "qk_norm=True"),
            ({"position_embedding": "sincos_2d"}, "position_embedding='sincos_2d'")):
        with pytest.raises(torch_layouts.LayoutError,
                           match="transformers' Aimv2VisionModel.*" + message):
            save_pretrained(tiny(**{**aimv2, **fields}), tmp_path / "never",
                            format="transformers")
    # NaFlex models: neither SigLIP 2's nor timm's NaFlexVit has AIMv2's options
    naflex = keras_vit.native.NaFlexViT(tiny(include_top=False, classifier="map",
                                             patch_norm=True))
    for layout, target in (("transformers", "Siglip2VisionModel"), ("timm", "NaFlexVit")):
        with pytest.raises(torch_layouts.LayoutError,
                           match=target + ".*norm of the patch tokens"):
            save_pretrained(naflex, tmp_path / "never", format=layout)
    assert not os.path.exists(tmp_path / "never")


# ViT-MSN (Assran et al. 2022) and ViT-MAE (He et al. 2022): ViT's layout without the pooler,
# written here from a keras_vit model's ViT files; against transformers itself:
# tests/library/weights/test_library_parity.py.
def _as_masked_vit(tmp_path, model, architecture, state_names, **config):
    """`model`'s transformers ViT files, as `architecture`'s: its state renamed by
    `state_names` (name -> name, or None to drop), its config.json edited by `config`."""
    from safetensors.numpy import load_file, save_file
    save_pretrained(model, tmp_path / "vit", format="transformers")
    state = {}
    for key, value in load_file(tmp_path / "vit" / "model.safetensors").items():
        if state_names(key) is not None:
            state[state_names(key)] = value
    (tmp_path / "masked").mkdir()
    save_file(state, str(tmp_path / "masked" / "model.safetensors"))
    config = {**json.loads((tmp_path / "vit" / "config.json").read_text()),
              "architectures": [architecture], **config}
    (tmp_path / "masked" / "config.json").write_text(json.dumps(config))
    return tmp_path / "masked"


def test_a_vit_msn_classifier_loads_with_its_head(tmp_path):
    model = tiny()
    # transformers saves its blocks as encoder.* beside vit.embeddings and vit.layernorm
    directory = _as_masked_vit(tmp_path, model, "ViTMSNForImageClassification",
                               lambda key: key[len("vit."):] if key.startswith("vit.encoder.")
                               else key, model_type="vit_msn")
    loaded = from_pretrained(str(directory))
    assert loaded.spec.include_top and loaded.spec.num_classes == model.spec.num_classes
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(model(pixels())), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("architecture", ["ViTMSNModel", "ViTMAEModel", "ViTMAEForPreTraining"])
def test_vit_msn_and_vit_mae_encoders_load_without_a_pooler(tmp_path, architecture, caplog):
    model = tiny(include_top=False, representation_size=24)  # ViTModel's files: a pooler
    pretraining = architecture == "ViTMAEForPreTraining"
    model_type = "vit_msn" if "MSN" in architecture else "vit_mae"
    directory = _as_masked_vit(
        tmp_path, model, architecture,
        lambda key: None if key.startswith("pooler.") else ("vit." if pretraining else "") + key,
        model_type=model_type, mask_ratio=0.75 if model_type == "vit_mae" else None)
    if pretraining:
        from safetensors.numpy import load_file, save_file
        state = load_file(directory / "model.safetensors")
        state["decoder.decoder_pos_embed"] = np.zeros((1, 17, 8), "float32")
        save_file(state, str(directory / "model.safetensors"))
    with caplog.at_level("INFO", logger="keras_vit.weights.torch_layouts"):
        loaded = from_pretrained(str(directory))
    assert ("left out decoder" in caplog.text) is pretraining
    assert ("mask_ratio 0.75" in caplog.text) is (model_type == "vit_mae")
    assert not loaded.spec.include_top and loaded.spec.representation_size is None
    tokens = [keras_vit.features(each, layers=-1, norm=True)(pixels()) for each in (model, loaded)]
    np.testing.assert_allclose(to_np(tokens[1]), to_np(tokens[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_np(loaded(pixels())), to_np(tokens[0])[:, 0], rtol=1e-5,
                               atol=1e-5)


def test_vit_mae_imagenet_normalisation_folds_into_the_patch_embedding(tmp_path):
    model = tiny(include_top=False, representation_size=24)
    directory = _as_masked_vit(tmp_path, model, "ViTMAEModel",
                               lambda key: None if key.startswith("pooler.") else key,
                               model_type="vit_mae")
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    (directory / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "do_normalize": True,
         "image_mean": list(mean), "image_std": list(std), "size": {"height": 32, "width": 32}}))
    loaded = from_pretrained(str(directory))
    # The saved weights read the processor's normalised pixels; keras_vit's inputs are
    # pixels * 2 - 1.
    theirs = ((pixels() + 1) / 2 - mean) / std
    tokens = keras_vit.features(model, layers=-1, norm=True)(theirs.astype("float32"))
    np.testing.assert_allclose(to_np(keras_vit.features(loaded, layers=-1, norm=True)(pixels())),
                               to_np(tokens), rtol=1e-4, atol=1e-4)

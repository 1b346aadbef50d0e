"""`from_pretrained` and `save_pretrained` against the libraries themselves (transformers 5 and
timm 1.0.31 on PyTorch's CPU): their ViTs and DeiT's distilled models with random weights of
order 1 (so that a wrong GELU or LayerNorm epsilon shows), saved by them and loaded here, and
ours saved here and loaded by them, give the same outputs; and timm's eval transform resizes
and crops to the sizes keras_vit computes. Skipped where they are not installed; CI runs it in
its own environment (see .ci/run)."""

import os

import keras
import numpy as np

from train_fixtures import REPO
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

import keras_vit  # noqa: E402
from keras_vit.weights.torch_layouts import LayoutError  # noqa: E402
from model_fixtures import order_one  # noqa: E402

IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")


def through_timm_files(theirs, directory, model_args=None):
    """keras_vit's model of timm's `theirs`, saved as its hub files (config.json with its
    architecture and `model_args`, model.safetensors) in `directory`."""
    from timm.models import _hub
    _hub.save_for_hf(theirs, str(directory), model_args=model_args, safe_serialization=True)
    return keras_vit.from_pretrained(str(directory))


def back_in_timm(model, directory):
    """timm's model of keras_vit's `model`, written by `save_pretrained(format="timm")` in
    `directory` and built by `timm.create_model("local-dir:...")`."""
    keras_vit.save_pretrained(model, directory, format="timm")
    return timm.create_model("local-dir:" + os.fspath(directory), pretrained=True)


def keras_order_one(model):
    """`order_one` for a keras_vit model: weights N(0, 0.3), LayerNorm scales 1 + N(0, 0.1)."""
    rng = np.random.default_rng(0)
    for weight in model.weights:
        scale = weight.path.endswith(("gamma", "scale"))  # Keras' LayerNorm scale: gamma
        weight.assign(rng.normal(float(scale), 0.1 if scale else 0.3, weight.shape))


def their_outputs(model, head):
    with torch.no_grad():
        outputs = model(pixel_values=torch.tensor(IMAGES.transpose(0, 3, 1, 2)))
    return (outputs.logits if head else outputs.pooler_output).numpy()


def assert_close(actual, expected, tolerance=1e-4):
    """Within `tolerance` of the largest of `expected`, which must not be small."""
    actual = np.asarray(keras.ops.convert_to_numpy(actual))
    expected = np.asarray(expected)
    assert actual.shape == expected.shape
    assert np.abs(expected).max() > 0.5
    assert np.abs(actual - expected).max() <= tolerance * np.abs(expected).max()


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("head", [True, False], ids=["classifier", "vitmodel"])
def test_transformers_both_ways(tmp_path, act, head):
    config = transformers.ViTConfig(
        hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=48,
        image_size=32, patch_size=8, num_labels=5, hidden_act=act)  # layer_norm_eps 1e-12
    cls = transformers.ViTForImageClassification if head else transformers.ViTModel
    theirs = order_one(cls(config))
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    # Carried over from the config, not assumed (an epsilon of 1e-12 against 1e-6 moves
    # order-1 outputs by less than the tolerance below).
    assert ours.spec.layer_norm_epsilon == 1e-12
    assert ours.spec.activation == {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}[act]
    expected = their_outputs(theirs, head)
    assert_close(ours(IMAGES), expected)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    assert_close(their_outputs(cls.from_pretrained(tmp_path / "ours").eval(), head), expected)


def test_a_vitmodel_without_its_pooler_loads_as_the_pooled_class_token(tmp_path):
    config = transformers.ViTConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=3,
                                    intermediate_size=48, image_size=32, patch_size=8)
    theirs = order_one(transformers.ViTModel(config, add_pooling_layer=False))
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert ours.spec.representation_size is None and not ours.spec.include_top
    with torch.no_grad():
        tokens = theirs(pixel_values=torch.tensor(IMAGES.transpose(0, 3, 1, 2)))
    assert_close(ours(IMAGES), tokens.last_hidden_state[:, 0].numpy())


def test_a_native_model_loads_in_transformers(tmp_path):
    """keras_vit's own models use the original's tanh GELU and epsilon 1e-6: the written config
    says so."""
    ours = keras_vit.vit("Ti/16", hidden_size=24, mlp_dim=48, num_heads=3, num_layers=2,
                         image_size=32, patch_size=8, num_classes=5)
    for variable in ours.weights:
        variable.assign(np.random.default_rng(1).normal(0, 0.3, variable.shape))
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    theirs = transformers.ViTForImageClassification.from_pretrained(tmp_path / "ours").eval()
    assert (theirs.config.hidden_act, theirs.config.layer_norm_eps) == ("gelu_pytorch_tanh",
                                                                        1e-6)
    assert_close(ours(IMAGES), their_outputs(theirs, True))


@pytest.mark.parametrize("gap", [False, True], ids=["token", "gap"])
def test_timm_both_ways(tmp_path, gap):
    pool = dict(global_pool="avg", class_token=False, fc_norm=False) if gap else {}
    theirs = order_one(timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=24,
        depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5, **pool))
    ours = through_timm_files(theirs, tmp_path / "theirs")
    assert ours.spec.classifier == ("gap" if gap else "token")
    cfg = theirs.pretrained_cfg  # its evaluation transform: bicubic, crop_pct 0.9
    assert ours.preprocessing == keras_vit.EvalPreprocessing(
        cfg["interpolation"], cfg["crop_pct"], cfg.get("crop_mode") or "center", antialias=True)
    images = torch.tensor(IMAGES.transpose(0, 3, 1, 2))
    with torch.no_grad():
        expected = theirs(images).numpy()
    assert_close(ours(IMAGES), expected)
    back = back_in_timm(ours, tmp_path / "ours")
    with torch.no_grad():
        assert_close(expected, back.eval()(images).numpy())


def test_a_timm_checkpoint_of_imagenet_normalisation_takes_keras_vit_inputs(tmp_path):
    """timm's DeiT-style weights expect (pixels / 255 - mean) / std with ImageNet's statistics;
    loaded here they take `keras_vit.preprocess_inputs(pixels)` and give timm's logits."""
    theirs = order_one(timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=24,
        depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5))
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    theirs.pretrained_cfg = {**theirs.pretrained_cfg, "mean": tuple(mean), "std": tuple(std)}
    ours = through_timm_files(theirs, tmp_path / "theirs")
    pixels = np.random.default_rng(3).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    normalised = ((pixels / 255 - mean) / std).astype("float32").transpose(0, 3, 1, 2)
    with torch.no_grad():
        expected = theirs(torch.tensor(normalised)).numpy()
    assert_close(ours(keras_vit.preprocess_inputs(pixels)), expected)


# timm architectures whose options keras_vit maps (each built small: width 24, 2 blocks, 32px),
# with what each shows.
TIMM_FAMILIES = {
    "vit_small_patch14_reg4_dinov2": "4 registers, no position embeddings for them, LayerScale",
    "vit_base_patch16_clip_224": "a norm before the blocks, no patch bias, epsilon 1e-5, "
                                 "CLIP's mean and std",
    "vit_base_patch16_siglip_gap_224": "GAP normalised before pooling, no class token",
    "vit_betwixt_patch16_reg4_gap_256": "registers and GAP normalised after pooling (fc_norm)",
    "vit_base_patch16_224_miil": "no query, key and value biases",
    "vit_base_patch16_radio_v3": "no final norm",
    "vit_base_patch16_siglip_224": "attention pooling (MAP)",
    "vit_base_patch16_clip_quickgelu_224": "OpenAI CLIP's quick GELU",
}


@pytest.mark.parametrize("architecture", TIMM_FAMILIES)
def test_timm_families_both_ways(tmp_path, architecture):
    small = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0,
                 num_classes=5)
    theirs = order_one(timm.create_model(architecture, pretrained=False, **small))
    # As timm writes a model of its own arguments: the architecture and model_args.
    ours = through_timm_files(theirs, tmp_path / "theirs", small)
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")

    def logits(model):  # on the pixels as the model's pretrained_cfg normalises them
        mean, std = (np.asarray(model.pretrained_cfg[key]) for key in ("mean", "std"))
        with torch.no_grad():
            return model(torch.tensor(((pixels / 255 - mean) / std).transpose(0, 3, 1, 2),
                                      dtype=torch.float32)).numpy()

    expected = logits(theirs)
    assert_close(ours(keras_vit.preprocess_inputs(pixels)), expected)
    back = back_in_timm(ours, tmp_path / "ours")
    assert_close(logits(back.eval()), expected)


# DeiT's distilled models (Touvron et al. 2021): a distillation token after the class token,
# with a head of its own; both libraries output the mean of the two heads' logits.
DEIT_SMALL = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0,
                  num_classes=5)


@pytest.mark.parametrize("options", [{}, {"init_values": 0.5, "pre_norm": True},
                                     {"num_classes": 0}],
                         ids=["deit", "layer_scale_pre_norm", "no_heads"])
def test_timms_distilled_deit_both_ways(tmp_path, options):
    from timm.models.deit import VisionTransformerDistilled
    args = {**DEIT_SMALL, **options}
    theirs = order_one(timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False,
                                         **args))
    assert isinstance(theirs, VisionTransformerDistilled)
    ours = through_timm_files(theirs, tmp_path / "theirs", args)
    assert ours.spec.distillation_token and ours.spec.include_top == bool(args["num_classes"])
    pixels = np.random.default_rng(4).uniform(0, 255, (2, 32, 32, 3)).astype("float32")

    def normalised(model):  # the pixels as the model's pretrained_cfg says (ImageNet's for DeiT)
        mean, std = (np.asarray(model.pretrained_cfg[key]) for key in ("mean", "std"))
        return torch.tensor(((pixels / 255 - mean) / std).transpose(0, 3, 1, 2),
                            dtype=torch.float32)

    with torch.no_grad():
        expected = theirs(normalised(theirs)).numpy()
        tokens = theirs.forward_features(normalised(theirs))
        heads = [theirs.head(tokens[:, 0]).numpy(), theirs.head_dist(tokens[:, 1]).numpy()]
    inputs = keras_vit.preprocess_inputs(pixels)
    assert_close(ours(inputs), expected, 1e-5)
    if ours.spec.include_top:  # each head, not only their mean
        for actual, head in zip(keras_vit.distillation_heads(ours)(inputs), heads):
            assert_close(actual, head, 1e-5)
    back = back_in_timm(ours, tmp_path / "ours")
    assert isinstance(back, VisionTransformerDistilled)
    with torch.no_grad():
        assert_close(back.eval()(normalised(back)).numpy(), expected, 1e-5)


def deit_config(**fields):
    return transformers.DeiTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                   intermediate_size=48, image_size=32, patch_size=8,
                                   **fields)  # hidden_act gelu, layer_norm_eps 1e-12


def deit_outputs(model):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(IMAGES.transpose(0, 3, 1, 2)))


@pytest.mark.parametrize("num_labels", [5, 0], ids=["heads", "no_heads"])
def test_transformers_deit_with_teacher_both_ways(tmp_path, num_labels):
    cls = transformers.DeiTForImageClassificationWithTeacher
    theirs = order_one(cls(deit_config(num_labels=num_labels)))
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert ours.spec.distillation_token and ours.spec.include_top == bool(num_labels)
    assert ours.spec.layer_norm_epsilon == 1e-12 and ours.spec.activation == "gelu"
    expected = deit_outputs(theirs)
    assert_close(ours(IMAGES), expected.logits.numpy(), 1e-5)
    if num_labels:
        class_logits, distillation_logits = keras_vit.distillation_heads(ours)(IMAGES)
        assert_close(class_logits, expected.cls_logits.numpy(), 1e-5)
        assert_close(distillation_logits, expected.distillation_logits.numpy(), 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = cls.from_pretrained(tmp_path / "ours").eval()
    assert back.config.model_type == "deit" and back.config.num_labels == num_labels
    assert_close(deit_outputs(back).logits.numpy(), expected.logits.numpy(), 1e-5)


@pytest.mark.parametrize("architecture", ["DeiTForImageClassification", "DeiTModel"])
def test_deit_classes_without_a_keras_vit_model_are_refused(tmp_path, architecture):
    """DeiTForImageClassification classifies from the class token alone, DeiTModel pools it
    alone: keras_vit's distilled models average the class and distillation tokens' outputs."""
    getattr(transformers, architecture)(deit_config(num_labels=5)).save_pretrained(tmp_path)
    with pytest.raises(LayoutError,
                       match=f"^transformers' {architecture} has no keras_vit equivalent yet: "
                             "it.* the class token alone") as error:
        keras_vit.from_pretrained(str(tmp_path))
    assert "\n" not in str(error.value)


def coverage_benchmark():
    import importlib.util
    path = os.path.join(REPO, "benchmarks", "timm_coverage.py")
    module_spec = importlib.util.spec_from_file_location("timm_coverage", path)
    coverage = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(coverage)
    return coverage


def test_the_architecture_table_is_the_installed_timms():
    """keras_vit/weights/torch_layouts/timm_architectures.json, which from_pretrained reads, is what
    benchmarks/timm_coverage.py --write_table makes of this timm."""
    from keras_vit.weights import torch_layouts
    assert coverage_benchmark().architecture_table(timm) == torch_layouts.timm_architectures()


def test_the_coverage_benchmark_checks_an_architecture_each_way(tmp_path, monkeypatch):
    from keras_vit.weights import torch_layouts
    check = coverage_benchmark().check
    for architecture in ("vit_xsmall_patch16_clip_224", "deit_tiny_distilled_patch16_224"):
        status, detail = check(architecture, 1, 1e-4, str(tmp_path))
        assert status == "covered", (architecture, detail)
    # An architecture whose table entry names an option keras_vit lacks (RelPosBias tables).
    table = torch_layouts.timm_architectures()
    architecture = "vit_relpos_small_patch16_rpn_224"
    monkeypatch.setitem(table, architecture, {
        **table[architecture], "args": {**table[architecture]["args"], "rel_pos_type": "bias"}})
    status, detail = check(architecture, 1, 1e-4, str(tmp_path))
    assert status == "missing" and "rel_pos_type='bias'" in detail


@pytest.mark.parametrize("crop_mode", ["center", "squash"])
def test_the_resize_and_crop_sizes_are_timms(crop_mode):
    """keras_vit's resize-and-crop arithmetic (what its graphs compute, see
    test_eval_preprocessing.py) gives the sizes and crop of timm's own eval transform, from
    `resolve_data_config` and `create_transform`, for images of many shapes."""
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from keras_vit.preprocessing import EvalPreprocessing, _crop_box
    rng = np.random.default_rng(0)
    shapes = [(480, 640), (640, 480), (333, 500), (250, 251), (224, 224)] + [
        tuple(int(side) for side in rng.integers(8, 1200, 2)) for _ in range(25)]
    for size in [(224, 224), (384, 384), (224, 320), (48, 32)]:
        for crop_pct in (0.875, 0.9, 0.95, 1.0):
            config = resolve_data_config(pretrained_cfg={
                "input_size": (3, *size), "interpolation": "bicubic", "crop_pct": crop_pct,
                "crop_mode": crop_mode})
            resize, crop = create_transform(**config).transforms[:2]
            ours = EvalPreprocessing("bicubic", crop_pct, crop_mode, antialias=True)
            for height, width in shapes:
                theirs_width, theirs_height = resize(Image.new("RGB", (width, height))).size
                # Pixels that say their row (column): the crop's first one is its top (left).
                offsets = [int(np.asarray(crop(Image.fromarray(index.astype(np.int32))))[0, 0])
                           for index in np.mgrid[:theirs_height, :theirs_width]]
                ours_resized, ours_offsets = _crop_box((height, width), size, ours)
                assert [int(side) for side in ours_resized] == [theirs_height, theirs_width], (
                    height, width, size, crop_pct)
                assert [int(offset) for offset in ours_offsets] == offsets, (height, width, size)


# DINOv2 (Oquab et al. 2023) and its registers form (Darcet et al. 2024): transformers'
# Dinov2Model and Dinov2WithRegistersModel load as models without a head whose output is the
# final LayerNorm's class token (their pooler_output).
DINO_IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 42, 42, 3)).astype("float32")


def dinov2_config(registers=0, cls=None, **fields):
    cls = cls or (transformers.Dinov2WithRegistersConfig if registers
                  else transformers.Dinov2Config)
    extra = {"num_register_tokens": registers} if registers else {}
    return cls(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=42,
               patch_size=14, **extra, **fields)  # gelu, layer_norm_eps 1e-6, qkv_bias


def dinov2_outputs(model):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(DINO_IMAGES.transpose(0, 3, 1, 2)))


@pytest.mark.parametrize("registers", [0, 2], ids=["dinov2", "with_registers"])
def test_transformers_dinov2_both_ways(tmp_path, registers):
    cls = transformers.Dinov2WithRegistersModel if registers else transformers.Dinov2Model
    theirs = order_one(cls(dinov2_config(registers)))  # LayerScale N(0, 0.3), not 1
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert (ours.spec.activation, ours.spec.layer_norm_epsilon) == ("gelu", 1e-6)
    assert ours.spec.num_register_tokens == registers and not ours.spec.include_top
    expected = dinov2_outputs(theirs)
    tokens = keras_vit.features(ours, layers=-1, norm=True)  # cls, registers, patches
    assert_close(ours(DINO_IMAGES), expected.pooler_output.numpy(), 1e-5)
    assert_close(tokens(DINO_IMAGES), expected.last_hidden_state.numpy(), 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is cls
    assert not back.embeddings.mask_token.any()
    outputs = dinov2_outputs(back)
    assert_close(outputs.pooler_output.numpy(), expected.pooler_output.numpy(), 1e-5)
    assert_close(outputs.last_hidden_state.numpy(), expected.last_hidden_state.numpy(), 1e-5)
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(processor).__name__.startswith("BitImageProcessor")


@pytest.mark.parametrize("registers", [0, 2], ids=["dinov2", "with_registers"])
def test_transformers_dinov2_classifiers_both_ways(tmp_path, registers):
    """Dinov2ForImageClassification and Dinov2WithRegistersForImageClassification: a head on
    the final LayerNorm's class token beside the patch tokens' mean, registers left out
    (classifier "token_gap")."""
    cls = (transformers.Dinov2WithRegistersForImageClassification if registers
           else transformers.Dinov2ForImageClassification)
    theirs = order_one(cls(dinov2_config(registers, num_labels=3)))
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert (ours.spec.classifier, ours.spec.include_top, ours.spec.num_classes) == (
        "token_gap", True, 3)
    assert ours.spec.num_register_tokens == registers
    expected = dinov2_outputs(theirs).logits.numpy()
    assert_close(ours(DINO_IMAGES), expected, 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is cls
    assert_close(dinov2_outputs(back).logits.numpy(), expected, 1e-5)
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(processor).__name__.startswith("BitImageProcessor")


def test_dinov2_giants_swiglu_mlp_both_ways(tmp_path):
    """DINOv2 giant's SwiGLU MLP (`use_swiglu_ffn`): `weights_in` holds the gate's rows, then
    the up projection's; two thirds of mlp_ratio x width, up to a multiple of 8."""
    theirs = order_one(transformers.Dinov2Model(dinov2_config(use_swiglu_ffn=True)))
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert (ours.spec.activation, ours.spec.mlp_dim) == ("swiglu", 88)  # 128 * 2 / 3 -> 88
    expected = dinov2_outputs(theirs)
    assert_close(ours(DINO_IMAGES), expected.pooler_output.numpy(), 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert back.config.use_swiglu_ffn
    assert_close(dinov2_outputs(back).last_hidden_state.numpy(),
                 expected.last_hidden_state.numpy(), 1e-5)


# The vision towers of CLIP (Radford et al. 2021), MetaCLIP 2 (Chuang et al. 2025) and SigLIP
# (Zhai et al. 2023): transformers' CLIPVisionModel, MetaClip2VisionModel and SiglipVisionModel,
# and the vision_model of CLIPModel, MetaClip2Model and SiglipModel, load as models without a
# head whose output is their pooler_output, and are written back as the vision models
# (MetaCLIP 2's as CLIP's, its layout under other class names).
TOWER_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, image_size=32, patch_size=8)
TEXT_SIZES = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2)
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], "float32")
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], "float32")
# Families of CLIP's layout -> the prefix of their transformers classes.
CLIP_FAMILIES = {"clip": "CLIP", "metaclip_2": "MetaClip2"}


def tower(family, full, **fields):
    """(transformers' model of random weights of order 1, its vision tower)."""
    sizes = {**TOWER_SIZES, **fields}
    if family in CLIP_FAMILIES:
        name = CLIP_FAMILIES[family]
        model = (getattr(transformers, name + "Model")(getattr(transformers, name + "Config")(
            vision_config=sizes, text_config=TEXT_SIZES, projection_dim=16)) if full
            else getattr(transformers, name + "VisionModel")(
                getattr(transformers, name + "VisionConfig")(**sizes)))
    else:
        model = (transformers.SiglipModel(transformers.SiglipConfig(
            vision_config=sizes, text_config=TEXT_SIZES)) if full
            else transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**sizes)))
    model = order_one(model)
    return model, getattr(model, "vision_model", model)  # transformers 5: no vision_model


def tower_outputs(vision, images):
    with torch.no_grad():
        return vision(pixel_values=torch.tensor(images.transpose(0, 3, 1, 2)))


@pytest.mark.parametrize("full", [False, True], ids=["vision_model", "full_model"])
@pytest.mark.parametrize("family", ["clip", "metaclip_2", "siglip"])
def test_clip_and_siglip_vision_towers_both_ways(tmp_path, family, full):
    theirs, vision = tower(family, full)
    theirs.save_pretrained(tmp_path / "theirs")
    clip = family in CLIP_FAMILIES
    processor = (transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                                 crop_size={"height": 32, "width": 32})
                 if clip else transformers.SiglipImageProcessor(size={"height": 32,
                                                                      "width": 32}))
    processor.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert (ours.spec.activation, ours.spec.layer_norm_epsilon) == (
        ("quick_gelu", 1e-5) if clip else ("gelu_tanh", 1e-6))
    assert not ours.spec.include_top
    assert ours.preprocessing.interpolation == "bicubic"
    assert ours.preprocessing.crop_mode == ("center" if clip else "squash")
    # keras_vit's inputs are pixels / 127.5 - 1; theirs, the processor's normalisation.
    pixels = (IMAGES + 1) / 2
    normalised = (pixels - CLIP_MEAN) / CLIP_STD if clip else IMAGES
    expected = tower_outputs(vision, normalised)
    last = keras_vit.features(ours, layers=-1, norm=not clip)  # CLIP's norm is the pooled one
    assert_close(ours(IMAGES), expected.pooler_output.numpy(), 1e-5)
    assert_close(last(IMAGES), expected.last_hidden_state.numpy(), 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is (transformers.CLIPVisionModel if clip
                          else transformers.SiglipVisionModel)
    outputs = tower_outputs(back, IMAGES)  # the normalisation is in the weights
    assert_close(outputs.pooler_output.numpy(), expected.pooler_output.numpy(), 1e-5)
    assert_close(outputs.last_hidden_state.numpy(), expected.last_hidden_state.numpy(), 1e-5)
    written = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(written).__name__.startswith("CLIPImageProcessor" if clip
                                             else "SiglipImageProcessor")


def test_a_siglip_without_its_pooling_head_is_refused(tmp_path):
    transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
        **TOWER_SIZES, vision_use_head=False)).save_pretrained(tmp_path)
    with pytest.raises(LayoutError, match="vision_use_head=False"):
        keras_vit.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("family", CLIP_FAMILIES)
def test_clip_vision_model_with_projection_both_ways(tmp_path, family):
    """CLIPVisionModelWithProjection (and MetaCLIP 2's): its visual_projection (a Linear without
    bias) is the head, of projection_dim classes with a zero bias; the output its image_embeds.
    Written back as CLIP's."""
    name = CLIP_FAMILIES[family]
    theirs = order_one(getattr(transformers, name + "VisionModelWithProjection")(
        getattr(transformers, name + "VisionConfig")(**TOWER_SIZES, projection_dim=16)))
    cls = transformers.CLIPVisionModelWithProjection
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert (ours.spec.include_top, ours.spec.num_classes) == (True, 16)
    assert not keras.ops.convert_to_numpy(ours.get_layer("head").bias).any()
    # The default preprocessing: CLIPVisionConfig alone, no processor (mean and std 0.5).
    expected = tower_outputs(theirs, IMAGES).image_embeds.numpy()
    assert_close(ours(IMAGES), expected, 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = cls.from_pretrained(tmp_path / "ours").eval()
    assert back.config.projection_dim == 16
    assert_close(tower_outputs(back, IMAGES).image_embeds.numpy(), expected, 1e-5)
    written = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(written).__name__.startswith("CLIPImageProcessor")


@pytest.mark.parametrize("family", CLIP_FAMILIES)
def test_a_whole_clip_model_with_include_top_keeps_its_projection(tmp_path, family):
    """`from_pretrained(CLIPModel's files, include_top=True)` (or MetaClip2Model's): the image
    encoder with its visual_projection as the head, the output its image features
    (image_embeds)."""
    theirs, _ = tower(family, full=True)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"), include_top=True)
    assert (ours.spec.include_top, ours.spec.num_classes) == (True, 16)
    with torch.no_grad():
        expected = theirs.get_image_features(
            pixel_values=torch.tensor(IMAGES.transpose(0, 3, 1, 2)))
    expected = getattr(expected, "pooler_output", expected).numpy()  # transformers 5: an output
    assert_close(ours(IMAGES), expected, 1e-5)
    tower_alone = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert not tower_alone.spec.include_top


def test_metaclip_2s_classifier_is_refused_naming_why(tmp_path):
    """MetaClip2ForImageClassification holds a whole tower, but its head reads the unnormed
    patch tokens' mean: refused, not loaded as the tower without its head."""
    transformers.MetaClip2ForImageClassification(transformers.MetaClip2Config(
        vision_config=TOWER_SIZES, text_config=TEXT_SIZES, num_labels=3)).save_pretrained(tmp_path)
    with pytest.raises(LayoutError, match="MetaClip2ForImageClassification has no keras_vit "
                                          "equivalent yet: its classifier reads the mean of the "
                                          "patch tokens before any norm"):
        keras_vit.from_pretrained(str(tmp_path))


def test_clip_options_it_lacks_are_refused_when_saving(tmp_path):
    theirs, _ = tower("clip", False)
    theirs.save_pretrained(tmp_path / "theirs")
    spec = keras_vit.from_pretrained(str(tmp_path / "theirs")).spec
    model = keras_vit.vit(spec.replace(include_top=True, num_classes=3, qkv_bias=False))
    with pytest.raises(LayoutError, match="CLIPVisionModel, which has no query, key and "
                                          "value without bias"):
        keras_vit.save_pretrained(model, tmp_path / "ours", format="transformers")
    model = keras_vit.vit(spec.replace(include_top=True, num_classes=3))
    model.get_layer("head").bias.assign(np.ones(3, "float32"))  # a projection has no bias
    with pytest.raises(LayoutError, match="CLIPVisionModelWithProjection, whose "
                                          "visual_projection has no bias.*not zero"):
        keras_vit.save_pretrained(model, tmp_path / "ours", format="transformers")
    assert not (tmp_path / "ours").exists()


# ViT-MSN (Assran et al. 2022) and ViT-MAE's encoder (He et al. 2022): ViT's layout without its
# pooler. Their models load without a head, the output the final LayerNorm's class token;
# ViTMSNForImageClassification with its head (written back as ViT's, the same computation).
MASKED_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, image_size=32, patch_size=8)
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], "float32")
IMAGENET_STD = np.array([0.229, 0.224, 0.225], "float32")


def masked_model(cls, **fields):
    config_class = transformers.ViTMAEConfig if "MAE" in cls else transformers.ViTMSNConfig
    extra = dict(mask_ratio=0.0) if "MAE" in cls else {}  # every patch (noise orders them)
    return order_one(getattr(transformers, cls)(config_class(**MASKED_SIZES, **extra, **fields)))


def masked_outputs(model, images):
    pixel_values = torch.tensor(images.transpose(0, 3, 1, 2))
    # MAE shuffles the patches by `noise`: its identity order keeps them in place.
    noise = {"noise": torch.arange(16.0).expand(len(images), -1)} if "MAE" in type(
        model).__name__ else {}
    with torch.no_grad():
        return model(pixel_values=pixel_values, **noise)


def imagenet_processor(directory):
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=IMAGENET_MEAN,
                                   image_std=IMAGENET_STD).save_pretrained(directory)
    return ((IMAGES + 1) / 2 - IMAGENET_MEAN) / IMAGENET_STD  # their inputs for IMAGES


@pytest.mark.parametrize("cls", ["ViTMSNModel", "ViTMAEModel", "ViTMAEForPreTraining"])
def test_vit_msn_and_vit_mae_encoders_load_as_normed_class_tokens(tmp_path, cls):
    theirs = masked_model(cls)
    theirs.save_pretrained(tmp_path)
    normalised = imagenet_processor(tmp_path)
    ours = keras_vit.from_pretrained(str(tmp_path))
    epsilon = 1e-12 if "MAE" in cls else 1e-6  # transformers' defaults, from the config
    assert (ours.spec.activation, ours.spec.layer_norm_epsilon) == ("gelu", epsilon)
    assert not ours.spec.include_top and ours.spec.representation_size is None
    assert (ours.spec.classifier, ours.spec.final_norm) == ("token", "tokens")
    expected = masked_outputs(getattr(theirs, "vit", theirs), normalised).last_hidden_state
    tokens = keras_vit.features(ours, layers=-1, norm=True)
    assert_close(ours(IMAGES), expected[:, 0].numpy(), 1e-5)
    assert_close(tokens(IMAGES), expected.numpy(), 1e-5)
    # Back as transformers' ViT encoder without a pooler, ViTMSNModel (MAE's encoder too, which
    # is the same computation once nothing is masked).
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is transformers.ViTMSNModel
    assert_close(masked_outputs(back, IMAGES).last_hidden_state.numpy(), expected.numpy(), 1e-5)


def test_vit_msn_classifier_loads_with_its_head_and_goes_back_as_vit(tmp_path):
    theirs = masked_model("ViTMSNForImageClassification", num_labels=3)
    theirs.save_pretrained(tmp_path / "theirs")
    normalised = imagenet_processor(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert ours.spec.include_top and ours.spec.num_classes == 3
    expected = masked_outputs(theirs, normalised).logits.numpy()
    assert_close(ours(IMAGES), expected, 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is transformers.ViTForImageClassification
    assert_close(masked_outputs(back, IMAGES).logits.numpy(), expected, 1e-5)


# I-JEPA (Assran et al. 2023): ViT's layout without a class token or pooler. IJepaModel's output
# is every token through the final LayerNorm (last_hidden_state): keras_vit's model of classifier
# "gap" without a class token, read by keras_vit.features(model, layers=-1, norm=True); its
# IJepaForImageClassification's head reads their mean, as that model's head does.
@pytest.mark.parametrize("head", [False, True], ids=["model", "classifier"])
def test_transformers_ijepa_both_ways(tmp_path, head):
    cls = transformers.IJepaForImageClassification if head else transformers.IJepaModel
    theirs = order_one(cls(transformers.IJepaConfig(**MASKED_SIZES, num_labels=3)))
    theirs.save_pretrained(tmp_path / "theirs")
    normalised = imagenet_processor(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert (ours.spec.activation, ours.spec.layer_norm_epsilon) == ("gelu", 1e-12)
    assert (ours.spec.classifier, ours.spec.class_token, ours.spec.final_norm) == (
        "gap", False, "tokens")
    assert (ours.spec.include_top, ours.spec.num_classes) == ((True, 3) if head else (False, 1))

    def outputs(model, images):  # (last_hidden_state, logits or the tokens' mean)
        with torch.no_grad():
            pixel_values = torch.tensor(images.transpose(0, 3, 1, 2))
            tokens = getattr(model, "ijepa", model)(pixel_values=pixel_values).last_hidden_state
            pooled = model(pixel_values=pixel_values).logits if head else tokens.mean(1)
        return tokens.numpy(), pooled.numpy()

    tokens, pooled = outputs(theirs, normalised)
    assert_close(keras_vit.features(ours, layers=-1, norm=True)(IMAGES), tokens, 1e-5)
    assert_close(ours(IMAGES), pooled, 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    auto = transformers.AutoModelForImageClassification if head else transformers.AutoModel
    back = auto.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is cls
    back_tokens, back_pooled = outputs(back, IMAGES)  # the normalisation is in the weights
    assert_close(back_tokens, tokens, 1e-5)
    assert_close(back_pooled, pooled, 1e-5)
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(processor).__name__.startswith("ViTImageProcessor")


# AIMv2 (Fini et al. 2024): RMSNorms (one on the patch tokens before the position embeddings),
# SiLU-gated MLPs, biases only with qkv_bias (the attention's four projections) and mlp_bias
# (the MLP's three), and its own attention pooling (the cls_token as the query itself, key and
# value projections, output_proj; no norm or MLP): keras_vit's patch_norm, proj_bias and
# classifier "map" with map_mlp_dim=0; without use_head, "gap" without a class token.
AIMV2_CASES = {"head": {}, "no_head": {"use_head": False},
               "qkv_bias": {"qkv_bias": True}, "mlp_bias": {"mlp_bias": True}, "full_model": {}}


@pytest.mark.parametrize("case", AIMV2_CASES)
def test_transformers_aimv2_both_ways(tmp_path, case):
    sizes = {**TOWER_SIZES, **AIMV2_CASES[case]}
    if case == "full_model":
        theirs = order_one(transformers.Aimv2Model(transformers.Aimv2Config(
            vision_config=sizes, text_config=TEXT_SIZES, projection_dim=16)))
    else:
        theirs = order_one(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(
            **sizes)))
    vision = getattr(theirs, "vision_model", theirs)
    theirs.save_pretrained(tmp_path / "theirs")
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={
        "height": 32, "width": 32}).save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    head = sizes.get("use_head", True)
    assert (ours.spec.norm_layer, ours.spec.activation, ours.spec.patch_norm) == (
        "rms_norm", "swiglu", True)
    assert (ours.spec.classifier, ours.spec.map_mlp_dim, ours.spec.class_token) == (
        ("map", 0, False) if head else ("gap", None, False))
    assert (ours.spec.qkv_bias, ours.spec.proj_bias) == (
        "qkv_bias" in sizes, "qkv_bias" in sizes or "mlp_bias" in sizes)
    normalised = ((IMAGES + 1) / 2 - CLIP_MEAN) / CLIP_STD
    expected = tower_outputs(vision, normalised)
    tokens = expected.last_hidden_state.numpy()
    pooled = expected.pooler_output.numpy() if head else tokens.mean(1)
    assert_close(keras_vit.features(ours, layers=-1, norm=True)(IMAGES), tokens, 1e-5)
    assert_close(ours(IMAGES), pooled, 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is transformers.Aimv2VisionModel
    outputs = tower_outputs(back, IMAGES)  # the normalisation is in the weights
    assert_close(outputs.last_hidden_state.numpy(), tokens, 1e-5)
    if head:
        assert_close(outputs.pooler_output.numpy(), pooled, 1e-5)
    else:
        assert outputs.pooler_output is None
    written = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(written).__name__.startswith("CLIPImageProcessor")


def test_a_whole_aimv2_model_with_include_top_keeps_its_projection(tmp_path):
    """Aimv2Model's image features: its visual_projection (no bias) of the tower's
    pooler_output, as the head."""
    theirs = order_one(transformers.Aimv2Model(transformers.Aimv2Config(
        vision_config=TOWER_SIZES, text_config=TEXT_SIZES, projection_dim=16)))
    theirs.save_pretrained(tmp_path)
    ours = keras_vit.from_pretrained(str(tmp_path), include_top=True)
    assert (ours.spec.include_top, ours.spec.num_classes) == (True, 16)
    assert not np.any(keras.ops.convert_to_numpy(ours.get_layer("head").bias))
    with torch.no_grad():
        features = theirs.get_image_features(
            pixel_values=torch.tensor(IMAGES.transpose(0, 3, 1, 2))).pooler_output
    assert_close(ours(IMAGES), features.numpy(), 1e-5)
    with pytest.raises(LayoutError, match="Aimv2VisionModel.*head: save a model with "
                                          "include_top=False"):
        keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_an_aimv2_pooling_of_any_weights_is_written_exactly(tmp_path, qkv_bias):
    """A keras_vit model of AIMv2's options, every weight random (the pooling's query
    projection and its biases too, which AIMv2's head lacks: folded into cls_token and
    output_proj), gives transformers' Aimv2VisionModel the same pooler_output."""
    ours = keras_vit.vit("Ti/16", hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                         image_size=32, patch_size=8, include_top=False, norm_layer="rms_norm",
                         activation="swiglu", patch_norm=True, qkv_bias=qkv_bias,
                         proj_bias=False, classifier="map", map_mlp_dim=0,
                         layer_norm_epsilon=1e-5)
    keras_order_one(ours)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert (back.config.qkv_bias, back.config.mlp_bias) == (qkv_bias, False)
    assert_close(ours(IMAGES), tower_outputs(back, IMAGES).pooler_output.numpy(), 1e-5)


def test_aimv2_options_it_lacks_are_refused(tmp_path):
    transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(
        **TOWER_SIZES, is_native=True)).save_pretrained(tmp_path / "native")
    with pytest.raises(LayoutError, match="is_native=True"):
        keras_vit.from_pretrained(str(tmp_path / "native"))
    transformers.Aimv2Model(transformers.Aimv2Config(
        vision_config={**TOWER_SIZES, "use_head": False},
        text_config=TEXT_SIZES)).save_pretrained(tmp_path / "full")
    with pytest.raises(LayoutError, match="use_head=False: its image features project"):
        keras_vit.from_pretrained(str(tmp_path / "full"), include_top=True)
    aimv2 = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=1, image_size=32,
                 patch_size=8, include_top=False, activation="swiglu", patch_norm=True,
                 classifier="map", map_mlp_dim=0)
    with pytest.raises(LayoutError, match="norm_layer='layer_norm'"):
        keras_vit.save_pretrained(keras_vit.vit("Ti/16", **aimv2), tmp_path / "a")
    # AIMv2's options elsewhere: no other class has them
    for fields, name in (({"proj_bias": False}, "proj_bias=False"),
                         ({"classifier": "map", "map_mlp_dim": 0}, "map_mlp_dim=0")):
        model = keras_vit.vit("Ti/16", hidden_size=32, mlp_dim=64, num_heads=4, num_layers=1,
                              image_size=32, patch_size=8, **fields)
        for layout in ("transformers", "timm"):
            with pytest.raises(LayoutError, match=name):
                keras_vit.save_pretrained(model, tmp_path / layout, format=layout)


# timm's Eva class (EVA-02, and its RoPE ViTs: naver's, the sbb GAP ones, DINOv3's...), built
# small (width 32, 2 heads of 16 channels, 2 blocks, 32px): RoPE in its interleaved and 'xy'
# layouts as keras_vit's (a permutation of each head's query and key channels), EvaAttention's
# absent key bias, LayerScale's gamma_1 / gamma_2, SwiGLU packed and not. Each cluster of
# pretrained tags it stands for is named.
EVA_SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0,
                 num_classes=5)
EVA_FAMILIES = {
    "lingbot": ("vit_base_patch16_lingbot", {"num_classes": 0},
                "DINOv3's RoPE, class token and 4 registers, no position embeddings, query and "
                "value biases, epsilon 1e-5, the class token's features"),
    "naver_rope": ("vit_base_patch16_rope_224", {},
                   "RoPE at indices, temperature 100, interleaved, columns first ('xy'), "
                   "AttentionRope's key bias"),
    "naver_rope_ape": ("vit_base_patch16_rope_ape_224", {},
                       "the same with position embeddings of the patches only"),
    "sbb_reg1_gap": ("vit_base_patch16_rope_reg1_gap_256", {},
                     "interleaved rows first, a reference grid (16x16 against 4x4), a "
                     "register without class token, GAP with fc_norm"),
    "sbb_reg4_gap": ("vit_betwixt_patch16_rope_reg4_gap_256", {}, "4 registers"),
    "sbb_no_bias": ("vit_mediumd_patch16_rope_reg1_gap_256", {}, "no query, key, value biases"),
    "glu_packed": ("vit_base_patch16_rope_reg1_gap_256", {"swiglu_mlp": True},
                   "SwiGLU packed in one fc1 (GluMlp: the gate's rows first)"),
    "swiglu_aligned": ("vit_base_patch16_lingbot", {"swiglu_mlp": True, "swiglu_align_to": 8,
                                                    "mlp_ratio": 2.6},
                       "SwiGLU unpacked (fc1_g, fc1_x), 83 units aligned to 88"),
    "dinov3_gap": ("vit_base_patch16_dinov3", {},
                   "a class token beside GAP of the patches (class_token), no biases"),
    "eva02_small": ("eva02_small_patch14_224", {"patch_size": 8},
                    "EVA-02 S: packed SwiGLU, a class token beside GAP, position embeddings of "
                    "every token, a reference grid"),
    "naver_rope_mixed": ("vit_base_patch16_rope_mixed_224", {},
                         "C8: RoPE-Mixed, learned frequencies of each block, head and pair of "
                         "channels ('xy': x the column's), no position embeddings"),
    "naver_rope_mixed_ape": ("vit_base_patch16_rope_mixed_ape_224", {},
                             "C9: the same with position embeddings of the patches only"),
    "rope_mixed_ij": ("vit_base_patch16_rope_mixed_224", {"rope_grid_indexing": "ij"},
                      "RoPE-Mixed on the 'ij' grid (x the row's frequencies)"),
    "eva02_base": ("eva02_base_patch14_224", {"patch_size": 8},
                   "C22, C23: EVA-02 B/L, split q, k, v projections (k without bias), SwiGLU "
                   "unpacked with mlp.norm (scale_mlp), fc_norm, a class token beside GAP, a "
                   "reference grid 16x16"),
    "eva02_clip": ("eva02_base_patch16_clip_224", {},
                   "C24, C26, C27: EVA-02 CLIP towers, attn.norm too (scale_attn_inner), the "
                   "class token's features, the final norm"),
    "pe_no_class": ("vit_pe_lang_gigantic_patch14_448", {},
                    "C19: Perception Encoder without class token, norm_pre and no patch bias, "
                    "LayerScale, GAP without norms, 'xy' RoPE at offset 0 on a reference grid"),
    "pe_lang_large": ("vit_pe_lang_large_patch14_448", {},
                      "C20: a class token beside GAP, rope_grid_offset 1, LayerScale"),
    "pe_spatial": ("vit_pe_spatial_base_patch16_512", {},
                   "C21: rope_grid_offset 1, without LayerScale"),
    "pe_core": ("vit_pe_core_base_patch16_224", {},
                "Perception Encoder core (4 tags): attention pooling (AttentionPoolLatent) of 8 "
                "heads and MLP ratio 4 (not the blocks' 2 and 2) over the class token and the "
                "patches, a head of num_classes (PE's projection) with a bias"),
    "pe_core_gigantic": ("vit_pe_core_gigantic_patch14_448", {},
                         "its gigantic: the same pooling without class token"),
    "sapiens2": ("vit_base_patch16_sapiens2", {"num_kv_heads": (2, 1)},
                 "Sapiens2 (5 tags): RmsNorm everywhere, qk_norm, grouped-query attention in "
                 "some blocks (AttentionRope: q_proj, k_proj, v_proj with biases), LayerScale on "
                 "the attention alone, DINOv3's RoPE, 8 registers, the class token"),
    "sapiens2_features": ("vit_base_patch16_sapiens2", {"num_kv_heads": 1, "num_classes": 0},
                          "its features: every block with one key and value head, no head"),
    "qk_norm_layer_norm": ("vit_base_patch16_rope_reg1_gap_256", {"qk_norm": True},
                           "qk_norm with LayerNorms (EvaAttention)"),
    "gqa_rope": ("vit_base_patch16_rope_224", {"num_kv_heads": 1, "qkv_fused": False},
                 "grouped-query attention with LayerNorms and RoPE at indices"),
}


def eva_pixels_and_logits(pixels):
    def logits(model):  # on the pixels as the model's pretrained_cfg normalises them
        mean, std = (np.asarray(model.pretrained_cfg[key]) for key in ("mean", "std"))
        with torch.no_grad():
            return model(torch.tensor(((pixels / 255 - mean) / std).transpose(0, 3, 1, 2),
                                      dtype=torch.float32)).numpy()
    return logits


@pytest.mark.parametrize("family", EVA_FAMILIES)
def test_timm_eva_both_ways(tmp_path, family):
    from timm.models.eva import Eva
    architecture, options, _ = EVA_FAMILIES[family]
    args = {**EVA_SMALL, **options}
    theirs = order_one(timm.create_model(architecture, pretrained=False, **args))
    assert isinstance(theirs, Eva)
    ours = through_timm_files(theirs, tmp_path / "theirs", args)
    normalized = ("patch16_lingbot", "dinov3", "sapiens2")
    assert ours.spec.rope == ("axial_normalized" if any(name in architecture for name in normalized)
                              else "mixed" if "mixed" in architecture else "axial")
    assert ours.spec.rope_grid_offset == (theirs.rope.grid_offset if ours.spec.rope == "axial"
                                          else 0.0)
    assert ours.spec.mlp_inner_norm == hasattr(theirs.blocks[0].mlp.norm, "weight")
    assert ours.spec.attention_inner_norm == hasattr(theirs.blocks[0].attn.norm, "weight")
    assert ours.spec.activation == ("gelu" if type(theirs.blocks[0].mlp).__name__ == "Mlp"
                                    else "swiglu")
    assert ours.spec.norm_layer == ("rms_norm" if type(theirs.blocks[0].norm1).__name__
                                    == "RmsNorm" else "layer_norm")
    assert ours.spec.qk_norm == hasattr(theirs.blocks[0].attn.q_norm, "weight")
    assert [ours.spec.kv_heads(i) for i in range(len(theirs.blocks))] == [
        getattr(block.attn, "num_kv_heads", block.attn.num_heads) for block in theirs.blocks]
    pool = theirs.attn_pool
    assert (ours.spec.classifier == "map") == (pool is not None)
    if pool is not None:  # Eva's AttentionPoolLatent: over every token, its own shape
        assert (ours.spec.map_num_heads, ours.spec.map_mlp_dim, ours.spec.map_include_prefix,
                ours.spec.class_token) == (pool.num_heads, pool.mlp.fc1.out_features, True,
                                           theirs.cls_token is not None)
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    logits = eva_pixels_and_logits(pixels)
    expected = logits(theirs)
    assert_close(ours(keras_vit.preprocess_inputs(pixels)), expected, 1e-5)
    back = back_in_timm(ours, tmp_path / "ours")
    # A non-zero key bias (AttentionRope's) goes back to AttentionRope; EvaAttention has none.
    assert type(back.blocks[0].attn).__name__ == type(theirs.blocks[0].attn).__name__
    assert_close(logits(back.eval()), expected, 1e-5)


@pytest.mark.parametrize("architecture, options, reason", [
    ("vit_pe_core_base_patch16_224", {"swiglu_mlp": True},
     r"global_pool='map' with swiglu_mlp=True \(Eva's attention pooling has an exact-GELU MLP"),
    ("vit_base_patch16_dinov3", {"rope_grid_offset": 1.0},
     "rope_grid_offset=1.0 with rope_type='dinov3'"),
])
def test_timm_eva_options_keras_vit_lacks_are_refused(tmp_path, architecture, options, reason):
    from timm.models import _hub
    args = {**EVA_SMALL, "depth": 1, **options}
    theirs = timm.create_model(architecture, pretrained=False, **args)
    _hub.save_for_hf(theirs, str(tmp_path), model_args=args, safe_serialization=True)
    with pytest.raises(LayoutError, match=f"^timm architecture '{architecture}' \\(timm's Eva\\) "
                                          f"needs .*{reason}") as error:
        keras_vit.from_pretrained(str(tmp_path))
    assert "\n" not in str(error.value)


# timm's post-norm blocks (x + LN(branch(x)): VisionTransformer's ResPostBlock, Eva's
# EvaBlockPostNorm) and DINOv2 giant's SwiGLUPacked MLP (GluMlp, the gate's rows first, SiLU):
# architecture -> (its options here, keras_vit's fields it loads as, timm's block class saved
# back, what it shows).
TIMM_BLOCKS = {
    "vit_base_patch16_rpn_224": (
        {}, dict(residual_post_norm=True, layer_scale_init=None, classifier="gap",
                 qkv_bias=False), "ResPostBlock",
        "ResPostBlock: no LayerScale (init_values starts its norms), GAP with fc_norm"),
    "eva02_enormous_patch14_clip_224": (
        EVA_SMALL, dict(residual_post_norm=True, rope=None, classifier="token"), "ResPostBlock",
        "EVA-02-E (2 tags): EvaBlockPostNorm, no RoPE, fused qkv with q_bias and v_bias; "
        "written back as VisionTransformer's ResPostBlock (the zero key bias as such)"),
    "vit_giant_patch14_dinov2": (
        {}, dict(activation="swiglu", mlp_dim=24, layer_scale_init=1e-5), "Block",
        "DINOv2 giant: fc1 of 48 rows (mlp_ratio 2), the gate's 24 first"),
    "vit_giant_patch14_reg1_tipsv2": (
        {}, dict(activation="swiglu", num_register_tokens=1, prefix_position_embeddings=False),
        "Block", "TIPSv2 giant: the same with a register and no prefix position rows"),
}


@pytest.mark.parametrize("architecture", TIMM_BLOCKS)
def test_timm_post_norm_and_swiglu_blocks_both_ways(tmp_path, architecture):
    from timm.models.vision_transformer import VisionTransformer
    options, fields, block, _ = TIMM_BLOCKS[architecture]
    args = {**dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3,
                   mlp_ratio=2.0, num_classes=5), **options}
    theirs = order_one(timm.create_model(architecture, pretrained=False, **args))
    back = _loaded_and_written_back(theirs, args, fields, tmp_path)
    assert isinstance(back, VisionTransformer) and type(back.blocks[0]).__name__ == block
    assert type(back.blocks[0].mlp).__name__ == type(theirs.blocks[0].mlp).__name__


def _loaded_and_written_back(theirs, args, fields, tmp_path):
    """timm's VisionTransformer `theirs` (built with `args`) loaded from its hub files as a
    keras_vit model with `fields`, and that model written back and loaded by timm: both give
    its logits (1e-5); returns timm's model of the written files."""
    ours = through_timm_files(theirs, tmp_path / "theirs", args)
    assert {name: getattr(ours.spec, name) for name in fields} == fields
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    logits = eva_pixels_and_logits(pixels)
    expected = logits(theirs)
    assert_close(ours(keras_vit.preprocess_inputs(pixels)), expected, 1e-5)
    back = back_in_timm(ours, tmp_path / "ours")
    assert_close(logits(back.eval()), expected, 1e-5)
    return back


# The 6 pretrained tags of timm's VisionTransformer with other attention or blocks (the sbb
# "wee" and "little" models): architecture -> (its options here, keras_vit's fields it loads
# as, timm's block and attention classes, what it shows). Each keeps its heads and mlp_ratio,
# 8 channels a head.
DIFF_AND_PARALLEL = {
    "vit_dwee_patch16_reg1_gap_256": (
        {}, dict(attention_layer="differential", parallel_blocks=False, mlp_dim=160),
        "Block", "DiffAttention", "2 tags: differential attention, 4 heads, a register, GAP"),
    "vit_dlittle_patch16_reg1_gap_256": (
        {}, dict(attention_layer="differential", mlp_dim=224), "Block", "DiffAttention",
        "1 tag: differential attention, 5 heads, mlp_ratio 5.6 (int(40 * 5.6) = 224 units)"),
    "vit_pwee_patch16_reg1_gap_256": (
        {}, dict(parallel_blocks=True, attention_layer="softmax", layer_scale_init=1e-5),
        "ParallelScalingBlock", None, "1 tag: in_proj of the MLP, q, k, v; two out projections"),
    "vit_pwee_no_qkv_bias": (
        {"qkv_bias": False}, dict(parallel_blocks=True, qkv_bias=False),
        "ParallelScalingBlock", None, "the MLP's bias apart (mlp_bias) beside a bias-free in_proj"),
    "vit_dpwee_patch16_reg1_gap_256": (
        {}, dict(parallel_blocks=True, attention_layer="differential"),
        "DiffParallelScalingBlock", None, "2 tags: differential, one out_proj over both branches"),
    "vit_dpwee_no_qkv_bias": (
        {"qkv_bias": False}, dict(parallel_blocks=True, attention_layer="differential",
                                  qkv_bias=False),
        "DiffParallelScalingBlock", None, "the same with mlp_bias"),
}


@pytest.mark.parametrize("case", DIFF_AND_PARALLEL)
def test_timm_differential_attention_and_parallel_blocks_both_ways(tmp_path, case):
    from timm.models.vision_transformer import VisionTransformer
    options, fields, block, attention, _ = DIFF_AND_PARALLEL[case]
    architecture = case.replace("_no_qkv_bias", "_patch16_reg1_gap_256")
    heads = 5 if "little" in architecture else 4
    args = {**dict(img_size=32, patch_size=8, embed_dim=8 * heads, depth=2, num_heads=heads,
                   num_classes=5), **options}
    theirs = order_one(timm.create_model(architecture, pretrained=False, **args))
    back = _loaded_and_written_back(theirs, args, fields, tmp_path)
    assert isinstance(back, VisionTransformer) and type(back.blocks[1]).__name__ == block
    if attention:
        assert type(back.blocks[1].attn).__name__ == attention


def test_differential_parallel_blocks_from_scratch_are_timms_and_refused_elsewhere(tmp_path):
    """Differential attention in parallel blocks, with a class token and no LayerScale (model
    args override DiffParallelScalingBlock's architecture, vit_dpwee's GAP, register and
    LayerScale), built here, are timm's VisionTransformer with its logits, and load back as
    the same spec; transformers' classes, timm's Eva (qk_norm) and another epsilon refuse."""
    fields = dict(hidden_size=32, mlp_dim=48, num_heads=2, num_layers=2, image_size=32,
                  patch_size=8, num_classes=5, activation="gelu",
                  attention_layer="differential", parallel_blocks=True)
    model = keras_vit.vit("Ti/16", **fields)
    with pytest.raises(LayoutError, match="no differential attention .*; no parallel blocks "
                                          r".*save this model with format='timm'"):
        keras_vit.save_pretrained(model, tmp_path / "hf", format="transformers")
    for other, named in ((dict(qk_norm=True), "Eva, which has no differential attention or "
                                              "parallel blocks"),
                         (dict(layer_norm_epsilon=1e-5), "DiffParallelScalingBlock> blocks "
                                                         r"\(parallel_blocks\) have LayerNorms "
                                                         "of epsilon 1e-06")):
        with pytest.raises(LayoutError, match=named):
            keras_vit.save_pretrained(keras_vit.vit("Ti/16", **{**fields, **other}),
                                      tmp_path / "refused", format="timm")
    keras_order_one(model)
    back = back_in_timm(model, tmp_path / "ours")
    assert type(back.blocks[0]).__name__ == "DiffParallelScalingBlock"
    assert back.cls_token is not None and back.reg_token is None
    _gives_timms_logits_and_reads_back(model, back, tmp_path / "ours")



def _gives_timms_logits_and_reads_back(model, back, written):
    """keras_vit's `model`, written for timm in `written` and loaded by timm as `back`: it gives
    timm's logits (1e-5), and the files load here as the same model (the name and resampling
    timm's)."""
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    expected = eva_pixels_and_logits(pixels)(back.eval())
    assert_close(model(keras_vit.preprocess_inputs(pixels)), expected, 1e-5)
    again = keras_vit.from_pretrained(str(written))
    assert again.spec == model.spec.replace(
        variant="B/16", position_embedding_interpolation="bicubic")
    assert_close(again(keras_vit.preprocess_inputs(pixels)), expected, 1e-5)

# DINOv3 (Siméoni et al. 2025): transformers' DINOv3ViTModel loads as a model without a head
# whose output is its pooler_output (the final LayerNorm's class token): RoPE at the patch
# centres in [-1, 1] ("axial_normalized"), no position embeddings, registers, LayerScale.
def dinov3_model(registers, gated, key_bias):
    config = transformers.DINOv3ViTConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        patch_size=8, image_size=32, num_register_tokens=registers, use_gated_mlp=gated,
        hidden_act="silu" if gated else "gelu", key_bias=key_bias)  # epsilon 1e-5, theta 100
    return order_one(transformers.DINOv3ViTModel(config))


def dinov3_outputs(model):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(IMAGES.transpose(0, 3, 1, 2)))


@pytest.mark.parametrize("registers, gated, key_bias", [(4, False, False), (2, True, True),
                                                        (0, False, True)],
                         ids=["registers", "gated_key_bias", "no_registers"])
def test_transformers_dinov3_both_ways(tmp_path, registers, gated, key_bias):
    from safetensors.numpy import load_file
    theirs = dinov3_model(registers, gated, key_bias)
    theirs.save_pretrained(tmp_path / "theirs")
    assert "layer.0.norm1.weight" in load_file(tmp_path / "theirs" / "model.safetensors")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert (ours.spec.rope, ours.spec.rope_temperature, ours.spec.layer_norm_epsilon) == (
        "axial_normalized", 100.0, 1e-5)
    assert ours.spec.activation == ("swiglu" if gated else "gelu")
    assert ours.spec.num_register_tokens == registers and not ours.spec.include_top
    expected = dinov3_outputs(theirs)
    tokens = keras_vit.features(ours, layers=-1, norm=True)  # cls, registers, patches
    assert_close(ours(IMAGES), expected.pooler_output.numpy(), 1e-5)
    assert_close(tokens(IMAGES), expected.last_hidden_state.numpy(), 1e-5)
    keras_vit.save_pretrained(ours, tmp_path / "ours", format="transformers")
    back = transformers.AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is transformers.DINOv3ViTModel
    assert back.config.key_bias == key_bias and not back.embeddings.mask_token.any()
    outputs = dinov3_outputs(back)
    assert_close(outputs.pooler_output.numpy(), expected.pooler_output.numpy(), 1e-5)
    assert_close(outputs.last_hidden_state.numpy(), expected.last_hidden_state.numpy(), 1e-5)
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert type(processor).__name__.startswith("DINOv3ViTImageProcessor")


def test_rope_models_transformers_lacks_are_refused_when_saving(tmp_path):
    """transformers' RoPE ViT is DINOv3's: normalized coordinates, no position embeddings."""
    model = keras_vit.vit("Ti/16", hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                          image_size=32, patch_size=8, include_top=False, rope="axial",
                          layer_scale_init=1.0, position_embedding="none")
    with pytest.raises(LayoutError, match="DINOv3ViTModel, which has no rope='axial'"):
        keras_vit.save_pretrained(model, tmp_path / "ours", format="transformers")
    assert not (tmp_path / "ours").exists()


def test_inner_norms_are_timms_eva_and_refused_for_transformers(tmp_path):
    """NormFormer's inner LayerNorms (mlp_inner_norm, attention_inner_norm) are timm's Eva's
    scale_mlp and scale_attn_inner, RoPE or not; transformers' classes have none."""
    from timm.models.eva import Eva
    model = keras_vit.vit("Ti/16", hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                          image_size=32, patch_size=8, num_classes=5, activation="gelu",
                          mlp_inner_norm=True, attention_inner_norm=True)
    with pytest.raises(LayoutError, match="Only timm's Eva has LayerNorms inside"):
        keras_vit.save_pretrained(model, tmp_path / "hf", format="transformers")
    assert not (tmp_path / "hf").exists()
    keras_order_one(model)
    back = back_in_timm(model, tmp_path / "ours")
    assert isinstance(back, Eva) and back.rope is None
    assert hasattr(back.blocks[0].mlp.norm, "weight") and hasattr(back.blocks[0].attn.norm,
                                                                  "weight")
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    assert_close(model(keras_vit.preprocess_inputs(pixels)),
                 eva_pixels_and_logits(pixels)(back.eval()), 1e-5)


def test_sapiens2s_options_from_scratch_are_timms_eva_and_refused_elsewhere(tmp_path):
    """RMSNorm, qk_norm and grouped-query attention per block, without qkv biases (no key bias
    to choose AttentionRope by: grouped attention alone does) and without RoPE, built here,
    are timm's Eva with its logits; transformers' classes and post-norm blocks refuse them."""
    from timm.models.eva import Eva
    fields = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, image_size=32,
                  patch_size=8, num_classes=5, activation="gelu", norm_layer="rms_norm",
                  qk_norm=True, num_kv_heads=(2, 1), qkv_bias=False, classifier="gap",
                  final_norm="pooled")
    model = keras_vit.vit("Ti/16", **fields)
    with pytest.raises(LayoutError, match="has no norm_layer='rms_norm', no qk_norm=True, no "
                                          "num_kv_heads: save this model with format='timm'"):
        keras_vit.save_pretrained(model, tmp_path / "hf", format="transformers")
    post_norm = keras_vit.vit("Ti/16", **{**fields, "residual_post_norm": True})
    with pytest.raises(LayoutError, match="post-norm blocks with qk_norm or num_kv_heads"):
        keras_vit.save_pretrained(post_norm, tmp_path / "post", format="timm")
    keras_order_one(model)
    back = back_in_timm(model, tmp_path / "ours")
    assert isinstance(back, Eva) and back.rope is None
    assert [block.attn.num_kv_heads for block in back.blocks] == [2, 1]
    assert type(back.blocks[0].norm1).__name__ == "RmsNorm"
    _gives_timms_logits_and_reads_back(model, back, tmp_path / "ours")


@pytest.mark.parametrize("fields", [dict(rope="axial"), dict(mlp_inner_norm=True)],
                         ids=["rope", "inner_norm"])
def test_post_norm_models_of_evas_options_are_its_post_norm_blocks(tmp_path, fields):
    """A post-norm model with RoPE or an inner norm is written as timm's Eva of
    EvaBlockPostNorm (use_post_norm), with its logits."""
    from timm.models.eva import Eva
    model = keras_vit.vit("Ti/16", hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2,
                          image_size=32, patch_size=8, num_classes=5, activation="gelu",
                          residual_post_norm=True, **fields)
    keras_order_one(model)
    back = back_in_timm(model, tmp_path / "ours")
    assert isinstance(back, Eva) and type(back.blocks[0]).__name__ == "EvaBlockPostNorm"
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    assert_close(model(keras_vit.preprocess_inputs(pixels)),
                 eva_pixels_and_logits(pixels)(back.eval()), 1e-5)


# timm's ViT-ResNet hybrids (vision_transformer_hybrid.py: HybridEmbed on a ResNetV2 of "same"
# padding): keras_vit's hybrids with resnet_numerics="timm" (weights standardised by
# sqrt(var + 1e-8), GroupNorm epsilon 1e-5, as its StdConv2dSame and GroupNormAct), one
# transformer block, at a small size. architecture -> (keras_vit's variant, image size,
# tolerance): R50+L/32's 16 units in float32 round to about 1.5e-5 of the largest logit with
# the numerics matched (the same model in float64 agrees to 1e-12), hence 5e-5 for it.
TIMM_HYBRIDS = {"vit_tiny_r_s16_p8_224": ("R+Ti/16", 96, 1e-5),
                "vit_small_r26_s32_224": ("R26+S/32", 96, 1e-5),
                "vit_base_r50_s16_224": ("R50+B/16", 64, 1e-5),
                "vit_large_r50_s32_224": ("R50+L/32", 64, 5e-5)}


@pytest.mark.parametrize("architecture", TIMM_HYBRIDS)
def test_timm_hybrids_both_ways(tmp_path, architecture):
    variant, size, tolerance = TIMM_HYBRIDS[architecture]
    args = dict(depth=1, img_size=size, num_classes=10)
    theirs = coverage_benchmark().order_one(torch, timm.create_model(architecture, **args))
    ours = through_timm_files(theirs, tmp_path / "theirs", args)
    assert (ours.spec.variant, ours.spec.resnet_numerics) == (variant, "timm")
    assert ours.spec.hidden_size == theirs.embed_dim
    assert ours.spec.patch_size == theirs.patch_embed.patch_size[0]
    assert (ours.spec.activation, ours.spec.layer_norm_epsilon) == ("gelu", 1e-6)
    images = np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype("float32")
    with torch.no_grad():
        expected = theirs(torch.tensor(images.transpose(0, 3, 1, 2))).numpy()
    assert_close(ours(images), expected, tolerance)
    back = back_in_timm(ours, tmp_path / "ours")
    assert type(back.patch_embed).__name__ == "HybridEmbed"
    with torch.no_grad():
        assert_close(back.eval()(torch.tensor(images.transpose(0, 3, 1, 2))).numpy(), expected,
                     tolerance)


def test_a_timm_hybrid_of_differential_attention_both_ways(tmp_path):
    """timm's hybrids are VisionTransformers: attn_layer='diff' in their model_args gives
    DiffAttention blocks, read and written back as attention_layer 'differential'."""
    args = dict(depth=1, img_size=64, num_classes=10, attn_layer="diff")
    theirs = coverage_benchmark().order_one(torch, timm.create_model("vit_tiny_r_s16_p8_224",
                                                                      **args))
    ours = through_timm_files(theirs, tmp_path / "theirs", args)
    assert (ours.spec.variant, ours.spec.attention_layer) == ("R+Ti/16", "differential")
    images = np.random.default_rng(0).uniform(-1, 1, (2, 64, 64, 3)).astype("float32")
    with torch.no_grad():
        expected = theirs(torch.tensor(images.transpose(0, 3, 1, 2))).numpy()
    assert_close(ours(images), expected, 1e-5)
    back = back_in_timm(ours, tmp_path / "ours")
    assert type(back.blocks[0].attn).__name__ == "DiffAttention"
    with torch.no_grad():
        assert_close(back.eval()(torch.tensor(images.transpose(0, 3, 1, 2))).numpy(), expected,
                     1e-5)


def test_a_hybrid_of_the_originals_numerics_is_refused_for_timm(tmp_path):
    model = keras_vit.vit("R26+S/32", num_layers=1, image_size=64)
    with pytest.raises(LayoutError, match="timm's ResNetV2 hard-codes its numerics"):
        keras_vit.save_pretrained(model, tmp_path / "ours", format="timm")
    assert not (tmp_path / "ours").exists()


@pytest.mark.parametrize("change, reason", [
    ({"model_args": {"padding_same": False}}, "padding_same=False"),
    ({"pretrained_cfg": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}},
     "not into a hybrid's ResNet"),
])
def test_timm_hybrids_keras_vit_lacks_are_refused(tmp_path, change, reason):
    """timm's padding_same=False ResNets are refused naming why, as is a normalisation other
    than [-1, 1] (which would have to fold into the ResNet). (MobileCLIP's stem loads:
    test_timm_mobileclip.py.)"""
    import json
    from timm.models import _hub
    args = dict(depth=1, img_size=64, num_classes=10)
    theirs = timm.create_model("vit_small_r26_s32_224", **args)
    _hub.save_for_hf(theirs, str(tmp_path), model_args=args, safe_serialization=True)
    config = json.loads((tmp_path / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LayoutError, match=reason) as error:
        keras_vit.from_pretrained(str(tmp_path))
    assert "\n" not in str(error.value)


# timm's VisionTransformerRelPos (vision_transformer_relpos.py): no position embeddings, a
# relative-position MLP in every block (RelPosMlp, "cr" mode: keras_vit's "relative_mlp"),
# LayerScale, no query, key and value biases. architecture -> what it adds.
RELPOS_SMALL = dict(img_size=48, patch_size=8, embed_dim=48, depth=2, num_heads=3,
                    mlp_ratio=2.0, num_classes=5)
TIMM_RELPOS = {
    "vit_relpos_small_patch16_224": "GAP normed after pooling (fc_norm)",
    "vit_relpos_medium_patch16_cls_224": "the class token (token pooling), 256 hidden units",
    "vit_relpos_base_patch16_clsgap_224": "a class token beside GAP of the patches, fc_norm",
    "vit_relpos_medium_patch16_rpn_224": "post-norm blocks (ResPostRelPosBlock), no LayerScale",
    "vit_srelpos_small_patch16_224": "one RelPosMlp that every block shares (shared_rel_pos)",
}


@pytest.mark.parametrize("architecture", TIMM_RELPOS)
def test_timm_relpos_both_ways(tmp_path, architecture):
    theirs = coverage_benchmark().order_one(torch, timm.create_model(architecture,
                                                                     **RELPOS_SMALL))
    ours = through_timm_files(theirs, tmp_path / "theirs", RELPOS_SMALL)
    spec = ours.spec
    post_norm = type(theirs.blocks[0]).__name__ == "ResPostRelPosBlock"
    assert (spec.position_embedding, spec.qkv_bias, spec.layer_scale_init,
            spec.residual_post_norm) == ("relative_mlp", False, None if post_norm else 1e-6,
                                         post_norm)
    shared = theirs.shared_rel_pos is not None
    assert spec.relative_mlp_shared == shared
    relative = theirs.shared_rel_pos if shared else theirs.blocks[0].attn.rel_pos
    assert spec.relative_mlp_dim == relative.mlp.fc1.out_features
    assert (spec.classifier, spec.class_token, spec.final_norm) == (
        "token" if theirs.global_pool == "token" else "gap", theirs.cls_token is not None,
        "pooled" if hasattr(theirs.fc_norm, "weight") else "tokens")
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 48, 48, 3)).astype("float32")
    logits = eva_pixels_and_logits(pixels)
    expected = logits(theirs)
    assert_close(ours(keras_vit.preprocess_inputs(pixels)), expected, 1e-5)
    back = back_in_timm(ours, tmp_path / "ours")
    assert type(back).__name__ == "VisionTransformerRelPos"
    assert type(back.blocks[0]) is type(theirs.blocks[0])
    assert (back.shared_rel_pos is None) == (not shared)
    assert_close(logits(back.eval()), expected, 1e-5)


@pytest.mark.parametrize("architecture, options, reason", [
    ("vit_relpos_small_patch16_224", {"rel_pos_type": "bias"}, "rel_pos_type='bias'"),
    ("vit_srelpos_small_patch16_224", {"rel_pos_type": "bias"}, "rel_pos_type='bias'"),
])
def test_timm_relpos_options_keras_vit_lacks_are_refused(tmp_path, architecture, options,
                                                         reason):
    from timm.models import _hub
    args = {**RELPOS_SMALL, **options}
    theirs = timm.create_model(architecture, **args)
    _hub.save_for_hf(theirs, str(tmp_path), model_args=args, safe_serialization=True)
    with pytest.raises(LayoutError, match=f"^timm architecture '{architecture}' \\(timm's "
                                          f"VisionTransformerRelPos\\) needs .*{reason}"):
        keras_vit.from_pretrained(str(tmp_path))


def test_a_shared_relative_mlp_is_timms_alone_when_saving(tmp_path):
    model = keras_vit.vit("Ti/16", hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2,
                          image_size=32, patch_size=8, position_embedding="relative_mlp",
                          relative_mlp_shared=True)
    with pytest.raises(LayoutError, match=r"transformers's ViT has no relative-position MLP "
                                          r"shared by every block \(relative_mlp_shared\).*"
                                          "format='timm'"):
        keras_vit.save_pretrained(model, tmp_path / "ours", format="transformers")
    assert not (tmp_path / "ours").exists()


def test_relative_mlp_models_timm_lacks_are_refused_when_saving(tmp_path):
    model = keras_vit.vit("Ti/16", hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1,
                          image_size=32, patch_size=8, position_embedding="relative_mlp",
                          final_norm="none")
    with pytest.raises(LayoutError, match="VisionTransformerRelPos, which has no model without "
                                          "a final norm"):
        keras_vit.save_pretrained(model, tmp_path / "ours", format="timm")
    assert not (tmp_path / "ours").exists()

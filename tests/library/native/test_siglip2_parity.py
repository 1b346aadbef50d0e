"""SigLIP 2's NaFlex against transformers 5 itself (PyTorch's CPU): a `Siglip2VisionModel` and
the vision tower of a `Siglip2Model` with random weights of order 1, saved by transformers,
load as a `NaFlexViT` with the same `pooler_output` and tokens on images of several aspect
ratios and budgets; written back, transformers loads the same outputs and the processor's
budget; `keras_vit.native.prepare` makes the arrays of transformers' `Siglip2ImageProcessor`
(the same sizes and masks; pixels within two grey levels, another resize). Skipped where
PyTorch or transformers is missing; CI runs it in its PyTorch environment (see .ci/run)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import keras  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import native  # noqa: E402
from keras_vit.weights.torch_layouts import LayoutError  # noqa: E402
from model_fixtures import order_one  # noqa: E402
from transformers.models.siglip2 import image_processing_siglip2  # noqa: E402

PATCH = 8
SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_patches=16, patch_size=PATCH)
RNG = np.random.default_rng(0)
IMAGES = [RNG.integers(0, 256, shape, dtype=np.uint8)
          for shape in ((32, 32, 3), (20, 90, 3), (90, 21, 3), (64, 40, 3))]
BUDGETS = (16, 24, 7)  # the learned grid's, more (enlarged), fewer (shrunk, antialiased)


def their_outputs(model, arrays):
    with torch.no_grad():
        out = model(pixel_values=torch.tensor(arrays["pixel_values"]),
                    pixel_attention_mask=torch.tensor(arrays["pixel_attention_mask"]),
                    spatial_shapes=torch.tensor(arrays["spatial_shapes"]).long())
    return out.pooler_output.numpy(), out.last_hidden_state.numpy()


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def assert_close(got, expected, what):
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), what


@pytest.fixture(scope="module")
def theirs():
    return order_one(transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(**SIZES)))


def test_budget_sizes_equal_transformers_for_every_image_and_budget():
    for height, width in RNG.integers(1, 3000, (400, 2)):
        for patch, budget in ((16, 256), (16, 1024), (14, 729), (8, 3)):
            assert native.image_size_for_budget(int(height), int(width), patch, budget) == \
                image_processing_siglip2.get_image_size_for_max_num_patches(
                    int(height), int(width), patch, budget)


@pytest.mark.parametrize("budget", BUDGETS)
def test_the_processors_agree(budget):
    ours = native.prepare(IMAGES, PATCH, budget)
    processor = transformers.Siglip2ImageProcessor(patch_size=PATCH, max_num_patches=budget)
    reference = processor(images=IMAGES, return_tensors="np")
    assert (ours["spatial_shapes"] == reference["spatial_shapes"]).all()
    assert (ours["pixel_attention_mask"] == reference["pixel_attention_mask"]).all()
    assert np.abs(ours["pixel_values"] - reference["pixel_values"]).max() < 2.5 * 2 / 255


def test_a_siglip2_vision_model_loads_and_writes_back_with_its_outputs(theirs, tmp_path):
    theirs.save_pretrained(tmp_path / "theirs")
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    assert isinstance(ours, native.NaFlexViT)
    for budget in BUDGETS:
        arrays = native.prepare(IMAGES, PATCH, budget)
        pooled, tokens = their_outputs(theirs, arrays)
        assert_close(numpy(ours(arrays)), pooled, f"pooler_output, budget {budget}")
        valid = arrays["pixel_attention_mask"] == 1
        assert_close(numpy(ours.tokens(arrays)[0])[valid], tokens[valid], f"tokens, {budget}")
    keras_vit.save_pretrained(ours, tmp_path / "ours")
    back = transformers.Siglip2VisionModel.from_pretrained(tmp_path / "ours").eval()
    arrays = native.prepare(IMAGES, PATCH, 24)
    assert_close(their_outputs(back, arrays)[0], their_outputs(theirs, arrays)[0], "written back")
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "ours")
    assert (processor.patch_size, processor.max_num_patches) == (PATCH, 16)


def test_the_vision_tower_of_a_whole_siglip2_model_loads(tmp_path):
    whole = transformers.Siglip2Model(transformers.Siglip2Config(
        vision_config=SIZES, text_config=dict(hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=1, num_attention_heads=4,
                                              vocab_size=99)))
    order_one(whole).save_pretrained(tmp_path / "whole")
    ours = keras_vit.from_pretrained(str(tmp_path / "whole"))
    arrays = native.prepare(IMAGES, PATCH, 24)
    assert_close(numpy(ours(arrays)), their_outputs(whole.vision_model, arrays)[0], "tower")


def test_a_model_siglip2_cannot_express_is_refused_before_writing(tmp_path):
    model = keras_vit.vit("Ti/16", image_size=32, patch_size=PATCH, num_classes=5)
    with pytest.raises(LayoutError, match="cannot be written as transformers' Siglip2"):
        keras_vit.save_pretrained(native.NaFlexViT(model), tmp_path / "a")
    # SigLIP's options but LayerNorms of another epsilon: format="timm" (timm's NaFlexVit, whose
    # norms are 1e-6) refuses it (tests/library/native/test_timm_naflex_parity.py writes others)
    siglip = keras_vit.vit("Ti/16", image_size=32, patch_size=PATCH, include_top=False,
                           classifier="map", class_token=False, final_norm="tokens",
                           layer_norm_epsilon=1e-5)
    with pytest.raises(LayoutError, match="cannot be written as timm's NaFlexVit, which has no "
                                          "LayerNorms of epsilon 1e-05"):
        keras_vit.save_pretrained(native.NaFlexViT(siglip), tmp_path / "b", format="timm")
    assert not list(tmp_path.iterdir())

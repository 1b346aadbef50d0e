"""MobileCLIP's ViT-B/16 image encoder (Vasu et al., "MobileCLIP", 2024; timm 1.0.31's
`vit_base_mci_224`: a `ConvStem` of convolutions with BatchNorm and GELU in place of the patch
embedding's one convolution) against timm itself: timm's model with random weights of order 1
(BatchNorm's running statistics too) loads with its logits and is written back with them, and
keras_vit's `ConvStem` computes timm's in training (the batch's statistics) as at inference.
Skipped where torch and timm are not installed; CI runs it in its own environment (.ci/run)."""

import os

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

import keras_vit  # noqa: E402
from keras_vit.weights.torch_layouts import LayoutError  # noqa: E402
from test_library_parity import coverage_benchmark  # noqa: E402

PIXELS = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")


def order_one(model):
    """timm's model with the coverage benchmark's random weights of order 1 (its BatchNorms'
    running statistics too)."""
    return coverage_benchmark().order_one(torch, model)


def timm_logits(model):
    """On PIXELS as the model's pretrained_cfg normalises them (MobileCLIP's: pixels / 255)."""
    mean, std = (np.asarray(model.pretrained_cfg[key]) for key in ("mean", "std"))
    with torch.no_grad():
        return model(torch.tensor(((PIXELS / 255 - mean) / std).transpose(0, 3, 1, 2),
                                  dtype=torch.float32)).numpy()


def assert_close(actual, expected, tolerance=1e-5):
    actual = np.asarray(keras.ops.convert_to_numpy(actual), np.float64)
    assert actual.shape == expected.shape
    assert np.abs(expected).max() > 0.5
    assert np.abs(actual - expected).max() <= tolerance * np.abs(expected).max()


def test_timms_mobileclip_encoder_both_ways(tmp_path):
    from timm.models import _hub
    args = dict(depth=1, img_size=32, num_classes=5)  # its stem is built for width 768
    theirs = order_one(timm.create_model("vit_base_mci_224", pretrained=False, **args))
    assert theirs.pretrained_cfg["mean"] == (0.0, 0.0, 0.0)  # folded into the stem here
    _hub.save_for_hf(theirs, str(tmp_path / "theirs"), model_args=args,
                     safe_serialization=True)
    ours = keras_vit.from_pretrained(str(tmp_path / "theirs"))
    spec = ours.spec
    assert (spec.conv_stem, spec.patch_size, spec.hidden_size) == (True, 16, 768)
    assert not spec.prefix_position_embeddings  # its no_embed_class
    expected = timm_logits(theirs)
    assert_close(ours(keras_vit.preprocess_inputs(PIXELS)), expected)

    keras_vit.save_pretrained(ours, tmp_path / "ours", format="timm")
    back = timm.create_model("local-dir:" + os.fspath(tmp_path / "ours"), pretrained=True)
    assert type(back.patch_embed.backbone).__name__ == "ConvStem"
    assert_close(timm_logits(back.eval()), expected)


def test_the_stem_is_timms_in_training_and_inference():
    """keras_vit's ConvStem and patch embedding against timm's ConvStem (its train mode:
    each BatchNorm normalises by the batch's statistics; then the moving means, which Keras'
    momentum 0.9 moves as PyTorch's 0.1 does)."""
    from timm.models.vision_transformer_hybrid import ConvStem
    theirs = order_one(ConvStem(channels=(8, 8, 32), stride=(4, 2, 2), kernel_size=(4, 2, 2),
                                padding=0, act_layer=torch.nn.GELU))
    model = keras_vit.vit("Ti/16", hidden_size=32, num_heads=2, mlp_dim=32, num_layers=1,
                          image_size=32, conv_stem=True)
    stem, embedding = model.get_layer("conv_stem"), model.get_layer("embedding")
    state = {key: value.numpy() for key, value in theirs.state_dict().items()}
    for index in range(2):
        conv, norm = stem.convs[index], stem.norms[index]
        conv.kernel.assign(state[f"{index}.conv.weight"].transpose(2, 3, 1, 0))
        for ours, name in (("gamma", "weight"), ("beta", "bias"), ("moving_mean", "running_mean"),
                           ("moving_variance", "running_var")):
            getattr(norm, ours).assign(state[f"{index}.bn.{name}"])
    embedding.kernel.assign(state["2.conv.weight"].transpose(2, 3, 1, 0))
    embedding.bias.assign(state["2.conv.bias"])

    images = np.random.default_rng(3).normal(0, 1, (4, 32, 32, 3)).astype("float32")
    inputs = torch.tensor(images.transpose(0, 3, 1, 2))

    def ours(training):
        return np.asarray(keras.ops.convert_to_numpy(
            embedding(stem(images, training=training))), np.float64).reshape(4, 2, 2, 32)

    with torch.no_grad():
        assert_close(ours(False), theirs(inputs).numpy().transpose(0, 2, 3, 1))
        trained = theirs.train()(inputs).numpy().transpose(0, 2, 3, 1)
    assert_close(ours(True), trained)
    for index in range(2):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(stem.norms[index].moving_mean),
                                   theirs.state_dict()[f"{index}.bn.running_mean"].numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_a_conv_stem_is_written_only_as_timms_mobileclip(tmp_path):
    tiny = keras_vit.vit("Ti/16", hidden_size=32, num_heads=2, mlp_dim=32, num_layers=1,
                         image_size=32, conv_stem=True)
    with pytest.raises(LayoutError, match="vit_base_mci_224 builds its ConvStem for width 768 "
                       "and 16-pixel patches .* hidden_size 32, patch_size 16"):
        keras_vit.save_pretrained(tiny, tmp_path / "timm", format="timm")
    with pytest.raises(LayoutError, match=r"has no convolutional stem \(conv_stem, "
                       r"MobileCLIP's\): save this model with format='timm'"):
        keras_vit.save_pretrained(tiny, tmp_path / "transformers", format="transformers")


@pytest.mark.parametrize("change, reason", [
    ({"act": "ReLU", "act_approximate": None}, r"activation ReLU \(keras_vit's conv_stem: "
                                               r"exact GELU\)"),
    ({"kernel_size": [3, 3, 3], "padding": [1, 1, 1]}, r"kernels \[3, 3, 3\], strides "
                                                       r"\[4, 2, 2\] and paddings \[1, 1, 1\]"),
    ({"channels": [64, 128, 768]}, r"channels \[64, 128, 768\]"),
    ({"norm_eps": 1e-3}, "norm BatchNormAct2d of epsilon 0.001"),
], ids=["relu", "overlapping", "tiered_channels", "epsilon"])
def test_other_conv_stems_are_refused_naming_how_they_differ(change, reason):
    """timm's ConvStem takes other kernels, channels, norms and activations than MobileCLIP's;
    a table entry of another is refused, naming what differs."""
    from keras_vit.weights.torch_layouts import timm_common, timm_hybrid
    args = {**timm_common.VIT_DEFAULTS,
            **timm_common.timm_architectures()["vit_base_mci_224"]["args"]}
    assert timm_hybrid._conv_stem("vit_base_mci_224", dict(args))
    backbone = args["embed_layer"]["hybrid_embed"]["backbone"]
    args["embed_layer"] = {"hybrid_embed": {"backbone": {**backbone, **change}, "proj": False}}
    with pytest.raises(LayoutError, match="'vit_base_mci_224' has a ConvStem of " + reason):
        timm_hybrid._conv_stem("vit_base_mci_224", args)

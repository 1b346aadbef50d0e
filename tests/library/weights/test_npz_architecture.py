"""`keras_vit.from_pretrained` on an original `.npz` with no spec beside it: the architecture
read from the tensors (`keras_vit.weights.npz_architecture`), the same model and logits as the one
that wrote the file, and the errors for files it cannot read.

Each file is written by `checkpoint.save_npz` in the original layout, then its spec sidecar is
deleted, so that only the tensors say what the model is, as for the paper's own files.
"""

import logging
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.weights import checkpoint, hub
from keras_vit.weights.checkpoint import CheckpointError
from model_fixtures import TINY_VIT, randomise

pytestmark = pytest.mark.usefixtures("fresh_session")

LOGGER = "keras_vit.weights.npz_architecture"

# The models. Where the paper's depth would make a test slow, fewer blocks keep its
# point (the grid, patch, width, heads and MLP are read from any number of blocks); the
# variant's name is still recovered, as the other sizes match it.
MODELS = {
    "Ti/16": dict(variant="Ti/16", image_size=64, num_classes=7),
    # B/32 at 384: a 12x12 grid of 32-pixel patches; 2 blocks instead of 12.
    "B/32@384": dict(variant="B/32", image_size=384, num_layers=2, num_classes=10),
    # R50+B/16: the full ResNet (3, 4, 9) and 1x1 patches of its stride-16 map; 1 block.
    "R50+B/16": dict(variant="R50+B/16", image_size=64, num_layers=1, num_classes=5),
    "R+Ti/16": dict(variant="R+Ti/16", image_size=64, num_layers=1, num_classes=5),
    "gap": dict(variant="S/16", classifier="gap", image_size=64, num_layers=2, num_classes=3),
    # The imagenet21k files' pre-logits (768) and head (21,843 classes); 1 block.
    "pre_logits": dict(variant="B/16", representation_size=768, image_size=32, num_layers=1,
                       num_classes=21843),
    "no_head": dict(variant="Ti/16", representation_size=32, include_top=False, image_size=32,
                    num_layers=1),
}


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def images(size, count=2):
    return np.random.default_rng(0).uniform(-1, 1, (count, size, size, 3)).astype("float32")


def spec_less_npz(model, path):
    """`model` written in the original layout at `path`, with no spec beside it."""
    checkpoint.save_npz(model, path)
    os.remove(checkpoint.spec_file(path))
    return str(path)


def written(fields, path):
    """A model of `fields` (a variant and ViTConfig fields), its weights random, and the
    spec-less `.npz` it wrote."""
    fields = dict(fields)
    model = keras_vit.vit(fields.pop("variant"), **fields)
    randomise(model)
    return model, spec_less_npz(model, path)


@pytest.mark.parametrize("case", MODELS)
def test_an_original_npz_loads_as_the_model_that_wrote_it(tmp_path, case):
    model, path = written(MODELS[case], tmp_path / "model.npz")
    loaded = keras_vit.from_pretrained(path)
    assert loaded.spec.to_dict() == model.spec.to_dict()  # the variant's name included
    size = model.spec.image_size[0]
    np.testing.assert_allclose(to_np(loaded(images(size))), to_np(model(images(size))),
                               rtol=1e-6, atol=1e-6)


def test_read_checkpoint_gives_the_inferred_spec_and_the_original_numerics(tmp_path):
    model, path = written(MODELS["Ti/16"], tmp_path / "ViT-Ti_16.npz")
    found = hub.read_checkpoint(path)
    assert found.spec == model.spec
    assert (found.spec.activation, found.spec.layer_norm_epsilon) == ("gelu_tanh", 1e-6)
    assert found.preprocessing == keras_vit.EvalPreprocessing()  # the original's resize


def test_other_sizes_than_the_table_are_kept_with_the_nearest_name(tmp_path):
    fields = dict(TINY_VIT, image_size=48, patch_size=8, num_classes=4)
    model = keras_vit.vit("Ti/16", **fields)
    randomise(model)
    spec = hub.read_checkpoint(spec_less_npz(model, tmp_path / "tiny.npz")).spec
    assert {name: getattr(spec, name) for name in fields} == {
        **fields, "image_size": (48, 48)}
    assert spec.variant == "Ti/16"  # 3 heads: Ti's; every other size is set explicitly


def test_a_file_in_the_current_vit_jax_naming_loads_the_same(tmp_path):
    model, path = written(MODELS["Ti/16"], tmp_path / "released.npz")
    current = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
               "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
    arrays = {}
    for key, value in checkpoint.read_npz(path).items():
        parts = key.split("/")
        if parts[0] == "Transformer" and parts[1].startswith("encoderblock_"):
            parts[2] = current.get(parts[2], parts[2])
        arrays["/".join(parts)] = value
    assert any("MlpBlock_0" in key for key in arrays)
    np.savez(tmp_path / "linen.npz", **arrays)
    loaded = keras_vit.from_pretrained(str(tmp_path / "linen.npz"))
    assert loaded.spec == model.spec
    np.testing.assert_allclose(to_np(loaded(images(64))), to_np(model(images(64))),
                               rtol=1e-6, atol=1e-6)


def test_the_architecture_is_logged_in_one_info_line(tmp_path, caplog):
    _, plain = written(MODELS["pre_logits"], tmp_path / "ViT-B_16.npz")
    _, fewer = written(MODELS["B/32@384"], tmp_path / "ViT-B_32.npz")
    _, gap = written(MODELS["gap"], tmp_path / "gap.npz")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for path in (plain, fewer, gap):
            hub.read_checkpoint(path)
    assert [record.getMessage() for record in caplog.records if record.name == LOGGER] == [
        "Inferred ViT-B/16 (num_layers 1) from ViT-B_16.npz: 32 px images (2x2 patches), "
        "token classifier, pre-logits 768, 21843 classes",
        "Inferred ViT-B/32 (num_layers 2) from ViT-B_32.npz: 384 px images (12x12 patches), "
        "token classifier, no pre-logits, 10 classes",
        "Inferred ViT-S/16 (num_layers 2) from gap.npz: 64 px images (4x4 patches), gap "
        "classifier, no pre-logits, 3 classes",
    ]


def test_a_spec_beside_the_file_is_used_and_nothing_is_inferred(tmp_path, caplog):
    # The exact GELU is what no tensor says: only the spec can give it back.
    model = keras_vit.vit("Ti/16", **TINY_VIT, image_size=32, patch_size=8, activation="gelu")
    checkpoint.save_npz(model, tmp_path / "model.npz")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        found = hub.read_checkpoint(str(tmp_path / "model.npz"))
    assert found.spec == model.spec and found.spec.activation == "gelu"
    assert not [record for record in caplog.records if record.name == LOGGER]


def arrays_of(tmp_path, **fields):
    model = keras_vit.vit("Ti/16", **{**TINY_VIT, "image_size": 32, "patch_size": 8,
                                      "num_classes": 5, **fields})
    return checkpoint.read_npz(spec_less_npz(model, tmp_path / "written.npz"))


def assert_refused(tmp_path, arrays, match):
    """`arrays` saved without a spec are refused with an error naming the file, `match` and
    the fix."""
    path = str(tmp_path / "odd.npz")
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match=match) as error:
        keras_vit.from_pretrained(path)
    assert path in str(error.value)
    assert "save_npz" in str(error.value) and "load_npz" in str(error.value)


def test_a_file_without_a_patch_embedding_is_refused_with_the_fix(tmp_path):
    arrays = arrays_of(tmp_path)
    del arrays["embedding/kernel"]
    assert_refused(tmp_path, arrays, "no embedding/kernel")


def test_a_file_without_blocks_is_refused_with_the_fix(tmp_path):
    arrays = {key: value for key, value in arrays_of(tmp_path).items()
              if "encoderblock_" not in key}
    assert_refused(tmp_path, arrays, "no Transformer/encoderblock_")


def test_a_non_square_grid_is_refused_with_the_fix(tmp_path):
    arrays = arrays_of(tmp_path)  # 1 + 4x4 rows; 1 + 12 is no square grid
    key = "Transformer/posembed_input/pos_embedding"
    arrays[key] = arrays[key][:, :13]
    assert_refused(tmp_path, arrays, "12 patch positions after the class token's row, not a "
                   "square grid")


def test_a_missing_block_is_refused_with_the_fix(tmp_path):
    arrays = {key: value for key, value in arrays_of(tmp_path, num_layers=3).items()
              if "encoderblock_1/" not in key}
    assert_refused(tmp_path, arrays, "missing Transformer/encoderblock_1/")


def test_tensors_of_another_model_are_refused_with_the_fix(tmp_path):
    # Register tokens: no tensor of the original ViT says where they go.
    assert_refused(tmp_path, arrays_of(tmp_path, num_register_tokens=2),
                   "tensors the original ViT does not have: reg/registers")
    # A block whose MLP is wider than the first's.
    arrays = arrays_of(tmp_path, num_layers=2)
    block = "Transformer/encoderblock_1/MlpBlock_3/"
    arrays[block + "Dense_0/kernel"] = np.zeros((24, 96), "float32")
    assert_refused(tmp_path, arrays, "shapes that do not fit the others: " + block)
    # A ResNet of one unit in one stage: no hybrid keras_vit builds.
    arrays = arrays_of(tmp_path)
    arrays.update({"conv_root/kernel": np.zeros((7, 7, 3, 64), "float32"),
                   "block1/unit1/conv1/kernel": np.zeros((1, 1, 64, 64), "float32")})
    assert_refused(tmp_path, arrays, r"its ResNet has \(1,\) units per stage")


def test_published_names_still_load_the_table_architecture(tmp_path):
    # `weights=` builds the named variant and loads the file into it, as before.
    model, path = written(MODELS["Ti/16"], tmp_path / "model.npz")
    named = keras_vit.vit("Ti/16", weights=path, image_size=64, num_classes=7)
    np.testing.assert_array_equal(to_np(named(images(64))), to_np(model(images(64))))

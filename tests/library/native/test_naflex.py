"""NaFlex (keras_vit.native): images at their own aspect ratios within a budget of patches.

Checked against the classic model itself: an image at the model's own grid gives the classic
model's output; a batch of mixed sizes gives each image what it gets alone (attention and
pooling see no padding); what is in the padding changes nothing. The budget sizes against
transformers' function and SigLIP 2's weights both ways are test_siglip2_parity.py's."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import native
from keras_vit.native import model as naflex_model
from model_fixtures import OPTION_FAMILIES, TINY_VIT, randomise

pytestmark = pytest.mark.usefixtures("fresh_session")

SIZE, PATCH = 32, 8  # a 4x4 grid of 8-pixel patches
RNG = np.random.default_rng(0)
# Square at the model's grid, wide, tall, small: 16 patches of budget each.
IMAGES = [RNG.integers(0, 256, shape, dtype=np.uint8)
          for shape in ((32, 32, 3), (20, 90, 3), (90, 21, 3), (9, 12, 3))]


def classic(fields):
    model = keras_vit.vit("Ti/16", image_size=SIZE, patch_size=PATCH, num_classes=5,
                          **{**TINY_VIT, **fields})
    randomise(model)
    return model


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def assert_close(got, expected, what, tolerance=1e-5):
    scale = max(np.abs(expected).max(), 1e-6)
    assert np.abs(got - expected).max() <= tolerance * scale, what


def _runs_natively(fields):
    return naflex_model.unsupported(keras_vit.ViTConfig(
        variant="Ti/16", image_size=SIZE, patch_size=PATCH, **TINY_VIT,
        **{key: value for key, value in fields.items()
           if key not in ("remat", "attention_impl")})) is None


NATIVE = [name for name, fields in OPTION_FAMILIES.items() if _runs_natively(fields)]
REFUSED = [name for name in OPTION_FAMILIES if name not in NATIVE]


@pytest.mark.parametrize("family", NATIVE + ["sincos_2d", "gap_token", "map_registers_fused"])
def test_each_image_gets_what_it_gets_alone_and_the_classic_model_at_its_grid(family):
    fields = {"sincos_2d": {"position_embedding": "sincos_2d"},
              "gap_token": {"classifier": "gap", "class_token": True},
              "map_registers_fused": {"classifier": "map", "num_register_tokens": 2,
                                      "attention_impl": "fused"}}.get(family)
    model = classic(OPTION_FAMILIES[family] if fields is None else fields)
    naflex = native.NaFlexViT(model)
    arrays = native.prepare(IMAGES, PATCH, 16)
    together = numpy(naflex(arrays))
    assert together.shape == (len(IMAGES), 5)
    for index in range(len(IMAGES)):
        alone = numpy(naflex({key: value[index:index + 1] for key, value in arrays.items()}))
        assert_close(together[index], alone[0], f"{family}: image {index} in a batch")
    # The square image at the model's own 4x4 grid: no resize anywhere, the classic output.
    assert arrays["spatial_shapes"][0].tolist() == [4, 4]
    expected = numpy(model(keras_vit.preprocess_inputs(IMAGES[0][None])))
    assert_close(together[0], expected[0], f"{family}: the classic model at its grid")


def unpatchified(patches, rows, columns):
    """The `[rows * P, columns * P, 3]` image of `rows * columns` flattened (P, P, 3) patches."""
    grid = np.reshape(patches[:rows * columns], (rows, columns, PATCH, PATCH, 3))
    return np.reshape(np.transpose(grid, (0, 2, 1, 3, 4)), (rows * PATCH, columns * PATCH, 3))


def test_bicubic_naflex_gives_the_classic_model_at_every_images_grid():
    """A model of timm's bicubic resize (`position_embedding_interpolation="bicubic"`): NaFlex
    resizes its embeddings per image as the classic model resizes them for a whole image of
    that grid (`dynamic_image_size`), enlarged, shrunk, both at once, so each image gets the
    classic model's output at its own size (bilinear NaFlex, SigLIP 2's, does not)."""
    model = classic({"classifier": "map", "class_token": False, "dynamic_image_size": True,
                     "position_embedding_interpolation": "bicubic"})
    naflex = native.NaFlexViT(model)
    for budget in (16, 30, 6):
        arrays = native.prepare(IMAGES, PATCH, budget)
        outputs = numpy(naflex(arrays))
        for index, (rows, columns) in enumerate(arrays["spatial_shapes"]):
            image = unpatchified(arrays["pixel_values"][index], rows, columns)
            expected = numpy(model(image[None]))[0]
            assert_close(outputs[index], expected, f"budget {budget}, image {index}")


def test_timm_input_names_give_the_same_outputs():
    """timm's NaFlexVit's dict (`patches`, `patch_valid`, `patch_coord`: each image's grid is
    one more than its largest row and column) is the same input under other names."""
    naflex = native.NaFlexViT(classic({"classifier": "gap", "num_register_tokens": 1,
                                       "position_embedding_interpolation": "bicubic"}))
    arrays = native.prepare(IMAGES, PATCH, 20)
    valid = arrays["pixel_attention_mask"] == 1
    coords = np.zeros(valid.shape + (2,), np.int32)
    for index, (rows, columns) in enumerate(arrays["spatial_shapes"]):
        coords[index, :rows * columns] = np.stack(np.meshgrid(
            np.arange(rows), np.arange(columns), indexing="ij"), -1).reshape(-1, 2)
    coords[~valid] = 3  # what the padding holds changes nothing
    timm_arrays = {"patches": arrays["pixel_values"], "patch_valid": valid, "patch_coord": coords}
    assert_close(numpy(naflex(timm_arrays)), numpy(naflex(arrays)), "timm's names")
    with pytest.raises(ValueError, match=r"patch_valid must be \[batch, length\] and patch_coord"):
        naflex(dict(timm_arrays, patch_coord=coords[..., :1]))
    with pytest.raises(ValueError, match=r"patches must be \[batch, length, 192\]"):
        naflex(dict(timm_arrays, patches=arrays["pixel_values"][..., :100]))


def test_the_padding_changes_nothing_and_tokens_come_with_their_mask():
    naflex = native.NaFlexViT(classic({"classifier": "map", "class_token": False}))
    arrays = native.prepare(IMAGES, PATCH, 16)
    noisy = dict(arrays, pixel_values=np.where(arrays["pixel_attention_mask"][..., None] == 1,
                                               arrays["pixel_values"], 7.0).astype("float32"))
    assert_close(numpy(naflex(noisy)), numpy(naflex(arrays)), "noise in the padding")
    tokens, mask = naflex.tokens(arrays)
    assert tuple(tokens.shape) == (len(IMAGES), 16, TINY_VIT["hidden_size"])
    assert (numpy(mask) == arrays["pixel_attention_mask"]).all()


def test_fused_and_explicit_attention_agree_on_a_padded_batch():
    fields = {"classifier": "map", "num_register_tokens": 1}
    explicit = native.NaFlexViT(classic(dict(fields, attention_impl="explicit")))
    fused = native.NaFlexViT(classic(dict(fields, attention_impl="fused")))
    arrays = native.prepare(IMAGES, PATCH, 16)
    assert_close(numpy(fused(arrays)), numpy(explicit(arrays)), "fused against explicit")


def test_a_naflex_model_saves_and_loads_in_safe_mode(tmp_path):
    naflex = native.NaFlexViT(classic({"classifier": "gap", "class_token": False}))
    arrays = native.prepare(IMAGES, PATCH, 12)
    path = str(tmp_path / "naflex.keras")
    naflex.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert isinstance(loaded, native.NaFlexViT)
    assert_close(numpy(loaded(arrays)), numpy(naflex(arrays)), "after .keras")


@pytest.mark.parametrize("family", REFUSED + ["hybrid", "axial"])
def test_a_model_that_needs_whole_square_grids_is_refused_naming_what(family):
    fields = {"hybrid": {"variant": "R26+S/32"},
              "axial": {"variant": "Axial-Ti/16"}}.get(family, OPTION_FAMILIES.get(family))
    variant = fields.pop("variant", "Ti/16") if "variant" in fields else "Ti/16"
    model = keras_vit.vit(variant, image_size=SIZE if family != "hybrid" else 64,
                          num_classes=5, **fields)
    with pytest.raises(ValueError, match="cannot run at native resolution: it has"):
        native.NaFlexViT(model)


def test_bad_inputs_are_refused_at_the_boundary():
    naflex = native.NaFlexViT(classic({}))
    arrays = native.prepare(IMAGES[:2], PATCH, 16)
    with pytest.raises(TypeError, match="takes a keras_vit model"):
        native.NaFlexViT(keras.Sequential([keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match="takes a dict of pixel_values"):
        naflex(arrays["pixel_values"])
    with pytest.raises(ValueError, match="takes a dict of pixel_values"):
        naflex({"pixel_values": arrays["pixel_values"]})
    with pytest.raises(ValueError, match=r"pixel_values must be \[batch, length, 192\]"):
        naflex(dict(arrays, pixel_values=arrays["pixel_values"][..., :100]))
    with pytest.raises(ValueError, match="pixel_attention_mask must be"):
        naflex(dict(arrays, pixel_attention_mask=arrays["pixel_attention_mask"][:, :5]))


@pytest.mark.parametrize("images, error, message", [
    ([], TypeError, "non-empty list"),
    ("image.png", TypeError, "non-empty list"),
    ([np.zeros((8, 8), np.uint8)], ValueError, r"Image 0 must be \[height, width, 3\]"),
    ([np.zeros((8, 8, 4), np.uint8)], ValueError, r"Image 0 must be \[height, width, 3\]"),
    ([np.zeros((0, 8, 3), np.uint8)], ValueError, r"Image 0 must be \[height, width, 3\]"),
    ([np.zeros((8, 8, 3), np.float32)], TypeError, "Image 0 must hold uint8 pixels"),
])
def test_prepare_refuses_what_is_not_a_list_of_rgb_images(images, error, message):
    with pytest.raises(error, match=message):
        native.prepare(images, PATCH, 16)


@pytest.mark.parametrize("patch_size, budget, error", [
    (0, 16, ValueError), (8, 0, ValueError), (8, 16.0, TypeError), ("8", 16, TypeError),
    (True, 16, TypeError)])
def test_a_bad_budget_is_refused_naming_the_argument(patch_size, budget, error):
    with pytest.raises(error, match="patch_size|max_num_patches"):
        native.image_size_for_budget(100, 50, patch_size, budget)
    with pytest.raises(error, match="patch_size|max_num_patches"):
        native.prepare(IMAGES[:1], patch_size, budget)


def test_the_budget_is_filled_with_whole_patches_keeping_the_aspect_ratio():
    for height, width in RNG.integers(1, 2000, (300, 2)):
        for patch, budget in ((16, 256), (14, 729), (8, 7)):
            rows, columns = (side // patch for side in native.image_size_for_budget(
                int(height), int(width), patch, budget))
            assert rows >= 1 and columns >= 1 and rows * columns <= budget
            # One patch more on the longer side would either break the budget or the ratio.
            ratio = (rows / columns) / (height / width)
            assert 0.5 < ratio < 2 or min(rows, columns) == 1, (height, width, rows, columns)


def test_the_tensorflow_search_gives_the_same_sizes():
    tf = pytest.importorskip("tensorflow")
    sides = RNG.integers(1, 3000, (500, 2))
    for patch, budget in ((16, 256), (14, 1024), (8, 3)):
        heights, widths = native.image_sizes_for_budget_tf(
            tf.constant(sides[:, 0]), tf.constant(sides[:, 1]), patch, budget)
        expected = [native.image_size_for_budget(int(h), int(w), patch, budget)
                    for h, w in sides]
        assert list(zip(heights.numpy().tolist(), widths.numpy().tolist())) == expected


# Packing (NaViT): several images in one sequence, each attending to its own patches and pooled
# alone; models without prefix tokens, as NaViT's.
PACKABLE = {"map": {"classifier": "map", "class_token": False},
            "gap_sincos": {"classifier": "gap", "class_token": False,
                           "position_embedding": "sincos_2d"},
            "map_fused_swiglu": {"classifier": "map", "class_token": False,
                                 "activation": "swiglu", "attention_impl": "fused"},
            "gap_post_norm_pooled": {"classifier": "gap", "class_token": False,
                                     "residual_post_norm": True, "final_norm": "pooled"}}


@pytest.mark.parametrize("family", PACKABLE)
def test_a_packed_batch_gives_each_image_what_it_gets_alone(family):
    naflex = native.NaFlexViT(classic(PACKABLE[family]))
    images = IMAGES + IMAGES[::-1]
    packed = native.pack(images, PATCH, 16, sequence_length=40, max_images=3)
    slots = packed["image_index"]
    assert sorted(slots[slots >= 0].tolist()) == list(range(len(images)))
    assert (slots >= 0).sum(axis=1).max() == 3  # some sequence holds several
    outputs = numpy(naflex(packed))
    assert outputs.shape == slots.shape + (5,)
    alone = numpy(naflex(native.prepare(images, PATCH, 16)))
    for row, slot in zip(*np.nonzero(slots >= 0)):
        assert_close(outputs[row, slot], alone[slots[row, slot]], f"{family}: {row}, {slot}")


def test_pack_fills_each_sequence_in_order_and_marks_every_patch():
    packed = native.pack(IMAGES, PATCH, 16, sequence_length=32, max_images=2)
    arrays = native.prepare(IMAGES, PATCH, 16)
    counts = arrays["spatial_shapes"].prod(axis=1)  # 16, 16, 16 and fewer patches
    assert packed["image_index"].tolist() == [[0, 1], [2, 3]]
    for row, slot in ((0, 0), (0, 1), (1, 0), (1, 1)):
        index = packed["image_index"][row, slot]
        rows, columns = packed["spatial_shapes"][row, slot]
        assert rows * columns == counts[index]
        where = packed["segment_ids"][row] == slot + 1
        assert (packed["pixel_values"][row][where]
                == arrays["pixel_values"][index, :counts[index]]).all()
        assert packed["patch_coords"][row][where].tolist() == [
            [r, c] for r in range(rows) for c in range(columns)]
    used = counts[2] + counts[3]
    assert (packed["segment_ids"][1, :used] > 0).all()
    assert (packed["segment_ids"][1, used:] == 0).all()


def _packed_one_by_one(patches, grids, sequence_length, max_images, sequences):
    """pack_patches as it was written first: first fit, then a few NumPy calls per image."""
    placed, used = [], []
    for index, (rows, columns) in enumerate(grids):
        count = rows * columns
        row = next((row for row in range(len(placed)) if len(placed[row]) < max_images
                    and used[row] + count <= sequence_length), None)
        if row is None and (sequences is None or len(placed) < sequences):
            row = len(placed)
            placed.append([])
            used.append(0)
        if row is not None:
            placed[row].append(index)
            used[row] += count
    placed += [[] for _ in range((sequences or 0) - len(placed))]
    arrays = {"pixel_values": np.zeros((len(placed), sequence_length, 5), np.float32),
              "segment_ids": np.zeros((len(placed), sequence_length), np.int32),
              "patch_coords": np.zeros((len(placed), sequence_length, 2), np.int32),
              "spatial_shapes": np.zeros((len(placed), max_images, 2), np.int32),
              "image_index": np.full((len(placed), max_images), -1, np.int32)}
    for row, indices in enumerate(placed):
        start = 0
        for slot, index in enumerate(indices):
            rows, columns = grids[index]
            end = start + rows * columns
            arrays["pixel_values"][row, start:end] = patches[index][:rows * columns]
            arrays["segment_ids"][row, start:end] = slot + 1
            arrays["patch_coords"][row, start:end] = [[r, c] for r in range(rows)
                                                      for c in range(columns)]
            arrays["spatial_shapes"][row, slot] = (rows, columns)
            arrays["image_index"][row, slot] = index
            start = end
    return arrays


def test_pack_patches_places_every_patch_as_one_image_at_a_time_does():
    """The packer scatters all patches at once: the arrays of placing them one image at a
    time, for random grids, budgets, slots and sequence counts (some images left out)."""
    rng = np.random.default_rng(1)
    for trial in range(60):
        length = int(rng.choice([16, 40, 64]))
        grids = [(int(rng.integers(1, 5)), int(rng.integers(1, 5)))
                 for _ in range(int(rng.integers(1, 30)))]
        patches = [rng.normal(size=(rows * columns + int(rng.integers(0, 3)), 5)).astype(
            np.float32) for rows, columns in grids]
        max_images, sequences = int(rng.integers(1, 6)), [None, int(rng.integers(1, 8))][trial % 2]
        got = native.pack_patches(patches, grids, length, max_images, sequences)
        expected = _packed_one_by_one(patches, grids, length, max_images, sequences)
        for name, value in expected.items():
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            np.testing.assert_array_equal(got[name], value, f"{name}, trial {trial}")
    with pytest.raises(ValueError, match="An image of 20 patches fits no sequence of 16"):
        native.pack_patches([np.zeros((20, 5))], [(4, 5)], 16, 2)


def test_packed_inputs_are_checked_at_the_boundary():
    packed = native.pack(IMAGES, PATCH, 16, sequence_length=32, max_images=2)
    with pytest.raises(ValueError, match="has prefix tokens"):
        native.NaFlexViT(classic({}))(packed)
    naflex = native.NaFlexViT(classic(PACKABLE["map"]))
    with pytest.raises(ValueError, match=r"segment_ids \[batch, length\], patch_coords"):
        naflex(dict(packed, patch_coords=packed["patch_coords"][:, :5]))
    with pytest.raises(ValueError, match="sequence_length 8 is shorter than max_num_patches"):
        native.pack(IMAGES, PATCH, 16, sequence_length=8)
    with pytest.raises(ValueError, match="max_images must be a positive integer"):
        native.pack(IMAGES, PATCH, 16, max_images=0)


def test_one_compiled_program_serves_every_packing():
    """XLA (TPUs) compiles a program per shape: packed batches of any mix of image sizes have
    one shape, so one compilation serves them all, with the eager outputs."""
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.function(jit_compile=True) compiles TensorFlow's ops")
    naflex = native.NaFlexViT(classic(PACKABLE["map"]))
    traces = []

    @tf.function(jit_compile=True)
    def run(arrays):
        traces.append(1)
        return naflex(arrays)

    for seed in range(3):
        rng = np.random.default_rng(seed)
        images = [rng.integers(0, 256, (*rng.integers(5, 100, 2), 3), dtype=np.uint8)
                  for _ in range(6)]
        packed = native.pack(images, PATCH, 16, sequence_length=48, max_images=4)
        packed = {key: np.concatenate([value, np.zeros((3 - len(value),) + value.shape[1:],
                                                       value.dtype)])  # 3 sequences
                  for key, value in packed.items() if key != "image_index"}
        assert_close(numpy(run(packed)), numpy(naflex(packed)), f"XLA, packing {seed}")
    assert len(traces) == 1


def test_the_tensorflow_patches_are_the_numpy_ones():
    """tf.data's per-image cut (`image_patches_tf`, a budget tensor too) and the NumPy one
    (`image_patches`): the same grid, and pixels as close as two bilinear resizes."""
    tf = pytest.importorskip("tensorflow")
    for image in IMAGES:
        for budget in (16, 5):
            expected, grid = native.image_patches(image, PATCH, budget)
            for given in (budget, tf.constant(budget)):
                patches, tf_grid = native.image_patches_tf(tf.constant(image), PATCH, given)
                assert tuple(tf_grid.numpy()) == grid
                assert np.abs(patches.numpy() - expected).max() < 2 / 255

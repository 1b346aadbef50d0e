"""A checkpoint's evaluation preprocessing (`keras_vit.EvalPreprocessing`) travels with the model:
timm's resize-and-crop arithmetic, the default that resizes exactly as keras_vit always did,
`prepare_images`, the `.keras` round trip, and the exported SavedModel's signatures. Reading
and writing it in transformers' and timm's files: test_hub.py; against timm itself:
test_library_parity.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import preprocessing
from keras_vit.deploy import export
from keras_vit.preprocessing import EvalPreprocessing
from export_fixtures import tiny_vit
from model_fixtures import TINY_VIT

pytestmark = pytest.mark.usefixtures("fresh_session")

TIMM_VIT = EvalPreprocessing("bicubic", 0.9, "center", antialias=True)  # timm's ViT default


def noise(height, width, seed=0):
    """uint8 noise: a crop or resize one pixel off changes it everywhere."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def tiny(**fields):
    return keras_vit.vit("Ti/16", **{**TINY_VIT, "image_size": 32, "patch_size": 8,
                                      "num_classes": 5, **fields})


def test_the_default_resizes_exactly_as_before():
    """keras_vit's own models (and every .keras file saved before) see the same pixels."""
    jpeg = tf.io.encode_jpeg(noise(23, 37)).numpy()
    before = tf.image.resize(tf.cast(tf.io.decode_jpeg(jpeg, channels=3), tf.float32), (8, 12),
                             method="bilinear")  # decode_and_resize until now
    for how in (None, EvalPreprocessing()):
        np.testing.assert_array_equal(preprocessing.decode_and_resize(jpeg, (8, 12), how), before)
    model = tiny(image_size=(8, 16), patch_size=4)
    np.testing.assert_array_equal(keras_vit.prepare_images(model, jpeg),
                                  keras_vit.preprocess_inputs(tf.image.resize(
                                      tf.io.decode_jpeg(jpeg, channels=3), (8, 16))))


# timm 1.0's eval transform (transforms_imagenet_eval): scale = floor(size / crop_pct); a square
# target resizes the shorter side to it and the longer to floor(scale * longer / shorter)
# (torchvision); a non-square one divides both sides by min(side / scale) and rounds them; the
# centre crop starts at round((resized - size) / 2), half to even. Worked by hand:
CASES = [
    # image (h, w), size, preprocessing, resized (h, w), crop's (top, left)
    ((480, 640), (224, 224), TIMM_VIT, (248, 330), (12, 53)),  # 224/0.9 = 248.9; 330.7
    ((640, 480), (224, 224), TIMM_VIT, (330, 248), (53, 12)),  # portrait
    # 256; 341.3; left (341 - 224) / 2 = 58.5, to even: 58
    ((480, 640), (224, 224), EvalPreprocessing("bilinear", 0.875, "center"), (256, 341),
     (16, 58)),
    # (248, 355); ratio min(480/248, 640/355) = 1.803; 480 / 1.803 = 266.25; 17.5 to even: 18
    ((480, 640), (224, 320), TIMM_VIT, (266, 355), (21, 18)),
    # squash: each side to floor(side / 0.875) whatever the image
    ((480, 640), (224, 224), EvalPreprocessing("bilinear", 0.875, "squash"), (256, 256),
     (16, 16)),
    # no crop fraction, aspect kept: 40x60 to 32x48, the centre 32 of 48
    ((40, 60), (32, 32), EvalPreprocessing("bilinear", 1.0, "center"), (32, 48), (0, 8)),
]


@pytest.mark.parametrize("image, size, how, resized, offsets", CASES)
def test_resize_and_crop_follow_timm_arithmetic(image, size, how, resized, offsets):
    box = preprocessing._crop_box(image, size, how)
    assert [int(v) for v in box[0]] == list(resized) and [int(v) for v in box[1]] == list(offsets)
    # The images resized in a graph (as the SavedModel runs) are those pixels of that resize.
    pixels = noise(*image)
    expected = tf.image.resize(pixels.astype(np.float32), resized, method=how.interpolation,
                               antialias=how.antialias)
    expected = tf.clip_by_value(expected, 0, 255)[offsets[0]:offsets[0] + size[0],
                                                   offsets[1]:offsets[1] + size[1]]
    for signature in ([tf.TensorSpec([None, None, 3], tf.uint8)], None):  # sides unknown, known
        graph = tf.function(lambda x: preprocessing.resize(x, size, how),
                            input_signature=signature)
        np.testing.assert_array_equal(graph(pixels), expected)
    np.testing.assert_array_equal(preprocessing.resize(pixels[None], size, how)[0], expected)


def test_the_graph_sizes_equal_pythons_where_a_division_by_a_constant_would_not():
    """640 / 14 multiplied by the reciprocal of 14 is one ulp off, and 480 / that rounds to 11
    instead of 10.5 to 10: TensorFlow's optimizer must not rewrite the divisions."""
    how = EvalPreprocessing(crop_fraction=0.5, crop_mode="center")
    size = (7, 5)
    assert [int(v) for v in preprocessing._crop_box((640, 480), size, how)[0]] == [14, 10]
    graph = tf.function(lambda shape: tf.stack(preprocessing._crop_box(
        shape, size, how, xp=preprocessing._tf_numpy())[0]))
    assert graph(tf.constant([640, 480])).numpy().tolist() == [14, 10]


def test_bicubic_antialias_and_crop_each_change_the_pixels():
    pixels = noise(90, 120)
    results = {how: preprocessing.resize(pixels, (32, 32), how).numpy() for how in (
        EvalPreprocessing(), EvalPreprocessing("bicubic"), EvalPreprocessing(antialias=True),
        EvalPreprocessing(crop_fraction=0.875), EvalPreprocessing(crop_mode="center"))}
    values = list(results.values())
    for index, first in enumerate(values):
        for second in values[index + 1:]:
            assert np.abs(first - second).max() > 10
    assert 0 <= values[1].min() and values[1].max() <= 255  # bicubic's overshoot clipped


def test_antialias_follows_pils_resize_which_timm_and_transformers_use():
    image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:300, 0:400]
    pixels = np.clip(128 + 80 * np.sin(xx / 5.0 + yy / 9.0)[..., None]
                     + rng.normal(0, 20, (300, 400, 3)), 0, 255).astype(np.uint8)
    for name, pil in (("bilinear", image.BILINEAR), ("bicubic", image.BICUBIC)):
        theirs = np.asarray(image.fromarray(pixels).resize((100, 75), pil), np.float32)
        ours = preprocessing.resize(pixels, (75, 100), EvalPreprocessing(name, antialias=True))
        plain = preprocessing.resize(pixels, (75, 100), EvalPreprocessing(name))
        assert np.abs(ours - theirs).max() <= 1.0  # PIL rounds to uint8
        assert np.abs(plain - theirs).max() > 20  # without the filter, aliasing


@pytest.mark.parametrize("fields, message", [
    ({"interpolation": "lanczos"}, "interpolation='lanczos': must be one of"),
    ({"crop_fraction": 0}, r"crop_fraction=0: must be a number in \(0, 1\]"),
    ({"crop_fraction": 1.1}, "crop_fraction=1.1"),
    ({"crop_fraction": float("nan")}, "crop_fraction=nan"),
    ({"crop_fraction": True}, "crop_fraction=True"),
    ({"crop_mode": "border"}, "crop_mode='border': must be one of"),
    ({"antialias": "yes"}, "antialias='yes': must be True or False"),
])
def test_a_wrong_value_is_named(fields, message):
    with pytest.raises(ValueError, match=message):
        EvalPreprocessing(**fields)


def test_to_dict_and_from_dict():
    assert EvalPreprocessing.from_dict(TIMM_VIT.to_dict()) == TIMM_VIT
    assert TIMM_VIT.to_dict() == {"interpolation": "bicubic", "crop_fraction": 0.9,
                                  "crop_mode": "center", "antialias": True}
    with pytest.raises(ValueError, match="read from a dict of"):
        EvalPreprocessing.from_dict({"interpolation": "bicubic", "crop": 0.9})
    assert EvalPreprocessing(crop_fraction=1).crop_fraction == 1.0  # float, equal to default
    assert EvalPreprocessing(crop_fraction=1) == EvalPreprocessing()


def test_the_model_carries_it_through_keras_files_and_copies(tmp_path):
    model = tiny()
    assert model.preprocessing == EvalPreprocessing()
    assert "vit_preprocessing" not in model.get_config()  # older files unchanged
    model.preprocessing = TIMM_VIT
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    assert loaded.preprocessing == TIMM_VIT and loaded.spec == model.spec
    assert keras_vit.features(loaded).preprocessing == TIMM_VIT
    mixed = tiny(dtype="mixed_bfloat16")
    mixed.preprocessing = TIMM_VIT
    copy = export.float32_copy(mixed)
    assert copy is not mixed and copy.preprocessing == TIMM_VIT
    with pytest.raises(TypeError, match="must be a keras_vit.EvalPreprocessing"):
        model.preprocessing = "bicubic"
    model.preprocessing = None
    assert model.preprocessing == EvalPreprocessing()


def test_prepare_images_takes_files_and_pixels_of_any_size():
    model = tiny()
    model.preprocessing = TIMM_VIT
    big, small = noise(60, 90, seed=1), noise(40, 33, seed=2)
    jpeg, png = tf.io.encode_jpeg(big).numpy(), tf.io.encode_png(small).numpy()

    def expected(pixels):
        return preprocessing.scale_pixels(preprocessing.resize(pixels, (32, 32), TIMM_VIT))

    files = keras_vit.prepare_images(model, [jpeg, png])
    assert tuple(files.shape) == (2, 32, 32, 3)
    np.testing.assert_array_equal(files[0], expected(tf.io.decode_jpeg(jpeg)))
    np.testing.assert_array_equal(files[1], expected(small))
    np.testing.assert_array_equal(keras_vit.prepare_images(model, png), files[1])
    np.testing.assert_array_equal(keras_vit.prepare_images(model, big), expected(big))
    batch = keras_vit.prepare_images(model, np.stack([big, big]).astype(np.float32))
    np.testing.assert_array_equal(batch[1], expected(big))
    dataset = tf.data.Dataset.from_tensor_slices([jpeg, jpeg]).map(
        lambda encoded: keras_vit.prepare_images(model, encoded))
    np.testing.assert_array_equal(next(iter(dataset)), files[0])


@pytest.mark.parametrize("images, error, message", [
    ("cat.jpg", TypeError, r"read the file first: open\(path, 'rb'\)"),
    ([noise(5, 5), noise(6, 5)], TypeError, "prepare images of several sizes one at a time"),
    (np.zeros((2, 8, 8, 4), np.uint8), ValueError, r"RGB pixels .* got shape \(2, 8, 8, 4\)"),
    (np.zeros((8, 8, 3), bool), TypeError, "got dtype bool"),
])
def test_prepare_images_errors_say_what_to_pass(images, error, message):
    with pytest.raises(error, match=message):
        keras_vit.prepare_images(tiny(), images)


def test_prepare_images_names_the_item_that_is_a_path_or_not_an_image():
    png = tf.io.encode_png(noise(8, 8)).numpy()
    with pytest.raises(TypeError, match=r"item 1 is a str \('no_such_photo.jpg'\); read the "
                                        r"files first"):
        keras_vit.prepare_images(tiny(), [png, "no_such_photo.jpg"])
    for bad, shown in ((b"not an image at all", "19 bytes, starting b'not an image at '"),
                       (png[:30], r"30 bytes, starting b'\\x89PNG")):
        with pytest.raises(ValueError, match=rf"item 1 \({shown}.*is not an image"):
            keras_vit.prepare_images(tiny(), [png, bad])
    with pytest.raises(ValueError, match=r"the file \(4 bytes, starting b'junk'\)"):
        keras_vit.prepare_images(tiny(), b"junk")


def test_the_saved_model_prepares_images_as_prepare_images(tmp_path):
    model = tiny_vit()
    model.preprocessing = TIMM_VIT
    served = tf.saved_model.load(export.export_saved_model(model, str(tmp_path / "vit")))
    big, small = noise(60, 90, seed=1), noise(40, 33, seed=2)
    files = [tf.io.encode_jpeg(big).numpy(), tf.io.encode_png(small).numpy()]
    expected = model(keras_vit.prepare_images(model, files))
    logits = served.signatures["serving_default"](image_bytes=tf.constant(files))["logits"]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    pixels = served.signatures["serving_images"](images=tf.constant(big[None], tf.float32))
    np.testing.assert_allclose(pixels["logits"], model(keras_vit.prepare_images(model, big[None])),
                               rtol=1e-5, atol=1e-5)

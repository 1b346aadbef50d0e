"""What the input pipelines read of a run's config (`FIELDS`: the engines hand them this section
and no more), and the rules of the input's own fields (`RULES`: `(kind, details)` pairs, as
`train.run.config_checks.rules` describes them, which gathers every part's).
"""

from keras_vit.preprocessing import CROP_MODES, INTERPOLATIONS, EvalPreprocessing

from . import augmentation, native_input, sources

PIPELINES = ("auto", "tf.data", "grain")
# How evaluation images are resized (the config's field -> keras_vit.EvalPreprocessing's):
# keras_vit's own by default; a starting checkpoint's where the user left them
# (train.run.starting_point), so that a timm checkpoint is evaluated with its crop_pct. The
# export keeps them (the SavedModel resizes as the run evaluated).
EVAL_RESIZE = {"eval_interpolation": "interpolation", "eval_crop_fraction": "crop_fraction",
               "eval_crop_mode": "crop_mode", "eval_antialias": "antialias"}

RULES = {
    "dataset": ("str", None),  # and what the source sees at once (a folder that is missing)
    "data_dir": ("optional_str", None),
    "train_split": ("str", None),
    "eval_split": ("str", None),
    "image_size": ("int", (1, None)),  # and a whole number of patches: by the model's spec
    "crop_min_area": ("float_above", (0.0, 1.0, True)),
    "flip": ("bool", None),
    "shuffle_buffer": ("int", (1, None)),
    "batch_size": ("int", (1, None)),
    "eval_batch_size": ("int", (1, None)),
    "eval_interpolation": ("choice", INTERPOLATIONS),
    "eval_crop_fraction": ("float_above", (0.0, 1.0, True)),
    "eval_crop_mode": ("choice", CROP_MODES),
    "eval_antialias": ("bool", None),
    "input_pipeline": ("choice", PIPELINES),
    "input_workers": ("int", (0, None)),
    # Masked patch prediction's corruption, drawn in the pipelines (train/data/masking.py).
    "mpp_corruption_rate": ("float_above", (0.0, 1.0, True)),
    "mpp_mask_rate": ("float", (0.0, 1.0, True)),
    "mpp_random_rate": ("float", (0.0, 1.0, True)),  # and mask + random <= 1
}

# Everything the pipelines read: their own fields, the augmentation's, the seed of the stream's
# order and augmentation, and the objective (whose corruption they draw).
FIELDS = (*RULES, *augmentation.FIELDS, *native_input.FIELDS, "seed", "objective")


def eval_preprocessing(config):
    """The `keras_vit.EvalPreprocessing` of the config's `eval_*` resize fields."""
    return EvalPreprocessing(
        interpolation=config.eval_interpolation, crop_fraction=config.eval_crop_fraction,
        crop_mode=config.eval_crop_mode, antialias=config.eval_antialias)


def check(config, report):
    """Adds to `report` (train.run.config_checks) what is wrong with the input's fields
    together."""
    if report.ok("dataset"):
        for problem in sources.get(config.dataset).problems():
            report.add("dataset", problem)
    if report.ok("mpp_mask_rate", "mpp_random_rate") and (
            config.mpp_mask_rate + config.mpp_random_rate > 1.0 + 1e-9):
        report.add(("mpp_mask_rate", "mpp_random_rate"),
                   f"config.mpp_mask_rate={config.mpp_mask_rate}, "
                   f"config.mpp_random_rate={config.mpp_random_rate}",
                   "are shares of the corrupted patches, so together at most 1 (the rest are "
                   "kept as they are)")

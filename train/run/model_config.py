"""The model of a training config: `config.model` (the fields of keras_vit.ViTConfig) with
`config.image_size`, as one spec."""

# What configs written before config.model held the model's fields (a variant name, and the other
# fields beside it) are told.
MODEL_FIELDS_MOVED = ("config.model holds the model's fields (those of keras_vit.ViTConfig), "
                      "not a variant name")


def model_spec(config, num_classes, include_top=True):
    """The `keras_vit.ViTConfig` of a training config: the fields of `config.model`, with
    `config.image_size`, the dataset's `num_classes` and `include_top` (False for an encoder
    without a head). `config` is a ConfigDict or the dict of a `config.json` (`run_config.saved`);
    a field that a config.json written before it existed lacks takes the spec's default.
    Raises the spec's ValueError (or TypeError) naming every bad field."""
    from keras_vit.architecture.spec import ViTConfig

    return ViTConfig.from_dict({**model_fields(config), "image_size": config["image_size"],
                                "num_classes": num_classes, "include_top": include_top})


def model_fields(config):
    """The fields of `config.model`, as a dict."""
    model = config["model"]
    return {name: model[name] for name in model}

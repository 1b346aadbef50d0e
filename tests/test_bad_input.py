"""Bad input for every field, generated from the fields themselves: each `ViTConfig` field given
a value of the wrong type, a NumPy scalar of the right type (accepted, as the Python value), and,
for numbers, out-of-range values, inf and NaN: one clear error naming the field. A field added to
the spec gets these checks with no test written for it (a guard says which fields need a sample
value or a context because their default is None or needs other fields)."""

import dataclasses
import math
import typing

import numpy as np
import pytest

from keras_vit.architecture import spec as spec_module
from keras_vit.architecture.spec import ViTConfig

# The fields set beside each field for its value to apply (rope's fields need rope, ...).
CONTEXT = {
    "class_token": dict(classifier="gap"),
    "rope_temperature": dict(rope="axial"),
    "rope_reference_grid": dict(rope="axial"),
    "rope_grid_offset": dict(rope="axial"),
    "relative_mlp_dim": dict(position_embedding="relative_mlp"),
    "relative_mlp_shared": dict(position_embedding="relative_mlp"),
    "map_num_heads": dict(classifier="map"),
    "map_mlp_dim": dict(classifier="map"),
    "map_include_prefix": dict(classifier="map"),
    "resnet_numerics": dict(variant="R50+B/16"),
    "dynamic_image_pad": dict(dynamic_image_size=True),
    "layer_scale_init": dict(residual_post_norm=False),
}
# A valid value other than the default, for fields whose default (None) says nothing of the type.
SAMPLE = {
    "patch_size": 32, "hidden_size": 384, "mlp_dim": 1536, "num_heads": 6, "num_layers": 2,
    "classifier": "gap", "representation_size": 64, "dropout": 0.1, "layer_scale_init": 1e-5,
    "class_token": True, "rope": "axial", "rope_temperature": 100.0,
    "rope_reference_grid": (14, 14), "rope_grid_offset": 1.0, "relative_mlp_dim": 32,
    "map_num_heads": 4, "map_mlp_dim": 64, "resnet_numerics": "timm", "image_size": (224, 160),
    "variant": "S/16", "num_kv_heads": 4,
}
# Fields whose numbers may be zero or negative (every other number must be positive).
SIGNED = {"rope_grid_offset"}
RATES = {"dropout", "attention_dropout", "drop_path_rate"}  # in [0, 1)
AT_LEAST_ZERO = {"num_register_tokens", "map_mlp_dim"}  # map_mlp_dim 0: no MLP
FIELDS = {field.name: field for field in dataclasses.fields(ViTConfig)}


def kind(name):
    """The Python type a field holds: its annotation (tuple fields take ints)."""
    annotation = typing.get_type_hints(ViTConfig)[name]
    return int if annotation is tuple else annotation


def sample(name):
    return SAMPLE.get(name, FIELDS[name].default)


def built(name, value):
    return ViTConfig(**{**CONTEXT.get(name, {}), name: value})


def numpy_of(value):
    """The value as a NumPy scalar (tuples: of NumPy integers)."""
    if isinstance(value, tuple):
        return tuple(np.int64(side) for side in value)
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float32(value) if float(np.float32(value)) == value else np.float64(value)
    return value


def test_every_field_has_a_sample_of_its_type():
    """A new field with a None default needs a sample here (and a context if it applies with
    another field only); the checks below then cover it."""
    for name in FIELDS:
        value = sample(name)
        assert value is not None, f"add a sample value of {name} to SAMPLE"
        built(name, value)  # valid in its context


@pytest.mark.parametrize("name", list(FIELDS))
def test_a_wrong_type_is_a_type_error_naming_the_field(name):
    wrong = [3] if kind(name) is str else ["3", b"3", [3, 4, 5]]
    if kind(name) is not bool:
        wrong.append(True)  # a bool is not a number
    if kind(name) is int:
        wrong.append(3.0)
    for value in wrong:
        if name == "variant" and value == 3:
            value = 16
        with pytest.raises((TypeError, ValueError), match=name) as info:
            built(name, value)
        # A list of two is a pair for image_size; everything else is the wrong type.
        assert info.type is TypeError or isinstance(value, list), (name, value, info.value)


@pytest.mark.parametrize("name", list(FIELDS))
def test_a_numpy_scalar_is_taken_as_its_python_value(name):
    value = sample(name)
    expected = getattr(built(name, value), name)
    got = getattr(built(name, numpy_of(value)), name)
    assert got == expected and type(got) is type(expected), (name, got, expected)


@pytest.mark.parametrize("name", [name for name in FIELDS if kind(name) in (int, float)])
def test_out_of_range_inf_and_nan_are_value_errors_naming_the_field(name):
    bad = [] if name in SIGNED else [-1]
    if kind(name) is int and name not in AT_LEAST_ZERO:
        bad.append(0)
    if kind(name) is float:
        bad += [math.inf, -math.inf, math.nan, np.float32("nan")]
        if name in RATES:
            bad.append(1.0)
        elif name not in SIGNED:
            bad.append(0.0)
    if name in ("image_size", "rope_reference_grid"):
        bad = [(0, 16), (16, -1), -1]
    for value in bad:
        with pytest.raises(ValueError, match=name):
            built(name, value)


def test_every_choice_field_lists_its_choices_when_refused():
    for name in FIELDS:
        if kind(name) is not str or name == "variant":
            continue
        with pytest.raises(ValueError, match=name) as info:
            built(name, "no such choice")
        assert repr(sample(name)) in str(info.value) or name == "rope", (name, info.value)


def test_the_spec_module_owns_the_field_list_these_tests_walk():
    assert tuple(FIELDS) == spec_module.FIELDS


# The run config: every field of configs/common.py, walked from its rule in
# train.run.config_checks.rules() (its kind and range); a value is refused when the checks
# report a problem naming `config.<field>=`.

def run_config(**values):
    """configs/common.py's config with `values` set, whatever their types (a config file's
    `get_config` may hold any)."""
    import ml_collections

    from configs import common

    # Made anew with the values, not assigned: ml_collections would cast True to 1.0 in a
    # float field.
    return ml_collections.ConfigDict({**common.get_config().to_dict(), **values})


def refusals(name, value):
    from train.run import config_checks

    return [line for line in config_checks.problems(run_config(**{name: value}))
            if line.startswith(f"config.{name}=")]


def run_rules():
    from train.run import config_checks

    return {name: rule for name, rule in config_checks.rules().items() if rule[0] != "spec"}


def valid_run_value(kind, details, default):
    """A valid value of the rule: the default, or one inside the range where that is None."""
    if default is not None:
        return default
    if kind == "optional_str":
        return "x"
    low, high = details[0], details[1]
    value = low + 2 if high is None else (low + high) / 2
    return int(value) if kind == "optional_int" else float(value)


def run_cases():
    from configs import common

    defaults = common.get_config()
    return [(name, kind, details, valid_run_value(kind, details, defaults[name]))
            for name, (kind, details) in run_rules().items()]


@pytest.mark.parametrize("case", run_cases(), ids=lambda case: case[0])
def test_every_run_config_field_refuses_wrong_types_and_takes_numpy_scalars(case):
    name, kind, details, valid = case
    base = kind.removeprefix("optional_")
    assert not refusals(name, valid), (name, valid)
    if base in ("int", "float", "float_above", "bool"):
        assert not refusals(name, numpy_of(valid)), (name, "its NumPy scalar is refused")
    wrong = {"int": ["3", 3.5, True], "float": ["0.5", True, [0.5]],
             "float_above": ["0.5", True], "bool": ["yes", 1, None], "choice": [3, None],
             "str": [3, "", None], "any_str": [3, None]}
    for value in wrong[base] if kind != "optional_str" else [3]:
        assert refusals(name, value), (name, value, "accepted")


@pytest.mark.parametrize("case", [case for case in run_cases()
                                  if case[1].removeprefix("optional_") in
                                  ("int", "float", "float_above")], ids=lambda case: case[0])
def test_every_numeric_run_config_field_refuses_its_out_of_range_values(case):
    name, kind, details, _ = case
    base = kind.removeprefix("optional_")
    low, high = details[0], details[1]
    bad = [low - 1]
    if base == "float_above":
        bad.append(low)
    if high is not None:
        bad.append(high + 1)
        if base != "int" and not details[2]:  # high exclusive
            bad.append(high)
    if base != "int":
        bad += [math.inf, -math.inf, math.nan, np.float32("nan")]
    for value in bad:
        assert refusals(name, value), (name, value, "accepted")


def test_every_choice_run_field_names_its_choices_when_refused():
    for name, (kind, details) in run_rules().items():
        if kind == "choice":
            (line,) = refusals(name, "no such choice")
            assert all(repr(choice) in line for choice in details), line


def test_a_config_file_of_numpy_numbers_loads_as_python_ones(tmp_path):
    """A config file may compute its values with NumPy: the loaded config holds the Python
    values (the run's config.json is JSON), and they pass the checks."""
    from absl import flags
    from ml_collections import config_flags

    from train.run import config_checks, config_flag

    path = tmp_path / "numpy_config.py"
    path.write_text(
        "import ml_collections\nimport numpy as np\nfrom configs import common\n\n"
        "def get_config():\n"
        "    fields = common.get_config().to_dict()\n"
        "    fields.update(batch_size=np.int64(64), learning_rate=np.float32(0.5),\n"
        "                  flip=np.bool_(False))\n"
        "    return ml_collections.ConfigDict(fields)\n")
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "test", flag_values=values)
    config_flag.install_config_parser(values["config"])
    values([__file__, f"--config={path}"])
    config = config_flag.loaded_config(values)
    for name, expected in (("batch_size", 64), ("learning_rate", 0.5), ("flip", False)):
        assert config[name] == expected and type(config[name]) is type(expected), name
    assert not config_checks.problems(config)

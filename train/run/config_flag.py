"""The `--config` flag of the commands, and how it loads a config file.

`define_config_flag` defines `--config` (ml_collections' config-file flag, locked, so a misspelt
`--config.field` is an error) with our loading: a bare name such as `quickstart` is the shipped
config of that name (`configs/` in a checkout, `keras_vit.configs` when installed), anything else
a path; a config file that is missing, has a syntax error or a bad `file.py:argument` is one
line, not a traceback; overrides in the layout before `config.model` held the model's fields
(`--config.model=B/16`, `--config.patch_size=2`) say what to write instead. `loaded_config`
reads the flag's value; `flat_fields` names a config's fields as `--config.<name>` does. What the
values may be is train.run.config_checks'.
"""

import copy
import difflib
import importlib
import importlib.util
import os
import re
import sys

from absl import app

from .model_config import MODEL_FIELDS_MOVED

# The shipped experiment configs, the package beside this one: `configs` in a checkout (where
# this package is `train`), `keras_vit.configs` when installed (where it is `keras_vit.train`).
CONFIGS_PACKAGE = ".".join([*__package__.split(".")[:-2], "configs"])


def shipped_config(name):
    """The shipped config module `name` (`common`, `quickstart`, ...)."""
    return importlib.import_module(f"{CONFIGS_PACKAGE}.{name}")


def _configs_folder():
    return os.path.dirname(os.path.abspath(importlib.import_module(CONFIGS_PACKAGE).__file__))


def shipped_config_names():
    """The experiment configs `--config=<name>` accepts (`common` is their shared base)."""
    return sorted(name[:-3] for name in os.listdir(_configs_folder())
                  if name.endswith(".py") and not name.startswith("_") and name != "common.py")


def config_file(name):
    """The file `--config=<name>` means: a bare name (no folder, no `.py`) is the shipped
    config of that name, wherever the package is; anything else is a path."""
    if os.sep in name or "/" in name or name.endswith(".py"):
        if not os.path.isfile(name):
            where = "" if os.path.isabs(name) else f" (relative to {os.getcwd()})"
            raise ValueError(f"no config file {name}{where}; give a shipped config "
                             f"({', '.join(shipped_config_names())}) or a config file path")
        return name
    if name not in shipped_config_names():
        raise ValueError(f"no shipped config named {name!r}; give one of "
                         f"{', '.join(shipped_config_names())}, or a config file path")
    return os.path.join(_configs_folder(), f"{name}.py")


def load_config_module(filename):
    """The config file as a module of the shipped configs package, so that its `from . import
    common` is the shipped `common` wherever the package is installed. A shipped file is
    imported under its package name (once per process, as any import); another file (a copy
    to edit) is run as an unregistered module of that package."""
    stem = os.path.splitext(os.path.basename(filename))[0]
    if os.path.samefile(os.path.dirname(os.path.abspath(filename)), _configs_folder()):
        return shipped_config(stem)
    spec = importlib.util.spec_from_file_location(f"{CONFIGS_PACKAGE}.{stem}", filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def define_config_flag(help_text, default=None):
    """Defines the `--config` flag of a command (a shipped config by name, or a file.py, with
    `[:arg]` and `--config.field=value` overrides), loaded by `install_config_parser`."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, help_text, lock_config=True)
    install_config_parser(flags.FLAGS["config"])
    if default is not None:
        flags.FLAGS.set_default("config", default)


def install_config_parser(flag):
    """Gives a `config_flags.DEFINE_config_file` flag our loading (`config_file`,
    `load_config_module`) and one-line errors: a missing file, a syntax error or a bad
    `file.py:argument` name the file and the problem, instead of ml_collections' traceback
    text (or a placeholder config that fails on first use)."""
    base = type(flag.parser)

    class ConfigFileParser(base):
        def parse(self, path):
            name, has_argument, argument = path.partition(":")
            filename = config_file(name)
            try:
                module = load_config_module(filename)
                config = module.get_config(*([argument] if has_argument else []))
            except SyntaxError as error:
                raise ValueError(f"{filename} line {error.lineno}: {error.msg}") from None
            except (TypeError, ValueError) as error:
                text = " ".join(str(error).split()).rstrip(".")
                if "field 'model'" in text:  # `config.model = "B/16"`, the old layout
                    text = (f"{text}. {MODEL_FIELDS_MOVED}: set "
                            "config.model.variant and config.model.<field>")
                raise type(error)(text) from None
            _numpy_scalars_as_python(config)
            _check_model_flags(flag.name, config, sys.argv)
            if getattr(self, "_lock_config", True) and callable(getattr(config, "lock", None)):
                config.lock()
            return config

    parser = copy.copy(flag.parser)
    parser.__class__ = ConfigFileParser
    flag.parser = parser


def _numpy_scalars_as_python(config):
    """Replaces (in place) the NumPy numbers and bools of a config (a file may compute its
    values with NumPy) by the Python values they stand for: the checks take either, but the
    run's config.json and the overrides' parsing want Python's."""
    if not hasattr(config, "keys"):
        return
    for name in list(config.keys()):
        value = config[name]
        if hasattr(value, "keys"):
            _numpy_scalars_as_python(value)
        elif type(value).__module__ == "numpy" and hasattr(value, "item"):
            with config.ignore_type():  # the field's type was NumPy's
                config[name] = value.item()


def _check_model_flags(flag, config, argv):
    """Raises ValueError for an override of a field the config does not have: in the layout
    before config.model held the model's fields (`--config.model=B/16`, `--config.patch_size=2`:
    ml_collections would say that 'B/16' is no ConfigDict, or suggest batch_size), a misspelt
    name (ml_collections says only "--config: no_such_field"), or a field under a value."""
    model = config.get("model") if hasattr(config, "get") else None
    if not hasattr(config, "keys"):
        return
    for arg in argv[1:]:
        match = re.match(rf"^--?{re.escape(flag)}\.([\w.]+?)(?:=(.*))?$", arg)
        if match is None:
            continue
        path, value = match.group(1), match.group(2) or "VALUE"
        name = path.split(".")[0]
        if hasattr(model, "keys") and name == "model" and path == "model":
            raise ValueError(f"--{flag}.model={value}: {MODEL_FIELDS_MOVED}; give the variant as "
                             f"--{flag}.model.variant={value}")
        if hasattr(model, "keys") and name in model and name not in config:
            raise ValueError(f"--{flag}.{name}={value}: the model's fields are in config.model; "
                             f"use --{flag}.model.{name}={value}")
        _check_field_path(flag, config, path, value)


def _check_field_path(flag, config, path, value):
    """ValueError unless each part of the dotted `path` is a field of the (nested) config,
    suggesting the nearest field name."""
    node, walked = config, []
    for name in path.split("."):
        if not hasattr(node, "keys"):
            raise ValueError(f"--{flag}.{path}={value}: config.{'.'.join(walked)} is a value, "
                             "not a group of fields.")
        if name not in node:
            where = f"config.{'.'.join(walked)}" if walked else "the config"
            fields = flat_fields(config)
            nearest = _nearest(".".join(walked + [name]), fields)
            raise ValueError(f"--{flag}.{path}={value}: {where} has no field {name!r} (the "
                             f"nearest name is --{flag}.{nearest}; configs/common.py documents "
                             "every field)")
        node, walked = node[name], walked + [name]


def _nearest(path, fields):
    """The field of `fields` (dotted names) nearest to `path`: compared whole, and by its last
    part (so `patch_sise` finds `model.patch_size`)."""
    leaf = path.rsplit(".", 1)[-1]

    def closeness(field):
        return max(difflib.SequenceMatcher(None, path, field).ratio(),
                   difflib.SequenceMatcher(None, leaf, field.rsplit(".", 1)[-1]).ratio())

    return max(fields, key=closeness)


def loaded_config(flag_values, name="config"):
    """The config of `--name`, touched so that a file that failed to load is a UsageError
    now, not an `_ErrorConfig` object later. None when the flag was not given."""
    config = flag_values[name].value
    if config is None:
        return None
    try:
        getattr(config, "lock")  # any access raises the loading error
    except OSError as error:
        cause = error.__cause__ or error
        raise app.UsageError(f"--{name}: cannot load the config file "
                             f"({' '.join(str(cause).split())}).") from None
    return config


def flat_fields(config, prefix=""):
    """The fields of a config (ConfigDict or dict) by dotted name, as `--config.<name>` names
    them: {"seed": 0, "model.variant": "B/16", "model.hidden_size": None, ...}."""
    flat = {}
    for name in config:
        value = config[name]
        if hasattr(value, "keys"):
            flat.update(flat_fields(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat

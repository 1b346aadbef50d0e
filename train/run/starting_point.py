"""What a run starts from: `config.pretrained`, any checkpoint `keras_vit.from_pretrained`
reads (a hub name "hf:..." or "timm:...", a directory in transformers' or timm's layout, an
`.npz` with the spec `save_npz` writes beside it, a run's exported `model.keras`), or the
paper's published names and original `.npz` files, whose architecture is the config's.

A checkpoint that says its architecture gives it to the run: each `config.model` field left at
its default (the spec's) takes the checkpoint's value, and the run's config.json records it; a
field the user set that the checkpoint contradicts is one error naming both. The run keeps
its own image size (the position embeddings are resampled, as `from_pretrained` resamples them),
dropout rates, stochastic depth and how attention and the backward pass are computed. The head
starts from zeros for the dataset's classes (the paper's fine-tuning) unless
`config.pretrained_head` keeps the checkpoint's, which must then have those classes.

The command resolves it once, before the config's checks, and the engine that builds the model
loads it; the checkpoint is read once, for its architecture and its weights together:

    config, start = starting_point.resolve(config, run_config.saved(workdir))
    config_checks.check(config)
    ...
    start.load(objective, model, config)  # in the engine, unless the run resumes
"""

import dataclasses
import os

from absl import logging

from . import run_config

RULES = {
    "pretrained": ("any_str", None),  # "", a published name, a URL, a file or a directory: check
    "pretrained_head": ("bool", None),
}

# The model fields a run decides for itself, whatever it starts from.
RUN_FIELDS = ("variant", "dropout", "attention_dropout", "drop_path_rate",
              "dynamic_image_size", "dynamic_image_pad")
# What the variant name stands for: the fields a `variant` set by the user must agree on.
VARIANT_FIELDS = ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")


def has_architecture(pretrained):
    """Whether `pretrained` names a checkpoint that says its architecture (everything but ""
    and the paper's published names, URLs and `.npz` files without a spec beside them)."""
    from keras_vit.weights import checkpoint, hub

    if pretrained.startswith(tuple(hub.PREFIXES)) or pretrained.endswith(".keras"):
        return True
    if pretrained.endswith(".npz"):
        return "://" not in pretrained and checkpoint.read_spec(pretrained) is not None
    return os.path.isdir(pretrained)


def check(config, report):
    """Adds to `report` (train.run.config_checks) a `config.pretrained` that names nothing
    readable: neither a published name, a URL, an existing file or directory nor a hub name."""
    from keras_vit.weights import pretrained as published

    if not report.ok("pretrained", "model.variant") or not config.pretrained:
        return
    weights, variant = config.pretrained, config.model["variant"]
    if weights in published.PUBLISHED:
        if variant not in published.PUBLISHED[weights]:
            report.add("pretrained", f"config.pretrained={weights!r}",
                       f"no such checkpoint was published for model {variant!r}; it exists for "
                       f"{', '.join(sorted(published.PUBLISHED[weights]))}")
        return
    if names_something(weights):
        return
    report.add("pretrained", f"config.pretrained={weights!r}",
               "is neither an existing file or directory, a URL, a gs:// path, a hub name "
               "(hf:<owner>/<name>, timm:<architecture>.<tag>) nor a published name "
               f"({', '.join(sorted(published.PUBLISHED))}); use '' to train from scratch")


def names_something(weights):
    """Whether `weights` names a checkpoint a run can look for: a published name, a URL or
    gs:// path, a hub name or an existing file or directory (read when the run starts)."""
    from keras_vit.weights import hub
    from keras_vit.weights import pretrained as published

    return (weights in published.PUBLISHED or "://" in weights
            or weights.startswith(("augreg/", *hub.PREFIXES)) or os.path.exists(weights))


@dataclasses.dataclass(frozen=True)
class StartingPoint:
    """What a run starts from, resolved once (`resolve`) and handed to the engine.

    `source`: `config.pretrained` ("" from scratch). `spec` and `preprocessing`: the
    checkpoint's architecture and evaluation resize where it says them and was read (None for
    the paper's `.npz` files, whose architecture is the config's, and for a rerun, which took
    them from its config.json). `taken`: the fields the checkpoint gave the run's config, by
    name (`model.<field>` for the model's). The weights read with the architecture are held
    until `load` hands them to the model, once: no checkpoint is read twice, and none is held
    for the length of the run."""

    source: str = ""
    spec: object = None
    preprocessing: object = None
    taken: dict = dataclasses.field(default_factory=dict)
    _weights: list = dataclasses.field(default_factory=list, repr=False, compare=False)

    def load(self, objective, model, config):
        """Initialises `model`'s encoder from the starting point and logs one paragraph of
        what the run started from: the one place both engines start a fine-tuning run from.
        Returns `keras_vit.weights.checkpoint.load_npz`'s report."""
        import keras_vit

        from ..data import settings

        spec = self.spec
        if self._weights:
            arrays = self._weights.pop()  # read with the architecture, given up now
        elif has_architecture(self.source):  # a rerun before its first checkpoint
            found = read(self.source)
            arrays, spec = found.arrays, found.spec
        else:  # the paper's: the config's architecture
            arrays = keras_vit.weights.pretrained.resolve_weights(self.source, config.model.variant)
        encoder = objective.encoder(model)
        report = keras_vit.weights.checkpoint.load_npz(encoder, arrays,
                                               new_head=not config.pretrained_head)
        if config.pretrained_head and report["new_head"]:
            raise ValueError(
                f"config.pretrained_head=True keeps the checkpoint's head, but {self.source!r} "
                f"has no head for the dataset's {encoder.spec.num_classes} classes; set it to "
                "False for a new one.")
        logging.info("%s", describe(self.source, spec, report, encoder.spec,
                                    settings.eval_preprocessing(config)))
        return report


def resolve(config, saved=None):
    """`(the run's config, its StartingPoint)` for `config.pretrained`. A checkpoint that says
    its architecture is read once, here, for its architecture and its weights: the run's config
    is a new one (`config` is left as it is) whose `config.model` fields left at their defaults
    (the spec's) take the checkpoint's, as do the `eval_*` resize fields
    (train.data.settings.EVAL_RESIZE) left at theirs. `saved`: the config.json of the run in
    the workdir (train.run.run_config.saved), whose fields a rerun takes instead, reading no
    checkpoint. Raises ValueError naming the fix when the checkpoint cannot be read or
    contradicts a field the user set."""
    from ..data.settings import EVAL_RESIZE

    source = config.pretrained
    if not source or not has_architecture(source):
        return config, StartingPoint(source)  # the config's architecture
    if saved is not None and saved.get("pretrained") == source:
        theirs = saved["model"]  # a rerun: what the run took, without reading the checkpoint
        resize = {name: saved[name] for name in EVAL_RESIZE if name in saved}
        found = None
    else:
        found = read(source)
        _refuse_contradictions(config, found.spec)
        theirs = found.spec.to_dict()
        resize = {ours: getattr(found.preprocessing, field)
                  for ours, field in EVAL_RESIZE.items()}
    defaults = _model_defaults()
    taken = {f"model.{name}": value for name, value in theirs.items()
             if name in config.model and (name == "variant" or name not in RUN_FIELDS)
             and config.model[name] == defaults.get(name)
             and _normal(value) != _normal(config.model[name])}
    resize_defaults = _resize_defaults()
    taken.update({name: value for name, value in resize.items()
                  if config[name] == resize_defaults[name] and value != config[name]})
    start = StartingPoint(source, taken=taken) if found is None else StartingPoint(
        source, found.spec, found.preprocessing, taken, [found.arrays])
    return run_config.replaced(config, taken), start


def _model_defaults():
    """What `config.model` holds where the user set nothing: the spec's defaults."""
    from keras_vit.architecture.spec import DEFAULTS

    return DEFAULTS


def _resize_defaults():
    """What the `eval_*` resize fields hold where the user set nothing: keras_vit's own."""
    from keras_vit.preprocessing import EvalPreprocessing

    from ..data.settings import EVAL_RESIZE

    default = EvalPreprocessing()
    return {ours: getattr(default, field) for ours, field in EVAL_RESIZE.items()}


def read(pretrained, field="pretrained"):
    """`keras_vit.weights.hub.read_checkpoint` of `pretrained`, its errors as one ValueError naming
    `config.<field>` (the config field that gave it: a teacher is `distill_teacher`) and the
    fix."""
    from keras_vit.weights import checkpoint, hub, torch_layouts

    try:
        return hub.read_checkpoint(pretrained)
    except (OSError, ImportError, checkpoint.CheckpointError, torch_layouts.LayoutError) as error:
        raise ValueError(f"config.{field}={pretrained!r} cannot be read: {error}") from None


def _refuse_contradictions(config, spec):
    """A ValueError naming each field the user set (not at its default) to another value than
    the checkpoint `spec` has."""
    from keras_vit.architecture.spec import ViTConfig

    defaults = _model_defaults()
    theirs = spec.to_dict()
    clashes = [(name, value, theirs[name]) for name, value in config.model.items()
               if name in theirs and name not in RUN_FIELDS and value != defaults.get(name)
               and _normal(value) != _normal(theirs[name])]
    variant = config.model.variant
    if variant != defaults["variant"]:
        sizes = ViTConfig(variant=variant).to_dict()
        clashes += [(f"{name} (of variant {variant!r})", sizes[name], theirs[name])
                    for name in VARIANT_FIELDS
                    if config.model[name] == defaults.get(name)
                    and _normal(sizes[name]) != _normal(theirs[name])]
    if clashes:
        listed = "; ".join(f"config.model.{name}={ours!r} but the checkpoint has {their!r}"
                           for name, ours, their in clashes)
        raise ValueError(
            f"config.pretrained={config.pretrained!r} is another architecture than the config "
            f"asks for: {listed}. Leave those fields out (the checkpoint's are taken), or "
            "start from another checkpoint.")


def _normal(value):
    """Lists and tuples alike (config.json holds lists), a square pair as its side."""
    if isinstance(value, (list, tuple)):
        value = tuple(value)
        return value[0] if len(set(value)) == 1 else value
    return value


def describe(pretrained, spec, report, model_spec, eval_preprocessing=None):
    """One paragraph: the checkpoint, its architecture, what was resampled and what is new,
    and how evaluation resizes (where it is not keras_vit's own)."""
    from keras_vit.preprocessing import EvalPreprocessing

    architecture = ("" if spec is None else
                    f", a ViT of width {spec.hidden_size}, {spec.num_layers} blocks of "
                    f"{spec.num_heads} heads, {spec.patch_size}-pixel patches, classifier "
                    f"{spec.classifier!r}" + (f", {spec.num_register_tokens} registers"
                                              if spec.num_register_tokens else "")
                    + (", a distillation token" if spec.distillation_token else ""))
    resampled = (f" Resampled to the run's {model_spec.image_size[0]} px: "
                 f"{', '.join(report['resized'])}." if report["resized"] else "")
    head = (f" The head is new (zeros) for {model_spec.num_classes} classes."
            if report["new_head"] else " The head is the checkpoint's."
            if model_spec.include_top else "")
    evaluation = ""
    if eval_preprocessing not in (None, EvalPreprocessing()):
        evaluation = (f" Evaluated as it was: {eval_preprocessing.interpolation} resize, "
                      f"{eval_preprocessing.crop_mode} crop of {eval_preprocessing.crop_fraction}"
                      + (", antialiased" if eval_preprocessing.antialias else "") + ".")
    return (f"Started from {pretrained}{architecture}: {len(report['loaded'])} weights "
            f"loaded.{resampled}{head}{evaluation}")

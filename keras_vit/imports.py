"""How keras_vit's modules are found: each room's modules load on first use
(`modules_on_first_use`), and the module paths from before the rooms are still importable:
`keras_vit.checkpoint` is `keras_vit.weights.checkpoint` under its old name, the very same
module (not a copy), and so for each of `MOVED`, their submodules too
(`keras_vit.torch_layouts.common`). Code written against the old paths (`from
keras_vit.checkpoint import load_npz`, `import keras_vit.export`,
`keras_vit.hub.from_pretrained`) keeps working; the package's own code and docs use the rooms'.
"""

import importlib
import importlib.abc
import importlib.util
import sys

# Old path -> the module in its room, both under keras_vit.
MOVED = {
    "spec": "architecture.spec",
    "variants": "architecture.variants",
    "resnet": "layers.resnet",
    "checkpoint": "weights.checkpoint",
    "pretrained": "weights.pretrained",
    "npz_architecture": "weights.npz_architecture",
    "resample": "layers.resample",
    "hub": "weights.hub",
    "torch_layouts": "weights.torch_layouts",
    "export": "deploy.export",
    "serving": "deploy.serving",
    "plotting": "analysis.plotting",
    "flops": "analysis.flops",
}


def new_name(name):
    """The module in its room for an old `keras_vit.<path>[.<submodule>]`, else None."""
    package, _, rest = name.partition(".")
    head, _, tail = rest.partition(".")
    if package != "keras_vit" or head not in MOVED:
        return None
    return ".".join(["keras_vit", MOVED[head], *([tail] if tail else [])])


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as the module of its room, which then answers to both names."""

    def find_spec(self, name, path=None, target=None):
        if new_name(name) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        module = importlib.import_module(new_name(spec.name))  # keeps its own __name__
        spec.loader_state = module.__spec__  # which the import system is about to replace
        return module

    def exec_module(self, module):
        # Run already, under its own name: only its own spec is given back (for
        # importlib.reload and the tools that read __spec__).
        module.__spec__ = module.__spec__.loader_state


def install():
    """Lets the old paths be imported (once per process)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())  # before the path finder: no second copy


def modules_on_first_use(package):
    """A module `__getattr__` for the package named `package` that imports its submodule of
    the name asked for (PEP 562): `keras_vit.analysis.flops` loads when it is first used."""
    def __getattr__(name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{package}.{name}":
                raise  # a module it imports is missing: say which
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__

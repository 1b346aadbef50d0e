"""The rooms of the code import one way only (docs/contributing.md): each room of train/ from
the rooms below it, each room of keras_vit from the rooms below it and from none of train/;
the paths from before keras_vit's rooms are the same modules, and no code of the project
imports through them."""

import ast
import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each room of train/ and the rooms it may import from (the commands, train/*.py, may import
# from all of them).
ROOMS = {
    "console": set(),
    "data": {"console"},
    "run": {"data", "console"},
    "engines": {"run", "data", "console"},
    "studies": {"run", "data", "console"},
}


def _imported_modules(path, package):
    """The absolute names of the modules `path` (a module of `package`) imports."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return found


def _room(module):
    """The room of train/ that `module` lies in ("" for the commands), or None."""
    parts = module.split(".")
    if parts[0] != "train":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else ""


def test_every_folder_of_train_is_a_room():
    folders = {os.path.basename(os.path.dirname(path))
               for path in glob.glob(os.path.join(REPO, "train", "*", "__init__.py"))}
    assert folders == set(ROOMS)


def test_rooms_import_only_from_the_rooms_below():
    wrong = []
    for room, allowed in ROOMS.items():
        for path in glob.glob(os.path.join(REPO, "train", room, "**", "*.py"), recursive=True):
            module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
            package = module.rsplit(".", 1)[0]  # (of an __init__.py too: its package)
            for imported in _imported_modules(path, package):
                target = _room(imported)
                if target is not None and target != room and target not in allowed:
                    wrong.append(f"{module} imports {imported}")
    assert not wrong, "imports that run back up:\n" + "\n".join(sorted(set(wrong)))


# Each room of keras_vit (a folder, or the module files that make the model) and the rooms it
# may import from; `builders` and the package's face, keras_vit/__init__.py, from all of them.
LIBRARY_ROOMS = {
    "imports": set(), "fileio": set(), "preprocessing": set(),
    "architecture": {"imports"},
    "layers": {"architecture", "imports"},
    "model": {"architecture", "layers", "preprocessing", "fileio", "imports"},
    "weights": {"architecture", "layers", "model", "native", "preprocessing", "fileio",
                "imports"},
    "deploy": {"architecture", "layers", "model", "native", "preprocessing", "fileio",
               "imports"},
    "analysis": {"architecture", "layers", "model", "native", "preprocessing", "fileio",
                 "imports"},
    "native": {"architecture", "layers", "model", "preprocessing", "imports"},
    "builders": {"architecture", "model", "weights"},
}
MODEL_MODULES = ("model", "lora", "intermediates", "masked_patches", "scanned_blocks")


def _library_room(module):
    """The room of keras_vit that `module` lies in ("" for the package's face), or None."""
    parts = module.split(".")
    if parts[0] != "keras_vit":
        return None
    if len(parts) == 1:
        return ""
    return "model" if parts[1] in MODEL_MODULES else parts[1]


def _library_modules():
    for path in glob.glob(os.path.join(REPO, "keras_vit", "**", "*.py"), recursive=True):
        module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        package = module if module.endswith("__init__") else module.rsplit(".", 1)[0]
        yield path, module.removesuffix(".__init__"), package.removesuffix(".__init__")


def test_the_library_imports_nothing_of_the_trainer():
    wrong = [f"{path} imports {module}" for path, _, package in _library_modules()
             for module in _imported_modules(path, package)
             if module.split(".")[0] in ("train", "configs")]
    assert not wrong


def test_the_librarys_rooms_import_only_from_the_rooms_below():
    wrong = []
    for path, module, package in _library_modules():
        room = _library_room(module)
        if room == "":
            continue
        assert room in LIBRARY_ROOMS, f"{module} is in no room of LIBRARY_ROOMS"
        for imported in _imported_modules(path, package):
            target = _library_room(imported)
            if target not in (None, "", room) and target not in LIBRARY_ROOMS[room]:
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "imports that run back up:\n" + "\n".join(sorted(set(wrong)))


def test_the_paths_from_before_the_rooms_are_the_same_modules():
    """`keras_vit.checkpoint` and the others of imports.MOVED import as the modules of their
    rooms (their submodules too), not as copies; the project's own code imports none of
    them."""
    import importlib

    from keras_vit import imports
    for old, new in imports.MOVED.items():
        assert importlib.import_module(f"keras_vit.{old}") is importlib.import_module(
            f"keras_vit.{new}"), old
    from keras_vit.checkpoint import load_npz
    from keras_vit.torch_layouts.common import LayoutError
    from keras_vit.weights import checkpoint
    from keras_vit.weights.torch_layouts import common
    assert load_npz is checkpoint.load_npz and LayoutError is common.LayoutError
    assert checkpoint.__spec__.name == "keras_vit.weights.checkpoint"
    old_paths = tuple(f"keras_vit.{old}" for old in imports.MOVED)
    wrong = [f"{path} imports {module}"
             for folder in ("keras_vit", "train", "benchmarks", "configs")
             for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True)
             for module in _imported_modules(path, os.path.relpath(
                 os.path.dirname(path), REPO).replace(os.sep, "."))
             if module in old_paths or module.startswith(tuple(p + "." for p in old_paths))]
    assert not wrong, "imports through an old path:\n" + "\n".join(wrong)


def test_a_checkpoint_family_is_one_module_in_the_registry():
    """Each module of keras_vit/torch_layouts but the shared ones is one family (its `FAMILY`,
    listed once in the registry, `FAMILIES`) and imports no other family; no two families of a
    library read the same class unless the later one says which of its files it reads."""
    import dataclasses

    from keras_vit.weights import torch_layouts
    from keras_vit.weights.torch_layouts.family import Family

    shared = {"__init__", "common", "family", "transformers_common", "timm_common"}
    folder = os.path.join(REPO, "keras_vit", "weights", "torch_layouts")
    names = sorted(os.path.basename(path)[:-3] for path in glob.glob(os.path.join(folder, "*.py")))
    registered = [family for families in torch_layouts.FAMILIES.values() for family in families]
    modules = {name: __import__(f"keras_vit.weights.torch_layouts.{name}", fromlist=["FAMILY"])
               for name in names if name not in shared}
    assert sorted(id(module.FAMILY) for module in modules.values()) == sorted(
        id(family) for family in registered)
    for name, module in modules.items():
        assert module.FAMILY in torch_layouts.FAMILIES[module.FAMILY.library], name
        others = [imported for imported in _imported_modules(
            os.path.join(folder, name + ".py"), "keras_vit.weights.torch_layouts")
            if imported.split(".")[-1] in set(modules) - {name}]
        assert not others, f"{name} imports {others}"
    every = {field.name: field.default for field in dataclasses.fields(Family)}["reads"]
    for families in torch_layouts.FAMILIES.values():
        for index, family in enumerate(families):
            for earlier in families[:index]:
                assert family.reads is not every or not set(family.classes) & set(
                    earlier.classes), (family.name, earlier.name)
            assert family.weight_pairs or not family.config_for, family.name


def test_the_tests_are_arranged_like_the_rooms_they_test():
    """tests/library/<room> for each room of keras_vit, tests/training/<room> for each room of
    train/; the tests that cross rooms (the docs, the package, this file) at the top."""
    for tests, code, rooms in (("library", "keras_vit", LIBRARY_ROOMS),
                               ("training", "train", ROOMS)):
        folders = {os.path.basename(path) for path in glob.glob(
            os.path.join(REPO, "tests", tests, "*")) if os.path.isdir(path)} - {"__pycache__"}
        assert folders, tests
        for folder in folders:
            assert folder in rooms and os.path.isdir(os.path.join(REPO, code, folder)), (
                f"tests/{tests}/{folder} names no room of {code}/")

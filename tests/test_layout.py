"""The rooms of the code import one way only (docs/contributing.md): each room of train/ from
the rooms below it, and keras_vit from none of train/."""

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


def test_the_library_imports_nothing_of_the_trainer():
    wrong = [f"{path} imports {module}"
             for path in glob.glob(os.path.join(REPO, "keras_vit", "*.py"))
             for module in _imported_modules(path, "keras_vit")
             if module.split(".")[0] in ("train", "configs")]
    assert not wrong


def test_a_checkpoint_family_is_one_module_in_the_registry():
    """Each module of keras_vit/torch_layouts but the shared ones is one family (its `FAMILY`,
    listed once in the registry, `FAMILIES`) and imports no other family; no two families of a
    library read the same class unless the later one says which of its files it reads."""
    import dataclasses

    from keras_vit import torch_layouts
    from keras_vit.torch_layouts.family import Family

    shared = {"__init__", "common", "family", "transformers_common", "timm_common"}
    folder = os.path.join(REPO, "keras_vit", "torch_layouts")
    names = sorted(os.path.basename(path)[:-3] for path in glob.glob(os.path.join(folder, "*.py")))
    registered = [family for families in torch_layouts.FAMILIES.values() for family in families]
    modules = {name: __import__(f"keras_vit.torch_layouts.{name}", fromlist=["FAMILY"])
               for name in names if name not in shared}
    assert sorted(id(module.FAMILY) for module in modules.values()) == sorted(
        id(family) for family in registered)
    for name, module in modules.items():
        assert module.FAMILY in torch_layouts.FAMILIES[module.FAMILY.library], name
        others = [imported for imported in _imported_modules(
            os.path.join(folder, name + ".py"), "keras_vit.torch_layouts")
            if imported.split(".")[-1] in set(modules) - {name}]
        assert not others, f"{name} imports {others}"
    every = {field.name: field.default for field in dataclasses.fields(Family)}["reads"]
    for families in torch_layouts.FAMILIES.values():
        for index, family in enumerate(families):
            for earlier in families[:index]:
                assert family.reads is not every or not set(family.classes) & set(
                    earlier.classes), (family.name, earlier.name)
            assert family.weight_pairs or not family.config_for, family.name

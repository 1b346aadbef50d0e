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

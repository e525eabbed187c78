"""The layering rules, checked on the source: the core is pure, every import points down.

Layers, bottom to top (a module may import its own layer and the ones below):

0. ``stream``            the method: stdlib, numpy and text-processing packages only, no file I/O
1. ``workers.settings``, ``workers.adapters``   one adapter per outside system
2. ``workers.service``   the Faust app and the roles
3. ``workers.commands``, ``workers.dev``        the CLI, evaluate, demo; dev tools

``bench/`` and ``tests/`` sit on top; ``bench/`` never imports ``tests/``.  Function-local
imports count too (they may keep start-up cheap, never dodge a cycle).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What the core may import besides itself and the standard library.
CORE_ALLOWED = {
    "numpy",
    "regex",  # Unicode classes for hashtags
    "nltk",  # TweetTokenizer
    "py3langid",  # language id
    "sklearn",  # only sklearn.feature_extraction.text's stop-word list (checked below)
}
CORE_STDLIB_BANNED = {"subprocess", "socket", "ctypes", "urllib", "http", "shutil", "tempfile", "threading"}
#: Calls that read or write files.
FILE_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "rmtree"}

LAYERS = [
    ("stream", 0),
    ("workers", 1),  # the package itself (its __init__)
    ("workers.settings", 1),
    ("workers.adapters", 1),
    ("workers.service", 2),
    ("workers.commands", 3),
    ("workers.dev", 3),
    ("bench", 4),
    ("tests", 5),
]


def layer_of(module: str) -> int | None:
    """The layer of the longest matching prefix."""
    found: tuple[int, int] | None = None
    for prefix, layer in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (
            found is None or len(prefix) > found[0]
        ):
            found = (len(prefix), layer)
    return None if found is None else found[1]


def modules() -> Iterator[tuple[str, Path]]:
    for package in ("stream", "workers", "bench", "tests"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def imports(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # `from workers import service` imports workers.service
                yield node.lineno, f"{node.module}.{alias.name}"


def test_the_core_imports_no_outside_system() -> None:
    bad = []
    stdlib = sys.stdlib_module_names
    for name, path in modules():
        if not name.startswith("stream"):
            continue
        for line, module in imports(path):
            top = module.split(".")[0]
            if top == "stream" or (top in stdlib and top not in CORE_STDLIB_BANNED):
                continue
            if top == "sklearn" and module.startswith("sklearn.feature_extraction.text"):
                continue
            if top in CORE_ALLOWED - {"sklearn"}:
                continue
            if top == "sklearn" and module == "sklearn.feature_extraction":  # `from x import text`
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "the core must stay free of outside systems:\n" + "\n".join(bad)


def test_the_core_touches_no_file() -> None:
    bad = []
    for name, path in modules():
        if not name.startswith("stream"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fn = node.func
                called = (
                    fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                )
                if called in FILE_CALLS:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {called}()")
    assert not bad, "files are read and written by adapters, not the core:\n" + "\n".join(bad)


def test_every_import_points_down() -> None:
    bad = []
    for name, path in modules():
        own = layer_of(name)
        assert own is not None, name
        for line, module in imports(path):
            target = layer_of(module)
            if target is not None and target > own:
                bad.append(
                    f"{path.relative_to(ROOT)}:{line} ({name}, layer {own}) imports {module} (layer {target})"
                )
    assert not bad, "imports must point down:\n" + "\n".join(bad)


#: The roles: each is started by the app (workers/service/app.py) and shares what it needs with
#: the others through modules below it (runtime, records, stores), never through another role.
ROLES = {"workers.service.embed", "workers.service.index", "workers.service.score"}


def test_no_role_imports_another() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for name, path in modules()
        if name.startswith("workers.service.") and name != "workers.service.app"
        for line, module in imports(path)
        if any(module == role or module.startswith(role + ".") for role in ROLES - {name})
        or (module == "workers.service" and name not in ROLES)
    ]
    assert not bad, "a role (or a module the roles share) imports a role:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", ["stream", "workers"])
def test_every_package_is_importable_and_has_doctests_collected(package: str) -> None:
    # pytest's testpaths include both packages and --doctest-modules runs their examples.
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"][
        "ini_options"
    ]
    assert package in config["testpaths"] and "--doctest-modules" in config["addopts"]


def test_the_architecture_page_names_every_module() -> None:
    """A newcomer finds each module of stream/ and workers/ in the docs' module map
    (docs/architecture.md: the code block under "Every module" that starts with ``stream/``)."""
    readme = (ROOT / "docs" / "architecture.md").read_text()
    start = readme.index("\nstream/ ", readme.index("## Every module"))
    block = readme[start : readme.index("```", start)]
    missing = [
        str(path.relative_to(ROOT))
        for package in ("stream", "workers")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__init__.py" and path.name not in block and path.stem not in block
    ]
    assert not missing, f"modules missing from docs/architecture.md's module map: {missing}"

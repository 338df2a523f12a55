"""docs/ARCHITECTURE.md's layers, checked on every module's imports (function-local ones included):
runtime -> backends/passes/frontend -> ir, settings.py (the EMBER_* switches) imports nothing
of ember and every layer may import it, files.py only settings (cache_store.py only files),
and no module reaches itself again through the modules it imports."""

from __future__ import annotations

import ast
import graphlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]

# what each layer may import; runtime, the CLI and the public API may import everything
ALLOWED = {
    "settings": set(),  # the EMBER_* environment switches, each declared once
    "files": {"settings"},
    "cache_store": {"files", "settings"},  # sealed cache entries, on files' atomic writes
    "ir": {"ir", "settings"},
    "frontend": {"frontend", "ir", "files", "settings"},
    "passes": {"passes", "ir", "files", "settings"},
    "backends": {"backends", "ir", "files", "cache_store", "settings"},
}
# imports that close a cycle, each with why it is still there; the test below fails once
# one is gone, so that it is struck from here too
KNOWN_CYCLES = {
    ("ember.ir.core", "ember.ir.printer"):
        "Graph.__str__ prints with the printer, which imports core (function-local import)",
}


def _modules() -> dict[str, Path]:
    """Every module of the packages pyproject.toml installs, by dotted name."""
    out = {}
    for package in PACKAGES:
        for path in ROOT.joinpath(*package.split(".")[1:]).glob("*.py"):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


MODULES = _modules()


def imports(name: str, source: str, modules=MODULES) -> set[str]:
    """The modules of ember that module `name` imports anywhere in `source`; a name taken
    from a package that is not one of its submodules counts as the package."""
    is_package = modules.get(name, Path()).name == "__init__.py"
    package = name.split(".") if is_package else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[:len(package) - node.level + 1]
                base = ".".join(up + [base] if base else up)
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names)
    return out & modules.keys()


IMPORTS = {name: imports(name, path.read_text()) for name, path in MODULES.items()}


def _layer(name: str) -> str:
    return name.split(".")[1] if "." in name else name


def test_the_graph_resolves_relative_absolute_and_local_imports():
    source = ("from .kernels import scalar as S\nfrom .machine.host import Isa\n"
              "from ...ir import Graph\n"
              "import ember.files\nimport numpy\n"
              "def f():\n    from ..errors import CodegenError\n")
    assert imports("ember.backends.cpu.codegen", source) == {
        "ember.backends.cpu.kernels.scalar", "ember.backends.cpu.machine.host", "ember.ir",
        "ember.files", "ember.backends.errors"}


def test_every_layer_imports_only_the_layers_below_it():
    wrong = sorted(f"{m} imports {t}" for m, targets in IMPORTS.items()
                   if _layer(m) in ALLOWED for t in targets
                   if _layer(t) not in ALLOWED[_layer(m)])
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", [
    "ember.ir", "ember.frontend", "ember.passes", "ember.backends.interpreter",
    "ember.backends.cpu", "ember.backends.cuda", "ember.runtime", "ember"])
def test_no_import_cycle(package):
    """Inside each package (a module that works only because of import order, or a
    function-local import that dodges a cycle, hides a layer upside down), and in all."""
    inside = {m for m in MODULES if m == package or m.startswith(package + ".")}
    graph = {m: {t for t in IMPORTS[m] & inside if (m, t) not in KNOWN_CYCLES} for m in inside}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(reversed(e.args[1]))}")


@pytest.mark.parametrize("edge", sorted(KNOWN_CYCLES))
def test_a_known_cycle_is_still_there(edge):
    assert edge[1] in IMPORTS[edge[0]], f"{edge} no longer imported: drop it from KNOWN_CYCLES"

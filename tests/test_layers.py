"""Imports run downward: no module of dpbench imports from a layer above its own.

The layer map is documented in docs/architecture.md; a new subpackage or top-level module
must be added to ``LAYERS`` (the test fails until it is), so its place is a decision.
Imports inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dpbench"

#: layer of each subpackage / top-level module of dpbench (higher may import lower or equal)
LAYERS: dict[str, int] = {
    # 0: foundations, importing nothing of dpbench but each other
    "errors": 0, "utils": 0, "privacy": 0, "registry": 0,
    # 1: the building blocks a run is made of
    "methods": 1, "models": 1, "data": 1, "tasks": 1,
    # 2: the loop, and the typed settings it runs under
    "training": 2, "config": 2,
    # 3: one run assembled from a config, and the sinks that record it
    "experiment": 3, "logging": 3,
    # 4: entry points and what reads their results
    "cli": 4, "__main__": 4, "report": 4, "analysis": 4, "audit": 4, "bench": 4,
    "bench_processes": 4,
    "tune": 4,
}


def _unit(module: str) -> str:
    """Return the layer unit of a dotted module name: its subpackage or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _dpbench_imports(source: str, module: str) -> list[tuple[int, str]]:
    """Return (line, module) for every dpbench import in ``source`` (absolute or relative)."""
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return [(line, name) for line, name in found if name.split(".")[0] == "dpbench"]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(p)) for p in MODULES}
    missing = sorted(units - set(LAYERS) - {"__init__"})
    assert not missing, f"add {missing} to LAYERS in tests/test_layers.py (docs/architecture.md)"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_upward_import(path):
    module = _module_name(path)
    source = _unit(module)
    if source == "__init__":
        return  # dpbench/__init__.py
    upward = [f"line {line}: {name} (layer {LAYERS.get(_unit(name))})"
              for line, name in _dpbench_imports(path.read_text(), module)
              if LAYERS.get(_unit(name), -1) > LAYERS.get(source, -1)]
    assert not upward, (f"{path.relative_to(REPO)} (layer {LAYERS.get(source)}, {source}) "
                        f"imports upward: {upward}")


def test_the_check_sees_an_upward_import():
    """The parser finds function-level and relative imports (so the test above can fail)."""
    source = "def f():\n    from dpbench.training.loop import Trainer\nfrom ..cli import main\n"
    names = [name for _, name in _dpbench_imports(source, "dpbench.methods.probe")]
    assert sorted(names) == ["dpbench.cli", "dpbench.training.loop"]
    assert all(LAYERS[_unit(n)] > LAYERS["methods"] for n in names)


def test_scripts_never_import_tests():
    offenders = []
    for path in sorted((REPO / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert not offenders, f"scripts import from tests/: {offenders}"

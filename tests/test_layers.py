"""Imports run downward: no module of dpbench imports from a tier above its own.

The tiers, bottom to top (docs/architecture.md lists the same):

0. foundations: ``errors``, ``utils``, ``privacy``, ``registry``. Exceptions, small helpers,
   the accountant and the ledger, name registries; they import nothing of dpbench but each
   other.
1. components: ``methods`` (and ``method_settings``, their settings dataclasses without torch),
   ``models``, ``data``, ``tasks``. What a run is made of.
2. training: ``training`` and ``config``. The loop (the release, the engines, checkpoints)
   and the typed settings it runs under (``config`` registers every method's settings
   schema, so it sits above the methods, and the loop reads it).
3. one run: ``spec`` (a composed config validated in one pass into a typed ``RunSpec``),
   ``experiment`` (the run built from a ``RunSpec`` and trained) and ``logging`` (the loop's
   sinks, and the record they write). ``tune.choices`` (the stored choices file a run applies
   with ``tuned=FILE``) sits here too: the spec applies it.
4. readers: ``analysis``. What reads results.json files: the one reader, tables, statistics,
   plots, claims, steps-to-target and ``dpbench-report`` (``analysis.report``). They never
   train, and they import no runner.
5. runners and the command line: ``cli``, ``__main__``, ``tune``, ``audit``, ``bench``,
   ``bench_processes``, ``hpo`` and ``runners`` (what trains or runs sweeps and then reads:
   ``runners.reproduce``, ``runners.overhead``). The console scripts' modules and what they
   share; they may import each other, and a runner uses the readers to print its tables.

A tier is given per subpackage or top-level module, or per module where a subpackage spans
two tiers (the most specific name counts). A new subpackage or top-level module must be added
to ``TIERS`` (the test fails until it is), so its place is a decision. Imports inside
functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dpbench"

FOUNDATIONS, COMPONENTS, TRAINING, ONE_RUN, READERS, RUNNERS = range(6)

#: tier of each subpackage / top-level module of dpbench, or of one module of a subpackage
#: (a module may import from its own tier or any tier below)
TIERS: dict[str, int] = {
    "errors": FOUNDATIONS, "utils": FOUNDATIONS, "privacy": FOUNDATIONS,
    "registry": FOUNDATIONS,
    "methods": COMPONENTS, "method_settings": COMPONENTS, "models": COMPONENTS,
    "data": COMPONENTS, "tasks": COMPONENTS,
    "training": TRAINING, "config": TRAINING,
    "spec": ONE_RUN, "experiment": ONE_RUN, "logging": ONE_RUN, "tune.choices": ONE_RUN,
    "analysis": READERS,
    "cli": RUNNERS, "__main__": RUNNERS, "tune": RUNNERS, "audit": RUNNERS, "bench": RUNNERS,
    "bench_steps": RUNNERS, "bench_presets": RUNNERS, "bench_processes": RUNNERS,
    "bench_seeds": RUNNERS,
    "bench_startup": RUNNERS,
    "bench_users": RUNNERS,
    "runners": RUNNERS,
}


def _unit(module: str) -> str:
    """Return the unit of a dotted module name: its subpackage or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _tier(module: str) -> int | None:
    """Return the tier of a dotted dpbench module: that of the most specific name in TIERS
    (``training.loop`` before ``training``); None if its unit has none."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in TIERS:
            return TIERS[".".join(parts[:n])]
    return None


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


def test_every_unit_has_a_tier():
    units = {_unit(_module_name(p)) for p in MODULES}
    missing = sorted(units - set(TIERS) - {"__init__"})
    assert not missing, f"add {missing} to TIERS in tests/test_layers.py (docs/architecture.md)"
    named = {name for name in TIERS if "." in name}  # module-level entries name real modules
    assert named <= {_module_name(p).split(".", 1)[1] for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_upward_import(path):
    module = _module_name(path)
    if _unit(module) == "__init__":
        return  # dpbench/__init__.py
    tier = _tier(module)
    upward = [f"line {line}: {name} (tier {_tier(name)})"
              for line, name in _dpbench_imports(path.read_text(), module)
              if (_tier(name) if _tier(name) is not None else -1) > (
                  tier if tier is not None else -1)]
    assert not upward, (f"{path.relative_to(REPO)} (tier {tier}) imports upward: {upward}")


def test_the_check_sees_an_upward_import():
    """The parser finds function-level and relative imports (so the test above can fail)."""
    source = "def f():\n    from dpbench.training.loop import Trainer\nfrom ..cli import main\n"
    names = [name for _, name in _dpbench_imports(source, "dpbench.methods.probe")]
    assert sorted(names) == ["dpbench.cli", "dpbench.training.loop"]
    assert all(_tier(n) > TIERS["methods"] for n in names)


def test_readers_sit_below_the_runners():
    """A reader importing a runner (the command line, a trainer) fails the check above."""
    assert _tier("dpbench.analysis.report") == _tier("dpbench.analysis.claims") == READERS
    assert _tier("dpbench.runners.reproduce") == _tier("dpbench.cli") == RUNNERS
    assert _tier("dpbench.logging.records") < READERS


def test_scripts_never_import_tests():
    offenders = []
    for path in sorted((REPO / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert not offenders, f"scripts import from tests/: {offenders}"


def _import_graph() -> dict[str, set[str]]:
    """Return module -> the dpbench modules it imports (any import, at any depth of the file;
    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module)."""
    modules = {_module_name(p).removesuffix(".__init__"): p for p in MODULES}

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            edges |= {known(n) for n in names if n.split(".")[0] == "dpbench"}
        # a package's own parents are imported first anyway: not an edge of a circle
        graph[module] = {e for e in edges if e and e != module and not module.startswith(e + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No two modules import each other, directly or through others (imports inside functions
    and under TYPE_CHECKING count)."""
    assert _circles(_import_graph()) == []


def test_the_circle_check_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

"""The import graph is one-directional: no cycle among the dfl.data modules (imports inside functions count:
they are how a cycle hides), each of them imports first in a fresh interpreter, and `topologies` knows nothing
of dfl."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at top level or inside a function (`from a import b` counts as a.b when
    a.b is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    files = sorted((ROOT / package.replace(".", "/")).glob("*.py"))
    modules = {_module(f): f for f in files}
    return {name: _imports(f) & set(modules) - {name} for name, f in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_dfl_data_has_no_import_cycle():
    graph = _graph("dfl.data")
    assert {"dfl.data.dataset", "dfl.data.types", "dfl.data.cifar", "dfl.data.partitioners"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # the loaders know nothing of the registry that names them; only the package imports the package
    assert all("dfl.data.dataset" not in graph[m] for m in ("dfl.data.cifar", "dfl.data.idx", "dfl.data.digits",
                                                            "dfl.data.mnist1d", "dfl.data.synthetic"))
    assert [m for m, deps in graph.items() if "dfl.data" in deps] == []


def test_registries_and_signatures_import_no_cli_or_engine():
    for module in ("dfl.registry", "dfl.signatures", "dfl.topologies"):
        deps = _imports(ROOT / (module.replace(".", "/") + ".py"))
        assert not deps & {"dfl.engine.runner", "dfl.cli", "dfl.cli.listing", "dfl.config", "torch"}, module


def test_topologies_knows_nothing_of_dfl():
    for path in sorted((ROOT / "topologies").glob("*.py")):
        assert not [m for m in _imports(path) if m == "dfl" or m.startswith("dfl.")], path.name


def test_each_dfl_data_module_imports_first_in_a_fresh_interpreter():
    modules = sorted(_graph("dfl.data"))
    # one interpreter (torch imported once), dfl forgotten before each module: each is imported first in turn
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    for loaded in [m for m in sys.modules if m == 'dfl' or m.startswith('dfl.')]:\n"
            "        del sys.modules[loaded]\n"
            "    importlib.import_module(name)\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]

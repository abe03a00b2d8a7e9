"""What import-linter (`lint-imports`, contracts in pyproject.toml) cannot say about the import graph: no cycle
between a package and its own modules (its contracts compare siblings only), every dfl module imports first in a
fresh interpreter, `import dfl` stays light, and every dotted name the docs write resolves after `import dfl`."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _graph() -> nx.DiGraph:
    """dfl and topologies as grimp sees them: imports inside functions count (they are how a cycle hides)."""
    graph = grimp.build_graph("dfl", "topologies", cache_dir=None)
    return nx.DiGraph([(m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)])


def test_no_module_is_on_an_import_cycle():
    cycles = [sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1]
    assert cycles == [], cycles


@pytest.mark.slow
def test_each_dfl_module_imports_first_in_a_fresh_interpreter():
    modules = sorted(m for m in _graph().nodes if m.startswith("dfl.") and not m.endswith("__main__"))
    assert len(modules) > 80
    # one interpreter (torch imported once), dfl forgotten before each module: each is imported first in turn
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    for loaded in [m for m in sys.modules if m == 'dfl' or m.startswith('dfl.')]:\n"
            "        del sys.modules[loaded]\n"
            "    importlib.import_module(name)\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_import_dfl_is_light():
    code = ("import sys, dfl; dfl.Config()\n"
            "print(sorted(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:]


# a dotted name in prose or code: dfl.word(.word)*, not part of a path, a file name or a longer word
DOTTED = re.compile(r"(?<![\w/.-])dfl(?:\.[A-Za-z_]\w*)+")
# plug-in entry-point groups (`[project.entry-points."dfl.datasets"]`) are names of groups, not of objects
ENTRY_POINT_GROUPS = {"dfl.algorithms", "dfl.models", "dfl.datasets", "dfl.partitions", "dfl.topologies", "dfl.loggers",
                      "dfl.attacks", "dfl.aggregators", "dfl.compressors"}
# a ```python notest block shows code that is not in dfl (a worked example of a module one would add)
HYPOTHETICAL = re.compile(r"```python notest\n.*?```", re.S)
FILE_SUFFIXES = {"py", "md", "toml", "json", "jsonl", "png", "pt", "txt", "yml", "yaml", "sh", "csv"}


def documented_names() -> dict[str, str]:
    """Every `dfl.<...>` written in README.md and docs/**/*.md -> the first file that writes it."""
    names: dict[str, str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if not path.is_file():
            continue
        for name in DOTTED.findall(HYPOTHETICAL.sub("", path.read_text())):
            if name.rsplit(".", 1)[1] not in FILE_SUFFIXES and name not in ENTRY_POINT_GROUPS:
                names.setdefault(name, str(path.relative_to(ROOT)))
    return names


def test_the_entry_point_groups_are_the_registries():
    from dfl import algorithms, data, graphs, loggers, models
    from dfl.network.byzantine_settings import AGGREGATORS, ATTACKS
    from dfl.network.settings import COMPRESSORS

    groups = {r.group for r in (algorithms.ALGORITHMS, models.MODELS, data.DATASETS, data.PARTITIONS,
                                graphs.TOPOLOGIES, loggers.LOGGERS, ATTACKS, AGGREGATORS, COMPRESSORS)}
    assert groups == ENTRY_POINT_GROUPS


def test_the_name_collector_finds_dotted_names():
    assert DOTTED.findall("see `dfl.data.FederatedData.from_arrays(...)` and dfl/run.py, not mydfl.x") == [
        "dfl.data.FederatedData.from_arrays"]


@pytest.mark.slow
def test_every_documented_dotted_name_resolves_after_import_dfl():
    names = documented_names()
    assert "dfl.run" in names or len(names) > 5  # the README names the API
    code = ("import json, sys, dfl\n"
            "missing = []\n"
            "for name in json.loads(sys.argv[1]):\n"
            "    obj = dfl\n"
            "    try:\n"
            "        for part in name.split('.')[1:]:\n"
            "            obj = getattr(obj, part)\n"
            "    except AttributeError as exc:\n"
            "        missing.append(f'{name}: {exc}')\n"
            "print('\\n'.join(missing))\n")
    import json

    proc = subprocess.run([sys.executable, "-c", code, json.dumps(sorted(names))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    missing = [line for line in proc.stdout.splitlines() if line]
    assert missing == [], "\n".join(f"{m} ({names[m.split(':')[0]]})" for m in missing)


def _private_imports(path: Path, module: str) -> list[str]:
    """`module.name` for each `_name` (not a dunder) that the file `path` of `module` imports from another dfl
    module; relative imports are resolved, and a package's `__init__` counts as a module of its own."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            source = ".".join(parts + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source != module and (source == "dfl" or source.startswith("dfl.")):
            found += [f"{source}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.endswith("__")]
    return found


def test_no_private_name_crosses_a_module_boundary():
    crossings = []
    for path in sorted((ROOT / "dfl").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        crossings += [f"{path.relative_to(ROOT)}: {name}" for name in _private_imports(path, module)]
    assert crossings == [], "make these public (and document them) or move them where they are used: " + \
        ", ".join(crossings)


def test_the_private_import_check_sees_relative_and_package_imports(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("from dfl.report.tables import _write_csv\nfrom .spectral import _fmt, __all__\n")
    assert _private_imports(init, "dfl.report") == ["dfl.report.tables._write_csv", "dfl.report.spectral._fmt"]
    own = tmp_path / "module.py"
    own.write_text("from dfl.report.tables import _write_csv\nfrom . import _helper\nfrom ..files import _x\n")
    assert _private_imports(own, "dfl.report.tables") == ["dfl.report._helper", "dfl.files._x"]

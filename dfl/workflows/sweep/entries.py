"""SWEEP/sweep.json: the state of each run of a sweep, written and read back.

`{"runs": [{"name", "dir", "overrides", "status", "error", ...}]}`, one entry per run, rewritten (atomically) after each
run, and read back checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfl.engine.results import to_json
from dfl.errors import FileReadError
from dfl.files import atomic_write_bytes, read_json


def write_entries(out: Path, entries: list[dict[str, Any]]) -> None:
    """Write `entries` as SWEEP/sweep.json (atomically: a sweep killed mid-write leaves the previous file)."""
    atomic_write_bytes(out / "sweep.json", to_json({"runs": entries}).encode())


def read_entries(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The run entries of SWEEP/sweep.json.

    Raises:
        FileReadError: one line naming the file, when it cannot be read or is not {"runs": [{"name": ...,
            "dir": "runs/<name>", ...}, ...]}.
    """
    path = Path(sweep_dir) / "sweep.json"
    runs = read_json(path, "sweep file").get("runs")
    if not isinstance(runs, list):
        raise FileReadError(path, f"holds no list of runs (its \"runs\" is {runs!r:.40}); a sweep writes "
                                  "{\"runs\": [...]}", "sweep file")
    for i, entry in enumerate(runs):
        problem = _entry_problem(entry)
        if problem:
            raise FileReadError(path, f"runs[{i}] {problem}", "sweep file")
    return runs


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one sweep.json entry (None when nothing is).

    A run entry needs a name and a `dir` inside the sweep directory.
    """
    if not isinstance(entry, dict):
        return f"is {type(entry).__name__}, not a run entry {{\"name\": ..., \"dir\": ...}}"
    name, where = entry.get("name"), entry.get("dir")
    if not isinstance(name, str) or not name:
        return f"has name = {name!r:.40}, expected the run's name"
    if not isinstance(where, str) or not where or "\x00" in where or Path(where).is_absolute() \
            or ".." in Path(where).parts:
        return f"has dir = {where!r:.60}, expected a path inside the sweep directory (runs/<name>)"
    return None


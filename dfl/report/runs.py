"""Run directories on disk: found, read into `RunRecord`s, and what their status means now.

Finding them (a sweep's runs first, in its order) and reading each into a `RunRecord` whose unreadable parts are listed
as problems, never raised; and what a summary's status means now (`effective_status`): a run whose summary says
"running" but whose process is gone is "killed". A run that ended as it should is `FINISHED`: "completed", or "stopped"
early by a callback or its target accuracy (`dfl.engine.hooks`).
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfl.config import Config
from dfl.directories import MARKER, directory_kind
from dfl.engine.results import read_metrics
from dfl.engine.validation import resolved
from dfl.errors import ConfigError, FileReadError, OutputPathError, ReportError
from dfl.files import read_json, read_text, read_toml

REPORT_DIR = "report"
FINISHED = ("completed", "stopped")  # stopped: ended early on purpose (a callback, stop_at_target); not resumed


@dataclass
class RunRecord:
    """One run directory as found on disk; `problems` lists what could not be read."""

    path: Path
    name: str  # path relative to the report root ("." for the root itself)
    config: dict[str, Any]  # Config defaults updated by config.toml
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    problems: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """`effective_status` of the summary: "killed" for a "running" run whose process is gone."""
        return effective_status(self.summary)

    @property
    def finished(self) -> bool:
        """Whether the run ended on purpose: completed, or stopped early."""
        return self.status in FINISHED

    @property
    def seed(self) -> Any:
        """The run's seed (from its config)."""
        return self.config.get("seed")

    @property
    def final(self) -> dict[str, Any] | None:
        """The run's last metrics record (None without one)."""
        return self.metrics[-1] if self.metrics else None


# ---------------------------------------------------------------------------------------------- status
def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (a zombie counts as gone: it has stopped running)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    except (OverflowError, OSError):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS) or it just exited: kill() said it existed
    return state not in ("Z", "X")


def run_process(summary: dict[str, Any]) -> str | None:
    """Where the process of a run whose summary says "running" is.

    "alive" (this host, the pid exists), "gone" (this host, no such process: killed or crashed),
    "elsewhere" (recorded on another host: cannot be checked from here) or "unknown" (no pid/host recorded: a run from
    before they were). None for any other status.
    """
    if summary.get("status") != "running":
        return None
    pid, host = summary.get("pid"), summary.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(host, str) or not host:
        return "unknown"
    if host != socket.gethostname():
        return "elsewhere"
    return "alive" if pid_alive(pid) else "gone"


def effective_status(summary: dict[str, Any]) -> str:
    """The summary's status as it is now: "running" becomes "killed" when its process is gone.

    That is, when the run's process was on this host and is gone (SIGKILL, out-of-memory kill, crash, power loss). A
    "running" run on another host, or one without a recorded pid/host, stays "running": it cannot be checked.
    """
    status = str(summary.get("status", "unknown"))
    if status == "running" and run_process(summary) == "gone":
        return "killed"
    return status


def has_metrics(run_dir: str | Path) -> bool:
    """Whether run_dir/metrics.jsonl holds at least one record.

    A run that failed or diverged before its first evaluation has none.
    """
    try:
        text = read_text(Path(run_dir) / "metrics.jsonl", "metrics file")
    except FileReadError:
        return False
    for line in text.splitlines():  # leniently, line by line: a damaged line does not hide the good ones
        try:
            if isinstance(json.loads(line), dict):
                return True
        except ValueError:
            continue
    return False


# files a run writes besides config.toml: a directory holding one of them is (or was) a run directory
RUN_TRACES = ("summary.json", "metrics.jsonl", "checkpoint.pt", MARKER)


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a run directory: it holds config.toml and summary.json or metrics.jsonl.

    A run whose summary.json is gone (deleted, or a copy that left it behind) is still reported: its metrics so far,
    its status unknown.
    """
    return (path / "config.toml").is_file() and any((path / f).is_file() for f in ("summary.json", "metrics.jsonl"))


def without_config(path: Path) -> bool:
    """Whether `path` holds a run's files but no config.toml: its setting is unknown, so it cannot be reported.

    A run's files: summary.json, metrics.jsonl, checkpoint.pt, or a marker saying "run".
    """
    if (path / "config.toml").is_file() or not any((path / f).is_file() for f in RUN_TRACES):
        return False
    if any((path / f).is_file() for f in RUN_TRACES[:-1]):
        return True
    try:  # nothing but a marker: a run directory only when the marker says so
        return directory_kind(path) == "run"
    except OutputPathError:
        return False


def _no_config(path: Path) -> str:
    return (f"{path} holds a run's files but no config.toml, so its setting is unknown (a run directory holds "
            "config.toml, summary.json and metrics.jsonl)")


def find_run_dirs(path: str | Path, skip: Iterable[Path] = ()) -> list[Path]:
    """PATH itself when it is a run directory, else every run directory below it.

    Nothing below `skip` nor below a `report/` directory is searched. Runs listed in PATH/sweep.json come first, in
    the sweep's order.
    """
    root = Path(path)
    if not root.exists():
        raise ReportError(f"path {root} does not exist")
    if is_run_dir(root):
        return [root]
    if not root.is_dir():
        raise ReportError(f"path {root} is neither a run directory nor a directory holding run directories")
    if without_config(root):
        raise ReportError(f"path {_no_config(root)}: nothing to report")
    skipped = {p.resolve() for p in skip}
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if is_run_dir(here):
            found.append(here)
            dirnames[:] = []
            continue
        if here != root and without_config(here):  # one line naming it, as for a run's unreadable file
            warnings.warn(f"{_no_config(here)}; it is left out of the report", stacklevel=2)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(
            d for d in dirnames
            if not d.startswith(".") and d != REPORT_DIR and (here / d).resolve() not in skipped
        )
    order = {(root / entry["dir"]).resolve(): i for i, entry in enumerate(sweep_entries(root)) if "dir" in entry}
    return sorted(found, key=lambda p: (order.get(p.resolve(), len(order)), str(p)))


def sweep_entries(root: Path) -> list[dict[str, Any]]:
    """The entries of root/sweep.json that name a run directory.

    None when root holds no readable sweep.json: a report of a folder that is no sweep reads only its run
    directories.
    """
    if not (root / "sweep.json").is_file():
        return []
    try:
        runs = read_json(root / "sweep.json", "sweep file").get("runs", [])
    except FileReadError:
        return []
    if not isinstance(runs, list):
        return []
    return [e for e in runs if isinstance(e, dict) and isinstance(e.get("dir"), str) and "\x00" not in e["dir"]]


def _unreadable(exc: FileReadError, name: str, consequence: str) -> str:
    """The problem noted in the report for an unreadable file of a run.

    Also a warning (one line naming the file and what is wrong: `dfl report` prints it), so that the reason is not only
    inside report.md.
    """
    warnings.warn(f"{exc}; {consequence}", stacklevel=3)
    return f"{name} unreadable ({exc.reason})"


def load_run(path: str | Path, root: str | Path | None = None) -> RunRecord:
    """Read config.toml, summary.json and metrics.jsonl; unreadable files become `problems`, never errors."""
    path = Path(path)
    name = os.path.relpath(path, root) if root is not None else "."
    if name == ".":
        name = path.resolve().name
    problems: list[str] = []
    config, problem = read_run_config(path)
    readable = problem is None
    if problem is not None:  # its setting is unknown: listed, never counted in a table
        problems.append(problem)
    summary: dict[str, Any] = {}
    try:
        summary = read_json(path / "summary.json", "summary file")
    except FileReadError as exc:
        problems.append(_unreadable(exc, "summary.json", "its status is unknown"))
    metrics: list[dict[str, Any]] = []
    if readable and (path / "metrics.jsonl").exists():
        try:
            metrics = read_metrics_so_far(path)
        except FileReadError as exc:
            problems.append(_unreadable(exc, "metrics.jsonl", "the run is left out of the tables"))
    if not metrics and readable:
        problems.append("no metrics")
    if effective_status(summary) == "killed":
        resumable = (path / "checkpoint.pt").is_file()
        after = "resumable from its checkpoint (`dfl run --resume`, or the sweep)" if resumable else \
            "no checkpoint: start it again"
        problems.insert(0, f"process {summary.get('pid')} is gone (killed or crashed) after round "
                           f"{summary.get('rounds_completed', '?')}; {after}")
    return RunRecord(path=path, name=name, config=config, summary=summary, metrics=metrics, problems=problems)


def read_run_config(path: Path) -> tuple[dict[str, Any], str | None]:
    """The config values of run directory `path` (its config.toml, defaults resolved), and the problem with it.

    The problem (None when there is none) is the note report.md shows; it is also warned in one line naming the file
    and what is wrong, in `Config.from_toml`'s words: unreadable (missing, not UTF-8, not TOML), or keys that make no
    Config (an unknown field, a value of the wrong type or out of range), every wrong key at once. Either way the
    run's setting is unknown and it is left out of the tables; its values are then those of the file as it is.
    """
    values = Config().to_dict()
    try:
        values.update(read_toml(path / "config.toml", "config file"))
    except FileReadError as exc:
        return values, _unreadable(exc, "config.toml", "the run is left out of the tables")
    try:
        _, wrong = Config.load(path / "config.toml")
    except ConfigError as exc:  # the file changed since it was read
        wrong = exc.problems
    if wrong:
        warnings.warn(f"{'; '.join(wrong)}; the run is left out of the tables", stacklevel=3)
        reasons = "; ".join(w.split(": ", 1)[-1] for w in wrong)
        return values, f"config.toml is not a valid config ({reasons})"
    return _resolved_values(values), None


def read_metrics_so_far(path: Path) -> list[dict[str, Any]]:
    """The records of run directory `path`'s metrics.jsonl, a partly written last line skipped with a warning.

    A run killed while a record was being written (or a copy taken meanwhile) can end in a line that is not JSON: the
    records before it are the run's metrics so far. A bad line anywhere else is `read_metrics`'s `FileReadError`.
    """
    try:
        return read_metrics(path)
    except FileReadError as exc:
        lines = read_text(path / "metrics.jsonl", "metrics file").splitlines()
        last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
        if not exc.reason.startswith(f"line {last} is not valid JSON"):
            raise
        warnings.warn(f"{exc}; a partly written last record (the run was killed while writing it?): skipped, "
                      f"the report uses the {sum(1 for line in lines[:last - 1] if line.strip())} record(s) before it",
                      stacklevel=3)
        # every line before `last` passed read_metrics's checks: it stopped at `last`
        return [json.loads(line) for line in lines[:last - 1] if line.strip()]


def _resolved_values(values: dict[str, Any]) -> dict[str, Any]:
    """A run's config values with the defaults its run resolved written in (`dfl.engine.validation.resolved`).

    A config.toml of an older dfl left an algorithm's momentum unset where a newer one records 0.9: the same setting.
    Values that do not make a Config (a field of another version) stay as they are.
    """
    try:
        return resolved(Config(**values)).to_dict()
    except (ConfigError, TypeError, ValueError):
        return values


def load_runs(path: str | Path, skip: Iterable[Path] = ()) -> list[RunRecord]:
    """Every run under `path` (`find_run_dirs`), loaded.

    Raises:
        ReportError: when there is no run directory under `path`.
    """
    dirs = find_run_dirs(path, skip)
    if not dirs:
        raise ReportError(f"no run directories under {path} (a run directory holds config.toml and summary.json "
                          "or metrics.jsonl)")
    return [load_run(d, path) for d in dirs]


def missing_sweep_runs(root: str | Path, runs: list[RunRecord]) -> list[dict[str, Any]]:
    """sweep.json entries whose run directory holds no run (e.g. a run that failed before it started)."""
    root = Path(root)
    have = {r.path.resolve() for r in runs}
    return [e for e in sweep_entries(root) if "dir" in e and (root / e["dir"]).resolve() not in have]

"""The launcher interface: what a sweep hands a launcher and what it gets back.

The runs a sweep hands over (`RunTask`), what it gets back (`Handle`) and the one method pair every launcher has
(`Launcher`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dfl.config import Config

LAUNCHERS = ("local", "slurm", "submitit-local")


@dataclass(frozen=True)
class RunTask:
    """One run to execute: `action` "start" (over: overwrites) or "resume" (from its checkpoint)."""

    name: str
    config: Config
    run_dir: Path
    action: str


@dataclass(frozen=True)
class Handle:
    """A submitted run: `job_id` (None for the local pool, whose runs have ended when `submit` returns)."""

    name: str
    launcher: str
    job_id: str | None = None


class Launcher(Protocol):
    """Where a sweep's runs execute: `kind` is its `--launcher` name (one of `LAUNCHERS`)."""

    kind: str

    def submit(self, tasks: Sequence[RunTask], sweep_dir: Path, *, started: Callable[[int, RunTask], None],
               finished: Callable[[int, RunTask, dict[str, Any]], None]) -> list[Handle]:
        """Execute (or queue) `tasks`, reporting the runs that start and end while `submit` runs.

        Args:
            tasks: the runs to execute, in order.
            sweep_dir: the sweep directory (where a launcher keeps its own records).
            started: called as `started(count, task)` when a run starts (count: 1, 2, ...).
            finished: called as `finished(count, task, outcome)` when a run ends (`outcome`: {"status", "error",
                ...} as `execute_run` returns).

        Returns:
            One `Handle` per task.
        """
        ...

    def live_jobs(self, sweep_dir: Path) -> dict[str, dict[str, Any]]:
        """Run name -> {"job_id", "state": "queued" or "running"} for runs in a job that is still alive."""
        ...

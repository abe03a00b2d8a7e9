"""One run of a sweep, executed in this process, whatever launcher started it.

`execute_run` and what it reads back (the run's summary, its final metrics) and the threads a run gets when it shares
the machine.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from dfl import threads
from dfl.config import Config
from dfl.errors import CheckpointError, DivergenceError, FileReadError
from dfl.files import atomic_write_bytes, read_json

ERROR_LOG = "error.log"  # the traceback of a failed run, in its run directory


def execute_run(config: Config, run_dir: Path, action: str) -> dict[str, Any]:
    """Run one planned run in this process; never raises for a run's failure.

    Args:
        config: the run's validated Config.
        run_dir: its run directory.
        action: "start" (over: overwrites) or "resume" (from its checkpoint).

    Returns:
        {"status", "error", "seconds", ...} with the summary's final metrics; a failed run leaves its traceback
        in run_dir/error.log.
    """
    from dfl.engine.runner import run

    run_dir = Path(run_dir)
    (run_dir / ERROR_LOG).unlink(missing_ok=True)
    tic = time.perf_counter()
    try:
        result = run(config, out=run_dir, overwrite=action == "start", resume=action == "resume")
    except DivergenceError as exc:
        from dfl.report.runs import has_metrics

        outcome = {"status": "diverged", "error": str(exc), "seconds": time.perf_counter() - tic,
                   **summary_metrics(read_summary(run_dir / "summary.json"))}
        if not has_metrics(run_dir):
            outcome["note"] = "diverged before its first evaluation: no metrics recorded"
        return outcome
    except CheckpointError as exc:  # not restarted: that would throw away rounds the user may want back
        atomic_write_bytes(run_dir / ERROR_LOG, traceback.format_exc().encode())
        return {"status": "failed", "seconds": time.perf_counter() - tic,
                "error": f"CheckpointError: checkpoint {exc.path} is unreadable ({exc.reason}); the sweep does not "
                         f"restart this run: delete {run_dir} and run the sweep again to start it over"}
    except Exception as exc:  # a failed run is recorded; the sweep goes on
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(run_dir / ERROR_LOG, traceback.format_exc().encode())
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - tic}
    return {"status": result.summary.get("status", "completed"), "error": None,  # or "stopped" (stop_at_target)
            "seconds": time.perf_counter() - tic, **summary_metrics(result.summary)}


def read_summary(path: Path) -> dict[str, Any]:
    """The JSON object in `path` (a run's summary.json), or {} when there is none or it cannot be read.

    A run whose summary is missing or damaged is treated as one that has not reported.
    """
    try:
        return read_json(path, "summary file")
    except FileReadError:
        return {}


def summary_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """The final metrics a sweep entry copies from a run's summary.

    `rounds_completed` and `test_acc`, where present.
    """
    return {k: summary[k] for k in ("rounds_completed", "test_acc") if k in summary}


def worker_threads(config: Config, workers: int) -> int:
    """The torch threads of a run that shares this machine with `workers - 1` other runs.

    The run's own `threads` when it is a number, else ("auto") this process's threads (`dfl.threads.count`:
    OMP_NUM_THREADS, or its cores) split evenly among the workers, at least 1. Every launcher splits the cores
    this way.
    """
    if config.threads != threads.AUTO:
        return threads.count(config.threads)
    return max(1, threads.count() // max(1, workers))


def threads_env(n: int) -> dict[str, str]:
    """The environment that gives a worker `n` threads: "auto" in its run reads OMP_NUM_THREADS."""
    return {name: str(n) for name in threads.COUNT_VARIABLES}


"""Where a sweep's runs execute: one small interface, three launchers.

A launcher gets the runs a sweep decided to run (`RunTask`: name, validated Config, run directory, "start" or
"resume") and executes them somewhere:

- `LocalPool` (`dfl sweep --launcher local`, the default): on this machine, one run at a time in this process or
  `parallel` worker processes; `submit` blocks until every run has ended and reports each outcome.
- `SubmititLauncher("slurm")` (`--launcher slurm`): one Slurm job array through submitit, one array task per run
  (a torch.distributed world of `tasks_per_run` processes where asked); `submit` returns once the array is
  queued.
- `SubmititLauncher("local")` (`--launcher submitit-local`): the same submission code on submitit's
  LocalExecutor (one subprocess group per run, no Slurm): what the tests use.

The run directories stay the single source of truth (summary.json `status`, `error`); a submitit launcher adds
`SWEEP/submitit/jobs.json`, the job of every submitted run (appended as soon as the scheduler accepted it, so a
submission that fails half way loses nothing), from which `live_jobs` tells which runs are still queued or
running in a live job: the sweep never submits those again. A job preempted or timed out on Slurm is requeued
by submitit and resumes its run from the last checkpoint (`RunJob.checkpoint`).

Modules, each importing only those before it: `base` (the interface), `execute` (one run in this process),
`signals` (stopping the local workers together), `local` (`LocalPool` and its worker process), `slurm`
(`SlurmOptions`), `jobs` (SWEEP/submitit/jobs.json and the state of each job) and `submission`
(`SubmititLauncher`, `RunJob`). submitit is an optional dependency (`pip install -e ".[cluster]"`), imported only
inside the submitit launcher.
"""

from __future__ import annotations

from dfl.errors import LauncherError
from dfl.workflows.launchers.base import LAUNCHERS, Handle, Launcher, RunTask
from dfl.workflows.launchers.execute import ERROR_LOG, execute_run, read_summary, summary_metrics, worker_threads
from dfl.workflows.launchers.jobs import (
    JOBS_DIR,
    JOBS_FILE,
    import_submitit,
    job_state,
    jobs_path,
    latest_jobs,
    live_jobs,
    read_jobs,
)
from dfl.workflows.launchers.local import WORKER, LocalPool
from dfl.workflows.launchers.signals import STOP_GRACE_SECONDS, STOP_SIGNALS
from dfl.workflows.launchers.slurm import SLURM_KEYS, SlurmOptions, parse_slurm_time
from dfl.workflows.launchers.submission import RunJob, SubmititLauncher

__all__ = [
    "LAUNCHERS", "Handle", "Launcher", "RunTask",
    "ERROR_LOG", "execute_run", "read_summary", "summary_metrics", "worker_threads",
    "STOP_GRACE_SECONDS", "STOP_SIGNALS",
    "WORKER", "LocalPool",
    "SLURM_KEYS", "SlurmOptions", "parse_slurm_time",
    "JOBS_DIR", "JOBS_FILE", "import_submitit", "job_state", "jobs_path", "latest_jobs", "live_jobs", "read_jobs",
    "RunJob", "SubmititLauncher",
    "make_launcher",
]


def make_launcher(kind: str, *, parallel: int = 1, options: SlurmOptions | None = None) -> Launcher:
    """The launcher named `kind` (one of `LAUNCHERS`).

    Args:
        kind: "local", "slurm" or "submitit-local".
        parallel: the local pool's runs at once.
        options: the Slurm options of a submitit launcher.

    Raises:
        LauncherError: for any other `kind`.
    """
    if kind == "local":
        return LocalPool(parallel)
    if kind == "slurm":
        return SubmititLauncher("slurm", options)
    if kind == "submitit-local":
        return SubmititLauncher("local", options)
    raise LauncherError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {kind!r}")

"""The submitit launcher.

A sweep's runs as submitit jobs, one Slurm job array (`--launcher slurm`) or one process group per run on this machine
through submitit's LocalExecutor (`--launcher submitit-local`, what the tests use). Each job is a `RunJob`, which
resumes its run after a preemption, a timeout or a requeue.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dfl import threads
from dfl.config import Config
from dfl.errors import LauncherError
from dfl.workflows.launchers.base import Handle, RunTask
from dfl.workflows.launchers.execute import execute_run, threads_env, worker_threads
from dfl.workflows.launchers.jobs import JOBS_DIR, import_submitit, jobs_path, live_jobs, record_jobs
from dfl.workflows.launchers.local import Finished, Started
from dfl.workflows.launchers.slurm import SlurmOptions


class RunJob:
    """The callable of one submitted run (pickled by submitit; one per array task).

    In a run of several processes it sets the torch.distributed environment (MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE, LOCAL_RANK) from Slurm's (or the local executor's) through
    `submitit.helpers.TorchDistributedEnvironment`.

    `checkpoint` (called by submitit on preemption or timeout, before it requeues the job) makes the requeued
    job resume its run from the run's last checkpoint. A job Slurm requeues without asking (node failure) finds
    a checkpoint newer than its submission and resumes it too, so that no round is computed twice.

    Args:
        config: the run's Config as a dict (`Config.to_dict`).
        run_dir: its run directory.
        action: "start" or "resume".
        submitted: when the job was submitted (`time.time()`): a checkpoint newer than that is this job's own.
        threads: the threads of each rank (0: the run's own `threads` decide).
    """

    def __init__(self, config: dict[str, Any], run_dir: str, action: str, submitted: float, threads: int = 0):
        self.config, self.run_dir, self.action, self.submitted, self.threads = \
            config, run_dir, action, submitted, threads

    def __call__(self) -> dict[str, Any]:
        """Run the run in this job (`execute_run`); the outcome carries the job's id."""
        submitit = import_submitit("slurm")
        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # the CUDA device of a rank is cuda:LOCAL_RANK (dfl.engine.distributed)
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        if self.threads:  # the run's "auto" reads it (dfl.threads); torch, if loaded, gets it from dfl.run
            os.environ.update(threads_env(self.threads))
        run_dir = Path(self.run_dir)
        action = self.action
        checkpoint = run_dir / "checkpoint.pt"
        if action == "start" and checkpoint.is_file() and checkpoint.stat().st_mtime > self.submitted:
            action = "resume"  # written by an earlier attempt of this job (requeued): continue it
        (run_dir).mkdir(parents=True, exist_ok=True)
        outcome = execute_run(Config.from_dict(self.config), run_dir, action)
        outcome["job_id"] = env.job_id
        return outcome

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """The requeue hook submitit calls: the same run, resumed from its checkpoint when it has one."""
        submitit = import_submitit("slurm")
        action = "resume" if (Path(self.run_dir) / "checkpoint.pt").is_file() else self.action
        job = RunJob(self.config, self.run_dir, action, self.submitted, self.threads)
        return submitit.helpers.DelayedSubmission(job, *args, **kwargs)

    __submitit_checkpoint__ = checkpoint  # the name newer submitit versions look up first



class SubmititLauncher:
    """Runs as submitit jobs; `submit` returns once every run is queued.

    Args:
        executor: "slurm" (one job array on Slurm) or "local" (submitit's LocalExecutor, one process group per
            run on this machine).
        options: the runs' resources (`SlurmOptions`; checked here).
    """

    def __init__(self, executor: str = "slurm", options: SlurmOptions | None = None):
        if executor not in ("slurm", "local"):
            raise LauncherError(f"submitit executor must be slurm or local, got {executor!r}")
        self.executor = executor
        self.kind = "slurm" if executor == "slurm" else "submitit-local"
        self.options = (options or SlurmOptions()).checked()
        self.submitit = import_submitit(self.kind)
        self._jobs: list[Any] = []  # the jobs submitted by this launcher (for `wait`)

    jobs_path = staticmethod(jobs_path)

    def live_jobs(self, sweep_dir: Path) -> dict[str, dict[str, Any]]:
        """Run name -> {"job_id", "state"} for runs whose latest job is queued or running (`jobs.live_jobs`)."""
        return live_jobs(sweep_dir, self.submitit)

    def submit(self, tasks: Sequence[RunTask], sweep_dir: Path, *, started: Started,
               finished: Finished) -> list[Handle]:
        """Queue `tasks` as jobs, each recorded in jobs.json (see `Launcher.submit`).

        `started` and `finished` are not called: the runs start later, in their jobs.
        """
        tasks = list(tasks)
        if not tasks:
            return []
        sweep_dir = Path(sweep_dir)
        executor = self._executor(sweep_dir)
        now = time.time()
        for task in tasks:
            task.run_dir.mkdir(parents=True, exist_ok=True)
        jobs = [RunJob(t.config.replace(progress=False).to_dict(), str(t.run_dir), t.action, now,
                       self._run_threads(t.config, len(tasks))) for t in tasks]
        if self.executor == "slurm":
            return self._submit_array(executor, tasks, jobs, sweep_dir)
        return self._submit_each(executor, tasks, jobs, sweep_dir)

    def wait(self) -> None:
        """Block until the jobs this launcher submitted have ended (`--wait`; on Slurm, polled through sacct)."""
        for job in self._jobs:
            with contextlib.suppress(Exception):
                job.wait()

    def _executor(self, sweep_dir: Path) -> Any:
        """Submitit's executor for this sweep, its parameters set from the options."""
        folder = sweep_dir / JOBS_DIR / "%j"
        params = self.options.executor_parameters(self.executor, name=f"dfl-{sweep_dir.resolve().name}")
        if self.executor == "local":
            executor = self.submitit.LocalExecutor(folder=folder)
        else:
            try:
                executor = self.submitit.AutoExecutor(folder=folder, cluster="slurm")
            except RuntimeError as exc:  # no srun on this machine
                raise LauncherError(f"--launcher slurm: {exc} (run dfl sweep on a login node of the cluster; "
                                    "--launcher submitit-local runs the same submission on this machine)") from None
        try:
            executor.update_parameters(**params)
        except Exception as exc:  # submitit's own check of a parameter
            raise LauncherError(f"submitit refused the options: {exc}") from exc
        return executor

    def _run_threads(self, config: Config, runs: int) -> int:
        """The threads of one rank of a run; 0: the run's "auto" decides where it runs (its CPU affinity)."""
        ranks = self.options.tasks_per_run
        if self.executor == "local":  # share this machine's cores between the runs that run at once
            return worker_threads(config, runs * ranks)
        if config.threads != threads.AUTO:
            return threads.count(config.threads)
        return self.options.cpus_per_run // ranks if self.options.cpus_per_run else 0

    def _submit_array(self, executor: Any, tasks: list[RunTask], jobs: list[RunJob], sweep_dir: Path) -> list[Handle]:
        """One sbatch for the whole array: every run is accepted, or nothing is."""
        try:
            submitted = executor.submit_array(jobs)
        except Exception as exc:
            last = next((line for line in reversed(str(exc).strip().splitlines()) if line.strip()), "")
            raise LauncherError(f"submitting the job array failed, nothing was submitted: "
                                f"{type(exc).__name__}: {last.strip()}") from exc
        handles = [Handle(t.name, self.kind, j.job_id) for t, j in zip(tasks, submitted)]
        self._jobs.extend(submitted)
        record_jobs(sweep_dir, handles, self.kind)
        return handles

    def _submit_each(self, executor: Any, tasks: list[RunTask], jobs: list[RunJob], sweep_dir: Path) -> list[Handle]:
        """One process group per run, each recorded as soon as it started (a failure half way loses nothing)."""
        handles: list[Handle] = []
        for task, job in zip(tasks, jobs):
            try:
                submitted = executor.submit(job)
            except Exception as exc:
                raise LauncherError(f"submitting run {task.name} failed after {len(handles)} of {len(tasks)} "
                                    f"runs were submitted (recorded in {jobs_path(sweep_dir)}): "
                                    f"{type(exc).__name__}: {exc}") from exc
            handle = Handle(task.name, self.kind, submitted.job_id)
            record_jobs(sweep_dir, [handle], self.kind)
            handles.append(handle)
            self._jobs.append(submitted)
        return handles

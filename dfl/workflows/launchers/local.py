"""The local pool (`dfl sweep --launcher local`, the default).

The runs on this machine, one after the other in this process, or in `parallel` worker processes (`WORKER`) that each
report their outcome as their last line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from dfl.config import Config
from dfl.errors import LauncherError, SweepInterrupted
from dfl.files import atomic_write_bytes
from dfl.workflows.launchers.base import Handle, RunTask
from dfl.workflows.launchers.execute import ERROR_LOG, execute_run, threads_env, worker_threads
from dfl.workflows.launchers.signals import die_with_parent, signals_interrupt, stop_workers

Started = Callable[[int, RunTask], None]
Finished = Callable[[int, RunTask, dict[str, Any]], None]


class LocalPool:
    """The local pool: the runs of a sweep on this machine; `submit` returns when every run has ended.

    `parallel` = 1 runs the runs one after the other in this process; more runs that many worker processes, each
    with its run's `threads`, or ("auto") this process's threads // parallel (`worker_threads`). SIGINT, SIGTERM
    and SIGHUP stop it (see `dfl.workflows.sweep`); the workers get SIGTERM (SIGKILL after
    `STOP_GRACE_SECONDS`).

    Args:
        parallel: the number of runs at once (an integer >= 1).
    """

    kind = "local"

    def __init__(self, parallel: int = 1):
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise LauncherError(f"parallel must be an integer >= 1, got {parallel!r}")
        self.parallel = parallel

    def live_jobs(self, sweep_dir: Path) -> dict[str, dict[str, Any]]:
        """None: the local pool keeps no jobs (see `Launcher.live_jobs`)."""
        return {}  # a run of this host in a live process is seen from its summary.json (pid, host)

    def submit(self, tasks: Sequence[RunTask], sweep_dir: Path, *, started: Started,
               finished: Finished) -> list[Handle]:
        """Run `tasks` here and return when all have ended (see `Launcher.submit`)."""
        tasks = list(tasks)
        with signals_interrupt():
            if self.parallel > 1 and len(tasks) > 1:
                run_parallel(tasks, self.parallel, started, finished)
            else:
                for count, task in enumerate(tasks, 1):
                    started(count, task)
                    try:
                        outcome = execute_run(task.config, task.run_dir, task.action)
                    except BaseException:  # Ctrl-C: leave an honest sweep.json behind
                        finished(count, task, {"status": "interrupted"})
                        raise
                    finished(count, task, outcome)
        return [Handle(t.name, self.kind) for t in tasks]



def run_parallel(tasks: list[RunTask], parallel: int, started: Started, finished: Finished) -> None:
    """Run `tasks` in worker subprocesses, at most `parallel` at once.

    Each run's stdout/stderr go to temporary files, kept in the run directory as error.log when it fails. Any
    exception here (a stop signal's `SweepInterrupted`, Ctrl-C, a bug) stops every worker first.
    """
    queue = list(enumerate(tasks, 1))
    running: dict[subprocess.Popen, tuple[int, RunTask, IO[bytes], IO[bytes], float]] = {}
    preexec = die_with_parent()
    try:
        while queue or running:
            while queue and len(running) < parallel:
                count, task = queue.pop(0)
                task.run_dir.mkdir(parents=True, exist_ok=True)
                job = {"config": task.config.replace(progress=False).to_dict(), "out": str(task.run_dir),
                       "action": task.action}
                env = {**os.environ, **threads_env(worker_threads(task.config, parallel))}
                stdout: IO[bytes] = tempfile.TemporaryFile()
                stderr: IO[bytes] = tempfile.TemporaryFile()
                proc = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(job)], stdout=stdout,
                                        stderr=stderr, stdin=subprocess.DEVNULL, env=env,
                                        preexec_fn=preexec)
                running[proc] = (count, task, stdout, stderr, time.perf_counter())
                started(count, task)
            done = [proc for proc in running if proc.poll() is not None]
            if not done:
                time.sleep(0.05)
                continue
            for proc in done:
                count, task, stdout, stderr, tic = running.pop(proc)
                outcome = worker_outcome(proc.returncode, stdout, stderr, task.run_dir)
                outcome.setdefault("seconds", time.perf_counter() - tic)
                finished(count, task, outcome)
    except BaseException as exc:  # a signal (SweepInterrupted), Ctrl-C, or a bug here: no worker outlives the sweep
        stop_workers(list(running))
        for count, task, stdout, stderr, _tic in running.values():
            stdout.close()
            stderr.close()
            finished(count, task, {"status": "interrupted", "error": None})
        if isinstance(exc, SweepInterrupted):
            exc.stopped = len(running)
        raise


# The worker: runs one job (argv[1], JSON) with `execute_run` and prints its outcome as the last stdout line.
WORKER = "import sys; from dfl.workflows.launchers.local import worker_main; sys.exit(worker_main(sys.argv[1]))"


def worker_main(job_json: str) -> int:
    """The worker process: run the job `job_json` ({"config", "out", "action"}) and print its outcome.

    Returns:
        The exit status: 0, or 128 + the signal that interrupted the run.
    """
    from dfl.engine.runner import raise_on_signal

    # the sweep stops its workers with SIGTERM (and so does the kernel when the sweep dies): the run then records
    # status "interrupted" with its last completed round instead of dying mid-summary
    signal.signal(signal.SIGTERM, raise_on_signal)
    job = json.loads(job_json)  # its threads: OMP_NUM_THREADS, set by the pool (`worker_threads`), read by dfl.run
    try:
        outcome = execute_run(Config.from_dict(job["config"]), Path(job["out"]), job["action"])
    except KeyboardInterrupt as exc:
        return 128 + int(getattr(exc, "signum", signal.SIGINT))
    print("\n" + json.dumps(outcome, allow_nan=True), flush=True)
    return 0


def worker_outcome(returncode: int, stdout: IO[bytes], stderr: IO[bytes], run_dir: Path) -> dict[str, Any]:
    """The outcome a worker printed as its last stdout line; else a failure, its stderr kept as run_dir/error.log.

    Closes both files.
    """
    stdout.seek(0)
    stderr.seek(0)
    lines = stdout.read().decode(errors="replace").strip().splitlines()
    err = stderr.read().decode(errors="replace")
    stdout.close()
    stderr.close()
    if returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    tail = err[-8000:]
    atomic_write_bytes(run_dir / ERROR_LOG, f"worker exit code {returncode}\n{tail}".encode())
    last = next((line for line in reversed(tail.splitlines()) if line.strip()), "no output")
    return {"status": "failed", "error": f"worker exited with code {returncode}: {last.strip()}"}


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

submitit is an optional dependency (`pip install -e ".[cluster]"`), imported only inside the submitit launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dfl import threads
from dfl.config import Config
from dfl.engine.results import atomic_write_bytes, to_json
from dfl.errors import FileReadError, LauncherError, SweepInterrupted
from dfl.files import read_json

ERROR_LOG = "error.log"
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
STOP_GRACE_SECONDS = 10.0  # SIGTERM'd workers that have not exited by then get SIGKILL
LAUNCHERS = ("local", "slurm", "submitit-local")
JOBS_DIR = "submitit"  # SWEEP/submitit/: submitit's folder (pickles, logs) and jobs.json
JOBS_FILE = "jobs.json"
INSTALL_HINT = 'pip install -e ".[cluster]"'


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
    kind: str

    def submit(self, tasks: Sequence[RunTask], sweep_dir: Path, *, started: Callable[[int, RunTask], None],
               finished: Callable[[int, RunTask, dict[str, Any]], None]) -> list[Handle]:
        """Execute (or queue) `tasks`; `started(count, task)` / `finished(count, task, outcome)` report runs that
        start / end while `submit` runs (`outcome`: {"status", "error", ...} as `execute_run` returns)."""
        ...

    def live_jobs(self, sweep_dir: Path) -> dict[str, dict[str, Any]]:
        """Run name -> {"job_id", "state": "queued" or "running"} for runs in a job that is still alive."""
        ...


# ---------------------------------------------------------------------------------------------- one run
def execute_run(config: Config, run_dir: Path, action: str) -> dict[str, Any]:
    """Run one planned run in this process (`action` "start" or "resume"); never raises for a run's failure:
    returns {"status", "error", ...} and leaves the traceback in run_dir/error.log."""
    from dfl.engine.checkpoint import CheckpointError
    from dfl.engine.runner import DivergenceError, run

    run_dir = Path(run_dir)
    (run_dir / ERROR_LOG).unlink(missing_ok=True)
    tic = time.perf_counter()
    try:
        result = run(config, out=run_dir, overwrite=action == "start", resume=action == "resume")
    except DivergenceError as exc:
        from dfl.report.runs import has_metrics

        outcome = {"status": "diverged", "error": str(exc), "seconds": time.perf_counter() - tic,
                   **_metrics(_read_json(run_dir / "summary.json"))}
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
            "seconds": time.perf_counter() - tic, **_metrics(result.summary)}


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path` (a run's summary.json), or {} when there is none or it cannot be read: a run
    whose summary is missing or damaged is treated as one that has not reported."""
    try:
        return read_json(path, "summary file")
    except FileReadError:
        return {}


def _metrics(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in ("rounds_completed", "test_acc") if k in summary}


def worker_threads(config: Config, workers: int) -> int:
    """The torch threads of a run that shares this machine with `workers - 1` other runs: the run's own
    `threads` when it is a number, else ("auto") this process's threads (`dfl.threads.count`: OMP_NUM_THREADS,
    or its cores) split evenly among the workers, at least 1. Every launcher splits the cores this way."""
    if config.threads != threads.AUTO:
        return threads.count(config.threads)
    return max(1, threads.count() // max(1, workers))


def _threads_env(n: int) -> dict[str, str]:
    """The environment that gives a worker `n` threads: "auto" in its run reads OMP_NUM_THREADS."""
    return {name: str(n) for name in threads.COUNT_VARIABLES}


# ---------------------------------------------------------------------------------------------- local pool
class LocalPool:
    """The local pool: `parallel` = 1 runs the runs one after the other in this process; more runs that many
    worker processes, each with its run's `threads`, or ("auto") this process's threads // parallel
    (`worker_threads`). SIGINT, SIGTERM and SIGHUP stop it (see
    `dfl.workflows.sweep`); the workers get SIGTERM (SIGKILL after `STOP_GRACE_SECONDS`)."""

    kind = "local"

    def __init__(self, parallel: int = 1):
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise LauncherError(f"parallel must be an integer >= 1, got {parallel!r}")
        self.parallel = parallel

    def live_jobs(self, sweep_dir: Path) -> dict[str, dict[str, Any]]:
        return {}  # a run of this host in a live process is seen from its summary.json (pid, host)

    def submit(self, tasks, sweep_dir, *, started, finished) -> list[Handle]:
        tasks = list(tasks)
        with _signals_interrupt():
            if self.parallel > 1 and len(tasks) > 1:
                _run_parallel(tasks, self.parallel, started, finished)
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


@contextlib.contextmanager
def _signals_interrupt():
    """Within: SIGINT, SIGTERM and SIGHUP raise `SweepInterrupted` (once; later signals are ignored while the
    workers are being stopped). Only in the main thread (elsewhere signal handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum, frame):
        if received:  # already stopping the workers: let that finish
            return
        received.append(signum)
        raise SweepInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def _die_with_parent():
    """A `preexec_fn` that makes the child get SIGTERM when this process dies (Linux `PR_SET_PDEATHSIG`, which
    survives exec); None where that is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: nothing but the call after fork
    except (OSError, AttributeError):  # pragma: no cover
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the sweep died before the call above: nobody would stop this worker
            os._exit(1)

    return preexec


def _stop_workers(procs: list[subprocess.Popen], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM every worker still running, wait up to `grace` seconds in all, then SIGKILL the rest; reaps all."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def _run_parallel(tasks: list[RunTask], parallel: int, started, finished) -> None:
    """Worker subprocesses, at most `parallel` at once; each run's stdout/stderr go to temporary files, kept in
    the run directory as error.log when it fails."""
    queue, running, count = list(enumerate(tasks, 1)), {}, 0
    preexec = _die_with_parent()
    try:
        while queue or running:
            while queue and len(running) < parallel:
                count, task = queue.pop(0)
                task.run_dir.mkdir(parents=True, exist_ok=True)
                job = {"config": task.config.replace(progress=False).to_dict(), "out": str(task.run_dir),
                       "action": task.action}
                env = {**os.environ, **_threads_env(worker_threads(task.config, parallel))}
                stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
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
                outcome = _worker_outcome(proc.returncode, stdout, stderr, task.run_dir)
                outcome.setdefault("seconds", time.perf_counter() - tic)
                finished(count, task, outcome)
    except BaseException as exc:  # a signal (SweepInterrupted), Ctrl-C, or a bug here: no worker outlives the sweep
        _stop_workers(list(running))
        for count, task, stdout, stderr, _tic in running.values():
            stdout.close()
            stderr.close()
            finished(count, task, {"status": "interrupted", "error": None})
        if isinstance(exc, SweepInterrupted):
            exc.stopped = len(running)
        raise


# The worker: runs one job (argv[1], JSON) with `execute_run` and prints its outcome as the last stdout line.
WORKER = "import sys; from dfl.workflows.launchers import _worker_main; sys.exit(_worker_main(sys.argv[1]))"


def _worker_main(job_json: str) -> int:
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


def _worker_outcome(returncode: int, stdout, stderr, run_dir: Path) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------------------------- Slurm options
# Extra `--slurm KEY=VALUE` keys (sbatch options submitit passes on); the knobs with their own flag are not here.
SLURM_KEYS = ("account", "qos", "constraint", "mem", "mem_per_cpu", "mem_per_gpu", "cpus_per_gpu", "gres",
              "exclude", "nodelist", "exclusive", "dependency", "comment", "job_name", "mail_type", "mail_user",
              "wckey", "signal_delay_s")
OWN_FLAG = {"partition": "--partition", "time": "--time", "gpus_per_node": "--gpus-per-run",
            "gpus_per_task": "--gpus-per-run", "cpus_per_task": "--cpus-per-run", "array_parallelism": "--max-parallel",
            "nodes": "--nodes-per-run", "ntasks_per_node": "--tasks-per-run"}
KNOBS = ("partition", "time", "gpus_per_run", "cpus_per_run", "max_parallel", "tasks_per_run", "nodes_per_run")
TIME_FORMS = "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES or " \
             "DAYS-HOURS:MINUTES:SECONDS"
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_slurm_time(text: Any, where: str = "--time") -> int:
    """Slurm's time limit formats -> whole minutes (seconds round up); a clear error for anything else."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    match = _TIME_RE.fullmatch(str(text).strip()) if isinstance(text, str) else None
    if not match:
        raise LauncherError(f"{where}: expected {TIME_FORMS} (e.g. 04:00:00 or 1-12), got {text!r}")
    days, a, b, c = match.groups()
    a, b, c = int(a), int(b) if b else None, int(c) if c else None
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = int(days) * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # H:M:S
        seconds = a * 3600 + b * 60 + c
    elif b is not None:  # M:S
        seconds = a * 60 + b
    else:  # M
        seconds = a * 60
    if seconds <= 0:
        raise LauncherError(f"{where}: the time limit must be positive, got {text!r}")
    return -(-seconds // 60)


@dataclass
class SlurmOptions:
    """The resources of one run (one array task) and of the array. `gpus_per_run`, `cpus_per_run` are totals
    over the run's `tasks_per_run` processes (split evenly over `nodes_per_run` nodes); `extra` holds the
    `--slurm KEY=VALUE` options (keys in `SLURM_KEYS`)."""

    partition: str | None = None
    time: str | int | None = None
    gpus_per_run: int = 0
    cpus_per_run: int | None = None
    max_parallel: int | None = None
    tasks_per_run: int = 1
    nodes_per_run: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str = "[slurm]") -> SlurmOptions:
        """A sweep file's `[slurm]` table: the knobs by their flag name with '_' (`gpus_per_run = 1`), any other
        key an extra option (as `--slurm KEY=VALUE`)."""
        table = dict(table)
        knobs = {k: table.pop(k) for k in KNOBS if k in table}
        return cls(**knobs, extra=table).checked(where)

    def merged(self, flags: dict[str, Any]) -> SlurmOptions:
        """These options with the flags that were given (not None) on top; `extra` merged key by key."""
        values = {k: getattr(self, k) for k in KNOBS}
        values.update({k: v for k, v in flags.items() if k in KNOBS and v is not None})
        return SlurmOptions(**values, extra={**self.extra, **(flags.get("extra") or {})})

    def to_table(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in KNOBS if getattr(self, k) is not None}
        return {**out, **self.extra}

    def checked(self, where: str = "") -> SlurmOptions:
        """Raise `LauncherError` (one line naming the flag or key and what is allowed) for a bad option."""
        pre = f"{where}: " if where else ""

        def count(name: str, value: Any, minimum: int, flag: str) -> None:
            if value is None and name in ("cpus_per_run", "max_parallel"):
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise LauncherError(f"{pre}{flag} must be an integer >= {minimum}, got {value!r}")

        count("gpus_per_run", self.gpus_per_run, 0, "--gpus-per-run")
        count("cpus_per_run", self.cpus_per_run, 1, "--cpus-per-run")
        count("max_parallel", self.max_parallel, 1, "--max-parallel")
        count("tasks_per_run", self.tasks_per_run, 1, "--tasks-per-run")
        count("nodes_per_run", self.nodes_per_run, 1, "--nodes-per-run")
        if self.time is not None:
            parse_slurm_time(self.time, f"{pre}--time")
        if self.partition is not None and (not isinstance(self.partition, str) or not self.partition.strip()
                                           or any(c.isspace() for c in self.partition)):
            raise LauncherError(f"{pre}--partition must be a partition name (no spaces), got {self.partition!r}")
        if self.tasks_per_run % self.nodes_per_run:
            raise LauncherError(f"{pre}--tasks-per-run ({self.tasks_per_run}) must be a multiple of "
                                f"--nodes-per-run ({self.nodes_per_run}): each node runs the same number of ranks")
        for name, what in (("gpus_per_run", "--gpus-per-run"), ("cpus_per_run", "--cpus-per-run")):
            value, per = getattr(self, name), self.tasks_per_run if name == "cpus_per_run" else self.nodes_per_run
            if value and value % per:
                unit = "--tasks-per-run" if name == "cpus_per_run" else "--nodes-per-run"
                raise LauncherError(f"{pre}{what} ({value}) must be a multiple of {unit} ({per})")
        if self.gpus_per_run and self.gpus_per_run != self.tasks_per_run and self.tasks_per_run > 1:
            raise LauncherError(f"{pre}--gpus-per-run ({self.gpus_per_run}) must equal --tasks-per-run "
                                f"({self.tasks_per_run}) for a multi-process run: one process per GPU (NCCL), or 0 "
                                "for CPU processes (gloo)")
        for key, value in self.extra.items():
            if key in OWN_FLAG:
                raise LauncherError(f"{pre}--slurm {key}: set it with {OWN_FLAG[key]}")
            if key not in SLURM_KEYS:
                raise LauncherError(f"{pre}--slurm {key}: unknown key; allowed: {', '.join(SLURM_KEYS)}")
            if key == "signal_delay_s":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise LauncherError(f"{pre}--slurm signal_delay_s must be an integer >= 0, got {value!r}")
            elif key == "exclusive":
                if not isinstance(value, (bool, str)):
                    raise LauncherError(f"{pre}--slurm exclusive must be true, false or a string, got {value!r}")
            elif not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
                raise LauncherError(f"{pre}--slurm {key} must be a non-empty string, got {value!r}")
        return self

    def executor_parameters(self, kind: str, name: str) -> dict[str, Any]:
        """submitit's `update_parameters` keywords for `kind` "slurm" (AutoExecutor, slurm_ prefix) or "local"."""
        tasks_per_node = self.tasks_per_run // self.nodes_per_run
        params: dict[str, Any] = {"tasks_per_node": tasks_per_node, "nodes": self.nodes_per_run,
                                  "timeout_min": parse_slurm_time(self.time) if self.time is not None else 60}
        if self.gpus_per_run:
            params["gpus_per_node"] = self.gpus_per_run // self.nodes_per_run
        if kind == "local":
            return params
        if self.cpus_per_run:
            params["cpus_per_task"] = self.cpus_per_run // self.tasks_per_run
        params["name"] = name
        if self.partition:
            params["slurm_partition"] = self.partition
        if self.max_parallel:
            params["slurm_array_parallelism"] = self.max_parallel
        for key, value in self.extra.items():
            params[f"slurm_{key}"] = value
        return params


# ---------------------------------------------------------------------------------------------- submitit
def import_submitit(launcher: str):
    try:
        import submitit
    except ImportError:
        raise LauncherError(f"--launcher {launcher} needs submitit, which is not installed: "
                            f"{INSTALL_HINT}") from None
    return submitit


class RunJob:
    """The callable of one submitted run (pickled by submitit; one per array task). In a run of several
    processes it sets the torch.distributed environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
    LOCAL_RANK) from Slurm's (or the local executor's) through `submitit.helpers.TorchDistributedEnvironment`.

    `checkpoint` (called by submitit on preemption or timeout, before it requeues the job) makes the requeued
    job resume its run from the run's last checkpoint. A job Slurm requeues without asking (node failure) finds
    a checkpoint newer than its submission and resumes it too, instead of starting the run over."""

    def __init__(self, config: dict[str, Any], run_dir: str, action: str, submitted: float, threads: int = 0):
        self.config, self.run_dir, self.action, self.submitted, self.threads = \
            config, run_dir, action, submitted, threads

    def __call__(self) -> dict[str, Any]:
        submitit = import_submitit("slurm")
        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # the CUDA device of a rank is cuda:LOCAL_RANK (dfl.engine.distributed)
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        if self.threads:  # the run's "auto" reads it (dfl.threads); torch, if loaded, gets it from dfl.run
            os.environ.update(_threads_env(self.threads))
        run_dir = Path(self.run_dir)
        action = self.action
        checkpoint = run_dir / "checkpoint.pt"
        if action == "start" and checkpoint.is_file() and checkpoint.stat().st_mtime > self.submitted:
            action = "resume"  # written by an earlier attempt of this job (requeued): continue it
        (run_dir).mkdir(parents=True, exist_ok=True)
        outcome = execute_run(Config.from_dict(self.config), run_dir, action)
        outcome["job_id"] = env.job_id
        return outcome

    def checkpoint(self, *args: Any, **kwargs: Any):
        submitit = import_submitit("slurm")
        action = "resume" if (Path(self.run_dir) / "checkpoint.pt").is_file() else self.action
        job = RunJob(self.config, self.run_dir, action, self.submitted, self.threads)
        return submitit.helpers.DelayedSubmission(job, *args, **kwargs)

    __submitit_checkpoint__ = checkpoint  # the name newer submitit versions look up first


SLURM_LIVE = {"PENDING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued", "REQUEUE_FED": "queued",
              "CONFIGURING": "queued", "RESV_DEL_HOLD": "queued", "SUSPENDED": "queued", "RUNNING": "running",
              "COMPLETING": "running", "RESIZING": "running", "STAGE_OUT": "running", "SIGNALING": "running"}


class SubmititLauncher:
    """Runs as submitit jobs: `executor` "slurm" (one job array on Slurm) or "local" (submitit's LocalExecutor,
    one process group per run on this machine). `submit` returns once every run is queued."""

    def __init__(self, executor: str = "slurm", options: SlurmOptions | None = None):
        if executor not in ("slurm", "local"):
            raise LauncherError(f"submitit executor must be slurm or local, got {executor!r}")
        self.executor = executor
        self.kind = "slurm" if executor == "slurm" else "submitit-local"
        self.options = (options or SlurmOptions()).checked()
        self.submitit = import_submitit(self.kind)
        self._jobs: list[Any] = []  # the jobs submitted by this launcher (for `wait`)

    # ------------------------------------------------------------------ the jobs of a sweep directory
    @staticmethod
    def jobs_path(sweep_dir: Path) -> Path:
        return Path(sweep_dir) / JOBS_DIR / JOBS_FILE

    def live_jobs(self, sweep_dir: Path) -> dict[str, dict[str, Any]]:
        return live_jobs(sweep_dir, self.submitit)

    def submit(self, tasks, sweep_dir, *, started, finished) -> list[Handle]:
        tasks = list(tasks)
        if not tasks:
            return []
        sweep_dir = Path(sweep_dir)
        folder = sweep_dir / JOBS_DIR / "%j"
        params = self.options.executor_parameters(self.executor, name=f"dfl-{sweep_dir.resolve().name}")
        ranks = self.options.tasks_per_run

        def run_threads(config: Config) -> int:  # 0: the run's "auto" decides where it runs (its CPU affinity)
            if self.executor == "local":  # share this machine's cores between the runs that run at once
                return worker_threads(config, len(tasks) * ranks)
            if config.threads != threads.AUTO:
                return threads.count(config.threads)
            return self.options.cpus_per_run // ranks if self.options.cpus_per_run else 0

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
        now = time.time()
        for task in tasks:
            task.run_dir.mkdir(parents=True, exist_ok=True)
        jobs = [RunJob(t.config.replace(progress=False).to_dict(), str(t.run_dir), t.action, now,
                       run_threads(t.config)) for t in tasks]
        handles: list[Handle] = []
        if self.executor == "slurm":  # one sbatch: the whole array is accepted, or nothing is
            try:
                submitted = executor.submit_array(jobs)
            except Exception as exc:
                last = next((line for line in reversed(str(exc).strip().splitlines()) if line.strip()), "")
                raise LauncherError(f"submitting the job array failed, nothing was submitted: "
                                    f"{type(exc).__name__}: {last.strip()}") from exc
            handles = [Handle(t.name, self.kind, j.job_id) for t, j in zip(tasks, submitted)]
            self._jobs.extend(submitted)
            _record_jobs(sweep_dir, handles, self.kind)
        else:  # one process group per run: each recorded as soon as it started
            for task, job in zip(tasks, jobs):
                try:
                    submitted = executor.submit(job)
                except Exception as exc:
                    raise LauncherError(f"submitting run {task.name} failed after {len(handles)} of {len(tasks)} "
                                        f"runs were submitted (recorded in {self.jobs_path(sweep_dir)}): "
                                        f"{type(exc).__name__}: {exc}") from exc
                handle = Handle(task.name, self.kind, submitted.job_id)
                _record_jobs(sweep_dir, [handle], self.kind)
                handles.append(handle)
                self._jobs.append(submitted)
        return handles

    def wait(self) -> None:
        """Block until the jobs this launcher submitted have ended (`--wait`; on Slurm, polled through sacct)."""
        for job in self._jobs:
            with contextlib.suppress(Exception):
                job.wait()


def _record_jobs(sweep_dir: Path, handles: list[Handle], kind: str) -> None:
    path = SubmititLauncher.jobs_path(sweep_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = read_jobs(sweep_dir)
    host, now = socket.gethostname(), time.time()
    records += [{"run": h.name, "job_id": h.job_id, "launcher": kind, "host": host, "submitted": now}
                for h in handles]
    atomic_write_bytes(path, to_json({"jobs": records}).encode())


def read_jobs(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Every job submitted for the sweep, oldest first (empty without SWEEP/submitit/jobs.json)."""
    path = SubmititLauncher.jobs_path(Path(sweep_dir))
    if not path.exists():
        return []
    jobs = read_json(path, "jobs file").get("jobs")
    if not isinstance(jobs, list) or not all(isinstance(j, dict) and isinstance(j.get("run"), str) and
                                             isinstance(j.get("job_id"), (str, int)) for j in jobs):
        raise FileReadError(path, "is not {\"jobs\": [{\"run\": ..., \"job_id\": ...}, ...]} as dfl writes it",
                            "jobs file")
    return list(jobs)


def latest_jobs(sweep_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Run name -> its most recent job record."""
    return {record["run"]: record for record in read_jobs(sweep_dir)}


def job_state(record: dict[str, Any], sweep_dir: Path, submitit=None) -> str:
    """"queued", "running" or "ended" for a job record: a local-executor job is alive while its controller
    process (the job id is its pid) exists on this host; a Slurm job is asked of Slurm (sacct, through submitit).
    A job that cannot be checked counts as alive, never run a run twice: "running" for a local-executor job of
    another host, "queued" for a Slurm job sacct does not know (yet)."""
    if record.get("launcher") == "submitit-local":
        if record.get("host") != socket.gethostname():
            return "running"
        from dfl.report.runs import pid_alive

        try:
            alive = pid_alive(int(record["job_id"]))
        except (TypeError, ValueError):
            return "ended"
        return "running" if alive else "ended"
    try:
        submitit = submitit or import_submitit("slurm")
        job = submitit.SlurmJob(folder=Path(sweep_dir) / JOBS_DIR / "%j", job_id=str(record["job_id"]))
        state = str(job.state).upper()
    except Exception:  # cannot tell: counted as alive (never run a run twice)
        return "queued"
    if state.startswith("UNKNOWN"):  # just submitted (sacct does not know it yet), or no sacct here
        return "queued"
    return SLURM_LIVE.get(state.split()[0], "ended")


def live_jobs(sweep_dir: str | Path, submitit=None) -> dict[str, dict[str, Any]]:
    """Run name -> {"job_id", "state"} for runs whose latest job is queued or running."""
    out = {}
    for name, record in latest_jobs(sweep_dir).items():
        state = job_state(record, Path(sweep_dir), submitit)
        if state != "ended":
            out[name] = {"job_id": record["job_id"], "state": state, "launcher": record.get("launcher")}
    return out


def make_launcher(kind: str, *, parallel: int = 1, options: SlurmOptions | None = None) -> Launcher:
    """The launcher named `kind` (one of `LAUNCHERS`)."""
    if kind == "local":
        return LocalPool(parallel)
    if kind == "slurm":
        return SubmititLauncher("slurm", options)
    if kind == "submitit-local":
        return SubmititLauncher("local", options)
    raise LauncherError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {kind!r}")

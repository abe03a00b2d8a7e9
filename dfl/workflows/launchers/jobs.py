"""The submitit jobs of a sweep.

SWEEP/submitit/jobs.json (the job of every submitted run, appended as soon as the scheduler accepted it) and the state
of each job now, so that a sweep never submits a run that is still queued or running in a live job.

submitit is an optional dependency (`pip install -e ".[cluster]"`), imported only by `import_submitit`.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from dfl.engine.results import to_json
from dfl.errors import FileReadError, LauncherError
from dfl.files import atomic_write_bytes, read_json
from dfl.workflows.launchers.base import Handle

JOBS_DIR = "submitit"  # SWEEP/submitit/: submitit's folder (pickles, logs) and jobs.json
JOBS_FILE = "jobs.json"
INSTALL_HINT = 'pip install -e ".[cluster]"'
# the Slurm job states (sacct) of a job still alive, as queued or running; any other state has ended
SLURM_LIVE = {"PENDING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued", "REQUEUE_FED": "queued",
              "CONFIGURING": "queued", "RESV_DEL_HOLD": "queued", "SUSPENDED": "queued", "RUNNING": "running",
              "COMPLETING": "running", "RESIZING": "running", "STAGE_OUT": "running", "SIGNALING": "running"}



def import_submitit(launcher: str) -> Any:
    """The submitit module, or a `LauncherError` naming `--launcher launcher` and the extra to install."""
    try:
        import submitit
    except ImportError:
        raise LauncherError(f"--launcher {launcher} needs submitit, which is not installed: "
                            f"{INSTALL_HINT}") from None
    return submitit



def jobs_path(sweep_dir: str | Path) -> Path:
    """SWEEP/submitit/jobs.json, the record of a sweep's submitted jobs."""
    return Path(sweep_dir) / JOBS_DIR / JOBS_FILE


def record_jobs(sweep_dir: Path, handles: list[Handle], kind: str) -> None:
    """Append the jobs of `handles` (submitted by the launcher `kind` from this host, now) to jobs.json."""
    path = jobs_path(sweep_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = read_jobs(sweep_dir)
    host, now = socket.gethostname(), time.time()
    records += [{"run": h.name, "job_id": h.job_id, "launcher": kind, "host": host, "submitted": now}
                for h in handles]
    atomic_write_bytes(path, to_json({"jobs": records}).encode())


def read_jobs(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Every job submitted for the sweep, oldest first (empty without SWEEP/submitit/jobs.json)."""
    path = jobs_path(Path(sweep_dir))
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


def job_state(record: dict[str, Any], sweep_dir: Path, submitit: Any = None) -> str:
    """The state of the job of a jobs.json record: "queued", "running" or "ended".

    A local-executor job is alive while its controller process (the job id is its pid) exists on this host; a
    Slurm job is asked of Slurm (sacct, through submitit). A job that cannot be checked counts as alive, so that
    no run runs twice: "running" for a local-executor job of another host, "queued" for a Slurm job sacct does
    not know (yet).
    """
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


def live_jobs(sweep_dir: str | Path, submitit: Any = None) -> dict[str, dict[str, Any]]:
    """Run name -> {"job_id", "state"} for runs whose latest job is queued or running."""
    out: dict[str, dict[str, Any]] = {}
    for name, record in latest_jobs(sweep_dir).items():
        state = job_state(record, Path(sweep_dir), submitit)
        if state != "ended":
            out[name] = {"job_id": record["job_id"], "state": state, "launcher": record.get("launcher")}
    return out


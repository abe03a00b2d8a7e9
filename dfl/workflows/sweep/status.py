"""A sweep's state read back.

Each run's state from its run directory and its latest job (`sweep_status`, `dfl sweep status DIR`), sweep.json brought
up to date (`sync_entries`), and the tables the CLI prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfl.errors import SweepError
from dfl.workflows.launchers import ERROR_LOG, JOBS_DIR, job_state, latest_jobs, read_summary, summary_metrics
from dfl.workflows.sweep.entries import read_entries, write_entries

STATES = ("queued", "running", "done", "failed", "pending")


def sync_entries(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Rewrite SWEEP/sweep.json with each run's status, error and metrics as its summary.json says now.

    After submitit jobs ended, their entries still say "queued". Returns the entries.
    """
    from dfl.report.runs import effective_status

    sweep_dir = Path(sweep_dir)
    entries = read_entries(sweep_dir)
    for entry in entries:
        summary = read_summary(sweep_dir / entry["dir"] / "summary.json")
        if summary:
            entry.update(status=effective_status(summary), error=summary.get("error"), **summary_metrics(summary))
    write_entries(sweep_dir, entries)
    return entries



def sweep_status(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Each run of the sweep in `sweep_dir`, as `dfl sweep status` lists it.

    A row is {"name", "state", "error", "job_id", "rounds_completed", "rounds", "test_acc"}, read from its run
    directory (summary.json `status`, `error`; error.log) and, where one was submitted, its latest submitit job
    (SWEEP/submitit/jobs.json; a Slurm job is asked of Slurm). `state`: "queued" (in a job not started yet),
    "running", "done" (completed or stopped early), "failed" (failed, diverged, interrupted, killed, or its job
    ended without finishing it; `error` says which, in its last line) or "pending" (never started, no job).

    Raises:
        SweepError: when `sweep_dir` holds no sweep.json.
    """
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "sweep.json").is_file():
        raise SweepError(f"{sweep_dir} is not a sweep directory (no sweep.json); give the --out of a dfl sweep")
    jobs = latest_jobs(sweep_dir)
    rows = []
    for entry in read_entries(sweep_dir):
        summary = read_summary(sweep_dir / entry["dir"] / "summary.json")
        job = jobs.get(entry["name"])
        row = {"name": entry["name"], "state": "pending", "error": None, "job_id": job and job["job_id"],
               **summary_metrics(summary), "rounds": summary.get("rounds")}
        row.update(_state(sweep_dir, sweep_dir / entry["dir"], summary, job))
        rows.append(row)
    return rows


def _state(sweep_dir: Path, run_dir: Path, summary: dict[str, Any], job: dict[str, Any] | None) -> dict[str, Any]:
    """The `state` of a run (and its `error`) from its summary and its latest job; {} for "pending"."""
    from dfl.report.runs import effective_status

    status = effective_status(summary) if summary else None
    job_state_now = job_state(job, sweep_dir) if job else None
    if job_state_now in ("queued", "running"):
        return {"state": "running" if status == "running" else job_state_now}
    if status in ("completed", "stopped"):
        return {"state": "done"}
    if status in ("failed", "diverged"):
        error = summary.get("error") or _last_line(run_dir / ERROR_LOG) or status
        return {"state": "failed", "error": f"diverged: {error}" if status == "diverged" else error}
    if status == "running" and not job:
        return {"state": "running"}  # a local run in a live process (or on a host that cannot be checked)
    if status in ("running", "killed", "interrupted"):
        done = summary.get("rounds_completed")
        what = {"interrupted": "interrupted", "killed": f"killed: its process {summary.get('pid')} is gone",
                "running": f"its job {job and job['job_id']} ended while the run was running"}[status]
        return {"state": "failed", "error": f"{what} after round {done}; run the sweep again to resume it"}
    if job:  # a job that ended without a run directory
        return {"state": "failed", "error": f"job {job['job_id']} ended without starting the run: "
                + (_last_line(_job_log(sweep_dir, job["job_id"])) or "no log")}
    if status is not None:
        return {"state": "failed", "error": f"status {status!r}"}
    return {}


def _last_line(path: Path | None) -> str | None:
    """The last non-blank line of a text file (None without one, or when it cannot be read)."""
    try:
        text = path.read_text(errors="replace") if path else ""
    except OSError:
        return None
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), None)


def _job_log(sweep_dir: Path, job_id: str) -> Path | None:
    """The stderr log submitit kept of a job, if any."""
    logs = sorted((sweep_dir / JOBS_DIR / str(job_id)).glob("*_log.err"))
    return logs[0] if logs else None


def format_sweep_status(rows: list[dict[str, Any]]) -> str:
    """The `dfl sweep status` table and a count line."""
    table = [("run", "state", "job", "rounds", "test acc", "error")]
    for r in rows:
        acc, done = r.get("test_acc"), r.get("rounds_completed")
        rounds = f"{done}/{r['rounds']}" if done is not None and r.get("rounds") else ""
        table.append((r["name"], r["state"], str(r.get("job_id") or ""), rounds,
                      f"{acc:.2%}" if isinstance(acc, (int, float)) else "",
                      (r.get("error") or "").strip().splitlines()[-1][:100] if r.get("error") else ""))
    widths = [max(len(t[c]) for t in table) for c in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
    lines.append(f"{len(rows)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return "\n".join(lines)



def format_status(entries: list[dict[str, Any]]) -> str:
    """The end-of-sweep table (one row per run) and a count line."""
    rows = [("run", "status", "action", "rounds", "test acc", "error")]
    for e in entries:
        acc = e.get("test_acc")
        rows.append((
            e["name"], e["status"], e["action"], str(e.get("rounds_completed", "")),
            f"{acc:.2%}" if isinstance(acc, (int, float)) else "",
            (e.get("error") or "").splitlines()[0][:80] if e.get("error") else "",
        ))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    counts: dict[str, int] = {}
    for e in entries:
        for key in (e["status"], e["action"]):
            counts[key] = counts.get(key, 0) + 1
    order = ("completed", "stopped", "diverged", "failed", "interrupted", "running", "killed", "skipped",
             "resumed", "started")
    lines.append(f"{len(entries)} runs: " + ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)))
    return "\n".join(lines)

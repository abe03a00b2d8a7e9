"""What a sweep does with each of its runs, and why.

Skip it, resume it from its checkpoint, or start it (over), read from what its run directory (and, for a submitit
launcher, its latest job) says now.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfl.config import Config
from dfl.directories import check_output_directory
from dfl.errors import ConfigError, FileReadError, SweepError
from dfl.files import read_toml
from dfl.workflows.launchers import Launcher, latest_jobs, read_summary
from dfl.workflows.sweep.spec import PlannedRun


@dataclass(frozen=True)
class RunPlan:
    """What a sweep does with one run.

    `action` is "skip", "resume" or "start" (start over: overwrites), and `note` a sentence saying why when that
    is not obvious (None for a fresh start or a plain skip).
    """

    action: str
    note: str | None = None


def plan_run(run_dir: Path, config: Config, *, retry_diverged: bool = False) -> RunPlan:
    """What running `config` into `run_dir` needs now, and why.

    - "skip": completed (with `config.rounds` rounds); stopped early by a callback or its target accuracy (a
      finished run, whatever `rounds` is now: `dfl run --resume` continues one on purpose); diverged (whatever
      `rounds` is now, unless `retry_diverged`); or running in a live process (this host) or on another host
      (cannot be checked);
    - "resume": a checkpoint whose config matches up to the resumable fields (interrupted, killed: its process
      is gone, failed, or completed with fewer rounds than now);
    - "start": nothing usable there, or a diverged run with `retry_diverged` (started over from scratch, not
      resumed: its checkpoint is the last good state, and resuming it would diverge again deterministically).

    Raises:
        SweepError: when the run directory holds a run of a different config (results must not mix), or a
            config.toml that cannot be read.
    """
    from dfl.engine.checkpoint import FILENAME
    from dfl.report.runs import effective_status, run_process

    if not (run_dir / "config.toml").is_file():
        return RunPlan("start")
    _check_same_config(run_dir, config)
    summary = read_summary(run_dir / "summary.json")
    status = effective_status(summary)
    done = summary.get("rounds_completed")
    checkpoint = (run_dir / FILENAME).is_file()
    if status == "completed" and done == config.rounds:
        return RunPlan("skip")
    if status == "stopped":
        by = summary.get("stopped_by") or "a callback or its target accuracy"
        return RunPlan("skip", f"stopped early after round {done} by {by}; a stopped run is finished and left as "
                               f"it is (dfl run --resume {run_dir} --no-stop-at-target continues it)")
    if status == "diverged":
        return _diverged_plan(run_dir, config, summary, retry_diverged)
    if status == "running":
        process, pid, host = run_process(summary), summary.get("pid"), summary.get("host")
        if process == "alive":
            return RunPlan("skip", f"still running (process {pid} on this host); left alone")
        if process == "elsewhere":
            return RunPlan("skip", f"running on host {host} (process {pid}) as its summary.json says, which cannot "
                                   f"be checked from here; left alone: if that process is gone, run the sweep on "
                                   f"{host} to resume it, or delete {run_dir} to start it over")
    if status in ("killed", "interrupted", "running", "failed") or (status == "completed" and checkpoint):
        return _unfinished_plan(config, summary, status, checkpoint)
    return RunPlan("resume" if checkpoint else "start")


def _check_same_config(run_dir: Path, config: Config) -> None:
    """Refuse a run directory whose config.toml differs from `config` beyond the fields a resume may change."""
    from dfl.engine.checkpoint import changed_fields

    stored_path = run_dir / "config.toml"
    try:
        read_toml(stored_path, "config file")  # the file itself first: Config.from_toml names no file for bad bytes
        stored = Config.from_toml(stored_path)
    except (ConfigError, FileReadError) as exc:
        # the message names the file (the reader's one line): what is wrong with it, and what to do
        raise SweepError(f"run {config.name}: {exc}; dfl cannot tell which run {run_dir} holds: repair that file, "
                         "or delete that run directory to start the run over") from exc
    differ = changed_fields(stored.to_dict(), config)
    if differ:
        shown = ", ".join(f"{n} (there {getattr(stored, n)!r}, now {getattr(config, n)!r})" for n in differ)
        raise SweepError(f"run {config.name}: {run_dir} holds a run with a different config: {shown}; use a new "
                         "--out for the changed sweep (or delete that run directory)")


def _diverged_plan(run_dir: Path, config: Config, summary: dict[str, Any], retry_diverged: bool) -> RunPlan:
    """The plan of a diverged run: kept, or started over from scratch with `retry_diverged`.

    Resuming its last good checkpoint would diverge again.
    """
    from dfl.report.runs import has_metrics

    done = summary.get("rounds_completed")
    when = f" with {done} of {summary.get('rounds', '?')} rounds completed" if isinstance(done, int) else ""
    if not has_metrics(run_dir):
        when += ", before its first evaluation (no metrics recorded)"
    if retry_diverged:
        return RunPlan("start", f"diverged{when}; --retry-diverged: started over from scratch (not resumed: "
                                "its last good checkpoint would diverge again)")
    grew = summary.get("rounds")
    grew = f"; rounds is now {config.rounds} (was {grew}), but" if isinstance(grew, int) and \
        grew != config.rounds else ";"
    return RunPlan("skip", f"diverged{when}{grew} it is kept as it is (resuming would diverge again); "
                           "--retry-diverged starts it over from scratch")


def _unfinished_plan(config: Config, summary: dict[str, Any], status: str, checkpoint: bool) -> RunPlan:
    """The plan of a run that ended before its rounds: resumed from its checkpoint, or started over without one.

    Killed, interrupted, failed, a "running" summary without a process, or completed with fewer rounds than now.
    """
    done = summary.get("rounds_completed")
    what = {
        "killed": f"its process {summary.get('pid')} is gone (killed or crashed)",
        "interrupted": "interrupted",
        "running": "its summary says running but records no process (a run from an older version)",
        "failed": "failed",
        "completed": f"completed with {done} rounds, now {config.rounds}",
    }[status]
    if status != "completed" and isinstance(done, int):
        what += f" after round {done}" if done > 0 else " before its first round"
    if checkpoint:
        return RunPlan("resume", f"{what}; resumed from its checkpoint")
    return RunPlan("start", f"{what}; no checkpoint: started over")


def plan_runs(out: str | Path, planned: list[PlannedRun], *, retry_diverged: bool = False,
              launcher: Launcher | None = None) -> list[RunPlan]:
    """`plan_run` for every run, with what a submitit launcher knows of its jobs (SWEEP/submitit/jobs.json).

    A run whose latest job is still queued or running is skipped (never run twice); a run whose summary says
    "running" (on a compute node: cannot be checked from here) but whose job has ended (node failure, scancel,
    a time limit without requeue) is resumed from its checkpoint, or started over without one. Every run
    directory is checked (`dfl.directories.check_output_directory`) before any is read.
    """
    from dfl.engine.checkpoint import FILENAME

    out = Path(out)
    check_output_directory(out, "sweep")  # a folder dfl did not make is refused before anything in it is read
    for p in planned:  # ... and so is a folder of the user's where a run directory goes
        check_output_directory(out / "runs" / p.name, "run", overwrite=True, adopt_own_files=True,
                               subject=f"the directory {out / 'runs' / p.name} of run {p.name}")
    tracks_jobs = launcher is not None and launcher.kind != "local"
    live = launcher.live_jobs(out) if launcher is not None and tracks_jobs else {}
    jobs = latest_jobs(out) if tracks_jobs else {}
    plans = []
    for p in planned:
        run_dir = out / "runs" / p.name
        if p.name in live:
            job = live[p.name]
            plans.append(RunPlan("skip", f"{job['state']} in submitit job {job['job_id']}; left alone"))
            continue
        plan = plan_run(run_dir, p.config, retry_diverged=retry_diverged)
        if plan.action == "skip" and p.name in jobs and read_summary(run_dir / "summary.json").get("status") == \
                "running":
            checkpoint = (run_dir / FILENAME).is_file()
            plan = RunPlan("resume" if checkpoint else "start",
                           f"its job {jobs[p.name]['job_id']} ended while the run was running; "
                           + ("resumed from its checkpoint" if checkpoint else "no checkpoint: started over"))
        plans.append(plan)
    return plans

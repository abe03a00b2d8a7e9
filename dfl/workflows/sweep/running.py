"""Running a sweep.

Every run planned and checked first, sweep.toml and sweep.json written, then the runs to do handed to a launcher,
sweep.json rewritten as each run ends (or is queued).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dfl.directories import claim_directory
from dfl.errors import FileReadError, SweepError
from dfl.files import atomic_write_bytes, remove_stale_temporaries
from dfl.workflows.launchers import Handle, Launcher, LocalPool, RunTask, read_summary, summary_metrics
from dfl.workflows.sweep.entries import read_entries, write_entries
from dfl.workflows.sweep.plan import RunPlan, plan_runs
from dfl.workflows.sweep.spec import PlannedRun, Sweep, left_out_lines

ACTION_WORDS = {"skip": "skipped", "resume": "resumed", "start": "started"}  # a plan's action, as an entry says it


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    parallel: int | None = None,
    *,
    log: Callable[[str], None] | None = print,
    retry_diverged: bool = False,
    launcher: Launcher | None = None,
) -> list[dict[str, Any]]:
    """Run every combination of `sweep` into `out/runs/<name>/` and return the sweep.json run entries.

    Each entry: name, dir ("runs/<name>"), overrides, status ("completed", "stopped", "diverged", "failed",
    "interrupted", "queued" for a run in a submitit job, or a skipped run's as its summary says), error (None or
    "Type: message"), action ("skipped", "resumed", "started"), note (why, when `plan_run` gives a reason),
    job_id (submitit), plus rounds_completed, test_acc and seconds when known.

    Args:
        sweep: the sweep spec.
        out: the sweep directory.
        parallel: the local pool's runs at once (default: the spec's; threads as `launchers.worker_threads`).
        log: where the progress lines go (None: nowhere).
        retry_diverged: start diverged runs over (by default they are skipped, even when `rounds` grew).
        launcher: where the runs execute (default: a `LocalPool`, which returns when every run has ended; a
            submitit launcher returns once the runs are queued).
    """
    out = Path(out)
    launcher = launcher if launcher is not None else _local_pool(sweep, parallel)
    planned = sweep.plan()
    plans = plan_runs(out, planned, retry_diverged=retry_diverged, launcher=launcher)  # all checked before any runs
    say = log or _silent
    entries = _entries(out, planned, plans, launcher, say)
    _claim(out, sweep, entries, plans)
    index = {p.name: i for i, (p, plan) in enumerate(zip(planned, plans)) if plan.action != "skip"}
    tasks = [RunTask(planned[i].name, planned[i].config, out / entries[i]["dir"], plans[i].action)
             for i in index.values()]
    say(_sweep_line(sweep, out, len(planned), len(tasks), launcher))
    for line in left_out_lines(planned):
        say(line)

    def started(count: int, task: RunTask) -> None:
        say(_start_line(count, len(tasks), entries[index[task.name]], task.action))

    def finished(count: int, task: RunTask, outcome: dict[str, Any]) -> None:
        entry = entries[index[task.name]]
        entry.update(outcome)
        if entry["status"] != "interrupted":
            say(_outcome_line(entry))
        write_entries(out, entries)

    handles = launcher.submit(tasks, out, started=started, finished=finished)
    _record_queued(out, entries, index, handles, say)
    return entries


def _silent(text: str) -> None:
    """The log of a sweep run with `log=None`."""


def _local_pool(sweep: Sweep, parallel: int | None) -> LocalPool:
    """The default launcher: a `LocalPool` of `parallel` (default: the spec's) runs at once."""
    parallel = sweep.parallel if parallel is None else parallel
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise SweepError(f"parallel must be an integer >= 1, got {parallel!r}")
    return LocalPool(parallel)


def _entries(out: Path, planned: list[PlannedRun], plans: list[RunPlan], launcher: Launcher,
             say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The sweep.json entry of each run before any runs.

    "pending", or a skipped run's state as its summary (and its live job) says, with the seconds it took when the
    previous sweep.json recorded them; a skipped run's reason is said.
    """
    from dfl.report.runs import effective_status

    live = launcher.live_jobs(out) if launcher.kind != "local" else {}
    took = _seconds_taken(out)
    entries = []
    for p, plan in zip(planned, plans):
        entry: dict[str, Any] = {"name": p.name, "dir": f"runs/{p.name}", "overrides": p.overrides,
                                 "status": "pending", "error": None, "action": ACTION_WORDS[plan.action]}
        if plan.note:
            entry["note"] = plan.note
        if p.left_out:
            entry["left_out"] = list(p.left_out)  # [base] fields this run does not read
        if plan.action == "skip":
            summary = read_summary(out / f"runs/{p.name}" / "summary.json")
            entry.update(status=effective_status(summary), error=summary.get("error"), **summary_metrics(summary))
            if p.name in took:
                entry["seconds"] = took[p.name]
            if p.name in live:
                entry.update(status=live[p.name]["state"], job_id=live[p.name]["job_id"])
            if plan.note:
                say(f"skip {p.name}: {plan.note}")
        entries.append(entry)
    return entries


def _seconds_taken(out: Path) -> dict[str, float]:
    """Run name -> the seconds its run took, as the sweep.json already in `out` says (none: empty)."""
    if not (out / "sweep.json").is_file():
        return {}
    try:
        entries = read_entries(out)
    except FileReadError:  # unreadable: the runs' own files decide what is done, as always
        return {}
    return {e["name"]: e["seconds"] for e in entries
            if isinstance(e.get("seconds"), (int, float)) and not isinstance(e.get("seconds"), bool)}


def _claim(out: Path, sweep: Sweep, entries: list[dict[str, Any]], plans: list[RunPlan]) -> None:
    """Mark the sweep directory dfl's and write sweep.toml and sweep.json; mark each run directory to run.

    The marks are `dfl.directories`'; a run directory is marked before it runs.
    """
    claim_directory(out, "sweep")
    remove_stale_temporaries(out, ("sweep.toml", "sweep.json"))  # left by a sweep killed mid-write
    atomic_write_bytes(out / "sweep.toml", sweep.to_toml().encode())
    write_entries(out, entries)
    for entry, plan in zip(entries, plans):
        if plan.action != "skip":
            claim_directory(out / entry["dir"], "run", overwrite=True, adopt_own_files=True,
                            subject=f"the directory {out / entry['dir']} of run {entry['name']}")


def _sweep_line(sweep: Sweep, out: Path, total: int, todo: int, launcher: Launcher) -> str:
    """The line that opens a sweep: its runs, how many are done, how many run and where."""
    parallel = getattr(launcher, "parallel", 1)
    where = {"local": f", {min(parallel, todo)} at a time" if todo and parallel > 1 else "",
             "slurm": " as a Slurm job array", "submitit-local": " through submitit's local executor"}
    return (f"sweep {sweep.name}: {total} runs in {out} ({total - todo} done, {todo} to run"
            + (where.get(launcher.kind, "") if todo else "") + ")")


def _record_queued(out: Path, entries: list[dict[str, Any]], index: dict[str, int], handles: list[Handle],
                   say: Callable[[str], None]) -> None:
    """Mark the runs a submitit launcher queued "queued" with their job, say so, and rewrite sweep.json."""
    queued = [h for h in handles if h.job_id is not None]
    for count, handle in enumerate(queued, 1):
        entries[index[handle.name]].update(status="queued", job_id=handle.job_id)
        say(f"[{count}/{len(queued)}] queued {handle.name} (job {handle.job_id}, "
            f"{entries[index[handle.name]]['action'][:-2]})")
    if queued:
        write_entries(out, entries)


def _start_line(count: int, total: int, entry: dict[str, Any], action: str) -> str:
    """The line said when a run starts: `[count/total] start NAME` (or resume), with its plan's note."""
    text = f"[{count}/{total}] {'resume' if action == 'resume' else 'start'} {entry['name']}"
    return text + (f" ({entry['note']})" if entry.get("note") else "")


def _outcome_line(entry: dict[str, Any]) -> str:
    """The line said when a run ends: its status, name, test accuracy, seconds and error."""
    acc = entry.get("test_acc")
    text = f"      {entry['status']:<9} {entry['name']}"
    if isinstance(acc, (int, float)):
        text += f"  test acc {acc:.2%}"
    if entry.get("seconds") is not None:
        text += f"  ({entry['seconds']:.1f} s)"
    if entry.get("error"):
        text += f"  {entry['error'].splitlines()[0][:200]}"
    if entry.get("status") == "diverged" and entry.get("note"):
        text += f" ({entry['note']})"
    return text

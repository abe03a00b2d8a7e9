"""Sweeps: one TOML spec → the cartesian product of its `[vary]` lists → one run directory per combination.

A sweep file has `[base]` (Config fields shared by every run), `[vary]` (field -> list of values; the runs are
the cartesian product, in the order the keys appear, the first key varying slowest) and an optional
`[sweep]` table (`name`, `parallel`) and an optional `[slurm]` table (the defaults of `--launcher slurm`:
`partition`, `time`, `gpus_per_run`, ... and extra sbatch options; `dfl.workflows.launchers.SlurmOptions`).
A key of a table-valued field may be varied on its own with a dotted key,
`algorithm_options.clip = [0.5, 1.0]` (or `model_options.hidden`, ...): each run gets the base table with that
key set. The sweep directory holds

    sweep.toml        the spec that was run (normalised; `dfl sweep SWEEP/sweep.toml --out SWEEP` resumes it)
    sweep.json        {"runs": [{"name", "dir", "overrides", "status", "error", ...}]}, rewritten after each run
    runs/<name>/      ordinary run directories

Running a sweep again is idempotent: a completed run is skipped (resumed if `rounds` grew), a run with a
checkpoint is resumed from it (`dfl.run(..., resume=True)`), any other run is started over. A diverged run is
skipped even when `rounds` grew: resuming its last good checkpoint would diverge again, deterministically;
`retry_diverged=True` (`dfl sweep --retry-diverged`) starts it over from scratch instead. A run whose summary
says "running" is left alone while its process is alive (or on another host, where it cannot be checked); one
whose process on this host is gone (SIGKILL, crash: `dfl.report.runs.effective_status` "killed") is treated
like an interrupted run. A run that fails is recorded and the others go on; a run whose checkpoint is unreadable
(truncated, corrupt) is reported failed on every rerun, never restarted silently: delete its directory to start
it over. `plan_run` says what will be done to each run and why (`dfl sweep --dry-run` prints it).

Where the runs execute is a launcher's business (`dfl.workflows.launchers`): the local pool below by default, or
a Slurm job array / submitit's local executor, whose jobs are recorded in SWEEP/submitit/jobs.json so that a
rerun never submits a run that is still queued or running (`plan_runs`); `sweep_status` reads each run's state
back from its run directory and its job (`dfl sweep status DIR`).

While a local sweep runs, SIGINT, SIGTERM and SIGHUP stop it: the worker processes get SIGTERM (SIGKILL after
`STOP_GRACE_SECONDS`), sweep.json marks their runs "interrupted", and `SweepInterrupted` is raised (the CLI exits
128 + the signal number). On Linux a worker also gets SIGTERM when the sweep process dies by any means
(`PR_SET_PDEATHSIG`), SIGKILL included. Runs keep their last checkpoint, so the next sweep resumes them.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dfl.errors import SweepError, SweepInterrupted  # noqa: F401 (re-exported)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from dfl.config import MAX_NAME, NAME_RE, Config
from dfl.engine.results import atomic_write_bytes, remove_stale_temporaries, to_json
from dfl.errors import ConfigError
from dfl.workflows.launchers import (  # noqa: F401 (execute_run, WORKER, ERROR_LOG re-exported)
    ERROR_LOG,
    JOBS_DIR,
    WORKER,
    Launcher,
    LocalPool,
    RunTask,
    SlurmOptions,
    _metrics,
    _read_json,
    execute_run,
    job_state,
    latest_jobs,
)

TABLES = ("sweep", "base", "vary", "slurm")
SWEEP_KEYS = ("name", "parallel")
CONFIG_FIELDS = tuple(f.name for f in fields(Config))
TABLE_FIELDS = tuple(f.name for f in fields(Config) if str(f.type).startswith("dict"))  # dotted keys vary these
NAME_CHARS = re.compile(r"[^A-Za-z0-9._=,-]")  # replaced by "_" in the run names built from settings


@dataclass(frozen=True)
class PlannedRun:
    name: str
    overrides: dict[str, Any]  # the varied fields of this run
    config: Config  # validated, `name` = the run name


@dataclass
class Sweep:
    """A parsed sweep spec: `base` Config fields, `vary` field -> list of values (in key order)."""

    base: dict[str, Any] = field(default_factory=dict)
    vary: dict[str, list[Any]] = field(default_factory=dict)
    name: str = "sweep"
    parallel: int = 1
    slurm: dict[str, Any] = field(default_factory=dict)  # the [slurm] table: defaults of the submitit launchers

    @classmethod
    def from_dict(cls, spec: dict[str, Any], where: str = "sweep spec") -> Sweep:
        """Check the tables and fields (not the values: `plan()` validates every combination's Config)."""
        loose = [k for k, v in spec.items() if not isinstance(v, dict)]
        if loose:
            raise SweepError(f"{where}: key(s) {', '.join(loose)} outside a table; put Config fields under [base] "
                             "and lists of values under [vary]")
        unknown = [k for k in spec if k not in TABLES]
        if unknown:
            raise SweepError(f"{where}: unknown table(s) {', '.join(f'[{k}]' for k in unknown)}; allowed: "
                             + ", ".join(f"[{t}]" for t in TABLES))
        meta, base, vary, slurm = (dict(spec.get(t, {})) for t in TABLES)
        SlurmOptions.from_table(slurm, where=f"{where}: [slurm]")  # a bad option fails before anything runs
        bad = [k for k in meta if k not in SWEEP_KEYS]
        if bad:
            raise SweepError(f"{where}: unknown key(s) {', '.join(bad)} in [sweep]; allowed: {', '.join(SWEEP_KEYS)}")
        name = meta.get("name", "sweep")
        if not isinstance(name, str) or len(name) > MAX_NAME or not NAME_RE.fullmatch(name):
            raise SweepError(f"{where}: [sweep] name must be 1-{MAX_NAME} letters, digits and ._=,- not starting "
                             f"with '.'; got {name!r}")
        parallel = meta.get("parallel", 1)
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise SweepError(f"{where}: [sweep] parallel must be an integer >= 1, got {parallel!r}")
        base, vary = _nest_dotted(base, where), _flatten_tables(vary)
        for table, values in (("base", base), ("vary", vary)):
            unknown = [k for k in values if k not in CONFIG_FIELDS and not is_table_key(k)]
            if unknown:
                raise SweepError(f"{where}: unknown Config field(s) {', '.join(unknown)} in [{table}]; known "
                                 f"fields: {', '.join(CONFIG_FIELDS)} (and FIELD.KEY for the tables "
                                 f"{', '.join(TABLE_FIELDS)})")
            if "name" in values:
                raise SweepError(f"{where}: 'name' cannot be set in [{table}]: each run is named after its varied "
                                 "fields; name the sweep with [sweep] name = \"...\"")
        for key, values in vary.items():
            if not isinstance(values, list):
                raise SweepError(f"{where}: [vary] {key} must be a list of values, got {values!r} (a single value "
                                 "belongs in [base])")
            if not values:
                raise SweepError(f"{where}: [vary] {key} is an empty list; give at least one value")
        both = [k for k in vary if k in base]
        for key in filter(is_table_key, vary):  # algorithm_options.clip vs algorithm_options = {clip = 1}
            head, sub = key.split(".", 1)
            if head in vary:
                raise SweepError(f"{where}: [vary] has both {head} and {key}; vary the whole table or its keys")
            if isinstance(base.get(head), dict) and sub in base[head]:
                both.append(key)
        if both:
            raise SweepError(f"{where}: field(s) {', '.join(both)} in both [base] and [vary]; keep each in one")
        return cls(base=base, vary=vary, name=name, parallel=parallel, slurm=slurm)

    def to_dict(self) -> dict[str, Any]:
        out = {"sweep": {"name": self.name, "parallel": self.parallel}, "base": dict(self.base),
               "vary": {k: list(v) for k, v in self.vary.items()}}
        if self.slurm:
            out["slurm"] = dict(self.slurm)
        return out

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def plan(self) -> list[PlannedRun]:
        """Every combination, first [vary] key slowest, each Config validated (errors name the run)."""
        keys = list(self.vary)
        planned: list[PlannedRun] = []
        seen: dict[str, dict[str, Any]] = {}
        for values in itertools.product(*(self.vary[k] for k in keys)):
            overrides = dict(zip(keys, values))
            name = run_name(overrides)
            if name in seen:
                raise SweepError(f"runs {seen[name]} and {overrides} get the same name {name!r}; make the [vary] "
                                 "values distinct")
            seen[name] = overrides
            values = {**apply_overrides(self.base, overrides), "name": name}
            planned.append(PlannedRun(name, overrides, _validated(name, values)))
        return planned

    def runs(self) -> list[tuple[str, Config]]:
        """(name, validated Config) per combination."""
        return [(p.name, p.config) for p in self.plan()]


def load_sweep(path: str | Path) -> Sweep:
    """Read a sweep TOML file (`[base]`, `[vary]`, optional `[sweep]`); every combination is validated."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {path} does not exist")
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"sweep file {path} is not valid TOML: {exc}") from exc
    sweep = Sweep.from_dict(spec, where=f"sweep file {path}")
    sweep.plan()  # fail fast on a typo in any combination
    return sweep


def is_table_key(key: str) -> bool:
    """`field.key` for a table-valued Config field (e.g. `algorithm_options.clip`)."""
    head, dot, sub = key.partition(".")
    return bool(dot) and head in TABLE_FIELDS and bool(sub)


def _nest_dotted(base: dict[str, Any], where: str) -> dict[str, Any]:
    """A quoted dotted key in [base] ("algorithm_options.clip" = 0.5) becomes a key of its table."""
    out = {k: v for k, v in base.items() if not is_table_key(k)}
    for key in [k for k in base if is_table_key(k)]:
        head, sub = key.split(".", 1)
        table = out.setdefault(head, {})
        if not isinstance(table, dict) or sub in table:
            raise SweepError(f"{where}: [base] {key} clashes with [base] {head} = {table!r}; set it once")
        out[head] = {**table, sub: base[key]}
    return out


def _flatten_tables(vary: dict[str, Any]) -> dict[str, Any]:
    """TOML's unquoted `algorithm_options.clip = [...]` in [vary] arrives as a table of lists: one dotted key per
    entry. (A whole table varied as a value is a list of tables, and stays as it is.)"""
    out: dict[str, Any] = {}
    for key, values in vary.items():
        if key in TABLE_FIELDS and isinstance(values, dict):
            out.update({f"{key}.{sub}": v for sub, v in values.items()})
        else:
            out[key] = values
    return out


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The Config values of one run: `base` with the varied fields set (a dotted key sets one key of a table)."""
    values = dict(base)
    for key, value in overrides.items():
        if is_table_key(key):
            head, sub = key.split(".", 1)
            table = values.get(head) or {}  # not a table: left for Config validation to name
            values[head] = {**table, sub: value} if isinstance(table, dict) else table
        else:
            values[key] = value
    return values


def run_name(overrides: dict[str, Any]) -> str:
    """`field=value,...` over the varied fields, e.g. `algorithm=dfedsam,topology=ring,seed=0`; characters
    outside [A-Za-z0-9._=,-] become `_`; tables render as `k=v_k=v` (`default` if empty), lists as `a-b`."""
    if not overrides:
        return "base"
    name = NAME_CHARS.sub("_", ",".join(f"{k}={_format(v)}" for k, v in overrides.items()))
    if len(name) > MAX_NAME:  # keep it a valid directory name, and unique
        import hashlib

        name = name[: MAX_NAME - 11] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list, tuple)) and not value:
        return "default" if isinstance(value, dict) else "none"
    if isinstance(value, dict):
        return "_".join(f"{k}={_format(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "-".join(_format(v) for v in value)
    return str(value)


def _validated(name: str, values: dict[str, Any]) -> Config:
    from dfl.algorithms import resolve_hyperparameters
    from dfl.engine.validation import validate

    try:
        config = validate(Config.from_dict(values))
        with warnings.catch_warnings():  # ignored options are reported when the run starts
            warnings.simplefilter("ignore")
            resolve_hyperparameters(config)
    except (ConfigError, TypeError) as exc:
        raise SweepError(f"run {name}: {exc}") from exc
    return config


# ---------------------------------------------------------------------------------------------- running
@dataclass(frozen=True)
class RunPlan:
    """What a sweep does with one run: `action` "skip", "resume" or "start" (start over: overwrites), and
    `note`, a sentence saying why when that is not obvious (None for a fresh start or a plain skip)."""

    action: str
    note: str | None = None


def inspect_run(run_dir: Path, config: Config, *, retry_diverged: bool = False) -> str:
    """The action of `plan_run`: "skip", "resume" or "start"."""
    return plan_run(run_dir, config, retry_diverged=retry_diverged).action


def plan_run(run_dir: Path, config: Config, *, retry_diverged: bool = False) -> RunPlan:
    """What running `config` into `run_dir` needs now, and why:

    - "skip": completed (with `config.rounds` rounds); stopped early by a callback or its target accuracy (a
      finished run, whatever `rounds` is now: `dfl run --resume` continues one on purpose); diverged (whatever
      `rounds` is now, unless `retry_diverged`); or running in a live process (this host) or on another host
      (cannot be checked);
    - "resume": a checkpoint whose config matches up to the resumable fields (interrupted, killed: its process
      is gone, failed, or completed with fewer rounds than now);
    - "start": nothing usable there, or a diverged run with `retry_diverged` (started over from scratch, not
      resumed: its checkpoint is the last good state, and resuming it would diverge again deterministically).

    A run directory made from a different config is an error (results must not mix)."""
    from dfl.engine.checkpoint import FILENAME, changed_fields
    from dfl.report.runs import effective_status, has_metrics, run_process

    stored_path = run_dir / "config.toml"
    if not stored_path.is_file():
        return RunPlan("start")
    try:
        stored = Config.from_toml(stored_path)
    except ConfigError as exc:
        raise SweepError(f"run {config.name}: cannot read {stored_path}: {exc}") from exc
    differ = changed_fields(stored.to_dict(), config)
    if differ:
        shown = ", ".join(f"{n} (there {getattr(stored, n)!r}, now {getattr(config, n)!r})" for n in differ)
        raise SweepError(f"run {config.name}: {run_dir} holds a run with a different config: {shown}; use a new "
                         "--out for the changed sweep (or delete that run directory)")
    summary = _read_json(run_dir / "summary.json")
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
    if status == "running":
        process, pid, host = run_process(summary), summary.get("pid"), summary.get("host")
        if process == "alive":
            return RunPlan("skip", f"still running (process {pid} on this host); left alone")
        if process == "elsewhere":
            return RunPlan("skip", f"running on host {host} (process {pid}) as its summary.json says, which cannot "
                                   f"be checked from here; left alone: if that process is gone, run the sweep on "
                                   f"{host} to resume it, or delete {run_dir} to start it over")
    if status in ("killed", "interrupted", "running", "failed") or (status == "completed" and checkpoint):
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
    if checkpoint:
        return RunPlan("resume")
    return RunPlan("start")


def plan_runs(out: str | Path, planned: list[PlannedRun], *, retry_diverged: bool = False,
              launcher: Launcher | None = None) -> list[RunPlan]:
    """`plan_run` for every run, with what a submitit launcher knows of its jobs (SWEEP/submitit/jobs.json): a
    run whose latest job is still queued or running is skipped (never run twice); a run whose summary says
    "running" (on a compute node: cannot be checked from here) but whose job has ended (node failure, scancel,
    a time limit without requeue) is resumed from its checkpoint, or started over without one."""
    from dfl.engine.checkpoint import FILENAME

    out = Path(out)
    tracks_jobs = launcher is not None and launcher.kind != "local"
    live = launcher.live_jobs(out) if tracks_jobs else {}
    jobs = latest_jobs(out) if tracks_jobs else {}
    plans = []
    for p in planned:
        run_dir = out / "runs" / p.name
        if p.name in live:
            job = live[p.name]
            plans.append(RunPlan("skip", f"{job['state']} in submitit job {job['job_id']}; left alone"))
            continue
        plan = plan_run(run_dir, p.config, retry_diverged=retry_diverged)
        if plan.action == "skip" and p.name in jobs and _read_json(run_dir / "summary.json").get("status") == \
                "running":
            checkpoint = (run_dir / FILENAME).is_file()
            plan = RunPlan("resume" if checkpoint else "start",
                           f"its job {jobs[p.name]['job_id']} ended while the run was running; "
                           + ("resumed from its checkpoint" if checkpoint else "no checkpoint: started over"))
        plans.append(plan)
    return plans


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
    "interrupted", "queued" for a run submitted to a submitit job, or for a skipped run whatever its summary
    says, e.g. "running"), error (None or "Type: message"), action ("skipped", "resumed", "started"), note (why,
    when `plan_run` gives a reason), job_id (submitit), plus rounds_completed, test_acc and seconds when known.

    `launcher` (`dfl.workflows.launchers`) executes the runs; by default a `LocalPool` of `parallel` (default:
    the spec's) worker processes, each with its run's threads (for "auto": this process's // parallel,
    `launchers.worker_threads`) and no progress bar, and `run_sweep` returns when every run has ended. A
    submitit launcher returns once the runs are queued.
    `retry_diverged` starts diverged runs over from scratch (by default they are skipped, even when `rounds`
    grew)."""
    out = Path(out)
    if launcher is None:
        parallel = sweep.parallel if parallel is None else parallel
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise SweepError(f"parallel must be an integer >= 1, got {parallel!r}")
        launcher = LocalPool(parallel)
    planned = sweep.plan()
    plans = plan_runs(out, planned, retry_diverged=retry_diverged, launcher=launcher)  # all checked before any runs
    actions = [plan.action for plan in plans]
    say = log or (lambda text: None)
    live = launcher.live_jobs(out) if launcher.kind != "local" else {}

    entries = []
    for p, plan in zip(planned, plans):
        entry = {"name": p.name, "dir": f"runs/{p.name}", "overrides": p.overrides, "status": "pending",
                 "error": None, "action": {"skip": "skipped", "resume": "resumed", "start": "started"}[plan.action]}
        if plan.note:
            entry["note"] = plan.note
        if plan.action == "skip":
            from dfl.report.runs import effective_status

            summary = _read_json(out / entry["dir"] / "summary.json")
            entry.update(status=effective_status(summary), error=summary.get("error"), **_metrics(summary))
            if p.name in live:
                entry.update(status=live[p.name]["state"], job_id=live[p.name]["job_id"])
            if plan.note:
                say(f"skip {p.name}: {plan.note}")
        entries.append(entry)
    if out.is_dir():
        remove_stale_temporaries(out, ("sweep.toml", "sweep.json"))  # left by a sweep killed mid-write
    atomic_write_bytes(out / "sweep.toml", sweep.to_toml().encode())
    _write_entries(out, entries)

    todo = [i for i, a in enumerate(actions) if a != "skip"]
    index = {planned[i].name: i for i in todo}
    tasks = [RunTask(planned[i].name, planned[i].config, out / entries[i]["dir"], actions[i]) for i in todo]
    parallel = getattr(launcher, "parallel", 1)
    where = {"local": f", {min(parallel, len(todo))} at a time" if todo and parallel > 1 else "",
             "slurm": " as a Slurm job array", "submitit-local": " through submitit's local executor"}
    say(f"sweep {sweep.name}: {len(planned)} runs in {out} ({len(planned) - len(todo)} done, {len(todo)} to run"
        + (where.get(launcher.kind, "") if todo else "") + ")")

    def started(count: int, task: RunTask) -> None:
        say(_start_line(count, len(todo), entries[index[task.name]], task.action))

    def finished(count: int, task: RunTask, outcome: dict[str, Any]) -> None:
        entry = entries[index[task.name]]
        entry.update(outcome)
        if entry["status"] != "interrupted":
            say(_one_line(entry))
        _write_entries(out, entries)

    handles = launcher.submit(tasks, out, started=started, finished=finished)
    queued = [h for h in handles if h.job_id is not None]
    for count, handle in enumerate(queued, 1):
        entries[index[handle.name]].update(status="queued", job_id=handle.job_id)
        say(f"[{count}/{len(queued)}] queued {handle.name} (job {handle.job_id}, "
            f"{entries[index[handle.name]]['action'][:-2]})")
    if queued:
        _write_entries(out, entries)
    return entries


# ---------------------------------------------------------------------------------------------- status
def sync_entries(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Rewrite SWEEP/sweep.json with each run's status, error and metrics as its summary.json says now (after
    submitit jobs ended: the entries said "queued"); returns the entries."""
    from dfl.report.runs import effective_status

    sweep_dir = Path(sweep_dir)
    entries = read_entries(sweep_dir)
    for entry in entries:
        summary = _read_json(sweep_dir / entry["dir"] / "summary.json")
        if summary:
            entry.update(status=effective_status(summary), error=summary.get("error"), **_metrics(summary))
    _write_entries(sweep_dir, entries)
    return entries


STATES = ("queued", "running", "done", "failed", "pending")


def sweep_status(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Each run of the sweep in `sweep_dir`: {"name", "state", "error", "job_id", "rounds_completed",
    "rounds", "test_acc"}, read from its run directory (summary.json `status`, `error`; error.log) and, where
    one was submitted, its latest submitit job (SWEEP/submitit/jobs.json; a Slurm job is asked of Slurm).
    `state`: "queued" (in a job not started yet), "running", "done" (completed or stopped early), "failed"
    (failed, diverged, interrupted, killed, or its job ended without finishing it; `error` says which, in its
    last line) or "pending" (never started, no job)."""
    from dfl.report.runs import effective_status

    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "sweep.json").is_file():
        raise SweepError(f"{sweep_dir} is not a sweep directory (no sweep.json); give the --out of a dfl sweep")
    jobs = latest_jobs(sweep_dir)
    rows = []
    for entry in read_entries(sweep_dir):
        run_dir = sweep_dir / entry["dir"]
        summary = _read_json(run_dir / "summary.json")
        status = effective_status(summary) if summary else None
        job = jobs.get(entry["name"])
        job_state_now = job_state(job, sweep_dir) if job else None
        row = {"name": entry["name"], "state": "pending", "error": None, "job_id": job and job["job_id"],
               **_metrics(summary), "rounds": summary.get("rounds")}
        if job_state_now in ("queued", "running"):
            row["state"] = "running" if status == "running" else job_state_now
        elif status in ("completed", "stopped"):
            row["state"] = "done"
        elif status in ("failed", "diverged"):
            row.update(state="failed", error=summary.get("error") or _last_line(run_dir / ERROR_LOG) or status)
            if status == "diverged":
                row["error"] = f"diverged: {row['error']}"
        elif status == "running" and not job:
            row["state"] = "running"  # a local run in a live process (or on a host that cannot be checked)
        elif status in ("running", "killed", "interrupted"):
            done = summary.get("rounds_completed")
            what = {"interrupted": "interrupted", "killed": f"killed: its process {summary.get('pid')} is gone",
                    "running": f"its job {job and job['job_id']} ended while the run was running"}[status]
            row.update(state="failed", error=f"{what} after round {done}; run the sweep again to resume it")
        elif job:  # a job that ended without a run directory
            row.update(state="failed", error=f"job {job['job_id']} ended without starting the run: "
                       + (_last_line(_job_log(sweep_dir, job["job_id"])) or "no log"))
        elif status is not None:
            row.update(state="failed", error=f"status {status!r}")
        rows.append(row)
    return rows


def _last_line(path: Path | None) -> str | None:
    try:
        text = path.read_text(errors="replace") if path else ""
    except OSError:
        return None
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), None)


def _job_log(sweep_dir: Path, job_id: str) -> Path | None:
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


# ---------------------------------------------------------------------------------------------- helpers
def _write_entries(out: Path, entries: list[dict[str, Any]]) -> None:
    atomic_write_bytes(out / "sweep.json", to_json({"runs": entries}).encode())


def read_entries(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The run entries of SWEEP/sweep.json."""
    return json.loads((Path(sweep_dir) / "sweep.json").read_text())["runs"]


def _start_line(count: int, total: int, entry: dict[str, Any], action: str) -> str:
    text = f"[{count}/{total}] {'resume' if action == 'resume' else 'start'} {entry['name']}"
    return text + (f" ({entry['note']})" if entry.get("note") else "")


def _one_line(entry: dict[str, Any]) -> str:
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

"""Sweeps: one TOML spec → the cartesian product of its `[vary]` lists → one run directory per combination.

A sweep file has `[base]` (Config fields shared by every run), `[vary]` (field -> list of values; the runs are
the cartesian product, in the order the keys appear, the first key varying slowest) and an optional
`[sweep]` table (`name`, `parallel`). A key of a table-valued field may be varied on its own with a dotted key,
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

While a sweep runs, SIGINT, SIGTERM and SIGHUP stop it: the worker processes get SIGTERM (SIGKILL after
`STOP_GRACE_SECONDS`), sweep.json marks their runs "interrupted", and `SweepInterrupted` is raised (the CLI exits
128 + the signal number). On Linux a worker also gets SIGTERM when the sweep process dies by any means
(`PR_SET_PDEATHSIG`), SIGKILL included. Runs keep their last checkpoint, so the next sweep resumes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
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

TABLES = ("sweep", "base", "vary")
SWEEP_KEYS = ("name", "parallel")
CONFIG_FIELDS = tuple(f.name for f in fields(Config))
TABLE_FIELDS = tuple(f.name for f in fields(Config) if str(f.type).startswith("dict"))  # dotted keys vary these
NAME_CHARS = re.compile(r"[^A-Za-z0-9._=,-]")  # replaced by "_" in the run names built from settings
ERROR_LOG = "error.log"
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
STOP_GRACE_SECONDS = 10.0  # SIGTERM'd workers that have not exited by then get SIGKILL


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
        meta, base, vary = (dict(spec.get(t, {})) for t in TABLES)
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
        return cls(base=base, vary=vary, name=name, parallel=parallel)

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": {"name": self.name, "parallel": self.parallel}, "base": dict(self.base),
                "vary": {k: list(v) for k, v in self.vary.items()}}

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


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    parallel: int | None = None,
    *,
    log: Callable[[str], None] | None = print,
    retry_diverged: bool = False,
) -> list[dict[str, Any]]:
    """Run every combination of `sweep` into `out/runs/<name>/` and return the sweep.json run entries.

    Each entry: name, dir ("runs/<name>"), overrides, status ("completed", "stopped", "diverged", "failed",
    "interrupted", or for a skipped run whatever its summary says, e.g. "running"), error (None or
    "Type: message"), action ("skipped", "resumed", "started"), note (why, when `plan_run` gives a reason), plus
    rounds_completed, test_acc and seconds when known. `parallel` (default: the spec's) > 1 runs that many
    worker processes, each with cpu_count // parallel torch threads and no progress bar. `retry_diverged`
    starts diverged runs over from scratch (by default they are skipped, even when `rounds` grew)."""
    out = Path(out)
    parallel = sweep.parallel if parallel is None else parallel
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise SweepError(f"parallel must be an integer >= 1, got {parallel!r}")
    planned = sweep.plan()
    plans = [plan_run(out / "runs" / p.name, p.config, retry_diverged=retry_diverged)
             for p in planned]  # all checked before any runs
    actions = [plan.action for plan in plans]
    say = log or (lambda text: None)

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
            if plan.note:
                say(f"skip {p.name}: {plan.note}")
        entries.append(entry)
    if out.is_dir():
        remove_stale_temporaries(out, ("sweep.toml", "sweep.json"))  # left by a sweep killed mid-write
    atomic_write_bytes(out / "sweep.toml", sweep.to_toml().encode())
    _write_entries(out, entries)
    with _signals_interrupt():
        _run_todo(sweep, planned, actions, entries, out, parallel, say)
    return entries


def _run_todo(sweep, planned, actions, entries, out: Path, parallel: int, say) -> None:
    todo = [i for i, a in enumerate(actions) if a != "skip"]
    say(f"sweep {sweep.name}: {len(planned)} runs in {out} ({len(planned) - len(todo)} done, {len(todo)} to run"
        + (f", {min(parallel, len(todo))} at a time)" if todo and parallel > 1 else ")"))
    if parallel > 1 and len(todo) > 1:
        _run_parallel(planned, actions, entries, todo, out, parallel, say)
    else:
        for count, i in enumerate(todo, 1):
            p = planned[i]
            say(_start_line(count, len(todo), entries[i], actions[i]))
            try:
                entries[i].update(execute_run(p.config, out / entries[i]["dir"], actions[i]))
            except BaseException:  # Ctrl-C: leave an honest sweep.json behind
                entries[i].update(status="interrupted")
                _write_entries(out, entries)
                raise
            say(_one_line(entries[i]))
            _write_entries(out, entries)


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


def _run_parallel(planned, actions, entries, todo, out: Path, parallel: int, say) -> None:
    """Worker subprocesses, at most `parallel` at once; each run's stdout/stderr go to temporary files, kept in
    the run directory as error.log when it fails."""
    threads = max(1, _cpu_count() // parallel)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    queue, running, count = list(todo), {}, 0
    preexec = _die_with_parent()
    try:
        while queue or running:
            while queue and len(running) < parallel:
                i = queue.pop(0)
                count += 1
                run_dir = out / entries[i]["dir"]
                run_dir.mkdir(parents=True, exist_ok=True)
                job = {"config": planned[i].config.replace(progress=False).to_dict(), "out": str(run_dir),
                       "action": actions[i], "threads": threads}
                stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
                proc = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(job)], stdout=stdout,
                                        stderr=stderr, stdin=subprocess.DEVNULL, env=env,
                                        preexec_fn=preexec)
                running[proc] = (i, stdout, stderr, time.perf_counter())
                say(_start_line(count, len(todo), entries[i], actions[i]))
            done = [proc for proc in running if proc.poll() is not None]
            if not done:
                time.sleep(0.05)
                continue
            for proc in done:
                i, stdout, stderr, tic = running.pop(proc)
                entries[i].update(_worker_outcome(proc.returncode, stdout, stderr, out / entries[i]["dir"]))
                entries[i].setdefault("seconds", time.perf_counter() - tic)
                say(_one_line(entries[i]))
                _write_entries(out, entries)
    except BaseException as exc:  # a signal (SweepInterrupted), Ctrl-C, or a bug here: no worker outlives the sweep
        _stop_workers(list(running))
        for i, stdout, stderr, _tic in running.values():
            stdout.close()
            stderr.close()
            entries[i].update(status="interrupted", error=None)
        if isinstance(exc, SweepInterrupted):
            exc.stopped = len(running)
        _write_entries(out, entries)
        raise


# The worker: runs one job (argv[1], JSON) with `execute_run` and prints its outcome as the last stdout line.
WORKER = "import sys; from dfl.workflows.sweep import _worker_main; sys.exit(_worker_main(sys.argv[1]))"


def _worker_main(job_json: str) -> int:
    import torch

    from dfl.engine.runner import raise_on_signal

    # the sweep stops its workers with SIGTERM (and so does the kernel when the sweep dies): the run then records
    # status "interrupted" with its last completed round instead of dying mid-summary
    signal.signal(signal.SIGTERM, raise_on_signal)
    job = json.loads(job_json)
    torch.set_num_threads(int(job["threads"]))
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


# ---------------------------------------------------------------------------------------------- helpers
def _write_entries(out: Path, entries: list[dict[str, Any]]) -> None:
    atomic_write_bytes(out / "sweep.json", to_json({"runs": entries}).encode())


def read_entries(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The run entries of SWEEP/sweep.json."""
    return json.loads((Path(sweep_dir) / "sweep.json").read_text())["runs"]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _metrics(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in ("rounds_completed", "test_acc") if k in summary}


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return os.cpu_count() or 1


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

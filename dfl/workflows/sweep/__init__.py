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

Where the runs execute is a launcher's business (`dfl.workflows.launchers`): the local pool by default, or
a Slurm job array / submitit's local executor, whose jobs are recorded in SWEEP/submitit/jobs.json so that a
rerun never submits a run that is still queued or running (`plan_runs`); `sweep_status` reads each run's state
back from its run directory and its job (`dfl sweep status DIR`).

While a local sweep runs, SIGINT, SIGTERM and SIGHUP stop it: the worker processes get SIGTERM (SIGKILL after
`STOP_GRACE_SECONDS`), sweep.json marks their runs "interrupted", and `SweepInterrupted` is raised (the CLI exits
128 + the signal number). On Linux a worker also gets SIGTERM when the sweep process dies by any means
(`PR_SET_PDEATHSIG`), SIGKILL included. Runs keep their last checkpoint, so the next sweep resumes them.

Modules, each importing only those before it: `naming` (run names), `spec` (`Sweep`, `load_sweep`), `entries`
(sweep.json), `plan` (`plan_run`, `plan_runs`), `running` (`run_sweep`) and `status` (`sweep_status` and the
tables `dfl sweep` prints).
"""

from __future__ import annotations

from dfl.errors import SweepError
from dfl.workflows.sweep.entries import read_entries
from dfl.workflows.sweep.naming import run_name
from dfl.workflows.sweep.plan import RunPlan, plan_run, plan_runs
from dfl.workflows.sweep.running import run_sweep
from dfl.workflows.sweep.spec import (
    CONFIG_FIELDS,
    PlannedRun,
    Sweep,
    apply_overrides,
    is_table_key,
    left_out_lines,
    load_sweep,
)
from dfl.workflows.sweep.status import format_status, format_sweep_status, sweep_status, sync_entries

__all__ = [
    "run_name",
    "SweepError",
    "CONFIG_FIELDS", "PlannedRun", "Sweep", "apply_overrides", "is_table_key", "left_out_lines", "load_sweep",
    "read_entries",
    "RunPlan", "plan_run", "plan_runs",
    "run_sweep",
    "format_status", "format_sweep_status", "sweep_status", "sync_entries",
]

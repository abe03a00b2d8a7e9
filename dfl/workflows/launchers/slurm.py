"""The Slurm options of a sweep: checked once, and turned into submitit's executor parameters.

They come from the flags (`--partition`, `--time`, `--gpus-per-run`, ..., `--slurm KEY=VALUE`) and a sweep file's
`[slurm]` table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from dfl.errors import LauncherError

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
    """Slurm's time limit formats -> whole minutes (seconds round up).

    Raises:
        LauncherError: for anything but a positive number of minutes or one of `TIME_FORMS`.
    """
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
        seconds = a * 3600 + (b or 0) * 60 + c  # the regex gives c only after b
    elif b is not None:  # M:S
        seconds = a * 60 + b
    else:  # M
        seconds = a * 60
    if seconds <= 0:
        raise LauncherError(f"{where}: the time limit must be positive, got {text!r}")
    return -(-seconds // 60)


@dataclass
class SlurmOptions:
    """The resources of one run (one array task) and of the array.

    `gpus_per_run`, `cpus_per_run` are totals over the run's `tasks_per_run` processes (split evenly over
    `nodes_per_run` nodes); `max_parallel` caps the array tasks running at once; `extra` holds the
    `--slurm KEY=VALUE` options (keys in `SLURM_KEYS`).
    """

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
        """The options of a sweep file's `[slurm]` table, checked.

        The knobs go by their flag name with '_' (`gpus_per_run = 1`); any other key is an extra option (as
        `--slurm KEY=VALUE`).
        """
        table = dict(table)
        knobs = {k: table.pop(k) for k in KNOBS if k in table}
        return cls(**knobs, extra=table).checked(where)

    def merged(self, flags: dict[str, Any]) -> SlurmOptions:
        """These options with the flags that were given (not None) on top; `extra` merged key by key."""
        values = {k: getattr(self, k) for k in KNOBS}
        values.update({k: v for k, v in flags.items() if k in KNOBS and v is not None})
        return SlurmOptions(**values, extra={**self.extra, **(flags.get("extra") or {})})

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
        """The keywords of submitit's `update_parameters` for `kind` "slurm" (AutoExecutor) or "local"."""
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


"""Settings: the runs grouped by configuration (seeds aside) and aggregated over their seeds.

Runs grouped by their config minus seed, name and `NOT_SETTING_FIELDS`, each aggregated over its seeds (`Stat`: mean ±
sample standard deviation); the default target accuracy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from dfl.algorithms import HYPERPARAMETERS
from dfl.config import Config
from dfl.errors import ReportError
from dfl.report.metrics import CSV_METRICS, as_number, run_metrics, run_target
from dfl.report.runs import RunRecord

CONFIG_FIELDS = tuple(f.name for f in fields(Config))
# Fields that do not change what a run computes, only how it executes or what it records: runs differing in
# them (and in `seed`) belong to one setting.
NOT_SETTING_FIELDS = (
    "name", "seed", "progress", "device", "backend", "gossip_mode", "client_chunk", "compile", "eval_batch_size",
    "dist_timeout", "data_root", "checkpoint_every", "eval_every", "train_eval_samples", "client_eval_samples",
    "hessian_every", "hessian_samples", "hessian_iters", "loggers", "target_accuracy",
)
SETTING_FIELDS = tuple(f for f in CONFIG_FIELDS if f not in NOT_SETTING_FIELDS)
DEFAULT_TARGET_FRACTION = 0.9


def canonical(value: Any) -> str:
    """A hashable, order-free identity of a config value (dicts and lists included)."""
    return json.dumps(value, sort_keys=True, default=str)


@dataclass
class Stat:
    """mean ± std (sample std, n − 1; None when n < 2) over the n finite values."""

    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        """Mean, sample standard deviation and count of the finite values.

        The standard deviation has n − 1 in the denominator (None for one value); None and NaN are left out.
        """
        vals = [v for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return cls(None, None, 0)
        try:
            mean = math.fsum(vals) / len(vals)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
        except OverflowError:  # values near the largest float (read from a metrics file): no finite statistic
            mean, std = sum(vals) / len(vals), (math.inf if len(vals) > 1 else None)
        return cls(mean, std, len(vals))


@dataclass
class Setting:
    """The runs that share every setting field (`values`), their seeds aside.

    `aggregate` fills each run's metrics (`per_run`) and their `stats` over the seeds.
    """
    values: dict[str, Any]  # SETTING_FIELDS -> value
    runs: list[RunRecord]
    per_run: list[dict[str, float | None]] = field(default_factory=list)
    stats: dict[str, Stat] = field(default_factory=dict)

    @property
    def completed(self) -> bool:
        """Every run finished: completed, or stopped early on purpose (a callback, stop_at_target)."""
        return all(r.finished for r in self.runs)

    def aggregate(self, target: float | None, own_targets: bool = False) -> None:
        """Compute each run's metrics and their statistics over the runs.

        Rounds to target count to `target`, or to each run's own target with `own_targets`.
        """
        self.per_run = [run_metrics(r, run_target(r, target, own_targets)) for r in self.runs]
        self.stats = {k: Stat.of(m[k] for m in self.per_run) for k in CSV_METRICS}


def group_settings(runs: list[RunRecord]) -> list[Setting]:
    """Runs with metrics, grouped by their setting (config minus NOT_SETTING_FIELDS), in order of appearance."""
    groups: dict[str, Setting] = {}
    for run in runs:
        if not run.metrics:
            continue
        values = {f: run.config.get(f) for f in SETTING_FIELDS}
        key = canonical(values)
        groups.setdefault(key, Setting(values, [])).runs.append(run)
    return list(groups.values())


# fields whose value an algorithm's defaults set (run directories record them resolved): they follow `algorithm`
ALGORITHM_DEFAULTS = (*HYPERPARAMETERS, "algorithm_options")


def varying_fields(settings: list[Setting]) -> list[str]:
    """The setting fields whose value differs between `settings`, in Config order: the report's axes.

    A field that only follows the algorithm (DFedSAM's momentum 0.9 beside D-PSGD's none: each algorithm's default,
    one value per algorithm) is no axis of its own; `dfl.report.comparison` says how such fields differ.
    """
    found = []
    for f in SETTING_FIELDS:
        if len({canonical(s.values[f]) for s in settings}) < 2:
            continue
        if f in ALGORITHM_DEFAULTS:
            per_algorithm: dict[str, set[str]] = {}
            for s in settings:
                per_algorithm.setdefault(canonical(s.values.get("algorithm")), set()).add(canonical(s.values[f]))
            if all(len(v) == 1 for v in per_algorithm.values()):
                continue
        found.append(f)
    return found


def default_target(settings: list[Setting]) -> float | None:
    """DEFAULT_TARGET_FRACTION × the lowest mean final test accuracy over the settings (None if none > 0)."""
    means = []
    for s in settings:
        mean = Stat.of(as_number((r.final or {}).get("test_acc")) for r in s.runs).mean
        if mean is not None and mean > 0:
            means.append(mean)
    return DEFAULT_TARGET_FRACTION * min(means) if means else None


def check_target(target: Any) -> float:
    """`target` as a float, when it is a test accuracy in (0, 1].

    Raises:
        ReportError: for anything else.
    """
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise ReportError(f"target accuracy must be a fraction in (0, 1] (e.g. 0.8 for 80%), got {target!r}")
    return float(target)

"""The metrics of one run that a report shows.

The values a report shows for one run, taken from the last record of its metrics.jsonl ("final"), plus the best
accuracy, the generalization gap and the rounds to a target accuracy.
"""

from __future__ import annotations

import math
from typing import Any

from dfl.report.runs import RunRecord

METRICS = (  # key, Markdown heading, cell format (see tables.format_stat)
    ("test_acc", "Final test accuracy (%)", "pct"),
    ("best_test_acc", "Best test accuracy (%)", "pct"),
    ("rounds_to_target", None, "rounds"),  # heading names the target
    ("gen_gap", "Generalization gap: train − test accuracy (percentage points)", "pct"),
    ("consensus_distance", "Final consensus distance (1/m)Σ‖x_i − x̄‖²", "sci"),
    ("bytes_sent_total", "Total bytes sent (all clients)", "bytes"),
    ("hessian_top_eig", "Top Hessian eigenvalue of the averaged model (last measurement; `hessian_every`)", "sci"),
    ("personal_acc_mean", "Final personalized accuracy: each client's model on its local test set, mean over "
                          "clients (%; `local_test_fraction`)", "pct"),
    ("global_acc_mean", "Final global accuracy: the averaged model on each client's local test set, mean over "
                        "clients (%; `local_test_fraction`)", "pct"),
    ("links_up", "Links up (%, last evaluated round; `link_failure`, `offline`)", "pct"),
    ("sim_time", "Simulated time (s; stragglers, `round_deadline`, `mode = async`)", "sci"),
)
# a table only when some run measured it (dfl.network.faults's metrics exist only when a fault model is on)
OPTIONAL_METRICS = {"hessian_top_eig", "personal_acc_mean", "global_acc_mean", "links_up", "sim_time"}
# personalized evaluation (`local_test_fraction`): mean, std and min over clients
LOCAL_TEST_METRICS = ("personal_acc_mean", "personal_acc_std", "personal_acc_min",
                      "global_acc_mean", "global_acc_std", "global_acc_min")
# each client's own model on its own training data (`personal_train_eval`): mean, std and min over clients
PERSONAL_TRAIN_METRICS = ("personal_train_acc_mean", "personal_train_acc_std", "personal_train_acc_min")
# unreliable networks (dfl.network.faults) and asynchronous gossip (dfl.engine.asynchronous)
NETWORK_METRICS = ("links_up", "spectral_gap_realised", "steps_done_mean", "sim_time", "staleness_mean")
CSV_METRICS = (
    "test_acc", "best_test_acc", "rounds_to_target", "train_acc", "gen_gap", "test_loss", "train_loss",
    "client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_max", "consensus_distance",
    "bytes_sent_total", "final_round", "lambda", "lambda_Q", "gossip_steps", "hessian_top_eig",
    *LOCAL_TEST_METRICS, *PERSONAL_TRAIN_METRICS, *NETWORK_METRICS,
)


def as_number(value: Any) -> float | None:
    """A finite number (ints stay ints), or None (missing, NaN, inf, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def rounds_to_target(metrics: list[dict[str, Any]], target: float | None) -> int | None:
    """The first evaluated round with test_acc >= target; None when never reached (or no target)."""
    if target is None:
        return None
    for record in metrics:
        acc = as_number(record.get("test_acc"))
        if acc is not None and acc >= target:
            return int(record["round"])
    return None


def run_target(run: RunRecord, target: float | None, own_targets: bool) -> float | None:
    """The target accuracy of one run.

    Its own `target_accuracy` (config) with `own_targets` when it has one, else the report's `target`.
    """
    own = run.config.get("target_accuracy")
    return own if own_targets and as_number(own) is not None else target


def run_metrics(run: RunRecord, target: float | None) -> dict[str, float | None]:
    """The final-record metrics of one run; None where the run has no such value."""
    last = run.final or {}
    out = {k: as_number(last.get(k)) for k in (
        "test_acc", "train_acc", "test_loss", "train_loss", "client_acc_mean", "client_acc_std",
        "client_acc_min", "client_acc_max", "consensus_distance", "bytes_sent_total", *LOCAL_TEST_METRICS,
        *PERSONAL_TRAIN_METRICS, *NETWORK_METRICS,
    )}
    out["final_round"] = as_number(last.get("round"))
    measured = [h for h in (as_number(m.get("hessian_top_eig")) for m in run.metrics) if h is not None]
    out["hessian_top_eig"] = measured[-1] if measured else None
    accs = [a for a in (as_number(m.get("test_acc")) for m in run.metrics) if a is not None]
    out["best_test_acc"] = max(accs) if accs else None
    gap = None
    if out["train_acc"] is not None and out["test_acc"] is not None:
        gap = out["train_acc"] - out["test_acc"]
    out["gen_gap"] = gap
    reached = rounds_to_target(run.metrics, target)
    out["rounds_to_target"] = reached
    for key in ("lambda", "lambda_Q", "gossip_steps"):
        out[key] = as_number(run.summary.get(key))
    return out

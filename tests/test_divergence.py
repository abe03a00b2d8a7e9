"""A run that blows up without NaN is marked diverged (loss rule), keeps its last good checkpoint and metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch

import dfl
from dfl.config import Config
from dfl.engine.experiment import DIVERGENCE_LOSS_FACTOR, DIVERGENCE_PATIENCE, divergence_hint
from dfl.errors import DivergenceError


def _config(**changes):
    base = dict(clients=4, rounds=8, eval_every=1, model="logreg", lr=0.05, lr_decay=1.0, local_steps=2,
                batch_size=8, progress=False, train_eval_samples=0, device="cpu", algorithm="dfedavg",
                dataset_options={"num_samples": 400})
    return dfl.Config(**{**base, **changes})


def test_finite_blow_up_is_diverged_with_the_last_good_checkpoint(tmp_path, monkeypatch):
    # the loss is fine for two rounds, then explodes (lr × 10^4) while staying finite
    import dfl.algorithms.base as base

    lr = base.Context.lr
    monkeypatch.setattr(base.Context, "lr", lambda self, t: lr(self, t) * (1 if t < 2 else 1e4))
    out = tmp_path / "run"
    with pytest.raises(DivergenceError, match=r"training diverged by round 5: the mean local training loss was "
                                              r"above 23 \(10 × ln 10"):
        dfl.run(_config(), out=out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and "above 23" in summary["error"]
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [h["round"] for h in history] == [1, 2, 3, 4, 5]  # metrics so far, the bad ones included
    bound = DIVERGENCE_LOSS_FACTOR * math.log(10)
    assert all(math.isfinite(h["train_loss"]) for h in history)
    assert [h["train_loss"] > bound for h in history] == [False, False] + [True] * DIVERGENCE_PATIENCE
    assert torch.load(out / "checkpoint.pt", weights_only=False)["round"] == 2  # the last good state


def test_a_bad_final_evaluation_is_diverged_too(monkeypatch):
    import dfl.algorithms.base as base

    lr = base.Context.lr
    monkeypatch.setattr(base.Context, "lr", lambda self, t: lr(self, t) * (1 if t < 3 else 1e4))
    with pytest.raises(DivergenceError, match="at the last 1 evaluation"):
        dfl.run(_config(rounds=4))


def test_an_ordinary_run_is_completed():
    result = dfl.run(_config(rounds=3))
    assert result.summary["status"] == "completed"


def test_nonfinite_rows_finds_nan_inf_and_not_finite_rows_whose_sum_overflows():
    from dfl.training.evaluate import nonfinite_clients, nonfinite_rows

    X = torch.randn(6, 1000)
    X[1, 7] = float("nan")
    X[3, 999] = float("inf")
    X[4, :2] = torch.tensor([float("inf"), float("-inf")])  # sums to NaN
    X[5] = 3e38  # finite, but its sum overflows to inf: a candidate that the exact check clears
    assert nonfinite_rows(X).tolist() == [False, True, False, True, True, False]
    loss = torch.tensor([0.0, 1.0, float("nan"), 0.0, 0.0, 0.0])
    assert nonfinite_clients(X, loss).tolist() == [False, True, True, True, True, False]


def test_a_non_finite_metric_is_divergence_even_with_finite_parameters():
    from dfl.engine.experiment import _check_finite_metrics

    hint = divergence_hint(Config())
    _check_finite_metrics({"round": 3, "test_loss": 0.5, "consensus_distance": 1e30, "train_loss": float("nan")}, hint)
    with pytest.raises(DivergenceError, match=r"training diverged by round 3: consensus_distance = inf \(not finite\)"):
        _check_finite_metrics({"round": 3, "test_loss": 0.5, "consensus_distance": float("inf")}, hint)
    with pytest.raises(DivergenceError, match="test_loss = nan.*try a smaller lr"):
        _check_finite_metrics({"round": 1, "test_loss": float("nan"), "consensus_distance": 0.0}, hint)


def test_under_differential_privacy_the_hint_names_the_noise_first():
    assert divergence_hint(Config()) == "try a smaller lr, a smaller rho, or clip_grad_norm"
    hint = divergence_hint(Config(dp_clip=0.5, dp_noise=2.0))
    assert hint.startswith("with differential privacy the noise's std per coordinate is dp_clip x dp_noise = 1,")
    assert hint.endswith("else try a smaller lr, a smaller rho, or clip_grad_norm")


def test_lr_1e30_ends_diverged_with_its_metrics_and_exit_status_1(tmp_path, capsys):
    from dfl.cli import main

    out = tmp_path / "run"
    status = main(["run", "--lr", "1e30", "--lr-decay", "1", "--clients", "4", "--rounds", "4", "--eval-every", "1",
                   "--model", "logreg", "--local-steps", "2", "--dataset-options", "num_samples=400",
                   "--train-eval-samples", "0", "--no-progress", "--device", "cpu", "--out", str(out)])
    assert status == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training diverged" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and "diverged" in summary["error"]
    assert (out / "metrics.jsonl").exists() or "before its first evaluation" in err

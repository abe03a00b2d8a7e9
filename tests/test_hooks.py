"""Callbacks and the target accuracy (`dfl.engine.hooks`): a callback's stop is checkpointed, marked "stopped" and
resumable; rounds_to_target is the first evaluated round reaching the target and survives resume;
stop_at_target stops there; `dfl report` and `dfl sweep` treat a stopped run as finished; every rank of a
multi-process run stops after the same round; bad inputs fail before training."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dfl
from dfl.config import Config, ConfigError
from dfl.engine.results import read_metrics
from dfl.engine.validation import validate
from dfl.loggers import LOGGERS, Logger
from tests.helpers import START_METHOD, blob_data, tiny_config

pytestmark = pytest.mark.timeout(300)  # hang guard only (a spawned process group)

CLIENTS = 4
make_data = partial(blob_data, sizes=(8,) * CLIENTS, shift=1.0, test_size=40)
make_config = partial(tiny_config, rounds=6, clients=CLIENTS, train_eval_samples=0)


class StopAt:
    """Stops the run at round `at`; records what it was given."""

    def __init__(self, at: int):
        self.at, self.rounds, self.started, self.ended = at, [], [], []

    def on_run_start(self, info):
        self.started.append(info)

    def on_round_end(self, round, metrics):
        self.rounds.append(round)
        metrics["test_acc"] = -1.0  # a copy: the run's own record is not changed
        return round >= self.at

    def on_run_end(self, summary):
        self.ended.append(dict(summary))


class Watch:
    """A callback without the optional hooks, never stopping (returns None)."""

    def __init__(self):
        self.rounds = []

    def on_round_end(self, round, metrics):
        self.rounds.append((round, metrics["test_acc"]))


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted 6-round run every stopped-then-resumed run must equal."""
    return dfl.run(make_config(), data=make_data())


def _same_run(got, want):
    torch.testing.assert_close(got.params, want.params, atol=0, rtol=0)
    assert [h["round"] for h in got.history] == [h["round"] for h in want.history]
    for g, w in zip(got.history, want.history):
        assert {k: v for k, v in g.items() if k != "seconds_per_round"} == \
            {k: v for k, v in w.items() if k != "seconds_per_round"}


# ---------------------------------------------------------------------------------------------- callbacks
def test_callback_stops_after_a_checkpoint_and_resume_continues(tmp_path, reference):
    out = tmp_path / "run"
    stop, watch = StopAt(2), Watch()
    # checkpoint_every = 5: round 2 is checkpointed only because the run stops there
    result = dfl.run(make_config(checkpoint_every=5), data=make_data(), out=out, callbacks=[stop, watch])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == result.summary["status"] == "stopped"
    assert summary["stopped_by"] == "callbacks[0] (StopAt) at round 2" and summary["stopped_at_round"] == 2
    assert summary["rounds_completed"] == 2 and summary["final_round"] == 2
    assert stop.rounds == [1, 2] and [r for r, _ in watch.rounds] == [1, 2]  # every callback sees every round
    assert [h["test_acc"] for h in result.history] == [a for _, a in watch.rounds] != [-1.0, -1.0]
    assert [h["round"] for h in read_metrics(out)] == [1, 2]
    assert torch.load(out / "checkpoint.pt")["round"] == 2
    torch.testing.assert_close(torch.load(out / "params.pt")["params"], result.params)
    assert len(stop.started) == 1 and stop.started[0].start_round == 0 and stop.started[0].out_dir == out
    assert stop.started[0].config.rounds == 6 and "rho" in stop.started[0].hyperparameters
    assert [s["status"] for s in stop.ended] == ["stopped"]

    resumed = dfl.run(make_config(checkpoint_every=5), data=make_data(), out=out, resume=True, callbacks=[Watch()])
    assert resumed.summary["status"] == "completed" and "stopped_by" not in resumed.summary
    assert resumed.summary["resumed_from_round"] == 2
    _same_run(resumed, reference)


def test_on_run_end_runs_when_a_callback_fails(tmp_path):
    class Boom:
        def on_round_end(self, round, metrics):
            if round == 2:
                raise RuntimeError("callback bug")

    ended = StopAt(99)
    with pytest.raises(RuntimeError, match="callback bug"):
        dfl.run(make_config(rounds=3), data=make_data(), out=tmp_path / "a", callbacks=[ended, Boom()])
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "failed" and "callback bug" in summary["error"]
    assert [s["status"] for s in ended.ended] == ["failed"]  # on_run_end runs however the run ends


@pytest.mark.parametrize("callbacks, message", [
    ([object()], r"callbacks\[0\] \(object\) has no on_round_end\(round, metrics\) method"),
    ([Watch(), StopAt], r"callbacks\[1\] \(the class StopAt, not an instance\) has no on_round_end"),
    (Watch(), "callbacks must be a list of objects with on_round_end"),
])
def test_bad_callbacks_fail_before_training(tmp_path, callbacks, message):
    with pytest.raises(TypeError, match=message):
        dfl.run(make_config(), data=make_data(), out=tmp_path / "run", callbacks=callbacks)
    assert not (tmp_path / "run").exists()


def test_a_callback_answer_must_be_a_bool_or_none():
    class Says:
        def on_round_end(self, round, metrics):
            return "stop"

    with pytest.raises(TypeError, match=r"callbacks\[0\] \(Says\)\.on_round_end returned 'stop'; return True"):
        dfl.run(make_config(rounds=1), data=make_data(), callbacks=[Says()])


# ---------------------------------------------------------------------------------------------- target accuracy
def _first_reaching(history, target):
    return next((h["round"] for h in history if h["test_acc"] >= target), None)


def test_rounds_to_target_stop_at_target_and_resume(tmp_path, reference):
    accs = [h["test_acc"] for h in reference.history]
    target = sorted(set(accs))[-2]  # the second-best accuracy: reached before the end
    expected = _first_reaching(reference.history, target)
    assert expected is not None and expected < 6 and target > 0

    tracked = dfl.run(make_config(target_accuracy=target), data=make_data(), out=tmp_path / "tracked")
    assert tracked.summary["status"] == "completed" and tracked.summary["rounds_to_target"] == expected
    assert tracked.summary["target_accuracy"] == target
    _same_run(tracked, reference)  # recording a target changes nothing else
    never = dfl.run(make_config(rounds=2, target_accuracy=1.0), data=make_data())
    assert never.summary["rounds_to_target"] is None and never.summary["status"] == "completed"

    out = tmp_path / "stopped"
    config = make_config(target_accuracy=target, stop_at_target=True)
    stopped = dfl.run(config, data=make_data(), out=out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["rounds_completed"] == expected
    assert summary["rounds_to_target"] == expected == summary["stopped_at_round"]
    assert summary["stopped_by"] == f"target_accuracy (test_acc >= {target} at round {expected}; stop_at_target)"
    assert torch.load(out / "checkpoint.pt")["round"] == expected
    assert len(stopped.history) == expected

    again = dfl.run(config, data=make_data(), out=out, resume=True)  # still stop_at_target: nothing to train
    assert again.summary["status"] == "stopped" and again.summary["rounds_completed"] == expected
    torch.testing.assert_close(again.params, stopped.params, atol=0, rtol=0)
    go_on = dfl.run(config.replace(stop_at_target=False), data=make_data(), out=out, resume=True)
    assert go_on.summary["status"] == "completed" and go_on.summary["rounds_to_target"] == expected  # from history
    _same_run(go_on, reference)


def test_report_and_sweep_treat_a_stopped_run_as_finished(tmp_path, reference):
    from dfl.report import write_report
    from dfl.workflows.sweep import plan_run

    target = sorted({h["test_acc"] for h in reference.history})[-2]
    expected = _first_reaching(reference.history, target)
    root = tmp_path / "runs"
    config = make_config(target_accuracy=target, stop_at_target=True)
    for seed in (1, 2):
        dfl.run(config.replace(name=f"s{seed}", seed=seed), data=make_data(), out=root / f"s{seed}")
    plan = plan_run(root / "s1", config.replace(name="s1", rounds=10))  # even with more rounds
    assert plan.action == "skip" and plan.note.startswith(f"stopped early after round {expected} by target_accuracy")

    md = write_report(root)["report.md"].read_text()
    assert f"## Rounds to reach {100 * target:.2f}% test accuracy (the runs' target_accuracy)" in md
    assert "†" not in md and "Runs not completed" not in md
    runs_csv = (root / "report" / "runs.csv").read_text().splitlines()
    header = runs_csv[0].split(",")
    row = dict(zip(header, next(r for r in runs_csv[1:] if r.startswith("s1,")).split(",")))
    assert (row["status"], float(row["target_acc"]), int(row["rounds_to_target"])) == ("stopped", target, expected)


def test_the_report_target_rule():
    """--target wins; else each run's own target_accuracy; runs without one get the default (0.9 × the lowest
    mean final accuracy)."""
    from dfl.report import RunRecord, group_settings
    from dfl.report.metrics import run_target
    from dfl.report.write import _targets

    def runs(*targets):
        return [RunRecord(Path(f"r{i}"), f"r{i}", {**Config(seed=i).to_dict(), "target_accuracy": t}, {},
                          [{"round": 1, "test_acc": 0.4}, {"round": 2, "test_acc": 0.6}])
                for i, t in enumerate(targets)]

    settings = group_settings(runs(0.5, 0.5))
    assert _targets(settings, 0.2) == (0.2, False, "20.00% test accuracy")
    assert _targets(settings, None)[1:] == (True, "50.00% test accuracy (the runs' target_accuracy)")
    settings = group_settings(runs(0.3, 0.35, None))
    target, own, heading = _targets(settings, None)
    assert target == pytest.approx(0.54) and own
    assert heading == "each run's target_accuracy (30.00%, 35.00%); runs without one: 54.00% (0.9 × the lowest " \
                      "mean final accuracy)"
    assert [run_target(r, target, own) for r in settings[0].runs] == [0.3, 0.35, target]
    settings[0].aggregate(target, own)
    assert [m["rounds_to_target"] for m in settings[0].per_run] == [1, 1, 2]
    assert _targets(group_settings(runs(None)), None)[1:] == (False, "54.00% test accuracy (default: 0.9 × the "
                                                                     "lowest mean final accuracy)")


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("changes, message", [
    (dict(loggers=["tensorbord"]), "loggers must be one of tensorboard, wandb; got 'tensorbord' (did you mean "
                                   "'tensorboard'?)"),
    (dict(loggers="tensorboard"), "loggers must be a list of logger names"),
    (dict(loggers=["tensorboard", "tensorboard"]), "loggers names a logger twice"),
    (dict(target_accuracy=80), "target_accuracy must be in (0, 1] (a test accuracy fraction, e.g. 0.8 for 80%), "
                               "got 80"),
    (dict(target_accuracy=0.0), "target_accuracy must be > 0.0, got 0.0"),
    (dict(target_accuracy=math.nan), "target_accuracy must be a finite number"),
    (dict(stop_at_target=True), "stop_at_target = true needs target_accuracy"),
    (dict(stop_at_target="yes", target_accuracy=0.5), "stop_at_target must be true or false"),
])
def test_bad_hook_fields(changes, message):
    with pytest.raises(ConfigError) as info:
        validate(make_config(**changes))
    assert message in str(info.value)


def test_hook_fields_may_change_on_resume(tmp_path):
    out = tmp_path / "run"
    dfl.run(make_config(rounds=2), data=make_data(), out=out)
    result = dfl.run(make_config(rounds=3, target_accuracy=0.01, stop_at_target=True), data=make_data(), out=out,
                     resume=True)
    # the target was reached in the history already: a resume that asks to stop there trains nothing more
    assert result.summary["rounds_to_target"] == 1 and result.summary["rounds_completed"] == 2
    assert result.summary["status"] == "stopped"


# ---------------------------------------------------------------------------------------------- torchrun
class RankFile(Logger):
    """A logger that writes which rank it runs on (loggers run on rank 0 only)."""

    def start(self, info):
        Path(info.out_dir, f"logger-rank{dist.get_rank()}").write_text("started")


def _stop_worker(rank, world, rdzv, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world)
    try:
        LOGGERS.register("rank-file", RankFile, replace=True)
        stop = StopAt(3)
        result = dfl.run(make_config(loggers=["rank-file"]), data=make_data(), out=Path(out_dir) / "run",
                         callbacks=[stop])
        torch.save({"params": result.params, "ids": result.client_ids, "summary": result.summary,
                    "rounds": stop.rounds}, Path(out_dir) / f"r{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_stops_after_the_round_rank_0_stopped(tmp_path):
    mp.start_processes(_stop_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=2, join=True,
                       start_method=START_METHOD)
    single = dfl.run(make_config(), data=make_data(), callbacks=[StopAt(3)])
    got = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    assert got[0]["rounds"] == [1, 2, 3] and got[1]["rounds"] == []  # callbacks run on rank 0 only
    for g in got:
        assert g["summary"]["status"] == "stopped" and g["summary"]["rounds_completed"] == 3
        assert g["summary"]["stopped_by"] == "callbacks[0] (StopAt) at round 3"
        torch.testing.assert_close(g["params"], single.params[g["ids"]], atol=1e-5, rtol=0)
    run = tmp_path / "run"
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"
    assert torch.load(run / "checkpoint.pt")["round"] == 3
    assert sorted(p.name for p in run.glob("logger-rank*")) == ["logger-rank0"]

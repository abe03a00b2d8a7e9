"""Loggers (`dfl.loggers`): TensorBoard event files hold one scalar per metric per evaluation (read back with
TensorBoard's own reader), the hyperparameters and the config, and stay one point per round across a resume;
the Weights & Biases adapter makes the calls W&B expects (a stub module stands in for `wandb`); a logger whose
package is missing, or that needs a run directory the run lacks, fails before training; `--log` on the CLI."""

from __future__ import annotations

import sys
import types
from functools import partial

import pytest

import dfl
from dfl.cli import build_parser, main
from dfl.cli.run import config_from_args
from dfl.config import Config, ConfigError
from dfl.loggers import LOGGERS, Logger
from tests.helpers import blob_data

make_data = partial(blob_data, sizes=(8,) * 4, shift=1.0, test_size=40)


def make_config(**changes) -> Config:
    values = dict(seed=1, rounds=4, eval_every=1, clients=4, model="logreg", local_steps=2, batch_size=4,
                  progress=False, train_eval_samples=20, device="cpu")
    return Config(**{**values, **changes})


# ---------------------------------------------------------------------------------------------- tensorboard
def read_events(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_writes_every_metric_of_every_evaluation(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    result = dfl.run(make_config(loggers=["tensorboard"], eval_every=2, rounds=5), data=make_data(), out=out)
    events = read_events(out / "tensorboard")
    rounds = [h["round"] for h in result.history]
    assert rounds == [2, 4, 5]
    tags = {"test_acc": "accuracy/test_acc", "train_loss": "loss/train_loss",
            "client_acc_min": "accuracy/client_acc_min", "bytes_sent_total": "communication/bytes_sent_total",
            "consensus_distance": "consensus/consensus_distance", "lr": "training/lr"}
    for name, tag in tags.items():
        points = events.Scalars(tag)
        assert [p.step for p in points] == rounds, tag
        assert [p.value for p in points] == pytest.approx([h[name] for h in result.history], rel=1e-6), tag
    numeric = {k for k, v in result.history[0].items() if k != "round" and isinstance(v, (int, float))}
    assert len(events.Tags()["scalars"]) == len(numeric)  # one scalar per numeric metric, nothing else
    histogram = events.Histograms("accuracy/client_acc")  # the per-client list, as a histogram
    assert [h.step for h in histogram] == rounds and histogram[-1].histogram_value.num == 4
    assert set(events.PluginTagToContent("hparams")) == {"_hparams_/experiment", "_hparams_/session_start_info",
                                                         "_hparams_/session_end_info"}
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    assert b"gossip_steps" in start and b"dfedsam-mgs" in start  # the algorithm's resolved defaults are there
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert 'algorithm = "dfedsam-mgs"' in config_text
    status = events.Tensors("status/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert status.startswith("status: **completed**, 5/5 rounds")


def test_tensorboard_after_a_resume_holds_each_round_once(tmp_path):
    pytest.importorskip("tensorboard")

    class Interrupt:
        def on_round_end(self, round, metrics):
            if round == 3:
                raise KeyboardInterrupt

    out = tmp_path / "run"
    config = make_config(loggers=["tensorboard"], rounds=5, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):  # logged rounds 1-3, checkpointed after round 2
        dfl.run(config, data=make_data(), out=out, callbacks=[Interrupt()])
    result = dfl.run(config, data=make_data(), out=out, resume=True)
    points = read_events(out / "tensorboard").Scalars("accuracy/test_acc")
    assert [p.step for p in points] == [1, 2, 3, 4, 5]  # round 3 of the interrupted session is hidden
    assert [p.value for p in points] == pytest.approx([h["test_acc"] for h in result.history], rel=1e-6)
    # tensorboard turned on when resuming: the rounds before it come from the history
    later = tmp_path / "later"
    dfl.run(make_config(rounds=2), data=make_data(), out=later)
    dfl.run(make_config(rounds=3, loggers=["tensorboard"]), data=make_data(), out=later, resume=True)
    assert [p.step for p in read_events(later / "tensorboard").Scalars("accuracy/test_acc")] == [1, 2, 3]


def test_tensorboard_needs_a_run_directory_and_its_package(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="loggers: 'tensorboard' writes under the run directory, so the run needs "
                                          "one: pass out= to dfl.run"):
        dfl.run(make_config(loggers=["tensorboard"]), data=make_data())
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: importing it fails
    with pytest.raises(ConfigError, match=r"loggers: 'tensorboard' needs the tensorboard package, which is not "
                                          r"installed .*install it with: pip install tensorboard"):
        dfl.run(make_config(loggers=["tensorboard"]), data=make_data(), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # before anything was written


# ---------------------------------------------------------------------------------------------- wandb
class FakeRun:
    def __init__(self, calls):
        self.calls, self.summary = calls, {}

    def log(self, data, step=None):
        self.calls.append(("log", dict(data), step))

    def finish(self, exit_code=None):
        self.calls.append(("finish", exit_code))


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in `wandb` module recording init/log/finish (the real package is not a dependency)."""
    module = types.ModuleType("wandb")
    module.calls = []

    def init(**kwargs):
        module.calls.append(("init", kwargs))
        module.run = FakeRun(module.calls)
        return module.run

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return module


def test_wandb_logs_every_evaluation_and_finishes(tmp_path, fake_wandb):
    out = tmp_path / "run"
    result = dfl.run(make_config(name="w", loggers=["wandb"], rho=0.05), data=make_data(), out=out)
    (kind, init), *logs, finish = fake_wandb.calls
    assert kind == "init" and init["project"] == "dfl" and init["name"] == "w" and init["dir"] == str(out)
    assert init["config"]["rho"] == 0.05 and init["config"]["gossip_steps"] == 4  # set, and resolved default
    assert [step for _, _, step in logs] == [1, 2, 3, 4]
    for (_, data, _), record in zip(logs, result.history):
        assert data["test_acc"] == record["test_acc"] and "client_acc" not in data and "round" not in data
    assert finish == ("finish", 0)
    assert fake_wandb.run.summary["status"] == "completed" and fake_wandb.run.summary["rounds_completed"] == 4


def test_wandb_without_a_run_directory_and_a_failed_run(fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "mine")

    class Boom:
        def on_round_end(self, round, metrics):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        dfl.run(make_config(loggers=["wandb"]), data=make_data(), callbacks=[Boom()])
    assert fake_wandb.calls[0][1]["project"] == "mine" and fake_wandb.calls[0][1]["dir"] is None
    assert fake_wandb.calls[-1] == ("finish", 1) and fake_wandb.run.summary["status"] == "failed"


def test_wandb_not_installed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"loggers: 'wandb' needs the wandb package, which is not installed "
                                          r".*install it with: pip install wandb$"):
        dfl.run(make_config(loggers=["wandb"]), data=make_data(), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- plug-ins, CLI
def test_a_registered_logger_gets_start_log_finish(tmp_path):
    calls = []

    class Memory(Logger):
        def start(self, info):
            calls.append(("start", info.start_round, info.out_dir))

        def log(self, round, metrics):
            calls.append(("log", round))

        def finish(self, status, summary):
            calls.append(("finish", status, summary["rounds_to_target"]))

    LOGGERS.register("memory", Memory)
    try:
        dfl.run(make_config(rounds=2, loggers=["memory"], target_accuracy=1.0), data=make_data())
    finally:
        LOGGERS.unregister("memory")
    assert calls == [("start", 0, None), ("log", 1), ("log", 2), ("finish", "completed", None)]


def test_log_flag_repeated_or_comma_separated():
    parse = build_parser().parse_args
    assert config_from_args(parse(["run", "--log", "tensorboard,wandb"])).loggers == ["tensorboard", "wandb"]
    assert config_from_args(parse(["run", "--log", "wandb", "--log", "tensorboard"])).loggers == ["wandb",
                                                                                                   "tensorboard"]
    assert config_from_args(parse(["run", "--loggers", ""])).loggers == []


def test_dfl_run_with_tensorboard_and_target(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    assert main(["run", "--clients", "4", "--rounds", "2", "--eval-every", "1", "--model", "logreg", "--dataset",
                 "synthetic", "--local-steps", "1", "--no-progress", "--log", "tensorboard", "--target-accuracy",
                 "0.3", "--stop-at-target", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "— stopped" in printed and "rounds to 30.00%" in printed and "stopped by target_accuracy" in printed
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))

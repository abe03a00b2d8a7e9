"""The table of what combines with what in a world of several processes (issue 45): `dfl torchrun N` refuses what the
table refuses for N processes in one line before any rank starts, a resumed run included (its config is its
directory's, and a resume may use another number of processes)."""

from __future__ import annotations

import pytest

import dfl
from dfl import cli
from dfl.engine import combinations
from dfl.workflows import torchrun
from tests.helpers import tiny_config

pytestmark = pytest.mark.timeout(300)  # a hang guard only


def _no_launch(nproc, run_args, stderr=None):
    raise AssertionError(f"torchrun launched {nproc} ranks of dfl run {run_args}: the refusal came after they started")


@pytest.mark.parametrize("world, changes", [
    (2, dict(byzantine=1, attack="gaussian")),  # the attacker reads every client's row: one process
    (4, dict(clients=3)),  # fewer clients than processes
])
def test_a_resume_under_torchrun_is_refused_before_any_rank_starts(tmp_path, monkeypatch, capsys, world, changes):
    """A run allowed in one process, resumed by `dfl torchrun N --resume DIR` in a world the table refuses: one line
    (the table's, for N processes) and exit status 2, and torchrun never starts."""
    config = tiny_config(**{**dict(rounds=1, clients=6, model="logreg", model_options={}, dataset="mnist1d", local_steps=1,
                                   dataset_options={"num_samples": 200}, train_eval_samples=0), **changes})
    run = tmp_path / "run"
    dfl.run(config, out=run)
    message = combinations.refusal(config, world)
    assert message is not None and combinations.refusal(config) is None
    monkeypatch.setattr(torchrun, "launch", _no_launch)
    capsys.readouterr()
    assert cli.main(["torchrun", str(world), "--resume", str(run), "--rounds", "2"]) == 2
    err = capsys.readouterr().err
    assert err == f"dfl run: error: {message}\n"


def test_a_resume_of_no_run_is_refused_before_any_rank_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torchrun, "launch", _no_launch)
    assert cli.main(["torchrun", "2", "--resume", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dfl run: error: cannot resume: ") and err.count("\n") == 1, err

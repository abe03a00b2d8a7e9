"""The table of what combines with what in a world of several processes (issue 45): `dfl torchrun N` refuses what the
table refuses for N processes in one line before any rank starts, a resumed run included (its config is its
directory's, and a resume may use another number of processes); a process whose block is smaller than client_chunk
is not warned about memory."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch.distributed as dist

import dfl
from dfl import cli
from dfl.engine import combinations
from dfl.workflows import torchrun
from tests.helpers import blob_data, init_gloo, spawn, tiny_config

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


# -------------------------------------------- an explicit client_chunk above a process's block: no memory warning
def _chunk_worker(rank, world, rdzv, out_dir):
    init_gloo(rank, world, rdzv)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = dfl.run(tiny_config(clients=7, client_chunk=4, rounds=1, train_eval_samples=0),
                             data=blob_data([6] * 7))
        Path(out_dir, f"chunk-r{rank}.json").write_text(json.dumps({
            "warnings": [str(w.message) for w in caught if "client_chunk" in str(w.message)],
            "status": result.summary["status"]}))
    finally:
        dist.destroy_process_group()


def test_a_chunk_above_a_processs_clients_is_not_warned_as_too_big_for_memory(tmp_path):
    """7 clients on 2 processes (blocks of 4 and 3) with client_chunk = 4: the process of 3 clients calls them all at
    once, which memory allows; it used to warn "client_chunk = 4 may not fit in memory: the estimate allows 3"."""
    spawn(_chunk_worker, 2, str(tmp_path / "rdzv"), str(tmp_path))
    for rank in range(2):
        report = json.loads((tmp_path / f"chunk-r{rank}.json").read_text())
        assert report == {"warnings": [], "status": "completed"}, (rank, report)

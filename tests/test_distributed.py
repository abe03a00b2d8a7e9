"""World size does not change results (gloo on CPU, spawned workers; the design contract of
docs/architecture.md#design-contracts); gossip across processes is exact; a failing rank stops every rank with a clear
error instead of a hang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import topologies
from dfl.config import Config
from dfl.engine import checkpoint as ckpt
from dfl.network.comm import even_blocks, exchange_plan
from tests.helpers import START_METHOD, assert_histories_close, blob_data, init_gloo, spawn

pytestmark = pytest.mark.timeout(300)  # hang guard only: a deadlock fails the test instead of blocking CI

CLIENTS = 10  # uneven blocks on 4 processes (3, 3, 2, 2)
CASES = {
    "mgs-ring": dict(algorithm="dfedsam-mgs", topology="ring", gossip_steps=2),
    "mgs-one-peer": dict(algorithm="dfedsam-mgs", topology="one-peer-exponential", gossip_steps=2),
    "dfedavg-full": dict(algorithm="dfedavg", topology="full"),
}
MODES = ("p2p", "allgather")

make_data = partial(blob_data, sizes=[6 + i % 3 for i in range(CLIENTS)])


def make_config(case: str, mode: str = "p2p", **changes) -> Config:
    values = dict(
        name=case, seed=3, rounds=3, eval_every=1, clients=CLIENTS, model="mlp", model_options={"hidden": [8]},
        local_steps=2, batch_size=4, lr=0.1, progress=False, train_eval_samples=20, gossip_mode=mode,
        dist_timeout=30.0,
    )
    return Config(**{**values, **CASES[case], **changes})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------- placement
def test_even_blocks_are_contiguous_and_balanced():
    assert [list(b) for b in even_blocks(10, 4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    with pytest.raises(ValueError, match="clients \\(3\\) must be >= the number of processes \\(4\\)"):
        even_blocks(3, 4)


def test_exchange_plan_sends_only_what_neighbours_need():
    W = topologies.build("ring", 10).W
    plan = exchange_plan(W, even_blocks(10, 4))
    # a ring crosses each of the 4 block boundaries both ways: one row each way
    assert plan.rows_sent() == 8
    assert plan.send[0][1].tolist() == [2] and plan.send[0][3].tolist() == [0] and len(plan.send[0][2]) == 0
    assert plan.columns(1).tolist() == [3, 4, 5, 2, 6]
    dense = exchange_plan(np.full((10, 10), 0.1), even_blocks(10, 4))
    assert dense.rows_sent() == 3 * 10  # every row goes to the 3 other ranks


# ------------------------------------------------------------------------------------- exact gossip
def _gossip_worker(rank, world, rdzv, out):
    from dfl.engine.distributed import DistributedCommunicator
    from dfl.network.gossip import Gossip

    init_gloo(rank, world, rdzv)
    try:
        results = {}
        X_all = torch.randn(CLIENTS, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        for name in ("ring", "one-peer-exponential", "full", "exponential"):
            topology = topologies.build(name, CLIENTS)
            for mode in MODES:
                comm = DistributedCommunicator(CLIENTS, mode)
                gossip = Gossip(topology, comm, torch.float64, torch.device("cpu"))
                X = X_all[comm.client_ids]
                for first, steps in ((0, 1), (1, 3)):
                    before = comm.bytes_moved
                    Y = comm.gather_rows(gossip.mix(X, first, steps))
                    results[(name, mode, first, steps)] = (Y, comm.bytes_moved - before)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gossip_across_processes_equals_the_product(tmp_path, world):
    out = tmp_path / "gossip.pt"
    spawn(_gossip_worker, world, str(tmp_path / "rdzv"), str(out))
    results = torch.load(out)
    X = torch.randn(CLIENTS, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    d_bytes = 7 * 8
    for (name, mode, first, steps), (Y, moved) in results.items():
        topology = topologies.build(name, CLIENTS)
        P = np.eye(CLIENTS)
        for s in range(first, first + steps):
            P = topology.matrix(s) @ P
        np.testing.assert_allclose(Y.numpy(), P @ X.numpy(), atol=1e-12, err_msg=f"{name} {mode}")
        gather = world * (world - 1) * max(len(b) for b in even_blocks(CLIENTS, world)) * d_bytes
        if name == "ring" and mode == "p2p":  # neighbour rows only: 2 per boundary for one step, plus the gather;
            # Q = 3 steps go as their product (7 diagonals, sparser than the 3 steps together): one exchange of the
            # rows it needs
            rows = 2 * world if steps == 1 else exchange_plan(P, even_blocks(CLIENTS, world)).rows_sent()
            assert moved == rows * d_bytes + gather
        if name == "full":  # W = J: one all_reduce of a [d] float64 row, whatever the mode and the steps
            assert moved == 2 * (world - 1) * d_bytes + gather


# ------------------------------------------------------------------------- world-size invariance of runs
def _run_worker(rank, world, rdzv, out_dir):
    import dfl

    init_gloo(rank, world, rdzv)
    try:
        data = make_data()
        for case in CASES:
            for mode in MODES:
                result = dfl.run(make_config(case, mode), data=data)
                torch.save({"params": result.params, "ids": result.client_ids, "history": result.history,
                            "summary": result.summary}, Path(out_dir) / f"{case}-{mode}-r{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def single_process_results():
    import dfl

    assert os.environ.get("WORLD_SIZE") in (None, "", "1"), "the reference must run in a world of one"
    data = make_data()
    return {case: dfl.run(make_config(case), data=data) for case in CASES}


@pytest.mark.parametrize("world", [2, 4])
def test_world_size_does_not_change_results(tmp_path, world, single_process_results):
    spawn(_run_worker, world, str(tmp_path / "rdzv"), str(tmp_path))
    for case, reference in single_process_results.items():
        assert reference.summary["processes"] == 1
        for mode in MODES:
            for rank in range(world):
                got = torch.load(tmp_path / f"{case}-{mode}-r{rank}.pt")
                label = f"{case} {mode} world={world} rank={rank}"
                assert got["summary"]["processes"] == world
                # every client on the main process, its own block elsewhere (assembled there, not gathered everywhere)
                assert got["ids"] == (list(range(CLIENTS)) if rank == 0 else list(even_blocks(CLIENTS, world)[rank]))
                torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0, msg=label)
                history = got["history"]
                if rank != 0:  # per-client accuracies are reported on the main process only
                    assert all("client_acc" not in h for h in history), label
                    history = [{**h, "client_acc": r["client_acc"]} for h, r in zip(history, reference.history)]
                assert_histories_close(history, reference.history, label)
                # bytes between processes: counted, the same on every rank, absent in a world of one
                assert history[-1]["bytes_moved_round"] > 0 and history[-1]["bytes_moved"] > 0, label
                assert reference.history[-1]["bytes_moved"] == 0


# ------------------------------------------------ personalized evaluation: each rank evaluates its own clients
def _personal_worker(rank, world, rdzv, out_dir):
    import dfl

    init_gloo(rank, world, rdzv)
    try:
        result = dfl.run(make_config("mgs-ring", local_test_fraction=0.3, client_chunk=2), data=make_data())
        torch.save(result.history, Path(out_dir) / f"personal-r{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_personalized_metrics_do_not_depend_on_the_world_size(tmp_path):
    import dfl

    reference = dfl.run(make_config("mgs-ring", local_test_fraction=0.3), data=make_data()).history
    spawn(_personal_worker, 2, str(tmp_path / "rdzv"), str(tmp_path))
    keys = [f"{name}_{stat}" for name in ("personal_acc", "global_acc") for stat in ("mean", "std", "min")]
    for rank in range(2):
        history = torch.load(tmp_path / f"personal-r{rank}.pt")
        for got, want in zip(history, reference, strict=True):
            for key in keys:
                assert got[key] == pytest.approx(want[key], abs=1e-6), f"rank {rank} round {want['round']} {key}"


# ------------------------------------------ D-PSGD with local epochs: processes with fewer steps still gossip
def _unequal_data():
    from dfl.data import FederatedData

    g = torch.Generator().manual_seed(1)
    train = [(torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (4, 4, 9, 9)]
    return FederatedData.from_arrays(train=train, test=(torch.randn(12, 5, generator=g), torch.arange(12) % 3),
                                     num_classes=3)


def _dpsgd_epochs_config() -> Config:
    # batch 4, one epoch: clients 0-1 (rank 0) take 1 step, clients 2-3 (rank 1) take 3; all gossip 3 times
    return Config(name="dpsgd-epochs", algorithm="dpsgd", clients=4, rounds=2, eval_every=1, model="logreg",
                  local_epochs=1, batch_size=4, progress=False, train_eval_samples=0, dist_timeout=30.0)


def _dpsgd_epochs_worker(rank, world, rdzv, out_dir):
    import dfl

    init_gloo(rank, world, rdzv)
    try:
        result = dfl.run(_dpsgd_epochs_config(), data=_unequal_data())
        torch.save(result.params, Path(out_dir) / f"dpsgd-r{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_dpsgd_local_epochs_with_unequal_step_counts_across_processes(tmp_path):
    import dfl

    reference = dfl.run(_dpsgd_epochs_config(), data=_unequal_data())
    spawn(_dpsgd_epochs_worker, 2, str(tmp_path / "rdzv"), str(tmp_path))
    for rank, ids in enumerate(([0, 1, 2, 3], [2, 3])):  # the main process: every client; the other: its block
        torch.testing.assert_close(torch.load(tmp_path / f"dpsgd-r{rank}.pt"), reference.params[ids], atol=1e-6, rtol=0)


# ------------------------------------ gradient tracking: extra per-client state, held and checkpointed per block
def _tracking_config(algorithm: str, rounds: int) -> Config:
    return make_config("mgs-ring", algorithm=algorithm, gossip_steps=None, rounds=rounds, checkpoint_every=1)


def _tracking_worker(rank, world, rdzv, out_dir, algorithm):
    import dfl

    init_gloo(rank, world, rdzv)
    try:
        result = dfl.run(_tracking_config(algorithm, 2), data=make_data(), out=Path(out_dir) / "run")
        torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                   Path(out_dir) / f"{algorithm}-r{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["dsgt", "kgt"])
def test_gradient_tracking_does_not_depend_on_the_world_size(tmp_path, algorithm):
    """DSGT's trackers and last gradients, K-GT's corrections: per-client state each rank holds for its block only,
    written to its own shard; world 2 gives world 1's results, and a resume in one process from the two ranks'
    shards continues as the uninterrupted single-process run."""
    import dfl

    # the workers are forked before this process runs anything: forking after torch started its OpenMP threads
    # can leave a child waiting forever on their lock
    spawn(_tracking_worker, 2, str(tmp_path / "rdzv"), str(tmp_path), algorithm)
    two_rounds = dfl.run(_tracking_config(algorithm, 2), data=make_data())
    reference = dfl.run(_tracking_config(algorithm, 3), data=make_data())
    for rank in range(2):
        got = torch.load(tmp_path / f"{algorithm}-r{rank}.pt")
        label = f"{algorithm} world=2 rank={rank}"
        assert got["ids"] == (list(range(CLIENTS)) if rank == 0 else list(even_blocks(CLIENTS, 2)[rank]))
        history = got["history"]
        if rank != 0:
            history = [{**h, "client_acc": r["client_acc"]} for h, r in zip(history, reference.history)]
        torch.testing.assert_close(got["params"], two_rounds.params[got["ids"]], atol=1e-5, rtol=0, msg=label)
        assert_histories_close(history, two_rounds.history, label)
    manifest = ckpt.load(tmp_path / "run")
    assert manifest["processes"] == 2 and manifest["round"] == 2
    names = {"dsgt": ["client_state.last_gradient", "client_state.tracker"], "kgt": ["client_state.correction"]}
    assert sorted(manifest["rows"]) == [*names[algorithm], "params"]
    resumed = dfl.run(_tracking_config(algorithm, 3), data=make_data(), out=tmp_path / "run", resume=True)
    torch.testing.assert_close(resumed.params, reference.params, atol=1e-5, rtol=0, msg=algorithm)
    assert_histories_close(resumed.history, reference.history, f"{algorithm} resumed in one process")


# ------------------------------------------------------------------------------------- a failing rank
def _failing_worker(rank, world, port, out_dir, bad_rank, how="raise"):
    import dfl
    from dfl.algorithms import dfedsam

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    if rank == bad_rank:
        original = dfedsam.DFedSAMMGS.round

        def failing_round(self, t):
            if t == 1:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "device":  # a tensor on another device handed to a collective
                    self.ctx.comm.sum(torch.zeros(3, device="meta"))
                raise ValueError(f"injected failure on rank {rank}")
            return original(self, t)

        dfedsam.DFedSAMMGS.round = failing_round
    tic = time.perf_counter()
    try:
        dfl.run(make_config("mgs-ring", dist_timeout=30.0), data=make_data())
        message = "finished without error"
    except BaseException as exc:  # the test inspects what every rank says
        message = f"{type(exc).__name__}: {exc}"
    initialized = dist.is_initialized()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {"message": message, "seconds": time.perf_counter() - tic, "group_left": not initialized}
    ))


@pytest.mark.parametrize("bad_rank", [1, 0])
def test_a_failing_rank_stops_every_rank_with_a_clear_error(tmp_path, bad_rank):
    reports = _run_failing_world(tmp_path, 3, bad_rank, "raise")
    assert reports[bad_rank]["message"] == f"ValueError: injected failure on rank {bad_rank}"
    for r, report in reports.items():
        assert report["group_left"], f"rank {r} did not destroy its process group"
        assert report["seconds"] < 30.0 + 30.0, f"rank {r} was not stopped within dist_timeout"
        if r == bad_rank:
            continue
        assert report["message"].startswith(f"PeerFailure: rank {r} stopped because rank {bad_rank} "), report
        assert report["message"].endswith(f"failed: ValueError: injected failure on rank {bad_rank}"), report


def _run_failing_world(tmp_path, world, bad_rank, how):
    ctx = mp.start_processes(_failing_worker, args=(world, _free_port(), str(tmp_path), bad_rank, how),
                             nprocs=world, join=False, start_method=START_METHOD)
    deadline = time.monotonic() + 240  # well above dist_timeout: a hang would blow it
    for p in ctx.processes:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [i for i, p in enumerate(ctx.processes) if p.is_alive()]
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    assert not alive, f"ranks {alive} hung after rank {bad_rank} failed"
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world) if r != bad_rank or
            how != "kill"}


def test_the_failing_rank_reports_its_own_device_error_and_the_others_name_it(tmp_path):
    reports = _run_failing_world(tmp_path, 2, 1, "device")
    assert reports[1]["message"].startswith("DeviceMismatch: sum: a (3,) tensor on meta was handed to the "
                                            "communicator, whose device is cpu"), reports[1]
    assert reports[0]["message"].startswith("PeerFailure: rank 0 stopped because rank 1 "), reports[0]
    assert "failed: DeviceMismatch: sum: a (3,) tensor on meta" in reports[0]["message"], reports[0]


@pytest.mark.parametrize("bad_rank", [1, 0])
def test_a_killed_rank_is_named_by_the_others_within_seconds(tmp_path, bad_rank):
    """SIGKILL leaves no message: the others name the rank whose heartbeat stopped (rank 0 hosts the store here,
    so its death takes the store along: the others name it too)."""
    reports = _run_failing_world(tmp_path, 3, bad_rank, "kill")
    for r, report in reports.items():
        assert report["message"].startswith(f"PeerFailure: rank {r} stopped because rank {bad_rank} "), report
        assert report["seconds"] < 60.0, report  # the round before the kill, then a few seconds
        assert report["group_left"], report


# ---------------------------------------------------------------------------------------------- torchrun
@pytest.mark.slow
def test_torchrun_launch_matches_a_single_process_run(tmp_path):
    import dfl

    config = Config(clients=4, rounds=2, eval_every=1, model="logreg", dataset="mnist1d",
                    dataset_options={"num_samples": 600}, local_steps=2, progress=False, topology="ring",
                    train_eval_samples=50, backend="gloo", dist_timeout=60.0)
    args = ["run", "--clients", "4", "--rounds", "2", "--eval-every", "1", "--model", "logreg", "--dataset",
            "mnist1d", "--dataset-options", "num_samples=600", "--local-steps", "2", "--no-progress",
            "--topology", "ring", "--train-eval-samples", "50", "--backend", "gloo", "--dist-timeout", "60",
            "--out", str(tmp_path / "two")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    # this interpreter's torchrun (the `torchrun` on PATH may belong to another environment, with another dfl)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                           "dfl.cli", *args], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    one = dfl.run(config).summary
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (one["processes"], two["processes"]) == (1, 2)
    for key in ("test_acc", "test_loss", "consensus_distance", "train_loss"):
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    lines = (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[-1])["bytes_moved"] > 0
    # the checkpoint holds every client's rows (each rank wrote its own shard), equal to the final parameters, which
    # each rank wrote too (params.shards/, no params.pt: nothing gathered on rank 0)
    checkpoint = ckpt.read(tmp_path / "two")
    final = ckpt.read_final_params(tmp_path / "two")
    assert final["source"] == "params.shards" and not (tmp_path / "two" / "params.pt").exists()
    assert checkpoint["round"] == 2 and checkpoint["params"].shape[0] == 4 and checkpoint["processes"] == 2
    for shards in (tmp_path / "two" / checkpoint["shards"], tmp_path / "two" / "params.shards"):
        assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    torch.testing.assert_close(checkpoint["params"], final["params"])
    assert proc.stdout.count("test accuracy (averaged model)") == 1  # only rank 0 prints the summary


# ------------------------------------------------------------------ exchange plans of random time-varying topologies
def _random_topology_worker(rank, world, rdzv, out):
    from dfl.engine.distributed import DistributedCommunicator, communicator
    from dfl.network.gossip import Gossip

    init_gloo(rank, world, rdzv)
    try:
        communicator.CACHE_BYTES = 20_000  # a few entries' worth at m = 10
        topology = topologies.build("random-k", CLIENTS, k=2, seed=4)
        X_all = torch.randn(CLIENTS, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        report = {"sparse": True, "most_bytes": 0, "most_entries": 0, "errors": []}
        comm = DistributedCommunicator(CLIENTS, "p2p")
        gossip = Gossip(topology, comm, torch.float64, torch.device("cpu"))
        X = X_all[comm.client_ids]
        P = np.eye(CLIENTS)
        for step in range(0, 24, 2):
            X = gossip.mix(X, step, 2)
            for s in (step, step + 1):
                P = topology.matrix(s) @ P
            report["sparse"] &= all(sp.issparse(W) for matrices, _, _ in comm._cache.values() for W in matrices)
            newest = next(reversed(comm._cache.values()))[2]
            report["most_bytes"] = max(report["most_bytes"], comm.cache_bytes - newest)
            report["most_entries"] = max(report["most_entries"], len(comm._cache))
            assert comm.cache_bytes == sum(size for _, _, size in comm._cache.values())
        report["error"] = float(np.abs(comm.gather_rows(X).numpy() - P @ X_all.numpy()).max())
        if rank == 0:
            torch.save(report, out)
    finally:
        dist.destroy_process_group()


def test_random_topologies_exchange_sparse_plans_in_a_cache_bounded_by_bytes(tmp_path):
    """random-k makes a new W every gossip step: its plans are built from CSR (no [m, m] per step), the cache holds
    at most CACHE_BYTES besides its newest entry, and the gossip stays the exact product."""
    out = tmp_path / "report.pt"
    spawn(_random_topology_worker, 2, str(tmp_path / "rdzv"), str(out))
    report = torch.load(out)
    assert report["sparse"], report
    assert 0 < report["most_bytes"] <= 20_000 and 1 < report["most_entries"] < 24, report
    assert report["error"] < 1e-12, report

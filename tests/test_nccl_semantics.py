"""What the NCCL path relies on, pinned on the CPU (gloo): how a failure is named once NCCL's asynchrony is
accounted for, and the communicator interface the engine checks at its boundary.

NCCL collectives return once enqueued; a dead peer shows at a later host sync, and the heartbeat thread ends that
wait by aborting the group (`dfl.engine.distributed.failures`). gloo's abort does not end a blocked collective
(checked: torch 2.13), so these tests put the main thread where NCCL leaves it, in host work after the collective,
and check what happens there: torch's `_abort_process_group` called from the heartbeat thread drops the group, and
whatever this rank raises next is reported as the peer's failure, never as its own. The blocked-kernel part itself
needs a GPU: benchmarks/gpu_check.py step 7 (a SIGKILLed rank under NCCL). Also here: NCCL's error types
classified outside a collective, the NCCL group bound to the rank's GPU (CUDA calls faked and recorded), and the
engine's communicator interface checked at `dfl.run`'s boundary.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dfl
from dfl.engine import checkpoint as ckpt
from dfl.engine import experiment
from dfl.engine.checkpoint import read_final_params
from dfl.engine.distributed import FAILURE_KEY, STOPPED_KEY, FailureWatch
from dfl.errors import ArgumentError, PeerFailure
from dfl.network.comm import LocalCommunicator
from tests.helpers import START_METHOD, blob_data, tiny_config

HANG_GUARD_SECONDS = 60.0  # only against a hang: the abort comes within about a heartbeat (1 s)


def _outcome(call) -> str:
    try:
        out = call()
    except BaseException as exc:  # the test compares what each call says
        return f"{type(exc).__name__}: {exc}"
    return "returned None" if out is None else f"returned {type(out).__name__}: {out}"


def _abort_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=HANG_GUARD_SECONDS))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=HANG_GUARD_SECONDS))
    group_store = dist.distributed_c10d._get_default_store()  # held here: the abort drops torch's reference
    watch = FailureWatch(rank, world, watch=True)  # NCCL's watch, on gloo
    record: dict = {}
    if rank == 1:
        watch.report(ValueError("injected on rank 1"))
        record["own"] = _outcome(lambda: watch.peer_failure(ValueError("injected on rank 1")))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
        store.wait(["test/done"])  # alive (as a stuck NCCL peer would be) until rank 0 has looked
        store.set("test/ack", "1")
    else:
        # where NCCL leaves the main thread: a host sync after an enqueued collective, while the peer is stuck
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while dist.is_initialized() and time.monotonic() < deadline:
            time.sleep(0.05)
        record["group_left"] = not dist.is_initialized()
        record["aborted"] = watch.aborted
        record["garbage"] = _outcome(lambda: watch.peer_failure(ValueError("loss is nan")))
        record["backend"] = _outcome(lambda: watch.peer_failure(dist.DistBackendError("NCCL communicator aborted")))
        record["check"] = _outcome(watch.check)
        record["collective"] = _outcome(lambda: watch.collective(dist.all_reduce, torch.ones(1)))
        record["stopping"] = watch.stopping
        record["stopped_count"] = int(group_store.add(STOPPED_KEY, 0))
        record["destroy"] = _outcome(watch.destroy_group_after_failure)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
        store.set("test/done", "1")
        store.wait(["test/ack"])  # rank 0 hosts the store: it leaves after rank 1 has read "done"
    watch.stop()
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_after_the_heartbeat_aborts_the_group_every_error_names_the_failed_peer(tmp_path):
    mp.start_processes(_abort_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True,
                       start_method=START_METHOD)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    named = "PeerFailure: rank 0 stopped because rank 1 ("
    assert rank0["group_left"] and rank0["aborted"], rank0  # torch's _abort_process_group ran, from the thread
    for key in ("garbage", "backend", "check", "collective"):
        assert rank0[key].startswith(("returned PeerFailure: rank 0 stopped because rank 1 (", named)), (key, rank0)
        assert rank0[key].endswith("failed: ValueError: injected on rank 1"), (key, rank0)
    assert rank0["stopping"] and rank0["stopped_count"] == 2, rank0  # rank 1 reported, rank 0 counted once
    assert rank0["destroy"] == "returned None", rank0  # the group is already gone: nothing to destroy, no error
    assert rank1["own"] == "returned None", rank1  # the failing rank's error is its own


def test_errors_are_classified_by_what_nccl_raises(tmp_path):
    """Without an abort (a world of one, the failure record set by hand): NCCL's DistBackendError, raised at a host
    sync outside any collective, alone or as the cause of another error, names the failed peer; this rank's own
    errors stay its own."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1,
                            timeout=timedelta(seconds=HANG_GUARD_SECONDS))
    try:
        dist.distributed_c10d._get_default_store().set(FAILURE_KEY, "rank 1 (node7) failed: OSError: disk full")
        watch = FailureWatch(0, 1, watch=False)
        wrapped = RuntimeError("checkpoint failed")
        wrapped.__cause__ = dist.DistBackendError("NCCL error: remote process exited")
        named = "rank 0 stopped because rank 1 (node7) failed: OSError: disk full"
        for exc in (dist.DistBackendError("NCCL communicator was aborted"), wrapped, RuntimeError("gloo: closed")):
            peer = watch.peer_failure(exc)
            assert isinstance(peer, PeerFailure) and str(peer) == named, (exc, peer)
        assert watch.peer_failure(ValueError("a bug of this rank")) is None
        assert watch.peer_failure(PeerFailure("already named")) is None
    finally:
        dist.destroy_process_group()


class _AbortedMidRound(LocalCommunicator):
    """A communicator whose group is aborted while round 2's evaluation waits at a host sync."""

    aborted = False

    def check_peers(self) -> None:
        if self.aborted:
            raise PeerFailure("rank 0 stopped because rank 1 (node) failed: ValueError: boom")


def test_metrics_of_a_round_whose_group_was_aborted_are_not_recorded(tmp_path, monkeypatch):
    comm = _AbortedMidRound(6)
    original = experiment.Experiment.evaluate

    def evaluate(self, t, stats):
        metrics = original(self, t, stats)
        if t == 1:
            comm.aborted = True  # the heartbeat aborted the group while this evaluation read its results back
        return metrics

    monkeypatch.setattr(experiment.Experiment, "evaluate", evaluate)
    with pytest.raises(PeerFailure, match="because rank 1"):
        dfl.run(tiny_config(), data=blob_data([10] * 6), out=tmp_path / "run", comm=comm)
    rounds = [json.loads(line)["round"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1], rounds


def test_a_communicator_is_checked_against_the_engine_interface_at_the_boundary():
    class OnlyReductions:  # what an algorithm sees (dfl.algorithms.base.Communicator), not what the engine needs
        num_clients, client_ids = 6, list(range(6))

        def mean_rows(self, X):
            return X.mean(0)

        def sum(self, value):
            return value

        def gather_rows(self, X):
            return X

    with pytest.raises(ArgumentError) as info:
        dfl.run(tiny_config(), data=blob_data([10] * 6), comm=OnlyReductions())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("comm must be a dfl.algorithms.base.EngineCommunicator"), message
    assert message.endswith("OnlyReductions lacks assemble_rows, barrier, bytes_moved, check_peers, close, device, "
                            "finish, gossip_mode, is_main, mix, peer_failure, rank, report_failure, "
                            "world_size"), message
    assert dfl.run(tiny_config(rounds=1), data=blob_data([10] * 6), comm=LocalCommunicator(6)).history


def test_torch_still_has_the_abort_dfl_calls():
    """The heartbeat calls torch's private `_abort_process_group(group=None)`; a rename fails here, not on a GPU."""
    import inspect

    params = inspect.signature(dist.distributed_c10d._abort_process_group).parameters
    assert list(params) == ["group"] and params["group"].default is None


@pytest.fixture
def two_gpus(monkeypatch):
    """CUDA faked as far as dfl's set-up asks (2 GPUs, rank 1 of 2), and what it calls recorded, not run."""
    from dfl.engine.distributed import setup

    calls: dict = {"set_device": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls["set_device"].append(torch.device(device)))
    for name, value in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="1").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    return setup, calls


def test_an_nccl_group_is_bound_to_the_rank_s_gpu(two_gpus, monkeypatch):
    """Barriers and torch's object collectives (DCP's checkpoint planning) run on the bound device, not cuda:0."""
    setup, calls = two_gpus
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: calls.update(init=(args, kwargs)))
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: calls.update(barrier=kwargs))
    setup.init_process_group(tiny_config(device="cuda", backend="nccl"))
    args, kwargs = calls["init"]
    assert args == ("nccl",) and kwargs["device_id"] == torch.device("cuda", 1), calls
    assert calls["set_device"] == [torch.device("cuda", 1)] and calls["barrier"] == {"device_ids": [1]}
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_under_torchrun_dfl_s_nccl_group_gets_the_error_mode_dfl_needs(two_gpus, monkeypatch):
    """torchrun's agent exports TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (tear down) to every worker; torch reads the
    variable when the group is created, and there it is 2 (clean up only, the process lives to name the cause)."""
    setup, calls = two_gpus
    for name, value in dict(TORCH_NCCL_ASYNC_ERROR_HANDLING="1", TORCHELASTIC_RUN_ID="none",
                            TORCHELASTIC_USE_AGENT_STORE="True", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: calls.update(
        mode=os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]))
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: None)
    setup.init_process_group(tiny_config(device="cuda", backend="nccl"))
    assert calls["mode"] == "2"


def test_torch_reads_the_error_mode_where_dfl_sets_it_and_torchrun_exports_tear_down():
    """The premises of the above, in the installed torch's own files: ProcessGroupNCCL reads
    TORCH_NCCL_ASYNC_ERROR_HANDLING, 2 is CleanUpOnly, and the torchrun agent exports 1 unless set."""
    import torch.distributed.elastic.agent.server.local_elastic_agent as agent

    header = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
    if not header.is_file():
        pytest.skip("this torch build ships no C++ headers")
    text = header.read_text()
    assert '"TORCH_NCCL_ASYNC_ERROR_HANDLING"' in text and "CleanUpOnly = 2" in text and "TearDown = 1" in text
    source = Path(agent.__file__).read_text()
    assert '"TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv(' in source and '"TORCH_NCCL_ASYNC_ERROR_HANDLING", str(1)' \
        in source


def test_a_caller_s_nccl_group_gets_the_rank_s_gpu_as_current_device(two_gpus, monkeypatch):
    setup, calls = two_gpus
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(setup, "DistributedCommunicator", lambda *args, **kwargs: (args, kwargs))
    with pytest.warns(UserWarning, match="created with TORCH_NCCL_ASYNC_ERROR_HANDLING=3 \\(skip clean-up\\)"):
        args, kwargs = setup.communicator_from_env(tiny_config(device="cuda"), 6)  # torch's default mode: killed
    assert args[2] == torch.device("cuda", 1) and kwargs == {"owns_group": False}
    assert calls["set_device"] == [torch.device("cuda", 1)]  # set by dfl: the caller's group did not
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the mode dfl needs: no warning
        setup.communicator_from_env(tiny_config(device="cuda"), 6)


@pytest.mark.parametrize("visible, local_rank, gpu", [
    (8, 3, 3),  # torchrun: every GPU of the node visible, LOCAL_RANK picks one
    (1, 3, 0),  # srun --gpus-per-task=1, a pod per GPU: the process sees its own GPU only, as cuda:0
    (2, 3, 1),  # two GPUs bound per task: LOCAL_RANK mod 2
])
def test_each_rank_s_gpu_under_launchers_that_bind_gpus_or_not(two_gpus, monkeypatch, visible, local_rank, gpu):
    setup, calls = two_gpus
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: calls.update(init=kwargs))
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: calls.update(barrier=kwargs))
    setup.init_process_group(tiny_config(device="cuda", backend="nccl"))
    assert calls["init"]["device_id"] == torch.device("cuda", gpu)
    assert calls["set_device"] == [torch.device("cuda", gpu)] and calls["barrier"] == {"device_ids": [gpu]}


def test_a_round_on_cuda_n_synchronizes_cuda_n_not_cuda_0(monkeypatch):
    """The round's timing waits for the rank's own GPU (`torch.cuda.synchronize()` alone waits for the current one)."""
    from types import SimpleNamespace

    from dfl.algorithms.base import RoundStats

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    X = torch.zeros(4, 3)
    fake = SimpleNamespace(
        device=torch.device("cuda", 3), comm=LocalCommunicator(4), config=tiny_config(), round_seconds=[],
        bytes_total=0, message_bytes=12, summary={}, progress=None,
        algorithm=SimpleNamespace(X=X, round=lambda t: RoundStats(train_loss=torch.zeros(4),
                                                                  models_sent=torch.zeros(4, dtype=torch.long))))
    experiment.Experiment.train_round(fake, 0)  # type: ignore[arg-type]
    assert synced == [torch.device("cuda", 3)]


# ------------------------------------------------------------------------------ the end of a completed run
WINDOW = 0.5  # STALE_SECONDS in these workers: rank 0's end of run below lasts several windows


class _SlowEnd:
    """A callback whose on_run_end (run on rank 0 only, after its last collective) outlasts the staleness window."""

    def on_round_end(self, round, metrics):
        return None

    def on_run_end(self, summary):
        time.sleep(6 * WINDOW)


def _end_of_run_worker(rank: int, world: int, port: int, out_dir: str, gather: bool) -> None:
    from dfl.engine.distributed import communicator, failures
    from dfl.engine.results import RunDirectory

    torch.set_num_threads(1)
    failures.STALE_SECONDS, failures.HEARTBEAT_SECONDS = WINDOW, WINDOW / 5
    communicator.WATCHED_BACKENDS = ("nccl", "gloo")  # NCCL's watch on gloo: rank 0 watches rank 1's heartbeat
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    if gather and rank == 0:  # rank 0 writes params.pt slowly, after rank 1 has left the last collective
        save = RunDirectory.save

        def slow_save(self, name, obj):
            time.sleep(6 * WINDOW)
            save(self, name, obj)

        RunDirectory.save = slow_save
    tic = time.perf_counter()
    try:
        result = dfl.run(tiny_config(rounds=2, gather_params=gather, dist_timeout=HANG_GUARD_SECONDS),
                         data=blob_data([10] * 6), out=Path(out_dir) / "run", callbacks=[_SlowEnd()])
        message = f"{result.summary['status']}: {tuple(result.params.shape)}"
    except BaseException as exc:  # the test compares what each rank says
        message = f"{type(exc).__name__}: {exc}"
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {"message": message, "seconds": time.perf_counter() - tic, "group_left": not dist.is_initialized()}))


@pytest.mark.parametrize("gather", [False, True])
def test_a_completed_run_is_not_reported_failed_however_long_rank_0_s_end_of_run_takes(tmp_path, gather):
    """Rank 0's end of run (the final params.pt, the loggers and callbacks) lasts 6 staleness windows while rank 1
    has done its last collective: nobody is reported as stopped responding, and rank 1 does not wait for it."""
    mp.start_processes(_end_of_run_worker, args=(2, _free_port(), str(tmp_path), gather), nprocs=2, join=True,
                       start_method=START_METHOD)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert reports[0]["message"] == "completed: (6, 57)", reports
    assert reports[1]["message"] == "completed: (3, 57)", reports  # its own block
    assert all(report["group_left"] for report in reports), reports
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_params"]["written"] == (
        "gathered" if gather else "shards"), summary
    assert (tmp_path / "run" / ("params.pt" if gather else "params.shards")).exists()
    final = read_final_params(tmp_path / "run")  # params.pt, or every rank's rows from params.shards/
    assert final["source"] == ("params.pt" if gather else "params.shards")
    torch.testing.assert_close(final["params"], ckpt.read(tmp_path / "run")["params"], atol=0, rtol=0)
    torch.testing.assert_close(read_final_params(tmp_path / "run", 2, 5)["params"], final["params"][2:5])


# ------------------------------------------------------------------------------ the heartbeat's load on the store
class _CountingStore:
    """The rendezvous store's key-value calls the heartbeat makes, answered in memory and counted."""

    def __init__(self):
        self.values: dict[str, int | bytes] = {}
        self.requests = 0

    def add(self, key, amount):
        self.requests += 1
        self.values[key] = int(self.values.get(key, 0)) + amount
        return self.values[key]

    def check(self, keys):
        self.requests += 1
        return all(k in self.values for k in keys)

    def get(self, key):
        self.requests += 1
        return self.values[key]

    def set(self, key, value):
        self.requests += 1
        self.values[key] = value.encode() if isinstance(value, str) else value


def _monitors(world: int, store) -> list:
    from dfl.engine.distributed.failures import _Monitor

    return [_Monitor(store, rank, world, watch=True) for rank in range(world)]


@pytest.mark.parametrize("world", [2, 8, 64, 512])
def test_the_heartbeat_load_on_the_store_grows_linearly_with_the_world(world):
    """One heartbeat period of every rank: at most 3 requests per rank (its beat, the failure record, the beats it
    watches), where every rank reading every peer made P² (260,000 a second at 512 ranks)."""
    store = _CountingStore()
    monitors = _monitors(world, store)
    for monitor in monitors:
        monitor.tick()
    assert store.requests <= 3 * world, (world, store.requests)
    watchers = sorted(m.rank for m in monitors if m._seen)
    assert watchers == [0, 1] and sorted(monitors[0]._seen) == list(range(1, world)) and list(monitors[1]._seen) == [0]


def test_a_silent_rank_is_found_by_its_watcher_and_every_rank_learns_it(monkeypatch):
    from dfl.engine.distributed import failures

    clock = [0.0]
    monkeypatch.setattr(failures.time, "monotonic", lambda: clock[0])
    store = _CountingStore()
    monitors = _monitors(8, store)
    for step in range(int(failures.STALE_SECONDS) + 3):  # rank 5 never beats again after its first period
        clock[0] = float(step)
        for monitor in monitors:
            if monitor.rank != 5 or step == 0:
                monitor.tick()
    message = monitors[0].failure
    assert message is not None and message.startswith("rank 5 stopped responding"), message
    clock[0] += 1
    for monitor in monitors[1:]:
        if monitor.rank != 5:
            monitor.tick()  # one more period: each reads the failure record the watcher wrote
    assert all(m.failure == message for m in monitors if m.rank != 5)


def test_a_finished_rank_is_not_watched_and_rank_0_waits_for_every_rank_to_finish(monkeypatch):
    from dfl.engine.distributed import failures

    clock = [0.0]
    monkeypatch.setattr(failures.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(failures.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    store = _CountingStore()
    monitors = _monitors(3, store)
    for monitor in monitors:
        monitor.tick()
    monitors[1].finish()
    monitors[2].finish()  # their last collective is done; their end of run is theirs
    for step in range(1, 4 * int(failures.STALE_SECONDS)):  # rank 0's long end of run: ranks 1, 2 beat no more
        clock[0] = float(step)
        monitors[0].tick()
    assert monitors[0].failure is None
    before = clock[0]
    monitors[0].finish()
    monitors[0].wait_for_finished()
    assert clock[0] - before < 1.0  # every rank had finished: no wait
    assert int(store.values[failures.FINISHED_KEY]) == 3
    monitors[0].unfinish()  # the communicator is used for another run: watched again
    assert int(store.values[failures.FINISHED_KEY]) == 2 and int(store.values["dfl/beat/0"]) < failures.FINISHED_MARK


def test_a_rank_that_starts_another_run_on_the_same_communicator_is_watched_again(monkeypatch):
    from dfl.engine.distributed import failures

    clock = [0.0]
    monkeypatch.setattr(failures.time, "monotonic", lambda: clock[0])
    store = _CountingStore()
    monitors = _monitors(2, store)
    monitors[1].tick()
    monitors[1].finish()
    for step in range(1, 2 * int(failures.STALE_SECONDS)):
        clock[0] = float(step)
        monitors[0].tick()
    assert monitors[0].failure is None  # finished: not waited for
    monitors[1].unfinish()  # its next run's first collective; then it dies
    for step in range(2 * int(failures.STALE_SECONDS), 4 * int(failures.STALE_SECONDS)):
        clock[0] = float(step)
        monitors[0].tick()
    assert monitors[0].failure is not None and monitors[0].failure.startswith("rank 1 stopped responding")

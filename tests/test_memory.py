"""client_chunk = "auto": measured per-client footprint, the chunk rule, and the errors before training."""

from __future__ import annotations

import argparse
import sys
import warnings

import pytest
import torch

import dfl
from dfl.cli.run import add_parser, config_from_args
from dfl.config import Config, ConfigError
from dfl.data import FederatedData
from dfl.engine.validation import validate
from dfl.training import memory

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # only its type is read by choose_chunk


def test_peak_tracker_counts_live_bytes_and_subtracts_freed_ones():
    def work():
        a = torch.ones(1000)  # 4,000 bytes
        b = torch.ones(2000)  # 8,000 more: peak 12,000
        del a, b
        c = torch.ones(500)  # 2,000 after both were freed
        return c

    tracker = memory.PeakTracker()
    with tracker:
        kept = work()
    assert tracker.peak == 12_000
    assert tracker.live == kept.untyped_storage().nbytes() == 2_000


def test_footprint_is_the_slope_and_intercept_of_the_call():
    def call(k):
        return torch.ones(250 + 1000 * k) * 2  # two tensors of (250 + 1000 k) floats alive at once

    fixed, per_client = memory.measure_footprint(call, clients=10, device=CPU)
    assert per_client == 8_000 and fixed == 2_000


def test_chunk_rule_cpu_is_capped_for_speed_cuda_only_by_memory():
    kw = dict(fixed=0, per_client=1 * 2**20, row_bytes=0, free=64 * 2**30)
    cpu, _ = memory.choose_chunk(10_000, device=CPU, **kw)
    assert cpu == memory.CPU_CHUNK_BYTES // 2**20
    gpu, _ = memory.choose_chunk(10_000, device=CUDA, **kw)
    assert gpu == 10_000
    small = dict(kw, free=2 * 2**30)  # budget 1.6 GiB on CUDA: 1638 clients of 1 MiB
    gpu, estimate = memory.choose_chunk(10_000, device=CUDA, **small)
    assert gpu == estimate["memory_limit"] == int(0.8 * 2 * 2**30) // 2**20
    assert memory.choose_chunk(3, device=CPU, **kw)[0] == 3  # never more than the clients


def test_stacks_are_set_aside_before_chunks():
    row = 4 * 10**6  # 4 MB per client row
    chunk, est = memory.choose_chunk(100, fixed=0, per_client=row, row_bytes=row, free=10 * 2**30, device=CUDA)
    assert est["stack_bytes"] == memory.STACK_COPIES * 100 * row
    room = est["budget_bytes"] - est["stack_bytes"]
    assert chunk == min(100, room // (row + memory.STEP_TEMPORARIES * row))


def test_the_planner_counts_every_stack_a_process_holds():
    """held_bytes (X and every per-client state, measured) are set aside with the round's temporaries; in a run,
    CHOCO's public copies x̂ and SCAFFOLD's c_i each add one [m, d] stack to what the plan counts."""
    row = 4 * 10**6
    _, est = memory.choose_chunk(100, fixed=0, per_client=row, row_bytes=row, free=10 * 2**30, device=CUDA,
                                 held_bytes=2 * 100 * row)
    assert est["held_bytes"] == 2 * 100 * row
    assert est["stack_bytes"] == (2 + memory.ROUND_STACKS) * 100 * row
    with pytest.raises(ConfigError, match=r"\[m, d\] stacks of 1000000 clients \(.* held: X and per-client state; "
                                          rf"{memory.ROUND_STACKS} temporaries\)"):
        memory.choose_chunk(10**6, fixed=0, per_client=10**6, row_bytes=10**6, free=2**30, device=CPU,
                            held_bytes=2 * 10**12)
    plain = dfl.run(_small(rounds=1, algorithm="dfedavg")).summary["memory_estimate"]
    stack = plain["held_bytes"]  # X alone
    for changes in (dict(algorithm="dfedavg", compressor="top-k"), dict(algorithm="scaffold")):
        held = dfl.run(_small(rounds=1, **changes)).summary["memory_estimate"]
        assert held["held_bytes"] == 2 * stack and held["stack_bytes"] == plain["stack_bytes"] + stack, changes
    async_ = dfl.run(_small(rounds=1, algorithm="dfedsam", mode="async")).summary["memory_estimate"]
    # X and the message pool: two stacks to start with, and the buffer of its next growth (POOL_GROWTH x)
    assert async_["async_pool_bytes"] == (2 + 3) * stack
    assert async_["held_bytes"] == stack + async_["async_pool_bytes"] + 6 * 8  # and the [6, 1] int64 versions


def test_the_plan_counts_dispfls_round_and_refuses_a_run_it_does_not_fit(monkeypatch, tmp_path):
    """DisPFL's round holds its [m, 2d] message and the mix of it and the new masks: d·itemsize + d bytes a client
    beyond the plan's three [m, d] temporaries (its card's round_bytes), in the plan before anything is allocated."""
    from dfl.engine import setup

    plain = dfl.run(_small(rounds=1, algorithm="dfedavg"))
    sparse = dfl.run(_small(rounds=1, algorithm="dispfl"))
    m, d = plain.params.shape
    own = m * (4 * d + d)
    assert setup.round_bytes("dispfl", d) * m == own and setup.round_bytes("dfedavg", d) == 0
    a, b = plain.summary["memory_estimate"], sparse.summary["memory_estimate"]
    assert b["round_bytes"] == own and "round_bytes" not in a
    # held: X, DisPFL's masks m_i ([m, d] bool) and which changed ([m] bool), and (set aside with them) its round's own
    assert b["held_bytes"] == a["held_bytes"] + m * d + m + own
    assert b["stack_bytes"] == a["stack_bytes"] + m * d + m + own
    assert memory.stack_bytes(m, d, round_bytes=own // m) == memory.stack_bytes(m, d) + own
    # a budget that holds dfedavg's stacks but not dispfl's: refused in one line before any data or stack is made
    need = memory.stack_bytes(m, d)
    monkeypatch.setattr(memory, "available_bytes", lambda device: int((need + own / 2) / memory.MEMORY_FRACTION["cpu"]))
    dfl.run(_small(rounds=1, algorithm="dfedavg"), out=tmp_path / "fits")
    with pytest.raises(ConfigError, match=rf"clients = 6: the run keeps 5 \[m, d\] stacks of 6 clients x {d:,} "
                                          rf"parameters and dispfl's round temporaries \({5 * d:,} bytes a client\), "
                                          "~.* more than its budget"):
        dfl.run(_small(rounds=1, algorithm="dispfl"), out=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("regrowth", ["random", "gradient"])
def test_dispfls_round_stays_within_what_the_plan_counts(monkeypatch, regrowth):
    """The bytes a DisPFL round allocates at its peak (X and its state already held) lie between the plan's three
    [m, d] temporaries, which it exceeds, and those plus the card's round_bytes and one gradient call's chunk (as
    the plan sets them aside), which it keeps to."""
    import gc

    from dfl.algorithms import dispfl
    from dfl.engine import setup

    monkeypatch.setattr(dispfl, "SORT_BYTES", 4096)  # the prune's sorts a row at a time: a bounded cost, not a stack
    peaks = []
    plain_round = dispfl.DisPFL.round

    def measured(self, t):
        tracker = memory.PeakTracker()
        with warnings.catch_warnings():  # isinstance on every live object wakes torch's deprecated aliases
            warnings.simplefilter("ignore", FutureWarning)
            held = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
        for tensor in held:  # what is held before the round (X, masks, data) is not the round's
            if tensor.device.type == "cpu" and not tensor.is_meta:
                tracker._seen.add(tensor.untyped_storage().data_ptr())
        with tracker:
            stats = plain_round(self, t)
        peaks.append((tracker.peak, *self.X.shape))
        return stats

    monkeypatch.setattr(dispfl.DisPFL, "round", measured)
    estimate = dfl.run(_small(rounds=2, clients=16, algorithm="dispfl", algorithm_options={"regrowth": regrowth},
                              client_chunk=2)).summary["memory_estimate"]
    call = estimate["fixed_bytes"] + estimate["chunk"] * estimate["bytes_per_client"]
    for peak, m, d in peaks:
        planned = memory.ROUND_STACKS * m * d * 4
        assert planned < peak <= planned + m * setup.round_bytes("dispfl", d) + call, (peak / (m * d * 4), regrowth)


RESNET18_CIFAR = 11_173_962  # parameters of resnet18 on CIFAR-10 (dfl.models)


def test_the_end_of_run_is_in_the_plan_and_no_host_gathers_a_1000_client_resnet18_unless_asked(monkeypatch):
    """1,000 ResNet-18 clients on 8 GPUs: written as shards, no host holds more than one chunk of the final
    parameters (41.6 GiB gathered on rank 0 before); gathered on request, refused before the first round where rank
    0's host does not have the room."""
    m, d, gpu = 1000, RESNET18_CIFAR, torch.device("cuda", 0)
    population = m * d * 4
    assert population / 2**30 == pytest.approx(41.6, abs=0.1)
    for rank in range(8):
        shards = memory.final_params_plan("shards", m, 125, d, 4, gpu, is_main=rank == 0)
        assert shards["final_params_written_bytes"] == 125 * d * 4  # each rank its own rows
        own = 0 if rank == 0 else 125 * d * 4  # the others keep their rows for their Result.params
        assert shards["final_params_host_bytes"] == memory.ROW_CHUNK_BYTES + own < population / 7
    gathered = memory.final_params_plan("gathered", m, 125, d, 4, gpu, is_main=True)
    assert gathered["final_params_host_bytes"] == gathered["final_params_written_bytes"] == population
    monkeypatch.setattr(memory, "available_memory", lambda: 32 * 2**30)
    memory.check_final_params(shards, m, d)  # nothing to gather
    with pytest.raises(ConfigError, match=r"gather_params: rank 0 would assemble the final parameters of all 1,000 "
                                          r"clients x 11,173,962 parameters on its host .* ~41.63 GiB, more than the "
                                          r"32.00 GiB free there; leave gather_params off"):
        memory.check_final_params(gathered, m, d)
    one = dfl.run(_small(rounds=1)).summary["memory_estimate"]  # a single process: X as params.pt, from the CPU
    assert one["final_params"] == "one file" and one["final_params_host_bytes"] == 0
    assert one["final_params_written_bytes"] == 6 * dfl.run(_small(rounds=1)).summary["num_params"] * 4


def test_nothing_fits_is_an_error_with_the_estimate():
    with pytest.raises(ConfigError, match=r"client_chunk: not even one client fits.*GiB"):
        memory.choose_chunk(10**6, fixed=0, per_client=10**6, row_bytes=10**6, free=2**30, device=CPU)


def test_config_validates_client_chunk():
    assert Config().client_chunk == "auto"
    validate(Config(client_chunk=0))
    validate(Config(client_chunk=16, clients=16))
    with pytest.raises(ConfigError, match="client_chunk must be \"auto\""):
        validate(Config(client_chunk="fast"))
    with pytest.raises(ConfigError, match="client_chunk = 17 is larger than clients = 16"):
        validate(Config(client_chunk=17, clients=16))
    with pytest.raises(ConfigError, match="client_chunk must be >= 0"):
        validate(Config(client_chunk=-1))


def test_cli_accepts_auto_and_numbers():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert config_from_args(parser.parse_args(["run", "--client-chunk", "auto"])).client_chunk == "auto"
    assert config_from_args(parser.parse_args(["run", "--client-chunk", "8"])).client_chunk == 8


def _small(**changes):
    base = dict(clients=6, rounds=2, local_steps=2, batch_size=8, model="mlp", progress=False, eval_every=1,
                train_eval_samples=0, device="cpu", dataset_options={"num_samples": 400})
    return Config(**{**base, **changes})


def test_auto_chunk_gives_the_same_run_as_explicit_chunks():
    data = FederatedData.build("mnist1d", 6, "dirichlet", seed=0, dataset_options={"num_samples": 400},
                               partition_options={"alpha": 0.3})
    auto = dfl.run(_small(), data=data)
    assert 1 <= auto.summary["client_chunk"] <= 6 and auto.summary["memory_estimate"]["bytes_per_client"] > 0
    for chunk in (1, 4):
        other = dfl.run(_small(client_chunk=chunk), data=data)
        assert other.summary["client_chunk"] == chunk
        torch.testing.assert_close(other.params, auto.params, atol=1e-6, rtol=0)


def test_run_that_cannot_fit_stops_before_training_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10_000)
    # the client stacks alone do not fit: refused before they are allocated (`memory.check_stacks`)
    with pytest.raises(ConfigError, match=r"clients = \d+: the run keeps 5 \[m, d\] stacks .* more than its budget"):
        dfl.run(_small(), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_explicit_chunk_above_the_estimate_warns(monkeypatch):
    monkeypatch.setattr(memory, "choose_chunk", lambda clients, *a, **k: (1, {"memory_limit": 1}))
    with pytest.warns(UserWarning, match="client_chunk = 4 may not fit"):
        result = dfl.run(_small(client_chunk=4, rounds=1))
    assert result.summary["client_chunk"] == 4


@pytest.mark.slow
def test_keep_freed_memory_is_glibc_only_and_can_be_declined():
    import subprocess

    code = "from dfl.training import memory; print(memory.keep_freed_memory(), memory.heap_kept())"
    env = {k: v for k, v in __import__("os").environ.items() if k != "DFL_MALLOC"}
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    declined = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**env, "DFL_MALLOC": "system"})
    assert declined.stdout.split() == ["False", "False"]
    if sys.platform.startswith("linux") and __import__("platform").libc_ver()[0] == "glibc":
        assert kept.stdout.split() == ["True", "True"]


def _resident_bytes() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_planning_hands_the_kept_heap_back_to_the_os():
    """A run's freed stacks stay in the kept heap, resident but free. Before planning, the planner hands them back
    (malloc_trim), so the OS counts them as available and a second run of the same size in one process fits
    (2 × mlp × 10,000 failed with "not even one client"), without the process holding them on top of its
    live memory (a kept first Result split them into holes the second run's stacks did not fit)."""
    if not memory.keep_freed_memory():
        pytest.skip("needs glibc's malloc (the kept heap)")
    size = 512 * 2**20
    keep = torch.ones(4 * 2**20)  # something live after the block, so the freed block is not the heap's top
    block = torch.ones(size // 4)  # touched: resident
    late = torch.ones(4 * 2**20)
    held = _resident_bytes()
    del block
    assert _resident_bytes() > held - size / 2  # freed, but kept by the heap (the price of reusing it)
    memory.available_bytes(CPU)
    assert _resident_bytes() < held - 0.9 * size  # handed back to the OS, where MemAvailable counts it
    assert keep.sum() > 0 and late.sum() > 0


def test_stacks_that_cannot_fit_are_refused_before_any_data_is_made(monkeypatch):
    """The model's size from the meta device and the dataset's from its card: no minutes of data generation first."""
    from dfl.engine import setup

    def no_data(config):
        raise AssertionError("the data was made before the memory check")

    monkeypatch.setattr(setup, "build_data", no_data)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 64 * 2**20)  # 64 MiB free
    with pytest.raises(ConfigError, match=r"clients = 2,000: the run keeps 5 \[m, d\] stacks"):
        dfl.run(dfl.Config(clients=2000, rounds=1, progress=False, device="cpu",
                           dataset_options={"num_samples": 4000}))

"""Decisions per device, testable on the CPU: the gossip method chosen by a timed, cached calibration on
calibrated devices (the CPU keeps its measured rule); gossip in IEEE fp32 whatever the training precision; PyTorch's
TF32 defaults left alone by fp32 runs; what compile needs on CUDA (Triton, a GPU it compiles for, a C compiler)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl.network import gossip as gossip_module
from dfl.network.comm import LocalCommunicator
from dfl.network.gossip import Gossip, ieee_fp32
from dfl.training import local


@pytest.fixture
def calibrated_cpu(monkeypatch):
    """The CPU treated as a calibrated device, with a fake clock: each way of mixing costs what `costs` says."""
    costs = {}
    now = [0.0]
    original = Gossip._apply

    def apply(self, method, X, first_step, steps):
        now[0] += costs[method]
        costs.setdefault("calls", []).append(method)
        return original(self, method, X, first_step, steps)

    monkeypatch.setattr(gossip_module, "CALIBRATED_DEVICES", ("cpu",))
    monkeypatch.setattr(gossip_module, "_clock", lambda: now[0])
    monkeypatch.setattr(gossip_module, "_CALIBRATION", {})
    monkeypatch.setattr(Gossip, "_apply", apply)
    return costs


@pytest.mark.parametrize("fastest", ["dense", "circulant", "steps"])
def test_calibration_picks_the_fastest_way_and_caches_it(calibrated_cpu, fastest):
    m, d = 24, 7
    calibrated_cpu.update({"dense": 3.0, "circulant": 2.0, "steps": 5.0, fastest: 1.0})
    topology = topologies.build("ring", m)
    gossip = Gossip(topology, LocalCommunicator(m), torch.float64, torch.device("cpu"))
    X = torch.randn(m, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert gossip.candidates(0, 4) == ["dense", "circulant", "steps"]
    Y = gossip.mix(X, 0, 4)
    assert gossip.method(0, 4, X) == fastest
    (found,) = gossip_module.calibrations().values()
    assert found["method"] == fastest and set(found["seconds"]) == {"dense", "circulant", "steps"}
    timed = len(calibrated_cpu["calls"])  # warm-up + CALIBRATION_REPEATS per way, then the mix itself
    assert timed == 3 * (1 + gossip_module.CALIBRATION_REPEATS) + 1
    gossip.mix(X, 4, 4)  # the same matrices: cached, nothing timed again
    assert gossip.method(4, 4, X) == fastest and calibrated_cpu["calls"][timed:] == [fastest]
    P = np.linalg.matrix_power(topology.matrix(0), 4)
    np.testing.assert_allclose(Y.numpy(), P @ X.numpy(), atol=1e-12)  # any way: the same product


def test_the_cpu_keeps_its_measured_rule():
    m = 1000  # ring, Q = 4: the composed circulant pass (dense only for m <= 4 (K + 1) = 40)
    gossip = Gossip(topologies.build("ring", m), LocalCommunicator(m), torch.float32, torch.device("cpu"))
    X = torch.zeros(m, 3)
    assert gossip.method(0, 4, X) == "circulant" and not gossip_module.calibrations()
    small = Gossip(topologies.build("ring", 16), LocalCommunicator(16), torch.float32, torch.device("cpu"))
    assert small.method(0, 4, torch.zeros(16, 3)) == "dense"


def test_ieee_fp32_turns_tf32_off_inside_and_puts_it_back():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        with ieee_fp32(torch.device("cuda")):
            assert matmul.fp32_precision == "ieee"
        assert matmul.fp32_precision == "tf32"
        with ieee_fp32(torch.device("cpu")):  # the CPU's fp32 matmuls are IEEE: nothing to change
            assert matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision = before


def test_an_fp32_run_leaves_pytorchs_tf32_defaults_alone():
    cudnn_before, matmul_before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.fp32_precision
    dfl.run(dfl.Config(clients=4, rounds=1, model="logreg", dataset="mnist1d", dataset_options={"num_samples": 600},
                       local_steps=1, progress=False))
    assert torch.backends.cudnn.allow_tf32 == cudnn_before  # PyTorch's default: True
    assert torch.backends.cuda.matmul.fp32_precision == matmul_before


def test_bf16_training_gossips_an_fp32_stack_outside_autocast(monkeypatch):
    seen = []
    original = gossip_module.exact_matmul

    def spy(A, X):
        seen.append((X.dtype, torch.is_autocast_enabled("cpu")))
        return original(A, X)

    monkeypatch.setattr(gossip_module, "exact_matmul", spy)
    monkeypatch.setattr("dfl.training.local.warn_if_slow_bf16", lambda *a: False)
    dfl.run(dfl.Config(clients=4, rounds=1, model="logreg", dataset="mnist1d", dataset_options={"num_samples": 600},
                       local_steps=1, progress=False, precision="bf16", topology="exponential"))
    assert seen and all(dtype == torch.float32 and not autocast for dtype, autocast in seen), seen


def test_compile_on_cuda_checks_what_triton_needs(monkeypatch):
    device = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(local.shutil, "which", lambda name: "/usr/bin/" + name)
    real_find_spec = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "triton" else
                        real_find_spec(name, *a))
    local.require_triton(device)  # everything there
    monkeypatch.setattr(local.shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(ValueError, match=r"needs a C compiler for Triton.*compile = false"):
        local.require_triton(device)
    monkeypatch.setattr(local.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (6, 1))
    with pytest.raises(ValueError, match=r"compute capability >= 7.0 .* has 6.1"):
        local.require_triton(device)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "triton" else
                        real_find_spec(name, *a))
    with pytest.raises(ValueError, match=r"needs Triton"):
        local.require_triton(device)


def test_received_rows_are_added_without_racing_atomics_and_as_before_on_the_cpu():
    """RowsOperator adds the j-th received term of every row in its j-th index_add_ (a row at most once per call: no
    two CUDA atomics on one row, so the same sums every run); on the CPU that is bit for bit the one index_add_ with
    every term that it replaces (the CPU adds in index order)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    n, r, d = 7, 5, 33
    dense = rng.random((n, n + r)) * (rng.random((n, n + r)) < 0.6)
    dense[:, n:] *= rng.random((n, r)) < 0.8  # rows with 0, 1 and up to r received terms
    A = sp.csr_array(dense)
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    R = torch.randn(r, d, generator=torch.Generator().manual_seed(2))
    op = gossip_module.RowsOperator(A, n, torch.float32, torch.device("cpu"))
    assert len(op.remote_calls) == int((dense[:, n:] != 0).sum(1).max()) >= 3
    for rows in torch.split(op.remote_rows, op.remote_calls):
        assert rows.unique().numel() == rows.numel()  # distinct rows within each call
    got = op(X, R)
    # the replaced path: local terms tile by tile, then every received term in one index_add_ in row-major order
    local = op(X, torch.zeros_like(R))
    sorted_A = sp.csr_array(dense)
    sorted_A.sort_indices()
    coo = sp.coo_array(sorted_A[:, n:])
    order = np.lexsort((coo.col, coo.row))
    rows, src = torch.from_numpy(coo.row[order].astype(np.int64)), torch.from_numpy(coo.col[order].astype(np.int64))
    vals = torch.from_numpy(coo.data[order]).float().view(-1, 1)
    before = local.index_add_(0, rows, R[src] * vals)
    assert torch.equal(got, before)
    np.testing.assert_allclose(got.numpy(), dense @ np.concatenate([X.numpy(), R.numpy()]), rtol=1e-5, atol=1e-6)

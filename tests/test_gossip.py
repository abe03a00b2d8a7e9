"""Gossip paths (averaging, circulant shifts, CSR, dense product) equal the float64 product of the step matrices."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import topologies
from dfl.network.comm import LocalCommunicator, exchange_plan
from dfl.network.gossip import Gossip, SparseStep, circulant_offsets, compose_circulants, shifted_sum, use_dense

STATIC = [
    ("ring", {}), ("grid", {}), ("grid", {"periodic": True}), ("exponential", {}), ("exponential", {"symmetric": True}),
    ("full", {}), ("star", {}), ("hypercube", {}), ("random-regular", {"degree": 3}), ("erdos-renyi", {"p": 0.5}),
]
TIME_VARYING = [("one-peer-exponential", {}), ("random-k", {"k": 2})]


def reference(topo, X: torch.Tensor, first: int, steps: int) -> np.ndarray:
    out = X.double().numpy()
    for s in range(first, first + steps):
        out = topo.matrix(s) @ out
    return out


def circulant_matrix(offsets, n: int) -> np.ndarray:
    """W[i, (i + k) mod n] = c_k for every (k, c_k) of `offsets`."""
    W = np.zeros((n, n))
    for k, c in offsets:
        W[np.arange(n), (np.arange(n) + k) % n] += c
    return W


def sparse_only(gossip: Gossip) -> Gossip:
    gossip.dense_is_cheaper = lambda first, steps: False
    return gossip


@pytest.mark.parametrize("name,options", STATIC + TIME_VARYING, ids=lambda v: str(v))
@pytest.mark.parametrize("n", [8, 16])
def test_sparse_gossip_equals_float64_product(name, options, n, device):
    topo = topologies.build(name, n, **options)
    X = torch.randn(n, 37, generator=torch.Generator().manual_seed(n))
    for first, steps in ((0, 1), (3, 4)):
        expected = reference(topo, X, first, steps)
        for gossip in (sparse_only(Gossip(topo, LocalCommunicator(n), torch.float32, torch.device(device))),
                       Gossip(topo, LocalCommunicator(n), torch.float32, torch.device(device))):
            out = gossip.mix(X.to(device), first, steps).cpu().double().numpy()
            np.testing.assert_allclose(out, expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("weights", ["metropolis", "max-degree", "lazy"])
def test_weight_schemes_on_sparse_path(weights):
    topo = topologies.build("grid", 12, weights=weights)
    X = torch.randn(12, 9, dtype=torch.float64)
    out = sparse_only(Gossip(topo, LocalCommunicator(12), torch.float64, torch.device("cpu"))).mix(X, 0, 3)
    np.testing.assert_allclose(out.numpy(), reference(topo, X, 0, 3), atol=1e-12)


def test_circulant_detection():
    ring = topologies.build("ring", 10).sparse(0)
    offsets = dict(circulant_offsets(ring))
    assert set(offsets) == {0, 1, 9} and all(c == pytest.approx(1 / 3) for c in offsets.values())
    assert circulant_offsets(topologies.build("exponential", 16).sparse(0)) is not None
    assert circulant_offsets(topologies.build("grid", 12).sparse(0)) is None  # boundary nodes differ
    assert circulant_offsets(topologies.build("star", 6).sparse(0)) is None
    W = np.eye(4)
    W[0, 0] = 0.5  # same pattern, other weights: not circulant (and not a gossip matrix, but detection only)
    assert circulant_offsets(sp.csr_array(W)) is None


def test_shifted_sum_is_the_circulant_product():
    n = 7
    X = torch.randn(n, 5, dtype=torch.float64)
    offsets = [(2, 0.25), (0, 0.5), (5, 0.25)]
    W = circulant_matrix(offsets, n)
    np.testing.assert_allclose(shifted_sum(X, offsets).numpy(), W @ X.numpy(), atol=1e-14)
    # without a self weight the first offset initialises the output
    np.testing.assert_allclose(shifted_sum(X, [(3, 1.0)]).numpy(), np.roll(X.numpy(), -3, axis=0), atol=0)


def test_csr_step_for_non_circulant_graphs():
    topo = topologies.build("star", 9)
    step = SparseStep(topo.sparse(0), torch.float32, torch.device("cpu"))
    assert step.offsets is None and step.matrix is not None and step.nnz == 9 + 2 * 8


def test_cost_rule():
    # a ring (3 nonzeros per row): dense only while m² ≤ 20 · Q · 4m, i.e. m ≤ 80 Q
    assert use_dense(64, [3 * 64], time_varying=False)
    assert use_dense(320, [3 * 320] * 4, time_varying=False)
    assert not use_dense(330, [3 * 330] * 4, time_varying=False)
    assert not use_dense(1000, [3 * 1000], time_varying=False)
    # a dense custom matrix: always dense (while formed at all)
    assert use_dense(1000, [1000 * 1000], time_varying=False)
    assert not use_dense(5000, [5000 * 5000], time_varying=False)  # above DENSE_MAX_CLIENTS
    # time-varying products are charged for forming them: one-peer exponential at m = 64, Q = 6
    assert not use_dense(64, [2 * 64] * 6, time_varying=True)
    assert use_dense(16, [2 * 16] * 4, time_varying=True)


def test_large_ring_never_forms_a_dense_matrix(monkeypatch):
    m = 50_000
    topo = topologies.build("ring", m)

    def refuse(*a, **k):
        raise AssertionError("dense matrix formed")

    monkeypatch.setattr(topo, "matrix", refuse)
    gossip = Gossip(topo, LocalCommunicator(m), torch.float32, torch.device("cpu"))
    X = torch.randn(m, 3)
    out = gossip.mix(X, 0, 2)
    W = topo.sparse(0)
    np.testing.assert_allclose(out.double().numpy(), W @ (W @ X.double().numpy()), atol=2e-6)
    assert gossip.sends(0, 2).tolist()[:3] == [4, 4, 4]


def test_full_topology_averages_without_a_matrix():
    m = 30_000
    topo = topologies.build("full", m)
    gossip = Gossip(topo, LocalCommunicator(m), torch.float32, torch.device("cpu"))
    X = torch.randn(m, 4, dtype=torch.float64)
    np.testing.assert_allclose(gossip.mix(X, 0, 3).numpy(), np.tile(X.mean(0).numpy(), (m, 1)), atol=1e-12)
    lazy = Gossip(topologies.build("full", 10, weights="lazy"), LocalCommunicator(10), torch.float64,
                  torch.device("cpu"))
    X = torch.randn(10, 4, dtype=torch.float64)
    W = topologies.build("full", 10, weights="lazy").matrix(0)
    np.testing.assert_allclose(lazy.mix(X, 0, 2).numpy(), W @ W @ X.numpy(), atol=1e-12)


def test_exchange_plan_is_the_same_for_sparse_and_dense():
    topo = topologies.build("random-regular", 24, degree=3, seed=1)
    blocks = [range(0, 7), range(7, 14), range(14, 19), range(19, 24)]
    dense, sparse = exchange_plan(topo.matrix(0), blocks), exchange_plan(topo.sparse(0), blocks)
    for q in range(4):
        for r in range(4):
            np.testing.assert_array_equal(dense.send[q][r], sparse.send[q][r])


@pytest.mark.parametrize("tile_rows", [1, 3, 7])
def test_shifted_sum_in_row_blocks(monkeypatch, tile_rows):
    import dfl.network.gossip as gossip_module

    n, d = 11, 6
    monkeypatch.setattr(gossip_module, "TILE_BYTES", tile_rows * d * 8)
    X = torch.randn(n, d, dtype=torch.float64)
    offsets = [(0, 0.4), (1, 0.2), (10, 0.2), (4, 0.1), (7, 0.1)]
    W = circulant_matrix(offsets, n)
    np.testing.assert_allclose(shifted_sum(X, offsets).numpy(), W @ X.numpy(), atol=1e-14)


def test_composed_circulants_are_the_product_of_the_steps():
    rng = np.random.default_rng(0)
    n = 13
    steps = [[(int(k), float(rng.random())) for k in rng.choice(n, size=3, replace=False)] for _ in range(4)]
    expected = np.eye(n)
    for offsets in steps:  # first step applied first: W_4 W_3 W_2 W_1
        expected = circulant_matrix(offsets, n) @ expected
    np.testing.assert_allclose(circulant_matrix(compose_circulants(steps, n), n), expected, atol=1e-15)
    ring = circulant_offsets(topologies.build("ring", 10).sparse(0))
    assert [k for k, _ in compose_circulants([ring] * 4, 10)] == [0, 1, 2, 3, 4, 6, 7, 8, 9]  # ±4 hops, wrapped


@pytest.mark.parametrize("name,n,first,expected_pass", [
    ("ring", 100, 0, True),                  # 9 offsets in one pass instead of 4 passes of 3
    ("one-peer-exponential", 64, 3, True),   # time-varying: steps 3..6, 16 offsets
    ("exponential", 128, 0, False),          # 4 steps of 8 offsets compose into nearly every offset: step by step
])
def test_circulant_rounds_run_as_one_pass_when_few_offsets(monkeypatch, name, n, first, expected_pass):
    import dfl.network.gossip as gossip_module

    passes = []
    monkeypatch.setattr(gossip_module, "shifted_sum", lambda X, offsets: passes.append(len(offsets)) or
                        shifted_sum(X, offsets))
    topo = topologies.build(name, n)
    gossip = sparse_only(Gossip(topo, LocalCommunicator(n), torch.float32, torch.device("cpu")))
    X = torch.randn(n, 21, generator=torch.Generator().manual_seed(1))
    out = gossip.mix(X, first, 4)
    np.testing.assert_allclose(out.double().numpy(), reference(topo, X, first, 4), atol=2e-6, rtol=0)
    assert (len(passes) == 1) == expected_pass and len(passes) in (1, 4)


def test_cost_rule_for_a_composed_circulant():
    assert use_dense(32, [3 * 32] * 4, time_varying=False, composed_offsets=9)  # measured: dense 1.9 ms, pass 2.5
    assert not use_dense(48, [3 * 48] * 4, time_varying=False, composed_offsets=9)  # 5.2 vs 4.2 ms
    assert not use_dense(100, [3 * 100] * 4, time_varying=False, composed_offsets=9)  # was dense: 13.6 vs 9.5 ms
    gossip = Gossip(topologies.build("ring", 100), LocalCommunicator(100), torch.float32, torch.device("cpu"))
    assert not gossip.dense_is_cheaper(0, 4) and len(gossip.circulant_product(0, 4)) == 9

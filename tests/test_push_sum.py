"""Push-sum on column-stochastic W: SGP and DFedSAM-MGS exact against numpy references written from
Assran et al. (ICML 2019, Algorithm 1), the de-biased models reach the plain average where gossip alone does not,
refusals, a checkpoint resumes the weights, and a torchrun world of 2 processes (gloo) gives the one-process result."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl import algorithms
from dfl.algorithms import ALGORITHMS, mixes_by_push_sum
from tests.helpers import (
    M,
    assert_world_of_two_gives_the_single_process_result,
    heterogeneous_data,
    logreg_gradients,
    sam_gradients,
)
from tests.helpers import tracking_config as config

# an irregular digraph on M = 6 nodes: out-degrees 3, 1, 2, 1, 1, 1, so column-stochastic weights are not doubly
DIGRAPH = nx.DiGraph([(0, 1), (0, 2), (0, 3), (1, 2), (2, 3), (2, 5), (3, 4), (4, 5), (5, 0)])
EDGES = Path(__file__).with_name("data") / "push_sum_digraph.edgelist"  # DIGRAPH's edges, "u v" per line
DIRECTED = dict(topology="custom", weights="column-stochastic",
                topology_options={"edges": str(EDGES), "directed": True})


def column_w() -> np.ndarray:
    W = topologies.build("custom", M, "column-stochastic", graph=DIGRAPH).W
    W = W.toarray() if hasattr(W, "toarray") else np.asarray(W)
    assert np.allclose(W.sum(axis=0), 1) and not np.allclose(W.sum(axis=1), 1)
    return W


def sgp_reference(x0, W, data, lr, wd, iterations):
    """Assran et al., Alg. 1: z = x/w; x ← x − γ ∇F(z); x ← W x; w ← W w (w^0 = 1); returns z."""
    x, w = x0.copy(), np.ones(len(x0))
    for _ in range(iterations):
        z = x / w[:, None]
        x = W @ (x - lr * (logreg_gradients(z, data) + wd * z))
        w = W @ w
    return x / w[:, None]


def local_sam_push_sum_reference(x0, W, data, lr, wd, rounds, K, Q, rho):
    """Local SAM (K steps from z, plain SGD) added to the numerator, then Q push-sum steps of [x, w]."""
    x, w = x0.copy(), np.ones(len(x0))
    WQ = np.linalg.matrix_power(W, Q)
    for _ in range(rounds):
        z = x / w[:, None]
        y = z.copy()
        for _ in range(K):
            y = y - lr * (sam_gradients(y, data, rho) + wd * y)
        x, w = WQ @ (x + (y - z)), WQ @ w
    return x / w[:, None]


def test_sgp_is_dfedavg_with_one_local_step_and_exact_against_the_paper():
    data = heterogeneous_data()
    result = dfl.run(config("dfedavg", local_steps=1, rounds=8, eval_every=8, **DIRECTED), data=data)
    assert result.summary["weights"] == "column-stochastic"
    z = sgp_reference(result.initial_params.double().numpy(), column_w(), data, 0.2, 0.01, 8)
    np.testing.assert_allclose(result.params.double().numpy(), z, atol=2e-5)


def test_dfedsam_mgs_with_push_sum_is_exact():
    data = heterogeneous_data()
    cfg = config("dfedsam-mgs", rho=0.05, momentum=0.0, gossip_steps=3, **DIRECTED)
    result = dfl.run(cfg, data=data)
    z = local_sam_push_sum_reference(result.initial_params.double().numpy(), column_w(), data, 0.2, 0.01,
                                     rounds=3, K=3, Q=3, rho=0.05)
    np.testing.assert_allclose(result.params.double().numpy(), z, atol=2e-5)


def test_push_sum_reaches_the_plain_average_where_gossip_alone_does_not():
    # with a learning rate too small to move the models, only the mixing acts: push-sum's ratio z = x/w converges
    # to the plain mean of the initial models, while X <- W^t X (no weights) has rows proportional to W's Perron
    # vector, far from consensus
    data = heterogeneous_data()
    result = dfl.run(config("dfedavg", lr=1e-12, rounds=80, eval_every=80, weight_decay=0.0, **DIRECTED), data=data)
    x0 = result.initial_params.double().numpy()
    mean = x0.mean(axis=0)
    np.testing.assert_allclose(result.params.double().numpy(), np.broadcast_to(mean, x0.shape), atol=1e-5)
    plain = np.linalg.matrix_power(column_w(), 80) @ x0
    assert np.abs(plain - mean).max() > 0.1 * np.abs(mean).max()


def test_the_refusal_lists_exactly_the_algorithms_that_mix_by_push_sum():
    assert algorithms.able("push_sum") == [name for name in ALGORITHMS.names() if mixes_by_push_sum(name)]
    assert algorithms.able("push_sum") == ["dfedavg", "dfedavgm", "dfedsam", "dfedsam-mgs"]


def test_column_stochastic_w_is_refused_where_push_sum_does_not_apply():
    with pytest.raises(dfl.ConfigError, match="'dsgt' does not mix by push-sum; use one of dfedavg"):
        dfl.validate(config("dsgt", **DIRECTED))
    with pytest.raises(dfl.ConfigError, match="compressor = top-k does not carry them"):
        dfl.validate(config("dfedsam", compressor="top-k", **DIRECTED))
    with pytest.raises(dfl.ConfigError, match="mode = async does not carry them"):
        dfl.validate(config("dfedavg", mode="async", **DIRECTED))
    dfl.validate(config("dfedsam-mgs", **DIRECTED))  # accepted


def test_the_edge_file_is_the_digraph():
    assert sorted(topologies.build("custom", M, "column-stochastic", **DIRECTED["topology_options"]).graph.edges) \
        == sorted(DIGRAPH.edges)


def test_a_checkpoint_keeps_the_push_sum_weights(tmp_path):
    data = heterogeneous_data()
    directed = DIRECTED
    whole = dfl.run(config("dfedavg", rounds=4, eval_every=2, **directed), data=data)
    first = dfl.run(config("dfedavg", rounds=2, eval_every=2, checkpoint_every=2, **directed), data=data,
                    out=tmp_path / "run")
    assert first.summary["rounds"] == 2
    resumed = dfl.run(config("dfedavg", rounds=4, eval_every=2, checkpoint_every=2, **directed), data=data,
                      out=tmp_path / "run", resume=True)
    torch.testing.assert_close(resumed.params, whole.params, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------- torchrun: world size 2, gloo
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_world_of_two_processes_gives_the_single_process_result(tmp_path):
    case = dict(algorithm="dfedsam-mgs", gossip_steps=2, rounds=2, eval_every=1, **DIRECTED)
    assert_world_of_two_gives_the_single_process_result(tmp_path, {"dfedsam-mgs-push-sum": case})

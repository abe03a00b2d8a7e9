"""Gradient tracking: DSGT and K-GT, with and without SAM, exact against numpy references written from
the papers' update rules; on a heterogeneous quadratic they reach the global optimum where D-PSGD and DFedAvg
keep a bias; a torchrun world of 2 processes (gloo) gives the single-process result."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl.algorithms import algorithm_class, resolve_hyperparameters
from dfl.algorithms.base import Context
from dfl.config import Config
from dfl.network.comm import LocalCommunicator
from dfl.network.gossip import Gossip
from dfl.training.local import LocalResult
from tests.helpers import (
    M,
    assert_world_of_two_gives_the_single_process_result,
    heterogeneous_data,
    logreg_gradients,
    sam_gradients,
)
from tests.helpers import tracking_config as config


# --------------------------------------------------------------------------- numpy references (the papers' rules)
def dsgt_reference(x0, W, data, lr, wd, iterations, rho=0.0):
    """Pu & Nedić: x^{k+1} = W(x^k − α y^k); y^{k+1} = W y^k + g(x^{k+1}) − g(x^k); y^0 = g(x^0)."""
    def grad(x):
        return (sam_gradients(x, data, rho) if rho else logreg_gradients(x, data)) + wd * x

    x = x0.copy()
    g = grad(x)
    y = g.copy()
    for _ in range(iterations):
        x_next = W @ (x - lr * y)
        g_next = grad(x_next)
        y = W @ y + g_next - g
        x, g = x_next, g_next
    return x


def kgt_reference(x0, W, data, lr, wd, rounds, K, outer_lr=1.0, rho=0.0):
    """Liu et al., Algorithm 1: K corrected local steps, c ← c − Δ/(Kη) + W Δ/(Kη), x ← W(x − η_s Δ)."""
    def grad(z):
        return (sam_gradients(z, data, rho) if rho else logreg_gradients(z, data)) + wd * z

    x, c = x0.copy(), np.zeros_like(x0)
    for _ in range(rounds):
        z = x.copy()
        for _ in range(K):
            z = z - lr * (grad(z) + c)  # ∇F_i(z) + c_i (+ weight decay)
        delta = x - z
        c = c - delta / (K * lr) + W @ delta / (K * lr)
        x = W @ (x - outer_lr * delta)
    return x


@pytest.mark.parametrize("algorithm,rho", [("dsgt", 0.0), ("dsgt-sam", 0.05)])
def test_dsgt_is_exact_against_the_paper(algorithm, rho):
    data = heterogeneous_data()
    result = dfl.run(config(algorithm, rho=rho), data=data)
    W = topologies.build("ring", M).W
    x = dsgt_reference(result.initial_params.double().numpy(), W, data, 0.2, 0.01, 3 * 3, rho)
    np.testing.assert_allclose(result.params.double().numpy(), x, atol=2e-5)
    # 2 vectors per link and iteration: 3 rounds x 3 iterations x 2 ring neighbours x 2 vectors x M clients
    assert result.history[-1]["bytes_sent_total"] == 9 * 2 * 2 * M * result.summary["num_params"] * 4


@pytest.mark.parametrize("algorithm,rho,outer_lr", [("kgt", 0.0, 1.0), ("kgt", 0.0, 0.5), ("kgt-sam", 0.05, 1.0)])
def test_kgt_is_exact_against_the_paper(algorithm, rho, outer_lr):
    data = heterogeneous_data()
    result = dfl.run(config(algorithm, rho=rho, topology="exponential", algorithm_options={"outer_lr": outer_lr}),
                     data=data)
    W = topologies.build("exponential", M).W
    x = kgt_reference(result.initial_params.double().numpy(), W, data, 0.2, 0.01, 3, 3, outer_lr, rho)
    np.testing.assert_allclose(result.params.double().numpy(), x, atol=2e-5)


def test_kgt_with_one_local_step_is_dsgt():
    data = heterogeneous_data()
    a = dfl.run(config("kgt", local_steps=1, rounds=6), data=data)
    b = dfl.run(config("dsgt", local_steps=1, rounds=6), data=data)
    torch.testing.assert_close(a.params, b.params, atol=1e-5, rtol=0)


def test_bad_options_are_refused():
    with pytest.raises(dfl.ConfigError, match="outer_lr .* must be > 0"):
        dfl.validate(config("kgt", algorithm_options={"outer_lr": 0.0}))
    with pytest.raises(dfl.ConfigError, match="local_optimizer = adam is not defined for dsgt"):
        dfl.validate(config("dsgt", local_optimizer="adam"))


# ----------------------------------------------------------------------- the heterogeneous quadratic problem
class QuadraticTrainer:
    """f_i(x) = ½ (x − b_i)ᵀ A_i (x − b_i) with exact gradients: the trainer interface the algorithms use."""

    def __init__(self, A: torch.Tensor, b: torch.Tensor, K: int):
        self.A, self.b, self.K = A, b, K
        self.mode, self.amount, self.batch_size = "steps", K, 0
        m = len(b)
        batch = SimpleNamespace(rows=torch.arange(m))
        self._schedule = SimpleNamespace(steps=K, batch=lambda k: batch,
                                         steps_per_client=torch.full((m,), K, dtype=torch.long))

    def grad(self, X: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return torch.einsum("mij,mj->mi", self.A[rows], X - self.b[rows])

    def schedule(self, t):
        return self._schedule

    def gradient(self, Xb, batch):
        return self.grad(Xb, batch.rows), torch.zeros(len(Xb), dtype=Xb.dtype)

    def sam_gradient(self, Xb, batch, rule):
        assert rule.rho == 0
        return self.gradient(Xb, batch)

    def train(self, X, t, lr, rule, momentum=None, transform=None, rows=None, adam=None):
        rows = torch.arange(len(X))
        Y = X.clone()
        for _ in range(self.K):
            g = self.grad(Y, rows)
            if transform is not None:
                g = transform(g, Y, rows)
            Y = Y - lr * g
        return LocalResult(Y=Y, momentum=None, loss=torch.zeros(len(X), dtype=X.dtype),
                           steps=torch.full((len(X),), self.K, dtype=torch.long))


def quadratic_run(algorithm: str, K: int, rounds: int, lr: float):
    m, d = 8, 4
    rng = np.random.default_rng(0)
    A = torch.tensor(np.stack([np.diag(rng.uniform(1.0, 3.0, d)) for _ in range(m)]))
    b = torch.tensor(rng.normal(0.0, 5.0, (m, d)))  # far-apart local optima: strong heterogeneity
    optimum = torch.linalg.solve(A.sum(0), torch.einsum("mij,mj->i", A, b))  # argmin Σ_i f_i
    cfg = Config(algorithm=algorithm, clients=m, lr=lr, lr_decay=1.0, local_steps=K, rounds=rounds)
    hp = resolve_hyperparameters(cfg)
    comm = LocalCommunicator(m)
    topo = topologies.build("ring", m)
    ctx = Context(config=cfg, hp=hp, trainer=QuadraticTrainer(A, b, K),
                  gossip=Gossip(topo, comm, torch.float64, torch.device("cpu")), comm=comm)
    algo = algorithm_class(algorithm)(ctx, torch.zeros(m, d, dtype=torch.float64))
    for t in range(rounds):
        algo.round(t)
    return (algo.X - optimum).norm(dim=1).max().item()


def test_gradient_tracking_reaches_the_global_optimum_where_dpsgd_and_dfedavg_keep_a_bias():
    # one gradient step per gossip: DSGT converges to the minimiser of Σ f_i, D-PSGD stalls at a biased point
    assert quadratic_run("dsgt", K=1, rounds=600, lr=0.05) < 1e-8
    assert quadratic_run("dpsgd", K=1, rounds=600, lr=0.05) > 1e-2
    # five local steps per gossip: K-GT converges, DFedAvg drifts towards the local optima
    assert quadratic_run("kgt", K=5, rounds=400, lr=0.02) < 1e-8
    assert quadratic_run("dfedavg", K=5, rounds=400, lr=0.02) > 1e-1


# --------------------------------------------------------------- the DisPFL random topology in a run; refusals
def test_row_stochastic_random_pull_runs_and_a_column_stochastic_w_is_refused():
    data = heterogeneous_data()
    cfg = config("dfedavg", topology="random-pull", topology_options={"k": 2}, rounds=1, weight_decay=0.0)
    result = dfl.run(cfg, data=data)
    assert result.summary["weights"] == "row-stochastic"
    # one round of DFedAvg on the row-stochastic W_0 of the run's seed: x_i <- (y_i + y_j + y_l)/3
    Y = result.initial_params.double().numpy()
    for _ in range(3):  # three full-batch local steps
        Y = Y - 0.2 * logreg_gradients(Y, data)
    W0 = topologies.build("random-pull", M, k=2, seed=cfg.seed).matrix(0)
    np.testing.assert_allclose(result.params.double().numpy(), W0 @ Y, atol=1e-5)
    with pytest.raises(dfl.ConfigError, match="column-stochastic: gossip X <- W X keeps its sum but not its average"):
        dfl.validate(config("dsgt", topology="directed-ring", weights="column-stochastic"))
    with pytest.raises(dfl.ConfigError, match="stochastic = column"):
        # a matrix in topology_options is a TOML value (config.toml records it): a list of rows
        dfl.validate(config("dsgt", topology="custom",
                            topology_options={"matrix": np.eye(M).tolist(), "stochastic": "column"}))
    with pytest.raises(dfl.ConfigError, match="must list 6 sample counts"):
        dfl.validate(config("dsgt", weights="sample-count", topology_options={"sizes": [1, 2]}))
    with pytest.raises(dfl.ConfigError, match="link_failure = 0.1 needs an undirected topology"):
        dfl.validate(config("dsgt", topology="directed-ring", link_failure=0.1))
    sizes = data.sizes.tolist()
    result = dfl.run(config("dfedavg", weights="sample-count", topology_options={"sizes": sizes}, rounds=1), data=data)
    assert result.summary["weights"] == "sample-count"
    # unset sizes: the run weighs by its own partition's counts, the same W
    default = dfl.run(config("dfedavg", weights="sample-count", rounds=1), data=data)
    torch.testing.assert_close(default.params, result.params, atol=0, rtol=0)


# ------------------------------------------------------------------------------- torchrun: world size 2, gloo
CASES = {case: dict(changes, rounds=2, eval_every=1) for case, changes in {
    "dsgt-ring": dict(algorithm="dsgt"),
    "kgt-sam-exponential": dict(algorithm="kgt-sam", topology="exponential", local_steps=2),
    "dfedavg-random-pull": dict(algorithm="dfedavg", topology="random-pull", topology_options={"k": 2}),
}.items()}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_world_of_two_processes_gives_the_single_process_result(tmp_path):
    assert_world_of_two_gives_the_single_process_result(tmp_path, CASES)

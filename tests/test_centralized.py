"""Centralized FL algorithms (docs/reference/update-rules.md#centralized-conventions): the identities
(docs/reference/update-rules.md#identities-the-tests-check), participation, aggregation, bytes,
world-size invariance and configuration errors. Full-batch gradients (batch_size = 0) unless noted."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import dfl
from dfl.algorithms import Context, algorithm_class, resolve_hyperparameters
from dfl.algorithms.server import sample_participants
from dfl.config import Config, ConfigError
from dfl.engine.setup import resolve_device
from dfl.engine.validation import validate
from dfl.models import build_model
from dfl.network.comm import LocalCommunicator
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.local import LocalTrainer
from tests.helpers import init_gloo

M = 6  # clients


def make_data(m=M, sizes=None, seed=0):
    """Heterogeneous, non-separable 3-class data: client i's inputs are shifted by i (so f_i differ)."""
    from dfl.data import FederatedData

    g = torch.Generator().manual_seed(seed)
    sizes = sizes or [10] * m
    train = []
    for i, n in enumerate(sizes):
        x = torch.randn(n, 4, generator=g) + torch.tensor([i / m, -i / m, 0.5, 0.0])
        y = (x[:, 0] + torch.randn(n, generator=g) > 0.3).long() + (i % 2)
        train.append((x, y))
    test = (torch.randn(24, 4, generator=g), torch.randint(0, 3, (24,), generator=g))
    return FederatedData.from_arrays(train=train, test=test, num_classes=3)


def config(**changes):
    values = dict(
        clients=M, model="logreg", rounds=3, batch_size=0, local_steps=2, lr=0.2, lr_decay=1.0, eval_every=1,
        progress=False, topology="full", train_eval_samples=0, algorithm="fedavg",
    )
    values.update(changes)
    return Config(**values)


def run(cfg, data=None):
    return dfl.run(cfg, data=data or make_data(cfg.clients))


def build(cfg, data=None):
    """The runner's set-up on `cfg.device`, returning the algorithm object (to read and set its state directly),
    the model and the data (both on that device)."""
    cfg = validate(cfg)
    device = resolve_device(cfg.device)
    data = (data or make_data(cfg.clients)).to(device)
    hp = resolve_hyperparameters(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, tuple(data.input_shape), data.num_classes, **cfg.model_options).to(device)
    layout = ParamLayout.of(model)
    comm = LocalCommunicator(cfg.clients)
    trainer = LocalTrainer(model, layout, data, comm.client_ids, cfg)
    ctx = Context(config=cfg, hp=hp, trainer=trainer, gossip=None, comm=comm)
    X0 = initial_stack(model, cfg.clients, device)
    return algorithm_class(cfg.algorithm)(ctx, X0.clone()), model, layout, data


def pooled_loss(model, layout, row, data, weights):
    """Σ_i w_i f_i(row) with f_i the mean cross-entropy of client i (full batch)."""
    padded, sizes = data.padded_indices()
    total = 0.0
    for i, w in enumerate(weights):
        idx = padded[i, : sizes[i]]
        logits = torch.func.functional_call(model, layout.views(row), (data.train_x[idx],))
        total = total + w * F.cross_entropy(logits, data.train_y[idx])
    return total


# ------------------------------------------------------------------------------------- §5 identities
@pytest.mark.parametrize("aggregation", ["uniform", "size"])
def test_fedavg_one_local_step_is_one_gd_step_on_the_weighted_loss(aggregation, device, slack):
    sizes = [6, 10, 14, 8, 12, 10]
    data = make_data(sizes=sizes)
    result = run(config(local_steps=1, rounds=1, aggregation=aggregation, device=device), data)
    _, model, layout, data = build(config(device=device), data)
    x0 = result.initial_params[0].clone().to(device).requires_grad_(True)
    p = np.array(sizes) / sum(sizes) if aggregation == "size" else np.full(M, 1 / M)
    (grad,) = torch.autograd.grad(pooled_loss(model, layout, x0, data, p), x0)
    expected = (x0 - 0.2 * grad).detach().cpu()
    torch.testing.assert_close(result.params, expected.expand_as(result.params), atol=1e-6 * slack, rtol=1e-5)
    assert result.history[-1]["consensus_distance"] < 1e-12  # every row holds the global model


def test_dfedavg_on_the_complete_graph_is_fedavg(device, slack):
    kw = dict(model="mlp", model_options={"hidden": [5]}, batch_size=4, local_steps=3, rounds=3, device=device)
    a = run(config(algorithm="fedavg", **kw))
    b = run(config(algorithm="dfedavg", **kw))
    torch.testing.assert_close(a.params, b.params, atol=1e-6 * slack, rtol=1e-5)
    assert [h["test_acc"] for h in a.history] == [h["test_acc"] for h in b.history]


@pytest.mark.parametrize("momentum_variant, base, extra", [
    ("fedcm", "fedavg", {}),
    ("mofedsam", "fedsam", {"rho": 0.05}),
])
def test_client_momentum_with_alpha_one_is_its_base(momentum_variant, base, extra, device):
    kw = dict(batch_size=4, local_steps=3, rounds=3, device=device, **extra)
    a = run(config(algorithm=momentum_variant, fedcm_alpha=1.0, **kw))
    b = run(config(algorithm=base, **kw))
    torch.testing.assert_close(a.params, b.params)
    c = run(config(algorithm=momentum_variant, **kw))  # default α = 0.1: the server direction matters
    assert not torch.allclose(c.params, b.params, atol=1e-4)


def test_domo_reductions(device, slack):
    kw = dict(local_steps=3, rounds=4, lr=0.1, server_momentum=0.8, device=device)
    slmz = run(config(algorithm="fedavgslm-z", momentum=0.5, **kw))
    for name in ("domo", "domo-s"):
        domo = run(config(algorithm=name, domo_alpha=0.0, momentum=0.5, **kw))
        torch.testing.assert_close(domo.params, slmz.params, atol=1e-6 * slack, rtol=1e-5, msg=name)
    sm = run(config(algorithm="fedavgsm", **kw))
    domo = run(config(algorithm="domo", domo_alpha=0.0, momentum=0.0, **kw))
    torch.testing.assert_close(domo.params, sm.params, atol=1e-6 * slack, rtol=1e-5)
    # α ≠ 0: the fused momentum changes the trajectory, and DOMO-S differs from DOMO
    fused = run(config(algorithm="domo", domo_alpha=0.5, momentum=0.5, **kw))
    scattered = run(config(algorithm="domo-s", domo_alpha=0.5, momentum=0.5, **kw))
    assert not torch.allclose(fused.params, slmz.params, atol=1e-4)
    assert not torch.allclose(fused.params, scattered.params, atol=1e-4)


def test_domo_upload_is_the_pseudo_gradient_from_the_fused_start(device, slack):
    """d_i = (x − y_K)/(ηK) − α m = (y_0 − y_K)/(ηK): the server momentum is not counted twice."""
    alg, *_ = build(config(algorithm="domo", domo_alpha=0.7, momentum=0.5, local_steps=3, device=device))
    alg.round(0)
    alg.round(1)
    m, x, lr, alpha, K = alg.m.clone(), alg.x.clone(), 0.2, 0.7, 3
    start = x - alpha * lr * K * m
    Y = alg.ctx.trainer.train(start.expand_as(alg.X).clone(), 2, lr, alg.ctx.rule(2)).Y
    d = ((start - Y) / (lr * K)).mean(0)
    alg.round(2)
    torch.testing.assert_close(alg.m, 0.9 * m + d, atol=1e-6 * slack, rtol=1e-5)
    torch.testing.assert_close(alg.x, x - lr * K * alg.m, atol=1e-6 * slack, rtol=1e-5)


def test_mimelite_with_beta_zero_is_fedavg_and_momentum_is_the_full_gradient(device, slack):
    kw = dict(batch_size=4, local_steps=3, rounds=3, device=device)
    torch.testing.assert_close(run(config(algorithm="mimelite", server_momentum=0.0, **kw)).params,
                               run(config(algorithm="fedavg", **kw)).params)
    # m after one round = (1 − β) mean_i ∇f_i(x_0), from minibatches of an epoch
    alg, model, layout, data = build(config(algorithm="mimelite", batch_size=4, server_momentum=0.9, device=device))
    x0 = alg.x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(pooled_loss(model, layout, x0, data, np.full(M, 1 / M)), x0)
    alg.round(0)
    torch.testing.assert_close(alg.m, 0.1 * grad, atol=1e-6 * slack, rtol=1e-5)


def test_scaffold_fixed_point_does_not_drift_but_fedavg_does(device):
    """With x = x*, c_i = ∇f_i(x*) and c = Σ c_i/N ≈ 0, SCAFFOLD's local steps stay at x*; FedAvg's drift."""
    cfg = config(algorithm="scaffold", local_steps=10, lr=0.5, rounds=1, device=device)
    alg, model, layout, data = build(cfg)
    x = alg.x.double().requires_grad_(True)  # x* = argmin (1/N) Σ f_i, solved in float64
    data64 = copy.copy(data)
    data64.train_x = data.train_x.double()
    model64 = copy.deepcopy(model).double()
    optimizer = torch.optim.LBFGS([x], lr=1, max_iter=500, tolerance_grad=1e-12, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = pooled_loss(model64, layout, x, data64, np.full(M, 1 / M))
        loss.backward()
        return loss

    optimizer.step(closure)
    x_star = x.detach().float()
    schedule = alg.ctx.trainer.schedule(0)
    X_star = x_star.expand(M, -1).clone()
    ci, _ = alg.ctx.trainer.gradient(X_star, schedule.batch(0))  # ∇f_i(x*), full batch
    residual = float(ci.mean(0).norm())  # ∇f(x*) after rounding x* to float32
    assert residual < 1e-4 and ci.norm(dim=1).min() > 1e-2  # x* is stationary; the clients disagree there
    alg.load_state({"x": x_star, "X": X_star.clone(), "ci": ci.clone(), "c": ci.mean(0)})
    alg.round(0)
    drift = float((alg.x - x_star).norm())
    assert drift < 2 * 0.5 * 10 * residual + 1e-6  # at most the K steps along the residual c = ∇f(x*)
    torch.testing.assert_close(alg.ci, ci, atol=1e-4, rtol=0)  # c_i⁺ = c_i at the fixed point

    fedavg, *_ = build(cfg.replace(algorithm="fedavg"))
    fedavg.load_state({"x": x_star, "X": X_star.clone()})
    fedavg.round(0)
    assert (fedavg.x - x_star).norm() > 1e-2


def test_fedgloss_without_sam_is_feddyn_with_alpha_one_over_beta(device, slack):
    kw = dict(model="mlp", model_options={"hidden": [5]}, batch_size=4, local_steps=2, rounds=4,
              participation=0.5, device=device)
    dyn = run(config(algorithm="feddyn", feddyn_alpha=0.25, **kw))
    gloss = run(config(algorithm="fedgloss", fedgloss_beta=4.0, rho=0.0, server_rho=0.0, **kw))
    torch.testing.assert_close(gloss.params, dyn.params, atol=1e-6 * slack, rtol=1e-5)
    sam = run(config(algorithm="fedgloss", fedgloss_beta=4.0, rho=0.0, server_rho=0.5, **kw))
    assert not torch.allclose(sam.params, dyn.params, atol=1e-4)


def test_fedavglm_averages_the_buffer_and_z_variant_resets_it(device):
    kw = dict(local_steps=3, rounds=3, device=device)
    lm, lmz = run(config(algorithm="fedavglm", **kw)), run(config(algorithm="fedavglm-z", **kw))
    assert not torch.allclose(lm.params, lmz.params, atol=1e-5)
    alg, *_ = build(config(algorithm="fedavglm", **kw))
    alg.round(0)
    Y = alg.ctx.trainer.train(alg.X, 1, 0.2, alg.ctx.rule(1), momentum=alg.u.expand_as(alg.X)).Y
    alg.round(1)
    torch.testing.assert_close(alg.x, Y.mean(0))


def test_fedgloss_rho_ramp_is_linear_then_constant():
    alg, *_ = build(config(algorithm="fedgloss", rho_ramp_rounds=10, server_rho=0.101))
    rho = alg.ctx.rho  # (t, final radius): FedGLoSS's ramp is the shared ρ schedule (default "linear")
    assert rho(0, 0.101) == pytest.approx(0.001)
    assert rho(5, 0.101) == pytest.approx(0.051)
    assert rho(10, 0.101) == rho(50, 0.101) == pytest.approx(0.101)
    assert rho(3, 0.0) == 0.0


# ------------------------------------------------------------------------------------- participation
def test_sampling_depends_only_on_seed_and_round():
    a = sample_participants(3, 7, 20, 0.25, "uniform")
    assert a.sum() == 5 and np.array_equal(a, sample_participants(3, 7, 20, 0.25, "uniform"))
    assert not np.array_equal(a, sample_participants(3, 8, 20, 0.25, "uniform"))
    assert not np.array_equal(a, sample_participants(4, 7, 20, 0.25, "uniform"))
    assert sample_participants(0, 0, 20, 0.01, "uniform").sum() == 1  # at least one client
    assert sample_participants(0, 0, 20, 1.0, "bernoulli").all()
    counts = np.array([sample_participants(0, t, 50, 0.3, "bernoulli").sum() for t in range(200)])
    assert abs(counts.mean() / 50 - 0.3) < 0.02 and counts.std() > 0  # independent joins, random |S_t|


def test_partial_participation_trains_only_the_sample_and_keeps_the_others_state(device):
    for name, key in (("scaffold", "ci"), ("feddyn", "h"), ("fedgloss", "sigma_k")):
        alg, *_ = build(config(algorithm=name, participation=0.5, batch_size=4, local_steps=2, device=device))
        for t in range(3):
            before = getattr(alg, key).clone()
            stats = alg.round(t)
            part = torch.as_tensor(sample_participants(0, t, M, 0.5, "uniform"))
            after = getattr(alg, key)
            torch.testing.assert_close(after[~part], before[~part], rtol=0, atol=0, msg=name)
            assert (after[part] != before[part]).any(dim=1).all(), name
            assert (stats.train_loss[~part] == 0).all() and (stats.train_loss[part] > 0).all()
            assert stats.models_sent.tolist() == (part.long() * (alg.uplink + alg.downlink)).tolist()
            torch.testing.assert_close(alg.X, alg.x.expand_as(alg.X), rtol=0, atol=0)  # broadcast to every row
            if name == "scaffold":  # the invariant c = (1/N) Σ_all c_i survives partial participation
                torch.testing.assert_close(alg.c, alg.ci.mean(0))


def test_partial_participation_equals_fedavg_of_the_sampled_clients(device):
    cfg = config(participation=0.5, rounds=1, local_steps=2, device=device)
    result = run(cfg)
    alg, *_ = build(cfg.replace(participation=None))
    Y = alg.ctx.trainer.train(alg.X, 0, 0.2, alg.ctx.rule(0)).Y.cpu()
    part = torch.as_tensor(sample_participants(0, 0, M, 0.5, "uniform"))
    torch.testing.assert_close(result.params[0], Y[part].mean(0))


def test_bernoulli_round_nobody_joins_is_skipped(device):
    empty = next(t for t in range(1000) if not sample_participants(0, t, M, 0.1, "bernoulli").any())
    alg, *_ = build(config(participation=0.1, participation_mode="bernoulli", device=device))
    x = alg.x.clone()
    stats = alg.round(empty)
    assert torch.equal(alg.x, x) and stats.models_sent.sum() == 0


def test_bytes_count_uplink_and_downlink_of_participants():
    d = 4 * 3 + 3
    for name, vectors in (("fedavg", 2), ("scaffold", 4), ("mimelite", 4), ("fedcm", 3), ("fedavglm", 4)):
        result = run(config(algorithm=name, participation=0.5, rounds=1))
        assert result.history[-1]["bytes_sent"] == 3 * vectors * d * 4, name


# ------------------------------------------------------------------------------------- world size
CASES = {
    "scaffold": dict(algorithm="scaffold"),
    "feddyn": dict(algorithm="feddyn", aggregation="size"),
    "fedgloss": dict(algorithm="fedgloss", rho=0.05, server_rho=0.05),
    "domo-s": dict(algorithm="domo-s", participation_mode="bernoulli"),
    "mimelite": dict(algorithm="mimelite"),
}


def world_config(case):
    return config(batch_size=4, local_steps=2, participation=0.5, seed=2, **CASES[case])


def world_data():
    return make_data(sizes=[6, 9, 12, 7, 10, 8])


def _world_worker(rank, world, rdzv, out_dir):
    init_gloo(rank, world, rdzv)
    try:
        for case in CASES:
            result = dfl.run(world_config(case), data=world_data())
            torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                       Path(out_dir) / f"{case}-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])  # 4 processes host 2, 2, 1, 1 clients: some rounds, none sampled
@pytest.mark.slow
def test_world_size_does_not_change_centralized_results(tmp_path, world):
    mp.start_processes(_world_worker, args=(world, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=world,
                       join=True, start_method="spawn")
    for case in CASES:
        reference = dfl.run(world_config(case), data=world_data())
        for rank in range(world):
            got = torch.load(tmp_path / f"{case}-{rank}.pt")
            torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0, msg=case)
            assert [h["test_acc"] for h in got["history"]] == [h["test_acc"] for h in reference.history]
            assert [h["bytes_sent"] for h in got["history"]] == [h["bytes_sent"] for h in reference.history]


# ------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("changes, match", [
    ({"participation": 0.0}, "participation must be > 0"),
    ({"participation": 1.5}, r"participation must be in \(0, 1\]"),
    ({"participation": "half"}, "participation must be a finite number"),
    ({"participation": 0.5, "algorithm": "dfedavg"}, "participation = 0.5 applies only to the centralized"),
    ({"participation_mode": "poisson"}, "participation_mode must be one of uniform, bernoulli"),
    ({"aggregation": "median"}, "aggregation must be one of uniform, size"),
    ({"server_lr": 0.0}, "server_lr must be > 0"),
    ({"server_momentum": 1.0}, r"server_momentum must be in \[0, 1\)"),
    ({"server_momentum": -0.1}, "server_momentum must be >= 0"),
    ({"fedcm_alpha": 1.5}, r"fedcm_alpha must be in \[0, 1\]"),
    ({"domo_alpha": -1.0}, "domo_alpha must be >= 0"),
    ({"feddyn_alpha": 0.0}, "feddyn_alpha must be > 0"),
    ({"fedgloss_beta": float("inf")}, "fedgloss_beta must be a finite number"),
    ({"server_rho": -0.1}, "server_rho must be >= 0"),
    ({"rho_ramp_rounds": 2.5}, "rho_ramp_rounds must be an integer"),
    ({"rho_ramp_rounds": -1}, "rho_ramp_rounds must be >= 0"),
])
def test_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        validate(config(**changes))


def test_option_of_another_algorithm_is_refused():
    with pytest.raises(ConfigError, match="feddyn_alpha = 0.1 is not read by fedavg; .* reads it: feddyn$"):
        validate(config(feddyn_alpha=0.1, rounds=1))
    assert run(config(rounds=1)).summary["hyperparameters"]["participation"] == 1.0
    with pytest.raises(ConfigError, match="participation = 1.0 is not read by dfedavg.*; aggregation = 'uniform' is"):
        validate(config(algorithm="dfedavg", aggregation="uniform", participation=1.0, rounds=1))  # defaults too

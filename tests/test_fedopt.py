"""FedProx and the adaptive server optimizers FedAdam, FedYogi, FedAdagrad
(docs/reference/update-rules.md#fedprox, #fedadam-fedyogi-and-fedadagrad).

FedProx: μ = 0 is FedAvg bit for bit; μ > 0 equals a per-client torch loop whose loss carries μ/2‖w − x_t‖². The
server rules equal a numpy loop over rounds written from Algorithm 2 (and Flower's and torch's forms from those
libraries' code), with partial participation; resume is bit-identical; two processes give one process's result;
the refusals answer in one line before torch loads.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
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
from dfl.cli import main
from dfl.config import ConfigError
from dfl.engine.validation import validate
from dfl.models import build_model
from dfl.network.comm import LocalCommunicator
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.local import LocalTrainer, Proximal
from tests.helpers import (
    TIMING,
    assert_same_history,
    blob_data,
    init_gloo,
    interrupted,
    tiny_config,
    torch_optimizer,
)

M = 6
SIZES = (6, 9, 12, 7, 10, 8)


def make_data():
    return blob_data(list(SIZES), shift=1.0, seed=4)


def build(config, data, device="cpu"):
    """The runner's set-up of `config`'s algorithm on one process, returned with its model and layout."""
    config = validate(config)
    data = data.to(device)
    hp = resolve_hyperparameters(config)
    torch.manual_seed(config.seed)
    model = build_model(config.model, tuple(data.input_shape), data.num_classes, **config.model_options).to(device)
    layout = ParamLayout.of(model)
    comm = LocalCommunicator(config.clients)
    trainer = LocalTrainer(model, layout, data, comm.client_ids, config)
    ctx = Context(config=config, hp=hp, trainer=trainer, gossip=None, comm=comm)
    return algorithm_class(config.algorithm)(ctx, initial_stack(model, config.clients, device)), model, layout, data


def weights(mask, aggregation):
    """p_i over S_t: 1/|S_t| or n_i / Σ_S n_j."""
    size = np.asarray(SIZES, dtype=float) if aggregation == "size" else np.ones(M)
    return np.where(mask, size, 0.0) / size[mask].sum()


# ------------------------------------------------------------------------------------------------ FedProx
@pytest.mark.parametrize("changes", [
    {},
    dict(weight_decay=1e-3, clip_grad_norm=0.5, participation=0.5, aggregation="size"),
    dict(participation=0.4, participation_mode="bernoulli", local_epochs=1, local_steps=None),
    dict(local_optimizer="adam", lr=0.01, local_optimizer_state="keep", participation=0.5),
])
def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(changes, device):
    config = tiny_config(device=device, **changes)
    fedavg = dfl.run(config.replace(algorithm="fedavg"), data=make_data())
    fedprox = dfl.run(config.replace(algorithm="fedprox", prox_mu=0.0), data=make_data())
    assert torch.equal(fedprox.params, fedavg.params)
    assert_same_history(fedprox.history, fedavg.history, str(changes))
    moved = dfl.run(config.replace(algorithm="fedprox", prox_mu=1.0), data=make_data())
    assert not torch.equal(moved.params, fedavg.params)  # the term is there once μ > 0


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])  # SGD's parameter-by-parameter path and the joined rows
def test_a_shared_anchor_equals_the_same_anchor_on_every_row(optimizer, device):
    alg, *_ = build(tiny_config(algorithm="fedprox", device=device), make_data(), device)
    trainer, x, rows = alg.ctx.trainer, alg.X[0].clone(), torch.tensor([0, 2, 5], device=alg.X.device)
    rule = alg.ctx.rule(0, optimizer=optimizer, clip_grad_norm=0.5)
    shared, per_row = (trainer.train(alg.X, 0, 0.05, rule, rows=rows, proximal=Proximal(0.7, anchor)).Y
                       for anchor in (x, x.expand_as(alg.X).clone()))
    assert torch.equal(shared, per_row)
    plain = trainer.train(alg.X, 0, 0.05, rule, rows=rows).Y
    assert not torch.equal(shared, plain) and torch.equal(shared[[1, 3, 4]], plain[[1, 3, 4]])


def proximal_reference(model, layout, data, schedule, x, clients, lr, rule, mu):
    """Each client of `clients` trained from x by torch.optim with μ/2 ‖w − x‖² added to its minibatch loss."""
    anchor = layout.views(x)
    rows = {}
    for i in clients:
        net = copy.deepcopy(model)
        layout.load_into(net, x)
        opt = torch_optimizer(net.parameters(), lr, rule)
        B = schedule.batch_size
        for k in range(int(schedule.steps_per_client[i])):
            idx = schedule.index[i, k * B: (k + 1) * B]
            keep = schedule.weight[i, k * B: (k + 1) * B] > 0
            opt.zero_grad()
            loss = F.cross_entropy(net(data.train_x[idx[keep]]), data.train_y[idx[keep]])
            proximal = sum(((p - anchor[n]) ** 2).sum() for n, p in net.named_parameters())
            (loss + mu / 2 * proximal).backward()
            if rule.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), rule.clip_grad_norm)
            opt.step()
        rows[i] = layout.flatten(net)
    return rows


@pytest.mark.parametrize("changes", [
    dict(weight_decay=1e-3, clip_grad_norm=0.5, aggregation="size"),  # the term enters before clipping and decay
    dict(local_optimizer="adam", lr=0.02),
])
def test_fedprox_equals_a_per_client_loop_with_the_proximal_term_in_the_loss(changes, device, slack):
    mu, rounds = 0.5, 3
    config = tiny_config(algorithm="fedprox", prox_mu=mu, participation=0.5, rounds=rounds, lr_decay=0.9,
                         device=device, **changes)
    result = dfl.run(config, data=make_data())
    alg, model, layout, data = build(config, make_data(), device)
    x = alg.X[0].clone()  # every client's start, x_0 (the run's x_0 is the mean of equal rows, up to a rounding)
    for t in range(rounds):
        part = sample_participants(config.seed, t, M, 0.5, "uniform")
        rows = proximal_reference(model, layout, data, alg.ctx.trainer.schedule(t), x, np.flatnonzero(part),
                                  alg.ctx.lr(t), alg.ctx.rule(t), mu)
        p = weights(part, config.aggregation or "uniform")
        x = x + sum(float(p[i]) * (rows[i] - x) for i in rows)  # x_{t+1} = x_t + Σ_S p_i (y_i − x_t)
    torch.testing.assert_close(result.params, x.cpu().expand_as(result.params), atol=2e-6 * slack, rtol=1e-5)


# ------------------------------------------------------------------------------------- the server optimizers
class Reference:
    """The server rule in float64 numpy, written from its source, fed the same Δ_t as the run (lock-step)."""

    def __init__(self, name, hp, d):
        self.name, self.hp = name, hp
        self.form = hp["fedopt_form"]
        tau = hp["server_tau"]
        self.m = np.zeros(d)
        self.v = np.full(d, tau**2) if self.form == "paper" else np.zeros(d)  # Alg. 2: v_{−1} ≥ τ²; libraries: 0
        if self.form == "torch":  # pfl-research's central optimizer: torch.optim.Adam on the gradient −Δ_t
            self.param = torch.zeros(d, dtype=torch.float64, requires_grad=True)
            self.adam = torch.optim.Adam([self.param], lr=hp["server_lr"], eps=tau,
                                         betas=(hp["server_beta1"], hp["server_beta2"]))

    def step(self, x, delta, t):
        """x_{t+1} from x_t and Δ_t (float64)."""
        hp = self.hp
        eta, b1, tau = hp["server_lr"], hp["server_beta1"], hp["server_tau"]
        if self.form == "torch":
            with torch.no_grad():
                self.param.copy_(torch.from_numpy(x))
            self.param.grad = -torch.from_numpy(delta)
            self.adam.step()
            state = self.adam.state[self.param]
            self.m, self.v = -state["exp_avg"].numpy(), state["exp_avg_sq"].numpy()
            return self.param.detach().numpy().copy()
        self.m = b1 * self.m + (1 - b1) * delta
        square = delta * delta
        if self.name == "fedadagrad":
            self.v = self.v + square
        elif self.name == "fedadam":
            self.v = hp["server_beta2"] * self.v + (1 - hp["server_beta2"]) * square
        else:  # fedyogi
            self.v = self.v - (1 - hp["server_beta2"]) * square * np.sign(self.v - square)
        if self.name == "fedadam" and self.form == "flower":  # Flower: eta_norm with server_round (from 1) + 1
            server_round = t + 1
            eta = eta * np.sqrt(1 - hp["server_beta2"] ** (server_round + 1.0)) / (
                1 - hp["server_beta1"] ** (server_round + 1.0))
        return x + eta * self.m / (np.sqrt(self.v) + tau)


def a_seed_with_an_empty_round(fraction, rounds):
    """A seed whose Bernoulli sample leaves one of the first `rounds` rounds empty and fills at least three."""
    for seed in range(1000):
        filled = [sample_participants(seed, t, M, fraction, "bernoulli").any() for t in range(rounds)]
        if not all(filled) and sum(filled) >= 3:
            return seed
    raise AssertionError("no such seed")


FORMS = [("fedadam", "paper"), ("fedyogi", "paper"), ("fedadagrad", "paper"), ("fedadam", "flower"),
         ("fedyogi", "flower"), ("fedadagrad", "flower"), ("fedadam", "torch")]
PARTICIPATION = {
    "uniform-half-size": dict(participation=0.5, aggregation="size"),
    "bernoulli-empty-round": dict(participation=0.3, participation_mode="bernoulli",
                                  seed=a_seed_with_an_empty_round(0.3, 6)),
}


@pytest.mark.parametrize("participation", PARTICIPATION)
@pytest.mark.parametrize("name, form", FORMS)
def test_server_rule_equals_a_numpy_loop_over_rounds(name, form, participation, device):
    rounds = 6
    options = dict(server_lr=0.05, server_beta1=0.8, server_tau=1e-2) if participation == "uniform-half-size" else {}
    if name != "fedadagrad" and options:
        options["server_beta2"] = 0.95
    config = tiny_config(algorithm=name, fedopt_form=form, rounds=rounds, device=device,
                         **PARTICIPATION[participation], **options)
    alg, *_ = build(config, make_data(), device)
    ref = Reference(name, alg.hp, alg.x.numel())
    trainer, skipped = alg.ctx.trainer, 0
    for t in range(rounds):
        x = alg.x.double().cpu().numpy()
        part = sample_participants(config.seed, t, M, alg.hp["participation"], alg.hp["participation_mode"])
        if part.any():
            Y = trainer.train(alg.X, t, alg.ctx.lr(t), alg.ctx.rule(t)).Y.double().cpu().numpy()  # (seed, i, t)
            delta = weights(part, alg.hp["aggregation"]) @ (Y - x)  # Δ_t = Σ_S p_i (y_i − x_t)
            expected = ref.step(x, delta, t)
        else:
            expected, skipped = x, skipped + 1  # nobody joined: no server step, the moments do not decay
        alg.round(t)
        np.testing.assert_allclose(alg.x.double().cpu().numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"t={t}")
        np.testing.assert_allclose(alg.m.double().cpu().numpy(), ref.m, rtol=1e-5, atol=1e-7, err_msg=f"m t={t}")
        np.testing.assert_allclose(alg.v.double().cpu().numpy(), ref.v, rtol=1e-5, atol=1e-9, err_msg=f"v t={t}")
    assert (skipped > 0) == (participation == "bernoulli-empty-round")
    if form == "torch":
        assert int(alg.server_steps) == rounds - skipped  # torch counts steps taken, not rounds


def test_defaults_are_the_papers():
    hp = {name: algorithm_class(name).card.defaults() for name in ("fedadam", "fedyogi", "fedadagrad", "fedprox")}
    paper = {"server_lr": 0.01, "server_beta1": 0.9, "server_beta2": 0.99, "server_tau": 1e-3, "fedopt_form": "paper"}
    for name in ("fedadam", "fedyogi"):
        assert {k: hp[name][k] for k in paper} == paper
    assert hp["fedadagrad"]["server_lr"] == 0.1 and hp["fedadagrad"]["server_beta1"] == 0.0
    assert "server_beta2" not in hp["fedadagrad"] and hp["fedprox"]["prox_mu"] == 0.01
    alg, *_ = build(tiny_config(algorithm="fedyogi"), make_data())
    assert torch.equal(alg.v, torch.full_like(alg.x, 1e-6)) and not alg.m.any()  # v_{−1} = τ², m_{−1} = 0


# ------------------------------------------------------------------------------------- resume and world size
RESUME = {
    "fedadam-torch-bernoulli": dict(algorithm="fedadam", fedopt_form="torch", participation=0.3,
                                    participation_mode="bernoulli", seed=a_seed_with_an_empty_round(0.3, 6)),
    "fedyogi-flower-half": dict(algorithm="fedyogi", fedopt_form="flower", participation=0.5),
    "fedprox-adam-keep": dict(algorithm="fedprox", participation=0.5, local_optimizer="adam", lr=0.01,
                              local_optimizer_state="keep"),
}


@pytest.mark.parametrize("case", RESUME)
def test_stop_and_resume_is_bit_identical(tmp_path, case):
    config = tiny_config(rounds=6, **RESUME[case])
    full = dfl.run(config, data=make_data(), out=tmp_path / "full")
    resumed = interrupted(config, 3, tmp_path / "part", make_data())
    assert resumed.summary["resumed_from_round"] == 3
    torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)

    def fields(history):  # JSON text, so that the NaN train loss of a round nobody joined compares equal
        return [json.dumps({k: v for k, v in h.items() if k not in TIMING}, sort_keys=True) for h in history]

    assert fields(resumed.history) == fields(full.history)


WORLD = {
    "fedadam-torch": dict(algorithm="fedadam", fedopt_form="torch", participation=0.5, aggregation="size"),
    "fedprox": dict(algorithm="fedprox", participation=0.5, prox_mu=0.1),
}


def _world_worker(rank, world, rdzv, out_dir):
    init_gloo(rank, world, rdzv)
    try:
        for case, changes in WORLD.items():
            result = dfl.run(tiny_config(dist_timeout=30.0, **changes), data=make_data())
            torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                       Path(out_dir) / f"{case}-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)  # hang guard only (spawned process group)
def test_world_of_two_equals_one_process(tmp_path):
    mp.start_processes(_world_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    for case, changes in WORLD.items():
        reference = dfl.run(tiny_config(**changes), data=make_data())
        for rank in range(2):
            got = torch.load(tmp_path / f"{case}-{rank}.pt")
            torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0, msg=case)
            assert [h["test_acc"] for h in got["history"]] == [h["test_acc"] for h in reference.history], case


# ------------------------------------------------------------------------------------- capabilities and refusals
@pytest.mark.parametrize("name", ["fedprox", "fedadam", "fedyogi", "fedadagrad"])
def test_capabilities_centralized_local_optimizers_dp_and_byzantine(name):
    from dfl import algorithms

    assert algorithms.is_centralized(name) and algorithms.card(name).dp and algorithms.card(name).byzantine
    for changes in (dict(local_optimizer="adamw", lr=0.01), dict(dp_clip=1.0, dp_noise=0.5),
                    dict(byzantine=1, attack="sign-flip", aggregator="median")):
        result = dfl.run(tiny_config(algorithm=name, rounds=2, **changes), data=make_data())
        assert np.isfinite(result.history[-1]["test_loss"]), changes
    private = dfl.run(tiny_config(algorithm=name, rounds=2, dp_clip=1.0, dp_noise=0.5), data=make_data())
    assert private.history[-1]["dp_epsilon"] > 0


@pytest.mark.parametrize("changes, match", [
    (dict(algorithm="fedprox", prox_mu=-0.1), "prox_mu must be >= 0"),
    (dict(algorithm="fedadam", server_beta1=1.0), r"server_beta1 must be in \[0, 1\)"),
    (dict(algorithm="fedyogi", server_beta2=-0.5), "server_beta2 must be >= 0"),
    (dict(algorithm="fedadagrad", server_tau=0.0), "server_tau must be > 0"),
    (dict(algorithm="fedadam", fedopt_form="keras"), "fedopt_form must be one of paper, flower, torch"),
    (dict(algorithm="fedyogi", fedopt_form="torch"), "fedopt_form = torch is torch.optim.Adam .* only to "
                                                     "algorithm = fedadam"),
    (dict(algorithm="fedadagrad", fedopt_form="torch"), "fedyogi and fedadagrad take fedopt_form = paper or flower"),
])
def test_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        validate(tiny_config(**changes))


def test_options_an_algorithm_does_not_read_are_refused():
    with pytest.raises(ConfigError, match="server_beta2 = 0.9 is not read by fedadagrad; remove it, or use an "
                                          "algorithm that reads it: fedadam, fedyogi"):
        validate(tiny_config(algorithm="fedadagrad", server_beta2=0.9, rounds=1))
    with pytest.raises(ConfigError, match="prox_mu = 0.1 is not read by fedavg.*; server_tau = 0.1 is not read"):
        validate(tiny_config(algorithm="fedavg", prox_mu=0.1, server_tau=0.1, rounds=1))


REFUSE = """
import sys
from dfl.cli import main
status = main({argv!r})
print(status, 'torch' in sys.modules)
"""


@pytest.mark.parametrize("argv", [
    ["run", "--algorithm", "fedyogi", "--fedopt-form", "torch"],
    ["run", "--algorithm", "fedprox", "--prox-mu", "-1"],
    ["run", "--algorithm", "fedadam", "--server-beta2", "1"],
])
def test_refusals_are_one_line_before_torch_loads(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-c", REFUSE.format(argv=argv)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and "error:" in proc.stderr


def test_dfl_list_algorithms_shows_them_with_their_options(capsys):
    assert main(["list", "algorithms"]) == 0
    out = capsys.readouterr().out
    for name, options in [("fedprox", ["prox_mu=0.01"]),
                          ("fedadam", ["server_tau=0.001", "fedopt_form='paper'", "server_beta2=0.99"]),
                          ("fedyogi", ["fedopt_form='paper'"]), ("fedadagrad", ["server_lr=0.1", "server_beta1=0.0"])]:
        block = re.split(r"\n  \S", out.split(f"\n  {name} ", 1)[1], maxsplit=1)[0]  # up to the next entry
        for option in options:  # one line per option: name=default (type, range): help
            assert re.search(rf"^\s*{re.escape(option)} \(", block, re.M), (name, option, block)

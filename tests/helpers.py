"""Builders and reference implementations shared by the test modules.

Data: `blob_data` (Gaussian inputs, random labels: the toy runs), `small_data` and `heterogeneous_data` (labels that
depend on the inputs, skewed per client: the algorithm identities), `local_data` (the local-trainer tests'
clients), `row_coded_data` (inputs that encode their row, so batches can be decoded). Configs: `tiny_config` (the
toy run that multi-process, resume and fault tests share), `base_config` (the algorithm identities),
`tracking_config` (gradient tracking and push-sum). References: `sequential_reference` (one torch.optim per
client), `logreg_gradients`/`sam_gradients` (numpy). Runs: `interrupted`, `assert_same_history`,
`assert_histories_close`, and the gloo worlds (`init_gloo`, `spawn`, `assert_world_size_invariant`,
`assert_world_of_two_gives_the_single_process_result`).

Every builder is deterministic for its seed: tests compare exact numbers, so a builder's draws (their order
included) must not change.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import dfl
from dfl.config import Config
from dfl.data import FederatedData
from dfl.errors import ConfigError
from dfl.models import build_model
from dfl.network.comm import even_blocks
from dfl.training.clients import ParamLayout
from dfl.training.local import LocalRule, LocalTrainer

ROOT = Path(__file__).resolve().parents[1]
# Forked workers inherit the imported torch (spawned ones re-import it: ~7 s for 4 workers on 2 cores). Every
# process group is created inside the workers, after the fork, as DataLoader workers do on Linux.
START_METHOD = "fork" if sys.platform == "linux" else "spawn"
TIMING = {"seconds_per_round"}  # the only field allowed to differ between a resumed and an uninterrupted run
# fields that differ between worlds of different sizes: wall time and the traffic between processes
VOLATILE = {"seconds_per_round", "bytes_moved", "bytes_moved_round"}


# ---------------------------------------------------------------------------------------------------- data
def blob_data(sizes, *, features: int = 5, classes: int = 3, shift: float = 0.0, test_size: int = 30,
              cyclic_test_labels: bool = False, seed: int = 0) -> FederatedData:
    """Client i holds sizes[i] rows x ~ N(shift * i / m, I) with uniform random labels (m = len(sizes)).

    Draws, in order from one generator: per client its x then its y; then the test x and (unless
    `cyclic_test_labels`, which gives labels 0, 1, 2, 0, ...) the test y.
    """
    g = torch.Generator().manual_seed(seed)
    train = []
    for i, n in enumerate(sizes):
        x = torch.randn(n, features, generator=g)
        if shift:
            x = x + shift * i / len(sizes)
        train.append((x, torch.randint(0, classes, (n,), generator=g)))
    test_x = torch.randn(test_size, features, generator=g)
    test_y = (torch.arange(test_size) % classes if cyclic_test_labels
              else torch.randint(0, classes, (test_size,), generator=g))
    return FederatedData.from_arrays(train=train, test=(test_x, test_y), num_classes=classes)


def small_data(m: int = 8, n: int = 12, seed: int = 0) -> FederatedData:
    """Clients with skewed labels: m clients of n rows.

    x ~ N(0.5 i / m, I) in 5 dimensions and y = 1[x_0 + 0.3 z > 0.25] + (i mod 2), z ~ N(0, 1), for client i.
    """
    g = torch.Generator().manual_seed(seed)
    train = []
    for i in range(m):
        x = torch.randn(n, 5, generator=g) + 0.5 * i / m
        y = (x[:, 0] + 0.3 * torch.randn(n, generator=g) > 0.25).long() + (i % 2)
        train.append((x, y))
    test = (torch.randn(20, 5, generator=g), torch.randint(0, 3, (20,), generator=g))
    return FederatedData.from_arrays(train=train, test=test, num_classes=3)


LOCAL_SIZES = (10, 7, 13, 5)  # uneven: epochs mode gives the clients different step counts


def local_data(seed: int = 0, sizes=LOCAL_SIZES) -> FederatedData:
    """The local-trainer tests' clients: 6 features, 3 random labels, 8 test rows."""
    return blob_data(sizes, features=6, test_size=8, seed=seed)


def small_mlp() -> nn.Module:
    """6 -> 5 (tanh) -> 3, initialised from torch's global seed 0."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def row_coded_data(sizes, augment=None, seed: int = 0) -> FederatedData:
    """Client i holds len sizes[i] rows of a shuffled pool; x[r] encodes r so batches can be decoded."""
    total = sum(sizes)
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    parts = list(torch.split(perm, list(sizes)))
    if augment:
        x = torch.randn(total, 3, 8, 8, generator=torch.Generator().manual_seed(seed + 1))
    else:
        x = torch.arange(total, dtype=torch.float32)[:, None]
    y = torch.arange(total) % 3
    return FederatedData(train_x=x, train_y=y, client_indices=parts, test_x=x[:2], test_y=y[:2], num_classes=3,
                         input_shape=tuple(x.shape[1:]), augment=augment)


# ------------------------------------------------------------------------------------------------- configs
TINY_RUN = dict(seed=1, rounds=4, eval_every=1, clients=6, model="mlp", model_options={"hidden": [6]},
                local_steps=2, batch_size=4, lr=0.1, progress=False, train_eval_samples=20, device="cpu",
                dist_timeout=60.0)


def tiny_config(**changes) -> Config:
    """A run of a few seconds: `TINY_RUN` (6 clients, a 6-unit MLP, 4 rounds on the CPU) with `changes`."""
    return Config(**{**TINY_RUN, **changes})


def base_config(**changes) -> Config:
    """The algorithm identities' run: 8 clients on a ring, a 6-unit MLP, 3 rounds, constant lr 0.1 (`small_data`)."""
    values = dict(
        clients=8, model="mlp", model_options={"hidden": [6]}, rounds=3, batch_size=4, local_steps=2,
        lr=0.1, lr_decay=1.0, eval_every=1, progress=False, topology="ring",
    )
    values.update(changes)
    return Config(**values)


def reference_trainer(config: Config, data: FederatedData) -> LocalTrainer:
    """The local trainer a run builds for `base_config`'s model, for hand-made reference rounds."""
    torch.manual_seed(config.seed)
    model = build_model("mlp", data.input_shape, 3, hidden=[6]).to(data.train_x.device)
    return LocalTrainer(model, ParamLayout.of(model), data, list(range(config.clients)), config)


# ------------------------------------------------------------------------------- the local-training reference
def torch_optimizer(params, lr, rule):
    """The torch.optim.SGD, Adam or AdamW that `rule` names, with its hyperparameters.

    `weight_decay` is passed explicitly: AdamW's own default is 0.01.
    """
    if rule.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=rule.momentum, weight_decay=rule.weight_decay)
    cls = torch.optim.Adam if rule.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=rule.adam_betas, eps=rule.adam_eps, weight_decay=rule.weight_decay)


def _sam_perturbation(net: nn.Module, rule: LocalRule) -> list[torch.Tensor]:
    """SAM's ε = ρ g/‖g‖ (ASAM: ρ T² g/‖T g‖, T = |w| + η on weights) from the gradients in `net`'s .grad."""
    params = list(net.parameters())
    if rule.sam == "asam":
        scales = [
            p.abs() if rule.asam_form == "dp-fedsam"  # the DP-FedSAM code: |w| everywhere
            else (p.abs() + rule.asam_eta) if "weight" in n else torch.ones_like(p)
            for n, p in net.named_parameters()
        ]
        norm = torch.norm(torch.stack([(s * p.grad).norm() for s, p in zip(scales, params)]))
        return [rule.rho * s * s * p.grad / (norm + 1e-12) for s, p in zip(scales, params)]
    norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
    return [rule.rho * p.grad / (norm + 1e-12) for p in params]


def sequential_reference(model, layout, data, schedule, X0, lr, rule, kept=None):
    """Local training as a plain loop, the reference the vectorized trainer must equal.

    Per client: an nn.Module, torch.optim.SGD/Adam/AdamW, SAM as in davda54/sam (perturb, restore, step). `kept`
    (client -> optimizer state_dict) carries each client's optimizer state across calls (rounds).
    """
    rows = []
    for i in range(X0.shape[0]):
        net = copy.deepcopy(model)
        layout.load_into(net, X0[i])
        opt = torch_optimizer(net.parameters(), lr, rule)
        if kept is not None and i in kept:
            opt.load_state_dict(kept[i])
            for group in opt.param_groups:
                group["lr"] = lr  # the state dict also restores the previous round's lr
        B = schedule.batch_size
        for k in range(int(schedule.steps_per_client[i])):
            idx = schedule.index[i, k * B : (k + 1) * B]
            keep = schedule.weight[i, k * B : (k + 1) * B] > 0
            x, y = data.train_x[idx[keep]], data.train_y[idx[keep]]
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            if rule.rho > 0:
                params = list(net.parameters())
                with torch.no_grad():
                    eps = _sam_perturbation(net, rule)
                    for p, e in zip(params, eps):
                        p.add_(e)
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                with torch.no_grad():
                    for p, e in zip(params, eps):
                        p.sub_(e)
            if rule.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), rule.clip_grad_norm)
            opt.step()
        if kept is not None:
            kept[i] = copy.deepcopy(opt.state_dict())
        rows.append(layout.flatten(net))
    return torch.stack(rows)


LOCAL_RULES = {
    "sgd": LocalRule(),
    "momentum": LocalRule(momentum=0.9),
    "sam": LocalRule(rho=0.05),
    "asam": LocalRule(rho=0.5, sam="asam", asam_eta=0.2),
    "asam-dp-fedsam": LocalRule(rho=0.5, sam="asam", asam_form="dp-fedsam"),
    "sam+momentum+wd+clip": LocalRule(rho=0.05, momentum=0.9, weight_decay=1e-3, clip_grad_norm=0.5),
    "adam": LocalRule(optimizer="adam"),
    "adam+wd+sam+clip": LocalRule(optimizer="adam", adam_betas=(0.8, 0.99), adam_eps=1e-6, weight_decay=1e-2,
                                  rho=0.05, clip_grad_norm=0.5),
    "adamw+wd": LocalRule(optimizer="adamw", weight_decay=0.05),
    "adamw+asam": LocalRule(optimizer="adamw", weight_decay=1e-2, rho=0.5, sam="asam"),
}


# --------------------------------------------------- gradient tracking and push-sum: logistic regression in numpy
M, N, D_IN, C = 6, 12, 5, 3  # heterogeneous_data: clients, samples per client, input size, classes


def heterogeneous_data(seed: int = 0) -> FederatedData:
    """M clients of N rows: inputs shifted by 0.8 i / M, labels 1[x_0 + 0.5 noise > 0.4] + (i mod 2)."""
    g = torch.Generator().manual_seed(seed)
    train = []
    for i in range(M):
        x = torch.randn(N, D_IN, generator=g) + 0.8 * i / M  # shifted inputs and skewed labels per client
        y = ((x[:, 0] + 0.5 * torch.randn(N, generator=g)) > 0.4).long() + (i % 2)
        train.append((x, y))
    test = (torch.randn(20, D_IN, generator=g), torch.randint(0, C, (20,), generator=g))
    return FederatedData.from_arrays(train=train, test=test, num_classes=C)


def tracking_config(algorithm: str, **changes) -> Config:
    """Full-batch logistic regression on a ring (`heterogeneous_data`), 3 rounds of 3 local steps, lr 0.2."""
    values = dict(algorithm=algorithm, clients=M, model="logreg", rounds=3, local_steps=3, batch_size=0, lr=0.2,
                  lr_decay=1.0, weight_decay=0.01, eval_every=3, progress=False, topology="ring",
                  train_eval_samples=0)
    values.update(changes)
    return Config(**values)


def logreg_gradients(X: np.ndarray, data: FederatedData) -> np.ndarray:
    """Full-batch gradient of each client's mean cross-entropy, for dfl's logreg layout [W (C x D) row-major, b]."""
    out = np.empty_like(X)
    for i in range(M):
        rows = data.client_indices[i]
        x, y = data.train_x[rows].double().numpy(), data.train_y[rows].numpy()
        Wm, b = X[i, : C * D_IN].reshape(C, D_IN), X[i, C * D_IN:]
        logits = x @ Wm.T + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        out[i] = np.concatenate([(p.T @ x).ravel(), p.sum(axis=0)])
    return out


def sam_gradients(X: np.ndarray, data: FederatedData, rho: float) -> np.ndarray:
    """∇f_i(x_i + ρ g_i/‖g_i‖) per client (SAM's ascent step with the client's own gradient)."""
    g = logreg_gradients(X, data)
    return logreg_gradients(X + rho * g / np.linalg.norm(g, axis=1, keepdims=True), data)


# ---------------------------------------------------------------------------------------------------- runs
def interrupted(config: Config, stop: int, out: Path, data) -> dfl.Result:
    """Run `stop` rounds into `out`, then resume it to config.rounds."""
    dfl.run(config.replace(rounds=stop), data=data, out=out)
    return dfl.run(config, data=data, out=out, resume=True)


def assert_same_history(got, want, label="", exact=True, skip=TIMING):
    """Same rounds and fields; every field but `skip` equal (exact) or within rel 1e-5 (client_acc: abs 1e-6)."""
    assert [h["round"] for h in got] == [h["round"] for h in want], label
    for g, w in zip(got, want):
        assert set(g) == set(w), label
        for key in w:
            if key in skip:
                continue
            if exact:
                assert g[key] == w[key], f"{label} round {w['round']} {key}: {g[key]} != {w[key]}"
            elif key == "client_acc":
                assert g[key] == pytest.approx(w[key], abs=1e-6), f"{label} round {w['round']} {key}"
            else:
                assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), f"{label} round {w['round']} {key}"


def assert_histories_close(history, reference, label):
    """Across world sizes: every field of `reference` but `VOLATILE` within rel 1e-4 (client_acc: abs 1e-6)."""
    assert len(history) == len(reference), label
    for got, want in zip(history, reference):
        for key, value in want.items():
            if key in VOLATILE:
                continue
            if key == "client_acc":
                np.testing.assert_allclose(got[key], value, atol=1e-6, err_msg=f"{label} {key}")
            else:
                assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), f"{label} round {want['round']} {key}"


# ------------------------------------------------------------------------------------- gloo process worlds
def init_gloo(rank: int, world: int, rdzv: str) -> None:
    """Join a gloo group of `world` processes through the rendezvous file `rdzv` (one torch thread each).

    dfl.engine.distributed is imported first, as a real run does before its group: it imports torch._dynamo, which
    imported while a group exists keeps gloo's threads alive at exit and the process aborts (its module docstring).
    """
    importlib.import_module("dfl.engine.distributed")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))


def spawn(fn, world: int, *args) -> None:
    """Start `world` processes of fn(rank, world, *args) and wait for them."""
    mp.start_processes(fn, args=(world, *args), nprocs=world, join=True, start_method=START_METHOD)


def _gossip_modes_worker(rank, world, rdzv, out_dir, config, data):
    init_gloo(rank, world, rdzv)
    try:
        for mode in ("p2p", "allgather"):
            result = dfl.run(config.replace(gossip_mode=mode), data=data)
            torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                       Path(out_dir) / f"{mode}-r{rank}.pt")
    finally:
        dist.destroy_process_group()


def assert_world_size_invariant(tmp_path, config: Config, data: FederatedData, world: int = 2) -> None:
    """A `world`-process gloo run of `config` (p2p and allgather gossip) equals the 1-process run."""
    reference = dfl.run(config, data=data)
    spawn(_gossip_modes_worker, world, str(tmp_path / "rdzv"), str(tmp_path), config, data)
    for mode in ("p2p", "allgather"):
        for rank in range(world):
            got = torch.load(tmp_path / f"{mode}-r{rank}.pt")
            torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0,
                                       msg=f"{mode} {rank}")
            history = got["history"] if rank == 0 else [
                {**h, "client_acc": r["client_acc"]} for h, r in zip(got["history"], reference.history)]
            assert_histories_close(history, reference.history, f"{mode} rank {rank}")


def _world_worker(rank, world, rdzv, out_dir, cases):
    init_gloo(rank, world, rdzv)
    try:
        for case, changes in cases.items():
            result = dfl.run(tracking_config(**changes, dist_timeout=30.0), data=heterogeneous_data())
            torch.save({"params": result.params, "ids": result.client_ids}, Path(out_dir) / f"{case}-r{rank}.pt")
    finally:
        dist.destroy_process_group()


def assert_world_of_two_gives_the_single_process_result(tmp_path, cases: dict[str, dict]) -> None:
    """Each case (`tracking_config` changes) run by two gloo processes equals the one-process run, row for row.

    The main process holds every client (assembled), the other its own block. The workers are spawned, not forked:
    the parent has run dfl, and a forked child can hang on the locks of its OpenMP threads.
    """
    mp.start_processes(_world_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path), cases), nprocs=2, join=True,
                       start_method="spawn")
    for case, changes in cases.items():
        reference = dfl.run(tracking_config(**changes), data=heterogeneous_data())
        assert reference.summary["processes"] == 1
        for rank in range(2):
            got = torch.load(tmp_path / f"{case}-r{rank}.pt")
            assert got["ids"] == (list(range(M)) if rank == 0 else list(even_blocks(M, 2)[rank]))
            torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0,
                                       msg=f"{case} rank {rank}")


def _configs_worker(rank, world, rdzv, out_dir, configs):
    init_gloo(rank, world, rdzv)
    try:
        for i, config in enumerate(configs.values()):
            try:
                result = dfl.run(config)
            except ConfigError as exc:  # refused at set-up, on every rank alike
                torch.save({"refused": str(exc)}, Path(out_dir) / f"{i}-r{rank}.pt")
                continue
            torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                       Path(out_dir) / f"{i}-r{rank}.pt")
    finally:
        dist.destroy_process_group()


def assert_worlds_of_two_equal_one(tmp_path, configs: dict[str, Config]) -> dict[str, str]:
    """Each config (by label) run by two gloo processes equals its one-process run: params and metrics.

    Within `assert_world_size_invariant`'s tolerances. The config loads its own dataset in each process. Returns the
    configs both processes refused at set-up (a ConfigError), with the message; put those last, as a refusal ends a
    run between its collectives. The workers are spawned, not forked: the parent has run dfl (see
    `assert_world_of_two_gives_the_single_process_result`).
    """
    mp.start_processes(_configs_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path), configs), nprocs=2,
                       join=True, start_method="spawn")
    refused = {}
    for i, (label, config) in enumerate(configs.items()):
        got = [torch.load(tmp_path / f"{i}-r{rank}.pt") for rank in range(2)]
        if "refused" in got[0] or "refused" in got[1]:
            assert got[0].get("refused") == got[1].get("refused"), label
            refused[label] = got[0]["refused"]
            continue
        reference = dfl.run(config)
        assert reference.summary["processes"] == 1, label
        for rank in range(2):
            torch.testing.assert_close(got[rank]["params"], reference.params[got[rank]["ids"]], atol=1e-5, rtol=0,
                                       msg=f"{label} rank {rank}")
            history = got[rank]["history"] if rank == 0 else [
                {**h, "client_acc": r["client_acc"]} for h, r in zip(got[rank]["history"], reference.history)]
            assert_histories_close(history, reference.history, f"{label} rank {rank}")
    return refused


# ------------------------------------------------------------------------------------------------ benchmarks
def benchmark_module(file: str, name: str):
    """A script of benchmarks/ imported as a module.

    It is registered in sys.modules: dataclasses look their module up there.
    """
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args: str) -> str:
    """Run benchmarks/`name` with `args` in a subprocess; assert it succeeds and return its stdout."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout

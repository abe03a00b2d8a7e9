"""`dfl.run(config)`: config → data/partition → client stack → (local steps → gossip) × rounds → metrics.

Convention (ALGORITHMS.md §0 ordering caveat): each round is "local training, then gossip", as in
the papers' pseudo-code; metrics after round t describe the models after that round's gossip.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import topologies
from dfl import checkpoint as ckpt
from dfl import memory
from dfl.algorithms import Context, algorithm_class, resolve_hyperparameters
from dfl.clients import ParamLayout, initial_stack
from dfl.config import Config, ConfigError
from dfl.distributed import communicator_from_env  # before any process group: see its torch._dynamo note
from dfl.evaluate import client_accuracies, consensus_distance, evaluate_row, nonfinite_rows
from dfl.gossip import Gossip
from dfl.local import LocalTrainer
from dfl.results import RunDirectory


class RunInterrupted(KeyboardInterrupt):
    """A signal asked the run to stop (`dfl run` raises it on SIGTERM and SIGHUP; Ctrl-C is KeyboardInterrupt)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def raise_on_signal(signum, frame) -> None:
    """A signal handler (SIGTERM, SIGHUP): stop the run as `RunInterrupted`, so it records status "interrupted"
    with its last completed round and keeps its metrics and last checkpoint."""
    raise RunInterrupted(signum)


class DivergenceError(RuntimeError):
    """The run diverged (NaN/inf, or the loss rule below); the message names the round and what happened."""


# A run whose mean local training loss stays above DIVERGENCE_LOSS_FACTOR × ln C (C classes; ln C is the loss
# of a uniform guess) at DIVERGENCE_PATIENCE evaluations in a row has diverged, NaN or not (a loss of 14,738
# with 10% accuracy was reported "completed" before). While the loss is above the bound no checkpoint is
# written, so the one on disk is the last good state.
DIVERGENCE_LOSS_FACTOR = 10.0
DIVERGENCE_PATIENCE = 3


@dataclass
class Result:
    config: Config
    history: list[dict[str, Any]]  # one dict per evaluated round
    params: torch.Tensor  # [m, d] final client parameters (CPU), rows by client id
    initial_params: torch.Tensor  # [m, d]
    param_names: list[str]  # flat layout: names in order (see `layout` for shapes and offsets)
    summary: dict[str, Any]
    layout: ParamLayout | None = None
    out_dir: Path | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available; use device = 'cpu' or 'auto'")
    return torch.device(name)


def build_topology(config: Config, n: int):
    """The topology a run mixes with: the complete graph for a centralized algorithm (the configured graph
    plays no part), else the configured topology on n clients."""
    if getattr(algorithm_class(config.algorithm), "centralized", False):
        return topologies.build("full", n)
    options = dict(config.topology_options)
    if config.topology in ("random-regular", "erdos-renyi", "random-k"):
        options.setdefault("seed", config.seed)
    try:
        return topologies.build(config.topology, n, weights=config.weights, **options)
    except ValueError as exc:
        raise ConfigError(f"topology: {exc}") from exc


def build_data(config: Config):
    from dfl.data import FederatedData

    partition_options = dict(config.partition_options)
    if config.partition in ("dirichlet", "dirichlet-class"):
        partition_options.setdefault("alpha", 0.3 if config.alpha is None else config.alpha)
    elif config.alpha is not None:
        raise ConfigError(f"alpha applies only to the dirichlet partitions, not to partition={config.partition!r}")
    return FederatedData.build(
        config.dataset,
        config.clients,
        config.partition,
        seed=config.seed,
        root=config.data_root,
        dataset_options=dict(config.dataset_options),
        partition_options=partition_options,
    )


def run(
    config: Config | None = None,
    data=None,
    out: str | Path | None = None,
    overwrite: bool = False,
    comm=None,
    resume: bool = False,
) -> Result:
    """Run one experiment. With `out`, write the run directory (see DESIGN.md) there.

    `resume=True` continues the run in `out` from its `checkpoint.pt` (`dfl.checkpoint`): the config must
    equal the checkpoint's except for `dfl.checkpoint.RESUMABLE_FIELDS` (e.g. more `rounds` extend a
    finished run); metrics.jsonl is rewritten from the checkpoint's history and rounds after the checkpoint
    are recomputed, so the result equals an uninterrupted run's. A finished run resumed with the same
    `rounds` trains nothing and returns its result again.

    Under torchrun (WORLD_SIZE > 1) every process calls this: it joins the process group, hosts its
    block of clients and leaves the group at the end or on error (`dfl.distributed`); a failure on one
    rank makes the others stop with a `PeerFailure` naming it. A given `comm` is used as is, not closed.
    """
    config = (config or Config()).validate()
    if resume and out is None:
        raise ValueError("resume=True needs out= (the run directory holding checkpoint.pt)")
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other: resume continues the run in out, overwrite "
                         "deletes it")
    own = comm is None
    if own:
        comm = communicator_from_env(config, config.clients)
    try:
        return _run(config, data, out, overwrite, comm, resume)
    except BaseException as exc:
        peer = getattr(comm, "peer_failure", lambda e: None)(exc)
        if peer is not None:
            raise peer from exc
        getattr(comm, "report_failure", lambda e: None)(exc)
        raise
    finally:
        if own:
            comm.close()


def _run(config: Config, data, out, overwrite: bool, comm, resume: bool) -> Result:
    from dfl.models import build_model

    saved = None
    if resume:  # before any work: a missing checkpoint or a changed config fails fast, on every rank alike
        saved = ckpt.load(out)
        ckpt.check_config(saved, config, out)
    hp, ignored = resolve_hyperparameters(config)
    device = getattr(comm, "device", None) or resolve_device(config.device)
    if device.type == "cpu":
        memory.keep_freed_memory()  # reuse freed heap instead of zero-filled fresh mappings every round
    tf32 = config.precision == "tf32"  # off otherwise: exact-averaging needs true fp32
    if tf32 and device.type != "cuda":
        raise ConfigError(f"precision = tf32 needs a CUDA device (the run is on {device}); use fp32 or bf16")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32

    if data is None:
        data = build_data(config)
    elif data.num_clients != config.clients:
        raise ConfigError(f"clients = {config.clients} but the given data has {data.num_clients} clients")
    m = data.num_clients
    if comm.num_clients != m:
        raise ConfigError(f"the communicator hosts {comm.num_clients} clients but the data has {m}")
    data = data.to(device)
    centralized = getattr(algorithm_class(config.algorithm), "centralized", False)
    if centralized and (config.topology not in ("ring", "full") or config.topology_options):  # ring: the default
        warnings.warn(f"{config.algorithm} is centralized (complete topology); ignoring topology", stacklevel=2)
        ignored = [*ignored, "topology"]
    topology = build_topology(config, m)

    torch.manual_seed(config.seed)
    model = build_model(config.model, tuple(data.input_shape), data.num_classes, **config.model_options)
    model = model.to(device)
    layout = ParamLayout.of(model)
    X0 = initial_stack(model, m, device)[comm.client_ids]

    trainer = LocalTrainer(model, layout, data, comm.client_ids, config)
    trainer.plan_chunk(X0)  # before any training: a run that cannot fit one client stops here, with the estimate
    gossip = Gossip(topology, comm, X0.dtype, device)
    ctx = Context(config=config, hp=hp, trainer=trainer, gossip=gossip, comm=comm)
    algorithm = algorithm_class(config.algorithm)(ctx, X0.clone())

    history: list[dict[str, Any]] = []
    bytes_total, start, wall_before = 0, 0, 0.0
    if saved is not None:
        ckpt.restore(saved, algorithm, comm, layout)
        start, history = saved["round"], list(saved["history"])
        if not comm.is_main:  # as in an uninterrupted run, per-client accuracies live on the main process
            history = [{k: v for k, v in h.items() if k != "client_acc"} for h in history]
        counters = saved["counters"]
        bytes_total, wall_before = counters["bytes_sent_total"], counters["wall_seconds"]
        comm.bytes_moved = counters["bytes_moved"]

    run_dir = None
    if out is not None and comm.is_main:
        run_dir = RunDirectory(out, overwrite=overwrite, resume=resume)
    model_bytes = layout.dim * X0.element_size()
    lam = _lambda(topology, 1)
    summary: dict[str, Any] = {
        "name": config.name,
        "algorithm": config.algorithm,
        "hyperparameters": hp,
        "ignored_options": ignored,
        "topology": topology.name,
        "weights": topology.weights,
        "lambda": lam,
        "spectral_gap": 1 - lam,
        "gossip_steps": hp.get("gossip_steps", 1),
        "lambda_Q": _lambda(topology, hp.get("gossip_steps", 1)),
        "clients": m,
        "processes": comm.world_size,
        "dataset": data.name,
        "model": config.model,
        "num_params": layout.dim,
        "device": str(device),
        "client_chunk": trainer.chunk,
        "malloc": "heap kept (dfl.memory.keep_freed_memory)" if memory.heap_kept() else "system",
        "memory_estimate": trainer.memory_estimate,
        "rounds": config.rounds,
        "rounds_completed": start,
        "status": "running",
        # while running: which process on which machine, so `dfl report` / `dfl sweep` can tell a run whose
        # process is gone (SIGKILL, a crash) from one still going
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "out_dir": str(run_dir.path) if run_dir else None,
    }
    if saved is not None:
        summary["resumed_from_round"] = start
    if run_dir:
        run_dir.write_config(config.to_toml())
        run_dir.write_json("partition.json", data.partition_info())
        if saved is not None:
            run_dir.write_metrics(history)  # drops records a killed run wrote after its last checkpoint
            run_dir.remove("params.pt")  # written again when the run finishes
        run_dir.write_json("summary.json", summary)

    eval_x, eval_y = data.test_x, data.test_y
    train_sub = _train_subset(data, config)
    # each client's accuracy: on `client_eval_samples` fixed test samples (0 = all), drawn once here
    client_test = (eval_x, eval_y) if not 0 < config.client_eval_samples < eval_x.shape[0] else _seeded_subset(
        eval_x, eval_y, config.client_eval_samples, config.seed)
    hessian_sub = _train_subset(data, config, config.hessian_samples) if config.hessian_every else None
    round_seconds: list[float] = []
    loss_bound = DIVERGENCE_LOSS_FACTOR * math.log(max(data.num_classes, 2))
    above_bound = 0  # consecutive evaluations with the training loss above loss_bound
    progress = _progress(config, comm, start)
    started = time.perf_counter()
    if saved is not None:
        ckpt.set_rng_state(saved["rng"])
    try:
        for t in range(start, config.rounds):
            tic = time.perf_counter()
            moved_before = comm.bytes_moved
            stats = algorithm.round(t)
            moved_round = comm.bytes_moved - moved_before  # this round's traffic between processes
            _check_finite(algorithm.X, stats.train_loss, t, comm)
            if device.type == "cuda":
                torch.cuda.synchronize()
            round_seconds.append(time.perf_counter() - tic)
            bytes_round = int(stats.models_sent.sum()) * model_bytes
            bytes_total += bytes_round
            summary["rounds_completed"] = t + 1
            measure_hessian = config.hessian_every > 0 and (
                (t + 1) % config.hessian_every == 0 or t + 1 == config.rounds
            )
            if (t + 1) % config.eval_every == 0 or t + 1 == config.rounds or measure_hessian:
                mean = comm.mean_rows(algorithm.X)
                record = _evaluate(model, layout, algorithm.X, mean, comm, eval_x, eval_y, train_sub, client_test,
                                   config, trainer.chunk)
                if measure_hessian:
                    record["hessian_top_eig"] = _hessian(model, layout, mean, hessian_sub, config)
                train_loss = _mean_train_loss(stats, comm)
                record = {
                    "round": t + 1,
                    **record,
                    "train_loss": train_loss,
                    "bytes_sent": bytes_round,
                    "bytes_sent_total": bytes_total,
                    "bytes_per_client": bytes_round / m,
                    "bytes_moved_round": moved_round,
                    "bytes_moved": comm.bytes_moved,
                    "lr": ctx.lr(t),
                    **({"rho": ctx.rho(t)} if "rho" in hp else {}),  # SAM algorithms: ρ_t (the client radius)
                    "seconds_per_round": float(np.mean(round_seconds)),
                }
                round_seconds = []
                history.append(record)
                if run_dir:
                    run_dir.append_metrics(record)
                if progress is not None:
                    progress.set_postfix(acc=f"{record['test_acc']:.3f}", refresh=False)
                above_bound = above_bound + 1 if train_loss > loss_bound else 0
                if above_bound >= DIVERGENCE_PATIENCE or (above_bound and t + 1 == config.rounds):
                    raise DivergenceError(
                        f"training diverged by round {t + 1}: the mean local training loss was above "
                        f"{loss_bound:.3g} ({DIVERGENCE_LOSS_FACTOR:g} × ln {data.num_classes}, the loss of a uniform "
                        f"guess) at the last {above_bound} evaluation(s) (latest {train_loss:.4g}); the last good "
                        "checkpoint, if any, is kept; try a smaller lr, a smaller rho, or clip_grad_norm"
                    )
            every = config.checkpoint_every or config.eval_every
            if out is not None and above_bound == 0 and ((t + 1) % every == 0 or t + 1 == config.rounds):
                counters = {"bytes_sent_total": bytes_total,
                            "wall_seconds": wall_before + time.perf_counter() - started}
                _checkpoint(run_dir, algorithm, comm, t, history, counters, config, layout)
            if progress is not None:
                progress.update(1)
        # params.pt before the summary says "completed": a kill in between leaves a run that is not marked done
        params = comm.gather_rows(algorithm.X).detach().cpu()
        if run_dir:
            run_dir.save("params.pt", {"params": params, "param_names": list(layout.names)})
        summary["status"] = "completed"
    except DivergenceError as exc:
        summary.update(status="diverged", error=str(exc))
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP turned into `RunInterrupted` by `dfl run`
        summary.update(status="interrupted", error=str(exc) or "KeyboardInterrupt")
        raise
    except BaseException as exc:
        summary.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if progress is not None:
            progress.close()
        summary["wall_seconds"] = wall_before + time.perf_counter() - started
        summary.update(_final_metrics(history))
        if run_dir:
            run_dir.write_json("summary.json", summary)

    initial = comm.gather_rows(X0).detach().cpu()
    return Result(
        config=config,
        history=history,
        params=params,
        initial_params=initial,
        param_names=list(layout.names),
        summary=summary,
        layout=layout,
        out_dir=run_dir.path if run_dir else None,
    )


def _lambda(topology, steps: int) -> float:
    """‖W^Q − J‖₂ (static) or the contraction of Q steps from step 0 (time-varying)."""
    return float(topology.gossip_lambda(steps))


def _train_subset(data, config: Config, samples: int | None = None):
    """A fixed (seeded) subset of the pooled training data: `train_eval_samples` or `samples` of them."""
    k = config.train_eval_samples if samples is None else samples
    return _seeded_subset(data.train_x, data.train_y, k, config.seed) if k else None


def _seeded_subset(x: torch.Tensor, y: torch.Tensor, k: int, seed: int):
    """The first min(k, n) samples of a permutation drawn from `seed`: the same subset on every process."""
    n = x.shape[0]
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: min(k, n)].to(x.device)
    return x[idx], y[idx]


def _evaluate(model, layout, X, mean, comm, x, y, train_sub, client_test, config, chunk: int) -> dict[str, Any]:
    """Metrics of the averaged model `mean` (= comm.mean_rows(X)) and of every client row of X."""
    test_acc, test_loss = evaluate_row(model, layout, mean, x, y, config.eval_batch_size)
    record: dict[str, Any] = {"test_acc": test_acc, "test_loss": test_loss}
    if train_sub is not None:
        record["train_acc"], record["train_eval_loss"] = evaluate_row(
            model, layout, mean, *train_sub, config.eval_batch_size
        )
    accs = comm.gather_rows(client_accuracies(model, layout, X, *client_test, config.eval_batch_size, chunk))
    accs = accs.double()
    record.update(
        client_acc_mean=float(accs.mean()),
        client_acc_std=float(accs.std(unbiased=False)),
        client_acc_min=float(accs.min()),
        client_acc_max=float(accs.max()),
        consensus_distance=consensus_distance(X, comm),
    )
    if comm.is_main:
        record["client_acc"] = [round(a, 6) for a in accs.tolist()]
    return record


def _hessian(model, layout, mean, sample, config: Config) -> float:
    """Top Hessian eigenvalue of the averaged model's training loss (`dfl.flatness`); every process computes
    it from the same mean and sample, so it is identical everywhere."""
    from dfl.flatness import hessian_top_eigenvalue

    return hessian_top_eigenvalue(model, layout, mean, *sample, iters=config.hessian_iters,
                                  batch_size=config.eval_batch_size, seed=config.seed)


def _mean_train_loss(stats, comm) -> float:
    """Mean local training loss over the clients that trained this round (NaN if none did)."""
    trained = torch.ones_like(stats.train_loss, dtype=torch.bool) if stats.trained is None else stats.trained
    local = torch.stack([(stats.train_loss * trained).sum(), trained.sum()]).double()
    total, count = comm.sum(local).tolist()
    return total / count if count else float("nan")


def _check_finite(X: torch.Tensor, train_loss: torch.Tensor, t: int, comm) -> None:
    bad = nonfinite_rows(X) | ~torch.isfinite(train_loss)
    bad_ids = [comm.client_ids[i] for i in bad.nonzero().flatten().tolist()]
    count = int(comm.sum(torch.tensor([float(len(bad_ids))], dtype=torch.float64, device=X.device)))
    if count:
        shown = ", ".join(map(str, bad_ids[:20])) + (" ..." if len(bad_ids) > 20 else "")
        where = f"clients {shown}" if bad_ids else "clients on another process"
        raise DivergenceError(
            f"training diverged in round {t + 1}: NaN/inf loss or parameters on {count} client(s) ({where}); "
            "try a smaller lr, a smaller rho, or clip_grad_norm"
        )


def _checkpoint(run_dir: RunDirectory | None, algorithm, comm, t: int, history, counters, config, layout) -> None:
    """The state after round t (`dfl.checkpoint`): a collective, every rank calls it (the per-client rows
    are gathered); rank 0 writes it atomically."""
    state = ckpt.gather(algorithm, comm, t + 1, history, counters, config, layout)
    if run_dir is not None:
        run_dir.save(ckpt.FILENAME, state)


def _final_metrics(history: list[dict[str, Any]]) -> dict[str, Any]:
    if not history:
        return {}
    last = {k: v for k, v in history[-1].items() if k != "client_acc"}
    accs = [h["test_acc"] for h in history if not math.isnan(h["test_acc"])]
    last["best_test_acc"] = max(accs) if accs else float("nan")
    last["final_round"] = last.pop("round")
    return last


def _progress(config: Config, comm, start: int = 0):
    if not (config.progress and comm.is_main):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.rounds, initial=start, desc=f"{config.algorithm}", unit="round", leave=False,
                disable=None)  # None: no bar when stderr is not a terminal (log files, sweep workers)

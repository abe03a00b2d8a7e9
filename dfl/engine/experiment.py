"""`Experiment`: one run between its phases, which `dfl.engine.runner` drives.

The set-up is `__init__`, a sequence of named steps (`dfl.engine.setup`: data, topology, network, model, client
block, trainer; then gossip, algorithm, resume, run directory); then per round `train_round`, `evaluate`, `record`,
`checkpoint`; at the end `save_params` and `result`.

Convention (docs/reference/update-rules.md#conventions): each round is "local training, then gossip", as in the papers'
pseudo-code; metrics after round t describe the models after that round's gossip.
"""

from __future__ import annotations

import math
import os
import socket
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfl.algorithms import Context, Hyperparameters
from dfl.config import Config
from dfl.data import data_shape
from dfl.data.dataset import with_clients
from dfl.engine import checkpoint as ckpt
from dfl.engine import combinations, setup
from dfl.engine.hooks import Hooks, Progress, announced
from dfl.engine.results import FinalParams, Result, RunDirectory
from dfl.engine.setup import (
    LocalTest,
    Pair,
    gossip_lambda,
    local_test_sets,
    local_train_sets,
    make_algorithm,
    seeded_subset,
    train_subset,
)
from dfl.engine.validation import resolved
from dfl.errors import DivergenceError
from dfl.loggers import RunInfo
from dfl.models import kernels
from dfl.network.byzantine import Threat
from dfl.training import memory, privacy_settings
from dfl.training.evaluate import (
    client_accuracies,
    consensus_distance,
    evaluate_row,
    honest_mean,
    local_accuracies,
    nonfinite_clients,
    suspect_rows,
)

# A run whose mean local training loss stays above DIVERGENCE_LOSS_FACTOR × ln C (C classes; ln C is the loss
# of a uniform guess) at DIVERGENCE_PATIENCE evaluations in a row has diverged, NaN or not (a loss of 14,738
# with 10% accuracy was reported "completed" before). While the loss is above the bound no checkpoint is
# written, so the one on disk is the last good state.
DIVERGENCE_LOSS_FACTOR = 10.0

DIVERGENCE_PATIENCE = 3
# Metrics that are finite in any run that has not diverged (train_loss may be NaN in a round nobody trained in)
FINITE_METRICS = ("test_loss", "train_eval_loss", "consensus_distance")

# Per-client accuracy on the whole test set above this many (client, sample) forward passes per evaluation gets a
# warning that points at client_eval_samples (an mlp on 2 CPU cores: 10,000 clients × 200 samples took 6.4 s, so
# 25,000 samples, MNIST-1D's test set at 125,000 samples, would take ~13 minutes per evaluation)
CLIENT_EVAL_WARN_PASSES = 20_000_000


class Experiment:
    """One run between its phases.

    `__init__` is the set-up, step by step (`dfl.engine.setup`: data, topology, network, model, client block,
    trainer; then gossip, algorithm, resume, run directory), then `train_round`, `evaluate`, `record`, `checkpoint`
    per round, and `save_params` + `result` at the end; `status()` marks summary.json with how the run ended.
    """

    def __init__(self, config: Config, data, out, overwrite: bool, comm, resume: bool, given_model=None,
                 callbacks=None):
        combinations.check(config, world=getattr(comm, "world_size", 1))  # the rules of a world (dfl.validate: 1)
        saved = setup.checkpoint_to_resume(config, out, resume)  # before any work, on every rank alike
        self.hooks = Hooks(config, callbacks, comm, out)  # loggers' packages and callbacks checked before any work
        hp = setup.hyperparameters(config)
        device = setup.device(config, comm)
        show = config.progress and comm.is_main  # set-up steps that take long say so (hooks.announced)
        setup.stacks_fit_before_data(config, comm, device, data, given_model)
        with announced(f"making the data ({_data_words(config)})", show and data is None):
            data = setup.data_on_device(config, data, comm, device)
        with announced(f"building the topology ({config.topology}, {data.num_clients:,} clients)", show):
            topology = setup.topology(config, data)
        network = setup.network(config, topology, data, hp)
        model, layout = setup.model(config, data, device, given_model)
        X0 = setup.client_block(model, layout, comm, device, network, config.algorithm)
        trainer = setup.trainer(model, layout, data, comm, config, network)
        gossip = network.gossip(comm, X0.dtype, device, start=X0)  # compressed gossip: x̂ starts at X_0
        self.ctx = Context(config=config, hp=hp, trainer=trainer, gossip=gossip, comm=comm)
        self.algorithm = make_algorithm(config, self.ctx, X0, topology)  # rounds in lock-step, or async clocks
        with announced("measuring the clients per vectorized call (client_chunk)", show):
            self.chunk = setup.client_chunk(trainer, self.algorithm, comm, layout, X0)  # clients per vectorized call
        self._plan_final_params(config, comm, out, layout.dim, X0.element_size(), device, trainer)
        self.config, self.comm, self.data, self.device, self.hp = config, comm, data, device, hp
        self.model, self.layout, self.X0, self.trainer, self.network = model, layout, X0, trainer, network
        self._prepare_threat()
        self._restore_progress(saved)
        self._open_run_directory(out, overwrite, resume)
        self.message_bytes = gossip.message_bytes(layout.dim, X0.element_size())  # a model, or compressed
        self._write_start(hp, topology, gossip, saved)
        self._prepare_evaluation()
        if saved is not None:  # last: the generators continue where the checkpointed run's were
            ckpt.set_rng_state(saved["rng"])

    @staticmethod
    def _plan_final_params(config: Config, comm, out, dim: int, itemsize: int, device: torch.device, trainer) -> None:
        """The end of run in the memory plan (`memory.final_params_plan`), refused now if rank 0 could not gather.

        Its bytes go into `memory_estimate` (summary.json).
        """
        how = final_params_plan(config, comm, out)
        plan = memory.final_params_plan(how, comm.num_clients, len(comm.client_ids), dim, itemsize, device,
                                        comm.is_main)
        if comm.is_main:
            memory.check_final_params(plan, comm.num_clients, dim)
        if trainer.memory_estimate is not None:
            trainer.memory_estimate.update(plan)

    def _prepare_threat(self) -> None:
        """The run's Byzantine clients, if any: every metric of the clients' models is then over the honest ones.

        `self.honest` is the [m] bool mask of the honest clients (None without Byzantine clients: every metric as
        before); `self.threat` (None without Byzantine clients or a robust aggregator) goes to summary.json.
        """
        self.threat = Threat.of(self.config, self.comm.num_clients)
        self.honest: torch.Tensor | None = None
        if self.threat is not None and self.threat.byzantine.any():  # one process (multi-process runs are refused)
            self.honest = torch.as_tensor(self.threat.honest, device=self.device)

    def _restore_progress(self, saved: dict[str, Any] | None) -> None:
        """The history and counters so far.

        Empty for a fresh run, the checkpoint's when resuming (the algorithm's state too: this process's rows
        only, onto the device).
        """
        self.history: list[dict[str, Any]] = []
        self.bytes_total, self.start, self.wall_before = 0, 0, 0.0
        if saved is None:
            return
        comm = self.comm
        ckpt.restore(saved, self.algorithm, comm, self.layout)
        self.start, self.history = saved["round"], list(saved["history"])
        if not comm.is_main:  # as in an uninterrupted run, per-client accuracies live on the main process
            self.history = [{k: v for k, v in h.items() if k != "client_acc"} for h in self.history]
        counters = saved["counters"]
        self.bytes_total, self.wall_before = counters["bytes_sent_total"], counters["wall_seconds"]
        comm.bytes_moved = counters["bytes_moved"]
        self.hooks.resume(self.history)

    def _open_run_directory(self, out, overwrite: bool, resume: bool) -> None:
        """The run directory (main process only): created, replaced (checkpoint shards too) or reopened."""
        self.out = out
        self.run_dir: RunDirectory | None = None
        if out is None or not self.comm.is_main:
            return
        self.run_dir = RunDirectory(out, overwrite=overwrite, resume=resume)
        if overwrite:
            ckpt.remove(out)  # the shards too, not only checkpoint.pt
        elif resume:
            ckpt.remove_stale_shards(out)  # left by a save killed before its manifest

    def _write_start(self, hp: Hyperparameters, topology, gossip, saved) -> None:
        """Write the initial summary and the run directory's first files.

        The initial summary, and the run directory's config.toml, partition.json and summary.json (on resume,
        metrics.jsonl rewritten from the checkpoint's history and the previous params.pt removed).
        """
        self.summary = self._initial_summary(hp, topology)
        if saved is not None:
            self.summary["resumed_from_round"] = self.start
        self.summary.update(self.hooks.summary_fields())
        self.summary.update(getattr(gossip, "describe", dict)())  # compressed gossip: compressor, ω, γ
        if self.threat is not None:  # Byzantine clients, attack, aggregator
            self.summary.update(self.threat.describe())
        if not self.run_dir:
            return
        self.run_dir.write_config(resolved(self.config).to_toml())  # every default the run resolved, written in
        self.run_dir.write_json("partition.json", self.data.partition_info())
        if saved is not None:
            self.run_dir.write_metrics(self.history)  # drops records a killed run wrote after its checkpoint
            ckpt.remove_final_params(self.run_dir.path)  # params.pt or params.shards/: written again at the end
        self.run_dir.write_json("summary.json", self.summary)

    def _prepare_evaluation(self) -> None:
        """Prepare the evaluation sets, the divergence rule and the round loop's counters.

        The fixed evaluation sets (test set, seeded train and per-client subsets, local test sets, the Hessian's
        sample), the divergence rule's bound and the round loop's counters.
        """
        config, data = self.config, self.data
        self.eval_x, self.eval_y = data.test_x, data.test_y
        self.train_sub = train_subset(data, config)
        # each client's accuracy: on `client_eval_samples` fixed test samples (0 = all), drawn once here
        self.client_test = (
            (self.eval_x, self.eval_y) if not 0 < config.client_eval_samples < self.eval_x.shape[0]
            else seeded_subset(self.eval_x, self.eval_y, config.client_eval_samples, config.seed)
        )
        passes = config.clients * self.eval_x.shape[0]
        if config.client_eval_samples == 0 and passes > CLIENT_EVAL_WARN_PASSES:
            warnings.warn(f"client_eval_samples = 0: every evaluation runs each of the {config.clients:,} clients on "
                          f"all {self.eval_x.shape[0]:,} test samples ({passes:,} forward passes); set "
                          f"client_eval_samples (the default: 2000) to use a fixed seeded subset per client",
                          stacklevel=4)
        # personalized evaluation (local_test_fraction): this process's clients' local test sets
        self.local_test = local_test_sets(data, self.comm.client_ids) if data.local_test_indices is not None else None
        # each client's own model on its own training data (personal_train_eval)
        self.local_train = local_train_sets(data, self.comm.client_ids) if config.personal_train_eval else None
        self.hessian_sub = train_subset(data, config, config.hessian_samples) if config.hessian_every else None
        self.round_seconds: list[float] = []
        self.loss_bound = DIVERGENCE_LOSS_FACTOR * math.log(max(data.num_classes, 2))
        self.above_bound = 0  # consecutive evaluations with the training loss above loss_bound
        self.progress = _progress(config, self.comm, self.start)
        self.started = time.perf_counter()
        self.params: torch.Tensor | None = None
        self.params_on_disk = False  # the final parameters are in params.shards/ only (`save_params`)
        self._last_round = (0, 0)  # (bytes sent, bytes moved between processes) of the latest round

    def _initial_summary(self, hp: Hyperparameters, topology) -> dict[str, Any]:
        config, comm, run_dir = self.config, self.comm, self.run_dir
        lam = gossip_lambda(topology, 1)
        return {
            "name": config.name,
            "algorithm": config.algorithm,
            "hyperparameters": hp.as_dict(),
            "topology": topology.name,
            "weights": topology.weights,
            "lambda": lam,
            "spectral_gap": 1 - lam,
            "gossip_steps": hp.get("gossip_steps", 1),
            "lambda_Q": gossip_lambda(topology, hp.get("gossip_steps", 1)),
            "clients": self.data.num_clients,
            "processes": comm.world_size,
            "dataset": self.data.name,
            "model": config.model,
            "num_params": self.layout.dim,
            "device": str(self.device),
            "client_chunk": self.trainer.chunk,
            "malloc": "heap kept (dfl.training.memory.keep_freed_memory)" if memory.heap_kept() else "system",
            "memory_estimate": self.trainer.memory_estimate,
            "rounds": config.rounds,
            **_privacy_summary(self.trainer.privacy),
            "rounds_completed": self.start,
            "status": "running",
            # while running: which process on which machine, so `dfl report` / `dfl sweep` can tell a run whose
            # process is gone (SIGKILL, a crash) from one still going
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "out_dir": str(run_dir.path) if run_dir else None,
        }

    # ------------------------------------------------------------------------------------------ round loop
    def train_round(self, t: int):
        """Round t of the algorithm (local steps, then gossip), checked for NaN/inf on every client."""
        tic = time.perf_counter()
        moved_before = self.comm.bytes_moved
        stats = self.algorithm.round(t)
        moved_round = self.comm.bytes_moved - moved_before  # this round's traffic between processes
        _check_finite(self.algorithm.X, stats.train_loss, t, self.comm, divergence_hint(self.config))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # this rank's GPU (cuda:N), not the current device's default cuda:0
        self.round_seconds.append(time.perf_counter() - tic)
        bytes_round = (int(stats.models_sent.sum()) * self.message_bytes if stats.bytes_sent is None
                       else int(stats.bytes_sent))  # an algorithm whose messages have their own sizes (DisPFL)
        self.bytes_total += bytes_round
        self._last_round = (bytes_round, moved_round)
        self.summary["rounds_completed"] = t + 1
        if self.progress is not None:
            self.progress.round_done()
        return stats

    def hessian_due(self, t: int) -> bool:
        """Whether round t's evaluation includes the Hessian's top eigenvalue (every `hessian_every`, and last)."""
        every = self.config.hessian_every
        return every > 0 and ((t + 1) % every == 0 or t + 1 == self.config.rounds)

    def evaluation_due(self, t: int) -> bool:
        """Whether round t is evaluated (every `eval_every` rounds, the last one, and with the Hessian)."""
        config = self.config
        return (t + 1) % config.eval_every == 0 or t + 1 == config.rounds or self.hessian_due(t)

    def evaluate(self, t: int, stats) -> dict[str, Any]:
        """The metrics record of round t (a collective: every process calls it)."""
        config, comm, X, honest = self.config, self.comm, self.algorithm.X, self.honest
        mean = comm.mean_rows(X) if honest is None else honest_mean(X, honest)  # x̄ of the honest clients
        metrics = _evaluate(self.model, self.layout, X, mean, comm, self.eval_x, self.eval_y, self.train_sub,
                            self.client_test, config, self.chunk, self.local_test, honest, self.local_train)
        if self.hessian_due(t) and self.hessian_sub is not None:  # the sample exists when hessian_every > 0
            metrics["hessian_top_eig"] = _hessian(self.model, self.layout, mean, self.hessian_sub, config)
        bytes_round, moved_round = self._last_round
        record = {
            "round": t + 1,
            **metrics,
            "train_loss": _mean_train_loss(stats, comm, honest),
            "bytes_sent": bytes_round,
            "bytes_sent_total": self.bytes_total,
            "bytes_per_client": bytes_round / self.data.num_clients,
            "bytes_moved_round": moved_round,
            "bytes_moved": comm.bytes_moved,
            "lr": self.ctx.lr(t),
            **({"rho": self.ctx.rho(t)} if "rho" in self.ctx.hp else {}),  # SAM algorithms: ρ_t (the client radius)
            "seconds_per_round": float(np.mean(self.round_seconds)),
            **self.network.metrics(t, len(self.round_seconds)),  # links_up, steps_done, sim_time, ... when on
            **self.algorithm.metrics(),  # the algorithm's own (async: sim_time, staleness, ...)
            **self._privacy_metrics(t),  # differential privacy: the worst client's ε so far
        }
        self.round_seconds = []
        return record

    def _privacy_metrics(self, t: int) -> dict[str, Any]:
        """ε at δ of the client that has released most after round t, and its release count; {} with DP off.

        A collective when on (the counts of every process). ε by `dfl.training.accountant`, imported here so that
        Opacus's accountant (~1 s of imports) loads only in a run with differential privacy.
        """
        privacy = self.trainer.privacy
        if privacy is None:
            return {}
        from dfl.training import accountant

        return accountant.report(privacy.settings, privacy.worst(self.comm, t + 1, self.device))

    def record(self, record: dict[str, Any]) -> None:
        """Where an evaluated round's metrics go.

        The history, metrics.jsonl, the progress bar; then the divergence rule (DIVERGENCE_LOSS_FACTOR) on its
        training loss.
        """
        self.history.append(record)
        if self.run_dir:
            self.run_dir.append_metrics(record)
        if self.progress is not None:
            self.progress.evaluated(record)
        self.hooks.round_end(record, self.device)  # loggers, target accuracy, callbacks; a stop agreed by all
        self.summary.update(self.hooks.summary_fields())
        train_loss, n = record["train_loss"], record["round"]
        _check_finite_metrics(record, divergence_hint(self.config))
        self.above_bound = self.above_bound + 1 if train_loss > self.loss_bound else 0
        if self.above_bound >= DIVERGENCE_PATIENCE or (self.above_bound and n == self.config.rounds):
            raise DivergenceError(
                f"training diverged by round {n}: the mean local training loss was above "
                f"{self.loss_bound:.3g} ({DIVERGENCE_LOSS_FACTOR:g} × ln {self.data.num_classes}, the loss of a "
                f"uniform guess) at the last {self.above_bound} evaluation(s) (latest {train_loss:.4g}); the last "
                f"good checkpoint, if any, is kept; {divergence_hint(self.config)}"
            )

    def checkpoint_due(self, t: int) -> bool:
        """Whether the state after round t is checkpointed.

        At every `checkpoint_every` rounds (default: every evaluation) and at the end, with a run directory, and
        never while the training loss is above the divergence bound (the one on disk stays the last good).
        """
        every = self.config.checkpoint_every or self.config.eval_every
        return self.out is not None and self.above_bound == 0 and (
            (t + 1) % every == 0 or t + 1 == self.config.rounds or self.hooks.stopped)

    def checkpoint(self, t: int) -> None:
        """The state after round t (`dfl.engine.checkpoint`).

        A collective, every rank calls it and writes the shards of its own rows; rank 0 then writes the manifest
        checkpoint.pt atomically.
        """
        counters = {"bytes_sent_total": self.bytes_total, "bytes_moved": self.comm.bytes_moved,
                    "wall_seconds": self.wall_before + time.perf_counter() - self.started}
        ckpt.save(self.algorithm, self.comm, t + 1, self.history, counters, self.config, self.layout, self.out)

    # ---------------------------------------------------------------------------------------------- finish
    def save_params(self) -> None:
        """The final parameters, then status "completed" (a collective: every process calls it).

        A kill in between leaves a run that is not marked done. In one process: X as params.pt. In a multi-process
        run (`final_params_plan`): by default every process writes its own rows to params.shards/ (DCP; no host
        holds the population) and the main process's `Result.params` reads them back when first used; with
        `gather_params` (or without a run directory, where the Result is the only output) the population is
        assembled on the main process's host, block by block (`comm.assemble_rows`), and written as params.pt. A
        barrier ends it: after it no rank waits for another (`comm.finish`), whatever the end of run takes.
        """
        comm, X = self.comm, self.algorithm.X.detach()
        tic = time.perf_counter()
        plan = final_params_plan(self.config, comm, self.out)
        self.params_on_disk = plan == "shards"
        if plan == "shards":
            ckpt.save_final_params(X, comm, self.out)
            # this process's rows for its Result; the main process's Result reads every row back (`result`)
            self.params = X[:0].cpu() if comm.is_main else X.cpu()
        else:
            if comm.is_main and comm.world_size > 1:
                # the round's freed stacks go back to the OS first: the host copy of every client's rows then takes
                # their place instead of growing the heap beyond them (CPU, kept heap; a no-op otherwise)
                memory.release_free_heap()
            self.params = comm.assemble_rows(X)
        comm.barrier()  # every rank's rows are out: from here on, nobody waits for anybody
        if self.run_dir and plan != "shards":
            self.run_dir.save(ckpt.PARAMS_FILE, {"params": self.params, "param_names": list(self.layout.names)})
        # how they were written and how long it took on the main process (the end of run: docs/how-to/gpu.md)
        self.summary["final_params"] = {"written": plan, "seconds": round(time.perf_counter() - tic, 3)}
        self.summary["status"] = "completed"

    @contextmanager
    def status(self):
        """Record how the run ended in summary.json, whatever happened.

        Marks the summary with how the run ended (completed by `save_params`, stopped when a callback or the
        target asked; diverged, interrupted or failed here, with the error) and writes summary.json with the
        final metrics, whatever happened. The hooks (`dfl.engine.hooks`) start here and finish last. While inside,
        PyTorch's TF32 and cuDNN settings are the run's (`precision`, `kernels`: `dfl.models.kernels`), and the
        caller's are put back after.
        """
        summary = self.summary
        kernel_settings = kernels.snapshot()  # TF32 and cuDNN as the caller had them: put back at the end
        try:
            kernels.apply(self.config.precision, self.config.kernels)
            self.hooks.start(RunInfo(self.config, dict(self.hp), self.run_dir.path if self.run_dir else None,
                                     self.start, list(self.history), dict(summary)))
            yield
            if self.hooks.stopped:
                summary.update(status="stopped", **self.hooks.summary_fields())
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
            kernels.restore(kernel_settings)
            if self.progress is not None:
                self.progress.close()
            summary["wall_seconds"] = self.wall_before + time.perf_counter() - self.started
            summary.update(_final_metrics(self.history))
            if self.run_dir:
                self.run_dir.write_json("summary.json", summary)
            self.hooks.finish(summary)

    def result(self) -> Result:
        """The run's `Result`.

        On the main process every client's rows, elsewhere this process's block (`client_ids` says which); the
        initial parameters as a view of the common x_0 (no [m, d] copy).
        """
        ids = list(range(self.comm.num_clients)) if self.comm.is_main else list(self.comm.client_ids)
        initial = self.X0[:1].detach().to("cpu").expand(len(ids), -1)
        assert self.params is not None, "the runner calls save_params before result"
        params: torch.Tensor | FinalParams = self.params
        if self.comm.is_main and self.params_on_disk:  # written as shards: read back when first used
            out = Path(self.out)
            params = FinalParams(out / ckpt.PARAMS_SHARDS, lambda: ckpt.read_final_params(out)["params"])
        return Result(
            config=self.config,
            history=self.history,
            params=params,  # type: ignore[arg-type]  # a FinalParams reads itself back on first use (Result.params)
            initial_params=initial,
            client_ids=ids,
            param_names=list(self.layout.names),
            summary=self.summary,
            layout=self.layout,
            out_dir=self.run_dir.path if self.run_dir else None,
        )


def final_params_plan(config: Config, comm, out) -> str:
    """How the final parameters leave the processes: "one file", "gathered" or "shards".

    "one file": a single process writes X as params.pt. "shards": each process of a multi-process run writes its own
    rows to params.shards/ (the default). "gathered": the main process assembles every row on its host and writes
    params.pt, when `gather_params` asks for it, or when there is no run directory (the main process's `Result`
    is then the only place the final parameters go).
    """
    if comm.world_size == 1:
        return "one file"
    return "gathered" if config.gather_params or out is None else "shards"


def _evaluate(model, layout, X, mean, comm, x, y, train_sub: Pair | None, client_test: Pair, config: Config, chunk: int,
              local_test: LocalTest | None = None, honest: torch.Tensor | None = None,
              local_train: LocalTest | None = None) -> dict[str, Any]:
    """Metrics of the averaged model `mean` (= comm.mean_rows(X)) and of every client row of X.

    With Byzantine clients (`honest`: the [m] bool mask of the honest ones, one process) every metric is over the
    honest clients only, as the Byzantine-robustness literature reports it: `mean` is their average, the per-client
    accuracies and the consensus distance theirs, and `honest_clients` says how many there are.

    With local test sets (`local_test_fraction`), personalized evaluation as the DisPFL / DFedSAM code bases report
    it: personal_acc = accuracy of client i's own model x_i on its own local test set, global_acc = accuracy of the
    averaged model x̄ on client i's local test set; each summarised by mean, std (population) and min over the
    clients, every client counting once whatever its test size (those code bases average the per-client
    accuracies, Σ_i correct_i / n_i / m, not Σ_i correct_i / Σ_i n_i). The models are those after the round's
    gossip, like every metric here (docs/reference/update-rules.md#conventions; DisPFL-derived code gossips first and
    evaluates right after
    local training). With `local_train` (`personal_train_eval`), personal_train_acc: client i's own model on its
    own training data, summarised the same way.
    """
    # the averaged model once in all: each process its share of the batches, the sums added (`evaluate_row`)
    test_acc, test_loss = evaluate_row(model, layout, mean, x, y, config.eval_batch_size, comm)
    record: dict[str, Any] = {"test_acc": test_acc, "test_loss": test_loss}
    if train_sub is not None:
        record["train_acc"], record["train_eval_loss"] = evaluate_row(
            model, layout, mean, *train_sub, config.eval_batch_size, comm
        )
    accs = comm.gather_rows(client_accuracies(model, layout, X, *client_test, config.eval_batch_size, chunk,
                                              min_per_client=config.batch_size))
    accs = accs.double() if honest is None else accs.double()[honest.to(accs.device)]
    if honest is not None:
        record["honest_clients"] = int(honest.sum())
    record.update(
        client_acc_mean=float(accs.mean()),
        client_acc_std=float(accs.std(unbiased=False)),
        client_acc_min=float(accs.min()),
        client_acc_max=float(accs.max()),
        consensus_distance=consensus_distance(X, comm, honest, mean),  # the x̄ computed once per evaluation
    )
    if local_test is not None:
        personal, global_ = local_accuracies(model, layout, X, mean, *local_test, config.eval_batch_size, chunk,
                                             min_per_client=config.batch_size)
        record.update(_over_clients("personal_acc", personal, comm, honest))
        record.update(_over_clients("global_acc", global_, comm, honest))
    if local_train is not None:
        personal_train, _ = local_accuracies(model, layout, X, mean, *local_train, config.eval_batch_size, chunk,
                                             min_per_client=config.batch_size, with_global=False)
        record.update(_over_clients("personal_train_acc", personal_train, comm, honest))
    if comm.is_main:
        record["client_acc"] = [round(a, 6) for a in accs.tolist()]
    return record


def _over_clients(name: str, values: torch.Tensor, comm, honest: torch.Tensor | None) -> dict[str, float]:
    """`name`_mean, _std (population) and _min of this process's per-client `values` over every (honest) client."""
    values = comm.gather_rows(values)
    values = values if honest is None else values[honest.to(values.device)]
    return {f"{name}_mean": float(values.mean()), f"{name}_std": float(values.std(unbiased=False)),
            f"{name}_min": float(values.min())}


def _hessian(model, layout, mean, sample: Pair, config: Config) -> float:
    """Top Hessian eigenvalue of the averaged model's training loss (`dfl.training.flatness`).

    Every process computes it from the same mean and sample, so it is identical everywhere.
    """
    from dfl.training.flatness import hessian_top_eigenvalue

    return hessian_top_eigenvalue(model, layout, mean, *sample, iters=config.hessian_iters,
                                  batch_size=config.eval_batch_size, seed=config.seed)


def _mean_train_loss(stats, comm, honest: torch.Tensor | None = None) -> float:
    """Mean local training loss over the (honest, with Byzantine clients) clients that trained (NaN if none did)."""
    trained = torch.ones_like(stats.train_loss, dtype=torch.bool) if stats.trained is None else stats.trained
    trained = trained if honest is None else trained & honest
    local = torch.stack([(stats.train_loss * trained).sum(), trained.sum()]).double()
    total, count = comm.sum(local).tolist()
    return total / count if count else float("nan")


def divergence_hint(config: Config) -> str:
    """What to try after a divergence: the step sizes, and under differential privacy the noise first."""
    hint = "try a smaller lr, a smaller rho, or clip_grad_norm"
    settings = privacy_settings.PrivacySettings.of(config)
    if settings is not None:
        std = settings.std
        hint = (f"with differential privacy the noise's std per coordinate is dp_clip x dp_noise = {std:g}, likely "
                f"too large for this model: lower dp_noise or dp_clip (or use a smaller model); else {hint}")
    return hint


def _check_finite(X: torch.Tensor, train_loss: torch.Tensor, t: int, comm, hint: str) -> None:
    """DivergenceError when any client of any process has a NaN/inf loss or parameter.

    One read back per round in the common case: the count, over every process, of the suspect rows (a non-finite row
    sum or loss); only when there are any are they checked element by element (`nonfinite_clients`) and named.
    """
    suspect = suspect_rows(X) | ~torch.isfinite(train_loss)
    if not int(comm.sum(suspect.sum(dtype=torch.float64).reshape(1)).item()):
        return
    bad = nonfinite_clients(X, train_loss)
    bad_ids = [comm.client_ids[i] for i in bad.nonzero().flatten().tolist()]
    count = int(comm.sum(torch.tensor([float(len(bad_ids))], dtype=torch.float64, device=X.device)))
    if count:
        shown = ", ".join(map(str, bad_ids[:20])) + (" ..." if len(bad_ids) > 20 else "")
        where = f"clients {shown}" if bad_ids else "clients on another process"
        raise DivergenceError(
            f"training diverged in round {t + 1}: NaN/inf loss or parameters on {count} client(s) ({where}); "
            f"{hint}"
        )


def _check_finite_metrics(record: dict[str, Any], hint: str) -> None:
    """DivergenceError when a metric that stays finite in a sound run is NaN/inf.

    A metric of the averaged model or of the clients' spread that is NaN/inf means the run diverged, even when every
    parameter is finite (lr = 1e30: parameters near 1e30 whose squared distances overflow).
    """
    bad = [key for key in FINITE_METRICS if isinstance(record.get(key), float) and not math.isfinite(record[key])]
    if bad:
        values = ", ".join(f"{key} = {record[key]}" for key in bad)
        raise DivergenceError(f"training diverged by round {record['round']}: {values} (not finite); the last good "
                              f"checkpoint, if any, is kept; {hint}")


def _privacy_summary(privacy) -> dict[str, Any]:
    """summary.json's description of the differential privacy of the run ({} when off)."""
    if privacy is None:
        return {}
    settings = privacy.settings
    return {"dp": {"clip": settings.clip, "noise": settings.noise, "delta": settings.delta,
                   "noise_std": settings.std, "sensitivity": privacy_settings.SENSITIVITY * settings.clip,
                   "neighbouring": privacy_settings.NEIGHBOURING, "accountant": "RDP (Opacus), no subsampling"}}


def _final_metrics(history: list[dict[str, Any]]) -> dict[str, Any]:
    if not history:
        return {}
    last = {k: v for k, v in history[-1].items() if k != "client_acc"}
    accs = [h["test_acc"] for h in history if not math.isnan(h["test_acc"])]
    last["best_test_acc"] = max(accs) if accs else float("nan")
    last["final_round"] = last.pop("round")
    # each record's seconds_per_round is the mean over the rounds since the previous one: weigh them by those
    # rounds for the mean of the whole run (the last record's alone is `seconds_per_round`, over `..._rounds`)
    rounds = [h["round"] - before for h, before in zip(history, [0] + [h["round"] for h in history[:-1]])]
    timed = [(r, h["seconds_per_round"]) for r, h in zip(rounds, history) if "seconds_per_round" in h]
    if timed and sum(r for r, _ in timed):
        last["seconds_per_round_mean"] = sum(r * s for r, s in timed) / sum(r for r, _ in timed)
        last["seconds_per_round_rounds"] = rounds[-1]
    return last


def _data_words(config: Config) -> str:
    """What the data step makes, as its progress line says it: "mnist1d, 4,000 samples for 16 clients"."""
    try:
        shape = data_shape(config.dataset, with_clients(config.dataset, dict(config.dataset_options), config.clients))
    except Exception:  # noqa: BLE001 (validated already; a registered loader's card may not know its size)
        shape = None
    size = f", {shape.train + shape.test:,} samples" if shape is not None else ""
    return f"{config.dataset}{size} for {config.clients:,} clients"


def _progress(config: Config, comm, start: int = 0):
    """The progress bar (a terminal) or plain lines (stdout a file) of the main process (`hooks.Progress`)."""
    return Progress(config.algorithm, config.rounds, start) if config.progress and comm.is_main else None

"""`dfl.run(config)`: config → data/partition → client stack → (local steps → gossip) × rounds → metrics.

The round loop is `_run`, below: everything a round does is behind `Experiment` (`dfl.engine.experiment`), and
what differs between a single process, a torchrun world and the asynchronous mode is behind two interfaces it
already holds: the communicator (`dfl.network.comm.LocalCommunicator` or `dfl.engine.distributed`'s, chosen by
`communicator_from_env`) and the algorithm (`dfl.engine.setup.make_algorithm`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dfl import threads
from dfl.algorithms.base import EngineCommunicator, missing_members
from dfl.config import Config
from dfl.directories import NewDirectory
from dfl.engine.distributed import communicator_from_env  # before any process group: see its torch._dynamo note
from dfl.engine.experiment import Experiment
from dfl.engine.results import Result
from dfl.engine.validation import validate
from dfl.errors import ArgumentError, ConfigError, RunInterrupted
from dfl.training import memory

if TYPE_CHECKING:  # annotations only
    from torch import nn

    from dfl.data import FederatedData
    from dfl.engine.hooks import Callback


def raise_on_signal(signum, frame) -> None:
    """A signal handler (SIGTERM, SIGHUP).

    Stop the run as `RunInterrupted`, so it records status "interrupted" with its last completed round and keeps its
    metrics and last checkpoint.
    """
    raise RunInterrupted(signum)


def run(  # over 50 lines by its docstring alone: dfl.run's documentation of every argument
    config: Config | None = None,
    data: FederatedData | None = None,
    out: str | Path | NewDirectory | None = None,
    overwrite: bool = False,
    comm: EngineCommunicator | None = None,
    resume: bool = False,
    model: nn.Module | Callable[..., nn.Module] | None = None,
    callbacks: Sequence[Callback] | None = None,
) -> Result:
    """Run one experiment: set-up, the round loop, the run directory.

    Under torchrun (WORLD_SIZE > 1) every process calls this: it joins the process group, hosts its block of
    clients and leaves the group at the end or on error (`dfl.engine.distributed`); a failure on one rank makes the
    others stop with a `PeerFailure` naming it.

    Args:
        config: the run's options (default `Config()`).
        data: the clients' data (`FederatedData`); None builds it from the config. Given, the config's dataset,
            partition and their options are not used, and what depends on the data is checked on it
            (`dfl.validate(config, data)`): e.g. more clients than the config's dataset has samples.
        out: the run directory to write (docs/architecture.md#the-run-directory); None writes nothing; a
            `dfl.directories.NewDirectory(stem)` (what `dfl run` without --out passes) makes a fresh
            runs/<stem>-<YYYYmmdd-HHMMSS> when the run starts (rank 0 makes it, and tells the other ranks its name)
            and removes it again if the run fails before writing there; its `path` says where.
        overwrite: replace an existing run directory.
        comm: a communicator to use as is (not closed): a `dfl.algorithms.base.EngineCommunicator`, e.g. a
            `dfl.engine.distributed.DistributedCommunicator` on a process group the caller made; None picks one
            from the environment.
        resume: continue the run in `out` from its checkpoint.pt (`dfl.engine.checkpoint`). The config must equal
            the checkpoint's except for `dfl.engine.checkpoint.RESUMABLE_FIELDS` (e.g. more `rounds` extend a
            finished run); metrics.jsonl is rewritten from the checkpoint's history and rounds after the checkpoint
            are recomputed, so the result equals an uninterrupted run's. A finished run resumed with the same
            `rounds` trains nothing and returns its result again.
        model: replaces `config.model`: an `nn.Module` (a copy is trained; its parameters are every client's start)
            or a factory f(input_shape, num_classes, **model_options) -> nn.Module (called after
            torch.manual_seed(config.seed), like the built-ins). The config records it (`dfl.models.spec_of`).
        callbacks: objects with `on_round_end(round, metrics)` (`dfl.engine.hooks`), called after every evaluated
            round on the main process; True stops the run after that round (checkpointed; status "stopped").

    Returns:
        The run's `Result` (every client's parameters on the main process, this process's block elsewhere).
    """
    _check_communicator(comm)
    callers_threads = threads.torch_threads()  # given back when the run returns: global state left as found
    try:
        return _run_in(config, data, out, overwrite, comm, resume, model, callbacks)
    finally:
        threads.restore(callers_threads)


def _run_in(config: Config | None, data, out, overwrite: bool, comm, resume: bool, model, callbacks) -> Result:
    """`run` between the caller's thread count and its restoring: the config, the communicator, the run."""
    config = _run_config(config, data, out, overwrite, resume, model)
    owned: EngineCommunicator | None = None
    if comm is None:
        comm = owned = communicator_from_env(config, config.clients)
    new = out if isinstance(out, NewDirectory) else None
    try:
        if new is not None:
            out = _make_new_directory(new, comm)
        return _run(config, data, out, overwrite, comm, resume, model, callbacks)
    except BaseException as exc:
        if new is not None and comm.is_main:
            new.remove_if_unused()
        peer = comm.peer_failure(exc)
        if peer is not None:
            raise peer from exc
        comm.report_failure(exc)
        raise
    finally:
        if owned is not None:  # a communicator given by the caller stays open
            owned.close()
        memory.release_free_heap()  # the run's freed stacks go back to the OS, not held until the process exits


NAME_BYTES = 4096  # the longest directory path (UTF-8) rank 0 tells the others


def _make_new_directory(new: NewDirectory, comm: EngineCommunicator) -> Path:
    """Rank 0 makes the new run directory; every rank returns its path.

    The others learn the name through one sum over the processes of its UTF-8 bytes (they add zeros): the
    communicator's own collective, so a rank that fails here is reported like a failure in a round. The bytes are
    set-up, not the run's traffic: `bytes_moved` is left as it was.
    """
    path = new.make("run") if comm.is_main else None
    if comm.world_size == 1:
        assert path is not None
        return path
    encoded = str(path).encode() if path is not None else b""
    if len(encoded) > NAME_BYTES:
        raise ConfigError(f"the new run directory's path is over {NAME_BYTES} bytes: {str(path)[:80]}...; give a "
                          "shorter --out")
    codes = torch.zeros(NAME_BYTES, dtype=torch.int32, device=comm.device or "cpu")
    if encoded:
        codes[:len(encoded)] = torch.tensor(list(encoded), dtype=torch.int32)
    moved = comm.bytes_moved
    codes = comm.sum(codes).cpu()
    comm.bytes_moved = moved
    text = bytes(int(c) for c in codes[codes > 0]).decode()
    new.path = Path(text)
    return new.path


def _check_communicator(comm) -> None:
    """A communicator given to `run` has every member of `EngineCommunicator` (an `ArgumentError` names the rest)."""
    missing = missing_members(comm) if comm is not None else []
    if missing:
        raise ArgumentError(f"comm must be a dfl.algorithms.base.EngineCommunicator (as dfl.network.comm."
                            f"LocalCommunicator is); {type(comm).__name__} lacks {', '.join(missing)}")


def _run_config(config: Config | None, data, out, overwrite: bool, resume: bool, model) -> Config:
    """The validated config of a run, with the arguments checked and a given model recorded.

    A given model is recorded as "module:factory" when that imports back to the factory, else as
    "module.Name (instance)"/"(factory)", which runs and resumes only with the object passed again; this process's torch
    threads are set as a side effect ("auto" or N: `dfl.threads`).
    """
    config = Config() if config is None else config
    _check_arguments(config, data, out, overwrite, resume)
    if model is not None:
        from dfl.models import spec_of

        config = config.replace(model=spec_of(model))
    config = validate(config, data)  # own data: what depends on the data is checked on it, not on config.dataset
    threads.apply(config.threads)
    return config


def _check_arguments(config: Config, data, out, overwrite, resume) -> None:
    """The arguments of `run` that are not the config.

    An `ArgumentError` (a ConfigError and a TypeError) naming the argument for a wrong type, a ConfigError for a
    wrong combination.
    """
    from dfl.data import FederatedData

    if not isinstance(config, Config):
        raise ArgumentError(f"config must be a dfl.Config (dfl.Config(...), Config.from_toml(path) or "
                            f"Config.from_dict(table)), got {type(config).__name__}")
    if data is not None and not isinstance(data, FederatedData):
        raise ArgumentError(f"data must be a dfl.data.FederatedData (FederatedData.build(...) or "
                            f"FederatedData.from_arrays(...)) or None, got {type(data).__name__}")
    if out is not None and not isinstance(out, (str, os.PathLike, NewDirectory)):
        raise ArgumentError(f"out must be a directory path (str or pathlib.Path), a dfl.directories.NewDirectory or "
                            f"None, got {type(out).__name__}")
    for name, value in (("overwrite", overwrite), ("resume", resume)):
        if not isinstance(value, bool):
            raise ArgumentError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    if resume and (out is None or isinstance(out, NewDirectory)):
        raise ConfigError("resume=True needs out= (the run directory holding checkpoint.pt)")
    if resume and overwrite:
        raise ConfigError("resume and overwrite exclude each other: resume continues the run in out, overwrite "
                          "deletes it")


def _run(config: Config, data, out, overwrite: bool, comm: EngineCommunicator, resume: bool, given_model=None,
         callbacks=None) -> Result:
    """The phases of a run, in order.

    Set-up, the round loop (train, evaluate when due, checkpoint when due), finish. `Experiment.record` is where
    every evaluated round's metrics go out (metrics.jsonl, progress, loggers, callbacks); a stop they ask for ends
    the loop after that round's checkpoint. `comm.check_peers()` stands before what leaves the process: under NCCL
    a group aborted for another rank's failure leaves garbage in the collectives that were in flight, and the host
    syncs after them return normally (`dfl.engine.distributed.failures`). `comm.finish()` follows the last
    collective (the barrier that ends `save_params`): from there on no rank watches this one, so the end of the run
    (summary.json, loggers) cannot be taken for a dead rank however long it takes.
    """
    exp = Experiment(config, data, out, overwrite, comm, resume, given_model, callbacks)
    with exp.status():
        for t in range(exp.start, config.rounds):
            if exp.hooks.stopped:
                break
            stats = exp.train_round(t)
            if exp.evaluation_due(t):
                metrics = exp.evaluate(t, stats)
                comm.check_peers()
                exp.record(metrics)
            if exp.checkpoint_due(t):
                comm.check_peers()
                exp.checkpoint(t)
        exp.save_params()  # ends with a barrier: the run's last collective
        comm.check_peers()
        comm.finish()  # nobody waits for this rank any more: its end of run (summary, loggers) takes what it takes
    return exp.result()

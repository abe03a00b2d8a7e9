"""Checkpoints: the complete state of a run after round t, and putting it back (resume).

A checkpoint is two parts, so that no process ever holds more client rows than its own block:

- `checkpoint.pt`, the manifest (rank 0 writes it atomically, a small `torch.save` dict): `round` t, the metrics
  `history`, the loop counters (bytes sent so far, bytes moved between processes, wall seconds), the global RNG
  states (torch, CUDA, numpy, python; rank 0's, restored on every rank), the config, the parameter names, the
  algorithm's replicated server state (identical on every process; rank 0's copy), the number of clients, the
  shape and dtype of every per-client entry (`rows`) and where the rows are (`shards`);
- `checkpoint.shards/round-<t>/`, the per-client rows in the format of torch.distributed.checkpoint (DCP): the
  client stack X (`params`), the algorithm's per-client state (`client_state.<name>`, `Algorithm.client_state`),
  and the gossip's per-client state when it has one (`gossip_state.<name>`: compressed gossip's public copies x̂,
  `dfl.network.choco`). Every rank writes only its block of rows, as chunks of at most ROW_CHUNK_BYTES at their
  row offset in the global [m, ...] tensor (`_RowSavePlanner`), into its own file; DCP's metadata records the
  chunks. A resume with any number of processes has each rank read only the rows of its own block: DCP's
  resharding reads the stored chunks that overlap it (`_RowLoadPlanner`), one chunk at a time.

Why DCP with row-offset planners, not DTensor: DTensor's Shard(0) lays rows out as `torch.chunk` does (the last
ranks get fewer, possibly none), while dfl's blocks are `even_blocks` (the first m mod P ranks one more), so the
engine's blocks are described to DCP directly as chunks at their offsets: DCP's own metadata, resharding and file
format, no ShardedTensor (deprecated) and no copy into another layout. Saving is synchronous: on the CPU an
asynchronous save would first copy the block (memory the run does not have to spare), and the manifest may only
be written once every shard is complete.

Order of a save (a collective: every process calls `save`): rank 0 removes a leftover directory of this round
(a killed earlier attempt), a barrier, every rank writes its shards (DCP's last step gathers every rank's write
results on rank 0, so when it returns there, all shards are on disk), rank 0 writes the manifest atomically, then
removes the shard directories the new manifest does not name. A kill at any point leaves the previous manifest and
its shards, or the new ones: the run resumes from one complete checkpoint.

The engine draws every random number from generators seeded by (seed, client, round) or (seed, round)
(`dfl.data.sampler`, `dfl.algorithms.server`), so with X and the state restored, rounds t+1, … of a resumed run
are those of an uninterrupted run; the global RNG states are restored too, for code that uses them.

Resuming checks that the config equals the checkpoint's except for the fields in `RESUMABLE_FIELDS`. The number
of processes may differ from the interrupted run's.

Checkpoints written before this format (format 1: one `checkpoint.pt` holding every row) still resume: the file
is memory-mapped, and each process copies only its own rows out of it.

The final parameters of a multi-process run go the same way (`save_final_params`): every rank writes its rows of X
into `params.shards/` (DCP's metadata and one file per rank, the row-offset planner above), so that no host ever
holds the whole population; `read_final_params` reads them back (all rows, or a range), as it reads the `params.pt`
of a single process or of a run with `gather_params = true`.
"""

from __future__ import annotations

import math
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfl.algorithms import resolve_hyperparameters
from dfl.algorithms.base import EngineCommunicator
from dfl.config import Config
from dfl.engine.results import torch_load_reason
from dfl.engine.validation import resolved
from dfl.errors import CheckpointError, ConfigError, NoCheckpoint, PeerFailure
from dfl.training import memory

FORMAT = 2
LEGACY_FORMAT = 1  # one file with every row (before sharded checkpoints): read, never written
FILENAME = "checkpoint.pt"
SHARDS = "checkpoint.shards"  # the directory of the per-round DCP shard directories
# Rows of one stored chunk: a resume with another number of processes reads whole stored chunks, so this bounds
# what a rank reads beyond its own rows (and the copy DCP's writer makes of each chunk; the memory planner's number)
ROW_CHUNK_BYTES = memory.ROW_CHUNK_BYTES
# Fields that may differ on resume. The first do not touch the trajectory (`rounds` may grow, to extend a
# run, except under lr_schedule = cosine, which anneals over `rounds`; the hooks' fields only watch it, or say
# where it ends, as `rounds` does); the execution fields give the same run up to float rounding, as a
# different number of processes does.
EXACT_FIELDS = ("rounds", "progress", "checkpoint_every", "dist_timeout", "data_root", "loggers", "target_accuracy",
                "stop_at_target", "gather_params")
EXECUTION_FIELDS = ("device", "backend", "gossip_mode", "client_chunk", "compile", "eval_batch_size", "threads")
RESUMABLE_FIELDS = EXACT_FIELDS + EXECUTION_FIELDS

# The keys every manifest of FORMAT holds (and of LEGACY_FORMAT); a file without one of them cannot be resumed.
REQUIRED_KEYS = ("round", "clients", "rows", "shards", "server_state", "history", "counters", "rng", "config",
                 "param_names")
LEGACY_REQUIRED_KEYS = ("round", "params", "client_state", "server_state", "history", "counters", "rng", "config",
                        "param_names")
from dfl.errors import RESTART_HINT  # noqa: E402,F401

PARAMS = "params"
PARAMS_FILE = "params.pt"  # the final parameters in one file: a single process, or gather_params = true
PARAMS_SHARDS = "params.shards"  # ... every rank's own rows (DCP): a multi-process run
CLIENT_PREFIX, GOSSIP_PREFIX = "client_state.", "gossip_state."
RELEASES = "privacy.releases"  # differential privacy: each client's release count (`dfl.training.privacy`)


@dataclass(frozen=True)
class RowSource:
    """Per-client rows that are written as they are produced, never held whole (`Algorithm.row_sources`).

    `shape` [m_local, ...] and `dtype` of the entry; `rows(a, b)` makes rows a..b-1 (on any device). The DCP writer
    asks for one chunk of at most ROW_CHUNK_BYTES at a time, so a checkpoint of the asynchronous mode's messages,
    [m_local, S, d], costs one chunk of memory, not the stack.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    rows: Callable[[int, int], torch.Tensor]

    def element_size(self) -> int:
        """Bytes of one element."""
        return torch.empty((), dtype=self.dtype).element_size()


# ------------------------------------------------------------------------------------------------------ save
def save(algorithm, comm, round_done: int, history, counters: dict[str, Any], config: Config, layout,
         run_dir: str | Path) -> dict[str, Any] | None:
    """Write the checkpoint after `round_done` rounds into `run_dir` (module docstring).

    A collective, every process calls it with the same `run_dir` (a directory every process can write: one
    filesystem, or a shared one across nodes). Returns the manifest on the main process, None elsewhere.
    """
    state = algorithm.state()
    rows = local_rows(algorithm, state)
    shards = f"{SHARDS}/round-{round_done:06d}"
    run_dir = Path(run_dir)
    if comm.is_main:
        shutil.rmtree(run_dir / shards, ignore_errors=True)  # a killed earlier attempt at this round
    comm.barrier()
    block = _block(comm)
    _dcp_save(rows, run_dir / shards, block.start, comm.num_clients, comm)
    if not comm.is_main:
        return None
    server = {k: _cpu(v) for k, v in state.items() if k not in algorithm.client_state}
    manifest = {
        "format": FORMAT,
        "round": round_done,
        "clients": comm.num_clients,
        "processes": comm.world_size,  # informational: a resume may use another number
        "rows": {k: {"shape": list(v.shape[1:]), "dtype": str(v.dtype).removeprefix("torch.")}
                 for k, v in rows.items()},
        "shards": shards,
        "server_state": server,
        "history": history,
        "counters": {**counters, "bytes_moved": comm.bytes_moved},
        "rng": rng_state(),
        "config": config.to_dict(),
        "param_names": list(layout.names),
    }
    from dfl.engine.results import atomic_torch_save

    atomic_torch_save(run_dir / FILENAME, manifest)
    remove_stale_shards(run_dir, keep=shards)
    return manifest


def local_rows(algorithm, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor | RowSource]:
    """This process's per-client rows, by checkpoint key.

    X, the algorithm's `client_state`, the gossip's state (`state`: the algorithm's `state()`, when the caller has
    it already). An entry the algorithm makes as it is written (`row_sources()`: the asynchronous messages) is a
    `RowSource`.
    """
    state = algorithm.state() if state is None else state
    sources: dict[str, RowSource] = getattr(algorithm, "row_sources", dict)()
    unknown = sorted(set(algorithm.client_state) - set(state) - set(sources))
    if unknown:
        raise RuntimeError(f"{algorithm.name}.client_state names {unknown}, which state() does not return")
    rows: dict[str, torch.Tensor | RowSource] = {PARAMS: algorithm.X.detach()}
    rows.update({CLIENT_PREFIX + k: state[k].detach() if k in state else sources[k] for k in algorithm.client_state})
    gossip = _gossip_state(algorithm)
    if gossip is not None:
        rows.update({GOSSIP_PREFIX + k: v.detach() for k, v in gossip.items()})
    privacy = algorithm.ctx.trainer.privacy
    if privacy is not None:  # the index of each client's next noise draw, and what its ε composes
        rows[RELEASES] = privacy.state().to(algorithm.X.device)
    return rows


def remove_stale_shards(run_dir: str | Path, keep: str | None = None) -> None:
    """Delete the shard directories of `run_dir` other than `keep`.

    `keep` None keeps the one the manifest names, and none when there is no readable manifest. What goes is what a
    save killed before its manifest, or an older checkpoint, left behind.
    """
    root = Path(run_dir) / SHARDS
    if not root.is_dir():
        return
    if keep is None:
        keep = _named_shards(Path(run_dir))
    for entry in root.iterdir():
        if f"{SHARDS}/{entry.name}" != keep:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def remove(run_dir: str | Path) -> None:
    """Delete the checkpoint of `run_dir` (manifest and shards): `--overwrite` starts the run afresh."""
    run_dir = Path(run_dir)
    shutil.rmtree(run_dir / SHARDS, ignore_errors=True)
    (run_dir / FILENAME).unlink(missing_ok=True)


def _named_shards(run_dir: Path) -> str | None:
    try:
        return torch.load(run_dir / FILENAME, map_location="cpu", weights_only=True, mmap=True).get("shards")
    except Exception:  # no manifest, a legacy file, or an unreadable one: it names no shards
        return None


# ------------------------------------------------------------------------------------------------------ load
def load(run_dir: str | Path) -> dict[str, Any]:
    """Read the manifest `run_dir/checkpoint.pt`.

    Every process reads it, so a multi-node resume needs the run directory on a shared filesystem. A checkpoint of
    the legacy format is memory-mapped, not read: its rows are copied out by `restore`, each process its own.
    """
    path = Path(run_dir) / FILENAME
    if not path.is_file():
        where = "does not exist" if not Path(run_dir).exists() else f"has no {FILENAME}"
        raise NoCheckpoint(
            f"cannot resume: run directory {run_dir} {where} (a run writes {FILENAME} every checkpoint_every "
            "rounds; start the run again, with --overwrite instead of --resume)"
        )
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # truncated zip, random bytes, a pickle with forbidden globals, ...
        raise CheckpointError(path, f"truncated or corrupt: {torch_load_reason(exc)}") from exc
    if not isinstance(checkpoint, dict):
        raise CheckpointError(path, f"not a dfl checkpoint: it holds a {type(checkpoint).__name__}, not a dict")
    version = checkpoint.get("format")
    if version not in (FORMAT, LEGACY_FORMAT):
        raise CheckpointError(path, f"not a dfl checkpoint of format {FORMAT} (or {LEGACY_FORMAT}): format "
                                    f"{version!r}")
    missing = [k for k in (REQUIRED_KEYS if version == FORMAT else LEGACY_REQUIRED_KEYS) if k not in checkpoint]
    if missing:
        raise CheckpointError(path, f"incomplete: it lacks {', '.join(missing)}")
    if version == LEGACY_FORMAT:
        params = checkpoint["params"]
        if not torch.is_tensor(params) or params.dim() != 2:
            raise CheckpointError(path, "corrupt: round, params or config has the wrong type")
        checkpoint["clients"] = int(params.shape[0])
    if not isinstance(checkpoint["round"], int) or not isinstance(checkpoint["config"], dict) \
            or not isinstance(checkpoint["clients"], int):
        raise CheckpointError(path, "corrupt: round, params or config has the wrong type")
    if version == FORMAT and (not isinstance(checkpoint["rows"], dict) or PARAMS not in checkpoint["rows"]):
        raise CheckpointError(path, "corrupt: its rows do not list the parameters")
    checkpoint["path"] = path
    return checkpoint


def check_config(checkpoint: dict[str, Any], config: Config, run_dir) -> None:
    """Refuse a resume whose config differs from the checkpoint's beyond what may change.

    The config must equal the checkpoint's except for RESUMABLE_FIELDS, and `rounds` may not shrink (nor change at
    all with lr_schedule = cosine, whose learning rates depend on `rounds`).
    """
    stored = checkpoint["config"]
    differ = changed_fields(stored, config)
    unknown = sorted(set(stored) - {f.name for f in fields(Config)})
    if differ or unknown:
        shown = ", ".join(
            f"{n} (checkpoint {stored.get(n)!r}, now {getattr(config, n)!r})" for n in differ
        ) + "".join(f", {n} (unknown field in the checkpoint)" for n in unknown)
        raise ConfigError(
            f"cannot resume {run_dir}: the config differs from the checkpoint's in {shown.lstrip(', ')}; "
            f"only {', '.join(RESUMABLE_FIELDS)} may change on resume"
        )
    done = checkpoint["round"]
    if config.rounds < done:
        raise ConfigError(
            f"cannot resume {run_dir}: rounds = {config.rounds} but the checkpoint is after round {done}; "
            f"rounds must be >= {done} (a run can be extended, not shortened)"
        )
    started = stored.get("rounds", config.rounds)
    if config.lr_schedule == "cosine" and config.rounds != started:
        raise ConfigError(
            f"cannot resume {run_dir} with rounds = {config.rounds}: lr_schedule = cosine anneals over the "
            f"run's rounds = {started}, so changing rounds would change the learning rate of every later round; "
            f"resume with rounds = {started}, or start a new run"
        )
    hp = resolve_hyperparameters(config) if config.rounds != started else {}
    if hp.get("anneal_factor", 0) > 0 and hp.get("anneal_rounds", 0) == 0:  # DisPFL's mask updates
        raise ConfigError(
            f"cannot resume {run_dir} with rounds = {config.rounds}: {config.algorithm}'s anneal_factor anneals the "
            f"masks' updates over the run's rounds = {started}, so changing rounds would change every later round; "
            f"resume with rounds = {started}, or set algorithm_options.anneal_rounds in a new run"
        )


def changed_fields(stored: dict[str, Any], config: Config) -> list[str]:
    """The Config fields outside RESUMABLE_FIELDS in which `config` differs from the `stored` one.

    A field missing from `stored` (a checkpoint's config values) counts as its default. Both are compared with the
    defaults their run resolves written in (`dfl.engine.validation.resolved`): a run directory's config.toml records
    momentum = 0.9 where the config left DFedSAM's momentum unset, the same run.
    """
    defaults = Config()
    values = {f.name: stored.get(f.name, getattr(defaults, f.name)) for f in fields(Config)}
    try:
        before = resolved(Config(**values)).to_dict()
    except (ConfigError, TypeError):  # a stored value of another type: compared as it is
        before = values
    now = resolved(config)
    return [
        f.name
        for f in fields(Config)
        if f.name not in RESUMABLE_FIELDS and _plain(before[f.name]) != _plain(getattr(now, f.name))
    ]


def restore(checkpoint: dict[str, Any], algorithm, comm, layout) -> None:
    """Put X and the algorithm state back.

    This process's rows of every per-client entry, read from the shards (each process reads only the stored chunks
    overlapping its block), straight onto the run's device. A collective (every process calls it).
    """
    names = checkpoint["param_names"]
    if list(names) != list(layout.names):
        raise ValueError("the checkpoint's parameter layout does not match the model built from the config")
    if checkpoint["clients"] != comm.num_clients:
        raise ValueError(f"the checkpoint holds {checkpoint['clients']} clients, the run has {comm.num_clients}")
    device = algorithm.X.device
    rows = _read_local_rows(checkpoint, comm, device)
    if rows[PARAMS].shape[1:] != (layout.dim,):
        raise ValueError("the checkpoint's parameter layout does not match the model built from the config")
    algorithm.X = rows[PARAMS].to(dtype=algorithm.X.dtype)
    client = {k.removeprefix(CLIENT_PREFIX): v for k, v in rows.items() if k.startswith(CLIENT_PREFIX)}
    missing = sorted(set(algorithm.client_state) - set(client))
    if missing:
        raise ValueError(f"the checkpoint lacks the per-client state {missing} of {algorithm.name}")
    algorithm.load_state({**checkpoint["server_state"], **{k: client[k] for k in algorithm.client_state}})
    if _gossip_state(algorithm) is not None:  # compressed gossip: its public copies, this process's rows
        algorithm.ctx.gossip.load_client_state(
            {k.removeprefix(GOSSIP_PREFIX): v for k, v in rows.items() if k.startswith(GOSSIP_PREFIX)})
    privacy = algorithm.ctx.trainer.privacy
    if privacy is not None:
        if RELEASES not in rows:
            raise ValueError("the checkpoint lacks the clients' differential-privacy release counts")
        privacy.load_state(rows[RELEASES])


def _read_local_rows(checkpoint: dict[str, Any], comm, device: torch.device) -> dict[str, torch.Tensor]:
    """{key: this process's rows [m_local, ...] on `device`} of every per-client entry of the checkpoint."""
    block = _block(comm)
    if checkpoint["format"] == LEGACY_FORMAT:  # memory-mapped: only this block's pages are read
        legacy = {PARAMS: checkpoint["params"],
                  **{CLIENT_PREFIX + k: v for k, v in checkpoint["client_state"].items()},
                  **{GOSSIP_PREFIX + k: v for k, v in checkpoint.get("gossip_state", {}).items()}}
        return {k: v[block.start:block.stop].to(device) for k, v in legacy.items()}
    return read_rows(checkpoint, block.start, block.stop, device, comm)


def read_rows(checkpoint: dict[str, Any], start: int = 0, stop: int | None = None,
              device: torch.device | str = "cpu", comm=None, keys=None) -> dict[str, torch.Tensor]:
    """Some rows of some per-client entries of a checkpoint read by `load`.

    Rows start..stop-1 (default: every client) of the per-client entries `keys` (default all: "params",
    "client_state.<name>", "gossip_state.<name>") of a checkpoint read by `load`, on `device`. Without `comm` (or in
    a world of one) it reads in this process alone; with a multi-process `comm` it is a collective (every process
    calls it with its own rows). Tools that inspect a checkpoint: `read_rows(load(run_dir))`.
    """
    path = checkpoint["path"]
    m = checkpoint["clients"]
    stop = m if stop is None else stop
    if checkpoint["format"] == LEGACY_FORMAT:
        legacy = {PARAMS: checkpoint["params"],
                  **{CLIENT_PREFIX + k: v for k, v in checkpoint["client_state"].items()},
                  **{GOSSIP_PREFIX + k: v for k, v in checkpoint.get("gossip_state", {}).items()}}
        return {k: v[start:stop].to(device) for k, v in legacy.items() if keys is None or k in keys}
    directory = path.parent / checkpoint["shards"]
    specs = {k: v for k, v in checkpoint["rows"].items() if keys is None or k in keys}
    try:
        dtypes = {k: getattr(torch, spec["dtype"]) for k, spec in specs.items()}
    except (AttributeError, TypeError, KeyError) as exc:
        raise CheckpointError(path, f"corrupt: its rows have an unknown dtype ({torch_load_reason(exc)})") from exc
    rows = {k: torch.empty((stop - start, *specs[k]["shape"]), dtype=dtypes[k], device=device) for k in specs}
    _dcp_load(rows, directory, start, m, comm)
    return rows


def read(run_dir: str | Path) -> dict[str, Any]:
    """The whole checkpoint of `run_dir` in one dict, assembled on the host (tools and tests, never the engine).

    The manifest's entries, with `params` [m, d], `client_state` {name: [m, ...]} and, when the gossip keeps state,
    `gossip_state` {name: [m, ...]}, as a checkpoint of the legacy format holds them.
    """
    checkpoint = load(run_dir)
    if checkpoint["format"] == LEGACY_FORMAT:
        return checkpoint
    rows = read_rows(checkpoint)
    out = {k: v for k, v in checkpoint.items() if k not in ("rows", "path")}
    out[PARAMS] = rows[PARAMS]
    out["client_state"] = {k.removeprefix(CLIENT_PREFIX): v for k, v in rows.items() if k.startswith(CLIENT_PREFIX)}
    gossip = {k.removeprefix(GOSSIP_PREFIX): v for k, v in rows.items() if k.startswith(GOSSIP_PREFIX)}
    if gossip:
        out["gossip_state"] = gossip
    return out


# --------------------------------------------------------------------------------------------- final parameters
def save_final_params(X: torch.Tensor, comm, run_dir: str | Path) -> Path:
    """Every rank writes its rows of the final parameters X into `run_dir/params.shards/` (a collective).

    The rows go out as chunks of at most ROW_CHUNK_BYTES (what DCP's writer copies to the host at a time); rank 0
    removes an earlier directory first and writes DCP's metadata last, once every rank's file is complete, so a
    directory without its metadata is an interrupted write. Returns the directory.
    """
    directory = Path(run_dir) / PARAMS_SHARDS
    if comm.is_main:
        shutil.rmtree(directory, ignore_errors=True)  # an interrupted earlier attempt, or the run before a resume
    comm.barrier()
    _dcp_save({PARAMS: X.detach()}, directory, _block(comm).start, comm.num_clients, comm)
    return directory


def read_final_params(run_dir: str | Path, start: int = 0, stop: int | None = None) -> dict[str, Any]:
    """The final parameters of the run in `run_dir`, rows start..stop-1 (default: every client), on the host.

    From `params.pt` (a single process, or `gather_params = true`) or else from `params.shards/` (each rank's rows;
    only the stored chunks overlapping the rows asked for are read). Returns {"params": [rows, d], "param_names":
    list or None, "source": the file or directory read}. `FileReadError`/`CheckpointError` naming the file when it
    is missing, truncated or not dfl's.
    """
    from dfl.engine.results import read_torch_file

    run_dir = Path(run_dir)
    if (run_dir / PARAMS_FILE).exists() or not (run_dir / PARAMS_SHARDS).exists():
        saved = read_torch_file(run_dir / PARAMS_FILE, "parameter file")
        params = saved.get("params") if isinstance(saved, dict) else None
        if not isinstance(params, torch.Tensor) or params.dim() != 2:
            raise CheckpointError(run_dir / PARAMS_FILE, "holds no [clients, dim] parameter tensor under 'params'")
        return {"params": params[start:stop], "param_names": saved.get("param_names"), "source": PARAMS_FILE}
    directory = run_dir / PARAMS_SHARDS
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = dcp.FileSystemReader(directory).read_metadata()
    except Exception as exc:  # no metadata: the write was interrupted (or it is not dfl's)
        raise CheckpointError(directory / ".metadata", f"missing or corrupt (the final parameters were not written "
                                                       f"completely): {torch_load_reason(exc)}") from exc
    stored = metadata.state_dict_metadata.get(PARAMS)
    size = getattr(stored, "size", None)
    if not isinstance(stored, TensorStorageMetadata) or size is None or len(size) != 2:
        raise CheckpointError(directory / ".metadata", f"holds no [clients, dim] {PARAMS!r} tensor")
    m, d = int(size[0]), int(size[1])
    first, last, _ = slice(start, stop).indices(m)
    rows = {PARAMS: torch.empty((max(last - first, 0), d), dtype=stored.properties.dtype)}
    _dcp_load(rows, directory, first, m, None)
    return {"params": rows[PARAMS], "param_names": None, "source": PARAMS_SHARDS}


def remove_final_params(run_dir: str | Path) -> None:
    """Delete the final parameters of `run_dir` (params.pt and params.shards/): a resumed run writes them again."""
    run_dir = Path(run_dir)
    (run_dir / PARAMS_FILE).unlink(missing_ok=True)
    directory = run_dir / PARAMS_SHARDS
    if directory.is_dir() and not directory.is_symlink():
        shutil.rmtree(directory, ignore_errors=True)


def _block(comm) -> range:
    ids = comm.client_ids
    return range(ids[0], ids[-1] + 1) if ids else range(0, 0)


# --------------------------------------------------------------------------------- DCP with row-offset chunks
def _dcp_save(rows: dict[str, torch.Tensor | RowSource], directory: Path, start: int, m: int,
              comm: EngineCommunicator) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "torch.distributed is disabled ... assuming ... a single process": meant
        warnings.simplefilter("ignore", UserWarning)
        _unwrapped(lambda: dcp.save(rows, storage_writer=dcp.FileSystemWriter(directory, single_file_per_rank=True),
                                    planner=_row_save_planner(start, m), no_dist=comm.world_size == 1), comm, "writing")


def _unwrapped(call, comm, doing: str):
    """Run call(), turning DCP's CheckpointException back into the failing rank's own error.

    call(), with DCP's CheckpointException (which wraps what each rank raised, KeyboardInterrupt included) turned
    back into this rank's own exception, or, when only other ranks failed, a PeerFailure naming the first of them.
    """
    import torch.distributed.checkpoint as dcp

    try:
        return call()
    except dcp.CheckpointException as exc:
        rank = comm.rank if comm is not None and comm.world_size > 1 else 0
        own = exc.failures.get(rank)
        if own is not None:
            raise own[0] from None
        other = min(exc.failures)
        cause = exc.failures[other][0]
        lines = str(cause).strip().splitlines()
        raise PeerFailure(f"rank {rank} stopped because rank {other} failed {doing} the checkpoint: "
                          f"{type(cause).__name__}: {lines[0] if lines else ''}") from None


def _dcp_load(rows: dict[str, torch.Tensor], directory: Path, start: int, m: int,
              comm: EngineCommunicator | None) -> None:
    """Fill `rows` (this process's rows start.., each [n, ...]) from the shard directory, checking its metadata first.

    A missing or corrupt shard is a CheckpointError naming the file.
    """
    import torch.distributed.checkpoint as dcp

    world = comm.world_size if comm is not None else 1
    reader = dcp.FileSystemReader(directory)
    try:
        metadata = reader.read_metadata()
    except Exception as exc:
        raise CheckpointError(directory / ".metadata", f"truncated or corrupt: {torch_load_reason(exc)}") from exc
    for key, tensor in rows.items():
        stored = metadata.state_dict_metadata.get(key)
        size = getattr(stored, "size", None)
        if size is None or tuple(size) != (m, *tensor.shape[1:]):
            raise CheckpointError(directory / ".metadata", f"incomplete: it lacks {key} of shape "
                                                           f"{(m, *tensor.shape[1:])} (has {size})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            _unwrapped(lambda: dcp.load(rows, storage_reader=reader, planner=_row_load_planner(start),
                                        no_dist=world == 1), comm, "reading")
    except (CheckpointError, PeerFailure):
        raise
    except Exception as exc:  # a truncated or garbled shard: the reader's error, in one line
        reason = torch_load_reason(exc)
        raise CheckpointError(_bad_shard(directory, metadata), f"truncated or corrupt: {reason}") from exc


def _bad_shard(directory: Path, metadata) -> Path:
    """The shard file a failed read names.

    The first shard file that is missing or shorter than the chunks DCP's metadata places in it (else the shard
    directory): the file a failed read names.
    """
    for info in sorted(getattr(metadata, "storage_data", {}).values(), key=lambda i: (i.relative_path, i.offset)):
        file = directory / info.relative_path
        if not file.is_file() or file.stat().st_size < info.offset + info.length:
            return file
    return directory


def _row_save_planner(start: int, m: int):
    """A DCP SavePlanner writing this process's rows of every global [m, ...] tensor.

    A DCP SavePlanner writing each [n, ...] tensor as chunks of at most ROW_CHUNK_BYTES at row offset `start` (+ its
    position) of a global [m, ...] tensor: every rank writes its own rows, DCP records the chunks.
    """
    from torch.distributed.checkpoint import DefaultSavePlanner, SavePlan
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    class RowSavePlanner(DefaultSavePlanner):
        def __init__(self):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

        def create_local_plan(self) -> SavePlan:
            items, self.pieces = [], {}
            for key, tensor in self.state_dict.items():
                n, tail = tensor.shape[0], tuple(tensor.shape[1:])
                row_bytes = max(1, math.prod(tail) * tensor.element_size())
                step = max(1, ROW_CHUNK_BYTES // row_bytes)
                properties = TensorProperties(dtype=tensor.dtype) if isinstance(tensor, RowSource) else \
                    TensorProperties.create_from_tensor(tensor)
                for a in range(0, n, step):
                    b = min(n, a + step)
                    offsets = torch.Size([start + a] + [0] * len(tail))
                    index = MetadataIndex(key, offsets)
                    self.pieces[(key, tuple(offsets))] = (tensor, a, b)
                    items.append(WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([b - a, *tail])),
                        properties=properties, size=torch.Size([m, *tail]))))
            self.plan = SavePlan(items)
            return self.plan

        def resolve_data(self, write_item):
            tensor, a, b = self.pieces[(write_item.index.fqn, tuple(write_item.index.offset))]
            return tensor.rows(a, b) if isinstance(tensor, RowSource) else tensor[a:b]  # a RowSource: made now

    return RowSavePlanner()


def _row_load_planner(start: int):
    """A DCP LoadPlanner reading rows `start`.. of each stored [m, ...] tensor into the given [n, ...] tensors.

    DCP computes which stored chunks overlap them and reads only those.
    """
    from torch.distributed.checkpoint import DefaultLoadPlanner, LoadPlan
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class RowLoadPlanner(DefaultLoadPlanner):
        def __init__(self):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

        def create_local_plan(self) -> LoadPlan:
            requests = []
            assert self.metadata is not None, "DCP sets the metadata (set_up_planner) before it asks for the plan"
            for key, tensor in self.state_dict.items():
                if tensor.shape[0] == 0:
                    continue
                offsets = torch.Size([start] + [0] * (tensor.dim() - 1))
                stored = self.metadata.state_dict_metadata[key]
                assert isinstance(stored, TensorStorageMetadata), f"{key}: the shards hold tensors only (`save`)"
                requests += create_read_items_for_chunk_list(key, stored, [
                    ChunkStorageMetadata(offsets=offsets, sizes=tensor.shape)])
            return LoadPlan(requests)

        def lookup_tensor(self, index):
            return self.state_dict[index.fqn]

    return RowLoadPlanner()


# ------------------------------------------------------------------------------------------------- the rest
def _gossip_state(algorithm) -> dict[str, torch.Tensor] | None:
    """The per-client state rows of the algorithm's gossip (None when it keeps none, as exact gossip)."""
    gossip = getattr(getattr(algorithm, "ctx", None), "gossip", None)
    return gossip.client_state() if gossip is not None and hasattr(gossip, "client_state") else None


def rng_state() -> dict[str, Any]:
    """The global generators' states.

    Torch CPU, the current CUDA device's (when CUDA is initialised; in a multi-process run each rank's current
    device is its own GPU), numpy, python.
    """
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.as_tensor(np.asarray(keys, dtype=np.int64), device="cpu"),
                  "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back the global generators' states `rng_state` recorded (torch, CUDA when recorded, numpy, python)."""
    torch.set_rng_state(state["torch"].clone())  # a memory-mapped manifest's tensor: a private copy
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].clone())


def _cpu(value):
    return value.detach().cpu() if torch.is_tensor(value) else value


def _plain(value):
    """Tuples and lists compare equal (TOML has only arrays); nested in dicts too."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value

"""Checkpoints: the complete state of a run after round t, and putting it back (resume).

`checkpoint.pt` in the run directory holds everything later rounds depend on:
- `round` t (rounds completed) and `params`, the client stack X with all m rows (gathered from every process);
- the algorithm's per-client state (`Algorithm.client_state`, all m rows, gathered) and its replicated
  server state (identical on every process; rank 0's copy);
- the gossip's per-client state, when it has one (`gossip_state`: compressed gossip's public copies x̂, all m
  rows, gathered; `dfl.network.choco`);
- the loop counters (bytes sent so far, bytes moved between processes, wall seconds) and the metrics history;
- the global RNG states (torch, CUDA, numpy, python; rank 0's, restored on every rank), the config and the
  parameter names.
The engine draws every random number from generators seeded by (seed, client, round) or (seed, round)
(`dfl.data.sampler`, `dfl.algorithms.server`), so with X and the state restored, rounds t+1, … of a resumed
run are those of an uninterrupted run; the global RNG states are restored too, for code that uses them.

Resuming checks that the config equals the checkpoint's except for the fields in `RESUMABLE_FIELDS`. The
number of processes may differ from the interrupted run's: per-client rows are sliced by client id.
"""

from __future__ import annotations

import random
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfl.config import Config
from dfl.errors import CheckpointError, ConfigError, NoCheckpoint  # noqa: F401 (re-exported)

FORMAT = 1
FILENAME = "checkpoint.pt"
# Fields that may differ on resume. The first do not touch the trajectory (`rounds` may grow, to extend a
# run, except under lr_schedule = cosine, which anneals over `rounds`; the hooks' fields only watch it, or say
# where it ends, as `rounds` does); the execution fields give the same run up to float rounding, as a
# different number of processes does.
EXACT_FIELDS = ("rounds", "progress", "checkpoint_every", "dist_timeout", "data_root", "loggers", "target_accuracy",
                "stop_at_target")
EXECUTION_FIELDS = ("device", "backend", "gossip_mode", "client_chunk", "compile", "eval_batch_size", "threads")
RESUMABLE_FIELDS = EXACT_FIELDS + EXECUTION_FIELDS


# The keys every checkpoint of FORMAT holds (`gather`); a file without one of them cannot be resumed.
REQUIRED_KEYS = ("round", "params", "client_state", "server_state", "history", "counters", "rng", "config",
                 "param_names")
from dfl.errors import RESTART_HINT  # noqa: E402,F401


def gather(algorithm, comm, round_done: int, history, counters: dict[str, Any], config: Config, layout):
    """The checkpoint after `round_done` rounds: a collective (every process calls it, it gathers the rows);
    returns the checkpoint on the main process, None elsewhere."""
    state = algorithm.state()
    unknown = sorted(set(algorithm.client_state) - set(state))
    if unknown:
        raise RuntimeError(f"{algorithm.name}.client_state names {unknown}, which state() does not return")
    params = comm.gather_rows(algorithm.X).detach().cpu()
    client = {k: comm.gather_rows(state[k]).detach().cpu() for k in algorithm.client_state}
    gossip = _gossip_state(algorithm)
    if gossip is not None:
        gossip = {k: comm.gather_rows(v).detach().cpu() for k, v in gossip.items()}
    if not comm.is_main:
        return None
    server = {k: _cpu(v) for k, v in state.items() if k not in algorithm.client_state}
    return {
        "format": FORMAT,
        "round": round_done,
        "params": params,
        "client_state": client,
        "server_state": server,
        **({} if gossip is None else {"gossip_state": gossip}),
        "history": history,
        # read after the gathers above: an uninterrupted run's later counts include them
        "counters": {**counters, "bytes_moved": comm.bytes_moved},
        "rng": rng_state(),
        "config": config.to_dict(),
        "param_names": list(layout.names),
    }


def load(run_dir: str | Path) -> dict[str, Any]:
    """Read `run_dir/checkpoint.pt` (every process reads it: a multi-node resume needs the run directory
    on a shared filesystem)."""
    path = Path(run_dir) / FILENAME
    if not path.is_file():
        where = "does not exist" if not Path(run_dir).exists() else f"has no {FILENAME}"
        raise NoCheckpoint(
            f"cannot resume: run directory {run_dir} {where} (a run writes {FILENAME} every checkpoint_every "
            "rounds; start the run again, with --overwrite instead of --resume)"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, random bytes, a pickle with forbidden globals, ...
        raise CheckpointError(path, f"truncated or corrupt: {_first_line(exc)}") from exc
    if not isinstance(checkpoint, dict):
        raise CheckpointError(path, f"not a dfl checkpoint: it holds a {type(checkpoint).__name__}, not a dict")
    if checkpoint.get("format") != FORMAT:
        raise CheckpointError(path, f"not a dfl checkpoint of format {FORMAT}: format {checkpoint.get('format')!r}")
    missing = [k for k in REQUIRED_KEYS if k not in checkpoint]
    if missing:
        raise CheckpointError(path, f"incomplete: it lacks {', '.join(missing)}")
    if not isinstance(checkpoint["round"], int) or not torch.is_tensor(checkpoint["params"]) \
            or checkpoint["params"].dim() != 2 or not isinstance(checkpoint["config"], dict):
        raise CheckpointError(path, "corrupt: round, params or config has the wrong type")
    return checkpoint


def _first_line(exc: BaseException) -> str:
    """`Type: first line of the message`, at most 200 characters (torch's messages run over many lines)."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def check_config(checkpoint: dict[str, Any], config: Config, run_dir) -> None:
    """The config must equal the checkpoint's except for RESUMABLE_FIELDS, and `rounds` may not shrink (nor
    change at all with lr_schedule = cosine, whose learning rates depend on `rounds`)."""
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


def changed_fields(stored: dict[str, Any], config: Config) -> list[str]:
    """The Config fields outside RESUMABLE_FIELDS in which `config` differs from the `stored` config values
    (a field missing from `stored` counts as its default)."""
    defaults = Config()
    return [
        f.name
        for f in fields(Config)
        if f.name not in RESUMABLE_FIELDS
        and _plain(stored.get(f.name, getattr(defaults, f.name))) != _plain(getattr(config, f.name))
    ]


def restore(checkpoint: dict[str, Any], algorithm, comm, layout) -> None:
    """Put X and the algorithm state back, this process's rows of the per-client entries."""
    names = checkpoint["param_names"]
    if list(names) != list(layout.names) or checkpoint["params"].shape[1] != layout.dim:
        raise ValueError("the checkpoint's parameter layout does not match the model built from the config")
    rows = torch.as_tensor(comm.client_ids, dtype=torch.long)
    params = checkpoint["params"]
    if params.shape[0] != comm.num_clients:
        raise ValueError(f"the checkpoint holds {params.shape[0]} clients, the run has {comm.num_clients}")
    algorithm.X = params[rows].to(device=algorithm.X.device, dtype=algorithm.X.dtype)
    missing = sorted(set(algorithm.client_state) - set(checkpoint["client_state"]))
    if missing:
        raise ValueError(f"the checkpoint lacks the per-client state {missing} of {algorithm.name}")
    state = {k: v[rows] for k, v in checkpoint["client_state"].items()}
    algorithm.load_state({**checkpoint["server_state"], **state})
    if _gossip_state(algorithm) is not None:  # compressed gossip: its public copies, this process's rows
        algorithm.ctx.gossip.load_client_state({k: v[rows] for k, v in checkpoint.get("gossip_state", {}).items()})


def _gossip_state(algorithm) -> dict[str, torch.Tensor] | None:
    """The per-client state rows of the algorithm's gossip (None when it keeps none, as exact gossip)."""
    gossip = getattr(getattr(algorithm, "ctx", None), "gossip", None)
    return gossip.client_state() if hasattr(gossip, "client_state") else None


def rng_state() -> dict[str, Any]:
    """The global generators' states: torch CPU, the current CUDA device's (when CUDA is initialised; in a
    multi-process run each rank's current device is its own GPU), numpy, python."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.as_tensor(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _cpu(value):
    return value.detach().cpu() if torch.is_tensor(value) else value


def _plain(value):
    """Tuples and lists compare equal (TOML has only arrays); nested in dicts too."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value

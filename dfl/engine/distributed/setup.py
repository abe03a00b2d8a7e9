"""The process group of a multi-process run, from the torchrun environment.

torchrun (or Slurm through `dfl.workflows.launchers`) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `communicator_from_env` turns them into this process's communicator: `LocalCommunicator` in a world
of one, else a `DistributedCommunicator` on the default process group. The backend is NCCL when CUDA is available
(and device is not "cpu"), gloo otherwise (`choose_backend`); under CUDA each process uses one GPU (`gpu_index`:
cuda:LOCAL_RANK when the node's GPUs are all visible, cuda:0 when a launcher gave the process one GPU of its own),
the CPU otherwise.

NCCL's error handling. torch reads TORCH_NCCL_ASYNC_ERROR_HANDLING when it constructs the NCCL process group (the
`ProcessGroupNCCL` constructor; its `Options` have no such field), with four modes: 0 none, 1 tear down (abort the
communicators and kill the process), 2 clean up only (abort the communicators, keep the process), 3 skip clean-up
(kill the process; torch's default when the variable is unset). dfl needs 2: on a timeout or an NCCL error the
watchdog aborts the communicators without killing the process, so the blocked rank raises and dfl reports why
(`dfl.engine.distributed.failures`). torchrun's agent exports TORCH_NCCL_ASYNC_ERROR_HANDLING=1 to every worker
(unless its own environment sets it), so `init_process_group` sets NCCL_ENVIRONMENT in this process's environment
right before it creates the group, whatever is there: the value a worker inherits never reaches torch. A group the
caller created is what it is: `communicator_from_env` warns when its mode kills the process.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from dfl.config import Config
from dfl.engine.distributed.communicator import DistributedCommunicator
from dfl.errors import ConfigError
from dfl.network.comm import LocalCommunicator, even_blocks

# Set for the NCCL groups dfl creates, over what the environment holds (torchrun's agent exports 1; module
# docstring): the watchdog aborts the communicators on a timeout or NCCL error without tearing the process down, so
# the rank can report why.
NCCL_ENVIRONMENT = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
# Modes of TORCH_NCCL_ASYNC_ERROR_HANDLING that kill the process on an NCCL error (torch's default when unset: 3)
NCCL_KILLING_MODES = {"1": "tear down", "3": "skip clean-up"}
NCCL_DEFAULT_MODE = "3"


def env_world_size() -> int:
    """WORLD_SIZE from the environment (torchrun sets it); 1 when unset."""
    return _env_int("WORLD_SIZE", 1, minimum=1)


def communicator_from_env(config: Config, num_clients: int) -> LocalCommunicator | DistributedCommunicator:
    """The communicator for this process.

    `LocalCommunicator` in a world of one, else a `DistributedCommunicator` on the process group (initialised here
    from the torchrun environment, or the one the caller already initialised).
    """
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() == 1:
            return LocalCommunicator(num_clients)
        device = _device(config, dist.get_backend(), _env_int("LOCAL_RANK", 0, minimum=0))
        if dist.get_backend() == "nccl":
            _warn_if_nccl_errors_kill()
        if device.type == "cuda":
            # the caller's group may not have set it: torch's object collectives (which DCP's checkpoints use) and
            # a barrier without device_ids run on the current CUDA device, cuda:0 on every rank unless set
            torch.cuda.set_device(device)
        return DistributedCommunicator(num_clients, config.gossip_mode, device, owns_group=False)
    world = env_world_size()
    if world == 1:
        return LocalCommunicator(num_clients)
    even_blocks(num_clients, world)  # fewer clients than processes: fail on every rank before connecting
    init_process_group(config)
    try:
        return DistributedCommunicator(num_clients, config.gossip_mode, _run_device(config), owns_group=True)
    except BaseException:
        dist.destroy_process_group()
        raise


def init_process_group(config: Config) -> None:
    """Initialise the default process group from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT.

    NCCL when CUDA is available (and device is not "cpu"), gloo otherwise; `config.backend` overrides.
    With CUDA each process uses its GPU (`gpu_index`; set before the group is created). The timeout is
    `config.dist_timeout`; an eager barrier makes every rank connect now rather than at the first
    gossip step, so a missing rank fails here. An NCCL group is bound to that GPU (`device_id`) and created with
    NCCL_ENVIRONMENT set in this process's environment (module docstring).
    """
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build; run with one process")
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK"):
        if name not in os.environ:
            raise ConfigError(
                f"WORLD_SIZE={env_world_size()} but {name} is not set: launch multi-process runs with torchrun "
                "(see launch/torchrun.sh), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
            )
    rank = _env_int("RANK", 0, minimum=0)
    world = env_world_size()
    if rank >= world:
        raise ConfigError(f"RANK must be in 0..{world - 1} (WORLD_SIZE={world}), got {rank}")
    backend = choose_backend(config)
    device = _run_device(config)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before any NCCL call (docs/concepts/vectorized-clients.md#clients-on-processes)
    if backend == "nccl":  # read when the group is created; torchrun's agent exports another value (module docstring)
        os.environ.update(NCCL_ENVIRONMENT)
    timeout = timedelta(seconds=config.dist_timeout)
    # NCCL: the group is bound to this rank's GPU (device_id): the communicator is formed now (a missing or
    # misconfigured rank fails here), and barriers and object collectives (DCP's) use that GPU, not a guess
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout,
                            device_id=device if backend == "nccl" else None)
    try:
        if backend == "nccl":
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise


def choose_backend(config: Config) -> str:
    """`config.backend`, with "auto" = NCCL when CUDA is available and device is not "cpu", else gloo."""
    cuda = torch.cuda.is_available() and config.device != "cpu"
    backend = config.backend
    if backend == "auto":
        return "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ConfigError(
            "backend = 'nccl' needs CUDA tensors: set device = 'auto' or 'cuda' on a machine with GPUs, "
            "or backend = 'gloo' (or 'auto') for CPU workers"
        )
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"backend must be one of auto, nccl, gloo; got {backend!r}")
    return backend


def _run_device(config: Config) -> torch.device:
    """This process's device in the run's backend (`_device`)."""
    return _device(config, choose_backend(config), _env_int("LOCAL_RANK", 0, minimum=0))


def _warn_if_nccl_errors_kill() -> None:
    """Warn when the caller's NCCL group was (most likely) created with an error mode that kills the process.

    torch read TORCH_NCCL_ASYNC_ERROR_HANDLING when the caller created the group; its value now is the best guess of
    what it was then.
    """
    mode = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_DEFAULT_MODE).strip()
    if mode in NCCL_KILLING_MODES:
        warnings.warn(f"the NCCL process group was created with TORCH_NCCL_ASYNC_ERROR_HANDLING={mode} "
                      f"({NCCL_KILLING_MODES[mode]}): on an NCCL timeout torch kills this process before dfl can "
                      "say which rank failed; create the group with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 in os.environ, "
                      "or let dfl.run create it", stacklevel=3)


def gpu_index(local_rank: int, visible: int) -> int:
    """The GPU of a process among the `visible` ones of its node: 0 when it sees one, else LOCAL_RANK mod `visible`.

    torchrun shows every process all the GPUs of its node, and LOCAL_RANK picks one (local_rank < visible). A
    launcher that binds one GPU per task (`srun --gpus-per-task=1`, a Kubernetes pod per GPU) shows each process
    only its own, as device 0, while LOCAL_RANK still counts the processes of the node; one that binds k GPUs per
    task shows k, and the process takes LOCAL_RANK mod k of them. Two processes on one GPU is NCCL's error
    ("Duplicate GPU detected"), raised when the group is created.
    """
    return 0 if visible == 1 else local_rank % visible


def _device(config: Config, backend: str, local_rank: int) -> torch.device:
    """This process's GPU (`gpu_index`) when the run uses CUDA, else cpu.

    One process per GPU: NCCL refuses two ranks on one device, so an explicit "cuda:k" is rejected in a
    multi-process run.
    """
    name = config.device
    if name == "cpu":
        if backend == "nccl":
            raise ConfigError("backend = 'nccl' needs device = 'auto' or 'cuda'; use backend = 'gloo' with cpu")
        return torch.device("cpu")
    if name == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available; use device = 'cpu' or 'auto'")
    if name not in ("auto", "cuda"):
        raise ConfigError(
            f"device must be 'auto', 'cuda' or 'cpu' in a multi-process run (each process uses "
            f"cuda:LOCAL_RANK); got {name!r}"
        )
    return torch.device("cuda", gpu_index(local_rank, torch.cuda.device_count()))


def _env_int(name: str, default: int, minimum: int) -> int:
    """The integer environment variable `name` (`default` when unset or empty).

    Raises:
        ConfigError: it is not an integer, or is below `minimum`.
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"environment variable {name} must be an integer >= {minimum}, got {value}")
    return value

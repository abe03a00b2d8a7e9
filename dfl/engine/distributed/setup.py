"""The process group of a multi-process run, from the torchrun environment.

torchrun (or Slurm through `dfl.workflows.launchers`) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `communicator_from_env` turns them into this process's communicator: `LocalCommunicator` in a world
of one, else a `DistributedCommunicator` on the default process group. The backend is NCCL when CUDA is available
(and device is not "cpu"), gloo otherwise (`choose_backend`); each process uses cuda:LOCAL_RANK under CUDA, the CPU
otherwise.

`init_process_group` sets TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (unless set): on a timeout or an NCCL error the
watchdog aborts the communicators without killing the process, so the blocked rank raises and dfl reports why
(`dfl.engine.distributed.failures`), instead of the watchdog tearing the process down with a C++ abort (the
default, 3, in torch 2.13).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from dfl.config import Config
from dfl.engine.distributed.communicator import DistributedCommunicator
from dfl.errors import ConfigError
from dfl.network.comm import LocalCommunicator, even_blocks

# Set for NCCL groups unless the environment already sets them (module docstring): the watchdog aborts the
# communicators on a timeout or NCCL error without tearing the process down, so the rank can report why.
NCCL_ENVIRONMENT = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


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
    With CUDA each process uses cuda:LOCAL_RANK (set before the group is created). The timeout is
    `config.dist_timeout`; an eager barrier makes every rank connect now rather than at the first
    gossip step, so a missing rank fails here. An NCCL group is bound to cuda:LOCAL_RANK (`device_id`).
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
    if backend == "nccl":
        for name, value in NCCL_ENVIRONMENT.items():  # read when the group is created
            os.environ.setdefault(name, value)
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


def _device(config: Config, backend: str, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK when the run uses CUDA, else cpu.

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
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but this node has {count} visible GPU(s): start at most {count} "
            "processes per node (torchrun --nproc_per_node), one per GPU"
        )
    return torch.device("cuda", local_rank)


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

"""Multi-process runs on torch.distributed: one process per GPU (NCCL) or per CPU worker (gloo).

Rank r hosts the contiguous client block `even_blocks(m, P)[r]` (`dfl.network.comm`) and gossips with the other
ranks through the collectives of its communicator.

Modules, each importing only those before it: `failures` (`FailureWatch`: the heartbeat thread, the failure record
in the rendezvous store, and the rank a `PeerFailure` names), `communicator` (`DistributedCommunicator`: gossip
exchanges, reductions and gathers of client rows, the device boundary) and `setup` (the process group from the
torchrun environment, its backend and device: `communicator_from_env`, `init_process_group`).
"""

from __future__ import annotations

# torch.func (vmap/grad, used by local training) imports torch._dynamo lazily. Imported while a process
# group exists, it keeps references to the group, so destroy_process_group leaves gloo's threads running
# and the process may abort at exit ("terminate called without an active exception", torch 2.13).
# Importing it here, before any group (dfl imports this package, and every module of it runs this first),
# avoids that; training imports it anyway.
import torch._dynamo  # noqa: F401 (imported for its side effect: see above)

from dfl.engine.distributed.communicator import DENSE_PRODUCT_LIMIT, GOSSIP_MODES, DistributedCommunicator
from dfl.engine.distributed.failures import (
    DEAD_PEER_SECONDS,
    FAILURE_KEY,
    HEARTBEAT_SECONDS,
    STALE_SECONDS,
    STOPPED_KEY,
    STORE_GRACE_SECONDS,
    FailureWatch,
)
from dfl.engine.distributed.setup import (
    NCCL_ENVIRONMENT,
    choose_backend,
    communicator_from_env,
    env_world_size,
    init_process_group,
)
from dfl.errors import PeerFailure

__all__ = [
    "DENSE_PRODUCT_LIMIT", "GOSSIP_MODES", "DistributedCommunicator",
    "DEAD_PEER_SECONDS", "FAILURE_KEY", "HEARTBEAT_SECONDS", "STALE_SECONDS", "STOPPED_KEY", "STORE_GRACE_SECONDS",
    "FailureWatch", "PeerFailure",
    "NCCL_ENVIRONMENT", "choose_backend", "communicator_from_env", "env_world_size", "init_process_group",
]

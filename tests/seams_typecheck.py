"""Checked by mypy (pyproject.toml [tool.mypy], CI), not collected by pytest: the runner's objects satisfy the
structural types an algorithm sees (`dfl.algorithms.base`), so a renamed or re-typed member fails CI."""

from __future__ import annotations

from dfl.algorithms.base import Communicator, EngineCommunicator, LocalTraining, Mixer
from dfl.engine.distributed import DistributedCommunicator
from dfl.network.comm import LocalCommunicator
from dfl.network.gossip import Gossip
from dfl.training.local import LocalTrainer


def conforms(trainer: LocalTrainer, gossip: Gossip, local: LocalCommunicator,
             distributed: DistributedCommunicator) -> None:
    """Each assignment is a structural check of one implementation against its Protocol."""
    as_training: LocalTraining = trainer
    as_mixer: Mixer = gossip
    as_local: Communicator = local
    as_distributed: Communicator = distributed
    engine_local: EngineCommunicator = local  # what dfl.run and the engine ask of a communicator
    engine_distributed: EngineCommunicator = distributed
    del as_training, as_mixer, as_local, as_distributed, engine_local, engine_distributed

"""Communication topologies for decentralized learning: graphs, gossip weights, spectral analysis.

Pure numpy/scipy/networkx (no torch). `build(name, n, weights, **options)` returns a validated `Topology`;
the spectral functions work on plain matrices too. Convention: x_i <- sum_l W[i, l] x_l (row = receiver).
"""

from __future__ import annotations

from topologies.build import NAMES, build
from topologies.spectral import (
    consensus_steps,
    effective_neighbors,
    gossip_lambda,
    phi,
    second_eigenvalue,
    spectral_gap,
)
from topologies.topology import Topology
from topologies.weights import SCHEMES

__all__ = [
    "NAMES",
    "SCHEMES",
    "Topology",
    "build",
    "consensus_steps",
    "effective_neighbors",
    "gossip_lambda",
    "phi",
    "second_eigenvalue",
    "spectral_gap",
]

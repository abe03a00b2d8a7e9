"""Communication topologies for decentralized learning: graphs, gossip weights, spectral analysis.

Pure numpy/scipy/networkx (no torch). `build(name, n, weights, **options)` returns a validated `Topology`
(`check(...)` runs the checks that need no construction, the memory it would take included); bad input raises
`TopologyError` (a ValueError) naming the argument;
the spectral functions work on plain matrices too (dense arrays or scipy sparse). Convention:
x_i <- sum_l W[i, l] x_l (row = receiver).

Sparse first: every built-in topology is built as a scipy CSR matrix (`Topology.sparse(step)`), so 100,000
clients fit in memory; dense [n, n] matrices (`Topology.matrix(step)`, `Topology.W`) are derived on demand
and refused above `DENSE_LIMIT` clients. Spectral quantities use the exact dense eigensolvers up to
`DENSE_SPECTRAL_LIMIT` clients and closed forms (circulant FFT) or a Lanczos iteration above. Both limits
live in `topologies.limits` and are read at call time, so `monkeypatch.setattr(topologies.limits,
"DENSE_SPECTRAL_LIMIT", 64)` works.
"""

from __future__ import annotations

from topologies import limits
from topologies.build import NAMES, build, check
from topologies.errors import TopologyError
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
    "TopologyError",
    "build",
    "check",
    "limits",
    "consensus_steps",
    "effective_neighbors",
    "gossip_lambda",
    "phi",
    "second_eigenvalue",
    "spectral_gap",
]

"""Communication topologies for decentralized learning: graphs, gossip weights, spectral analysis.

Pure numpy/scipy/networkx (no torch). `build(name, n, weights, **options)` returns a validated `Topology`;
the spectral functions work on plain matrices too (dense arrays or scipy sparse). Convention:
x_i <- sum_l W[i, l] x_l (row = receiver).

Sparse first: every built-in topology is built as a scipy CSR matrix (`Topology.sparse(step)`), so 100,000
clients fit in memory; dense [n, n] matrices (`Topology.matrix(step)`, `Topology.W`) are derived on demand
and refused above `DENSE_LIMIT` clients. Spectral quantities use the exact dense eigensolvers up to
`DENSE_SPECTRAL_LIMIT` clients and closed forms (circulant FFT) or a Lanczos iteration above. Both limits
are read at call time, so `monkeypatch.setattr(topologies, "DENSE_SPECTRAL_LIMIT", 64)` works.
"""

from __future__ import annotations

# defined before the submodules are imported: they look these up on the package at call time
DENSE_LIMIT = 20_000  # largest n for which matrix(step) / W build a dense [n, n] float64 array (3.2 GB)
DENSE_SPECTRAL_LIMIT = 2048  # largest n for the exact dense eigensolvers (O(n^3))
FULL_SPARSE_LIMIT = 2048  # largest n for which the complete topology's sparse() stores its n^2 entries

from topologies.build import NAMES, build  # noqa: E402
from topologies.spectral import (  # noqa: E402
    consensus_steps,
    effective_neighbors,
    gossip_lambda,
    phi,
    second_eigenvalue,
    spectral_gap,
)
from topologies.topology import Topology  # noqa: E402
from topologies.weights import SCHEMES  # noqa: E402

__all__ = [
    "DENSE_LIMIT",
    "DENSE_SPECTRAL_LIMIT",
    "FULL_SPARSE_LIMIT",
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

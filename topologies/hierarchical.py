"""Hierarchical topologies: a graph inside each group of clients, a graph between the groups.

The n clients form G groups of s = n/G consecutive clients (client i is in group i // s: the contiguous blocks a
torchrun world of G processes hosts when G divides n, `dfl.network.comm.even_blocks`). With W_in the s x s mixing
matrix of the inner graph and W_out the G x G matrix of the outer graph, one gossip step is

    W = W_out ⊗ W_in,     x_(g,a) <- sum_h W_out[g, h] sum_b W_in[a, b] x_(h,b)

(client (g, a) = g s + a): every group mixes inside by W_in, then client a of each group mixes with client a of
the neighbouring groups by W_out (the "rails" between machines). With the default inner graph `full`
(W_in = J_s, exact averaging inside a group) this is W = W_out ⊗ J_s, i.e. x_i <- sum_h W_out[g(i), h] mean(x over
group h): BlueFog's `hierarchical_neighbor_allreduce` (each machine averages its processes, the machines
neighbour-allreduce the averages over the machine graph, every process takes the result), which is the shape of
one process per GPU hosting a group of clients.

Spectra follow from the Kronecker product: the singular values of W are the products of those of W_out and W_in,
so for doubly stochastic factors lambda(W) = ||W - J||_2 = max(lambda(W_out), lambda(W_in)): the hierarchy mixes
as fast as its slower level (with inner `full`, as fast as the outer graph on G nodes). Groups must all have the
same size (BlueFog's hierarchical operations likewise require a homogeneous world), so G must divide n.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from topologies.errors import TopologyError

DIVISORS_LISTED = 10**12  # above this n the message says "a divisor of n" instead of listing them (sqrt(n) steps)


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, by trial division up to sqrt(n) (n <= DIVISORS_LISTED)."""
    if n > DIVISORS_LISTED:
        return []
    small = [g for g in range(1, math.isqrt(n) + 1) if n % g == 0]
    return sorted({*small, *(n // g for g in small)})


class Hierarchical:
    """The grouping of n clients into `groups` contiguous blocks of equal size, and the Kronecker W it gives."""

    def __init__(self, n: int, groups: object):
        if groups is None:
            raise TopologyError("hierarchical needs option groups (the number of groups, e.g. the number of processes; "
                                "it must divide the number of clients)")
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or not 1 <= groups <= n \
                or n % groups:
            divisors = _divisors(n)
            listed = ", ".join(map(str, divisors[:24])) + (", ..." if len(divisors) > 24 else "")
            which = f"one of {listed}" if divisors else "a divisor of n"
            raise TopologyError(f"groups must be an integer that divides n = {n} (groups of equal size), {which}; "
                                f"got {groups!r}")
        self.n, self.groups, self.size = n, int(groups), n // int(groups)

    def labels(self) -> np.ndarray:
        """[n]: the group of each client (i // s)."""
        return np.arange(self.n, dtype=np.int64) // self.size

    def matrix(self, W_out: sp.sparray, W_in: sp.sparray) -> sp.csr_array:
        """W = W_out ⊗ W_in as canonical CSR (W_out: G x G, W_in: s x s)."""
        if W_out.shape != (self.groups, self.groups) or W_in.shape != (self.size, self.size):
            raise TopologyError(f"hierarchical: the outer W must be {self.groups} x {self.groups} and the inner "
                                f"{self.size} x {self.size}, got {W_out.shape} and {W_in.shape}")
        W = sp.csr_array(sp.kron(sp.csr_array(W_out), sp.csr_array(W_in), format="csr"))
        W.sum_duplicates()
        W.eliminate_zeros()
        return W

"""Robust aggregation rules: per receiver over its gossip neighbourhood, and at the server over the participants.

Gossip (`Neighbourhoods`, `robust_step`): receiver i combines the messages z_j of its in-neighbours N_i (W_ij > 0,
j ≠ i) and its own model x_i, the set N̄_i = N_i ∪ {i} of k_i = |N̄_i| vectors. The neighbourhoods of one step are a
padded [m, K] table (K = max_i k_i; slot 0 is i itself, padding masked), processed in blocks of receivers whose
[K, rows, d] gathers stay under a byte budget, so memory does not grow with m·K·d.

- clipped-gossip (He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via ClippedGossip", 2022):
  x_i ← x_i + Σ_{j∈N_i} w_ij CLIP(z_j − x_i, τ_i), CLIP(v, τ) = v · min(1, τ/‖v‖). Since CLIP(v, τ) = c v with
  c = min(1, τ/‖v‖), this is x_i ← Σ_j w̃_ij z_j with w̃_ij = c_ij w_ij (j ≠ i) and w̃_ii = 1 − Σ_{j≠i} w̃_ij: a
  matmul with a rescaled W whose rows still sum to 1 (`clipped_weights`). τ_i = `clip_radius` when set, else
  adaptive: the (b+1)-th largest of the distances ‖z_j − x_i‖ over j ∈ N_i (b = `trim`), so the b farthest
  neighbours are clipped to it; b = 1 is the rule of the authors' code (epfml/byzantine-robust-decentralized-optimizer,
  `SelfCenteredClipping`: the second-largest distance). A receiver with at most b neighbours gets τ_i = 0 (keeps x_i).
  τ = ∞ is plain gossip.
- trimmed-mean: per coordinate, the b largest and the b smallest of the k_i values of the closed neighbourhood N̄_i
  (the receiver's own among them) are dropped and the remaining k_i − 2b averaged (unweighted): the coordinate-wise
  trimmed mean (Yin et al., ICML 2018) taken over N̄_i, as the code the BRIDGE authors released computes their
  screening (INSPIRE-Lab-US/Byzantine-resilient-distributed-learning, `DecLearning.communication`, whose neighbour
  lists hold the node itself). A receiver with k_i <= 2b trims what it can, b_i = ⌊(k_i − 1)/2⌋ (with link faults
  an isolated client keeps its model).
- bridge-trimmed-mean (BRIDGE-T as the paper states it: Fang, Yang & Bajwa, "BRIDGE: Byzantine-resilient
  decentralized gradient descent", IEEE TSIPN 2022, arXiv 1908.08098): per coordinate, only the n_i = k_i − 1
  neighbours' values are trimmed (the b largest and b smallest dropped) and the n_i − 2b left are averaged with the
  receiver's own value, which is never trimmed: x_i ← (x_i + Σ_kept z_j) / (n_i − 2b + 1). A receiver with
  n_i < 2b trims b_i = ⌊n_i/2⌋. The formula is as recalled from the paper's Algorithm 1 (its text was not at hand);
  the difference from trimmed-mean is that an honest receiver's own model always counts.
- median: per coordinate, the median of the k_i values (the mean of the two middle ones when k_i is even).

Server (`server_aggregate`), over the participants' updates Δ_1 … Δ_n (unweighted):
- median and trimmed-mean: as above, coordinate-wise over the n updates (Yin et al., ICML 2018); a round with
  n <= 2b participants trims ⌊(n − 1)/2⌋;
- krum (Blanchard et al., NeurIPS 2017): the Δ_i with the smallest score Σ_{j ∈ n−f−2 nearest of i} ‖Δ_i − Δ_j‖²,
  f = b; needs n > 2f + 2;
- centered-clipping (Karimireddy, He & Jaggi, "Learning from history for Byzantine robust optimization", ICML 2021;
  one iteration): v ← v + (1/n) Σ_i CLIP(Δ_i − v, τ), v the previous round's aggregate (0 at first),
  τ = `clip_radius`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
import torch

import topologies
from dfl.errors import ConfigError
from dfl.network.byzantine_settings import AGGREGATORS, AggregatorCard

# temporaries of one block of receivers (a [K, rows, d] gather and its sorted copy) stay under this many bytes
BLOCK_BYTES = {"cpu": 64 * 2**20, "cuda": 512 * 2**20}
SORT_COPIES = 3  # the gather, the masked gather and the sorted values, alive together in a coordinate-wise rule


@dataclass
class Neighbourhoods:
    """One gossip step's in-neighbourhoods as a padded table (module docstring), on the run's device.

    `index` [m, K] client ids (slot 0 = the receiver; padding repeats it), `weight` [m, K] the W_ij (0 on padding),
    `valid` [m, K] bool, `count` [m] = k_i, `most` = K (host int), and `senders` [m, K] the host (numpy) copy of
    `index` with -1 on padding (what host-side counts read, so they need no copy back from the device).
    """

    index: torch.Tensor
    weight: torch.Tensor
    valid: torch.Tensor
    count: torch.Tensor
    most: int
    senders: np.ndarray

    @classmethod
    def of(cls, W, dtype: torch.dtype, device: torch.device) -> Neighbourhoods:
        """The neighbourhoods of W (row = receiver, scipy sparse or dense), self first, in column order."""
        W = sp.csr_array(W)
        W.sort_indices()
        m = W.shape[0]
        rows = np.repeat(np.arange(m), np.diff(W.indptr))
        other = (W.indices != rows) & (W.data != 0)
        count = np.bincount(rows[other], minlength=m) + 1
        K = int(count.max()) if m else 1
        index = np.repeat(np.arange(m)[:, None], K, axis=1)
        weight = np.zeros((m, K))
        weight[:, 0] = W.diagonal()
        start = np.concatenate([[0], np.cumsum(count - 1)[:-1]])
        slot = 1 + np.arange(int(other.sum())) - np.repeat(start, count - 1)
        index[rows[other], slot] = W.indices[other]
        weight[rows[other], slot] = W.data[other]
        valid = np.arange(K)[None, :] < count[:, None]
        return cls(torch.as_tensor(index, device=device), torch.as_tensor(weight, dtype=dtype, device=device),
                   torch.as_tensor(valid, device=device), torch.as_tensor(count, device=device), K,
                   np.where(valid, index, -1))

    def byzantine_inputs(self, byzantine: np.ndarray) -> int:
        """The most Byzantine in-neighbours any honest receiver has (the default b of `trim`; host arrays only)."""
        valid = self.senders >= 0
        bad = (byzantine[np.maximum(self.senders, 0)] & valid)[:, 1:].sum(axis=1)
        honest = ~byzantine
        return int(bad[honest].max()) if honest.any() else 0


def free_bytes(device: torch.device) -> int:
    """Memory free on `device` now (CUDA: the driver's free memory; CPU: the OS's MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return topologies.limits.available_memory()


def block_rows(K: int, d: int, itemsize: int, device: torch.device, what: str) -> int:
    """Receivers per block of a coordinate-wise rule: [K, rows, d] temporaries within the budget (module docstring).

    Refuses (ConfigError naming `what`, the fields) a neighbourhood whose one receiver's temporaries do not fit in
    the memory free: K·d values, SORT_COPIES times.
    """
    per_row = SORT_COPIES * K * d * itemsize
    free = free_bytes(device)
    if per_row > free // 2:
        raise ConfigError(f"{what}: one receiver's neighbourhood of {K:,} models x {d:,} parameters needs "
                          f"~{topologies.limits.gib(per_row)} for a coordinate-wise rule, more than half of the "
                          f"{topologies.limits.gib(free)} free; use a sparser topology or aggregator = clipped-gossip")
    budget = BLOCK_BYTES.get(device.type, BLOCK_BYTES["cpu"])
    return max(1, min(budget, free // 4) // per_row)


def row_slices(m: int, rows: int):
    """Slices of `rows` consecutive rows (receivers) covering 0 … m − 1: the blocks the rules work in."""
    for a in range(0, m, rows):
        yield slice(a, min(a + rows, m))


def clip_scale(radius: torch.Tensor | float, norm: torch.Tensor) -> torch.Tensor:
    """The factor c = min(1, τ/‖v‖) with CLIP(v, τ) = c·v (1 for a zero v: 0/0)."""
    return (radius / norm).clamp(max=1.0).nan_to_num(nan=1.0)


def trimmed_sum(G: torch.Tensor, count: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ of the entries ranked b[r] … count[r] − b[r] − 1 along dim 0 of G [K, r, d], per coordinate.

    The entries past count[r] must be +inf (they sort last): the b smallest and b largest of the first count[r] values
    of each column are left out.
    """
    S = torch.msort(G)  # values only: no int64 index tensor
    position = torch.arange(S.shape[0], device=S.device).view(-1, 1, 1)
    keep = (position >= b.view(1, -1, 1)) & (position < (count - b).view(1, -1, 1))
    return S.masked_fill_(~keep, 0.0).sum(dim=0)  # S is msort's own copy


def coordinatewise(G: torch.Tensor, count: torch.Tensor, rule: str, b: torch.Tensor) -> torch.Tensor:
    """Median or trimmed mean along dim 0 of G [K, r, d], of the first count[r] entries of each column.

    The entries past count[r] must be +inf (they sort last); b [r] is each column group's trim (trimmed-mean).
    """
    if rule == "median":
        S = torch.msort(G)
        lo = ((count - 1) // 2).view(1, -1, 1).expand(1, *S.shape[1:])
        hi = (count // 2).view(1, -1, 1).expand(1, *S.shape[1:])
        return (torch.gather(S, 0, lo) + torch.gather(S, 0, hi)).squeeze(0) / 2
    return trimmed_sum(G, count, b) / (count - 2 * b).to(G.dtype).view(-1, 1)


def robust_step(M: torch.Tensor, hood: Neighbourhoods, rule: str, b: int, rows: int) -> torch.Tensor:
    """One gossip step of a coordinate-wise rule (its card's `coordinatewise`) for every receiver i.

    median and trimmed-mean: out_i = the rule over {z_j : j ∈ N̄_i} (the receiver's own model among them); a receiver
    with k_i <= 2b trims b_i = ⌊(k_i − 1)/2⌋ (what it can: an isolated one keeps its model). bridge-trimmed-mean:
    out_i = (x_i + Σ of the neighbours' values left after trimming b_i of each end) / (n_i − 2b_i + 1), n_i = k_i − 1
    neighbours, b_i = min(b, ⌊n_i/2⌋) (`bridge_step`). M [m, d] holds each client's message (a receiver's own model in
    its own row); `rows` receivers per block.
    """
    if rule == "bridge-trimmed-mean":
        return bridge_step(M, hood, b, rows)
    out = torch.empty_like(M)
    trims = torch.minimum(torch.full_like(hood.count, b), (hood.count - 1) // 2)
    for s in row_slices(M.shape[0], rows):
        G = M[hood.index[s].T]  # [K, r, d]
        G = G.masked_fill_(~hood.valid[s].T.unsqueeze(-1), float("inf"))  # G is the gather's own copy
        out[s] = coordinatewise(G, hood.count[s], rule, trims[s])
    return out


def bridge_step(M: torch.Tensor, hood: Neighbourhoods, b: int, rows: int) -> torch.Tensor:
    """BRIDGE-T's screening (module docstring): trim the neighbours' values only, then average with the own value.

    Per coordinate, receiver i drops the b_i largest and b_i smallest of its n_i neighbours' values and averages the
    n_i − 2b_i left with its own x_i: out_i = (x_i + Σ_kept z_j) / (n_i − 2b_i + 1). b_i = min(b, ⌊n_i/2⌋): with
    n_i <= 2b it trims what it can (with no neighbour left, it keeps x_i).
    """
    out = torch.empty_like(M)
    neighbours = hood.count - 1
    trims = torch.minimum(torch.full_like(neighbours, b), neighbours // 2)
    for s in row_slices(M.shape[0], rows):
        G = M[hood.index[s, 1:].T]  # [K − 1, r, d]: the neighbour slots (slot 0 is the receiver)
        G = G.masked_fill_(~hood.valid[s, 1:].T.unsqueeze(-1), float("inf"))
        total = trimmed_sum(G, neighbours[s], trims[s]) + M[s]
        out[s] = total / (neighbours[s] - 2 * trims[s] + 1).to(M.dtype).view(-1, 1)
    return out


def neighbour_distances(M: torch.Tensor, hood: Neighbourhoods, rows: int) -> torch.Tensor:
    """[m, K]: ‖z_j − x_i‖ for the slots of each receiver's neighbourhood (0 on padding and on slot 0)."""
    dist = torch.zeros(hood.index.shape, dtype=M.dtype, device=M.device)
    for s in row_slices(M.shape[0], rows):
        for k in range(1, hood.most):
            dist[s, k] = torch.linalg.vector_norm(M[hood.index[s, k]] - M[s], dim=1)
    return dist * hood.valid


def clipped_weights(dist: torch.Tensor, hood: Neighbourhoods, tau: float | None, b: int) -> torch.Tensor:
    """W̃ [m, K] of clipped gossip: w̃_ij = w_ij min(1, τ_i/‖z_j − x_i‖) for j ≠ i, w̃_ii = 1 − Σ_{j≠i} w̃_ij.

    τ_i = `tau`, or (None) the (b+1)-th largest neighbour distance of receiver i (0 with at most b neighbours).
    """
    if tau is None:
        ranked = dist[:, 1:].masked_fill(~hood.valid[:, 1:], -1.0)
        ranked = torch.sort(ranked, dim=1, descending=True).values
        radius = ranked[:, b].clamp_min(0) if b < ranked.shape[1] else torch.zeros_like(dist[:, 0])
    else:
        radius = torch.full_like(dist[:, 0], tau)
    scale = clip_scale(radius[:, None], dist[:, 1:])  # a neighbour equal to x_i: 1
    off = hood.weight[:, 1:] * scale
    return torch.cat([1 - off.sum(dim=1, keepdim=True), off], dim=1)


def weighted_step(M: torch.Tensor, hood: Neighbourhoods, weight: torch.Tensor, rows: int) -> torch.Tensor:
    """out_i = Σ_k weight[i, k] z_{index[i, k]}: a gossip step with the (rescaled) weights of the table."""
    out = torch.empty_like(M)
    for s in row_slices(M.shape[0], rows):
        part = M[hood.index[s, 0]] * weight[s, 0:1]
        for k in range(1, hood.most):
            part.addcmul_(M[hood.index[s, k]], weight[s, k:k + 1])
        out[s] = part
    return out


# ------------------------------------------------------------------------------------------------ the server
def server_aggregate(V: torch.Tensor, rule: str, b: int, tau: float | None = None,
                     center: torch.Tensor | None = None) -> torch.Tensor:
    """The robust aggregate [d] of the participants' updates V [n, d] (module docstring; unweighted).

    `b`: trimmed-mean's b and krum's f; `tau` and `center` (the previous aggregate): centered-clipping's.
    """
    n, d = V.shape
    if rule in ("median", "trimmed-mean"):
        count, trim = torch.full((1,), n, device=V.device), torch.full((1,), min(b, (n - 1) // 2), device=V.device)
        columns = max(1, BLOCK_BYTES.get(V.device.type, BLOCK_BYTES["cpu"]) // (SORT_COPIES * n * V.element_size()))
        return torch.cat([coordinatewise(V[:, c:c + columns].unsqueeze(1), count, rule, trim).squeeze(0)
                          for c in range(0, d, columns)])
    if rule == "krum":
        if n <= 2 * b + 2:
            raise ConfigError(f"aggregator = krum with trim = {b} Byzantine inputs needs more than 2·{b} + 2 = "
                              f"{2 * b + 2} participants in a round (Blanchard et al.), got {n}")
        dist = torch.cdist(V.unsqueeze(0), V.unsqueeze(0)).squeeze(0) ** 2
        dist.fill_diagonal_(float("inf"))
        score = torch.sort(dist, dim=1).values[:, : n - b - 2].sum(dim=1)
        return V[torch.argmin(score)].clone()
    if rule == "centered-clipping":
        assert tau is not None, "validation requires clip_radius for centered-clipping"
        v = torch.zeros(d, dtype=V.dtype, device=V.device) if center is None else center
        diff = V - v
        scale = clip_scale(tau, torch.linalg.vector_norm(diff, dim=1, keepdim=True))
        return v + (diff * scale).mean(dim=0)
    raise ValueError(f"unknown server aggregator {rule!r}")


# ------------------------------------------------------------------------------------------------ the registered rules
class Aggregator:
    """An aggregator: one gossip step of each receiver over its neighbourhood (`step`), or the server's aggregate.

    Registered with its card in `dfl.network.byzantine_settings.AGGREGATORS`; a plug-in subclasses it, sets `card`
    and registers the class. `step(gossip, M, s)` gets the `dfl.network.byzantine.ByzantineGossip` that runs it (its
    `inner` gossip, its `threat`, and `neighbourhoods(s, dtype, device)`: the step's table, the trim b, and the
    receivers per block) and the step's messages M [m, d]; `server(V, weights, b, tau, center)` the participants'
    updates V [n, d], their aggregation weights (a weighted rule's), b (trim, else the Byzantine count), clip_radius
    and the previous aggregate.
    """

    card: ClassVar[AggregatorCard]

    def neighbourhood(self, threat: Any, hood: Neighbourhoods, b: int) -> None:
        """See a gossip step's neighbourhood table `hood` and trim b when it is made (before round 1 if static)."""
        return None

    def step(self, gossip: Any, M: torch.Tensor, s: int) -> torch.Tensor:
        """One gossip step of the messages M [m, d] at gossip step s."""
        raise NotImplementedError(f"{type(self).__name__} is not a rule of the decentralized algorithms")

    def server(self, V: torch.Tensor, weights: torch.Tensor, b: int, tau: float | None,
               center: torch.Tensor | None) -> torch.Tensor:
        """The server's aggregate [d] of the participants' updates V [n, d]."""
        raise NotImplementedError(f"{type(self).__name__} is not a rule of a server")


class Mean(Aggregator):
    """mean: the topology's own gossip X ← W X, and the server's weighted mean Σ p_i Δ_i."""

    card = AGGREGATORS.card("mean")

    def step(self, gossip, M, s):
        """X ← W X: the inner gossip's step."""
        return gossip.inner.mix(M, s, 1)

    def server(self, V, weights, b, tau, center):
        """Σ p_i Δ_i."""
        return weights @ V


class ClippedGossip(Aggregator):
    """clipped-gossip: each neighbour's difference clipped to τ_i, then W's weights (module docstring)."""

    card = AGGREGATORS.card("clipped-gossip")

    def __init__(self) -> None:
        self.warned = False

    def step(self, gossip, M, s):
        """Each neighbour's difference clipped to the receiver's τ_i, then weighted by W."""
        hood, b, rows = gossip.neighbourhoods(s, M.dtype, M.device)
        weight = clipped_weights(neighbour_distances(M, hood, rows), hood, gossip.threat.clip_radius, b)
        return weighted_step(M, hood, weight, rows)

    def neighbourhood(self, threat: Any, hood: Neighbourhoods, b: int) -> None:
        """Warn (once) when the adaptive radius leaves honest receivers with τ = 0: no more neighbours than b.

        With `trim` unset, b is the most Byzantine in-neighbours of any honest receiver, applied to every receiver; on a
        sparse graph that can switch gossip off for every client with at most b neighbours (a ring with b = 2).
        """
        if self.warned or threat.clip_radius is not None:
            return
        neighbours = (hood.senders[:, 1:] >= 0).sum(axis=1)
        isolated = int(((neighbours <= b) & threat.honest).sum())
        if isolated and b:
            self.warned = True
            warnings.warn(f"aggregator = clipped-gossip: {isolated} of the {int(threat.honest.sum())} honest "
                          f"clients have at most b = {b} neighbours, so the adaptive radius clips every neighbour to "
                          "tau = 0 and they keep their own models (b: trim, unset = the most Byzantine in-neighbours "
                          f"of any honest client); set trim below {b} (e.g. trim = {b - 1}) or clip_radius",
                          stacklevel=2)


class _Coordinatewise(Aggregator):
    """A coordinate-wise rule over each receiver's neighbourhood (`robust_step`) and over the server's participants."""

    rule: ClassVar[str]

    def step(self, gossip, M, s):
        hood, b, rows = gossip.neighbourhoods(s, M.dtype, M.device)
        return robust_step(M, hood, self.rule, b, rows)

    def server(self, V, weights, b, tau, center):
        return server_aggregate(V, self.rule, b, tau, center)


class TrimmedMean(_Coordinatewise):
    """trimmed-mean: per coordinate, the b largest and b smallest of the neighbourhood dropped, the rest averaged."""

    card = AGGREGATORS.card("trimmed-mean")
    rule = "trimmed-mean"


class BridgeTrimmedMean(_Coordinatewise):
    """bridge-trimmed-mean: BRIDGE-T, the neighbours' values trimmed, the receiver's own always kept."""

    card = AGGREGATORS.card("bridge-trimmed-mean")
    rule = "bridge-trimmed-mean"


class Median(_Coordinatewise):
    """median: per coordinate, the median of the neighbourhood (of the participants, at a server)."""

    card = AGGREGATORS.card("median")
    rule = "median"


class Krum(Aggregator):
    """krum: the participant's update closest to its n − f − 2 nearest others (a server's rule)."""

    card = AGGREGATORS.card("krum")

    def server(self, V, weights, b, tau, center):
        """The Krum-selected update."""
        return server_aggregate(V, "krum", b, tau, center)


class CenteredClipping(Aggregator):
    """centered-clipping: the previous aggregate moved by the mean of the updates clipped around it (server)."""

    card = AGGREGATORS.card("centered-clipping")

    def server(self, V, weights, b, tau, center):
        """V + the mean of the updates' differences from v, each clipped to τ."""
        return server_aggregate(V, "centered-clipping", b, tau, center)

"""The measures topology papers report besides the spectral gap: what a time-varying sequence does over its steps.

A single step's lambda = ||W_t - J||_2 says little about a time-varying sequence: the one-peer exponential graph
and the Base-(k+1) graph have ||W_t - J||_2 = 1 at most steps, yet their products average exactly after tau steps
(Takezawa et al. 2023; Ying et al. 2021). So besides lambda (per step over one period) these are reported
(`dfl topology compare`):

- `exact_steps`: the steps after which W_{T-1} ... W_0 = J to rounding (||. - J||_2 <= EXACT_TOL): finite-time
  (exact) consensus; None when it is not reached within two periods, and for a schedule without a period (a
  random one only contracts geometrically, so it would cross any tolerance eventually);
- `step_norms`: ||W_t - J||_2 of each step of one period (the first RANDOM_STEPS steps without a period);
- `period_norm`: ||W_{tau-1} ... W_0 - J||_2, the contraction of one whole period (None without a period);
- `peers`: the clients each client sends to per step, max and mean over clients and those steps;
- `sends_per_round`: the models all clients send in a round of Q gossip steps, mean over the rounds of one period
  (times the bytes of a model: the bytes per round);
- `random_start_steps`: the steps until a random start x_0 ~ N(0, I) (seeded) is within eps of consensus,
  ||x_T - mean(x_T)|| <= eps ||x_0 - mean(x_0)||: the typical case, where `Topology.consensus_steps` bounds the
  worst one; inf when not reached within RANDOM_START_LIMIT steps.
"""

from __future__ import annotations

import math

import numpy as np

from topologies import spectral
from topologies.topology import Topology

EXACT_TOL = 1e-12
RANDOM_STEPS = 16  # steps measured of a schedule without a period
RANDOM_START_LIMIT = 10_000
RANDOM_START_COLUMNS = 4


def steps_of(topology: Topology) -> range:
    """The steps the per-step measures look at: one period, or the first RANDOM_STEPS without a period."""
    return range(topology.period if topology.period is not None else RANDOM_STEPS)


def step_norms(topology: Topology) -> list[float]:
    """||W_t - J||_2 of each step of `steps_of` (static: lambda)."""
    if not topology.is_time_varying:
        return [topology.gossip_lambda(1)]
    return [spectral.product_lambda([topology.sparse(t)]) for t in steps_of(topology)]


def period_norm(topology: Topology) -> float | None:
    """||W_{tau-1} ... W_0 - J||_2 (static: lambda); None without a period."""
    if topology.period is None:
        return None
    return topology.gossip_lambda(topology.period)


def exact_steps(topology: Topology) -> int | None:
    """The first T with ||W_{T-1} ... W_0 - J||_2 <= EXACT_TOL, searched over two periods (None if never)."""
    if topology.averaging is not None:  # W = a I + (1 - a) J: exact in one step when a = 0, never otherwise
        return (1 if topology.n > 1 else 0) if topology.averaging == 0.0 else None
    if topology.period is None:  # a random schedule contracts geometrically: below EXACT_TOL is not finite-time
        return None
    limit = 2 * topology.period if topology.is_time_varying else 1  # a static W is exact only if W = J
    mats = []
    for T in range(1, limit + 1):
        mats.append(topology.sparse(T - 1))
        if spectral.product_lambda(mats) <= EXACT_TOL:
            return T
    return None


def peers(topology: Topology) -> tuple[int, float]:
    """(max, mean) over clients and the steps of `steps_of` of the clients each client sends to."""
    counts = np.stack([topology.out_degrees(t) for t in steps_of(topology)])
    return int(counts.max()), float(counts.mean())


def sends_per_round(topology: Topology, Q: int) -> float:
    """Models sent by all clients in a round of Q steps.

    The mean over the rounds of one period (RANDOM_STEPS rounds without a period; static: one round).
    """
    Q = spectral.check_steps(Q)
    if not topology.is_time_varying:
        rounds = 1
    elif topology.period is None:
        rounds = RANDOM_STEPS
    else:
        rounds = topology.period // math.gcd(topology.period, Q)  # rounds until the steps repeat
    total = sum(int(topology.out_degrees(t).sum()) for t in range(rounds * Q))
    return total / rounds


def random_start_steps(topology: Topology, eps: float = 1e-3, seed: int = 0, method: str = "auto") -> int | float:
    """Steps until x_0 ~ N(0, I) ([n, 4], `np.random.default_rng(seed)`) is within eps of consensus (module doc).

    method: "simulate" applies the steps one by one; "auto" does so unless every step of one period is circulant
    (ring, exponential, one-peer exponential), where the Fourier form gives the same count in O(n log n)
    (`spectral.circulant_disagreement_steps`): a ring of 100,000 clients, where the simulation runs all
    RANDOM_START_LIMIT steps, takes well under a second instead of minutes.
    """
    eps = spectral.check_eps(eps)
    if method not in ("auto", "simulate"):
        raise ValueError(f"method must be auto or simulate, got {method!r}")
    X = np.random.default_rng(seed).standard_normal((topology.n, RANDOM_START_COLUMNS))
    start = spectral.disagreement(X)
    if start == 0.0 or topology.n == 1:
        return 0
    a = topology.averaging
    if a is not None:  # (W - J) x = a (x - mean): a^T <= eps
        return 1 if a == 0.0 else math.ceil(math.log(eps) / math.log(a))
    period = topology.period if topology.is_time_varying else 1  # None: a random schedule, simulated
    if method == "auto" and period is not None:
        spectra = spectral.circulant_spectra([topology.sparse(t) for t in range(period)])
        steps = None if spectra is None else spectral.circulant_disagreement_steps(spectra, X, eps,
                                                                                   RANDOM_START_LIMIT)
        if steps is not None:
            return steps
    for T in range(1, RANDOM_START_LIMIT + 1):
        X = topology.sparse(T - 1) @ X
        if spectral.disagreement(X) <= eps * start:
            return T
    return math.inf

"""The Byzantine fields of a Config, checked without torch (`dfl.validate`; the threat itself: `dfl.network.byzantine`).

`byzantine`, `attack`, `attack_scale`, `aggregator`, `trim` and `clip_radius` each on its own are checked by
`Config.validate` (type, range, choices); here are the rules between them and with the rest of the run:

- `byzantine` is a count (>= 1, an integer) or a fraction in (0, 1) of the clients (rounded to the nearest count, at
  least 1); at least one client stays honest. With byzantine > 0 an `attack` is needed; `attack` and `attack_scale`
  with byzantine = 0 are refused (a field set while it has no effect is an error).
- `aggregator`: mean, clipped-gossip, trimmed-mean, bridge-trimmed-mean or median for the decentralized algorithms
  (each receiver over its in-neighbours and itself); mean, median, trimmed-mean, krum or centered-clipping at the
  server of the centralized ones. `trim` only for trimmed-mean, bridge-trimmed-mean, krum and clipped-gossip without
  a radius; `clip_radius` only for
  clipped-gossip and centered-clipping (which needs it). A robust aggregator without Byzantine clients is allowed:
  it measures what robustness costs.
- Algorithms: those whose card sets `byzantine` (they share only their models: dpsgd, dfedavg, dfedavgm, dfedsam,
  dfedsam-mgs; fedavg, fedsam, fedavgsm at the server). Trackers, control variates and server states built from the
  clients' messages (dsgt, kgt, scaffold, fedcm, ...) are refused, as are compressed gossip (the attacker would have
  to forge CHOCO's public copies), mode = async, the column-stochastic weights of push-sum and, for the centralized
  rules, aggregation = size (no weighted robust rule is implemented).
- A torchrun world of more than one process is refused when the run is set up (`dfl.network.byzantine`): the
  omniscient attacker and the neighbourhood gathers read every client's row.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

from dfl.config import Config
from dfl.errors import ConfigError
from topologies import limits

FIELDS = ("byzantine", "attack", "attack_scale", "aggregator", "trim", "clip_radius")
# per receiver, over its neighbourhood (bridge-trimmed-mean: its neighbours', its own model kept; `dfl.network.robust`)
DECENTRALIZED = ("mean", "clipped-gossip", "trimmed-mean", "bridge-trimmed-mean", "median")
CENTRALIZED = ("mean", "median", "trimmed-mean", "krum", "centered-clipping")  # at the server, over the participants
TRIMMING = ("trimmed-mean", "bridge-trimmed-mean", "krum", "clipped-gossip")  # the aggregators that read `trim`
CLIPPING = ("clipped-gossip", "centered-clipping")  # the aggregators that read `clip_radius`
# the attack's strength when `attack_scale` is unset (alie: None = Baruch et al.'s z_max, `alie_z`)
DEFAULT_SCALE = {"sign-flip": 1.0, "gaussian": 1.0, "alie": None, "ipm": 0.1}


def byzantine_count(value: Any, clients: int) -> int:
    """The number of Byzantine clients `byzantine = value` asks for among `clients` (0 = none).

    A value >= 1 is a count (an integer); one in (0, 1) a fraction, rounded to the nearest count (halves up).
    """
    if value == 0:
        return 0
    if value >= 1:
        if value != int(value):
            raise ConfigError(f"byzantine must be a count (an integer >= 1) or a fraction in (0, 1) of the clients, "
                              f"got {value!r}")
        return int(value)
    count = math.floor(value * clients + 0.5)
    if count == 0:
        raise ConfigError(f"byzantine = {value:g} of {clients} clients rounds to no Byzantine client; use a fraction "
                          f">= {0.5 / clients:.3g} or a count >= 1")
    return count


def alie_z(clients: int, byzantine: int) -> float:
    """z_max of "A Little Is Enough" (Baruch et al., NeurIPS 2019, Algorithm 3) for n clients, f of them Byzantine.

    s = ⌊n/2 + 1⌋ − f honest clients must be won over; z_max = Φ⁻¹((n − f − s)/(n − f)), Φ the standard normal CDF
    (as the authors' code, and He, Karimireddy & Jaggi's decentralized adaptation, compute it).
    """
    n, f = clients, byzantine
    s = math.floor(n / 2 + 1) - f
    p = (n - f - s) / (n - f)
    if not 0 < p < 1:
        raise ConfigError(f"attack = alie: z_max = Φ⁻¹((n − f − s)/(n − f)) is undefined for {n} clients with "
                          f"byzantine = {f} (s = {s} supporters); set attack_scale (z) explicitly")
    return NormalDist().inv_cdf(p)


def check_config(config: Config, centralized: bool, accepts: bool, accepting: list[str]) -> None:
    """The Byzantine part of `dfl.validate`.

    ConfigError, one line naming the field and the allowed values, for every combination the module docstring
    refuses.

    Args:
        config: the run's `Config` (its fields already checked on their own by `Config.validate`).
        centralized: whether the algorithm aggregates at a server.
        accepts: whether the algorithm's card says it runs with Byzantine clients (`dfl.algorithms.accepts_byzantine`).
        accepting: the algorithms that do (`dfl.algorithms.byzantine_algorithms`), for the message.
    """
    count = byzantine_count(config.byzantine, config.clients)
    if count >= config.clients:
        raise ConfigError(f"byzantine = {config.byzantine:g} leaves no honest client among clients = {config.clients}; "
                          "use fewer")
    if count == 0:
        for name in ("attack", "attack_scale"):
            if getattr(config, name) is not None:
                raise ConfigError(f"{name} = {getattr(config, name)!r} applies to Byzantine clients, but byzantine = "
                                  "0; set byzantine (a count or a fraction of the clients), or unset it")
    elif config.attack is None:
        raise ConfigError(f"byzantine = {config.byzantine:g} needs attack: one of sign-flip, gaussian, alie, ipm")
    elif config.attack == "alie" and config.attack_scale is None:
        alie_z(config.clients, count)
    _check_aggregator(config, centralized)
    if count == 0 and config.aggregator == "mean":
        return
    if not centralized and config.aggregator != "mean" and config.topology == "full" \
            and config.clients > limits.FULL_SPARSE_LIMIT:
        raise ConfigError(f"aggregator = {config.aggregator} on topology = full reads each receiver's whole "
                          f"neighbourhood, the {config.clients - 1:,} other clients; the complete graph's explicit "
                          f"neighbourhoods stop at {limits.FULL_SPARSE_LIMIT:,} clients (clients = "
                          f"{config.clients:,}): use fewer clients or a sparser topology (e.g. exponential)")
    _check_combinations(config, centralized, accepts, accepting)


def _check_aggregator(config: Config, centralized: bool) -> None:
    """`aggregator` for this kind of algorithm, and `trim` / `clip_radius` only where the aggregator reads them."""
    name = config.aggregator
    allowed = CENTRALIZED if centralized else DECENTRALIZED
    if name not in allowed:
        kind = "the centralized" if centralized else "the decentralized"
        raise ConfigError(f"aggregator = {name} is not a rule of {kind} {config.algorithm!r}; use one of "
                          f"{', '.join(allowed)}")
    if config.trim is not None and name not in TRIMMING:
        raise ConfigError(f"trim = {config.trim} applies to aggregator = {', '.join(TRIMMING[:-1])} or "
                          f"{TRIMMING[-1]}, not {name}; unset it")
    if config.trim is not None and name == "clipped-gossip" and config.clip_radius is not None:
        raise ConfigError(f"trim = {config.trim} sets clipped-gossip's adaptive radius, but clip_radius = "
                          f"{config.clip_radius} fixes it; set one of them")
    if config.clip_radius is not None and name not in CLIPPING:
        raise ConfigError(f"clip_radius = {config.clip_radius} applies to aggregator = clipped-gossip or "
                          f"centered-clipping, not {name}; unset it")
    if name == "centered-clipping" and config.clip_radius is None:
        raise ConfigError("aggregator = centered-clipping needs clip_radius (tau, the radius each update is clipped to "
                          "around the previous aggregate)")


def _check_combinations(config: Config, centralized: bool, accepts: bool, accepting: list[str]) -> None:
    """What Byzantine clients or a robust aggregator cannot run with (module docstring)."""
    what = f"byzantine = {config.byzantine:g}" if config.byzantine else f"aggregator = {config.aggregator}"
    if not accepts:
        raise ConfigError(f"algorithm: {what} runs with {', '.join(accepting)} (they share only their models), not "
                          f"{config.algorithm!r}")
    if config.compressor != "none":
        raise ConfigError(f"compressor = {config.compressor} is not modelled with {what}: use compressor = none")
    if config.mode != "sync":
        raise ConfigError(f"mode = {config.mode} is not modelled with {what}: use mode = sync")
    if config.weights == "column-stochastic":
        raise ConfigError(f"weights = column-stochastic (push-sum) is not modelled with {what}: use a row- or "
                          "doubly stochastic scheme (e.g. metropolis)")
    if centralized and config.aggregator == "krum":
        _check_krum(config)
    if centralized and config.aggregator != "mean" and config.aggregation == "size":
        raise ConfigError(f"aggregation = size weighs the clients by their data, but aggregator = {config.aggregator} "
                          "is unweighted; use aggregation = uniform")


def _check_krum(config: Config) -> None:
    """Krum needs n > 2f + 2 participants (Blanchard et al.): checked here where the round's n is fixed.

    That is with uniform participation (round(f·N), at least 1); Bernoulli rounds are checked as they come.
    """
    fraction = 1.0 if config.participation is None else config.participation
    if (config.participation_mode or "uniform") != "uniform":
        return
    n = max(1, math.floor(fraction * config.clients + 0.5))
    f = config.trim if config.trim is not None else byzantine_count(config.byzantine, config.clients)
    if n <= 2 * f + 2:
        raise ConfigError(f"aggregator = krum with {f} Byzantine inputs (trim, or byzantine) needs more than 2·{f} + 2 "
                          f"= {2 * f + 2} participants per round (Blanchard et al.), got {n}; use fewer Byzantine "
                          "clients, more participants or another aggregator")

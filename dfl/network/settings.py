"""The network's settings and their checks, torch-free so `dfl.validate` answers before torch loads.

Link faults, offline clients and stragglers (`dfl.network.faults`), compressed gossip (`dfl.network.choco`, the
compressors of `dfl.network.compression`) and the asynchronous mode's links and staleness (`dfl.engine.asynchronous`).

`check_config(config, centralized)` is the network's part of `dfl.validate` (`centralized`: the algorithm aggregates
at a server); every check raises `ConfigError` naming the field and the allowed values. The checks that need the
built topology (e.g. a custom directed graph) are where it is built (`dfl.network.run_network.Network`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any

from dfl.config import Config
from dfl.errors import ConfigError
from dfl.registry import Registry
from topologies import limits
from topologies.build import TIME_VARYING

NETWORK_FIELDS = ("link_failure", "offline")  # the per-gossip-step faults
BURST_FIELDS = {"link_failure_burst": "link_failure", "offline_burst": "offline"}  # burst length -> its probability
STATIC_ONLY = tuple(TIME_VARYING)  # built-in time-varying topologies, refused by CHOCO and async (others: when built)

NONE = "none"  # the exact gossip of the run's topology (`dfl.network.gossip.Gossip`), no compressor
QSGD_BITS = (2, 16)  # bits per coordinate: 2 = sign + 1 level bit (s = 1), 16 = sign + 15 (s = 32,767)

MODES = ("sync", "async")
# The algorithms the asynchronous mode runs, and the form of their update: "local" = K local steps, then one mix
# of the trained models; "step" = one SGD step whose gradient is taken at the model sent (AD-PSGD).
ASYNC_ALGORITHMS = {"dpsgd": "step", "dfedavg": "local", "dfedavgm": "local", "dfedsam": "local",
                    "dfedsam-mgs": "local"}
ASYNC_FIELDS = ("link_latency", "link_bandwidth", "max_staleness")  # fields that apply only to mode = async


def check_config(config: Config, centralized: bool) -> None:
    """The network's part of `dfl.validate`: link faults, offline clients and stragglers; compressed gossip.

    The asynchronous mode.
    """
    check_faults(config, centralized)  # link_failure, offline, bursts, stragglers, round_deadline
    check_compression(config, centralized)  # compressor, compression, consensus_lr
    check_async(config, centralized)  # mode, link_latency, link_bandwidth, max_staleness


# ------------------------------------------------------------------------------------------- link faults
def _probability(config: Config, name: str, closed: bool) -> float:
    value = getattr(config, name)
    upper = "1]" if closed else "1)"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or value > 1 or (value == 1 and not closed):
        raise ConfigError(f"{name} must be a probability in [0, {upper}, got {value!r}")
    return float(value)


def _seconds(config: Config, name: str, minimum: float) -> float:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ConfigError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


def faults_field(config: Config) -> str | None:
    """The first of link_failure / offline that is on (> 0), or None: the field a refusal names."""
    return next((name for name in NETWORK_FIELDS if getattr(config, name)), None)


def check_faults(config: Config, centralized: bool) -> None:
    """The network fields of a Config (`dfl.validate`; `centralized`: the algorithm aggregates at a server).

    Ranges, and where link faults cannot apply (the checks that need the built topology, e.g. a custom directed graph,
    are in `Network`).
    """
    for name in NETWORK_FIELDS:
        _probability(config, name, closed=False)
    _check_bursts(config)
    fraction = _probability(config, "stragglers", closed=True)
    slowdown = _seconds(config, "straggler_slowdown", 1.0)
    deadline = _seconds(config, "round_deadline", 0.0)
    slowest = slowdown if fraction > 0 else 1.0
    if 0 < deadline < slowest:
        raise ConfigError(f"round_deadline = {deadline:g} is shorter than one local step of the slowest client "
                          f"({slowest:g} simulated seconds{', straggler_slowdown' if fraction > 0 else ''}): every "
                          f"client must finish a step by the deadline; use 0 (no deadline) or >= {slowest:g}")
    fault = faults_field(config)
    if fault is not None:
        _check_link_faults(config, fault, getattr(config, fault), centralized)


def _check_bursts(config: Config) -> None:
    """The burst lengths of link failures and churn: 0, or a mean outage of at least 1 / (1 - p) steps."""
    for name, of in BURST_FIELDS.items():
        burst, p = getattr(config, name), getattr(config, of)
        if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not math.isfinite(burst) or burst < 0:
            raise ConfigError(f"{name} must be 0 (independent {of} per gossip step) or a mean outage length in gossip "
                              f"steps >= 1 / (1 - {of}), got {burst!r}")
        if burst and not p:
            raise ConfigError(f"{name} = {burst:g} sets the mean length of {of} bursts, but {of} = 0: set {of} > 0 "
                              "(the fraction of steps down), or leave the burst length at 0")
        if burst and burst < 1 / (1 - p):
            raise ConfigError(f"{name} must be 0 (independent) or >= 1 / (1 - {of}) = {1 / (1 - p):.4g} gossip steps "
                              f"(the mean outage of independent draws; longer = burstier), got {burst:g}")


def _check_link_faults(config: Config, name: str, value: Any, centralized: bool) -> None:
    """Refuse link faults (`name` = `value`) where they cannot apply.

    That is with a centralized algorithm, on a directed topology, with weights that failures break, or on a full
    graph too large to draw every link of.
    """
    if centralized:
        raise ConfigError(f"{name} = {value} applies to gossip, not to the centralized {config.algorithm!r}, which "
                          "aggregates at a server every round; for clients that miss rounds use participation "
                          "with participation_mode = bernoulli")
    directed = config.topology == "one-peer-exponential" or (
        config.topology == "exponential" and not config.topology_options.get("symmetric", False))
    if directed:
        hint = " (or topology_options symmetric = true)" if config.topology == "exponential" else ""
        raise ConfigError(f"{name} = {value} needs an undirected topology, but {config.topology} is directed: a "
                          "failed directed link breaks the in/out balance that keeps W doubly stochastic; use ring, "
                          f"grid, exponential with symmetric = true, random-regular, ...{hint}")
    scheme, base = config.weights or "metropolis", config.topology_options.get("base")
    if "uniform" in (scheme, base) or "fastest" in (scheme, base):
        bad = "uniform" if "uniform" in (scheme, base) else "fastest"
        why = ("is doubly stochastic on regular graphs only, and failures make the graph irregular" if bad == "uniform"
               else "optimises W for one graph, and every gossip step has another")
        raise ConfigError(f"weights: {name} = {value} reweights the surviving links of each gossip step with the "
                          f"weight scheme, but {bad} {why}; use metropolis (the default), max-degree or lazy")
    limit = limits.FULL_SPARSE_LIMIT
    if config.topology == "full" and isinstance(config.clients, int) and config.clients > limit:
        raise ConfigError(f"{name} = {value} on full draws all n(n-1)/2 links per gossip step: at most "
                          f"topologies.limits.FULL_SPARSE_LIMIT = {limits.FULL_SPARSE_LIMIT} clients, got "
                          f"clients = {config.clients}; use a sparse topology (e.g. random-regular)")


# --------------------------------------------------------------------------------------------- compressors
def fraction(name: str, value: Any) -> float:
    """top-k and random-k: `compression` is the fraction of coordinates kept, in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= 1:
        raise ConfigError(f"compression must be the fraction of coordinates kept, in (0, 1], for compressor = {name};"
                          f" got {value!r}")
    return float(value)


def qsgd_bits(value: Any) -> int:
    """qsgd: `compression` is the bits per coordinate, sign included, an integer in `QSGD_BITS`."""
    lo, hi = QSGD_BITS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or not lo <= value <= hi:
        raise ConfigError(f"compression must be the bits per coordinate (sign included), an integer in [{lo}, "
                          f"{hi}], for compressor = qsgd; got {value!r}")
    return int(value)


@dataclass(frozen=True)
class CompressorCard:
    """What validation reads of a compressor: `compression`'s default and its check (ValueError naming the field).

    A compressor class answers both itself (`dfl.network.compression.Compressor`).
    """

    default: float
    check: Any


# the compressors (`dfl.network.compression`, which imports torch) are declared by card
COMPRESSORS: Registry = Registry("compressor")
COMPRESSORS.declare("top-k", "dfl.network.compression:TopK", CompressorCard(0.1, functools.partial(fraction, "top-k")))
COMPRESSORS.declare("random-k", "dfl.network.compression:RandomK",
                    CompressorCard(0.1, functools.partial(fraction, "random-k")))
COMPRESSORS.declare("qsgd", "dfl.network.compression:QSGD", CompressorCard(8, qsgd_bits))


def check_compression(config: Config, centralized: bool) -> None:
    """Check a Config's compressed-gossip fields.

    compressor, compression and consensus_lr of a Config (`dfl.validate`; `centralized`: the algorithm
    aggregates at a server): ConfigError naming the field.
    """
    name = config.compressor
    names = (NONE, *COMPRESSORS.names())
    if name not in names:
        raise ConfigError(f"compressor must be one of {', '.join(names)}; got {name!r}")
    if name == NONE:
        for field in ("compression", "consensus_lr"):
            if getattr(config, field) is not None:
                raise ConfigError(f"{field} = {getattr(config, field)} applies to compressed gossip, but compressor "
                                  f"= none (exact gossip); set compressor = top-k, random-k or qsgd, or unset {field}")
        return
    if config.compression is not None:
        try:
            COMPRESSORS.card(name).check(config.compression)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    gamma = config.consensus_lr
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, float))
                              or not math.isfinite(gamma) or not 0 < gamma <= 1):
        raise ConfigError(f"consensus_lr must be CHOCO's consensus step size gamma in (0, 1], got {gamma!r}")
    if centralized:
        raise ConfigError(f"compressor = {name} compresses gossip, but {config.algorithm!r} is centralized (it "
                          "aggregates at a server and does not gossip); use a decentralized algorithm (dpsgd, "
                          "dfedavg, dfedavgm, dfedsam, dfedsam-mgs)")
    if config.topology in STATIC_ONLY:
        check_topology(name, config.topology, True)


def check_topology(name: str, topology_name: str, time_varying: bool) -> None:
    """Refuse compressed gossip on a time-varying topology (CHOCO keeps public copies at fixed neighbours)."""
    if time_varying:
        raise ConfigError(f"compressor = {name} needs a static topology, but {topology_name} changes every gossip "
                          "step: CHOCO keeps each client's public copy at its neighbours, so they must stay the same "
                          "(use ring, grid, exponential, random-regular, ...)")


# ------------------------------------------------------------------------------------------ asynchronous
def check_async(config: Config, centralized: bool) -> None:
    """Check a Config's `mode` and asynchronous fields.

    `mode` and the asynchronous fields of a Config (`dfl.validate`; `centralized`: the algorithm aggregates at a
    server): ranges, and what async cannot run.
    """
    if config.mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}; got {config.mode!r}")
    for name in ("link_latency", "link_bandwidth"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0{' (0 = unlimited)' if 'band' in name else ''}, "
                              f"got {value!r}")
    staleness = config.max_staleness
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < -1:
        raise ConfigError(f"max_staleness must be an integer >= 0, or -1 for unbounded, got {staleness!r}")
    if config.mode == "sync":
        defaults = {f.name: f.default for f in fields(config) if f.name in ASYNC_FIELDS}
        for name, default in defaults.items():
            if getattr(config, name) != default:
                raise ConfigError(f"{name} = {getattr(config, name)!r} applies only to mode = async (the "
                                  f"synchronous rounds' sim_time counts computation only); set mode = \"async\" "
                                  f"or remove it (default {default!r})")
        return
    algorithm = config.algorithm
    if centralized:
        raise ConfigError(f"mode = async applies to gossip, not to the centralized {algorithm!r}, which waits for "
                          f"its clients at a server every round; use one of {', '.join(ASYNC_ALGORITHMS)}")
    if algorithm not in ASYNC_ALGORITHMS:
        raise ConfigError(f"algorithm: mode = async runs {', '.join(ASYNC_ALGORITHMS)}, not {algorithm!r} (an "
                          "asynchronous update needs the algorithm's rule for one client at a time)")
    if algorithm == "dfedsam-mgs" and (config.gossip_steps or 4) != 1:
        raise ConfigError(f"gossip_steps = {config.gossip_steps or 4} (dfedsam-mgs): mode = async mixes once per "
                          "update, with the neighbour models that have arrived; set gossip_steps = 1, or use "
                          "algorithm = dfedsam")
    for name in ("link_failure", "offline", "round_deadline"):
        if getattr(config, name):
            what = "rounds to cut short" if name == "round_deadline" else "lost messages"
            raise ConfigError(f"{name} = {getattr(config, name)} applies to mode = sync: the asynchronous mode has "
                              f"no {what} (a slow link is link_latency / link_bandwidth); set it to 0")
    if config.local_optimizer != "sgd":
        raise ConfigError(f"local_optimizer = {config.local_optimizer} is not supported with mode = async, which "
                          "updates one client at a time with SGD steps; use local_optimizer = sgd")
    if config.topology in STATIC_ONLY:
        raise ConfigError(f"topology: mode = async needs a static topology, but {config.topology} changes every "
                          "gossip step (an asynchronous client has no global step); use e.g. ring, exponential, "
                          "random-regular")

"""The network's settings and their checks, torch-free so `dfl.validate` answers before torch loads.

Link faults, offline clients and stragglers (`dfl.network.faults`), compressed gossip (`dfl.network.choco`, the
compressors of `dfl.network.compression`) and the asynchronous mode's links and staleness (`dfl.engine.asynchronous`).

`check_config(config)` is the network's part of `dfl.validate`: each of these settings on its own and the rules
between them; every check raises `ConfigError` naming the field and the allowed values. What they combine with (the
algorithm, the topology, the weights, the mode, push-sum, Byzantine clients) is `dfl.engine.combinations`'s; the
checks that need the built topology (e.g. a custom directed graph) are where it is built
(`dfl.network.run_network.Network`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, fields
from typing import Any

from dfl.config import Config
from dfl.errors import ConfigError
from dfl.registry import Registry

NETWORK_FIELDS = ("link_failure", "offline")  # the per-gossip-step faults
BURST_FIELDS = {"link_failure_burst": "link_failure", "offline_burst": "offline"}  # burst length -> its probability

NONE = "none"  # the exact gossip of the run's topology (`dfl.network.gossip.Gossip`), no compressor
QSGD_BITS = (2, 16)  # bits per coordinate: 2 = sign + 1 level bit (s = 1), 16 = sign + 15 (s = 32,767)

MODES = ("sync", "async")
ASYNC_FIELDS = ("link_latency", "link_bandwidth", "max_staleness")  # fields that apply only to mode = async


def check_config(config: Config) -> None:
    """The network's part of `dfl.validate`: link faults, offline clients and stragglers; compressed gossip.

    The asynchronous mode's fields.
    """
    check_faults(config)  # link_failure, offline, bursts, stragglers, round_deadline
    check_compression(config)  # compressor, compression, consensus_lr
    check_async(config)  # mode, link_latency, link_bandwidth, max_staleness


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


def check_faults(config: Config) -> None:
    """The network fields of a Config on their own (`dfl.validate`): ranges, bursts, the deadline.

    Where link faults cannot apply (a centralized algorithm, a directed graph, weights that failures break) is
    `dfl.engine.combinations`'s; what needs the built topology (a custom directed graph) is `Network`'s.
    """
    for name in NETWORK_FIELDS:
        _probability(config, name, closed=False)
    _check_bursts(config)
    fraction = _probability(config, "stragglers", closed=True)
    slowdown = _seconds(config, "straggler_slowdown", 1.0)
    deadline = _seconds(config, "round_deadline", 0.0)
    default = next(f.default for f in dataclasses.fields(Config) if f.name == "straggler_slowdown")
    if not fraction and slowdown != default:  # nothing reads it: refused, never ignored
        raise ConfigError(f"straggler_slowdown = {slowdown:g} sets how many times slower a straggler's steps are, but "
                          f"stragglers = 0: set stragglers > 0 (the fraction of slow clients per round), or leave "
                          f"straggler_slowdown at its default {default:g}")
    slowest = slowdown if fraction > 0 else 1.0
    if 0 < deadline < slowest:
        raise ConfigError(f"round_deadline = {deadline:g} is shorter than one local step of the slowest client "
                          f"({slowest:g} simulated seconds{', straggler_slowdown' if fraction > 0 else ''}): every "
                          f"client must finish a step by the deadline; use 0 (no deadline) or >= {slowest:g}")


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


def check_compression(config: Config) -> None:
    """Check a Config's compressed-gossip fields: compressor, compression and consensus_lr (ConfigError naming one).

    What compressed gossip runs with (the algorithm, a static topology, mode = sync) is `dfl.engine.combinations`'s.
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


def static_refusal(compressor: str, topology: str) -> str:
    """Why compressed gossip refuses a time-varying topology: one line (`dfl.engine.combinations`, `check_topology`)."""
    return (f"compressor = {compressor} needs a static topology, but {topology} changes every gossip step: CHOCO keeps "
            "each client's public copy at its neighbours, so they must stay the same (use ring, grid, exponential, "
            "random-regular, ...)")


def check_topology(compressor: str, topology: str, time_varying: bool) -> None:
    """Refuse compressed gossip on a built topology that is time-varying (a registered factory's, known once built)."""
    if time_varying:
        raise ConfigError(static_refusal(compressor, topology))


# ------------------------------------------------------------------------------------------ asynchronous
def check_async(config: Config) -> None:
    """Check a Config's `mode` and asynchronous fields: their ranges, and the asynchronous fields only in mode = async.

    What the asynchronous mode runs (the algorithms whose card has an asynchronous form, a static topology, SGD, no
    link faults) is `dfl.engine.combinations`'s.
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

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

import math
from dataclasses import dataclass, fields
from typing import Any

from dfl.config import Config
from dfl.errors import ConfigError, RegistryError
from dfl.registry import Registry
from dfl.specs import Param, Spec, param

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
    default = next(f.default for f in fields(Config) if f.name == "straggler_slowdown")
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
@dataclass(frozen=True)
class FractionKept(Spec):
    """The option of top-k and random-k: the fraction of each client's coordinates a message keeps."""

    compression: float = param(0.1, "the fraction of coordinates kept", interval="(0, 1]")


@dataclass(frozen=True)
class QsgdBits(Spec):
    """The option of qsgd: the bits per coordinate of a message, sign included."""

    compression: int = param(8, "the bits per coordinate (sign included)", interval=f"[{QSGD_BITS[0]}, {QSGD_BITS[1]}]")


@dataclass(frozen=True)
class CompressorCard:
    """What validation, `dfl list compressors` and the options page read of a compressor, torch-free.

    Its class (`dfl.network.compression.Compressor`) binds it as `card` and restates none of it.

    Args:
        name: the compressor's name (the config field `compressor`).
        option: the Spec whose one field `compression` says what the config field `compression` means for it:
            type, default, allowed range, one line of help (`FractionKept`, `QsgdBits`).
        unbiased: E[Q(x)] = x. CHOCO takes biased compressors too: its condition is a contraction,
            E‖Q(x) − x‖² ≤ (1 − ω)‖x‖² (`dfl.network.compression`).
        omega: ω of that contraction in words: the default of the config field `consensus_lr`.
        sends: what one message carries, in bytes (`Compressor.message_bytes` counts it).
    """

    name: str
    option: type[Spec]
    unbiased: bool
    omega: str
    sends: str

    def __post_init__(self) -> None:
        if tuple(self.option.defaults()) != ("compression",):
            raise TypeError(f"compressor {self.name!r}: its option spec must declare one field, compression, got "
                            f"{', '.join(self.option.defaults()) or 'none'}")

    @property
    def param(self) -> Param:
        """The spec of `compression` for this compressor (`dfl.specs.Param`)."""
        return self.option.specs()[0]

    @property
    def default(self) -> Any:
        """`compression` when unset."""
        return self.param.default

    def check(self, value: Any) -> float | int:
        """The value of `compression`, or ValueError naming the field, this compressor and the allowed values.

        A finite number (an integer for an `int` option) inside the option's interval.
        """
        spec = self.param
        integer = spec.type == "int"
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        try:
            if not number or (integer and value != int(value)):
                raise ValueError(value)
            spec.check(value, "compression")
        except ValueError:
            raise ValueError(f"compression must be {spec.help}, {'an integer ' if integer else ''}{spec.allowed}, for "
                             f"compressor = {self.name}; got {value!r}") from None
        return int(value) if integer else float(value)


def _compressor_card(name: str, obj: Any) -> CompressorCard:
    """The card of a registered compressor class: its `card` attribute (`Registry.card` of a plug-in)."""
    return obj.card


def _check_compressor(name: str, obj: Any) -> None:
    """A compressor class binds a `CompressorCard` named like its registry entry (what `dfl.validate` reads)."""
    card = getattr(obj, "card", None)
    if not isinstance(card, CompressorCard) or card.name != name:
        raise RegistryError(f"compressor {name!r} must be a class with `card = CompressorCard({name!r}, ...)` "
                            f"(dfl.network.settings: its option spec and what it is); got {type(obj).__name__} "
                            f"{getattr(obj, '__name__', obj)!r} with card {card!r}")


CARDS: dict[str, CompressorCard] = {card.name: card for card in (
    CompressorCard("top-k", FractionKept, unbiased=False, omega="k/d (the fraction kept)",
                   sends="k·(4 + itemsize) bytes: an int32 index and a value per kept coordinate"),
    CompressorCard("random-k", FractionKept, unbiased=False, omega="k/d (the fraction kept; rand_k unscaled)",
                   sends="k·itemsize bytes: the values only (the receivers draw the indices from the seed)"),
    CompressorCard("qsgd", QsgdBits, unbiased=False,
                   omega="1/τ, τ = 1 + min(d/s², √d/s), s = 2^(b−1) − 1 (QSGD's unbiased quantizer divided by τ)",
                   sends="⌈d·b/8⌉ + itemsize bytes: b bits per coordinate, packed, and the norm"),
)}
"""The built-in compressors' cards, in `COMPRESSORS` order."""

# the compressors (`dfl.network.compression`, which imports torch) are declared by card; a plug-in registers its
# class (in code, or an installed package's entry point in group `dfl.compressors`), which binds its own
# `CompressorCard` (`_check_compressor`)
COMPRESSORS: Registry = Registry("compressor", group="dfl.compressors", check=_check_compressor,
                                 describe=_compressor_card)
COMPRESSORS.declare("top-k", "dfl.network.compression:TopK", CARDS["top-k"])
COMPRESSORS.declare("random-k", "dfl.network.compression:RandomK", CARDS["random-k"])
COMPRESSORS.declare("qsgd", "dfl.network.compression:QSGD", CARDS["qsgd"])


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
                                  f"= none (exact gossip); set compressor = {_either(COMPRESSORS.names())}, or unset "
                                  f"{field}")
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


def _either(names: tuple[str, ...]) -> str:
    """"a, b or c"."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1])))


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

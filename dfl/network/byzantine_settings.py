"""Byzantine clients' attacks and the robust aggregators: their registries, their cards and the checks of their fields.

Torch-free, so `dfl.validate` answers before torch loads; the threat itself (who is Byzantine, what the attacks send,
how each rule aggregates) is `dfl.network.byzantine` and `dfl.network.robust`.

`ATTACKS` and `AGGREGATORS` are registries like the others (`dfl.registry.Registry`): the built-ins are declared by
card (an `AttackCard`, an `AggregatorCard`: what the checks and the rules between features read), and a plug-in
registers a class with its card (`@ATTACKS.register("name")`, or the entry-point groups `dfl.attacks` and
`dfl.aggregators`). An attack's class forges the Byzantine messages (`dfl.network.byzantine.Attack`); an
aggregator's class combines a receiver's neighbourhood, or the server's participants (`dfl.network.robust.Aggregator`).

`byzantine`, `attack_scale`, `trim` and `clip_radius` on their own are checked by `Config.validate` (type, range); here
are the rules between them, which the component owns:

- `byzantine` is a count (>= 1, an integer) or a fraction in (0, 1) of the clients (rounded to the nearest count, at
  least 1); at least one client stays honest. With byzantine > 0 an `attack` is needed; `attack` and `attack_scale`
  with byzantine = 0 are refused (a field set while it has no effect is an error).
- `trim` only for the aggregators whose card reads it, `clip_radius` only for those whose card reads it (and required
  where the card says so). A robust aggregator without Byzantine clients is allowed: it measures what robustness costs.

What Byzantine clients and the aggregators combine with (the algorithms that share only their models, a server's rules
or a receiver's, compressed gossip, the asynchronous mode, push-sum, a signed W, the size of a neighbourhood, one
process) is `dfl.engine.combinations`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from dfl.config import Config
from dfl.errors import ConfigError, RegistryError
from dfl.registry import Registry

FIELDS = ("byzantine", "attack", "attack_scale", "aggregator", "trim", "clip_radius")


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


# ------------------------------------------------------------------------------------------------ the cards
@dataclass(frozen=True)
class AttackCard:
    """What is known of an attack before its module (and torch) is imported.

    Attributes:
        scale: its strength s when `attack_scale` is unset: a number, or `scale(clients, byzantine)` (alie's z_max).
        spread: it reads the honest messages' coordinate-wise standard deviation σ_H besides their mean.
        start: it reads each Byzantine client's x^start, its model after the previous gossip (a per-client state
            the checkpoint keeps).
    """

    scale: float | Callable[[int, int], float]
    spread: bool = False
    start: bool = False

    def default_scale(self, clients: int, byzantine: int) -> float:
        """The strength s when `attack_scale` is unset, for `byzantine` of `clients` clients."""
        return self.scale(clients, byzantine) if callable(self.scale) else float(self.scale)


@dataclass(frozen=True)
class AggregatorCard:
    """What is known of an aggregator before its module (and torch) is imported.

    Attributes:
        gossip: a rule each receiver of a decentralized algorithm applies over its in-neighbours and itself.
        server: a rule the server of a centralized algorithm applies over the round's participants.
        robust: anything but the plain weighted mean: it reads each receiver's whole neighbourhood (explicit
            neighbour lists), weighs a neighbour by W's entries assuming W >= 0, and is unweighted at a server.
        trim: reads `trim` (b): "yes", "adaptive" (b sets the radius when clip_radius is unset), or "no".
        clip_radius: reads `clip_radius`: "required", "optional" or "no".
        coordinatewise: sorts each coordinate of a neighbourhood (its memory per receiver grows with the degree).
        participants: `participants(f)`, the fewest participants a round needs with f Byzantine inputs (krum's
            2f + 3), or None.
        center: keeps the previous aggregate between rounds (centered-clipping's v: server state).
    """

    gossip: bool
    server: bool
    robust: bool = True
    trim: str = "no"
    clip_radius: str = "no"
    coordinatewise: bool = False
    participants: Callable[[int], int] | None = None
    center: bool = False


def _krum_participants(byzantine: int) -> int:
    return 2 * byzantine + 3  # n > 2f + 2 (Blanchard et al.)


def _card_check(kind: str, card_class: type) -> Callable[[str, Any], None]:
    """The registry's check of a class registered as `kind` (in code or by entry point): it binds a `card_class`."""
    def check(name: str, cls: Any) -> None:
        if not isinstance(getattr(cls, "card", None), card_class):
            raise RegistryError(f"{kind} {name!r} must be a class with `card = {card_class.__name__}(...)` "
                                f"(dfl.network.byzantine_settings: what validation reads of it); got "
                                f"{type(cls).__name__} {getattr(cls, '__name__', cls)!r} with card "
                                f"{getattr(cls, 'card', None)!r}")
    return check


ATTACKS: Registry = Registry("attack", group="dfl.attacks", check=_card_check("attack", AttackCard),
                             describe=lambda name, cls: cls.card)
"""What the Byzantine clients send (`attack`): name -> `dfl.network.byzantine.Attack` class; cards readable without
torch (`ATTACKS.card(name)`)."""
for _name, _target, _card in (
        ("sign-flip", "SignFlip", AttackCard(1.0, start=True)),
        ("gaussian", "Gaussian", AttackCard(1.0)),
        ("alie", "ALIE", AttackCard(alie_z, spread=True)),
        ("ipm", "IPM", AttackCard(0.1))):
    ATTACKS.declare(_name, f"dfl.network.byzantine:{_target}", _card)

AGGREGATORS: Registry = Registry("aggregator", group="dfl.aggregators", check=_card_check("aggregator", AggregatorCard),
                                 describe=lambda name, cls: cls.card)
"""How a receiver (decentralized) or the server (centralized) combines the models it receives (`aggregator`):
name -> `dfl.network.robust.Aggregator` class; cards readable without torch (`AGGREGATORS.card(name)`)."""
for _name, _target, _aggregator in (
        ("mean", "Mean", AggregatorCard(True, True, robust=False)),
        ("clipped-gossip", "ClippedGossip", AggregatorCard(True, False, trim="adaptive", clip_radius="optional")),
        ("trimmed-mean", "TrimmedMean", AggregatorCard(True, True, trim="yes", coordinatewise=True)),
        ("bridge-trimmed-mean", "BridgeTrimmedMean", AggregatorCard(True, False, trim="yes", coordinatewise=True)),
        ("median", "Median", AggregatorCard(True, True, coordinatewise=True)),
        ("krum", "Krum", AggregatorCard(False, True, trim="yes", participants=_krum_participants)),
        ("centered-clipping", "CenteredClipping", AggregatorCard(False, True, clip_radius="required", center=True))):
    AGGREGATORS.declare(_name, f"dfl.network.robust:{_target}", _aggregator)
del _name, _target, _card, _aggregator


def aggregators(where: str) -> list[str]:
    """The registered aggregators of the decentralized algorithms (`where` = "gossip") or of a server ("server")."""
    return [name for name in AGGREGATORS.names() if getattr(AGGREGATORS.card(name), where)]


def threatened(config: Config) -> bool:
    """Whether `config` asks for Byzantine clients or a robust aggregator (anything but the plain mean)."""
    return bool(config.byzantine) or AGGREGATORS.card(config.aggregator, "aggregator").robust


# ------------------------------------------------------------------------------------------------ the checks
def check_config(config: Config) -> None:
    """The Byzantine part of `dfl.validate`: the threat's own fields (module docstring).

    ConfigError, one line naming the field and the allowed values. `config`: the run's `Config` (its fields already
    checked on their own by `Config.validate`).
    """
    count = byzantine_count(config.byzantine, config.clients)
    if count >= config.clients:
        raise ConfigError(f"byzantine = {config.byzantine:g} leaves no honest client among clients = {config.clients}; "
                          "use fewer")
    if config.attack is not None:
        ATTACKS.card(config.attack, "attack")  # a registered name (or the one meant)
    if count == 0:
        for name in ("attack", "attack_scale"):
            if getattr(config, name) is not None:
                raise ConfigError(f"{name} = {getattr(config, name)!r} applies to Byzantine clients, but byzantine = "
                                  "0; set byzantine (a count or a fraction of the clients), or unset it")
    elif config.attack is None:
        raise ConfigError(f"byzantine = {config.byzantine:g} needs attack: one of {', '.join(ATTACKS.names())}")
    elif config.attack_scale is None:
        ATTACKS.card(config.attack).default_scale(config.clients, count)  # alie's z_max may be undefined
    _check_aggregator(config)


def _check_aggregator(config: Config) -> None:
    """`trim` and `clip_radius` only where the aggregator's card reads them."""
    name = config.aggregator
    card = AGGREGATORS.card(name, "aggregator")
    trimming = [n for n in AGGREGATORS.names() if AGGREGATORS.card(n).trim != "no"]
    clipping = [n for n in AGGREGATORS.names() if AGGREGATORS.card(n).clip_radius != "no"]
    if config.trim is not None and card.trim == "no":
        raise ConfigError(f"trim = {config.trim} applies to aggregator = {', '.join(trimming[:-1])} or "
                          f"{trimming[-1]}, not {name}; unset it")
    if config.trim is not None and card.trim == "adaptive" and config.clip_radius is not None:
        raise ConfigError(f"trim = {config.trim} sets {name}'s adaptive radius, but clip_radius = "
                          f"{config.clip_radius} fixes it; set one of them")
    if config.clip_radius is not None and card.clip_radius == "no":
        raise ConfigError(f"clip_radius = {config.clip_radius} applies to aggregator = {' or '.join(clipping)}, not "
                          f"{name}; unset it")
    if card.clip_radius == "required" and config.clip_radius is None:
        raise ConfigError(f"aggregator = {name} needs clip_radius (tau, the radius each update is clipped to "
                          "around the previous aggregate)")

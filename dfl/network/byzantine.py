"""Byzantine clients: who they are, what they send, and gossip that aggregates robustly (`ByzantineGossip`).

Threat model (as in the papers of each attack): a fixed set B of Byzantine clients, drawn once from the seed
(`byzantine_clients`; `summary.json` records it). The attacker is omniscient: it knows every honest client's message
of the current gossip step (or round, at a server) and colludes across B. A Byzantine client sends the same message to
every neighbour it has in that step (it cannot send different messages to different receivers). It cannot change an
honest client's state or the messages between honest clients. Between its messages it holds the mean of the honest
models (its best view of the consensus) and trains from it on its own data like an honest client, so "its update" is
an honest-looking local update.

Attacks (each gossip step for the decentralized algorithms, on the models; each round at the server, on the updates
Δ = y − x, where the "start" below is 0). s = `attack_scale`; μ_H and σ_H are the coordinate-wise mean and standard
deviation (n_H − 1 in the denominator) of the honest messages of the step:
- sign-flip: z_b = x_b^start − s (y_b − x_b^start), its local update reversed and scaled (x^start: its model after the
  previous gossip, y: the model it trained; at the server −s Δ_b). Bit/sign flipping as in He, Karimireddy & Jaggi
  2022 and Karimireddy et al. 2021, taken on the update so that s = 1 sends the opposite step;
- gaussian: z_b = x_b^start + s ξ, ξ ~ N(0, I) drawn per step and client from the seed: the update replaced by Gaussian
  noise, as the Gaussian Byzantine of Blanchard et al. (NeurIPS 2017) replaces the gradient (s = 1 by default);
- alie: z_b = μ_H − z σ_H (Baruch, Baruch & Goldberg, "A Little Is Enough", NeurIPS 2019), z = s or, unset, their
  z_max = Φ⁻¹((n − f − s')/(n − f)) with s' = ⌊n/2 + 1⌋ − f (`dfl.network.byzantine_settings.alie_z`; n clients, f
  Byzantine, over the whole population);
- ipm: z_b = −ε μ_H (Xie, Koyejo & Gupta, "Fall of Empires: inner product manipulation", UAI 2019; on models as in
  He et al.'s decentralized adaptation), ε = s (unset 0.1, their decentralized default).
All Byzantine clients send the same message for alie and ipm; sign-flip and gaussian are per client. Each attack is a
class (`Attack`) registered with its card in `dfl.network.byzantine_settings.ATTACKS`; a plug-in adds one the same way.

Robust gossip (`ByzantineGossip.mix`): each step the Byzantine rows of the stack are replaced by their messages, each
receiver combines its neighbourhood with `aggregator` (`dfl.network.robust`: mean = the topology's gossip itself,
clipped-gossip, trimmed-mean, bridge-trimmed-mean, median; registered in `AGGREGATORS`), then the Byzantine rows are set
to the new honest mean.
A multi-process run is refused here: the attacker and the neighbourhood gathers read every client's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from dfl.config import Config
from dfl.errors import ConfigError
from dfl.network import robust
from dfl.network.byzantine_settings import AGGREGATORS, ATTACKS, AttackCard, byzantine_count, threatened

STREAM_CHOICE, STREAM_NOISE = 0x42595A, 0x4E4F4953  # seeds of the Byzantine set and of the gaussian attack's noise
STATE_KEY = "byzantine_start"  # checkpoint key of x^start (sign-flip): `ByzantineGossip.client_state`


def byzantine_clients(seed: int, clients: int, count: int) -> np.ndarray:
    """The [clients] bool mask of the Byzantine set: `count` clients drawn without replacement from the seed alone."""
    mask = np.zeros(clients, dtype=bool)
    if count:
        rng = np.random.default_rng(np.random.SeedSequence([seed, STREAM_CHOICE]))
        mask[rng.choice(clients, size=count, replace=False)] = True
    return mask


@dataclass(frozen=True)
class Threat:
    """A run's Byzantine clients, their attack and the robust aggregator (module docstring)."""

    byzantine: np.ndarray  # [m] bool
    attack: str | None
    scale: float | None  # resolved: the attack's strength (None without attack)
    aggregator: str
    trim: int | None  # None: the most Byzantine inputs a receiver has
    clip_radius: float | None
    seed: int

    @classmethod
    def of(cls, config: Config, clients: int) -> Threat | None:
        """The threat of a (validated) config, or None when it has no Byzantine clients and aggregates by the mean."""
        return cls.from_config(config, clients) if threatened(config) else None

    @classmethod
    def from_config(cls, config: Config, clients: int) -> Threat:
        """The threat a (validated) config describes, for `clients` clients."""
        count = byzantine_count(config.byzantine, clients)
        scale = None
        if count:
            scale = config.attack_scale if config.attack_scale is not None else \
                ATTACKS.card(config.attack).default_scale(clients, count)
        return cls(byzantine_clients(config.seed, clients, count), config.attack if count else None, scale,
                   config.aggregator, config.trim, config.clip_radius, int(config.seed))

    @property
    def active(self) -> bool:
        """Whether anything differs from plain gossip / averaging (Byzantine clients, or a robust aggregator)."""
        return bool(self.byzantine.any()) or AGGREGATORS.card(self.aggregator).robust

    @property
    def attack_card(self) -> AttackCard | None:
        """The card of the attack (None without Byzantine clients)."""
        return None if self.attack is None else ATTACKS.card(self.attack)

    @property
    def honest(self) -> np.ndarray:
        """The [m] bool mask of the honest clients."""
        return ~self.byzantine

    def describe(self) -> dict[str, Any]:
        """summary.json's entries: the Byzantine clients, how many are honest, the attack and the aggregator."""
        return {"byzantine_clients": np.flatnonzero(self.byzantine).tolist(), "honest_clients": int(self.honest.sum()),
                "attack": self.attack, "attack_scale": self.scale, "aggregator": self.aggregator}

    def noise(self, step: int, rows: int, d: int, like: torch.Tensor) -> torch.Tensor:
        """ξ [rows, d] ~ N(0, I) of the gaussian attack at `step` (a gossip step, or a round at the server)."""
        state = np.random.SeedSequence([self.seed, step, STREAM_NOISE]).generate_state(1, np.uint64)[0]
        generator = torch.Generator(device=like.device).manual_seed(int(state >> np.uint64(1)))
        return torch.randn((rows, d), generator=generator, dtype=like.dtype, device=like.device)

    def forge(self, own: torch.Tensor, start: torch.Tensor | None, mean: torch.Tensor, std: torch.Tensor | None,
              step: int) -> torch.Tensor:
        """The Byzantine messages [b, d] (module docstring).

        `own`: the Byzantine rows' current models (updates at the server); `start`: x^start (None = 0, at the
        server); `mean`, `std`: μ_H and σ_H of the honest messages (std only for alie).
        """
        if self.attack is None:
            raise ValueError("no attack: this threat has no Byzantine clients")
        return ATTACKS.get(self.attack)().forge(self, own, start, mean, std, step)


class Attack:
    """An attack: what the Byzantine clients send (`forge`), and its card (`AttackCard`).

    A plug-in subclasses it, sets `card` and registers the class: `@dfl.network.byzantine_settings.ATTACKS.register(
    "name")`. `forge` sees the omniscient attacker's view of the step (module docstring).
    """

    card: ClassVar[AttackCard]

    def forge(self, threat: Threat, own: torch.Tensor, start: torch.Tensor | None, mean: torch.Tensor,
              std: torch.Tensor | None, step: int) -> torch.Tensor:
        """The Byzantine messages [b, d].

        Args:
            threat: the run's threat (`threat.scale`: the strength s; `threat.noise`: seeded draws).
            own: the Byzantine rows' current models (their updates, at a server).
            start: their x^start (None: 0, at a server; given when the card's `start` is set).
            mean: μ_H, the honest messages' mean [d].
            std: σ_H, their standard deviation [d] (when the card's `spread` is set; else None).
            step: the gossip step (a round, at a server).
        """
        raise NotImplementedError


class SignFlip(Attack):
    """sign-flip: the local update reversed and scaled, z_b = x_b^start − s (y_b − x_b^start) (−s Δ_b at a server)."""

    card = ATTACKS.card("sign-flip")

    def forge(self, threat, own, start, mean, std, step):
        """z_b = x_b^start − s (y_b − x_b^start), or −s Δ_b at a server."""
        s = float(threat.scale)  # type: ignore[arg-type]  # set whenever there is an attack
        return -s * own if start is None else start - s * (own - start)


class Gaussian(Attack):
    """gaussian: the update replaced by noise, z_b = x_b^start + s ξ, ξ ~ N(0, I) drawn from the seed."""

    card = ATTACKS.card("gaussian")

    def forge(self, threat, own, start, mean, std, step):
        """z_b = x_b^start + s ξ (s ξ at a server)."""
        s = float(threat.scale)  # type: ignore[arg-type]
        noise = threat.noise(step, own.shape[0], own.shape[1], own)
        return s * noise if start is None else start + s * noise


class ALIE(Attack):
    """alie ("A Little Is Enough"): z_b = μ_H − z σ_H, the same for every Byzantine client."""

    card = ATTACKS.card("alie")

    def forge(self, threat, own, start, mean, std, step):
        """z_b = μ_H − z σ_H."""
        assert std is not None, "alie needs the honest standard deviation"
        return (mean - float(threat.scale) * std).expand_as(own).clone()  # type: ignore[arg-type]


class IPM(Attack):
    """ipm (inner product manipulation): z_b = −ε μ_H, the same for every Byzantine client."""

    card = ATTACKS.card("ipm")

    def forge(self, threat, own, start, mean, std, step):
        """z_b = −ε μ_H."""
        return (-float(threat.scale) * mean).expand_as(own).clone()  # type: ignore[arg-type]


def honest_moments(X: torch.Tensor, honest: torch.Tensor, count: int,
                   std: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(μ_H, σ_H) of the rows of X that `honest` ([m] 0/1 in X's dtype) marks, block by block (no [m, d] copy).

    σ_H divides by count − 1 (0 with one honest row); None unless `std`.
    """
    mean = (honest @ X) / count
    if not std:
        return mean, None
    var = torch.zeros_like(mean)
    for rows in robust_row_blocks(X):
        var += honest[rows] @ (X[rows] - mean) ** 2
    return mean, (var / max(count - 1, 1)).sqrt()


def robust_row_blocks(X: torch.Tensor):
    """Slices of X's rows whose [rows, d] temporaries stay under the CPU block budget."""
    return robust.row_slices(X.shape[0], max(1, robust.BLOCK_BYTES["cpu"] // max(1, X.shape[1] * X.element_size())))


class ByzantineGossip:
    """Gossip with Byzantine clients and a robust aggregator over `inner` (a `dfl.network.gossip.Gossip`).

    The `Mixer` of `ctx.gossip` (module docstring): `mix` replaces the Byzantine rows by their messages and
    aggregates each step; `sends` and `message_bytes` are the inner gossip's (a Byzantine client sends one model-sized
    message to each neighbour too). `start`: X_0, the Byzantine clients' first x^start.
    """

    def __init__(self, inner, threat: Threat, start: torch.Tensor):
        hosted, clients = len(inner.comm.client_ids), inner.comm.num_clients
        if hosted < clients:  # a torchrun world of several processes: each holds its own block of rows
            raise ConfigError(f"byzantine = {int(threat.byzantine.sum())}, aggregator = {threat.aggregator}: this "
                              f"process hosts {hosted} of the {clients} clients (a torchrun world of several "
                              "processes), which is not supported: the attacker and the robust rules read every "
                              "client's row; run in one process")
        if inner.topology.stochastic == "column":
            raise ConfigError("weights = column-stochastic (push-sum) is not modelled with Byzantine clients or a "
                              "robust aggregator: use a row- or doubly stochastic scheme (e.g. metropolis)")
        self.inner, self.threat = inner, threat
        self.topology, self.comm = inner.topology, inner.comm
        device, dtype = start.device, start.dtype
        self.bad = torch.as_tensor(np.flatnonzero(threat.byzantine), device=device)
        self.honest = torch.as_tensor(threat.honest, dtype=dtype, device=device)
        self.honest_count = int(threat.honest.sum())
        attack = threat.attack_card
        self.spread = attack is not None and attack.spread  # the attack reads σ_H
        self.start = start[self.bad].clone() if attack is not None and attack.start else None
        self.dim = start.shape[1]
        self._hoods: dict[int, tuple[robust.Neighbourhoods, int, int]] = {}
        self.rule = AGGREGATORS.get(threat.aggregator)()
        if self.rule.card.robust:
            self.neighbourhoods(0, dtype, device)  # a neighbourhood too large to aggregate is refused before round 1

    def neighbourhoods(self, step: int, dtype: torch.dtype, device: torch.device):
        """(tables, b, receivers per block) of gossip step `step` (cached per distinct matrix)."""
        static = not self.topology.is_time_varying or self.topology.period is not None
        key = self.inner.step_key(step)
        if static and key in self._hoods:
            return self._hoods[key]
        hood = robust.Neighbourhoods.of(self.topology.sparse(step), dtype, device)
        b = self.threat.trim if self.threat.trim is not None else hood.byzantine_inputs(self.threat.byzantine)
        what = f"aggregator = {self.threat.aggregator} on topology = {self.topology.name} ({self.topology.n} clients)"
        coordinate = self.rule.card.coordinatewise
        rows = robust.block_rows(hood.most if coordinate else 1, self.dim, torch.finfo(dtype).bits // 8, device, what)
        entry = (hood, b, rows)
        self.rule.neighbourhood(self.threat, hood, b)  # adaptive clipped-gossip warns when it isolates receivers
        if static:
            self._hoods[key] = entry
        return entry

    def step(self, M: torch.Tensor, s: int) -> torch.Tensor:
        """One gossip step of the messages M with the run's aggregator (its registered class's `step`)."""
        return self.rule.step(self, M, s)

    def mix(self, X: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
        """Gossip steps first_step … first_step+steps−1 of the model stack X under attack (module docstring)."""
        if X.shape[1] != self.dim:
            raise RuntimeError(f"Byzantine gossip mixes the model stack ([m, {self.dim}]); got {tuple(X.shape)}")
        attacked = self.threat.attack is not None
        own = X[self.bad] if attacked else None
        for s in range(first_step, first_step + steps):
            M = X
            if attacked:
                assert own is not None
                mean, std = honest_moments(X, self.honest, self.honest_count, self.spread)
                M = X.index_put((self.bad,), self.threat.forge(own, self.start, mean, std, s))
            X = self.step(M, s)
            if attacked:
                X[self.bad] = ((self.honest @ X) / self.honest_count).to(X.dtype)
        if self.start is not None:
            self.start = X[self.bad].clone()
        return X

    def sends(self, first_step: int, steps: int) -> np.ndarray:
        """Models each client sends over these steps (the inner gossip's count)."""
        return self.inner.sends(first_step, steps)

    def message_bytes(self, dim: int, itemsize: int) -> int:
        """Bytes of one message: a model."""
        return self.inner.message_bytes(dim, itemsize)

    # ------------------------------------------------------------------ checkpoints (`dfl.engine.checkpoint`)
    def client_state(self) -> dict[str, torch.Tensor]:
        """Per-client rows the next rounds depend on: x^start of the Byzantine clients (sign-flip; 0 elsewhere)."""
        if self.start is None:
            return {}
        rows = torch.zeros((self.topology.n, self.dim), dtype=self.start.dtype, device=self.start.device)
        rows[self.bad] = self.start
        return {STATE_KEY: rows}

    def load_client_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore x^start of the Byzantine clients from a checkpoint's rows."""
        if self.start is None:
            return
        if STATE_KEY not in state:
            raise ValueError("the checkpoint lacks the Byzantine clients' x^start (attack = sign-flip)")
        self.start = state[STATE_KEY][self.bad.to(state[STATE_KEY].device)].to(self.start)


def server_updates(threat: Threat, V: torch.Tensor, bad: np.ndarray, weights: torch.Tensor, round_index: int,
                   center: torch.Tensor) -> torch.Tensor:
    """The server's aggregate [d] of the participants' updates V [n, d] under attack (module docstring).

    `bad` [n] marks the Byzantine participants, `weights` [n] their aggregation weights (used by mean only),
    `center` the previous aggregate (centered-clipping).
    """
    V = V.clone() if bad.any() else V
    if bad.any() and threat.attack is not None:
        rows = torch.as_tensor(np.flatnonzero(bad), device=V.device)
        honest = torch.as_tensor(~bad, dtype=V.dtype, device=V.device)
        count = max(int((~bad).sum()), 1)
        attack = threat.attack_card
        mean, std = honest_moments(V, honest, count, attack is not None and attack.spread)
        V[rows] = threat.forge(V[rows], None, mean, std, round_index)
    b = threat.trim if threat.trim is not None else int(bad.sum())
    return AGGREGATORS.get(threat.aggregator)().server(V, weights, b, threat.clip_radius, center)

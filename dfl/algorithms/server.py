"""Centralized FL as the complete-topology case of the engine: client sampling, aggregation, broadcast.

Conventions shared by every centralized algorithm (docs/reference/update-rules.md#conventions and
docs/reference/update-rules.md#centralized-conventions):
- Participation. S_t is drawn from (seed, t) alone, identically on every process, so results do not
  depend on the world size. "uniform": round(f·N) clients (at least 1) without replacement;
  "bernoulli": each client joins independently with probability f (FedSAM paper). A Bernoulli round
  that nobody joins is skipped: no local work, no server step, no momentum decay, nothing sent.
  Non-participants train nothing and keep their persistent state (c_i, h_i, σ_k, ...) untouched.
- Aggregation weights p_i over S_t: "uniform" 1/|S_t| or "size" n_i / Σ_{j∈S_t} n_j. SCAFFOLD's c, a
  statistic of the whole population, uses q_i = 1/N or n_i / Σ_j n_j in the same way (`share`).
- Server state ([d] tensors) is replicated on every process and updated by the same arithmetic from
  the same all-reduced sums (`comm.sum`), so it stays identical everywhere.
- Broadcast. After every round each row of X holds the new global model x_{t+1}, also the rows of
  clients that did not take part: a real client receives x_{t+1} when it is next sampled, and every
  client starts local training from the broadcast model, so the trajectory is the same. The runner's
  "averaged model" metrics are therefore the global model's, and the consensus distance is 0.
- Communication. `RoundStats.models_sent[i]` = (model-sized vectors client i uploads + those the server
  sends it) for a participant, 0 otherwise; e.g. FedAvg 1 + 1, SCAFFOLD 2 + 2. Each transfer is counted
  once, as a gossip send is in the decentralized algorithms; the runner multiplies by the model bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from typing_extensions import override

from dfl.algorithms.base import Algorithm, Context, RoundStats
from dfl.algorithms.builtin import SERVER, ServerParams
from dfl.config import PARTICIPATION_MODES
from dfl.errors import ConfigError
from dfl.network.byzantine import Threat, server_updates
from dfl.network.byzantine_settings import AGGREGATORS

SP = TypeVar("SP", bound=ServerParams)  # a centralized algorithm's hyperparameters: the server's, and its own
_SAMPLING_STREAM = 0x5A3D  # separates the participation stream from the per-client data streams


def sample_participants(seed: int, round_index: int, num_clients: int, fraction: float, mode: str) -> np.ndarray:
    """The [N] boolean mask of S_t; a function of (seed, t, N, f, mode) only (never of rank or world size)."""
    if mode not in PARTICIPATION_MODES:
        raise ConfigError(f"participation_mode must be one of {', '.join(PARTICIPATION_MODES)}; got {mode!r}")
    if not 0 < fraction <= 1:
        raise ConfigError(f"participation must be in (0, 1], got {fraction}")
    if fraction == 1:
        return np.ones(num_clients, dtype=bool)
    rng = np.random.default_rng(np.random.SeedSequence([seed, round_index, _SAMPLING_STREAM]))
    if mode == "bernoulli":
        return rng.random(num_clients) < fraction
    k = max(1, math.floor(fraction * num_clients + 0.5))
    mask = np.zeros(num_clients, dtype=bool)
    mask[rng.choice(num_clients, size=k, replace=False)] = True
    return mask


@dataclass
class Participation:
    """The clients that take part in one round of a centralized algorithm, and their aggregation weights."""
    mask: np.ndarray  # [N] bool, every client of every process
    rows: torch.Tensor  # local row ids of this process's participants
    weights: torch.Tensor  # [m_local] aggregation weights p_i (0 off S_t); Σ over all processes = 1

    @property
    def count(self) -> int:
        """How many clients take part, over all processes."""
        return int(self.mask.sum())


class ServerAlgorithm(Algorithm[SP]):
    """Base of the centralized algorithms: the global model `x` and the sampling/aggregation helpers."""

    card = SERVER
    uplink = 1  # model-sized vectors a participant uploads per round
    downlink = 1  # model-sized vectors the server sends a participant per round

    def __init__(self, ctx: Context[SP], X: torch.Tensor):
        super().__init__(ctx, X)
        self.hp: SP = ctx.hp
        self.x = ctx.comm.mean_rows(X)  # x_0: every client starts from the same model
        ids = torch.as_tensor(ctx.comm.client_ids, dtype=torch.long)
        sizes = ctx.trainer.data.sizes.double()  # n_i of all N clients
        self.sizes = sizes.numpy()
        share = sizes / sizes.sum() if self.hp.aggregation == "size" else torch.full_like(sizes, 1 / len(sizes))
        self.share = share[ids].to(device=X.device, dtype=X.dtype)  # q_i of the local clients
        # Byzantine clients and a robust rule at the server (`aggregate_updates`); None: the weighted mean of today
        config = ctx.config
        self.threat = Threat.of(config, ctx.comm.num_clients)
        if self.threat is not None:
            hosted = len(ctx.comm.client_ids)
            if hosted < ctx.comm.num_clients:  # a torchrun world of several processes
                raise ConfigError(f"byzantine = {config.byzantine:g}, aggregator = {config.aggregator}: this process "
                                  f"hosts {hosted} of the {ctx.comm.num_clients} clients (a torchrun world of several "
                                  "processes), which is not supported at the server (the attacker reads every "
                                  "participant's update); run in one process")
            self.robust_center = torch.zeros_like(self.x)  # centered-clipping's v: the previous aggregate

    # ------------------------------------------------------------------ sampling and aggregation
    def participants(self, t: int) -> Participation:
        """S_t, this process's rows of it, and the weights p_i (docs/reference/update-rules.md#conventions)."""
        comm, hp = self.ctx.comm, self.hp
        mask = sample_participants(
            self.ctx.config.seed, t, comm.num_clients, hp.participation, hp.participation_mode
        )
        size = self.sizes if hp.aggregation == "size" else np.ones(len(mask))
        p = np.where(mask, size, 0.0) / max(float(size[mask].sum()), 1e-300)
        local = mask[comm.client_ids]
        return Participation(
            mask=mask,
            rows=torch.as_tensor(np.flatnonzero(local), dtype=torch.long, device=self.X.device),
            weights=torch.as_tensor(p[comm.client_ids], dtype=self.X.dtype, device=self.X.device),
        )

    def aggregate(self, V: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Σ_i w_i v_i over every client of every process (V: [m_local, d] or [m_local]).

        The local part is one matvec in V's dtype (no float64 copy of the stack); processes add in float64.
        """
        local = weights @ V if V.dim() == 2 else (weights * V).sum()
        return self.ctx.comm.sum(local.reshape(-1).double()).to(V.dtype).reshape(V.shape[1:])

    def aggregate_updates(self, D: torch.Tensor, part: Participation, t: int) -> torch.Tensor:
        """The server's aggregate [d] of the participants' model updates D ([m_local, d], rows off S_t unused).

        Without Byzantine clients and with aggregator = mean: `aggregate(D, part.weights)`, Σ_S p_i Δ_i. Otherwise the
        Byzantine participants' rows are replaced by their attack and the `aggregator` combines the participants
        (`dfl.network.byzantine.server_updates`, `dfl.network.robust.server_aggregate`; one process).
        """
        if self.threat is None:
            return self.aggregate(D, part.weights)
        clients = np.asarray(self.ctx.comm.client_ids)
        ids = clients[part.mask[clients]]  # the participants of this process, in row order (as part.rows)
        out = server_updates(self.threat, D[part.rows], self.threat.byzantine[ids], part.weights[part.rows], t,
                             self.robust_center)
        if AGGREGATORS.card(self.threat.aggregator).center:  # the rule keeps its previous aggregate
            self.robust_center = out
        return out

    def pseudo_gradient(self, Y: torch.Tensor, steps: torch.Tensor, lr: float, part: Participation):
        """The normalized pseudo-gradient Σ_S p_i (x − y_i)/(η K_i) and the mean step count K̄ = Σ_S p_i K_i."""
        K = steps.to(Y.dtype).clamp_min(1)  # non-participants: K = 0, weight 0
        d = self.aggregate((self.x - Y) / (lr * K[:, None]), part.weights)
        return d, float(self.aggregate(K, part.weights))

    def broadcast(self, x: torch.Tensor) -> None:
        """x_{t+1} becomes the server model and every row of the client stack."""
        self.x = x
        # every row is x: a read-only [m, d] view of it, as the engine's X_0 (`common_start`), not an [m, d] copy.
        # Whoever writes rows clones it first (local training does, `LocalTrainer.train`), so a round writes the
        # stack once instead of twice, and reads of X (the finiteness check, evaluation) read one cached row
        self.X = x.expand_as(self.X)

    # ------------------------------------------------------------------ statistics
    def stats(self, loss: torch.Tensor, part: Participation) -> RoundStats:
        """The round's statistics: the participants' losses, the models they exchanged with the server, who trained."""
        trained = torch.as_tensor(part.mask[self.ctx.comm.client_ids], device=self.X.device)
        return RoundStats(
            train_loss=loss,
            models_sent=part.mask.astype(np.int64) * (self.uplink + self.downlink),
            trained=trained,
        )

    def skipped(self) -> RoundStats:
        """A round nobody joined (Bernoulli sampling): nothing trains, nothing changes, nothing is sent."""
        return RoundStats(
            train_loss=torch.zeros(self.X.shape[0], device=self.X.device, dtype=self.X.dtype),
            models_sent=np.zeros(self.ctx.comm.num_clients, dtype=np.int64),
            trained=torch.zeros(self.X.shape[0], dtype=torch.bool, device=self.X.device),
        )

    @override
    def state(self) -> dict[str, torch.Tensor]:
        robust = {"robust_center": self.robust_center} if self.threat is not None else {}
        return {**super().state(), "x": self.x, **robust}

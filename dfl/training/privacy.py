r"""Client-level differential privacy: each release of a client's trained model is clipped and noised.

Every `LocalTrainer.train` call is a release: client i, starting the round from x_i (public: the result of earlier
releases and public values), trains to y_i and shares, in place of y_i,

    Δ_i = y_i − x_i
    ỹ_i = x_i + Δ_i · min(1, C / ‖Δ_i‖₂) + σC · ξ_i,      ξ_i ~ N(0, I_d)

the Gaussian mechanism on the round's update clipped to norm C (DP-FedAvg: McMahan et al., ICLR 2018, Algorithm 1
with per-user clipping; DP-FedSAM: Shi et al., CVPR 2023, Algorithm 1, with the clipping over the whole update).
Unlike both papers, whose server adds noise of std σC to the *sum* of the round's m clipped updates (or each client
adds σC/√m, whose m-fold sum has std σC; the average then carries σC/m), every client here adds the full σC: in
decentralized training each neighbour sees each message on its own, so each message must carry the guarantee
(docs/how-to/differential-privacy.md).

The noise ξ_i of client i's r-th release is drawn from a generator seeded by (seed, i, r) alone, so it does not depend
on which process holds the client, on which other clients train, or on a resume (the counts r are checkpointed). The
clipping is vectorized over the rows (one norm per row, one scale); the noise is drawn on the run's device with nothing
read back to the host: one `randn` per released row from its own seeded generator, or on CUDA for models of at most
2^16 parameters one batched counter-based draw of every row (`dfl.data.draws`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dfl.config import Config
from dfl.data import draws
from dfl.training.privacy_settings import PrivacySettings

NOISE_STREAM = 0xD1FF  # separates the noise's seeds from every other stream drawn from the run's seed


def noise_seed(seed: int, client: int, release: int) -> int:
    """The seed of client `client`'s `release`-th noise vector: a function of (seed, client id, release index) only."""
    return int(np.random.SeedSequence([seed, NOISE_STREAM, client, release]).generate_state(1, np.uint64)[0])


def clip_updates(Y: torch.Tensor, X: torch.Tensor, clip: float) -> torch.Tensor:
    """Clip each row's update Y − X to L2 norm `clip`, in place on Y; returns Y.

    y ← y + (min(1, C/‖y − x‖) − 1)(y − x) = x + min(1, C/‖Δ‖) Δ. A row within the norm gets a zero correction,
    so it stays bitwise what it was (Y + 0); a zero update (norm 0, C/0 = inf) too.

    Args:
        Y: [a, d] the trained rows.
        X: [a, d] (or broadcastable) their start of round.
        clip: C > 0.
    """
    delta = Y - X
    scale = (clip / delta.norm(dim=1, keepdim=True)).clamp(max=1.0)
    return Y.addcmul_(delta, scale - 1)


def add_noise(Y: torch.Tensor, std: float, seeds: Sequence[int]) -> torch.Tensor:
    """Add N(0, std² I) to each row of Y, in place, row r's draw a function of `seeds[r]` alone; returns Y.

    `dfl.data.draws.normals`: a generator seeded with it per row, or on CUDA for small models every row in one
    batched counter-based draw; either way a client's noise is its own, whatever the others do.
    """
    if std == 0 or not len(seeds):
        return Y
    noise = draws.normals(np.asarray(seeds, dtype=np.uint64), Y.shape[1], Y.dtype, Y.device)
    return Y.add_(noise, alpha=std)


class ClientPrivacy:
    """The mechanism of the clients of one process, and how many releases each has made.

    Attributes:
        settings: C, σ and δ (`PrivacySettings`).
        seed: the run's seed.
        client_ids: the global ids of this process's rows, in row order.
        releases: [m_local] int64, the releases each local client has made (the index of its next release; what the
            accountant composes; checkpointed).
    """

    def __init__(self, settings: PrivacySettings, seed: int, client_ids: Sequence[int]):
        self.settings = settings
        self.seed = seed
        self.client_ids = list(client_ids)
        self.row_of = {client: row for row, client in enumerate(self.client_ids)}
        self.releases = np.zeros(len(self.client_ids), dtype=np.int64)
        self.last_round = np.full(len(self.client_ids), -1, dtype=np.int64)  # the round of each client's last release

    @classmethod
    def of(cls, config: Config, client_ids: Sequence[int]) -> ClientPrivacy | None:
        """The mechanism of `config`'s clients `client_ids` (global ids, in row order); None when DP is off."""
        settings = PrivacySettings.of(config)
        return None if settings is None else cls(settings, config.seed, client_ids)

    def release(self, Y: torch.Tensor, X: torch.Tensor, clients: Sequence[int] | np.ndarray,
                round_index: int) -> torch.Tensor:
        """The released rows of the clients `clients` (global ids, row r of Y is clients[r]), in place on Y.

        Args:
            Y: [a, d] their trained models.
            X: [a, d] (or broadcastable) their models at the start of the round.
            clients: the clients' global ids.
            round_index: the round. A client releases at most once a round (what `Algorithm.dp` promises, and what
                bounds the counts in `worst`): a second release in one round is an error.

        Returns:
            Y, now x + clip_C(y − x) + N(0, σ²C² I) per row; each client's release count goes up by one.
        """
        rows = np.fromiter((self.row_of[c] for c in clients), dtype=np.int64, count=len(clients))
        if np.any(self.last_round[rows] >= round_index):
            raise RuntimeError(f"differential privacy: a client trained twice in round {round_index}; an algorithm "
                               "that takes dp_clip (Algorithm.dp) calls trainer.train at most once a round")
        self.last_round[rows] = round_index
        seeds = [noise_seed(self.seed, c, int(r)) for c, r in zip(clients, self.releases[rows])]
        clip_updates(Y, X, self.settings.clip)
        add_noise(Y, self.settings.std, seeds)
        self.releases[rows] += 1
        return Y

    def worst(self, comm, bound: int, device: torch.device | str = "cpu") -> int:
        """The most releases made by any client of any process (a collective: every process calls it).

        Args:
            comm: the run's communicator (`sum` over processes).
            bound: an upper bound on any count, the same on every process (the rounds run so far).
            device: where the summed vector lives (the run's device: NCCL sums CUDA tensors).

        Returns:
            max_i releases_i over every client: each process's largest count, one-hot in [bound + 1], summed over
            processes; the largest index with a nonzero sum.
        """
        local = int(self.releases.max()) if len(self.releases) else 0
        onehot = torch.zeros(bound + 1, dtype=torch.float64, device=device)
        onehot[min(local, bound)] = 1.0
        total = comm.sum(onehot)
        return int(torch.nonzero(total).max())

    def state(self) -> torch.Tensor:
        """[m_local, 2] int64: each client's release count and the round of its last release, for the checkpoint."""
        return torch.as_tensor(np.stack([self.releases, self.last_round], axis=1))

    def load_state(self, state: torch.Tensor) -> None:
        """Restore what `state` saved (this process's rows)."""
        saved = state.detach().cpu().numpy().astype(np.int64).reshape(len(self.client_ids), 2)
        self.releases, self.last_round = saved[:, 0].copy(), saved[:, 1].copy()

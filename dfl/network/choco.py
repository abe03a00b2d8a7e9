"""Compressed gossip with error feedback.

CHOCO-GOSSIP (Koloskova, Stich & Jaggi, ICML 2019, "Decentralized Stochastic Optimization and Gossip Algorithms with
Compressed Communication").

[recon] marks what is reconstructed from memory of the paper, not checked against its text (the algorithm lines
are as I recall them; the equation numbers are not recalled, so none are cited).

Algorithm 1 (CHOCO-GOSSIP) [recon], for every client i in parallel, x̂_i^(0) = 0, consensus step size γ:
    1: for t = 0, …, T−1:
    2:     q_i^(t) = Q(x_i^(t) − x̂_i^(t))                          compress the difference to the public copy
    3-6:   send q_i^(t) to the neighbours, receive q_j^(t); for j ∈ {i} ∪ neighbours: x̂_j^(t+1) = x̂_j^(t) + q_j^(t)
    7:     x_i^(t+1) = x_i^(t) + γ Σ_j w_ij (x̂_j^(t+1) − x̂_i^(t+1))
x̂_j is client j's public copy: every neighbour of j holds the same one (it adds the same q_j), so the simulator
keeps one [m, d] stack X̂, and line 7 is X ← X + γ (W X̂ − X̂) (rows of W sum to 1): one ordinary gossip step of
X̂, done by `dfl.network.gossip.Gossip.mix`, so the neighbour-only row exchange across processes is reused as it is.
What the network carries is q_j (a compressed message, `dfl.network.compression`); error feedback is the x − x̂ that
Q leaves out, carried to the next step's q.

Algorithm 2 (CHOCO-SGD) [recon] puts a local SGD step before it: x_i^(t+½) = x_i^(t) − η_t ∇F_i(x_i^(t), ξ_i^(t)),
then lines 2-7 on x^(t+½). Here every gossip step of a decentralized algorithm becomes one CHOCO-GOSSIP step:
DFedAvg with one local step is CHOCO-SGD exactly; DFedAvg(M)/DFedSAM take K local steps before it, DFedSAM-MGS
Q CHOCO steps after them (X ← W^Q Y becomes Q CHOCO steps from Y), and D-PSGD's W X^k − η G(X^k) becomes
CHOCO(X^k) − η G(X^k). γ = 1 with the identity (top-k, compression = 1) is exact gossip: x + (W x − x) = W x.

Convergence (Theorem 2 [recon]): with the Lyapunov function e_t = Σ_i ‖x_i^(t) − x̄‖² + ‖x_i^(t) − x̂_i^(t+1)‖²,
    E e_t ≤ (1 − δ²ω/82)^t e_0   for γ = δ²ω / (16δ + δ² + 4β² + 2δβ² − 8δω),
δ = 1 − |λ₂(W)| the spectral gap, β = ‖I − W‖₂, ω the compression parameter; CHOCO keeps x̄ (W doubly
stochastic). That γ is tiny (1e-4 to 1e-3 on small rings): the paper's experiments tune γ instead (a grid; the
values used were between about 0.01 and 1 [recon]). Unset, γ = ω here: measured on a ring (README), γ near ω
converges for every compressor, and random-k diverges at 2ω.

Choices of this implementation:
- x̂_i^(0) = x^(0), the common initial model every client builds from the run's seed, instead of 0: CHOCO is
  shift invariant (q depends on x − x̂ only, line 7 on differences of x̂), so this is Algorithm 1 in coordinates
  centred at x^(0), and the first messages carry the change from the start instead of the model itself.
  (A gossip built without a start, as in the tests, starts from x̂^(0) = 0, as the paper.)
- One public copy per client: an algorithm gossips one stack (the models) per gossip step; mixing a second
  stack at a step already gossiped is an error.
- Faults (`dfl.network.faults`): line 7 uses the realised W'_s of the step. An offline client sends nothing: q_j = 0,
  so x̂_j stays, and its row of W'_s is e_j, so x_j stays. A message q_j that cannot cross a failed link (or
  reach an offline neighbour) is delivered with the next message over that link: updates add up, so the copy of
  x̂_j a neighbour holds is exact whenever it mixes with j. Bytes count every q_j once per neighbour of the
  topology (in the step it is made), as that delivery needs.
- Static topologies only: on a time-varying one (one-peer-exponential, random-k, ...) a client would need the
  public copies of every client it may ever meet, i.e. every q_j sent to all of them.
"""

from __future__ import annotations

import numpy as np
import torch

from dfl.network import compression as compressors

STATE_KEY = "choco_public"  # the checkpoint's name for the public copies x̂


class ChocoGossip:
    """CHOCO-GOSSIP over `inner` (a `dfl.network.gossip.Gossip`).

    `mix` and `sends` as Gossip's, compressed (module doc).

    `public` holds x̂ of this process's clients ([m_local, d], rows = `comm.client_ids`); `start` is x̂^(0) (None:
    zeros, made at the first `mix`). With link faults, `faults` (`dfl.network.faults.LinkFaults`) says who is online
    and `base` (a Gossip over the fault-free topology) counts the neighbours each message goes to.
    """

    def __init__(self, inner, compressor: compressors.Compressor, gamma: float | None, seed: int,
                 start: torch.Tensor | None = None, faults=None, base=None):
        self.inner, self.compressor, self.seed = inner, compressor, int(seed)
        self.topology, self.comm = inner.topology, inner.comm
        self.public: torch.Tensor | None = None if start is None else start.detach().clone()
        self.given_gamma = gamma
        self.gamma = None if start is None else self.consensus_lr(start.shape[1])
        self.faults, self.base = faults, base
        self.next_step = 0  # the first gossip step not yet taken: each step advances x̂ once

    def mix(self, X: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
        """Gossip steps first_step … first_step+steps−1 of the model stack X, one CHOCO-GOSSIP step each."""
        if first_step < self.next_step:
            raise RuntimeError(
                f"compressed gossip: step {first_step} was already taken (steps up to {self.next_step - 1}): CHOCO "
                "advances each client's public copy once per gossip step, so an algorithm may gossip one stack (its "
                "models) per step")
        if self.public is None:
            self.public = torch.zeros_like(X)
            self.gamma = self.consensus_lr(X.shape[1])
        if X.shape != self.public.shape:
            raise RuntimeError(f"compressed gossip keeps public copies of shape {tuple(self.public.shape)}; got a "
                               f"stack of shape {tuple(X.shape)}: only the model stack can be gossiped")
        for s in range(first_step, first_step + steps):
            X = self.step(X, s)
        self.next_step = first_step + steps
        return X

    def consensus_lr(self, d: int) -> float:
        """γ: the given one, else ω of the compressor for vectors of length d (module doc)."""
        return float(self.compressor.omega(d) if self.given_gamma is None else self.given_gamma)

    def describe(self) -> dict:
        """The run summary's entries: the compressor, its ω and the γ it runs with."""
        assert self.public is not None, "described after the first mix (or with a start)"
        d = self.public.shape[1]
        return {"compressor": self.compressor.name, "compression": self.compressor.compression,
                "compression_omega": self.compressor.omega(d), "consensus_lr": self.gamma}

    def step(self, X: torch.Tensor, s: int) -> torch.Tensor:
        """One CHOCO gossip step s: exchange compressed corrections of the public copies, then mix with γ."""
        assert self.public is not None, "mix makes the public copies before the first step"
        ids = self.comm.client_ids
        U = None
        if self.compressor.random:
            U = compressors.uniforms(self.seed, s, ids, X.shape[1], X.dtype, X.device)
        q = self.compressor(X - self.public, U)  # line 2: q_i = Q(x_i − x̂_i)
        if self.faults is not None and self.faults.offline:
            online = torch.as_tensor(self.faults.online(s, np.asarray(ids)), device=X.device)
            q = q * online[:, None].to(q.dtype)  # an offline client sends nothing
        self.public = self.public + q  # lines 3-6: x̂_j += q_j (this process's rows; the others do theirs)
        mixed = self.inner.mix(self.public, s, 1)  # Σ_j w_ij x̂_j: one gossip step of X̂
        return X + self.gamma * (mixed - self.public)  # line 7

    def sends(self, first_step: int, steps: int) -> np.ndarray:
        """Messages q_j each client sends over these steps.

        One per neighbour of the topology and step (with faults: while it is online, to every neighbour of the
        fault-free topology; see the module doc).
        """
        if self.faults is None:
            return self.inner.sends(first_step, steps)
        n = self.topology.n
        out = np.zeros(n, dtype=np.int64)
        for s in range(first_step, first_step + steps):
            out += self.base.sends(s, 1) * self.faults.online(s, np.arange(n))
        return out

    def message_bytes(self, dim: int, itemsize: int) -> int:
        """Bytes of one message q_j (`dfl.network.compression`)."""
        return self.compressor.message_bytes(dim, itemsize)

    # ------------------------------------------------------------------ checkpoints (`dfl.engine.checkpoint`)
    def client_state(self) -> dict[str, torch.Tensor]:
        """Per-client state rows ([m_local, ...]): the public copies x̂."""
        return {} if self.public is None else {STATE_KEY: self.public}

    def load_client_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the public copies from a checkpoint's client state."""
        if STATE_KEY not in state:
            raise ValueError("the checkpoint lacks the public copies of compressed gossip (compressor)")
        value = state[STATE_KEY]
        like = self.public if self.public is not None else value
        self.public = value.to(device=like.device, dtype=like.dtype).clone()

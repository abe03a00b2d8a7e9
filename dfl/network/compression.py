"""Compression operators Q for compressed gossip (`dfl.network.choco`), vectorized over the rows (clients) of a stack.

A compressor maps D [m, d] (row r: one client's vector, in CHOCO x_i − x̂_i) to Q(D) [m, d], row by row. CHOCO's
condition on Q (Koloskova, Stich & Jaggi, ICML 2019, Assumption 1 [recon: from memory]) is contraction in
expectation:
    E_Q ‖Q(x) − x‖² ≤ (1 − ω) ‖x‖²  for every x ∈ R^d,  with a compression parameter ω ∈ (0, 1].
The three built-ins are the paper's examples; c = `compression`, k = ⌈c·d⌉ (at least 1):
- top-k (c ∈ (0, 1]): keep the k coordinates of largest |x| of each row, zero the rest (deterministic; ties as
  torch.topk breaks them); ω = k/d. c = 1 is the identity.
- random-k (c ∈ (0, 1]): keep k coordinates drawn uniformly without replacement, UNSCALED: the paper's biased
  rand_k, ω = k/d. (The unbiased (d/k)·rand_k has E‖Q(x) − x‖² = (d/k − 1)‖x‖², no contraction for k < d/2, so
  CHOCO uses rand_k as is.)
- qsgd (c = b bits per coordinate, sign included, an integer in [2, 16]): s = 2^(b−1) − 1 levels and
      Q(x) = sign(x) · ‖x‖₂ / (s τ) · ⌊s |x| / ‖x‖₂ + ξ⌋,   ξ ~ U[0, 1)^d,   τ = 1 + min(d/s², √d/s),
  the QSGD quantizer of Alistarh et al. (NeurIPS 2017, unbiased, E‖Q_s(x)‖² ≤ τ‖x‖²) divided by τ, as CHOCO
  writes qsgd_s: then ω = 1/τ. The level ⌊s|x|/‖x‖ + ξ⌋ ∈ {0, …, s} takes b − 1 bits, the sign one.

Randomness (random-k's coordinates, qsgd's ξ) is drawn per (seed, gossip step, client): row r's uniforms are a
function of the counter-based hash of (seed, step, client id) alone (`dfl.data.sampler.client_keys`, as the network's
faults): a torch generator seeded with it, or on CUDA for d ≤ 2^16 one batched counter-based draw of every row
(`dfl.data.draws`), so a client's message does not depend on which process hosts it, the world size or a resume.
Draws differ between CPU and CUDA (like any torch RNG).

Bytes of one message (`message_bytes`, fixed-width encodings, counted exactly; `itemsize` = bytes of one value
of the client stack, 4 in fp32):
- top-k: k · (4 + itemsize): an int32 index and a value per kept coordinate (int64 indices if d ≥ 2^31);
- random-k: k · itemsize: the values only; every receiver regenerates the indices from (seed, step, sender);
- qsgd: ⌈d·b / 8⌉ + itemsize: b bits per coordinate (sign + level), packed, and the norm ‖x‖₂ as one value.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from typing_extensions import override

from dfl.data import draws
from dfl.data.sampler import client_keys
from dfl.network.settings import CARDS, COMPRESSORS, CompressorCard

STREAM_COMPRESS = 0x434D5052  # hash stream "CMPR" (the sampler uses 0 and 1, the network LINK, OFFL, SLOW)


def kept(fraction: float, d: int) -> int:
    """K = ⌈fraction·d⌉, at least 1 (a tolerance keeps 0.1·100 = 10.000000000000002 at 10)."""
    return min(d, max(1, math.ceil(fraction * d - 1e-9)))


def uniforms(seed: int, step: int, client_ids, d: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[m, d] uniforms in [0, 1): row r a function of hash(seed, step, client_ids[r]) alone (`dfl.data.draws`)."""
    keys = client_keys(seed, np.asarray(client_ids, dtype=np.int64), step, STREAM_COMPRESS)
    return draws.uniforms(keys, d, dtype, device)


def _keep(D: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """D with every coordinate outside `index` ([m, k] per row) set to zero."""
    return torch.zeros_like(D).scatter_(1, index, D.gather(1, index))


class Compressor:
    """Q for one run: `fraction`/`bits` from `compression` (checked by its card), applied to [m, d] stacks.

    A subclass binds its card (`card = CompressorCard(name, option, ...)`, `dfl.network.settings`): its name, the
    meaning, type, default and range of `compression`, whether it is unbiased, its ω and what a message sends. A
    plug-in registers its class in `dfl.network.settings.COMPRESSORS` (the registry refuses a class without a card
    named like its entry) and implements `__call__`, `message_bytes` and `omega`.
    """

    card: CompressorCard
    random = False  # draws from (seed, step, client)

    def __init__(self, compression: float):
        self.compression = self.check(compression)

    @classmethod
    def check(cls, value) -> float:
        """The compression value, or ValueError naming the field and the allowed values (`CompressorCard.check`)."""
        return cls.card.check(value)

    @property
    def name(self) -> str:
        """The compressor's name (its card's)."""
        return self.card.name

    def __call__(self, D: torch.Tensor, U: torch.Tensor | None = None) -> torch.Tensor:
        """Q(D) row by row; U: the [m, d] uniforms of this step's clients (random compressors)."""
        raise NotImplementedError

    def message_bytes(self, d: int, itemsize: int) -> int:
        """The bytes of one compressed message of a length-d vector of `itemsize`-byte floats (indices included)."""
        raise NotImplementedError

    def omega(self, d: int) -> float:
        """ω of Assumption 1 for vectors of length d."""
        raise NotImplementedError


class TopK(Compressor):
    """Top-k: keep the fraction `compression` of each row's coordinates of largest magnitude."""
    card = CARDS["top-k"]

    @override
    def __call__(self, D, U=None):
        k = kept(self.compression, D.shape[1])
        return D.clone() if k == D.shape[1] else _keep(D, D.abs().topk(k, dim=1, sorted=False).indices)

    @override
    def message_bytes(self, d, itemsize):
        return kept(self.compression, d) * ((4 if d < 2**31 else 8) + itemsize)

    @override
    def omega(self, d):
        return kept(self.compression, d) / d


class RandomK(TopK):
    """Random-k: keep a uniformly random fraction `compression` of each row's coordinates."""
    card, random = CARDS["random-k"], True

    @override
    def __call__(self, D, U=None):
        k = kept(self.compression, D.shape[1])
        # the k largest of d i.i.d. uniforms: a uniformly random k-subset of the coordinates
        return D.clone() if k == D.shape[1] else _keep(D, U.topk(k, dim=1, sorted=False).indices)

    @override
    def message_bytes(self, d, itemsize):
        return kept(self.compression, d) * itemsize


class QSGD(Compressor):
    """QSGD: stochastic rounding of |x_j|/‖x‖ to 2^(bits−1) − 1 levels, scaled by 1/τ (unbiased times 1/τ)."""
    card, random = CARDS["qsgd"], True

    @property
    def levels(self) -> float:
        """The quantization levels s = 2^(bits − 1) − 1 of |x_j| / ‖x‖."""
        return 2 ** (self.compression - 1) - 1

    def tau(self, d: int) -> float:
        """τ = 1 + min(d/s², √d/s), QSGD's variance factor for vectors of length d."""
        s = self.levels
        return 1 + min(d / s**2, math.sqrt(d) / s)

    @override
    def __call__(self, D, U=None):
        s, tau = self.levels, self.tau(D.shape[1])
        norm = torch.linalg.vector_norm(D, dim=1, keepdim=True)
        safe = torch.where(norm > 0, norm, torch.ones_like(norm))  # a zero row stays zero
        level = torch.floor(s * D.abs() / safe + U).clamp_(max=s)  # |x| ≤ ‖x‖, up to rounding
        return torch.sign(D) * level * (norm / (s * tau))

    @override
    def message_bytes(self, d, itemsize):
        return math.ceil(d * self.compression / 8) + itemsize

    @override
    def omega(self, d):
        return 1 / self.tau(d)




def build(name: str, compression=None) -> Compressor:
    """The compressor `name` with `compression` (None: its default)."""
    cls = COMPRESSORS.get(name, "compressor")
    return cls(cls.card.default if compression is None else compression)

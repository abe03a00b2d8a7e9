"""Per-client random draws that depend only on each client's key: uniforms and normals for a block of clients.

Client i's draw in round (or gossip step) t must depend on (seed, i, t) alone, never on which process holds the client,
the world size, the chunk or a resume (the caller makes the 64-bit key of each client from those, e.g.
`dfl.data.sampler.client_keys`). Two ways to honour that:

- one torch generator per row, seeded with the key: one kernel launch (and a few µs of Python) per client;
- on CUDA, for rows of at most COUNTER_MAX_D values, a counter-based generator that draws every row of the block in
  one batched computation (a few dozen elementwise kernels per tile, whatever the number of clients): word c of
  client i is a keyed hash of (key_i, c), three rounds of a 32-bit integer mixer (hash-prospector's
  [16 21f0aaad 15 735a2d97 15]; both multipliers are below 2^31, so every product of 32-bit values fits an int64:
  no overflow, the same bits on every device). Uniforms take 53 bits (two words) per value; normals are Box–Muller
  pairs (a 53-bit radius uniform, a 32-bit angle), so their tails reach 8.6σ.

The choice depends on the device type and d only, never on the number of rows, so a client's numbers are the same
whichever process draws them (a CPU run and a CUDA run differ, as with any torch generator). Why the split, measured
on the 2-core CPU (one thread, 1,000 clients per call): the batched hash took 151 ms for d = 410 normals against 19 ms
for the loop (about 20 µs a client), 1.35 s against 69 ms at d = 4,096: the CPU's int64 passes are slower than its
generator, so the CPU keeps the loop. On a GPU a launch costs ~10 µs while a pass over the block costs
~2 bytes·m·d / bandwidth, so the ~30 integer passes of the hash cost less than m launches while d ≲ 60,000 (an estimate
from H100 bandwidth; benchmarks/gpu_check.py does not time it yet): COUNTER_MAX_D = 2^16.
"""

from __future__ import annotations

import math

import numpy as np
import torch

COUNTER_MAX_D = 2**16
_M32 = 0xFFFFFFFF
_TILE_ELEMENTS = 2**20  # int64 temporaries of one tile: 8 MiB each


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer mixer on int64 tensors holding uint32 values (products stay below 2^63)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def _words(lo: torch.Tensor, hi: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """[a, n] uint32 words (as int64): a keyed hash of each row's key (lo, hi: [a, 1]) and the counters [1, n]."""
    h = _mix32(counters ^ lo)
    h = _mix32(h ^ hi)
    return _mix32(h ^ lo)


def _key_halves(keys, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint64 keys split into their low and high 32 bits, [a, 1] int64 each, on `device` (one copy)."""
    keys = np.asarray(keys, dtype=np.uint64)
    halves = np.stack([keys & np.uint64(_M32), keys >> np.uint64(32)]).astype(np.int64)
    lo, hi = torch.from_numpy(halves).to(device, non_blocking=True).unsqueeze(-1)
    return lo, hi


def _tiles(a: int, d: int):
    """(row slice, column slice) tiles of an [a, d] draw, each at most _TILE_ELEMENTS values (about)."""
    cols = min(d, _TILE_ELEMENTS) or 1
    rows = max(1, _TILE_ELEMENTS // cols)
    for r in range(0, a, rows):
        for c in range(0, d, cols):
            yield slice(r, min(r + rows, a)), slice(c, min(c + cols, d))


def _unit(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """float64 in [0, 1) from two words: 53 bits (27 of `high`, 26 of `low`)."""
    return ((high >> 5) * 67108864 + (low >> 6)).double() * 2.0**-53


def batched(d: int, device: torch.device) -> bool:
    """Whether rows of d values are drawn by the counter-based generator on `device` (else a generator per row)."""
    return device.type == "cuda" and d <= COUNTER_MAX_D


def _rows(keys, d: int, dtype: torch.dtype, device, per_row, counter) -> torch.Tensor:
    """[a, d] draws, row r from keys[r]: `counter(keys, out)` where `batched`.

    Elsewhere `per_row` (torch.rand or torch.randn) from a generator seeded with each key in turn.
    """
    device = torch.device(device)
    out = torch.empty(len(keys), d, dtype=dtype, device=device)
    if not batched(d, device):
        generator = torch.Generator(device=device)
        for r, key in enumerate(np.asarray(keys, dtype=np.uint64).tolist()):
            per_row(d, generator=generator.manual_seed(key), dtype=dtype, device=device, out=out[r])
        return out
    return counter(keys, out)


def uniforms(keys, d: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[a, d] uniforms in [0, 1): row r a function of keys[r] (uint64), d and the device type only."""
    return _rows(keys, d, dtype, device, torch.rand, counter_uniforms)


def counter_uniforms(keys, out: torch.Tensor) -> torch.Tensor:
    """The counter-based uniforms of the keys' rows, written into `out` [a, d] (any device)."""
    d, dtype, device = out.shape[1], out.dtype, out.device
    lo, hi = _key_halves(keys, device)
    for rows, cols in _tiles(len(keys), d):
        j = torch.arange(cols.start, cols.stop, device=device).unsqueeze(0)
        words_lo, words_hi = lo[rows], hi[rows]
        u = _unit(_words(words_lo, words_hi, 2 * j), _words(words_lo, words_hi, 2 * j + 1))
        # rounding to a narrower dtype can give 1.0: the largest value below 1 instead
        out[rows, cols] = u.to(dtype).clamp_(max=1.0 - torch.finfo(dtype).eps / 2)
    return out


def normals(keys, d: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[a, d] standard normals: row r a function of keys[r] (uint64), d and the device type only."""
    return _rows(keys, d, dtype, device, torch.randn, counter_normals)


def counter_normals(keys, out: torch.Tensor) -> torch.Tensor:
    """The counter-based standard normals of the keys' rows, written into `out` [a, d] (any device)."""
    d, dtype, device = out.shape[1], out.dtype, out.device
    lo, hi = _key_halves(keys, device)
    pairs = (d + 1) // 2  # Box–Muller: pair p gives values 2p (cosine) and 2p + 1 (sine)
    for rows, cols in _tiles(len(keys), pairs):
        p = torch.arange(cols.start, cols.stop, device=device).unsqueeze(0)
        words_lo, words_hi = lo[rows], hi[rows]
        radius = torch.sqrt(-2.0 * torch.log1p(-_unit(_words(words_lo, words_hi, 3 * p),
                                                      _words(words_lo, words_hi, 3 * p + 1))))  # 1 − u ∈ (0, 1]
        angle = _words(words_lo, words_hi, 3 * p + 2).double() * (2 * math.pi * 2.0**-32)
        z = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1).flatten(1)
        lo_col, hi_col = 2 * cols.start, min(2 * cols.stop, d)
        out[rows, lo_col:hi_col] = z[:, : hi_col - lo_col].to(dtype)
    return out

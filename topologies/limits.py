"""Size limits of the topologies package, and the memory this machine has free.

The limits are read at call time (`monkeypatch.setattr(topologies.limits, ...)` changes them for a test).
`available_memory` is what a build is checked against before it allocates; dfl's memory planner reads it too.
"""

from __future__ import annotations

import os

DENSE_LIMIT = 20_000  # largest n for which matrix(step) / W build a dense [n, n] float64 array (3.2 GB)
DENSE_SPECTRAL_LIMIT = 2048  # largest n for the exact dense eigensolvers (O(n^3))
FULL_SPARSE_LIMIT = 2048  # largest n for which the complete topology's sparse() stores its n^2 entries
# Peak bytes while a topology is built, per directed edge of its graph and per node: measured with tracemalloc at
# 10^5-10^6 clients (ring 132, grid 106, exponential 85, hypercube 102, random-k 166, erdos-renyi 168,
# random-regular 198 bytes per edge), rounded up.
EDGE_BYTES = 200
NODE_BYTES = 64


def available_memory() -> int:
    """Bytes of memory free now.

    The OS's MemAvailable, capped by a cgroup (v2) limit when lower; the free physical pages where /proc is not
    there.
    """
    candidates = [b for b in (_meminfo_available(), _cgroup_free()) if b is not None]
    if not candidates:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(candidates)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_free() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as fh:
            return int(limit) - int(fh.read().strip())
    except (OSError, ValueError):
        return None


def gib(nbytes: float) -> str:
    """Bytes as a message shows them: "1.5 GiB", "12.0 MiB", "3.2 TiB"."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30)):
        if nbytes >= size:
            return f"{nbytes / size:,.1f} {unit}"
    return f"{nbytes / 2**20:,.1f} MiB"

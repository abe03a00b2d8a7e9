"""The memory this process may still allocate on this machine, read without torch.

Read without torch so that a size refused for memory is refused before torch loads: `available_memory` is
`topologies.limits.available_memory` (the kernel's MemAvailable, capped by the cgroup's memory limit when there is
one), and `human_bytes` writes sizes for messages. `dfl.training.memory.available_bytes` builds on it (and adds CUDA
and the kept heap).
"""

from __future__ import annotations

from topologies.limits import available_memory  # one reader of free memory, torch-free

__all__ = ["available_memory", "human_bytes"]


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KiB"; bytes below 1 KiB as an integer."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)

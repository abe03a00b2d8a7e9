"""The memory this process may still allocate on this machine, read without torch (so a size refused for memory
is refused before torch loads): the kernel's MemAvailable, capped by the cgroup's memory limit when there is one.
`dfl.training.memory.available_bytes` builds on it (and adds CUDA and the kept heap)."""

from __future__ import annotations

import os


def available_memory() -> int:
    """Bytes available now: min(MemAvailable, cgroup limit - usage); free physical pages without /proc."""
    candidates = [b for b in (meminfo_available(), cgroup_free()) if b is not None]
    if not candidates:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(candidates)


def meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None off Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cgroup_free() -> int | None:
    """The cgroup (v2) memory limit minus its usage, in bytes (None without a limit)."""
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as fh:
            return int(limit) - int(fh.read().strip())
    except (OSError, ValueError):
        return None


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KiB"; bytes below 1 KiB as an integer."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)

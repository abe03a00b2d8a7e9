"""Whether this CPU computes bf16 natively, and the warning when `precision = "bf16"` runs where it does not.

On a CPU without bf16 instructions (avx512_bf16 or AMX-BF16) oneDNN/ATen emulate bf16 matmuls by converting
to fp32 and back: on an AVX2 EPYC a bf16 SAM step ran ~40× slower than fp32 (benchmarks/throughput.py), with
no gain in memory that the run would notice.
"""

from __future__ import annotations

import warnings

import torch

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_SLOWDOWN = "~40×"  # measured on an AVX2 AMD EPYC (benchmarks/throughput.py --precision bf16)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_bf16() -> bool:
    """True when the CPU has native bf16 arithmetic.

    An avx512_bf16/amx_bf16 flag, or torch's dispatch level AVX512_BF16 / AMX
    (`torch.backends.cpu.get_cpu_capability`).
    """
    capability = str(torch.backends.cpu.get_cpu_capability()).upper()
    if "BF16" in capability or "AMX" in capability:
        return True
    return any(flag in cpu_flags() for flag in BF16_FLAGS)


def warn_if_slow_bf16(precision: str, device_type: str) -> bool:
    """Warn when bf16 will be emulated on this CPU (the trainer calls it once per run); returns whether it warned."""
    if precision != "bf16" or device_type != "cpu" or cpu_has_bf16():
        return False
    warnings.warn(
        f'precision = "bf16" on a CPU without bf16 instructions (no {" / ".join(BF16_FLAGS)}; torch CPU capability '
        f"{torch.backends.cpu.get_cpu_capability()}): bf16 matmuls are emulated, expect local training to run "
        f'{BF16_SLOWDOWN} slower than fp32; use precision = "fp32" on this machine',
        RuntimeWarning, stacklevel=3)
    return True

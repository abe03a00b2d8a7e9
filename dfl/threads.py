"""How many threads a dfl process computes with, and how its OpenMP threads wait for each other.

torch's CPU kernels run in OpenMP parallel regions; a step of a small model is ~100 of them, each ending in a
barrier. At a barrier libgomp (the OpenMP runtime of torch's Linux CPU wheel) lets a thread spin before it
sleeps: 300,000 rounds of a `pause` loop by default, milliseconds on a CPU whose `pause` takes ~140 cycles. On an
idle machine the partner arrives within microseconds and the spin is free; on a busy one the partner has been
descheduled, every barrier spins away the rest of a time slice, and a run of a few seconds takes minutes
(docs/benchmarks.md, "Threads on a busy machine", has the measurements).

The rule, for every process that imports dfl before torch (`dfl ...`, `python -m dfl`, torchrun ranks, sweep
workers, scripts and notebooks that `import dfl` first):

- Waiting: `GOMP_SPINCOUNT = SPIN_COUNT` (a waiting thread spins about SPIN_COUNT `pause`s, tens of
  microseconds, then sleeps), set by `prepare_environment` at `import dfl`, before torch loads libgomp, unless
  OMP_WAIT_POLICY or GOMP_SPINCOUNT is already set (the user's choice is kept). The variable is inherited by the
  processes dfl starts.
- Count (`Config.threads`, `--threads`, the TOML key `threads`): `"auto"` keeps a count the caller chose: the
  value of OMP_NUM_THREADS when that is set (torchrun sets 1 when it starts several ranks on a machine; a sweep's
  pool sets each worker's share), or torch's count when torch is loaded and the caller changed it from torch's own
  default (`torch.set_num_threads(1)` before `dfl.run`); else the cores in this process's CPU affinity shared
  evenly among the ranks of this machine (torchrun's LOCAL_WORLD_SIZE), at least 1. An integer N is N threads.
  `apply` sets it: torch.set_num_threads when torch is loaded, else OMP_NUM_THREADS and MKL_NUM_THREADS for when
  it loads; `dfl.run` gives torch its previous count back when it returns (`restore`).

When torch was imported before dfl, libgomp has read its environment already: the thread count still applies
(torch.set_num_threads), but the spin cannot change any more. That costs time only on a busy machine (threads
descheduled while their partners spin), so `apply` warns (`SpinWarning`, once per process) only when the machine
is busy as it starts: more than one thread, and the 1-minute load average plus this run's threads exceed the CPUs
by a whole one (`busy`). Set GOMP_SPINCOUNT yourself before importing torch, or import dfl first; or silence it
with `warnings.filterwarnings("ignore", category=dfl.threads.SpinWarning)`.

This module imports no torch (it runs before torch loads): it finds torch in `sys.modules` when it is loaded.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfl.errors import ConfigError

if TYPE_CHECKING:  # annotations only
    from dfl.config import Config

AUTO = "auto"
# GOMP_SPINCOUNT set at import: see docs/benchmarks.md ("Threads on a busy machine") for the measurements
SPIN_COUNT = 1_000
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# the most threads a process may ask for: every OpenMP thread reserves a stack, so threads = 10^9 took memory until
# the process was killed; 1024 is above the cores of any one machine dfl runs on
MAX_THREADS = 1024

# at import of dfl: was torch already loaded (its OpenMP runtime has read the environment), and did dfl set the
# spin count itself
_state: dict[str, Any] = {"torch_first": None, "set_spin": False, "warned": False}


class SpinWarning(RuntimeWarning):
    """torch was imported before dfl on a busy machine: its OpenMP threads spin at every barrier (module doc)."""


def check(value: Any, where: str = "threads") -> None:
    """Raise `ConfigError` (one line naming `where`) unless `value` is "auto" or an integer in [1, MAX_THREADS].

    No torch: the CLI and `Config` checks may call it before torch loads.
    """
    if value == AUTO and isinstance(value, str):
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise ConfigError(f'{where} must be "auto" or an integer in [1, {MAX_THREADS}] (torch threads of the '
                          f"process), got {shown}")


def check_config(config: Config) -> None:
    """`Config.threads`: "auto" or an integer in [1, MAX_THREADS]."""
    check(config.threads)


def cores() -> int:
    """The cores this process may run on: its CPU affinity (Slurm's and taskset's restrictions included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return os.cpu_count() or 1


def share(processes: int) -> int:
    """Threads for each of `processes` processes that share this process's cores: cores // processes, >= 1."""
    return max(1, cores() // max(1, processes))


def _env_count(name: str) -> int | None:
    """A positive integer environment variable, or None when unset or not a positive integer."""
    text = os.environ.get(name, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def count(value: Any = AUTO) -> int:
    """The number of threads `value` ("auto" or N) means in this process (see the module's rule)."""
    check(value)
    if value != AUTO:
        return int(value)
    given = _env_count("OMP_NUM_THREADS")
    if given is not None:
        return given
    chosen = callers_torch_threads()
    if chosen is not None:
        return chosen
    return share(_env_count("LOCAL_WORLD_SIZE") or 1)


def torch_default_threads() -> int:
    """The intra-op thread count torch starts with when its environment sets none.

    MKL_NUM_THREADS, else OMP_NUM_THREADS (as torch reads them when it loads), else the physical cores of the machine
    (cpuinfo's count, which torch uses: every core of /sys/devices/system/cpu, not this process's affinity), or the
    logical CPUs where that cannot be read.
    """
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        given = _env_count(name)
        if given is not None:
            return given
    logical = os.cpu_count() or 1
    physical = _physical_cores()
    return physical if 0 < physical < logical else logical


def _physical_cores() -> int:
    """Distinct (package, core) pairs under /sys/devices/system/cpu (Linux); 0 where there are none to read."""
    pairs = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            pairs.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            return 0
    return len(pairs)


def callers_torch_threads() -> int | None:
    """The thread count of a loaded torch when it differs from torch's default: one the caller chose, else None.

    A count dfl set itself (`apply` inside `dfl.run`) is given back when the run returns (`restore`), so what is left
    is the caller's.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    current = int(torch.get_num_threads())
    return current if current != torch_default_threads() else None


def load_average() -> float | None:
    """The 1-minute load average of the machine (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover (Windows)
        return None


def busy(threads: int) -> bool:
    """Whether `threads` more threads would wait for a CPU: the 1-minute load average + threads >= CPUs + 1."""
    load = load_average()
    return load is not None and load + threads >= (os.cpu_count() or 1) + 1


def prepare_environment() -> bool:
    """At `import dfl`.

    Set GOMP_SPINCOUNT = SPIN_COUNT unless torch is loaded already or OMP_WAIT_POLICY / GOMP_SPINCOUNT is set. Returns
    whether it set it. Idempotent.
    """
    if _state["torch_first"] is None:
        _state["torch_first"] = "torch" in sys.modules
    if _state["torch_first"] or any(name in os.environ for name in WAIT_VARIABLES):
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    _state["set_spin"] = True
    return True


def spin_is_bounded() -> bool:
    """Whether this process's OpenMP threads spin boundedly while they wait.

    True when they wait as the rule says or as the user set; False when torch was loaded before dfl, so libgomp
    kept its default spin.
    """
    return bool(_state["set_spin"]) or not _state["torch_first"] or any(n in os.environ for n in WAIT_VARIABLES)


def apply(value: Any = AUTO) -> int:
    """Give this process `count(value)` threads; return the count.

    Through torch.set_num_threads when torch is loaded, else through the environment torch reads when it loads.
    Warns (`SpinWarning`) once per process when torch was loaded before dfl with libgomp's default spin, with more
    than one thread, on a machine that is busy now (`busy`): the case that collapses.
    """
    n = count(value)
    torch = sys.modules.get("torch")
    if torch is None:
        for name in COUNT_VARIABLES:
            os.environ[name] = str(n)
        return n
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    if n > 1 and not spin_is_bounded() and not _state["warned"] and busy(n):
        _state["warned"] = True
        warnings.warn(f"torch was imported before dfl and this machine is busy (load average "
                      f"{load_average():.1f} on {os.cpu_count()} CPUs), so the run's {n} OpenMP threads spin for "
                      f"milliseconds at every barrier and run slowly: import dfl before torch, or set "
                      f"GOMP_SPINCOUNT={SPIN_COUNT} before starting Python, or threads = 1; to silence this: "
                      "warnings.filterwarnings('ignore', category=dfl.threads.SpinWarning)", SpinWarning,
                      stacklevel=2)
    return n


def torch_threads() -> int | None:
    """The thread count of torch now (None while torch is not loaded): what `restore` gives back."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())


def restore(previous: int | None) -> None:
    """Give torch back the thread count `torch_threads()` returned before a run (nothing when it was None)."""
    torch = sys.modules.get("torch")
    if previous is not None and torch is not None and torch.get_num_threads() != previous:
        torch.set_num_threads(previous)

"""How many clients one vectorized call trains (`client_chunk = "auto"`), from measured memory.

The per-client footprint is measured, not guessed: one gradient call on 1 and on k clients runs under
`PeakTracker`, which follows every tensor the call allocates (a `TorchDispatchMode` sees the real tensors
under `vmap`/`grad`) and records the peak of the live bytes; the slope (peak_k − peak_1)/(k − 1) is the
bytes each extra client adds, the intercept what the call needs anyway. On CUDA the allocator's own peak
statistics give the same two numbers.

The chunk is the largest that
- fits: fixed + chunk · (per_client + step temporaries) ≤ a fraction of the memory free now plus what the
  process's per-client stacks already hold (CUDA: `torch.cuda.mem_get_info`; CPU: MemAvailable, or the cgroup
  limit when lower, after the free blocks of this process's own heap — memory an earlier run freed and
  `keep_freed_memory` keeps for reuse, which the OS counts as used — are handed back to the OS), after every
  per-client stack this process holds (`held_bytes`: X, the algorithm's per-client state, the gossip's state,
  the asynchronous mode's message pool — measured from the tensors themselves, this process's rows only) and the
  round's `[m_local, d]` temporaries (`ROUND_STACKS`: the trained Y, a momentum buffer, the gossip output) are set
  aside; and
- is fast: on CPU, chunk · per_client ≤ CPU_CHUNK_BYTES. Larger calls did not run faster on the 2-core CPU,
  and calls with hundreds of MB of temporaries ran slower: every temporary above glibc's mmap threshold
  (32 MiB) is a fresh mapping that the kernel zero-fills page by page (system time exceeded user time at
  1,000 mlp clients in one call). cnn1d, 256 clients, per client-step: chunk 16 15.4 ms, 32 11.5, 64 8.2,
  128 7.6, 256 9.6 (with 3.3 s of system time); mlp gradient, 1,000 clients: chunk 10 0.56 ms per client,
  25–200 0.38–0.41, 1,000 0.45. On CUDA there is no such cost (a caching allocator), so only memory binds.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dfl.errors import ConfigError
from dfl.sysmem import available_memory

CPU_CHUNK_BYTES = 128 * 2**20
MEMORY_FRACTION = {"cpu": 0.5, "cuda": 0.8}  # of the memory free when the run starts
# [m_local, d] temporaries of a round besides the stacks a process holds (`held_bytes`): the trained Y, a momentum
# buffer, the gossip output. A checkpoint adds at most ROW_CHUNK_BYTES per tensor (`dfl.engine.checkpoint`).
ROUND_STACKS = 3
STACK_COPIES = 1 + ROUND_STACKS  # without a measured `held_bytes`: X alone is held
# [chunk, d] temporaries of one local step besides the gradient call: Y rows, g, the SAM point, the step.
STEP_TEMPORARIES = 4
# Rows of one stored chunk of a checkpoint or of the final parameters' shards (`dfl.engine.checkpoint`): what DCP's
# writer copies to the host at a time, so what writing them costs beyond the stacks
ROW_CHUNK_BYTES = 64 * 2**20


class PeakTracker(TorchDispatchMode):
    """Peak bytes of the tensors allocated inside the `with` block (freed ones are subtracted)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size and key not in self._seen:
                    self._seen.add(key)
                    self.live += size
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key, size)
        return out

    def _free(self, key: int, size: int) -> None:
        self.live -= size
        self._seen.discard(key)


def call_peak_bytes(fn, device: torch.device) -> int:
    """Peak bytes allocated by fn() beyond what was allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    tracker = PeakTracker()
    with tracker:
        fn()
    return tracker.peak


def available_bytes(device: torch.device) -> int:
    """Memory free now.

    CUDA's free memory (the caching allocator's reserved-but-free blocks included), or on CPU the OS's MemAvailable
    (capped by a cgroup limit) after this process's free heap is handed back.

    The heap part matters with `keep_freed_memory`: a finished run's stacks stay in the heap as free blocks,
    resident (so not in MemAvailable, and charged to the cgroup). Without them a second run of the same size in
    one process found "not even one client fits"; counting them as free (mallinfo2) let it run but not reuse
    them: when the first run's Result is kept, its stacks split the free heap into holes smaller than the
    second run's `[m, d]` stacks, which then grew the heap (mlp × 10,000: 19.3 GiB at the second run's peak).
    `malloc_trim` returns every free page of the heap to the OS, so MemAvailable counts it and the process
    holds only live memory (13.7–14.0 GiB there); the round loop's reuse of freed blocks is unchanged, as a
    run trims only when it plans its chunk and when it ends (`dfl.engine.runner.run`).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    release_free_heap()
    return available_memory()  # MemAvailable, capped by the cgroup's limit (dfl.sysmem: no torch)


def release_free_heap() -> bool:
    """Hand the free pages of the kept heap back to the OS.

    The heap is the one `keep_freed_memory` keeps; glibc's `malloc_trim(0)` also releases whole free pages inside it,
    not only at its top. Returns whether it ran: not without the kept heap (glibc's defaults already unmap large
    blocks and trim the top) nor off glibc.
    """
    if not _HEAP_KEPT:
        return False
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def stack_bytes(clients: int, dim: int, extra_stacks: int = 0, itemsize: int = 4, round_bytes: int = 0) -> int:
    """The bytes `check_stacks` plans for a run's stacks.

    X, `STACK_COPIES` and `extra_stacks` more `[m, d]` stacks, and the `round_bytes` a client that the algorithm's
    round holds beyond them (its card's `round_bytes`).
    """
    return (1 + STACK_COPIES + extra_stacks) * clients * dim * itemsize + clients * round_bytes


def check_stacks(clients: int, dim: int, device: torch.device, extra_stacks: int = 0, itemsize: int = 4,
                 round_bytes: int = 0, algorithm: str = "") -> None:
    """Refuse a run whose client stacks alone would not fit in memory.

    Refuse, before the client stack is allocated, a run whose `[m, d]` stacks alone (X and `STACK_COPIES` more,
    `extra_stacks` beyond them, and the `round_bytes` a client that `algorithm`'s round holds beyond them) would
    not fit in the memory budget (`stack_bytes`): a ConfigError naming clients, the memory they need and what is
    free. `choose_chunk` then sizes the gradient calls in what is left.
    """
    kind = "cuda" if device.type == "cuda" else "cpu"
    copies = 1 + STACK_COPIES + extra_stacks
    need = stack_bytes(clients, dim, extra_stacks, itemsize, round_bytes)
    free = available_bytes(device)
    budget = int(free * MEMORY_FRACTION[kind])
    if need > budget:
        own = f" and {algorithm}'s round temporaries ({round_bytes:,} bytes a client)" if round_bytes else ""
        raise ConfigError(
            f"clients = {clients:,}: the run keeps {copies} [m, d] stacks of {clients:,} clients x {dim:,} parameters"
            f"{own}, ~{_gib(need)}, more than its budget of {_gib(budget)} ({MEMORY_FRACTION[kind]:.0%} of "
            f"{_gib(free)} free on {device}); use fewer clients, more processes (torchrun) or a smaller model"
        )


def choose_chunk(
    clients: int, fixed: int, per_client: int, row_bytes: int, free: int, device: torch.device,
    held_bytes: int | None = None,
) -> tuple[int, dict]:
    """(chunk, estimate) for `clients` local clients: the largest chunk that fits and is fast (see module doc).

    fixed, per_client: the gradient call's bytes (intercept, slope); row_bytes: one client's parameters (d × 4);
    free: memory free now; held_bytes: the per-client stacks this process already holds (`held_bytes()`; None: X
    alone), set aside with ROUND_STACKS more [clients, d] temporaries. Raises ConfigError (a ValueError naming
    client_chunk), with the estimate, when not even one client fits.
    """
    kind = "cuda" if device.type == "cuda" else "cpu"
    held = clients * row_bytes if held_bytes is None else int(held_bytes)
    budget = int((free + held) * MEMORY_FRACTION[kind])  # what is free now, and what the held stacks occupy
    stacks = held + ROUND_STACKS * clients * row_bytes
    each = per_client + STEP_TEMPORARIES * row_bytes
    estimate = {"free_bytes": free, "budget_bytes": budget, "held_bytes": held, "stack_bytes": stacks,
                "fixed_bytes": fixed, "bytes_per_client": each}
    room = budget - stacks - fixed
    if room < each:
        raise ConfigError(
            f"client_chunk: not even one client fits in memory on {device}: the round needs ~{_gib(stacks)} for the "
            f"[m, d] stacks of {clients} clients ({_gib(held)} held: X and per-client state; {ROUND_STACKS} "
            f"temporaries) + {_gib(fixed + each)} for one client's gradient call, but the budget is {_gib(budget)} "
            f"({MEMORY_FRACTION[kind]:.0%} of {_gib(free + held)}); use fewer clients per process (more processes), "
            "a smaller model or a smaller batch_size"
        )
    fit = room // each
    fast = clients if kind == "cuda" else max(1, CPU_CHUNK_BYTES // max(each, 1))
    chunk = int(max(1, min(clients, fit, fast)))
    estimate.update(chunk=chunk, memory_limit=int(min(fit, clients)))
    return chunk, estimate


def held_bytes(rows: dict, async_engine=None) -> int:
    """Bytes of the per-client stacks a process holds.

    Its rows of X and of every per-client state (`dfl.engine.checkpoint.local_rows`; an entry made only as it is
    written, a `RowSource`, holds nothing), and the asynchronous mode's message pool when there is one
    (`AsyncEngine.planned_pool_bytes`: what it holds and the next growth of it).
    """
    total = sum(t.numel() * t.element_size() for t in rows.values() if isinstance(t, torch.Tensor))
    pool = async_engine.planned_pool_bytes() if async_engine is not None else 0
    return int(total + pool)


def final_params_plan(how: str, clients: int, local_clients: int, dim: int, itemsize: int, device: torch.device,
                      is_main: bool) -> dict[str, int | str]:
    """The end of run's memory and writes on this process (`dfl.engine.experiment.final_params_plan`'s `how`).

    host_bytes: host memory the final parameters take besides the run's stacks; written_bytes: what this process
    writes. "one file" (one process): X on the host (a copy from a GPU) and params.pt. "gathered": the main process
    assembles every client's rows on its host, m·d, and writes params.pt; the others copy their rows to their host.
    "shards": every process writes its own rows through chunks of at most `ROW_CHUNK_BYTES` (`ckpt.save_final_params`)
    and the main process reads nothing back until `Result.params` is used; the others keep their rows on the host
    (their `Result.params`; a copy from a GPU).
    """
    row = dim * itemsize
    on_gpu = device.type == "cuda"
    local = local_clients * row
    if how == "one file":
        host, written = (local if on_gpu else 0), local
    elif how == "gathered":
        host = clients * row if is_main else (local if on_gpu else 0)
        written = clients * row if is_main else 0
    else:
        host = min(local, ROW_CHUNK_BYTES) + (local if on_gpu and not is_main else 0)
        written = local
    return {"final_params": how, "final_params_host_bytes": int(host), "final_params_written_bytes": int(written)}


def check_final_params(plan: dict[str, int | str], clients: int, dim: int) -> None:
    """Refuse, before the first round, a run whose main process could not hold the final parameters it gathers.

    The gathered population (`final_params_plan` "gathered") must fit in the host memory free now: a ConfigError
    naming gather_params and the memory, instead of an out-of-memory kill after the last round.
    """
    need = int(plan["final_params_host_bytes"])
    if plan["final_params"] != "gathered" or need == 0:
        return
    free = available_memory()
    if need > free:
        raise ConfigError(
            f"gather_params: rank 0 would assemble the final parameters of all {clients:,} clients x {dim:,} "
            f"parameters on its host at the end of the run, ~{_gib(need)}, more than the {_gib(free)} free there; "
            "leave gather_params off and give the run a run directory (out): each process then writes its own rows "
            "to params.shards/"
        )


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**28 else f"{b / 2**20:.1f} MiB"


def measure_footprint(call, clients: int, device: torch.device, probe: int = 4) -> tuple[int, int]:
    """(fixed, per_client) bytes of `call(k)` — a gradient call on k clients — from k = 1 and k = probe."""
    k = max(1, min(probe, clients))
    one = call_peak_bytes(lambda: call(1), device)
    if k == 1:
        return 0, max(one, 1)
    many = call_peak_bytes(lambda: call(k), device)
    per_client = max(math.ceil((many - one) / (k - 1)), 1)
    return max(one - per_client, 0), per_client


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_HEAP_KEPT = False


def keep_freed_memory() -> bool:
    """Make glibc serve every allocation from its heap and keep what is freed for reuse (CPU runs).

    By default glibc gives each allocation above 32 MiB its own mapping and unmaps it on free, so every round
    the `[m, d]` stacks and `[chunk, d]` temporaries are mapped afresh and zero-filled page by page by the
    kernel: at 1,000 mlp clients that system time exceeded the arithmetic, and a gossip step on 200 MB ran at
    15% of the copy bandwidth. With mappings off (M_MMAP_MAX = 0) and trimming only past 2 GiB of free heap
    top (M_TRIM_THRESHOLD), freed blocks are reused: same step, 68% of copy bandwidth; mlp × 1,000 rounds
    1.3-2× faster, with no system time. The price: during a run the process keeps its peak heap; `dfl.run` hands
    the free part back to the OS when it ends and before it plans (`release_free_heap`).

    Process-wide and once; `DFL_MALLOC=system` keeps glibc's defaults; a no-op off glibc. Returns whether the
    setting is in force.
    """
    global _HEAP_KEPT
    if _HEAP_KEPT:
        return True
    if os.environ.get("DFL_MALLOC", "").strip().lower() == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (e.g. musl)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _HEAP_KEPT = bool(mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
                      and mallopt(_M_TOP_PAD, 64 * 2**20))
    return _HEAP_KEPT


def heap_kept() -> bool:
    """Whether `keep_freed_memory` is in force in this process."""
    return _HEAP_KEPT

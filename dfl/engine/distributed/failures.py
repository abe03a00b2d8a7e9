"""When a rank of a multi-process run fails: the heartbeat, the failure record, and naming the rank that failed.

A rank that fails records "rank r (host) failed: …" in the rendezvous store before it leaves the group
(`FailureWatch.report`); every rank's heartbeat thread bumps a counter in the store every HEARTBEAT_SECONDS. When a
collective fails, `FailureWatch.peer_failure` names the cause: the recorded failure of another rank, or a rank whose
heartbeat stopped (SIGKILL, a lost node) — `PeerFailure: rank r stopped because rank k …` — and if no other rank
failed, the error is this rank's own and is reported as such (never blamed on "another rank"). gloo notices a dead
peer at once (its sockets close). NCCL does not: a rank waiting for a dead peer waits for the watchdog; so under
NCCL the heartbeat thread also watches, and on a recorded failure or a heartbeat silent for STALE_SECONDS it aborts
the process group, which ends the wait, and the rank stops with PeerFailure within seconds. The process group's
NCCL environment (`dfl.engine.distributed.setup`) lets the watchdog abort the communicators without killing the
process, so that the blocked rank raises and dfl reports why. `dist_timeout` stays the bound on any wait (a frozen
rank: its heartbeat thread still runs).

What an abort does under NCCL (torch 2.13; docs/how-to/torchrun.md#nccl-semantics-dfl-relies-on). NCCL collectives
are asynchronous to the host: `dist.all_reduce` returns once the kernel is enqueued, so a rank waiting for a dead
peer is blocked in a later host sync (`.item()`, `.cpu()`, a device-to-host copy), not in the collective.
`_abort_process_group()`, called by the heartbeat thread, aborts the NCCL communicators (their kernels exit, so
that host sync returns, with whatever the aborted kernels left in the buffers) and clears torch's registry of
groups (the default group and store are gone: `dist.is_initialized()` is False, and any `dist` call raises). So
the watch records the failure BEFORE it aborts, and once it has aborted, every exception this rank raises
afterwards, whatever its type (a ValueError from torch's cleared registry, a DistBackendError, an error computed
from garbage), is a consequence: `peer_failure` names the peer. Every collective checks first, and the engine
calls `check` where garbage could leave the process (before a round's metrics are recorded, a checkpoint is
written or the final rows are returned: `dfl.engine.runner`). The watch keeps its own reference to the store, so
the failure record and rank 0's store outlive the aborted group.

Store keys: FAILURE_KEY (the first failure's message), STOPPED_KEY (how many ranks have read or written it) and
`dfl/beat/<rank>` (each rank's heartbeat counter).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from dfl.errors import PeerFailure

FAILURE_KEY = "dfl/failure"
STOPPED_KEY = "dfl/stopped"  # ranks that have read or written the failure
STORE_GRACE_SECONDS = 10.0  # how long rank 0 keeps the store alive for the others to read the failure
HEARTBEAT_SECONDS = 1.0  # each rank bumps its heartbeat counter in the store this often (a daemon thread)
STALE_SECONDS = 10.0  # NCCL: a peer whose heartbeat has not moved for this long is gone; the group is aborted
DEAD_PEER_SECONDS = 3.0  # after a failed collective: how long heartbeats are watched to name a dead peer

_T = TypeVar("_T")


class FailureWatch:
    """One rank's side of the failure handling of its process group (see the module docstring).

    It runs the rank's heartbeat thread, marks the exceptions raised inside collectives, records this rank's
    failure in the store and names the rank whose failure stopped this one.

    Args:
        rank: this process's rank.
        world: the number of processes in the group.
        watch: the heartbeat thread also watches the failure record and the peers' heartbeats, and aborts the
            process group on a failure (NCCL, which does not notice a dead peer by itself).

    Attributes:
        stopping: a failure on some rank is known here: no more collectives (no closing barrier).
        dead: how many peers were found dead (their heartbeat stopped): they will not say they stopped.
    """

    def __init__(self, rank: int, world: int, watch: bool):
        self.rank = rank
        self.world = world
        self.stopping = False
        self.dead = 0
        self._collective_error: BaseException | None = None  # the latest exception raised inside a collective
        self._monitor = _Monitor.start(rank, world, watch)

    def collective(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run one torch.distributed call, `fn(*args, **kwargs)`.

        An exception it raises is marked as a collective failure (`peer_failure` decides whose), and a failure
        the heartbeat thread saw stops the rank with PeerFailure. Under NCCL the call returns once enqueued: a
        failure that happens while the kernel runs shows at a later host sync or at the next call (`check`).

        Raises:
            PeerFailure: the heartbeat thread saw another rank fail (before the call, or while it was blocked).
        """
        self.check()
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            self._collective_error = exc
            raise
        self.check()  # aborted while we were blocked (gloo blocks in the call; NCCL only to enqueue it)
        return out

    @property
    def aborted(self) -> bool:
        """Whether the heartbeat thread aborted the process group because another rank failed."""
        return self._monitor is not None and self._monitor.failure is not None

    def check(self) -> None:
        """Raise the PeerFailure the heartbeat thread saw, if any (no collective, no store access).

        Called before and after every collective and by the engine before anything computed since the last
        collective leaves the process: once the group is aborted, the results of the collectives in flight are
        garbage (module docstring).

        Raises:
            PeerFailure: another rank failed and this rank's group was aborted.
        """
        if self._monitor is not None and self._monitor.failure is not None:
            self._stopped()
            raise PeerFailure(f"rank {self.rank} stopped because {self._monitor.failure}")

    def report(self, exc: BaseException) -> None:
        """Record "rank r (host) failed: …" in the rendezvous store so the other ranks can say why they stopped.

        Their blocked collectives fail when this process exits (gloo closes its sockets) or, under NCCL, when their
        heartbeat threads read the record and abort the group. A PeerFailure (another rank's failure) is not
        recorded.
        """
        if isinstance(exc, PeerFailure):
            return
        self.stopping = True
        store = self._store()
        if store is None:
            return
        try:
            if not store.check([FAILURE_KEY]):
                store.set(FAILURE_KEY, f"rank {self.rank} ({socket.gethostname()}) failed: {_describe(exc)}")
            store.add(STOPPED_KEY, 1)
        except Exception:  # the store itself may be gone; the error still propagates on this rank
            pass

    def peer_failure(self, exc: BaseException) -> BaseException | None:
        """A `PeerFailure` naming the rank that caused `exc`, or None when the error is this rank's own.

        It is returned when
        - the heartbeat thread aborted the group (`aborted`): whatever `exc` is, it followed the abort (module
          docstring); or
        - `exc` is a failed collective (one run by `collective`, a `torch.distributed.DistError` such as NCCL's
          DistBackendError from a later host sync or `work.wait()`, or a plain RuntimeError: gloo's report of a
          dead peer in another library's collective, e.g. a checkpoint's) and another rank failed (recorded in
          the store, or its heartbeat stopped).
        None when the error is this rank's own, which is then reported as it is.
        """
        if isinstance(exc, PeerFailure):
            return None
        message = self._monitor.failure if self._monitor is not None else None
        if message is None and not (self._from_collective(exc) or type(exc) is RuntimeError):
            return None
        store = self._store()
        if message is None and store is not None:
            try:
                if store.check([FAILURE_KEY]):
                    message = store.get(FAILURE_KEY).decode()
            except Exception:  # the store may have lived in the failed process
                message = "rank 0 (which hosts the rendezvous store) failed or was killed"
        if message is None and self._monitor is not None:
            dead = self._monitor.silent_peers(DEAD_PEER_SECONDS)
            self.dead = len(dead)
            if dead:
                message = (f"rank {dead[0]} stopped responding (killed, or its node was lost: its heartbeat stopped; "
                           f"see its output)")
        if message is None or message.startswith(f"rank {self.rank} "):
            return None  # nobody else failed: the collective's error is this rank's own, reported as it is
        self._stopped()
        return PeerFailure(f"rank {self.rank} stopped because {message}")

    def _stopped(self) -> None:
        """This rank stops for another's failure: no more collectives; counted once in STOPPED_KEY for rank 0."""
        if self.stopping:
            return
        self.stopping = True
        try:
            store = self._store()
            if store is not None:
                store.add(STOPPED_KEY, 1)
        except Exception:  # the store is gone with rank 0: nobody waits for the count
            pass

    def _from_collective(self, exc: BaseException) -> bool:
        """Whether `exc`, or an exception in its cause/context chain, was raised inside a collective.

        Inside `collective`, or anywhere as a `torch.distributed.DistError` (DistBackendError: NCCL's errors, which
        surface at a host sync or `work.wait()` after the call returned; DistNetworkError, DistStoreError).
        """
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            if e is self._collective_error or isinstance(e, dist.DistError):
                return True
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return False

    def _store(self):
        """The rendezvous store: the heartbeat's own reference (it outlives an aborted group), else torch's."""
        return self._monitor.store if self._monitor is not None else _store()

    def stop(self) -> None:
        """Stop the heartbeat thread."""
        if self._monitor is not None:
            self._monitor.stop()

    def destroy_group_after_failure(self) -> None:
        """Destroy the process group after a failure, rank 0 keeping the store alive for the others.

        Rank 0 (which hosts the rendezvous store unless torchrun's agent does) closes its connections, which makes
        the others' pending collectives fail, then keeps the store alive for up to STORE_GRACE_SECONDS so that
        every rank can read which rank failed and why. After the heartbeat thread aborted the group, torch has
        already dropped it (nothing to destroy); rank 0 still waits, through the heartbeat's store reference.
        """
        store = self._store() if self.rank == 0 else None  # this reference keeps the store's server up
        if dist.is_initialized():
            dist.destroy_process_group()
        if store is not None:
            _wait_for_stopped_ranks(store, self.world - self.dead)


class _Monitor:
    """The heartbeat thread of one rank (module docstring).

    Bumps `dfl/beat/<rank>` every HEARTBEAT_SECONDS; with `watch` (NCCL) it also reads the failure record and the
    peers' heartbeats, and aborts the process group on a failure or a peer silent for STALE_SECONDS, so that a
    blocked collective ends.
    """

    def __init__(self, store, rank: int, world: int, watch: bool):
        self.store, self.rank, self.world, self.watch = store, rank, world, watch
        self.failure: str | None = None
        self._stop = threading.Event()
        self._seen = {q: (-1, time.monotonic()) for q in range(world) if q != rank}
        self._thread = threading.Thread(target=self._run, name=f"dfl-heartbeat-{rank}", daemon=True)

    @classmethod
    def start(cls, rank: int, world: int, watch: bool) -> _Monitor | None:
        store = _store()
        if store is None or world < 2:
            return None
        monitor = cls(store, rank, world, watch)
        monitor._thread.start()
        return monitor

    def stop(self) -> None:
        self._stop.set()

    def beats(self) -> dict[int, int]:
        """Each peer's heartbeat counter, read from the store now."""
        return {q: int(self.store.add(f"dfl/beat/{q}", 0)) for q in self._seen}

    def silent_peers(self, seconds: float) -> list[int]:
        """Peers whose heartbeat does not move for `seconds` (watched now, in the calling thread)."""
        try:
            first = self.beats()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(min(0.25, seconds))
                now = self.beats()
                first = {q: v for q, v in first.items() if now[q] == v}
                if not first:
                    return []
            return sorted(first)
        except Exception:  # the store is gone: it lived in rank 0 (no torchrun agent)
            return [0] if self.rank != 0 else []

    def _run(self) -> None:
        key = f"dfl/beat/{self.rank}"
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.store.add(key, 1)
                if self.watch and self.failure is None:
                    self._watch()
            except Exception:  # the store is gone (the run is ending, or rank 0 died): nothing left to watch
                return

    def _watch(self) -> None:
        if self.store.check([FAILURE_KEY]):
            message = self.store.get(FAILURE_KEY).decode()
            if not message.startswith(f"rank {self.rank} "):
                self._abort(message)
            return
        now = time.monotonic()
        for q, value in self.beats().items():
            last, since = self._seen[q]
            if value != last:
                self._seen[q] = (value, now)
            elif now - since > STALE_SECONDS:
                message = f"rank {q} stopped responding (no heartbeat for {STALE_SECONDS:.0f} s: killed, or its node " \
                          "was lost; see its output)"
                if not self.store.check([FAILURE_KEY]):
                    self.store.set(FAILURE_KEY, message)
                self._abort(message)
                return

    def _abort(self, message: str) -> None:
        # The failure first: the main thread, released from its host sync by the abort, must find it set before
        # it uses the garbage the aborted collective left (FailureWatch.check, module docstring).
        self.failure = message
        try:  # aborts the NCCL communicators: the kernels exit, the main thread's host sync returns
            dist.distributed_c10d._abort_process_group()
        except Exception:  # already aborted or destroyed (the watchdog, or the run ending)
            pass


def _wait_for_stopped_ranks(store, world_size: int) -> None:
    deadline = time.monotonic() + STORE_GRACE_SECONDS
    try:
        while time.monotonic() < deadline:
            if store.add(STOPPED_KEY, 0) >= world_size:
                return
            time.sleep(0.05)
    except Exception:  # a broken store: nothing left to wait for
        return


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None

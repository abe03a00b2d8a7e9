"""When a rank of a multi-process run fails: the heartbeat, the failure record, and naming the rank that failed.

A rank that fails records "rank r (host) failed: …" in the rendezvous store before it leaves the group
(`FailureWatch.report`); every rank's heartbeat thread bumps a counter in the store every HEARTBEAT_SECONDS. When a
collective fails, `FailureWatch.peer_failure` names the cause: the recorded failure of another rank, or a rank whose
heartbeat stopped (SIGKILL, a lost node) — `PeerFailure: rank r stopped because rank k …` — and if no other rank
failed, the error is this rank's own and is reported as such (never blamed on "another rank"). gloo notices a dead
peer at once (its sockets close). NCCL does not: a rank blocked in a collective waits for the watchdog; so under NCCL
the heartbeat thread also watches, and on a recorded failure or a heartbeat silent for STALE_SECONDS it aborts the
process group, which ends the blocked collective, and the rank stops with PeerFailure within seconds. The process
group's NCCL environment (`dfl.engine.distributed.setup`) lets the watchdog abort the communicators without killing
the process, so that the blocked rank raises and dfl reports why. `dist_timeout` stays the bound on any wait (a
frozen rank: its heartbeat thread still runs).

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
        the heartbeat thread saw stops the rank with PeerFailure.

        Raises:
            PeerFailure: the heartbeat thread saw another rank fail (before the call, or while it was blocked).
        """
        self._raise_seen_failure()
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            self._collective_error = exc
            raise
        self._raise_seen_failure()  # aborted while we were blocked
        return out

    def _raise_seen_failure(self) -> None:
        if self._monitor is not None and self._monitor.failure is not None:
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
        store = _store()
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

        A `PeerFailure` naming the rank that caused `exc` here, when `exc` is a failed collective (one run by
        `collective`, or a plain RuntimeError: gloo's report of a dead peer in another library's collective,
        e.g. a checkpoint's) and another rank failed (recorded in the store, or its heartbeat stopped); None
        when the error is this rank's own, which is then reported as it is.
        """
        if isinstance(exc, PeerFailure) or not (self._from_collective(exc) or type(exc) is RuntimeError):
            return None
        message = self._monitor.failure if self._monitor is not None else None
        store = _store()
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
        self.stopping = True
        try:
            if store is not None:
                store.add(STOPPED_KEY, 1)
        except Exception:
            pass
        return PeerFailure(f"rank {self.rank} stopped because {message}")

    def _from_collective(self, exc: BaseException) -> bool:
        """Whether `exc`, or an exception in its cause/context chain, was raised inside a collective."""
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            if e is self._collective_error or isinstance(e, dist.DistError):
                return True
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return False

    def stop(self) -> None:
        """Stop the heartbeat thread."""
        if self._monitor is not None:
            self._monitor.stop()

    def destroy_group_after_failure(self) -> None:
        """Destroy the process group after a failure, rank 0 keeping the store alive for the others.

        Rank 0 (which hosts the rendezvous store unless torchrun's agent does) closes its connections, which makes
        the others' pending collectives fail, then keeps the store alive for up to STORE_GRACE_SECONDS so that
        every rank can read which rank failed and why.
        """
        store = _store() if self.rank == 0 else None  # this reference keeps the store's server up
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
        self.failure = message
        try:  # ends the collective the main thread is blocked in (NCCL); it then raises PeerFailure
            dist.distributed_c10d._abort_process_group()
        except Exception:
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

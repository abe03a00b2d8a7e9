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

Who watches whom (NCCL): rank 0 reads the heartbeats of ranks 1 … P−1, rank 1 reads rank 0's (`watched_ranks`), and
every rank reads the failure record, once per heartbeat. So the store answers about 3P requests a second (P beats,
P failure checks, P watched beats), linear in the number of ranks; when every rank watched every other it answered
P², 260,000 a second at 512 ranks, enough to delay answers past STALE_SECONDS and report live ranks as dead. A
rank that finds a peer silent records "rank k stopped responding" as the failure, which every other rank then reads
within a heartbeat. If the store itself stops answering for STALE_SECONDS (it lived in rank 0, which died), the
watching rank stops too, naming it.

The end of a run. A rank that has done its last collective of the run (`FailureWatch.finish`: after the final
parameters are written and the closing barrier; `dfl.engine.runner`) adds FINISHED_MARK to its heartbeat counter
and counts itself in FINISHED_KEY: it is not watched any more, whatever its end-of-run work takes (rank 0 writing
the summary, loggers uploading), and its own watch stops, since no collective of the run can wait for a peer any
more. Nothing after `finish` waits on another rank but rank 0, which keeps the rendezvous store up (it hosts it,
unless torchrun's agent does) until every rank has finished, or gone silent after its last collective
(`FailureWatch.wait_for_peers_to_finish`). Before this, a rank stopped its heartbeat and waited in a closing
barrier while rank 0 still watched it: an end of run on rank 0 longer than STALE_SECONDS ended a completed run with
"rank 0 stopped because rank 1 stopped responding", and the barrier, an NCCL collective, timed out after
`dist_timeout` under a longer one.

Store keys: FAILURE_KEY (the first failure's message), STOPPED_KEY (how many ranks have read or written it),
FINISHED_KEY (how many ranks have finished the run) and `dfl/beat/<rank>` (each rank's heartbeat counter, plus
FINISHED_MARK once it has finished).
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
FINISHED_KEY = "dfl/finished"  # ranks that have done their last collective of the run (module docstring)
FINISHED_MARK = 1 << 40  # added to a rank's heartbeat counter when it finishes: no watcher waits for it any more
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
        finished: this rank has done its last collective of the run (`finish`); a collective after it resumes the
            watch (a communicator used for another run).
        dead: how many peers were found dead (their heartbeat stopped): they will not say they stopped.
    """

    def __init__(self, rank: int, world: int, watch: bool):
        self.rank = rank
        self.world = world
        self.stopping = False
        self.finished = False
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
        if self.finished:  # the communicator serves another run: watch again
            self._unfinish()
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
            if not self.finished:  # a finished rank is counted in FINISHED_KEY already
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
            if store is not None and not self.finished:
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

    def finish(self) -> None:
        """This rank has done its last collective of the run: nobody watches it any more (module docstring).

        Adds FINISHED_MARK to its heartbeat counter and counts it in FINISHED_KEY; its own watch stops (no collective
        is left that could wait for a dead peer). Whatever this rank does next (the end-of-run files, loggers) can
        take as long as it takes: no peer reports it as silent. Idempotent.
        """
        if self.finished or self._monitor is None:
            self.finished = True
            return
        self.finished = True
        self._monitor.finish()

    def _unfinish(self) -> None:
        """Undo `finish`: the heartbeat counts as running again and the watch resumes (a communicator reused)."""
        self.finished = False
        if self._monitor is not None:
            self._monitor.unfinish()

    def wait_for_peers_to_finish(self) -> None:
        """Rank 0, at the end of a run: wait until every rank has finished before the rendezvous store goes.

        Rank 0 hosts the store (unless torchrun's agent does); the others may still be reading it until they finish.
        A rank silent for STALE_SECONDS without finishing (it died after its last collective) is not waited for.
        No collective: the others' end of run does not keep rank 0 in an NCCL wait bounded by `dist_timeout`.
        """
        if self.rank == 0 and self._monitor is not None:
            self._monitor.wait_for_finished()

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
        if store is not None:  # ranks that finished before the failure read nothing more from the store
            _wait_for_stopped_ranks(store, self.world - self.dead)


def watched_ranks(rank: int, world: int) -> list[int]:
    """The ranks whose heartbeats `rank` reads under NCCL: rank 0 reads every other rank's, rank 1 reads rank 0's.

    Every rank is watched by one other (rank 0 by rank 1, which matters when torchrun's agent hosts the store and
    rank 0 dies without taking it along), and the store's load stays linear in the number of ranks (module
    docstring).
    """
    if world < 2:
        return []
    if rank == 0:
        return list(range(1, world))
    return [0] if rank == 1 else []


def _beat_key(rank: int) -> str:
    return f"dfl/beat/{rank}"


class _Monitor:
    """The heartbeat thread of one rank (module docstring).

    Bumps `dfl/beat/<rank>` every HEARTBEAT_SECONDS; with `watch` (NCCL) it also reads the failure record and the
    heartbeats of `watched_ranks`, and aborts the process group on a failure, a watched peer silent for
    STALE_SECONDS or a store that stopped answering, so that a blocked collective ends. `tick` is one period's work.
    """

    def __init__(self, store, rank: int, world: int, watch: bool):
        self.store, self.rank, self.world, self.watch = store, rank, world, watch
        self.failure: str | None = None
        self.finished = False
        self._stop = threading.Event()
        now = time.monotonic()
        self._seen = {q: (-1, now) for q in watched_ranks(rank, world)}
        self._thread = threading.Thread(target=self._run, name=f"dfl-heartbeat-{rank}", daemon=True)

    @classmethod
    def start(cls, rank: int, world: int, watch: bool) -> _Monitor | None:
        store = _store()
        if store is None or world < 2:
            return None
        monitor = cls(store, rank, world, watch)
        monitor.reset()
        monitor._thread.start()
        return monitor

    def stop(self) -> None:
        self._stop.set()

    def reset(self) -> None:
        """A counter left FINISHED by an earlier run on the same store (a process group reused) counts as running."""
        value = int(self.store.add(_beat_key(self.rank), 0))
        if value >= FINISHED_MARK:
            self.store.add(_beat_key(self.rank), -FINISHED_MARK * (value // FINISHED_MARK))

    def finish(self) -> None:
        """Mark this rank finished in the store (`FailureWatch.finish`); its watch stops, its heartbeat goes on."""
        self.finished = True
        try:
            self.store.add(_beat_key(self.rank), FINISHED_MARK)
            self.store.add(FINISHED_KEY, 1)
        except Exception:  # the store is gone (rank 0 died after the last collective): nobody is left to tell
            pass

    def unfinish(self) -> None:
        try:
            self.store.add(_beat_key(self.rank), -FINISHED_MARK)
            self.store.add(FINISHED_KEY, -1)
        except Exception:  # the store is gone: the next collective fails and says so
            pass
        now = time.monotonic()
        self._seen = {q: (-1, now) for q in watched_ranks(self.rank, self.world)}
        self.finished = False

    def beats(self) -> dict[int, int]:
        """Every peer's heartbeat counter, read from the store now (one request per peer: after a failure only)."""
        return {q: int(self.store.add(_beat_key(q), 0)) for q in range(self.world) if q != self.rank}

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

    def wait_for_finished(self) -> None:
        """Until every rank has finished (FINISHED_KEY) or the unfinished ones are silent for STALE_SECONDS.

        At most STORE_GRACE_SECONDS: a rank finishes right after the closing barrier that rank 0 passed too, so
        only a communicator closed outside the engine (on some ranks only) waits that long.
        """
        now = time.monotonic()
        deadline = now + STORE_GRACE_SECONDS
        waiting = {q: (-1, now) for q in range(self.world) if q != self.rank}
        try:
            while waiting and int(self.store.add(FINISHED_KEY, 0)) < self.world and time.monotonic() < deadline:
                now = time.monotonic()
                for q, (last, since) in list(waiting.items()):
                    value = int(self.store.add(_beat_key(q), 0))
                    if value >= FINISHED_MARK or (value == last and now - since > STALE_SECONDS):
                        del waiting[q]  # finished, or died after its last collective: nothing to wait for
                    elif value != last:
                        waiting[q] = (value, now)
                time.sleep(HEARTBEAT_SECONDS / 4)
        except Exception:  # a broken store: nobody can read it any more
            return

    def tick(self) -> None:
        """One heartbeat period: bump this rank's counter; with `watch`, read the failure record and the watched."""
        self.store.add(_beat_key(self.rank), 1)
        if self.watch and self.failure is None and not self.finished:
            self._watch()

    def _run(self) -> None:
        unanswered_since: float | None = None
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.tick()
                unanswered_since = None
            except Exception:  # the store does not answer: the run is ending, or its host died
                if self.finished or not self.watch or self.failure is not None:
                    return  # gloo notices a dead peer by itself; a finished rank waits for nobody
                now = time.monotonic()
                unanswered_since = now if unanswered_since is None else unanswered_since
                if now - unanswered_since > STALE_SECONDS:
                    self._abort(f"the rendezvous store stopped answering for {STALE_SECONDS:g} s: rank 0 (or the "
                                "torchrun agent) that hosts it failed or was killed; see its output")
                    return

    def _watch(self) -> None:
        if self.store.check([FAILURE_KEY]):
            message = self.store.get(FAILURE_KEY).decode()
            if not message.startswith(f"rank {self.rank} "):
                self._abort(message)
            return
        now = time.monotonic()
        for q, (last, since) in list(self._seen.items()):
            value = int(self.store.add(_beat_key(q), 0))
            if value >= FINISHED_MARK:  # done with every collective of the run: not waited for (until it unfinishes)
                self._seen[q] = (value, now)
            elif value != last:
                self._seen[q] = (value, now)
            elif now - since > STALE_SECONDS:
                message = f"rank {q} stopped responding (no heartbeat for {STALE_SECONDS:g} s: killed, or its node " \
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
    """Until `world_size` ranks have stopped or finished (these read the store no more), at most STORE_GRACE_SECONDS."""
    deadline = time.monotonic() + STORE_GRACE_SECONDS
    try:
        while time.monotonic() < deadline:
            if store.add(STOPPED_KEY, 0) + store.add(FINISHED_KEY, 0) >= world_size:
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

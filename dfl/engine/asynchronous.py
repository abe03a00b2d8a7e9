"""Asynchronous gossip in simulated time (`mode = "async"`), in the style of AD-PSGD (Lian et al., ICML 2018).

Every client runs on its own clock (`dfl.network.async_events`: compute time per local step from the straggler model, a
serialized uplink of `link_bandwidth` bytes per simulated second, `link_latency` per message) and, at the end of
each of its updates, mixes its model with the newest model of each in-neighbour that has arrived:
- dfedavg, dfedavgm, dfedsam (and dfedsam-mgs with gossip_steps = 1): update k of client i trains the K_i local
  steps of its local round k from x_i (data order, SAM, momentum as in the synchronous round k), sends y_i^k,
  then x_i ← w_ii y_i^k + Σ_j w_ij y_j^{v_ij};
- dpsgd (AD-PSGD): update k is one SGD step, step k mod K_i of local round k // K_i: the gradient is taken at the
  model x_i^k it sends, then x_i ← w_ii x_i^k + Σ_j w_ij x_j^{v_ij} − η g_i(x_i^k).
v_ij is the version of client j's model that has arrived at i (version −1 is x⁰), at most `max_staleness` updates
behind i's own (`dfl.network.async_events`). W is the run's static topology, row i = the weights client i mixes with.

Rounds. One round of the runner is U updates in event order: U = m for the local-steps family (as many updates
as a synchronous round has), U = Σ_i K_i for dpsgd (as many SGD steps as a synchronous round has). The learning
rate and ρ of round r apply to the updates in it. Evaluation and checkpoints happen between rounds, as in the
synchronous mode. `sim_time` is the simulated time of the round's last update (`sim_time_round`: since the
previous round); `staleness_mean`/`staleness_max` are k − v_ij over the round's mixes and links (negative when
the neighbour is ahead); `updates_min`/`updates_max` count each client's updates in the round.

With equal speeds (stragglers = 0), max_staleness = 0 and zero latency and transmission time, every client's
update k ends at the same instant and mixes its neighbours' version k: the synchronous X^{k+1} = W Y^k of
dfedavg/dfedsam (and D-PSGD's X^{k+1} = W X^k − η G(X^k)), round for round (tests/test_asynchronous.py).

Vectorization. The events of a round are cut into waves by their data dependencies only: a local phase depends
on its client's previous mix; a mix on its own local phase and on the local phases of the versions it mixes.
A wave runs the local phases of its updates (one vectorized `LocalTrainer.train` over clients at different
updates: each client's data order is a function of its own local round), then their mixes (one sparse product).
Any cut that respects the dependencies computes the same numbers, so the waves follow the dependency depth:
one wave per round when clocks tick together, a few when they drift, whatever the latency.

Messages live on the sender's process in a pool of rows (version v of client j), freed when every client that
mixes with j has mixed a newer version. Every process computes the same events; before each wave's mixes,
processes exchange exactly the message rows the other processes' mixes need (`exchange_rows`), and every mix
sums its terms in the same order, so results do not depend on the world size.

Memory of the pool. It starts at 2 rows per local client (x⁰ and one version in flight each) and grows by
POOL_GROWTH when a wave needs more: a new buffer and one copy (old and new alive for that moment; `torch.cat` of
the old buffer and an extension had three buffers alive), its size checked against the memory free first
(`_grow`). With `max_staleness` S >= 0 on a symmetric W a sender keeps at most 2S + 3 versions (a neighbour mixes
one at most S behind itself and runs at most S + 1 ahead of it), and the pool never grows beyond that bound
(`pool_bound`); with S = -1 nothing bounds it but the stragglers' slowdown. The memory planner counts the pool and
its next growth (`planned_pool_bytes`). A checkpoint writes the messages as [m_local, S, d] rows made chunk by
chunk from the pool while they are written (`row_sources`), never that stack whole.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from typing import cast

import numpy as np
import scipy.sparse as sp
import torch

from dfl.algorithms import card
from dfl.algorithms.base import Algorithm, RoundStats
from dfl.data.sampler import batch_width, local_step_counts
from dfl.engine.checkpoint import ROW_CHUNK_BYTES, RowSource
from dfl.errors import ConfigError
from dfl.network.async_events import ComputeTimes, EventSchedule, Local, Mix
from dfl.network.comm import even_blocks
from dfl.network.gossip import RowsOperator
from dfl.training import memory
from dfl.training.local import LocalTrainer, descent_direction

EMPTY = -2  # checkpoint: an unused message slot (version −1 is x⁰)
POOL_GROWTH = 1.5  # the message pool grows by this factor when it runs out (module docstring)


def transmit_seconds(model_bytes: int, bandwidth: float) -> float:
    """Simulated seconds one message occupies its sender's uplink: model_bytes / bandwidth (0 = unlimited)."""
    return model_bytes / bandwidth if bandwidth > 0 else 0.0


# ------------------------------------------------------------------------------------------------- engine
class AsyncEngine:
    """The asynchronous mode on a block of clients, independent of models and data (module docstring).

    `local(rows, ids, versions, r)` runs the local phases of the local rows `rows` (a device tensor; `ids` the same
    rows on the host; their updates `versions`, in round r) from X and returns (messages [n, d], losses [n] or None);
    `step(rows, ids, versions, r)` (dpsgd) returns (η·direction [n, d], losses [n]) at X[rows]; `None` for the
    local-steps family. Index tensors go to the device packed into one copy per use (`_upload`); nothing comes
    back to the host during a round.
    """

    def __init__(self, W: sp.csr_array, schedule: EventSchedule, X: torch.Tensor, comm, local, step,
                 updates_per_round: int):
        W = sp.csr_array(W, dtype=np.float64)
        W.eliminate_zeros()
        W.sort_indices()
        self.W, self.schedule, self.X, self.comm = W, schedule, X, comm
        self.local, self.step, self.updates = local, step, int(updates_per_round)
        m = W.shape[0]
        self.m = m
        blocks = even_blocks(m, comm.world_size)
        self.starts = np.array([b.start for b in blocks], dtype=np.int64)
        self.rank, self.world = comm.rank, comm.world_size
        self.first = blocks[self.rank].start
        # per client: (weights, sources) of its mix: own weight first (if any), then in-neighbours in CSR order
        self.diag = W.diagonal()
        rows = np.repeat(np.arange(m), np.diff(W.indptr))
        self.edge_sender = W.indices.astype(np.int64)
        self.edge_is_self = rows == self.edge_sender
        self.edge_weight = W.data
        # message versions each consumer (an entry of W) mixed last: what it may still need is that one or newer
        self.floor = np.full(W.nnz, -1, dtype=np.int64)
        self.latest = np.full(m, -1, dtype=np.int64)  # newest version each client has sent
        self.low = np.full(m, -1, dtype=np.int64)  # oldest version still needed, per sender
        # the message pool of this process's clients: (client, version) -> row of `pool`
        d = X.shape[1]
        self.bound = pool_bound(W, blocks[self.rank], schedule.max_staleness)  # most rows ever needed (None: none)
        self.pool = X.new_empty((self._capped(max(2 * X.shape[0], 1)), d))
        self.pool[: X.shape[0]] = X
        self.slot = {(self.first + r, -1): r for r in range(X.shape[0])}
        self.free = list(range(self.pool.shape[0] - 1, X.shape[0] - 1, -1))
        self.rounds_done = 0
        self.waves = 0  # waves run so far (benchmarks/asynchronous.py: events per vectorized call)
        self.last_time = 0.0
        self.round_metrics: dict[str, float] = {}
        self.trace: list[Mix] | None = None  # tests: set to [] to record every mix

    # ---------------------------------------------------------------------------------------- one round
    def round(self, r: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Round r: its U updates. Returns (loss sum [m_local], updates with a loss [m_local], models sent [m])."""
        events = self.schedule.advance(self.updates)
        n_local = self.X.shape[0]
        loss = torch.zeros(n_local, dtype=self.X.dtype, device=self.X.device)
        count = torch.zeros(n_local, dtype=torch.long, device=self.X.device)
        for locals_, mixes in self._waves(events):
            self._run_locals(locals_, r, loss, count)
            self._run_mixes(mixes, r, loss, count)
            self._versions([*locals_, *mixes])
            self._collect_garbage()  # after every wave: the pool holds what some later mix may still combine
            self.waves += 1
        sent = self._account(events)
        self.rounds_done = r + 1
        return loss, count, sent

    def replay(self, rounds: int) -> None:
        """Advance the clocks and the message bookkeeping through `rounds` rounds without training.

        Used on resume: the models and messages come from the checkpoint.
        """
        while self.rounds_done < rounds:
            events = self.schedule.advance(self.updates)
            self._versions(events)
            self._account(events)
            self.rounds_done += 1

    def _versions(self, events) -> None:
        """The versions each client has sent (`latest`) and mixed (`floor`), and the oldest still needed (`low`).

        Per wave or per round alike: a client's events keep their order in both, and a consumer mixes ever newer
        versions of a sender, so a message older than `low` is combined by no later mix.
        """
        indptr = self.W.indptr
        for ev in events:
            if isinstance(ev, Local):
                self.latest[ev.client] = ev.version
                continue
            lo, hi = indptr[ev.client], indptr[ev.client + 1]
            own = self.edge_is_self[lo:hi]
            self.floor[lo:hi][own] = ev.version
            self.floor[lo:hi][~own] = ev.versions
        consumers = np.full(self.m, np.iinfo(np.int64).max)
        np.minimum.at(consumers, self.edge_sender, self.floor)
        self.low = np.minimum(consumers, self.latest)

    def _account(self, events) -> np.ndarray:
        """The round metrics of a round's events (after `_versions`); returns the models each client sent [m]."""
        sent = np.zeros(self.m, dtype=np.int64)
        staleness, updates = [], np.zeros(self.m, dtype=np.int64)
        for ev in events:
            if isinstance(ev, Local):
                sent[ev.client] += self.schedule.out_degree[ev.client]
                continue
            staleness.append(ev.version - ev.versions)
            updates[ev.client] += 1
            if self.trace is not None:
                self.trace.append(ev)
        stale = np.concatenate(staleness) if staleness else np.zeros(0, dtype=np.int64)
        time = self.schedule.time
        self.round_metrics = {
            "sim_time": time, "sim_time_round": time - self.last_time,
            "staleness_mean": float(stale.mean()) if len(stale) else 0.0,
            "staleness_max": int(stale.max()) if len(stale) else 0,
            "updates_min": int(updates.min()), "updates_max": int(updates.max()),
        }
        self.last_time = time
        return sent

    def _waves(self, events) -> list[tuple[list[Local], list[Mix]]]:
        """The round's events cut into waves by dependency depth (module docstring)."""
        local_level: dict[tuple[int, int], int] = {}
        mix_level: dict[int, int] = {}
        waves: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
        for ev in events:
            if isinstance(ev, Local):
                level = mix_level[ev.client] + 1 if ev.client in mix_level else 0
                local_level[(ev.client, ev.version)] = level
                waves[level][0].append(ev)
            else:
                level = local_level.get((ev.client, ev.version), 0)
                for j, v in zip(self.schedule.in_neighbours[ev.client].tolist(), ev.versions.tolist()):
                    level = max(level, local_level.get((j, v), 0))
                mix_level[ev.client] = level
                waves[level][1].append(ev)
        return [waves[level] for level in sorted(waves)]

    # ----------------------------------------------------------------------------------------- a wave
    def _hosted(self, events) -> list:
        lo, hi = self.first, self.first + self.X.shape[0]
        return [ev for ev in events if lo <= ev.client < hi]

    def _run_locals(self, events, r: int, loss: torch.Tensor, count: torch.Tensor) -> None:
        """The local phases of a wave (this process's clients).

        Their messages go to the pool. Host to device: one index transfer (the rows and their pool slots),
        whatever the number of clients.
        """
        mine = self._hosted(events)
        if not mine:
            return
        ids = np.array([ev.client - self.first for ev in mine], dtype=np.int64)
        versions = np.array([ev.version for ev in mine], dtype=np.int64)
        slots = self._reserve([(ev.client, ev.version) for ev in mine])
        rows, pool_rows = _upload(self.X.device, ids, slots)
        messages, losses = self.local(rows, ids, versions, r)
        self.pool[pool_rows] = messages
        if losses is not None:
            loss.index_add_(0, rows, losses.to(loss.dtype))
            count.index_add_(0, rows, torch.ones_like(rows))

    def _run_mixes(self, events, r: int, loss: torch.Tensor, count: torch.Tensor) -> None:
        """The mixes of a wave.

        The message rows they need (exchanged between processes), one sparse product. Host to device: the
        exchange's send index (multi-process), one index transfer and the weights; nothing back.
        """
        if not events:
            return
        keys_of = [self._terms(ev) for ev in events]
        received = self._exchange(events, keys_of) if self.world > 1 else None
        mine = self._hosted(events)
        if not mine:
            return
        lo = self.first
        terms = [keys_of[n] for n, ev in enumerate(events) if ev.client - lo in range(self.X.shape[0])]
        keys = sorted({key for t in terms for key, _ in t})
        # each mix sums its terms in the order of `_terms` (its row of W), whatever the world size; the messages
        # received from other processes go to free pool slots for the product, so every term is a pool row (no
        # source stack is gathered)
        temporary = np.zeros(0, dtype=np.int64)
        if received is not None and received[0]:
            keys_in, rows_in = received
            temporary = self._reserve_free(len(keys_in))
            (slots_in,) = _upload(self.X.device, temporary)
            self.pool[slots_in] = rows_in
            where = dict(zip(keys_in, temporary.tolist()))
        else:
            where = {}
        slot_of = {key: self.slot[key] if key in self.slot else where[key] for key in keys}
        indptr = np.cumsum([0] + [len(t) for t in terms]).astype(np.int64)
        indices = np.array([slot_of[key] for t in terms for key, _ in t], dtype=np.int64)
        data = np.array([w for t in terms for _, w in t], dtype=np.float64)
        A = sp.csr_array((data, indices, indptr), shape=(len(terms), self.pool.shape[0]))
        mixed = RowsOperator(A, self.pool.shape[0], self.X.dtype, self.X.device, sort=False)(self.pool)
        self.free.extend(temporary.tolist())
        ids = np.array([ev.client - lo for ev in mine], dtype=np.int64)
        (rows,) = _upload(self.X.device, ids)
        if self.step is not None:  # dpsgd: the SGD step at the model sent, x_i^k = X[i]
            delta, losses = self.step(rows, ids, np.array([ev.version for ev in mine], dtype=np.int64), r)
            mixed = mixed - delta
            loss.index_add_(0, rows, losses.to(loss.dtype))
            count.index_add_(0, rows, torch.ones_like(rows))
        self.X[rows] = mixed

    def _terms(self, ev: Mix) -> list[tuple[tuple[int, int], float]]:
        """(message key, weight) of a mix, in CSR order: own version for the diagonal, else the arrived one."""
        lo, hi = self.W.indptr[ev.client], self.W.indptr[ev.client + 1]
        versions = iter(ev.versions.tolist())
        out = []
        for j, w, own in zip(self.edge_sender[lo:hi].tolist(), self.edge_weight[lo:hi].tolist(),
                             self.edge_is_self[lo:hi].tolist()):
            out.append(((j, ev.version if own else next(versions)), w))
        return out

    def _owner(self, client: int) -> int:
        return int(np.searchsorted(self.starts, client, side="right")) - 1

    def _exchange(self, events, keys_of):
        """The message rows this process's mixes need from other processes.

        A collective: every rank calls it with the same events. Returns (keys, rows [len(keys), d]) in the order
        received.
        """
        # need[q][r]: the (client, version) keys q sends to r
        need: list[list[set[tuple[int, int]]]] = [[set() for _ in range(self.world)] for _ in range(self.world)]
        for ev, terms in zip(events, keys_of):
            r = self._owner(ev.client)
            for key, _ in terms:
                q = self._owner(key[0])
                if q != r:
                    need[q][r].add(key)
        plan = [[sorted(need[q][r]) for r in range(self.world)] for q in range(self.world)]
        total = sum(len(keys) for row in plan for keys in row)
        if total == 0:
            return [], self.X.new_empty((0, self.X.shape[1]))
        send = np.array([self.slot[key] for r in range(self.world) for key in plan[self.rank][r]], dtype=np.int64)
        (send_d,) = _upload(self.X.device, send)
        send_counts = [len(plan[self.rank][r]) for r in range(self.world)]
        recv_counts = [len(plan[q][self.rank]) for q in range(self.world)]
        rows = self.comm.exchange_rows(self.pool, send_d, send_counts, recv_counts, total)
        keys = [key for q in range(self.world) for key in plan[q][self.rank]]
        return keys, rows

    # ------------------------------------------------------------------------------------- message pool
    def _reserve(self, keys: list[tuple[int, int]]) -> np.ndarray:
        """Pool slots for new messages `keys` (the pool grows, on the device, when the free ones run out)."""
        slots = self._reserve_free(len(keys))
        self.slot.update(zip(keys, slots.tolist()))
        return slots

    def _reserve_free(self, count: int) -> np.ndarray:
        """`count` free pool slots, taken from the free list (the pool grows when it runs out)."""
        if len(self.free) < count:
            self._grow(self.pool.shape[0] - len(self.free) + count)
        return np.array([self.free.pop() for _ in range(count)], dtype=np.int64)

    def _capped(self, rows: int) -> int:
        return rows if self.bound is None else max(1, min(rows, self.bound))

    def _next_size(self, needed: int) -> int:
        """The pool's size after a growth to at least `needed` rows: POOL_GROWTH times larger, within the bound."""
        return max(needed, self._capped(math.ceil(self.pool.shape[0] * POOL_GROWTH)))

    def _grow(self, needed: int) -> None:
        """Grow the pool to hold `needed` rows: one new buffer (`_next_size`), checked against the memory free."""
        old, d = self.pool.shape
        size = self._next_size(needed)
        need = size * d * self.pool.element_size()
        free = memory.available_bytes(self.pool.device)
        if need > free:
            raise ConfigError(
                f"mode = async: the message pool of this process needs {size:,} rows of {d:,} parameters "
                f"(~{need / 2**30:.2f} GiB; it holds {old:,}), more than the {free / 2**30:.2f} GiB free on "
                f"{self.pool.device}: stragglers far behind their neighbours keep many versions in flight; set "
                "max_staleness >= 0 to bound them (a client then keeps at most 2 max_staleness + 3), or use more "
                "processes (torchrun)")
        pool = self.pool.new_empty((size, d))
        pool[:old] = self.pool
        self.pool = pool
        self.free.extend(range(size - 1, old - 1, -1))

    def planned_pool_bytes(self) -> int:
        """What the memory planner sets aside for the pool: its rows now and the new buffer of its next growth."""
        rows, d = self.pool.shape
        grown = 0 if self.bound is not None and rows >= self.bound else self._next_size(rows + 1)
        return (rows + grown) * d * self.pool.element_size()

    def _collect_garbage(self) -> None:
        """Free the messages no client can mix any more (older than what every consumer mixed last)."""
        dead = [key for key in self.slot if key[1] < self.low[key[0]]]
        for key in dead:
            self.free.append(self.slot.pop(key))

    def message_versions(self) -> torch.Tensor:
        """[m_local, S] versions of the pool's messages per client (EMPTY where unused), on the pool's device.

        S is the same on every process (the most versions any client keeps): the checkpoint's layout.
        """
        n, S = self.X.shape[0], self.versions_kept()
        versions = torch.full((n, S), EMPTY, dtype=torch.long, device=self.X.device)
        keys = list(self.slot)
        if keys:
            client = np.array([c for c, _ in keys], dtype=np.int64)
            version = np.array([v for _, v in keys], dtype=np.int64)
            r, s, version_d = _upload(self.X.device, client - self.first, version - self.low[client], version)
            versions[r, s] = version_d
        return versions

    def versions_kept(self) -> int:
        """S: the most versions any client keeps (the same on every process: the clocks are global)."""
        return int((self.latest - self.low).max()) + 1

    def message_rows(self, a: int, b: int) -> torch.Tensor:
        """[b − a, S, d] models of local clients a..b-1 (zeros where unused): one chunk of the checkpoint's rows."""
        S, d = self.versions_kept(), self.X.shape[1]
        models = self.X.new_zeros((b - a, S, d))
        keys = [key for key in self.slot if a <= key[0] - self.first < b]
        if keys:
            client = np.array([c for c, _ in keys], dtype=np.int64)
            version = np.array([v for _, v in keys], dtype=np.int64)
            r, s, slots = _upload(self.X.device, client - self.first - a, version - self.low[client],
                                  np.array([self.slot[k] for k in keys], dtype=np.int64))
            models[r, s] = self.pool[slots]
        return models

    def load_messages(self, models: torch.Tensor, versions: torch.Tensor) -> None:
        """Put a checkpoint's messages back (after `replay` to its round), client block by client block."""
        n, S, d = models.shape
        table = versions.cpu().numpy()  # once per resume: which (client, version) each slot holds
        r, s = np.nonzero(table != EMPTY)
        keys = [(self.first + int(a), int(table[a, b])) for a, b in zip(r, s)]
        self.pool = self.X.new_empty((self._capped(max(len(keys) + n, 2 * n, 1)), d))
        self.slot, self.free = {}, list(range(self.pool.shape[0] - 1, -1, -1))
        if keys:
            slots = self._reserve(keys)
            step = max(1, ROW_CHUNK_BYTES // max(1, S * d * models.element_size()))
            for a in range(0, n, step):  # one block of clients on the way at a time, not the [n, S, d] stack
                sel = (r >= a) & (r < a + step)
                if sel.any():
                    r_d, s_d, slots_d = _upload(self.pool.device, (r[sel] - a).astype(np.int64),
                                                s[sel].astype(np.int64), slots[sel])
                    self.pool[slots_d] = models[a:a + step].to(self.pool)[r_d, s_d]
        expected = {(c, v) for c in range(self.first, self.first + n) for v in range(self.low[c], self.latest[c] + 1)}
        if set(keys) != expected:
            raise ValueError("the checkpoint's asynchronous messages do not match the replayed events")


def pool_bound(W: sp.csr_array, block: range, max_staleness: int) -> int | None:
    """The most pool rows a process can need, or None when nothing bounds them (max_staleness = -1, a directed W).

    With S = max_staleness >= 0 and a symmetric W, a sender keeps at most 2S + 3 versions of its model (x⁰ counts
    as one; module docstring): a neighbour i at its last mix k_i used a version >= k_i − S, and the sender has sent at
    most version k_i + S + 2, since it waits for i's version (its own version) − S, which i sends after its mix k_i.
    Plus the rows the wave's mixes receive from other processes, at most one per edge into the block.
    """
    pattern = sp.csr_array((np.ones(W.nnz), W.indices, W.indptr), shape=W.shape)
    if max_staleness < 0 or (pattern != pattern.T).nnz:
        return None
    rows = W[block.start:block.stop]
    remote = int(((rows.indices < block.start) | (rows.indices >= block.stop)).sum())
    return len(block) * (2 * max_staleness + 3) + remote


def _upload(device: torch.device, *arrays: np.ndarray) -> list[torch.Tensor]:
    """int64 host arrays as device tensors in one host-to-device copy (concatenated, then split into views)."""
    sizes = [len(a) for a in arrays]
    flat = torch.from_numpy(np.concatenate(arrays).astype(np.int64, copy=False))
    return list(torch.split(flat.to(device, non_blocking=True), sizes))


# ---------------------------------------------------------------------------------------- the algorithm
class AsyncGossip(Algorithm):
    """`mode = "async"`: the configured algorithm's update run asynchronously (module docstring)."""

    def __init__(self, ctx, X: torch.Tensor, topology):
        super().__init__(ctx, X)
        config = ctx.config
        # the wrapped algorithm's name, per instance (Algorithm.name is a class's registered name)
        self.name = config.algorithm  # type: ignore[misc]
        self.kind = card(config.algorithm).asynchronous  # "local" or "step" (`AlgorithmCard.asynchronous`)
        if topology.is_time_varying:
            raise ConfigError(f"topology: mode = async needs a static topology, but {topology.name} is "
                              "time-varying (an asynchronous client has no global gossip step)")
        trainer = ctx.trainer
        sizes = trainer.data.sizes.numpy()
        steps = local_step_counts(sizes, batch_width(sizes, config.batch_size), *config.epochs_or_steps)
        self.steps = steps  # K_i of every client
        if self.kind == "local":
            compute = ComputeTimes(config.seed, config.stragglers, config.straggler_slowdown, steps, 1)
            updates = len(steps)
        else:
            compute = ComputeTimes(config.seed, config.stragglers, config.straggler_slowdown,
                                   np.ones(len(steps)), steps)
            updates = int(steps.sum())
        transmit = transmit_seconds(X.shape[1] * X.element_size(), config.link_bandwidth)
        schedule = EventSchedule(topology.sparse(0), compute, transmit, config.link_latency, config.max_staleness)
        self.engine = AsyncEngine(topology.sparse(0), schedule, self.X, ctx.comm, self._local,
                                  self._step if self.kind == "step" else None, updates)
        self.client_state = ("async_messages", "async_versions")
        self._loaded: tuple[torch.Tensor, torch.Tensor] | None = None  # a checkpoint's messages until the engine's

    # the runner reads and replaces X; the engine owns it
    @property
    def X(self) -> torch.Tensor:
        """The clients' current models (the engine's, once it runs)."""
        return self.engine.X if hasattr(self, "engine") else self._X

    @X.setter
    def X(self, value: torch.Tensor) -> None:
        if hasattr(self, "engine"):
            self.engine.X = value
        else:
            self._X = value

    def round(self, t: int) -> RoundStats:
        """Round t: the waves of local updates and mixes whose clocks fall in it."""
        engine = self.engine
        if engine.rounds_done < t:  # resumed: replay the clocks, then put the checkpoint's messages back
            engine.replay(t)
        if self._loaded is not None:
            engine.load_messages(*self._loaded)
            self._loaded = None
        loss, count, sent = engine.round(t)
        return RoundStats(train_loss=loss / count.clamp_min(1), models_sent=sent, trained=count > 0)

    def metrics(self) -> dict[str, float]:
        """sim_time, sim_time_round, staleness_mean/max, updates_min/max of the latest round."""
        return dict(self.engine.round_metrics)

    # --------------------------------------------------------------------------------- the update rules
    def _trainer(self, ids: np.ndarray):
        """The run's trainer restricted to the local rows `ids` (host; their own compact stack)."""
        # the run's trainer is dfl's LocalTrainer (dfl.engine.setup.trainer); the Context seam types only its protocol
        trainer = cast(LocalTrainer, self.ctx.trainer)
        sub = copy.copy(trainer)
        sub.client_ids = [trainer.client_ids[r] for r in ids]
        return sub

    def _local(self, rows: torch.Tensor, ids: np.ndarray, versions: np.ndarray, r: int):
        """rows: the local rows on the device; ids: the same on the host (no device-to-host copy)."""
        ctx = self.ctx
        if self.kind == "step":  # dpsgd sends the model it takes its step at
            return self.X[rows], None
        local = self._trainer(ids).train(self.X[rows], versions, ctx.lr(r), ctx.rule(r))
        return local.Y, local.loss

    def _step(self, rows: torch.Tensor, ids: np.ndarray, versions: np.ndarray, r: int):
        """η·direction and loss of one SGD step per client: step k mod K_i of local round k // K_i."""
        ctx = self.ctx
        rule, lr = ctx.rule(r), ctx.lr(r)
        K = self.steps[np.array([ctx.trainer.client_ids[i] for i in ids])]
        trainer = self._trainer(ids)
        batch = trainer.schedule(versions // K).batch_at(versions % K)  # every client at its own step
        Xb = self.X[rows]
        g, loss = trainer.gradient(Xb, batch)
        return lr * descent_direction(g, Xb, rule, None), loss

    # ------------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, torch.Tensor]:
        """The versions of the messages in flight, [m_local, S] per client (their models: `row_sources`)."""
        return {"async_versions": self.engine.message_versions()}

    def row_sources(self) -> dict[str, RowSource]:
        """The models in flight, [m_local, S, d] per client, made from the pool chunk by chunk as they are written."""
        engine = self.engine
        shape = (engine.X.shape[0], engine.versions_kept(), engine.X.shape[1])
        return {"async_messages": RowSource(shape, engine.X.dtype, engine.message_rows)}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Keep a checkpoint's message pool until the engine's next round puts it back."""
        self._loaded = (state["async_messages"], state["async_versions"])

"""The clocks of the asynchronous mode (`mode = "async"`).

When each client trains, sends and mixes, and which version of each neighbour's model it mixes. A pure function of the
seed and the static setting (graph, speeds, link costs, data sizes): every process computes the same events without
communicating, and a resume replays them.

Model (simulated seconds; one local step of a normal-speed client takes 1 s, as in `dfl.network.faults`). Client i's
update k = 0, 1, 2, ... is a local phase, a send and a mix:
- the local phase starts at s_{i,k} and takes C_{i,k} = n_i c_{i,t} seconds: n_i local steps (K_i of the round's
  local work for dfedavg/dfedsam, 1 for dpsgd), c = `straggler_slowdown` with probability `stragglers`, else 1,
  drawn per client and local round t (t = k, or k // K_i for dpsgd) from the seed as `dfl.network.faults.Stragglers`
  does; it ends at e_{i,k} = s_{i,k} + C_{i,k};
- at e_{i,k} the client sends version k of its model to each out-neighbour (column i of W). Its uplink carries
  one message at a time, T = model_bytes / `link_bandwidth` seconds each (0 with unlimited bandwidth), to the
  out-neighbours j in order of (j − i) mod m; a message then travels `link_latency` L seconds. So the r-th message
  (r = 1 .. d_i, d_i = out-degree) arrives at e_{i,k} + r T + L;
- it mixes at μ_{i,k} >= e_{i,k}. With `max_staleness` S >= 0 it first waits until version k − S or newer has
  arrived from every in-neighbour (row i of W); with S = −1 it never waits. From in-neighbour j it mixes the
  newest version that has arrived by μ_{i,k}: v_ij = max{v : e_{j,v} + r_{ji} T + L <= μ_{i,k}}, where version −1
  is x⁰, which every client holds at time 0. Hence the staleness k − v_ij <= S;
- the next update starts when the mix is done and the uplink is free: s_{i,k+1} = max(μ_{i,k}, e_{i,k} + d_i T),
  with s_{i,0} = 0.
Events at the same instant: every send before any mix (a message that arrives at μ is mixed at μ), then mixes by
client id. Waiting cannot deadlock: the version i waits for is sent before its sender waits on anything newer
than version k − 1 of i, which i has sent.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from operator import add

import numpy as np
import scipy.sparse as sp

from dfl.data.sampler import client_keys
from dfl.network.faults import STREAM_STRAGGLER, uniform  # an async client is slow in the local rounds a sync one is

_SEND, _MIX = 0, 1  # event kinds, in their order at equal times
_CACHED_ROUNDS = 256  # local rounds of straggler draws kept


@dataclass(frozen=True)
class Local:
    """Client `client` ends the local phase of its update `version` at `time` and sends that version."""

    client: int
    version: int
    time: float


@dataclass(frozen=True)
class Mix:
    """One asynchronous mixing event: a client mixes the versions of its in-neighbours.

    Client `client` mixes (update `version`) at `time`, using version `versions[r]` of its r-th in-neighbour
    (`EventSchedule.in_neighbours[client][r]`; −1 = x⁰).
    """

    client: int
    version: int
    time: float
    versions: np.ndarray


class ComputeTimes:
    """Seconds of the local phase of update k of every client.

    steps[i] · c_{i,t}, t = k // rounds_per[i] (`rounds_per` = 1: one update per local round; K_i: dpsgd's one step per
    update).
    """

    def __init__(self, seed: int, stragglers: float, slowdown: float, steps: np.ndarray, updates_per_round):
        self.seed, self.fraction, self.slowdown = seed, float(stragglers), float(slowdown)
        self.steps = np.asarray(steps, dtype=np.float64)
        self.per_round = np.broadcast_to(np.asarray(updates_per_round, dtype=np.int64), self.steps.shape)
        self._slow: dict[int, np.ndarray] = {}

    def step_seconds(self, t: int) -> np.ndarray:
        """[m] seconds per local step of every client in local round t (the straggler draw of `dfl.network.faults`)."""
        if self.fraction == 0:
            return np.ones(len(self.steps))
        c = self._slow.get(t)
        if c is None:
            u = uniform(client_keys(self.seed, np.arange(len(self.steps)), t, STREAM_STRAGGLER))
            c = np.where(u < self.fraction, self.slowdown, 1.0)
            self._slow[t] = c
            if len(self._slow) > _CACHED_ROUNDS:
                self._slow.pop(next(iter(self._slow)))
        return c

    def local_round(self, client: int, version: int) -> int:
        """The local round t of a client's update `version` (updates_per_round of them per round)."""
        return version // int(self.per_round[client])

    def __call__(self, client: int, version: int) -> float:
        """Seconds of the local phase of `client`'s update `version`: its steps times that round's step time."""
        return float(self.steps[client] * self.step_seconds(self.local_round(client, version))[client])


class EventSchedule:
    """The events of the asynchronous mode in processing order (module docstring).

    `advance(n)` runs the clocks until n more mixes have happened and returns the events on the way (`Local` and `Mix`).
    """

    def __init__(self, W: sp.csr_array, compute: ComputeTimes, transmit: float, latency: float,
                 max_staleness: int):
        W = sp.csr_array(W)
        m = W.shape[0]
        self.m, self.compute, self.transmit, self.latency = m, compute, float(transmit), float(latency)
        self.max_staleness = int(max_staleness)
        rows = np.repeat(np.arange(m), np.diff(W.indptr))
        off = rows != W.indices
        receivers, senders = rows[off], W.indices[off].astype(np.int64)
        # send order of each sender: its out-neighbours j by (j − i) mod m; rank r = 1 .. d_i
        order = np.lexsort(((receivers - senders) % m, senders))
        rank = np.empty(len(order), dtype=np.int64)
        first = np.searchsorted(senders[order], np.arange(m))
        rank[order] = np.arange(len(order)) - first[senders[order]] + 1
        self.out_degree = np.bincount(senders, minlength=m).astype(np.int64)
        self.in_neighbours: list[np.ndarray] = []
        self._offsets: list[list[float]] = []  # per in-edge: r_ji T + L
        for i in range(m):
            sel = slice(*np.searchsorted(receivers, [i, i + 1]))  # CSR: receivers are sorted
            self.in_neighbours.append(senders[sel])
            self._offsets.append([float(r * self.transmit + self.latency) for r in rank[sel]])
        self._sent = [array("d") for _ in range(m)]  # e_{j,v} by version v
        self._version = [0] * m  # the update each client is in
        self._waiting: dict[tuple[int, int], list[int]] = defaultdict(list)
        self._heap = [(compute(i, 0), _SEND, i) for i in range(m)]
        heapq.heapify(self._heap)
        self.mixes = 0  # mixes so far
        self.time = 0.0  # the latest event's time

    def advance(self, mixes: int) -> list[Local | Mix]:
        """Process events until `mixes` more mixes have happened; the events, in order."""
        out: list[Local | Mix] = []
        target = self.mixes + mixes
        heap = self._heap
        while self.mixes < target:
            time, kind, i = heapq.heappop(heap)
            self.time = time
            k = self._version[i]
            if kind == _SEND:
                self._sent[i].append(time)
                out.append(Local(i, k, time))
                for waiter in self._waiting.pop((i, k), ()):
                    self._try_mix(waiter)
                self._try_mix(i)
            else:
                versions = np.array([bisect_right(self._sent[j], time, key=partial(add, o)) - 1
                                     for j, o in zip(self.in_neighbours[i].tolist(), self._offsets[i])],
                                    dtype=np.int64)
                out.append(Mix(i, k, time, versions))
                self.mixes += 1
                self._version[i] = k + 1
                start = max(time, self._sent[i][k] + self.out_degree[i] * self.transmit)
                heapq.heappush(heap, (start + self.compute(i, k + 1), _SEND, i))
        return out

    def _try_mix(self, i: int) -> None:
        """Schedule client i's mix once what it must wait for has arrived (or wait on the first missing one)."""
        k = self._version[i]
        time = self._sent[i][k]
        need = k - self.max_staleness
        if self.max_staleness >= 0 and need >= 0:
            for j, o in zip(self.in_neighbours[i].tolist(), self._offsets[i]):
                sent = self._sent[j]
                if len(sent) <= need:
                    self._waiting[(j, need)].append(i)
                    return
                time = max(time, sent[need] + o)
        heapq.heappush(self._heap, (time, _MIX, i))

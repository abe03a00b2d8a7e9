"""Unreliable networks: link failures, offline clients and stragglers, drawn per gossip step and per round.

Every draw is a counter-based hash (`dfl.data.sampler`'s splitmix64 chain) of (seed, step or round, stream, client
or link), read as u uniform in [0, 1) from its top 53 bits. So the network of gossip step s is a pure function of
(seed, s): identical on every process whatever the world size, the order in which steps are drawn, or a resume.

Link failures and offline clients (decentralized algorithms; per gossip step s; `RealisedTopology`):
- the undirected link {i, j} of W_s is down when u(seed, s, LINK, min(i, j), max(i, j)) < p (p = `link_failure`),
  independently per link and step; client i is offline when u(seed, s, OFFLINE, i) < q (q = `offline`): all its
  links are down, so it neither sends nor receives, and it keeps its model (its row and column of W'_s are e_i);
- the realised W'_s is the run's weight scheme on the surviving graph (`topologies.weights.drop_links`):
  metropolis and max-degree (and lazy over them) recomputed from the surviving degrees, so W'_s is symmetric and
  doubly stochastic. A custom matrix= keeps the weights of its surviving links and moves a failed link's weight
  onto the self-weights of both ends (w'_ii = w_ii + w_ij, w'_jj = w_jj + w_ji): still symmetric, doubly stochastic;
- refused with a ConfigError (`check_config`, `Network`): directed graphs and non-symmetric matrices (a failed
  directed link breaks the in/out balance that keeps a directed W doubly stochastic), weights uniform (doubly
  stochastic on regular graphs only) and fastest (an optimisation per graph, i.e. per step), `full` above
  topologies.limits.FULL_SPARSE_LIMIT clients (n²/2 links to draw per step), and the centralized algorithms (they do not
  gossip: clients missing from rounds are participation with participation_mode = bernoulli);
- p = q = 0 gossips over the topology itself: the fault-free code path, bit for bit.

Bursts (`link_failure_burst` = B > 0 for links, `offline_burst` for clients; `Bursts`): instead of independently per
step, each link (client) is a Gilbert–Elliott two-state Markov chain over the gossip steps, down at step 0 with the
stationary probability p; then a down link comes back with probability r = 1/B per step and an up link fails with
probability f = p / (B (1 − p)). So P(down at any step) = p as in the independent model, down runs are geometric with
mean B steps, up runs with mean B (1 − p) / p, and the down indicator's lag-k correlation is (1 − r − f)^k =
(1 − 1/(B (1 − p)))^k: B = 1 / (1 − p) is the independent model's law (a down run's mean length there), so
B >= 1 / (1 − p) is required and larger B means longer outages. Step s's draw of a link is u(seed, s, LINK, lo, hi)
as above, now read as a transition, so the state at s is a pure function of (seed, s), computed forward from step 0
(`Bursts` keeps each key's latest state: O(keys) per step for in-order steps; a resumed run replays from step 0).

Stragglers (every algorithm; per round t; `Stragglers`):
- client i is slow in round t when u(seed, t, STRAGGLER, i) < f (f = `stragglers`); a local step takes 1 simulated
  second, c = `straggler_slowdown` seconds on a slow client;
- with a deadline D = `round_deadline` > 0 a client stops after the steps it has finished by then and sends what it
  has: K'_i = min(K_i, floor(D / c_i)) (`LocalTrainer.step_cap`); D >= c is required, so every client takes a step;
- the round takes min(D, max_i K_i c_i) simulated seconds over the clients that train (max_i K_i c_i without a
  deadline). Only computation takes time in this model: messages arrive instantly.

Metrics (`Network.metrics`, in each evaluated round's record; only for the parts that are on):
- links_up: the fraction of the links of W_s that are up (both ends online, link not failed), mean over the round's
  gossip steps; spectral_gap_realised and spectral_gap_realised_worst: the mean and the minimum over the round's
  steps of 1 − ‖W'_s − J‖₂ (0 when the surviving graph is disconnected, which is detected first; exact dense
  eigenvalues up to SPECTRAL_METRIC_LIMIT clients, not recorded above that);
- steps_done_mean and steps_done_min over the clients that trained in the round; sim_time_round (that round's
  simulated seconds) and sim_time (all rounds so far, for accuracy-versus-time plots).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

import topologies
from dfl.data.sampler import absorb, batch_width, client_keys, local_step_counts
from dfl.errors import ConfigError
from dfl.network.settings import BURST_FIELDS, NETWORK_FIELDS, check_faults, faults_field  # noqa: F401
from topologies import spectral
from topologies.schedules import _check_step
from topologies.weights import drop_links

if TYPE_CHECKING:
    from dfl.network.byzantine import Threat

# hash streams: the sampler uses 0 (data order) and 1 (augmentation); these spell LINK, OFFL, SLOW
STREAM_LINK, STREAM_OFFLINE, STREAM_STRAGGLER = 0x4C494E4B, 0x4F46464C, 0x534C4F57
_PEER = np.uint64(0xC2B2AE3D27D4EB4F)  # the kind of word absorbed for a link's second end
SPECTRAL_METRIC_LIMIT = 256  # clients: one dense eigendecomposition per gossip step of an evaluated round
_CACHE_STEPS = 64  # realised step matrices kept (a round's steps are used by the mix, then by the byte count) ...
_CACHE_NNZ = 1 << 22  # ... and at most this many stored entries in all (~50 MB), one matrix at least
_DENSE_CACHE = 8


def uniform(h: np.ndarray) -> np.ndarray:
    """U in [0, 1) from the top 53 bits of uint64 hashes: P(u < p) = p to 2^-53."""
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


# ----------------------------------------------------------------------------------- link failures, offline
class Bursts:
    """Gilbert–Elliott outages (module docstring).

    `down(step, keys)` per int64 key, a pure function of the step and the draws u = `draws(step, keys)` of steps
    0..step. Each key's latest (step, state) is kept, so steps asked in order cost O(keys) each; a step before a key's
    latest replays that key from step 0.
    """

    def __init__(self, p: float, burst: float, draws):
        if not (0 < p < 1 and burst >= 1 / (1 - p)):
            raise ValueError(f"Bursts needs 0 < p < 1 and burst >= 1 / (1 - p), got p = {p}, burst = {burst}")
        self.p, self.recover, self.fail = p, 1.0 / burst, p / (burst * (1.0 - p))
        self.draws = draws
        self._keys = np.empty(0, dtype=np.int64)  # sorted
        self._step = np.empty(0, dtype=np.int64)  # latest step computed per key (-1: none)
        self._down = np.empty(0, dtype=bool)

    def down(self, step: int, keys) -> np.ndarray:
        """Bool per key: down at `step`."""
        keys = np.asarray(keys, dtype=np.int64)
        unique, inverse = np.unique(keys, return_inverse=True)
        new = np.setdiff1d(unique, self._keys, assume_unique=True)
        if len(new):
            order = np.argsort(np.concatenate([self._keys, new]), kind="stable")
            self._keys = np.concatenate([self._keys, new])[order]
            self._step = np.concatenate([self._step, np.full(len(new), -1, dtype=np.int64)])[order]
            self._down = np.concatenate([self._down, np.zeros(len(new), dtype=bool)])[order]
        pos = np.searchsorted(self._keys, unique)
        last, state = self._step[pos], self._down[pos]
        last[last > step] = -1  # asked for an earlier step: replay from the start
        for t in range(int(last.min(initial=step)) + 1, step + 1):
            todo = np.flatnonzero(last < t)
            u = self.draws(t, unique[todo])
            state[todo] = (u < self.p) if t == 0 else np.where(state[todo], u >= self.recover, u < self.fail)
            last[todo] = t
        self._step[pos], self._down[pos] = last, state
        return state[inverse]


def _link_key(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (np.asarray(lo, dtype=np.int64) << 32) | np.asarray(hi, dtype=np.int64)


@dataclass(frozen=True)
class LinkFaults:
    """Which links are up at gossip step s: a pure function of (seed, s) (module docstring)."""

    seed: int
    link_failure: float = 0.0
    offline: float = 0.0
    link_failure_burst: float = 0.0  # 0: independent per step; B > 0: Gilbert–Elliott bursts of mean B steps
    offline_burst: float = 0.0
    _bursts: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.link_failure and self.link_failure_burst:
            self._bursts["link"] = Bursts(self.link_failure, self.link_failure_burst,
                                          lambda step, keys: self._link_draws(step, keys >> 32, keys & 0xFFFFFFFF))
        if self.offline and self.offline_burst:
            self._bursts["offline"] = Bursts(self.offline, self.offline_burst, self._offline_draws)

    def _offline_draws(self, step: int, clients: np.ndarray) -> np.ndarray:
        return uniform(client_keys(self.seed, clients, step, STREAM_OFFLINE))

    def _link_draws(self, step: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return uniform(absorb(client_keys(self.seed, lo, step, STREAM_LINK),
                              np.asarray(hi, dtype=np.int64).astype(np.uint64), _PEER))

    def online(self, step: int, clients: np.ndarray) -> np.ndarray:
        """Bool per client id: online at gossip step `step`."""
        clients = np.asarray(clients, dtype=np.int64)
        if self.offline == 0:
            return np.ones(len(clients), dtype=bool)
        if "offline" in self._bursts:
            return ~self._bursts["offline"].down(step, clients)
        return self._offline_draws(step, clients) >= self.offline

    def link_up(self, step: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Bool per link {lo, hi} (lo <= hi): not failed at `step` (whether its ends are online is separate)."""
        if self.link_failure == 0:
            return np.ones(len(lo), dtype=bool)
        if "link" in self._bursts:
            return ~self._bursts["link"].down(step, _link_key(lo, hi))
        return self._link_draws(step, lo, hi) >= self.link_failure

    def keep(self, step: int, W: sp.csr_array) -> np.ndarray:
        """Bool per stored entry of W: its link is up at `step` (the same for (i, j) and (j, i))."""
        n = W.shape[0]
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(W.indptr))
        cols = W.indices.astype(np.int64)
        keep = self.link_up(step, np.minimum(rows, cols), np.maximum(rows, cols))
        if self.offline:
            on = self.online(step, np.arange(n))
            keep &= on[rows] & on[cols]
        return keep


@dataclass(frozen=True)
class Realised:
    """One gossip step's matrix W'_s as the unreliable network realised it, and how many links were up."""
    W: sp.csr_array  # W'_s, canonical float64 CSR
    links: int  # undirected links of the topology's W_s (self-loops not counted)
    up: int  # of them, up at this step

    @property
    def links_up(self) -> float:
        """The fraction of the topology's links up at this step (1 when it has none)."""
        return self.up / self.links if self.links else 1.0


class RealisedTopology:
    """The topology as the unreliable network realises it: W'_s per gossip step (module docstring).

    The part of `topologies.Topology` that `dfl.network.gossip.Gossip` and the communicators use (n, sparse, matrix,
    out_degrees, is_time_varying, period, averaging, stochastic): every step has its own matrix, never the averaging
    fast path, so gossip takes the CSR path (or the dense product for small m, or the neighbour exchange across
    processes). `sparse(step)` also notes the step as gossiped over, for the round's metrics (`take_used`).
    """

    is_time_varying = True
    period = None  # every step is drawn afresh
    averaging = None
    symmetric = True
    stochastic = "doubly"  # link faults run only on undirected, doubly stochastic W, and reweighting keeps it so

    def __init__(self, topology, faults: LinkFaults, scheme: str | None, base: str | None = None):
        self.topology, self.faults, self.scheme, self.base = topology, faults, scheme, base
        self.n, self.name, self.weights = topology.n, topology.name, topology.weights
        self._cache: OrderedDict[int, Realised] = OrderedDict()
        self._dense: OrderedDict[int, np.ndarray] = OrderedDict()
        self._used: dict[int, tuple[int, int]] = {}  # step -> (links, up) of the steps gossiped over

    def __repr__(self) -> str:
        return f"RealisedTopology({self.topology!r}, {self.faults})"

    def realise(self, step: int) -> Realised:
        """W'_s and its link counts (cached; a pure function of (seed, step))."""
        step = _check_step(step)
        hit = self._cache.get(step)
        if hit is not None:
            self._cache.move_to_end(step)
            return hit
        W = self.topology.sparse(step)
        keep = self.faults.keep(step, W)
        offdiag = np.repeat(np.arange(self.n), np.diff(W.indptr)) != W.indices
        hit = Realised(W=drop_links(W, keep, self.scheme, self.base, self.name),
                       links=int(offdiag.sum()) // 2, up=int((keep & offdiag).sum()) // 2)
        self._cache[step] = hit
        nnz = sum(r.W.nnz for r in self._cache.values())
        while len(self._cache) > 1 and (len(self._cache) > _CACHE_STEPS or nnz > _CACHE_NNZ):
            _, old = self._cache.popitem(last=False)
            nnz -= old.W.nnz
        return hit

    def sparse(self, step: int = 0) -> sp.csr_array:
        """W'_s as canonical float64 CSR (row = receiver); do not modify it."""
        realised = self.realise(step)
        self._used[int(step)] = (realised.links, realised.up)
        return realised.W

    def matrix(self, step: int = 0) -> np.ndarray:
        """W'_s dense (read-only); refused above topologies.limits.DENSE_LIMIT clients, as Topology.matrix is."""
        if self.n > topologies.limits.DENSE_LIMIT:
            raise ValueError(f"{self.name} has n = {self.n} clients, above topologies.limits.DENSE_LIMIT = "
                             f"{topologies.limits.DENSE_LIMIT}: use sparse(step)")
        D = self._dense.get(step)
        if D is None:
            D = self.sparse(step).toarray()
            D.flags.writeable = False
            self._dense[step] = D
            if len(self._dense) > _DENSE_CACHE:
                self._dense.popitem(last=False)
        else:
            self.sparse(step)  # noted as used
        return D

    def out_degrees(self, step: int = 0) -> np.ndarray:
        """Clients each client sends to at `step` over the surviving links (0 for an offline client)."""
        W = self.sparse(step)
        return np.bincount(W.indices, minlength=self.n).astype(np.int64) - (W.diagonal() != 0)

    def take_used(self) -> list[int]:
        """The steps gossiped over since the last call, in order (and forget them)."""
        steps = sorted(self._used)
        self._used = {}
        return steps


def realised_gap(W: sp.csr_array) -> float:
    """1 − ‖W − J‖₂ of a symmetric doubly stochastic W: 0 when its graph is disconnected (eigenvalue 1 twice)."""
    components, _ = connected_components(W, directed=False)
    if components > 1:
        return 0.0
    return 1.0 - spectral.second_eigenvalue(W)


# --------------------------------------------------------------------------------------------- stragglers
class Stragglers:
    """Slow clients per round and the steps a round deadline leaves them (module docstring).

    `steps` are K_i of all N clients (what they take without a deadline); `participants(t)` the [N] mask of the
    clients that train in round t (None: all).
    """

    def __init__(self, seed: int, fraction: float, slowdown: float, deadline: float, steps: np.ndarray,
                 participants=None):
        self.seed, self.fraction, self.slowdown, self.deadline = seed, fraction, slowdown, deadline
        self.steps = np.asarray(steps, dtype=np.int64)
        self.participants = participants
        self._elapsed = (-1, 0.0)  # (round, simulated seconds of rounds 0..round)

    def step_seconds(self, t: int, clients) -> np.ndarray:
        """Simulated seconds per local step of each client in round t: 1, or the slowdown on a slow client."""
        clients = np.asarray(clients, dtype=np.int64)
        if self.fraction == 0:
            return np.ones(len(clients))
        slow = uniform(client_keys(self.seed, clients, t, STREAM_STRAGGLER)) < self.fraction
        return np.where(slow, self.slowdown, 1.0)

    def cap(self, t: int, clients) -> np.ndarray:
        """Steps each client finishes by the deadline in round t: floor(D / c_i) (`LocalTrainer.step_cap`)."""
        return np.floor(np.minimum(self.deadline / self.step_seconds(t, clients), 2.0**62)).astype(np.int64)

    def round(self, t: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(steps done [N], trained [N] bool, simulated seconds) of round t."""
        clients = np.arange(len(self.steps))
        c = self.step_seconds(t, clients)
        done = self.steps if self.deadline == 0 else np.minimum(self.steps, self.cap(t, clients))
        trained = np.ones(len(clients), dtype=bool) if self.participants is None else self.participants(t)
        finish = self.steps[trained] * c[trained]
        seconds = float(finish.max()) if len(finish) else 0.0
        return done, trained, min(seconds, self.deadline) if self.deadline else seconds

    def elapsed(self, t: int) -> float:
        """Simulated seconds of rounds 0..t (summed once per round; a resumed run adds up its past rounds again)."""
        done, total = self._elapsed
        if t < done:
            done, total = -1, 0.0
        for r in range(done + 1, t + 1):
            total += self.round(r)[2]
        self._elapsed = (t, total)
        return total


# ------------------------------------------------------------------------------------------------ the run's
class Network:
    """The network a run trains over.

    `topology` to gossip on (the topology itself, or its `RealisedTopology` with link faults), `gossip` over it
    (compressed with a compressor, `dfl.network.choco`), `step_cap` for the local trainer (stragglers with a deadline),
    `metrics` per evaluation.
    """

    def __init__(self, config, topology, data, participants: Callable[[int], np.ndarray] | None = None):
        """`participants(t)`.

        The [N] mask of the clients that train in round t, for an algorithm that samples them (centralized partial
        participation); None: every client trains every round.
        """
        check_faults(config)
        self.topology = topology
        self.realised: RealisedTopology | None = None
        name = faults_field(config)
        if name is not None:
            W0 = topology.sparse(0)
            if not (topology.symmetric or (not topology.is_time_varying and spectral.is_symmetric(W0))):
                raise ConfigError(f"{name} = {getattr(config, name)} needs an undirected topology (a symmetric W), "
                                  f"but this {topology.name} is directed: a failed directed link breaks the in/out "
                                  "balance that keeps W doubly stochastic")
            scheme = None if topology.weights == "given" else (config.weights or "metropolis")
            base = config.topology_options.get("base") if scheme == "lazy" else None
            faults = LinkFaults(config.seed, float(config.link_failure), float(config.offline),
                                float(config.link_failure_burst), float(config.offline_burst))
            self.realised = self.topology = RealisedTopology(topology, faults, scheme, base)
        self.compressor, self.consensus_lr, self.seed = None, None, config.seed  # compressed gossip (dfl.network.choco)
        # Byzantine clients or a robust aggregator on gossip (dfl.network.byzantine; the server's: ServerAlgorithm)
        self.threat: Threat | None = None
        if participants is None:
            from dfl.network.byzantine import Threat

            self.threat = Threat.of(config, self.topology.n)
        if config.compressor != "none":
            from dfl.network import choco, compression

            choco.check_topology(config.compressor, topology.name, topology.is_time_varying)
            self.compressor = compression.build(config.compressor, config.compression)
            self.consensus_lr = config.consensus_lr  # None: ω of the compressor (dfl.network.choco)
        self.stragglers: Stragglers | None = None
        if config.mode == "sync" and (config.stragglers > 0 or config.round_deadline > 0):  # async: its own clocks
            sizes = data.sizes.numpy()
            mode, amount = config.epochs_or_steps
            steps = local_step_counts(sizes, batch_width(sizes, config.batch_size), mode, amount)
            self.stragglers = Stragglers(config.seed, float(config.stragglers), float(config.straggler_slowdown),
                                         float(config.round_deadline), steps, participants)

    @property
    def step_cap(self):
        """(round, client ids) -> max local steps, for `LocalTrainer.step_cap`; None without a deadline."""
        s = self.stragglers
        return s.cap if s is not None and s.deadline > 0 else None

    def gossip(self, comm, dtype, device, start=None):
        """The run's gossip over this network: the one place it is built.

        With a compressor, CHOCO-GOSSIP (`dfl.network.choco`) wraps it, its public copies starting at `start` (the local
        rows of X_0); with Byzantine clients or a robust aggregator, `dfl.network.byzantine.ByzantineGossip` does.
        """
        from dfl.network.choco import ChocoGossip
        from dfl.network.gossip import Gossip

        gossip = Gossip(self.topology, comm, dtype, device)
        if self.threat is not None:  # validation refuses it with a compressor
            from dfl.network.byzantine import ByzantineGossip

            assert start is not None, "Byzantine gossip starts from X_0"
            robust_gossip = ByzantineGossip(gossip, self.threat, start)
            if self.realised is not None:  # its size check read W'_0, which is no gossip: the metrics count only those
                self.realised.take_used()  # (a resumed run's first round would average step 0 in, `metrics`)
            return robust_gossip
        if self.compressor is None:
            return gossip
        faults = base = None
        if self.realised is not None:
            faults, base = self.realised.faults, Gossip(self.realised.topology, comm, dtype, device)
        return ChocoGossip(gossip, self.compressor, self.consensus_lr, self.seed, start, faults, base)

    def metrics(self, t: int, rounds: int) -> dict[str, Any]:
        """The network's part of round t's record (module docstring).

        `rounds` = rounds since the previous evaluation, whose gossip steps are split evenly (every round of a run has
        the same number of steps).
        """
        out: dict[str, Any] = {}
        if self.realised is not None:
            used = self.realised.take_used()
            per_round = len(used) // rounds if rounds > 0 and len(used) % rounds == 0 else len(used)
            last = [self.realised.realise(s) for s in used[len(used) - per_round:]]  # the evaluated round's steps
            if last:
                out["links_up"] = float(np.mean([r.links_up for r in last]))
                if self.realised.n <= SPECTRAL_METRIC_LIMIT:
                    gaps = [realised_gap(r.W) for r in last]
                    out["spectral_gap_realised"] = float(np.mean(gaps))
                    out["spectral_gap_realised_worst"] = float(np.min(gaps))
        if self.stragglers is not None:
            done, trained, seconds = self.stragglers.round(t)
            steps = done[trained]
            out["steps_done_mean"] = float(steps.mean()) if len(steps) else float("nan")
            out["steps_done_min"] = int(steps.min()) if len(steps) else float("nan")
            out["sim_time_round"] = seconds
            out["sim_time"] = self.stragglers.elapsed(t)
        return out

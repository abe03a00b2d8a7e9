"""The network a run trains over: its topology, the faults on it, and the gossip through them.

`Network` joins the parts of `dfl.network` a run's config turns on, each defined in its own module: link failures and
offline clients (`dfl.network.faults.RealisedTopology`), stragglers and the round deadline
(`dfl.network.faults.Stragglers`), compressed gossip (`dfl.network.choco`) and Byzantine clients with a robust
aggregator (`dfl.network.byzantine`). It checks them against the built topology (`dfl.network.settings` checks what
the config alone says), builds the run's gossip once (`Network.gossip`) and reports the network's metrics
(`Network.metrics`; what each means: `dfl.network.faults`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dfl.config import Config
from dfl.data.sampler import batch_width, local_step_counts
from dfl.errors import ConfigError
from dfl.network.faults import SPECTRAL_METRIC_LIMIT, LinkFaults, RealisedTopology, Stragglers, realised_gap
from dfl.network.settings import check_faults, check_topology, faults_field
from topologies import spectral

if TYPE_CHECKING:
    from dfl.network.byzantine import Threat


class Network:
    """The network a run trains over.

    `topology` to gossip on (the topology itself, or its `RealisedTopology` with link faults), `gossip` over it
    (compressed with a compressor, `dfl.network.choco`), `step_cap` for the local trainer (stragglers with a deadline),
    `metrics` per evaluation.
    """

    def __init__(self, config: Config, topology, data, participants: Callable[[int], np.ndarray] | None = None):
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
            from dfl.network import compression

            check_topology(config.compressor, topology.name, topology.is_time_varying)
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

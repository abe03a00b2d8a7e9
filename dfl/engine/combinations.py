"""What combines with what: every rule between features, in one table that reads the components' cards.

Each component checks its own settings where it is registered (an algorithm's hyperparameters, a topology's options,
a compressor's `compression`, an attack's `attack_scale`, ...). The rules *between* features are here, and only here:
the run's mode (sync, async), compressed gossip, push-sum (a column-stochastic W), gradient tracking and the other
algorithms that gossip more than their models, the local optimizer, differential privacy, Byzantine clients and the
robust aggregators, the topology, the weight scheme, link faults and the world size (processes). A rule asks
capabilities, never names: the algorithm's card (`dfl.algorithms.AlgorithmCard`: centralized, push_sum, compression,
byzantine, dp, asynchronous, local_optimizers), the topology's facts (`dfl.graphs.TopologyFacts`: directed,
time-varying, signed, complete, regular, its own W, the schemes it takes), the weight scheme's card
(`dfl.graphs.WeightsCard`: stochastic, sizes, under_failures, needs a regular or an undirected graph) and the
aggregator's card (`dfl.network.byzantine_settings.AggregatorCard`). A plug-in that declares
its capabilities is held to the same rules as a built-in.

`RULES` is the table: each `Rule` names the axes it joins and says, for a config, why the combination is refused (one
line naming the field and what to use instead) or None. `reasons(config, world)` lists every refusal,
`refusal(config, world)` the first or None, and `check(config, world)` raises them as one `ConfigError`: `dfl.validate`
calls it (world = 1; a torchrun world checks its own size when it is set up). Nothing here imports torch.

The docs page "What combines with what" (docs/reference/combinations.md) is generated from `RULES` by
`docs/gen_combinations.py`: axis against axis, each cell "works" or its refusal's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from dfl import algorithms
from dfl import graphs as topology_registry
from dfl.config import Config
from dfl.errors import ConfigError
from dfl.network import byzantine_settings as threat_settings
from dfl.network import settings as network_settings
from dfl.network.byzantine_settings import AGGREGATORS, byzantine_count
from topologies import limits

__all__ = ["AXES", "RULES", "Rule", "Run", "check", "reasons", "refusal", "unread_topology_fields"]

AXES = ("algorithm", "local optimizer", "mode", "compression", "push-sum", "DP", "Byzantine", "aggregator",
        "topology", "weights", "link faults", "world size", "clients")
"""The axes the rules join (`Rule.axes`), in the order the docs page lists them."""

LINK_FAULTS = ("link_failure", "offline")  # the per-gossip-step faults (`dfl.network.faults`)
TOPOLOGY_FIELDS = ("topology", "weights", "topology_options")


def _default(name: str) -> Any:
    spec = next(f for f in fields(Config) if f.name == name)
    return spec.default_factory() if callable(spec.default_factory) else spec.default  # type: ignore[misc]


class Run:
    """The facts of one config that the rules read: its components' cards, resolved once.

    `world`: the number of processes the run is split over (1 unless a torchrun world).
    """

    def __init__(self, config: Config, world: int = 1):
        self.config, self.world = config, world

    @cached_property
    def card(self) -> algorithms.AlgorithmCard:
        """The algorithm's card."""
        return algorithms.card(self.config.algorithm)

    @property
    def centralized(self) -> bool:
        """The algorithm aggregates at a server (its card)."""
        return self.card.centralized

    @cached_property
    def hp(self) -> Any:
        """The resolved hyperparameters (their defaults when the config's own are wrong: said elsewhere)."""
        try:
            return algorithms.resolve_hyperparameters(self.config)
        except (ValueError, ConfigError):
            return self.card.hyperparameters()

    @cached_property
    def topology(self) -> topology_registry.TopologyFacts:
        """The topology's facts on the config's clients (not `known` for a registered factory: checked when built)."""
        c = self.config
        clients = c.clients if isinstance(c.clients, int) else None
        return topology_registry.facts(c.topology, c.topology_options, clients)

    @cached_property
    def weights(self) -> tuple[topology_registry.WeightsCard, str]:
        """The weight scheme's card, and a custom matrix's own `stochastic`."""
        return topology_registry.weights_of(self.config)

    @property
    def column_stochastic(self) -> bool:
        """W keeps the sum, not the average: push-sum's W (weights = column-stochastic, or a custom matrix's)."""
        return topology_registry.is_column_stochastic(self.config)

    @property
    def one_sided(self) -> bool:
        """W sums to 1 on one side only (row- or column-stochastic)."""
        card, stochastic = self.weights
        return card.stochastic != "doubly" or stochastic != "doubly"

    @property
    def compressed(self) -> bool:
        """Whether compressed gossip (a compressor other than none)."""
        return self.config.compressor != "none"

    @property
    def asynchronous(self) -> bool:
        """Whether mode = async."""
        return self.config.mode == "async"

    @property
    def private(self) -> bool:
        """Whether differential privacy is on (dp_clip > 0)."""
        return bool(self.config.dp_clip)

    @property
    def threatened(self) -> bool:
        """Byzantine clients or a robust aggregator."""
        return threat_settings.threatened(self.config)

    @cached_property
    def aggregator(self) -> threat_settings.AggregatorCard:
        """The aggregator's card."""
        return AGGREGATORS.card(self.config.aggregator, "aggregator")

    @property
    def fault(self) -> str | None:
        """The first link fault that is on (link_failure, offline), or None."""
        return next((name for name in LINK_FAULTS if getattr(self.config, name)), None)

    @property
    def threat(self) -> str:
        """How a refusal names the threat: byzantine = b, or aggregator = name."""
        c = self.config
        return f"byzantine = {c.byzantine:g}" if c.byzantine else f"aggregator = {c.aggregator}"


@dataclass(frozen=True)
class Rule:
    """One rule between features: the axes it joins, and why `config` is refused (one line) or None.

    `because(run)` reads the `Run`'s facts; `summary` says the rule in words for the docs page.
    """

    axes: tuple[str, str]
    summary: str
    because: Callable[[Run], str | None]


RULES: list[Rule] = []


def rule(a: str, b: str, summary: str) -> Callable[[Callable[[Run], str | None]], Callable[[Run], str | None]]:
    """Add the decorated function to `RULES` as the rule joining axes `a` and `b`."""
    if a not in AXES or b not in AXES:
        raise ValueError(f"a rule's axes are among {', '.join(AXES)}; got {a!r}, {b!r}")

    def add(fn: Callable[[Run], str | None]) -> Callable[[Run], str | None]:
        RULES.append(Rule((a, b), summary, fn))
        return fn
    return add


def own_words(run: Run, capability: str, setting: str, instead: str) -> str | None:
    """"SETTING does not apply to ALGORITHM: WHY; use INSTEAD" when its card says why it lacks `capability`."""
    why = run.card.why_not(capability)
    return None if why is None else f"{setting} does not apply to {run.config.algorithm}: {why}; use {instead}"


def takers(capability: str) -> str:
    """The registered algorithms with `capability`, for a refusal's "use one of ...": `dfl.algorithms.able`."""
    return ", ".join(algorithms.able(capability)) or "none is registered"


# ------------------------------------------------------------------------------------------ the algorithm
def unread_topology_fields(config: Config) -> list[str]:
    """The topology fields set in `config` that its run does not read: all of them for a centralized algorithm.

    `topology` counts as set unless it is its default or the complete graph (which a server's average is),
    `weights` when not None, `topology_options` when not empty. [] for an unregistered algorithm or topology.
    """
    try:
        if not algorithms.card(config.algorithm).centralized:
            return []
        complete = config.topology in topology_registry.TOPOLOGIES and \
            topology_registry.facts(config.topology).complete
    except ConfigError:
        return []
    unread = []
    if config.topology != _default("topology") and not complete:
        unread.append("topology")
    unread += [name for name in ("weights", "topology_options") if getattr(config, name) != _default(name)]
    return unread


def _shown(value: Any, width: int = 60) -> str:
    """`value` as a refusal quotes it: its repr, or a table's keys with each long value elided.

    A whole custom matrix would make the line as long as the matrix.
    """
    shown = repr(value)
    if len(shown) <= width or not isinstance(value, dict):
        return shown
    return "{" + ", ".join(f"{key!r}: {_shown(item, width // 2) if len(repr(item)) <= width // 2 else '...'}"
                           for key, item in value.items()) + "}"


@rule("algorithm", "topology", "a centralized algorithm averages at a server (the complete graph): it reads no "
      "topology, weights or topology_options")
def _centralized_topology(run: Run) -> str | None:
    unread = unread_topology_fields(run.config)
    if not unread:
        return None
    c = run.config
    settings = ", ".join(f"{name} = {_shown(getattr(c, name))}" for name in unread)
    return (f"{settings}: {c.algorithm} is centralized (its "
            f"server averages over the complete graph), so it reads no topology; remove {' and '.join(unread)} (or "
            "set topology = full), or use a decentralized algorithm")


@rule("algorithm", "local optimizer", "Adam/AdamW only where the algorithm's card lists them (its rule uses local "
      "training only through its result)")
def _local_optimizer(run: Run) -> str | None:
    c = run.config
    if c.local_optimizer == "sgd" or c.local_optimizer in run.card.local_optimizers:
        return None
    return (f"local_optimizer = {c.local_optimizer} is not defined for {c.algorithm}, whose update rule is written in "
            f"SGD steps; use local_optimizer = sgd, or one of {takers(c.local_optimizer)}")


@rule("topology", "weights", "a topology whose W is given (its paper's, a custom matrix) takes no weight scheme")
def _own_weights(run: Run) -> str | None:
    c = run.config
    if run.centralized or run.topology.own_weights is None or c.weights is None:
        return None
    return f"topology: {c.topology} {run.topology.own_weights}: leave weights unset, got weights={c.weights!r}"


def _scheme(run: Run) -> tuple[str, topology_registry.WeightsCard] | None:
    """The set weight scheme as a refusal names it ("uniform", "lazy (base uniform)"), and the card of its needs.

    None when weights is unset (the topology's default suits it) or names a scheme the topology does not take (its own
    check says so).
    """
    c = run.config
    if run.centralized or c.weights is None or not run.topology.takes(c.weights):
        return None
    card, _ = run.weights
    return (c.weights if card.name == c.weights else f"{c.weights} (base {card.name})"), card


@rule("topology", "weights", "uniform weights 1/(deg + 1) are doubly stochastic on a regular graph only (checked "
      "when it is built where only the graph tells: a random draw, a custom graph, a registered factory)")
def _regular_weights(run: Run) -> str | None:
    scheme = _scheme(run)
    if scheme is None or not scheme[1].regular or run.topology.regular is not False:
        return None
    c = run.config
    return (f"weights = {scheme[0]}: 1/(deg + 1) on each link is doubly stochastic on a regular graph only, but "
            f"topology = {c.topology} on {c.clients} clients has clients of different degrees; use metropolis (the "
            "default), max-degree or lazy, or a regular topology (ring, exponential, hypercube, random-regular, ...)")


@rule("topology", "weights", "fastest-mixing weights optimise a symmetric W: an undirected graph")
def _undirected_weights(run: Run) -> str | None:
    scheme = _scheme(run)
    if scheme is None or not scheme[1].undirected or not run.topology.directed:
        return None
    c, hint = run.config, " (or topology_options symmetric = true)" if run.topology.symmetric_option else ""
    return (f"weights = {scheme[0]} optimises a symmetric W, which needs an undirected graph, but topology = "
            f"{c.topology} is directed; use metropolis, uniform, max-degree or lazy, or an undirected topology{hint}")


# ------------------------------------------------------------------------------------------ push-sum
def _push_sum_field(run: Run) -> tuple[str, str]:
    if run.config.weights == "column-stochastic":
        return "weights", "the W of weights = column-stochastic"
    return "topology_options", "a custom matrix with stochastic = column"


@rule("push-sum", "algorithm", "a column-stochastic W only with an algorithm whose card mixes by push-sum")
def _push_sum_algorithm(run: Run) -> str | None:
    if not run.column_stochastic or run.card.push_sum or run.centralized:  # a server reads no W: said once, above
        return None
    field, what = _push_sum_field(run)
    if field == "weights":
        setting, instead = "weights = column-stochastic (push-sum)", "the topology's own weights or metropolis"
    else:  # a custom matrix takes no weight scheme: its own stochastic is the choice
        setting, instead = "topology_options stochastic = column (push-sum)", "a matrix with stochastic = row or doubly"
    return own_words(run, "push_sum", setting, instead) or \
        f"{field}: " + topology_registry.column_refusal(what, run.config.algorithm, algorithms.able("push_sum"))


@rule("push-sum", "compression", "push-sum's weights need every message exactly: no compressed gossip")
def _push_sum_compression(run: Run) -> str | None:
    if not (run.column_stochastic and run.card.push_sum and run.compressed):
        return None
    field, what = _push_sum_field(run)
    return (f"{field}: {what} mixes by push-sum, whose weights need every message exactly and in step; compressor = "
            f"{run.config.compressor} does not carry them (use compressor = none)")


@rule("push-sum", "mode", "push-sum's weights need every message in step: mode = sync")
def _push_sum_mode(run: Run) -> str | None:
    if not (run.column_stochastic and run.card.push_sum and run.asynchronous):
        return None
    field, what = _push_sum_field(run)
    return (f"{field}: {what} mixes by push-sum, whose weights need every message exactly and in step; mode = async "
            "does not carry them (use mode = sync)")


# ------------------------------------------------------------------------------------------ link faults
@rule("link faults", "algorithm", "link faults are gossip's: a centralized algorithm samples clients instead")
def _faults_centralized(run: Run) -> str | None:
    if run.fault is None or not run.centralized:
        return None
    c = run.config
    return (f"{run.fault} = {getattr(c, run.fault)} applies to gossip, not to the centralized {c.algorithm!r}, which "
            "aggregates at a server every round; for clients that miss rounds use participation with "
            "participation_mode = bernoulli")


@rule("link faults", "topology", "link faults need an undirected graph (a failed directed link breaks W's balance); "
      "on the complete graph, at most FULL_SPARSE_LIMIT clients")
def _faults_topology(run: Run) -> str | None:
    if run.fault is None or run.centralized:
        return None
    c, topo = run.config, run.topology
    value = getattr(c, run.fault)
    if topo.directed:
        hint = " (or topology_options symmetric = true)" if topo.symmetric_option else ""
        return (f"{run.fault} = {value} needs an undirected topology, but {c.topology} is directed: a failed directed "
                "link breaks the in/out balance that keeps W doubly stochastic; use ring, grid, exponential with "
                f"symmetric = true, random-regular, ...{hint}")
    if topo.complete and isinstance(c.clients, int) and c.clients > limits.FULL_SPARSE_LIMIT:
        return (f"{run.fault} = {value} on {c.topology} draws all n(n-1)/2 links per gossip step: at most "
                f"topologies.limits.FULL_SPARSE_LIMIT = {limits.FULL_SPARSE_LIMIT} clients, got clients = "
                f"{c.clients}; use a sparse topology (e.g. random-regular)")
    return None


@rule("link faults", "weights", "link faults reweigh each step's surviving links: a doubly stochastic scheme that can "
      "(metropolis, max-degree, lazy)")
def _faults_weights(run: Run) -> str | None:
    if run.fault is None or run.centralized or run.topology.directed:
        return None
    c = run.config
    value = getattr(c, run.fault)
    card, _ = run.weights
    if run.one_sided:
        return (f"{run.fault} = {value} needs doubly stochastic weights, but weights = {card.name} (a one-sided W) is "
                "not: a failed link would break the balance of W's sums; use metropolis, max-degree or lazy weights")
    if card.under_failures is not None:
        return (f"weights: {run.fault} = {value} reweights the surviving links of each gossip step with the weight "
                f"scheme, but {card.name} {card.under_failures}; use metropolis (the default), max-degree or lazy")
    return None


# ------------------------------------------------------------------------------------------ compressed gossip
@rule("compression", "algorithm", "compressed gossip (CHOCO) keeps one public copy of the models: only an algorithm "
      "that gossips its models alone, and gossips at all")
def _compression_algorithm(run: Run) -> str | None:
    if not run.compressed:
        return None
    c = run.config
    if run.centralized:
        return (f"compressor = {c.compressor} compresses gossip, but {c.algorithm!r} is centralized (it aggregates at "
                f"a server and does not gossip); use a decentralized algorithm ({takers('compression')})")
    if run.card.compression:
        return None
    instead = f"compressor = none, or one of {takers('compression')}"
    return own_words(run, "compression", f"compressor = {c.compressor}", instead) or (
        f"compressor = {c.compressor} is not defined for {c.algorithm!r}, which gossips more than its models each "
        f"step, while compressed gossip (CHOCO) keeps one public copy per client, of the models; use {instead}")


@rule("compression", "topology", "CHOCO keeps each client's public copy at fixed neighbours: a static topology")
def _compression_topology(run: Run) -> str | None:
    if not run.compressed or run.centralized or not run.topology.time_varying:
        return None
    return network_settings.static_refusal(run.config.compressor, run.config.topology)


@rule("compression", "mode", "CHOCO's public copies need every neighbour to see every message in order: mode = sync")
def _compression_mode(run: Run) -> str | None:
    if not (run.compressed and run.asynchronous):
        return None
    return (f"compressor = {run.config.compressor} is not modelled in mode = async (CHOCO's public copies need every "
            "neighbour to see every message in order); use mode = sync")


# ------------------------------------------------------------------------------------------ the asynchronous mode
@rule("mode", "algorithm", "mode = async runs an algorithm whose card has an asynchronous form, with one gossip "
      "step per update")
def _async_algorithm(run: Run) -> str | None:
    if not run.asynchronous:
        return None
    c = run.config
    if run.centralized:
        return (f"mode = async applies to gossip, not to the centralized {c.algorithm!r}, which waits for its clients "
                f"at a server every round; use one of {takers('asynchronous')}")
    if run.card.asynchronous is None:
        return (f"algorithm: mode = async runs {takers('asynchronous')}, not {c.algorithm!r} (an asynchronous update "
                "needs the algorithm's rule for one client at a time)")
    steps = run.hp.get("gossip_steps", 1)
    if steps != 1:
        return (f"gossip_steps = {steps} ({c.algorithm}): mode = async mixes once per update, with the neighbour "
                "models that have arrived; set gossip_steps = 1")
    return None


@rule("mode", "local optimizer", "an asynchronous client takes SGD steps")
def _async_optimizer(run: Run) -> str | None:
    if not run.asynchronous or run.config.local_optimizer == "sgd":
        return None
    return (f"local_optimizer = {run.config.local_optimizer} is not supported with mode = async, which updates one "
            "client at a time with SGD steps; use local_optimizer = sgd")


@rule("mode", "link faults", "the asynchronous mode loses no message and has no round to cut short")
def _async_faults(run: Run) -> str | None:
    if not run.asynchronous:
        return None
    for name in (*LINK_FAULTS, "round_deadline"):
        value = getattr(run.config, name)
        if value:
            what = "rounds to cut short" if name == "round_deadline" else "lost messages"
            return (f"{name} = {value} applies to mode = sync: the asynchronous mode has no {what} (a slow link is "
                    "link_latency / link_bandwidth); set it to 0")
    return None


@rule("mode", "topology", "an asynchronous client has no global gossip step: a static topology")
def _async_topology(run: Run) -> str | None:
    if not run.asynchronous or run.centralized or not run.topology.time_varying:
        return None
    return (f"topology: mode = async needs a static topology, but {run.config.topology} changes every gossip step (an "
            "asynchronous client has no global step); use e.g. ring, exponential, random-regular")


# ------------------------------------------------------------------------------------------ differential privacy
@rule("DP", "algorithm", "client-level DP covers what an algorithm sends when its card says every message is a "
      "post-processing of the clipped, noised models")
def _dp_algorithm(run: Run) -> str | None:
    if not run.private or run.card.dp:
        return None
    c = run.config
    return own_words(run, "dp", f"dp_clip = {c.dp_clip:g}", "dp_clip = 0") or (
        f"dp_clip = {c.dp_clip:g}: {c.algorithm} sends more than its trained models (gradients, trackers, buffers or "
        f"step counts), which clipping does not bound; differential privacy takes {takers('dp')}")


@rule("DP", "mode", "the release counters and the accountant follow the synchronous rounds")
def _dp_mode(run: Run) -> str | None:
    if not (run.private and run.asynchronous):
        return None
    return (f"dp_clip = {run.config.dp_clip:g} is not available in mode = async (the release counters and the "
            "accountant follow the synchronous rounds); use mode = sync")


@rule("DP", "weights", "weights that reveal each client's data size (sample-count; a server's aggregation = size)")
def _dp_sizes(run: Run) -> str | None:
    if not run.private:
        return None
    on = f"dp_clip = {run.config.dp_clip:g}"
    if run.hp.get("aggregation") == "size":
        return (f"{on} with aggregation = size: the weights n_i / Σ n_j reveal each client's data size, which a "
                "replace-one neighbour may change; use aggregation = uniform")
    card, _ = run.weights
    if not run.centralized and card.sizes:
        return (f"{on} with weights = {card.name}: the gossip weights reveal each client's data size, which a "
                "replace-one neighbour may change; use another weights scheme")
    return None


# ------------------------------------------------------------------------------------------ Byzantine clients
@rule("aggregator", "algorithm", "a receiver's rules for a decentralized algorithm, a server's for a centralized one")
def _aggregator_kind(run: Run) -> str | None:
    where = "server" if run.centralized else "gossip"
    if getattr(run.aggregator, where):
        return None
    kind = "the centralized" if run.centralized else "the decentralized"
    return (f"aggregator = {run.config.aggregator} is not a rule of {kind} {run.config.algorithm!r}; use one of "
            f"{', '.join(threat_settings.aggregators(where))}")


@rule("Byzantine", "algorithm", "Byzantine clients and robust aggregators with an algorithm that shares only its "
      "models (its card's byzantine)")
def _threat_algorithm(run: Run) -> str | None:
    if not run.threatened or run.card.byzantine:
        return None
    return own_words(run, "byzantine", run.threat, "byzantine = 0 and aggregator = mean") or (
        f"algorithm: {run.threat} runs with {takers('byzantine')} (they share only their models), not "
        f"{run.config.algorithm!r}")


@rule("Byzantine", "compression", "the attacker would have to forge CHOCO's public copies")
def _threat_compression(run: Run) -> str | None:
    if not (run.threatened and run.compressed):
        return None
    return f"compressor = {run.config.compressor} is not modelled with {run.threat}: use compressor = none"


@rule("Byzantine", "mode", "the attacks and robust rules are written for synchronous gossip steps")
def _threat_mode(run: Run) -> str | None:
    if not (run.threatened and run.asynchronous):
        return None
    return f"mode = async is not modelled with {run.threat}: use mode = sync"


@rule("Byzantine", "push-sum", "the robust rules combine models, not push-sum's (model, weight) pairs")
def _threat_push_sum(run: Run) -> str | None:
    if not (run.threatened and run.column_stochastic) or run.centralized:  # a server reads no W: said once, above
        return None
    if _push_sum_field(run)[0] == "weights":
        return (f"weights = column-stochastic (push-sum) is not modelled with {run.threat}: use a row- or doubly "
                "stochastic scheme (e.g. metropolis)")
    return (f"topology_options stochastic = column (push-sum) is not modelled with {run.threat}: use a matrix with "
            "stochastic = row or doubly")


@rule("aggregator", "topology", "a robust rule reads explicit neighbourhoods (the complete graph's stop at "
      "FULL_SPARSE_LIMIT clients) and weighs by W >= 0 (not MATCHA's signed W)")
def _aggregator_topology(run: Run) -> str | None:
    if run.centralized or not run.aggregator.robust:
        return None
    c = run.config
    if run.topology.signed:
        return (f"aggregator = {c.aggregator} on topology = {c.topology}: the robust gossip rules weigh each neighbour "
                f"by W's entries, assuming W >= 0, but {c.topology}'s W has negative entries; use aggregator = mean "
                "or another topology")
    if run.topology.complete and isinstance(c.clients, int) and c.clients > limits.FULL_SPARSE_LIMIT:
        return (f"aggregator = {c.aggregator} on topology = {c.topology} reads each receiver's whole neighbourhood, "
                f"the {c.clients - 1:,} other clients; the complete graph's explicit neighbourhoods stop at "
                f"{limits.FULL_SPARSE_LIMIT:,} clients (clients = {c.clients:,}): use fewer clients or a sparser "
                "topology (e.g. exponential)")
    return None


@rule("aggregator", "Byzantine", "a server rule's fewest participants for its Byzantine inputs (krum: n > 2f + 2), "
      "in every round: uniform participation (a Bernoulli round may draw fewer)")
def _aggregator_participants(run: Run) -> str | None:
    needs = run.aggregator.participants
    if needs is None or not run.centralized:
        return None
    c = run.config
    try:
        f = c.trim if c.trim is not None else byzantine_count(c.byzantine, c.clients)
    except ConfigError:
        return None  # said by the Byzantine fields' own checks
    fraction = run.hp.get("participation", 1.0)
    if run.hp.get("participation_mode", "uniform") == "bernoulli" and fraction < 1:
        # a round that draws too few would stop the run midway; skipping it would give this rule fewer rounds than
        # another aggregator's run of the same config, and lowering f would drop the guarantee: refused up front
        others = [name for name in threat_settings.aggregators("server") if AGGREGATORS.card(name).robust and
                  AGGREGATORS.card(name).participants is None]
        return (f"participation_mode = bernoulli: aggregator = {c.aggregator} with {f} Byzantine inputs needs at least "
                f"{needs(f)} participants in every round, which a Bernoulli round may not draw; use participation_mode "
                f"= uniform (round(participation x clients) participants every round) or aggregator = "
                f"{', '.join(others)}")
    n = max(1, int(fraction * c.clients + 0.5))
    if n >= needs(f):
        return None
    return (f"aggregator = {c.aggregator} with {f} Byzantine inputs (trim, or byzantine) needs at least {needs(f)} "
            f"participants per round, got {n}; use fewer Byzantine clients, more participants or another aggregator")


@rule("aggregator", "weights", "a robust server rule is unweighted: aggregation = uniform")
def _aggregator_weighted(run: Run) -> str | None:
    if not (run.centralized and run.aggregator.robust and run.hp.get("aggregation") == "size"):
        return None
    return (f"aggregation = size weighs the clients by their data, but aggregator = {run.config.aggregator} is "
            "unweighted; use aggregation = uniform")


@rule("Byzantine", "world size", "the omniscient attacker and the robust rules read every client's row: one process")
def _threat_world(run: Run) -> str | None:
    if run.world <= 1 or not run.threatened:
        return None
    return (f"{run.threat}: a torchrun world of {run.world} processes is not supported, as the attacker and the robust "
            "rules read every client's row; run in one process")


@rule("world size", "clients", "every process of a torchrun world hosts at least one client: clients >= processes")
def _world_clients(run: Run) -> str | None:
    c = run.config
    if run.world <= 1 or not isinstance(c.clients, int) or c.clients >= run.world:
        return None
    return (f"clients = {c.clients} is fewer than the {run.world} processes of the torchrun world, and every process "
            f"hosts at least one client: use at most {c.clients} processes, or more clients")


# ------------------------------------------------------------------------------------------ the table's answers
def reasons(config: Config, world: int = 1) -> list[str]:
    """Why `config` is refused by the rules between features, one line per broken rule ([] when none is).

    `config`'s fields must hold values of their own types (`Config.validate`); a component it names that is not
    registered breaks no rule here (`dfl.validate` says so). `world`: the processes of the run.
    """
    run = Run(config, world)
    try:
        run.card, run.topology, run.aggregator  # noqa: B018 (unregistered names: the registries say so)
    except ConfigError:
        return []
    found: list[str] = []
    for entry in RULES:
        reason = entry.because(run)
        if reason is not None and reason not in found:
            found.append(reason)
    return found


def refusal(config: Config, world: int = 1) -> str | None:
    """The first reason the rules between features refuse `config` (`reasons`), or None: it combines.

    Torch-free; what the covering tests use as their oracle for what the table refuses.
    """
    found = reasons(config, world)
    return found[0] if found else None


def check(config: Config, world: int = 1) -> None:
    """`ConfigError` listing every rule `config` breaks (`reasons`); nothing when it combines."""
    found = reasons(config, world)
    if found:
        raise ConfigError("; ".join(found), found)

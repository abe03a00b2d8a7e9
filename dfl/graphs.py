"""The topology registry: every name the config field `topology` takes, `topologies.build`'s built-ins first.

`TOPOLOGIES` (entry-point group `dfl.topologies`) maps a name to a factory. Register your own network as

    @dfl.graphs.register("two-cliques")
    def two_cliques(n, *, bridges=1):          # n clients; keyword-only parameters are its options
        ...
        return W

returning one of
    - the gossip matrix W ([n, n] numpy array or scipy sparse), used as it is: it must be doubly stochastic
      (finite, nonnegative, rows and columns summing to 1), connected and contracting, checked like a
      `topology = "custom"` matrix file (`topologies.validation`: errors name the row or column and by how
      much); the config's `weights` must be left unset;
    - a networkx graph on n nodes, weighted by the config's `weights` scheme (default metropolis), as
      `custom` weighs a graph;
    - a `topologies.Topology` (e.g. time-varying), used as it is (`weights` unset).
A factory with a keyword-only `seed` option gets the run's seed unless the config sets one.

The `topologies` package knows nothing of dfl: this module adapts it, registering each built-in as a
`BuiltinTopology` that calls `topologies.build(name, n, weights, **options)`. (It is named `dfl.graphs`, not after
the `topologies` package it adapts, so that `import topologies` and dfl's registry are never confused.)

The cards. Each built-in's class is its card: its docstring (the math, its options with their defaults), and the
facts the rules between features read without building it (`TopologyFacts`: time-varying, directed, a W with
negative entries, the complete graph, weights of its own). Each weight scheme has a card too (`WEIGHTS`: which sums
of W are 1, whether it reads the clients' sample counts, why it cannot reweigh the links that survive a failure, and
its options' spec: lazy's `base`, sample-count's `sizes`, equal to the pure `topologies.weights.OPTIONS`).
What a run combines them with (push-sum for a column-stochastic W, link faults, compressed gossip, the asynchronous
mode, robust aggregators) is `dfl.engine.combinations`'s; `check_config` checks the topology's own settings.

What a run can mix with. The engine gossips X <- W X. A doubly stochastic W (every scheme but the three below, and
every matrix unless said otherwise) keeps the average. A row-stochastic W (weights = "row-stochastic" or
"sample-count", the DisPFL `random-pull` topology, a `custom` matrix with stochastic = "row") is allowed as an
explicit choice: the clients still reach consensus, but on a weighted average pi^T x (pi the left Perron vector
of W), biased unless pi = 1/n (`topologies.directed`). A column-stochastic W (weights = "column-stochastic",
stochastic = "column") keeps the sum but not the average; only push-sum's de-biased ratio x/y makes it an
average, so a run takes it only with an algorithm that mixes by push-sum (its card's `push_sum`; SGP is dfedavg
with one local step) and refuses it otherwise (`dfl.engine.combinations`, and `build` when it is built); `dfl
topology` analyses and draws any. Sample-count weights take the clients' sample counts from the option `sizes`, or
from the run's partition when it is unset.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import networkx as nx
import numpy as np
import scipy.sparse as sp

import topologies
from dfl import signatures
from dfl.config import Config
from dfl.errors import ConfigError
from dfl.registry import Registry
from dfl.specs import REQUIRED, Param, Spec, checked, param
from topologies import directed, graphs, measures, schedules
from topologies.build import (
    BASE_GRAPHS,
    RANDOM_K_SCHEMES,
    RANDOM_PULL_SCHEMES,
    default_weights,
)
from topologies.errors import TopologyError
from topologies.validation import check_connected, check_stochastic
from topologies.weights import KIND, LAZY_BASES, NEEDS_REGULAR, NEEDS_UNDIRECTED, OPTIONS

TOPOLOGIES: Registry = Registry("topology", group="dfl.topologies")
"""Every topology the config field `topology` takes: name -> factory.

The built-ins are `BuiltinTopology` instances (one documented class each, `BUILTINS`); `register` adds a factory
f(n, *, option=default, ...) after checking its signature, and installed packages add theirs by entry point (group
`dfl.topologies`). Its options are `topology_options(name)`; `build` turns a name into a validated topology."""
USAGE = "f(n, *, option=default, ...) returning a gossip matrix W [n, n], a networkx graph or a topologies.Topology"
"""The shape of a registered topology factory, as the refusal of a wrong one states it."""


def seed_param(of: str) -> Any:
    """The option `seed` of a random topology, declared once: "the seed of `of`", 0 by default, an integer >= 0.

    Unset, a run passes its own seed (`run_options`). A function rather than a shared base `Spec`: a base class's
    field comes first, and each topology lists its options in `topologies.build`'s order, seed last.
    """
    return param(0, f"the seed of {of} (a run passes its own seed unless this is set)", interval="[0, inf)")


class BuiltinTopology:
    """A topology of the `topologies` package registered under its name (the base of the built-ins below).

    Calling it builds `topologies.build(name, n, weights, **options)`. A graph-weighted built-in is weighted by the
    config's `weights` scheme (metropolis unless said otherwise; `dfl list weights`), and takes besides its own
    options `base` (the scheme under weights = "lazy") and `sizes` (the clients' sample counts under weights =
    "sample-count"; their specs are on the schemes' cards, `WEIGHTS`). `options` holds its own options with their
    defaults ("required" for one without a default), declared once in its `Options` spec (`dfl.specs`: type, default,
    allowed values, one line of help; the "Args" section of its docstring, `dfl list topologies` and the options page
    are generated from it, and `check_config` refuses a value outside it); `kind` is "static", "time-varying" or
    "custom".

    The facts the rules between features read (`facts`): `directed` (some link carries a model one way only, so a
    failed link breaks W's balance; `is_directed` when an option decides it), `regular` (every client has the same
    number of neighbours, which uniform weights need: True, False, or None when only the built graph tells;
    `is_regular` when n or an option decides it), `signed` (W may have negative entries, which the robust gossip
    rules' weights assume away), `complete` (every pair of clients is linked, so what draws or reads each link is
    bounded by `topologies.limits.FULL_SPARSE_LIMIT`) and `schemes` (the weight schemes it takes, when not every one:
    its own check refuses the others); whether it is time-varying is `kind`, and whether its W is given (its
    paper's, `topologies.build.default_weights`, or a custom matrix: `weights` unset) is `gives_w`. `example`: the
    options a small run (8 clients) uses where a required one has no default (the combinations table's runs).
    `circulant`: every client has the same offsets (j − i) mod n to its neighbours (so a one-peer schedule over it is a
    permutation at every step, `OnePeer.check_schedule`).
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "static"
    directed: ClassVar[bool] = False
    regular: ClassVar[bool | None] = None
    schemes: ClassVar[tuple[str, ...] | None] = None
    signed: ClassVar[bool] = False
    complete: ClassVar[bool] = False
    circulant: ClassVar[bool] = False
    example: ClassVar[dict[str, Any]] = {}

    @dataclass(frozen=True)
    class Options(Spec):
        """No options."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Append the "Args:" section generated from its `Options` spec to its docstring."""
        super().__init_subclass__(**kwargs)
        args = cls.Options.docstring_args()
        if cls.__doc__ and args:
            cls.__doc__ = inspect.cleandoc(cls.__doc__) + "\n\n" + args

    def __init__(self) -> None:
        self.options: dict[str, Any] = self.Options.defaults()

    def specs(self) -> tuple[Param, ...]:
        """Every option's spec (`dfl.specs.Param`: name, type, default, allowed values, help)."""
        return self.Options.specs()

    def is_directed(self, options: dict[str, Any]) -> bool:
        """Whether the graph built with `options` is directed (the class's `directed`, unless an option decides)."""
        return self.directed

    def is_regular(self, n: int | None, options: dict[str, Any]) -> bool | None:
        """Whether the graph on n clients built with `options` is regular: the class's `regular` unless n decides.

        None when only the built graph tells, or when n or the options are wrong (their own checks say so).
        """
        return self.regular

    def check_schedule(self, n: int | None, scheme: str, options: dict[str, Any]) -> None:
        """TopologyError when weight scheme `scheme` cannot weigh the graphs built with `options` on n clients.

        Checked before the run builds it where the card can tell without torch (one-peer's steps); nothing by default.
        """

    def gives_w(self, options: dict[str, Any]) -> str | None:
        """How its W is given, so that `weights` stays unset ("defines its own weights (its paper's W)").

        None: a weight scheme weighs its graph.
        """
        return "defines its own weights (its paper's W)" if default_weights(self.name) == "given" else None

    def __call__(self, n: int | None, weights: str | None = None, **options: Any) -> topologies.Topology:
        """The topology on n clients weighted by `weights`: `topologies.build(self.name, n, weights, **options)`."""
        return topologies.build(self.name, n, weights, **options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Ring(BuiltinTopology):
    """Ring: the undirected cycle i -- i+1 (mod n), every client gossips with its two neighbours.

    With Metropolis weights (the default) w_ii = w_i,i±1 = 1/3: W is circulant with eigenvalues
    (1 + 2 cos(2πk/n))/3, k = 0..n−1, so for n ≥ 5

        λ = ‖W − J‖₂ = 1/3 + (2/3) cos(2π/n),    1 − λ = (2/3)(1 − cos(2π/n)) ≈ 4π²/(3n²),

    the slowest-mixing built-in: the gap falls as 1/n². n = 1 is a lone client and n = 2 a single edge.

    Examples:
        >>> from dfl.graphs import build
        >>> round(build("ring", 8).spectral_gap(), 4)  # (2/3)(1 - cos(π/4))
        0.1953
    """

    name = "ring"
    regular = True
    circulant = True


class Grid(BuiltinTopology):
    """Grid: the 2-D r × c mesh, client (a, b) = a·c + b linked to its right and lower neighbours.

    Without `shape` the mesh is near-square (r the largest divisor of n not above √n). A prime n > 3 has no
    r × c shape with both sides ≥ 2 and is refused (naming the nearest counts that factor) unless `shape` asks
    for the 1 × n path. With `periodic` it is the s × s torus, every client of degree 4: with weights 1/5,

        λ = 3/5 + (2/5) cos(2π/s),    1 − λ ≈ 4π²/(5n);

    the open grid has the same Θ(1/n) gap (Metropolis: λ = 0.916 at 5 × 5, 0.968 at 8 × 8).
    """

    name = "grid"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of grid."""

        shape: list[int] | None = param(None, "the mesh's (rows, columns), their product n (unset: near-square)",
                                         items="[1, inf)")
        periodic: bool = param(False, "wrap both sides, making the mesh a torus")

    def is_regular(self, n: int | None, options: dict[str, Any]) -> bool | None:
        """Regular when each side is periodic or at most 2 long (`topologies.graphs.grid_is_regular`)."""
        try:
            periodic = options.get("periodic", False)
            return None if n is None else graphs.grid_is_regular(n, options.get("shape"), periodic)
        except ValueError:
            return None


class Exponential(BuiltinTopology):
    """Exponential: client i sends to i + b^k (mod n) for every hop b^k < n (Ying et al., NeurIPS 2021).

    Ying, Yuan, Chen, Hu, Pan & Yin, "Exponential graph is provably efficient for decentralized deep
    training", NeurIPS 2021. Directed by default (BlueFog's `ExponentialGraph(n, base=b)`): every client has in-
    and out-degree τ = ⌈log_b n⌉, so the weights 1/(τ + 1) are doubly stochastic; for b = 2 and even n

        λ = 1 − 2/(1 + τ),    1 − λ = 2/(1 + τ) = Θ(1/log₂ n),

    at a degree of only log₂ n (odd n mixes a little faster: λ = 0.442 at n = 9).
    """

    name = "exponential"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of exponential."""

        symmetric: bool = param(False, "the undirected circulant graph with offsets ±b^k instead (n/2 adds a single "
                                       "neighbour)")
        exponent_base: int = param(2, "the base b of the hops b^k; a larger b trades degree (log_b n) for mixing "
                                      "(BlueFog's symmetric variant uses 4)", interval="[2, inf)")

    regular = True  # a circulant graph, directed or not: every client has the same hops
    circulant = True

    def is_directed(self, options: dict[str, Any]) -> bool:
        """Directed unless `symmetric`."""
        return not options.get("symmetric", False)


class Full(BuiltinTopology):
    """Full: the complete graph K_n, every client averages with every other in one step.

    Metropolis weights give w_ij = 1/n everywhere, W = J = 11ᵀ/n: exact averaging,

        λ = 0,    1 − λ = 1,

    at n − 1 messages per client per step. A centralized algorithm's server average mixes over this graph.
    """

    name = "full"
    regular = True
    complete = True
    circulant = True


class Star(BuiltinTopology):
    """Star: every client linked to the one client `centre`, n clients in all (BlueFog's `StarGraph`).

    With Metropolis weights the leaves give 1/n to the centre and keep 1 − 1/n, so

        λ = 1 − 1/n,    1 − λ = 1/n;

    the fastest-mixing weights on the star reach λ = (n − 2)/(n − 1). Its centre carries n − 1 links.
    """

    name = "star"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of star."""

        centre: int = param(0, "the index of the centre client, below n", interval="[0, inf)")

    def is_regular(self, n: int | None, options: dict[str, Any]) -> bool | None:
        """The centre has n − 1 neighbours, a leaf 1: regular only for n <= 2."""
        return None if n is None else n <= 2


class Hypercube(BuiltinTopology):
    """Hypercube: n = 2^d clients, i -- i XOR 2^b for each bit b (n must be a power of 2).

    Every client has degree d = log₂ n; with weights 1/(d + 1)

        λ = (d − 1)/(d + 1) (and λ_n = −λ₂),    1 − λ = 2/(1 + log₂ n).
    """

    name = "hypercube"
    regular = True


class RandomRegular(BuiltinTopology):
    """Random regular: a random `degree`-regular graph (`nx.random_regular_graph`), refused unless connected.

    With weights 1/(d + 1) its λ sits near the Ramanujan value (1 + 2√(d − 1))/(d + 1), so the gap stays
    bounded away from 0 as n grows at a fixed degree d. A draw that comes out disconnected is refused
    (raise `degree` or change `seed`).
    """

    name = "random-regular"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of random-regular."""

        degree: int | None = param(None, "every client's number of neighbours d, below n with n·d even (required: a "
                                         "run without it is refused)", interval="[0, inf)")
        seed: int = seed_param("the draw")

    regular = True
    example = {"degree": 3}


class ErdosRenyi(BuiltinTopology):
    """Erdős–Rényi: the random graph G(n, p), each of the n(n − 1)/2 edges present with probability p.

    Connected with high probability when p > ln(n)/n; a disconnected draw (λ = 1) is refused. Degrees vary,
    so the default Metropolis weights are the ones to use (uniform weights are refused on an irregular graph).
    """

    name = "erdos-renyi"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of erdos-renyi."""

        p: float | None = param(None, "the edge probability (required: a run without it is refused)",
                                interval="[0, 1]")
        seed: int = seed_param("the draw")

    example = {"p": 0.6}

    def is_regular(self, n: int | None, options: dict[str, Any]) -> bool | None:
        """Regular as K_n (p = 1) or for n <= 2; otherwise False.

        Its degrees are drawn, regular only by chance of the draw, which uniform weights are not left to (one seed
        would run and the next be refused).
        """
        p = options.get("p")
        if n is None or isinstance(p, bool) or not isinstance(p, (int, float)):
            return None
        return n <= 2 or p == 1


class DirectedRing(BuiltinTopology):
    """Directed ring: client i sends to i+1 (mod n) only (BlueFog's `RingGraph(n, connect_style=2)`).

    In- and out-degree 1 everywhere, so the weights are W = (I + P)/2 with P the cyclic shift: doubly
    stochastic, with

        λ = ‖W − J‖₂ = cos(π/n),    1 − λ ≈ π²/(2n²),

    slower than the undirected ring's 1/3 + (2/3) cos(2π/n) at half its messages.
    """

    name = "directed-ring"
    regular = True
    directed = True
    circulant = True


class DEquiStatic(BuiltinTopology):
    """D-EquiStatic: the mean of M random powers of the cycle, ‖W − J‖₂ ≤ ε independently of n (Song et al. 2022).

    Song, Li, Jin, Shi, Yan, Yin & Yuan, "Communication-Efficient Topologies for Decentralized Learning with O(1)
    Consensus Rate", NeurIPS 2022 (EquiTopo; code kexinjinnn/EquiTopo). With H_a = (1/n) I + ((n − 1)/n) P^a (P the
    cyclic shift) and a_1, …, a_M drawn uniformly from {1, …, n − 1},

        W = (1/M) Σ_m H_{a_m},    ‖W − J‖₂ ≤ ε with probability ≥ 1 − δ when M ≥ 8 ln(2n/δ) / (3ε²),

    at in- and out-degree ≤ M, a consensus rate that does not grow with n. Directed, doubly stochastic: client i
    receives from i − a_m (the authors' training convention, i sends to i + a; their graph code builds the transpose,
    with the same ‖W − J‖₂). Give M, or ε with δ (then M = ⌈8 ln(2n/δ)/(3ε²)⌉); a draw whose offsets share a factor
    with n is disconnected and refused (raise M or change seed). Its W is the paper's: `weights` stays unset.
    """

    name = "d-equistatic"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of d-equistatic."""

        M: int | None = param(None, "the number of basis matrices drawn (unset: from epsilon and delta)",
                              interval="[1, inf)")
        epsilon: float | None = param(None, "the bound on ‖W − J‖₂ to hold", interval="(0, 1)")
        delta: float | None = param(None, "the probability that it fails (the paper's p)", interval="(0, 1)")
        seed: int = seed_param("the offsets")

    directed = True
    example = {"M": 3}


class UEquiStatic(BuiltinTopology):
    """U-EquiStatic: D-EquiStatic made undirected, W = (1/(2M)) Σ_m (H_{a_m} + H_{a_m}ᵀ) (Song et al. 2022).

    The symmetric EquiTopo (NeurIPS 2022; see d-equistatic): the same offsets a_m, each client exchanging with
    i ± a_m, degree ≤ 2M, and the same guarantee ‖W − J‖₂ ≤ ε with probability ≥ 1 − δ at M ≥ 8 ln(2n/δ)/(3ε²).
    Symmetric, so it runs with link failures (failed links' weight moves onto the self-weights) and compression.
    """

    name = "u-equistatic"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of u-equistatic."""

        M: int | None = param(None, "the number of basis matrices drawn (unset: from epsilon and delta)",
                              interval="[1, inf)")
        epsilon: float | None = param(None, "the bound on ‖W − J‖₂ to hold", interval="(0, 1)")
        delta: float | None = param(None, "the probability that it fails (the paper's p)", interval="(0, 1)")
        seed: int = seed_param("the offsets")

    example = {"M": 3}


class OnePeerExponential(BuiltinTopology):
    """One-peer exponential: at step t client i sends to i + 2^(t mod τ) (mod n) only (Ying et al., NeurIPS 2021).

    τ = ⌈log₂ n⌉. Each step graph is a permutation, W_t = (I + P^(2^(t mod τ)))/2, doubly stochastic at one
    message per client. A single step has ‖W_t − J‖₂ = 1, but the product of τ consecutive steps is exactly J when
    n is a power of 2: consensus after τ steps (dfl reports λ_Q = ‖W_{Q−1}⋯W_0 − J‖₂ of the steps a round takes).
    """

    name = "one-peer-exponential"
    regular = True
    directed = True
    kind = "time-varying"


class OnePeer(BuiltinTopology):
    """One-peer schedule of any static base graph: at step t client i sends to one out-neighbour only.

    BlueFog's `GetDynamicOnePeerSendRecvRanks`: client i cycles through its d_i out-neighbours in clockwise
    order ((j − i) mod n), one per step, so a step costs one message per client instead of d_i. On the
    exponential graph this is the one-peer exponential graph; on a ring it alternates i → i+1 and i → i−1. A
    step whose every client receives from exactly one is a permutation, weighted (I + P_t)/2 (doubly
    stochastic); an irregular base graph (a star, an open grid) needs the one-sided weights ("row-stochastic",
    or "column-stochastic" with push-sum).
    """

    name = "one-peer"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of one-peer."""

        graph: str = param("exponential", "the base graph, the name of a static built-in (or a networkx graph)")
        graph_options: dict | None = param(None, "the base graph's own options, e.g. {shape = [4, 4]} for a grid "
                                                 "(unset: its defaults)")

    directed = True
    kind = "time-varying"

    def check_schedule(self, n: int | None, scheme: str, options: dict[str, Any]) -> None:
        """A doubly stochastic scheme needs every step to be a permutation (each client receives from exactly one).

        Each step graph is directed with out-degree 1, so metropolis, uniform, max-degree and lazy weigh it doubly
        stochastically only when every in-degree is 1 too, which `topologies.build` checks over one period. A circulant
        base graph (ring, exponential, ...) always gives permutations; an irregular one never does (a client of degree
        d sends to each neighbour every d-th step, so j receives sum over its neighbours i of 1/d_i per step, 1 only
        when the degrees are equal); any other is checked here on its schedule, as the run would, without torch.
        """
        if KIND.get(scheme, "doubly") != "doubly" or n is None:
            return
        base = options.get("base") if scheme == "lazy" else None
        if any(WEIGHTS[name].undirected for name in (scheme, base) if name in WEIGHTS):
            return  # fastest: refused on any directed graph (`dfl.engine.combinations`)
        graph, graph_options = options.get("graph", "exponential"), options.get("graph_options") or {}
        known = TOPOLOGIES.get(graph) if isinstance(graph, str) and graph in BASE_GRAPHS else None
        if isinstance(known, BuiltinTopology) and known.circulant:
            return
        senders = _one_peer_collision(n, graph, graph_options)
        if senders is None:
            return
        label = f"lazy (base {base or OPTIONS['lazy']['base']})" if scheme == "lazy" else scheme
        raise TopologyError(f"one-peer over {graph if isinstance(graph, str) else 'the given graph'}: {senders}, so "
                            f"its steps are not permutations and weights = {label} cannot make them doubly "
                            "stochastic; use weights = row-stochastic (or column-stochastic with push-sum), or a base "
                            "graph whose one-peer steps are permutations (ring, exponential, directed-ring, full)")


def _one_peer_collision(n: int, graph: Any, graph_options: dict[str, Any]) -> str | None:
    """Why a one-peer schedule over `graph` has a step at which a client receives from several, or None.

    The base graph is a static built-in's name (with its options) or a networkx graph; its schedule is
    `topologies.schedules.OnePeer`'s. An undirected base whose degrees differ collides at some step
    (`OnePeer.check_schedule`); one of degree d everywhere has period d, whose steps are checked. A directed base of
    unequal out-degrees is left to the build.
    """
    if isinstance(graph, nx.Graph):
        A, directed = graphs.adjacency_of(graphs.from_networkx(graph, n))
    elif graph == "full":
        A, directed = graphs.adjacency_of(graphs.full(n))
    else:
        A, directed = graphs.ADJACENCY[graph](n, **graph_options)
    A = sp.csr_array(A)
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    degree = np.bincount(A.indices[A.indices != rows], minlength=n)  # out-degree: whom each client sends to
    if n == 0 or degree.min() != degree.max():
        return None if directed or n == 0 else "its clients have different degrees"
    schedule = schedules.OnePeer(A)
    for step in range(int(degree[0])):  # one period
        receivers = schedule.receivers(step)
        if np.bincount(receivers[receivers >= 0], minlength=n).max(initial=0) > 1:
            return f"at step {step} a client receives from several"
    return None


class RandomK(BuiltinTopology):
    """Random k-peer gossip: at each step every client draws k distinct peers uniformly at random.

    The draws of step t depend only on (seed, t); the step graph is their union made undirected (i -- j if
    either drew the other), so every degree is ≥ k, and Metropolis or max-degree weights make W_t symmetric and
    doubly stochastic. A single W_t may be disconnected: the schedule mixes over several steps, and has no
    period (its λ is not defined; dfl reports λ_Q of the steps a round takes).
    """

    name = "random-k"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of random-k."""

        k: int | None = param(None, "the peers each client draws per step, at most n − 1 (required: a run without "
                                    "it is refused)", interval="[1, inf)")
        seed: int = seed_param("the draws")

    example = {"k": 2}
    schemes = RANDOM_K_SCHEMES
    kind = "time-varying"


class RandomPull(BuiltinTopology):
    """Random pull (DisPFL): at each step every client pulls the models of k random peers and averages them.

    Dai, Shen, Luo, Zhang & Tao, "DisPFL: towards communication-efficient personalized federated learning via
    decentralized sparse training", ICML 2022 (its code's `cs='random'`). Client i's draws are random-k's, but
    the step graph stays directed, j → i for each drawn j (in-degree k, out-degrees vary), weighted row-
    stochastically by default: x_i ← (x_i + Σ_{j drawn} x_j)/(k + 1). W_t 1 = 1 but the columns do not sum to
    1, so the clients agree on a weighted average πᵀx, biased unless π = 1/n.
    """

    name = "random-pull"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of random-pull."""

        k: int | None = param(None, "the peers each client pulls from per step, at most n − 1 (required: a run "
                                    "without it is refused)", interval="[1, inf)")
        seed: int = seed_param("the draws")

    directed = True
    schemes = RANDOM_PULL_SCHEMES
    example = {"k": 2}
    kind = "time-varying"


class BaseGraph(BuiltinTopology):
    """Base-(k+1) graph: ≤ k peers per step and exact consensus after τ steps, for every n (Takezawa et al. 2023).

    Takezawa, Sato, Bao, Niwa & Yamada, "Beyond Exponential Graph: Communication-Efficient Topologies for
    Decentralized Learning via Finite-time Convergence", NeurIPS 2023 (arXiv 2305.11420; code
    yukiTakezawa/BaseGraph). A periodic sequence of symmetric, doubly stochastic W_0, …, W_{τ−1}, cliques of at most
    k + 1 clients averaging at 1/size plus weighted pairings between groups, whose product is exactly

        W_{τ−1} ⋯ W_1 W_0 = J = 11ᵀ/n,    τ ≤ 2 log_{k+1} n + 2,

    so the clients agree exactly after every τ steps (the one-peer exponential graph does only when n is a power of
    2). k = 1 is the Base-2 graph. The shorter of the paper's two constructions (Alg. 3); the digits of n are integer
    arithmetic, exact for every n and k (`topologies.base_graph`). Its W_t are the paper's: `weights` stays unset.
    """

    name = "base-graph"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of base-graph."""

        k: int = param(1, "the peers per client per step (the maximum degree)", interval="[1, inf)")

    kind = "time-varying"


class SimpleBaseGraph(BuiltinTopology):
    """Simple Base-(k+1) graph: the base-(k+1) split of n into groups, exact after τ steps (Takezawa et al. 2023).

    The paper's Alg. 2 on its own (NeurIPS 2023; see base-graph): n = Σ_l a_l (k+1)^(p_l) in base k + 1 splits the
    clients into groups that run k-peer hyper-hypercubes, then exchange between groups with weights that make the
    product of the τ steps exactly J. base-graph takes it when it is the shorter sequence; this name always does.
    """

    name = "simple-base-graph"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of simple-base-graph."""

        k: int = param(1, "the peers per client per step (the maximum degree)", interval="[1, inf)")

    kind = "time-varying"


class ODEquiDyn(BuiltinTopology):
    """OD-EquiDyn: one random power of the cycle per step, W_t = (1 − η) I + η H_{a_t} (Song et al. 2022).

    The one-peer directed EquiTopo (NeurIPS 2022; see d-equistatic): each step every client sends to i + a_t and
    receives from i − a_t, a_t drawn from the D-EquiStatic offsets (M given, same seed) or from all of 1…n − 1 (M
    unset). E‖(W_t − J) x‖² ≤ ((1 − η)² + η²) ‖x − x̄‖² per step for every n (all offsets); η = 1 gives 1 − 2/n,
    which is why the paper takes η < 1. The draws of step t depend only on (seed, t); no period.
    """

    name = "od-equidyn"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of od-equidyn."""

        eta: float = param(0.5, "the weight η of the exchanged model", interval="(0, 1]")
        M: int | None = param(None, "draw a_t from M offsets of D-EquiStatic instead of all of them (unset: all n − 1)",
                              interval="[1, inf)")
        seed: int = seed_param("the draws")

    directed = True
    kind = "time-varying"


class OUEquiDyn(BuiltinTopology):
    """OU-EquiDyn: a random matching i -- i + a_t per step, weights η(n − 1)/n across (Song et al. 2022).

    The one-peer undirected EquiTopo (NeurIPS 2022; see d-equistatic): each step draws an offset a_t (as od-equidyn)
    and a start s_t, and pairs i with i + a_t (mod n) going round from s_t while both are free. A pair keeps
    (1 − η) + η/n and gives η(n − 1)/n to the other; the unpaired keep their model. Symmetric, doubly stochastic, one
    peer per step; the draws of step t depend only on (seed, t); no period.
    """

    name = "ou-equidyn"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of ou-equidyn."""

        eta: float = param(0.5, "the weight η of the exchanged model", interval="(0, 1]")
        M: int | None = param(None, "draw a_t from M offsets of U-EquiStatic instead of all of them (unset: all n − 1)",
                              interval="[1, inf)")
        seed: int = seed_param("the draws")

    kind = "time-varying"


class Matcha(BuiltinTopology):
    """MATCHA: the base graph's matchings, each used per step with a probability that maximises the mixing.

    Wang, Sahu, Yang, Joshi & Kar, "MATCHA: Speeding Up Decentralized SGD via Matching Decomposition Sampling",
    2019 (arXiv 1905.09435; code JYWa/MATCHA). The base graph (its undirected links) is split into matchings M_j
    with Laplacians L_j; matching j is active at a step with probability p_j, the p that maximise λ₂(Σ p_j L_j)
    under Σ p_j ≤ C_b·m (C_b = `budget`: the expected fraction of the matchings used per step), and

        W_t = I − α Σ_{j active} L_j,    α = argmin ‖E[W_tᵀ W_t] − J‖₂,

    symmetric with rows summing to 1; α is often above 1/degree, so a client's self-weight can be negative on a step
    that activates many of its matchings (as in the paper; the one built-in with a signed W). Both optimisations
    use scipy with a certified optimum (`topologies.matcha`); the draws of step t depend only on (seed, t).
    """

    name = "matcha"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of matcha."""

        graph: str = param("exponential", "the base graph, the name of a static built-in (a directed one is taken "
                                          "undirected) or a networkx graph")
        graph_options: dict | None = param(None, "the base graph's own options (unset: its defaults)")
        budget: float = param(0.5, "C_b, the expected fraction of the matchings activated per step", interval="(0, 1]")
        seed: int = seed_param("the activations")

    signed = True
    kind = "time-varying"


class Hierarchical(BuiltinTopology):
    """Hierarchical: a graph inside each of `groups` equal blocks of clients and a graph between the blocks.

    The n clients form G groups of s = n/G consecutive clients; with W_in the s × s matrix of the inner graph
    and W_out the G × G matrix of the outer one,

        W = W_out ⊗ W_in,    λ(W) = max(λ(W_out), λ(W_in))

    for doubly stochastic factors: the hierarchy mixes as fast as its slower level. With the default inner
    graph `full` (W_in = J_s) each group averages exactly and the groups gossip their averages over the outer
    graph: BlueFog's `hierarchical_neighbor_allreduce`, the shape of one process per GPU hosting a block.
    """

    name = "hierarchical"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of hierarchical."""

        groups: int = param(REQUIRED, "the number of groups G, a divisor of n", interval="[1, inf)")
        inner: str = param("full", "the static built-in inside each group", choices=BASE_GRAPHS)
        outer: str = param("ring", "the static built-in between the groups", choices=BASE_GRAPHS)
        inner_options: dict | None = param(None, "the inner graph's options (unset: its defaults)")
        outer_options: dict | None = param(None, "the outer graph's options (unset: its defaults)")

    example = {"groups": 2}

    def is_regular(self, n: int | None, options: dict[str, Any]) -> bool | None:
        """Regular when the inner graph on n/groups clients and the outer one on `groups` are.

        Each level is weighed on its own (`topologies.build`).
        """
        groups = options.get("groups")
        if n is None or isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or n % groups:
            return None
        levels = [(options.get(level, self.options[level]), options.get(f"{level}_options") or {}, size)
                  for level, size in (("inner", n // groups), ("outer", groups))]
        found = [TOPOLOGIES.get(name).is_regular(size, level_options) if name in BASE_GRAPHS and
                 isinstance(level_options, dict) else None for name, level_options, size in levels]
        return None if None in found else all(found)


class Custom(BuiltinTopology):
    """Custom: your own network, given as a networkx graph, an edge-list file or the gossip matrix W itself.

    Exactly one source is given. A graph or an edge list is weighted by the config's `weights` scheme like any
    graph; a matrix is used as it is and checked: finite, nonnegative, its rows and columns (or the sums that
    `stochastic` names) equal to 1, connected and contracting, with errors naming the row or column.
    """

    name = "custom"

    @dataclass(frozen=True)
    class Options(Spec):
        """The options of custom."""

        graph: Any = param(None, "a networkx graph on the nodes 0..n−1")
        path: str | None = param(None, "an edge-list file, one \"u v\" pair per line")
        matrix: Any = param(None, "W as an [n, n] array or a .npy, .csv or .mtx file")
        edges: str | None = param(None, "another name for `path`")
        symmetric: bool | None = param(None, "also require W = Wᵀ of a matrix (unset: False)")
        directed: bool | None = param(None, "read an edge list as u → v instead of u -- v (unset: False)")
        stochastic: str | None = param(None, "which sums of a matrix are 1 (column only with push-sum; unset: doubly)",
                                       choices=("doubly", "row", "column"))

    example = {"matrix": [[1 / 3 if (i - j) % 8 in (0, 1, 7) else 0.0 for j in range(8)] for i in range(8)]}

    kind = "custom"

    def is_directed(self, options: dict[str, Any]) -> bool:
        """An edge list read as u → v (`directed`)."""
        return bool(options.get("directed"))

    def gives_w(self, options: dict[str, Any]) -> str | None:
        """A matrix is W itself; a graph or an edge list is weighed by the scheme."""
        return "with matrix= uses the matrix as W" if options.get("matrix") is not None else None


BUILTINS: tuple[type[BuiltinTopology], ...] = (
    Ring, Grid, Exponential, Full, Star, Hypercube, RandomRegular, ErdosRenyi, DirectedRing, DEquiStatic, UEquiStatic,
    OnePeerExponential, OnePeer, RandomK, RandomPull, BaseGraph, SimpleBaseGraph, ODEquiDyn, OUEquiDyn, Matcha,
    Hierarchical, Custom)
if tuple(cls.name for cls in BUILTINS) != topologies.NAMES:  # one documented class per name, in build's order
    raise ImportError("dfl.graphs.BUILTINS must list one class per topologies.NAMES entry, in that order")
for _cls in BUILTINS:
    TOPOLOGIES.register(_cls.name, _cls())
del _cls


def _check(name: str, factory: Any) -> None:
    signatures.check("topology", name, factory, (1,), USAGE)


SPECS: dict[str, type[Spec]] = {}
"""A registered topology's options spec, when `register` was given one (name -> `dfl.specs.Spec` subclass)."""


def register(name: str, factory: Any = None, *, replace: bool = False, options: type[Spec] | None = None) -> Any:
    """Register `factory(n, *, option=default, ...)` as topology `name` (a decorator without `factory`).

    Its signature is checked here, what it returns when a run builds it. `options`: the spec of its keyword-only
    options (`dfl.specs.Spec`: type, default, allowed values, one help line each), whose names and defaults must be
    the signature's (checked here); `dfl.validate` then refuses a value outside it, naming `topology_options.NAME`,
    before anything is built, and `dfl list topologies` shows it. An entry point's factory declares it as its
    `options` attribute.
    """
    if factory is None:
        return lambda target: register(name, target, replace=replace, options=options)
    _check(name, factory)
    if options is not None:
        try:
            checked("topology", name, options, signatures.options(factory))
        except ValueError as exc:
            raise TopologyError(str(exc)) from None
    registered = TOPOLOGIES.register(name, factory, replace=replace)
    SPECS.pop(name, None)
    if options is not None:
        SPECS[name] = options
    return registered


# an entry point's factory: checked as `register` checks one, with the spec its `options` attribute declares
TOPOLOGIES.plugin = lambda name, factory: register(name, factory, options=getattr(factory, "options", None))


def topology_options(name: str) -> dict[str, Any]:
    """The options topology `name` accepts, with their defaults ("required" for one without a default)."""
    factory = TOPOLOGIES.get(name)
    if isinstance(factory, BuiltinTopology):
        return dict(factory.options)
    _check(name, factory)
    return signatures.options(factory)


def build(name: str, n: int | None, weights: str | None = None, *, push_sum: bool = False,
          push_sum_algorithms: tuple[str, ...] = (), **options: Any) -> topologies.Topology:
    """The validated topology `name` on n clients that a run mixes with.

    A built-in from `topologies.build`, or a registered factory's result adopted as described in the module docstring.
    Errors are ValueErrors naming the topology; a column-stochastic W is refused unless the run's algorithm mixes by
    push-sum (`push_sum`, module docstring; `analyse` builds any W for `dfl topology`).
    """
    topo = analyse(name, n, weights, **options)
    if topo.stochastic == "column" and not push_sum:
        raise TopologyError(column_refusal(f"{name}'s W", takers=push_sum_algorithms))
    return topo


def column_refusal(what: str, algorithm: str | None = None, takers: tuple[str, ...] | list[str] = ()) -> str:
    """Why a run refuses a column-stochastic W, naming what gave it and the allowed alternatives (one line).

    `takers`: the algorithms that mix by push-sum (their cards say so: `dfl.algorithms.able("push_sum")`).
    """
    by = f"{algorithm!r} does not mix by push-sum" if algorithm else "this run does not mix by push-sum"
    use = f"one of {', '.join(takers)} (push-sum)" if takers else "an algorithm that mixes by push-sum"
    return (f"{what} is column-stochastic: gossip X <- W X keeps its sum but not its average, which takes push-sum's "
            f"weights y <- W y and the ratio x/y, and {by}; use {use}, a doubly stochastic scheme (metropolis, ...) or "
            "weights = row-stochastic (consensus on a weighted average), or analyse and draw W with `dfl topology`")


def is_column_stochastic(config: Config) -> bool:
    """Whether `config` asks for a column-stochastic W.

    That is weights = column-stochastic, or a custom matrix with stochastic = column: the W that only push-sum
    averages.
    """
    custom = config.topology == "custom" and config.topology_options.get("stochastic", "doubly") == "column"
    return config.weights == "column-stochastic" or custom


def analyse(name: str, n: int | None, weights: str | None = None, **options: Any) -> topologies.Topology:
    """`build` without the run's refusal of column-stochastic W: what `dfl topology` analyses and draws."""
    factory = TOPOLOGIES.get(name)
    if isinstance(factory, BuiltinTopology):
        return factory(n, weights, **options)
    _check(name, factory)
    signatures.resolve("topology", name, factory, options)
    n = graphs.check_n(n)
    made = factory(n, **options)
    if isinstance(made, nx.Graph):
        try:
            topo = topologies.build("custom", n, weights, graph=made)
        except ValueError as exc:
            raise TopologyError(f"the graph of {name!r}: {exc}") from None
        topo.name = name
        return topo
    if weights is not None:
        raise TopologyError(f"weights = {weights!r} does not apply to {name!r}: it gives its own gossip matrix "
                         "(leave weights unset)")
    if isinstance(made, topologies.Topology):
        if made.n != n:
            raise TopologyError(f"{name!r} built a topology on {made.n} clients for n = {n}")
        made.name = name
        return made
    return _from_matrix(name, made, n)


def _from_matrix(name: str, made: Any, n: int) -> topologies.Topology:
    label = f"the matrix of {name!r}"
    try:
        W = sp.csr_array(made, dtype=np.float64) if sp.issparse(made) else np.array(made, dtype=np.float64)
    except (TypeError, ValueError):
        W = None
    if W is None or W.ndim != 2:
        raise TopologyError(f"{name!r} returned {type(made).__name__}; a topology factory returns a gossip matrix "
                         "W ([n, n] array or scipy sparse), a networkx graph or a topologies.Topology")
    if W.shape != (n, n):
        raise TopologyError(f"{label} must be [n, n] = [{n}, {n}], got shape {list(W.shape)}")
    W = check_stochastic(W, False, label)  # located errors: the row or column, and by how much
    check_connected(W, label)
    S = W if sp.issparse(W) else sp.csr_array(W)
    symmetric = (S != S.T).nnz == 0  # exactly: then the spectral code may use the symmetric solvers
    return topologies.Topology(name, W=W, weights="given", symmetric=symmetric)


def run_options(config: Config) -> dict[str, Any]:
    """The options the run builds its topology with.

    `topology_options`, and the run's seed for a topology with a seed option (random graphs follow the run's seed)
    unless they set one.
    """
    options = dict(config.topology_options)
    if "seed" in topology_options(config.topology):
        options.setdefault("seed", config.seed)
    return options


def check_config(config: Config, centralized: bool = False) -> None:
    """The topology's part of `dfl.validate`, before anything is built: its own settings.

    `topology` is registered, `weights` (when set) is a scheme of `topologies.SCHEMES`; sample-count weights have their
    `sizes`, one per client, when given (a run passes its partition's by default); and the options fit the topology:
    for a built-in, also their values on `clients` nodes and the memory building it takes (`topologies.check`). A
    centralized algorithm mixes over the complete graph, checked instead. A `custom` matrix or edge-list file is read
    and checked here too (no torch; whether its algorithm may take a column-stochastic matrix is a rule between
    features).
    What needs the graph itself (a random graph's connectivity, the degrees of a custom graph or a registered factory's)
    is known when it is built; what the topology combines with (its weight scheme's needs where its card knows the
    graph: a regular one for uniform, an undirected one for fastest; link faults, push-sum, compressed gossip, the
    asynchronous mode, robust aggregators, a centralized algorithm's unread topology) is `dfl.engine.combinations`'s.
    """
    factory = TOPOLOGIES.require(config.topology, "topology")
    if config.weights is not None and config.weights not in topologies.SCHEMES:
        raise ConfigError(f"weights must be one of {', '.join(topologies.SCHEMES)}; got {config.weights!r}")
    options = config.topology_options
    spec = factory.Options if isinstance(factory, BuiltinTopology) else SPECS.get(config.topology)
    if spec is not None and not centralized:
        try:  # each option against its declared range or choices: one line naming it and the allowed values
            spec.check_values(options, "topology_options")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    scheme = config.weights or default_weights(config.topology)
    gives_w = isinstance(factory, BuiltinTopology) and factory.gives_w(options) is not None
    if not centralized and not gives_w:
        _check_scheme_options(config, scheme)
    weights, built = config.weights, run_options(config)
    if gives_w and weights is not None:
        # a topology whose W is given takes no scheme: the rule between topology and weights says so in one line
        # (`dfl.engine.combinations`), so its own check is not asked to say it again
        weights = None
        built = {key: value for key, value in built.items() if key not in SCHEME_OPTION}
    try:
        if centralized:
            topologies.check("full", config.clients)
        elif isinstance(factory, BuiltinTopology):
            topologies.check(config.topology, config.clients, weights, **built)
            if config.topology == "custom" and (scheme != "sample-count" or "sizes" in options):
                # a custom matrix or edge-list file is read now (numpy/scipy, no torch), so a wrong file is refused
                # before any data is made, as a wrong option is (the run reads it again when it builds the graph)
                build("custom", config.clients, weights, push_sum=True, **built)
            elif not gives_w:
                factory.check_schedule(config.clients, scheme, built)
        else:
            signatures.resolve("topology", config.topology, factory, run_options(config))
    except ValueError as exc:
        raise ConfigError(f"topology: {exc}") from None


@dataclass(frozen=True)
class TopologyFacts:
    """What the rules between features read of a topology before it is built (a built-in's card, and its options).

    A registered factory's facts are not known before it is built (`known` False, the flags False, `regular` None):
    the run checks what it built (`dfl.network.run_network.Network`, compressed gossip, the asynchronous mode, the
    weight scheme's needs).
    """

    name: str
    known: bool
    time_varying: bool = False
    directed: bool = False
    signed: bool = False  # W may have negative entries (MATCHA's I − αL)
    complete: bool = False  # the complete graph: explicit links stop at topologies.limits.FULL_SPARSE_LIMIT clients
    own_weights: str | None = None  # how its W is given (its paper's, a custom matrix): `weights` stays unset
    symmetric_option: bool = False  # an option `symmetric` makes it undirected
    regular: bool | None = None  # every client has the same degree; None: only the built graph tells
    schemes: tuple[str, ...] | None = None  # the weight schemes it takes (None: every one)

    def takes(self, scheme: str) -> bool:
        """Whether it is weighed by `scheme` at all (its own check refuses a scheme it does not take)."""
        return self.own_weights is None and (self.schemes is None or scheme in self.schemes)


def facts(name: str, options: dict[str, Any] | None = None, n: int | None = None) -> TopologyFacts:
    """The facts of topology `name` on n clients (None: not known) built with `options` (`TopologyFacts`).

    ConfigError for an unknown name.
    """
    factory = TOPOLOGIES.require(name, "topology")
    if not isinstance(factory, BuiltinTopology):
        return TopologyFacts(name, known=False)
    options = options or {}
    return TopologyFacts(name, True, factory.kind == "time-varying", factory.is_directed(options), factory.signed,
                         factory.complete, factory.gives_w(options), "symmetric" in factory.options,
                         factory.is_regular(n, options), factory.schemes)


@dataclass(frozen=True)
class LazyOptions(Spec):
    """The options of weights = lazy, W = (I + W_base)/2."""

    base: str = param("metropolis", "the scheme W_base made lazy", choices=LAZY_BASES)


@dataclass(frozen=True)
class SampleCountOptions(Spec):
    """The options of weights = sample-count, w_ij ∝ s_j over client i and its in-neighbours."""

    sizes: list[float] | None = param(None, "the clients' sample counts s_i, one per client (unset: a run passes its "
                                            "partition's training-sample counts)", items="(0, inf)")


@dataclass(frozen=True)
class WeightsCard:
    """What the rules read of a weight scheme (`topologies.weights`), and its options.

    `stochastic`: which sums of W are 1 ("doubly", "row" or "column": `topologies.weights.KIND`); `sizes`: it weighs
    the clients by their sample counts (its option `sizes`), which a differential-privacy neighbour may change;
    `under_failures`: why it cannot reweigh the links that survive a failed link or an offline client (None: it can);
    `regular`: it is doubly stochastic on a regular graph only (`topologies.weights.NEEDS_REGULAR`); `undirected`: it
    needs an undirected graph (`NEEDS_UNDIRECTED`). `options`: its options' spec (`dfl.specs`: type, default, allowed
    values, one line of help), set in `topology_options`; its defaults are `topologies.weights.OPTIONS[name]`, the
    pure library's (checked when this module is imported).
    """

    name: str
    stochastic: str
    sizes: bool
    under_failures: str | None = None
    regular: bool = False
    undirected: bool = False
    options: type[Spec] = Spec

    def specs(self) -> tuple[Param, ...]:
        """Every option's spec (`dfl.specs.Param`)."""
        return self.options.specs()

    def check_values(self, options: dict[str, Any], n: int | None) -> None:
        """ConfigError naming `topology_options.NAME` for a value of its options outside their spec.

        `sizes`, when given, lists one count per client (n of them).
        """
        try:
            self.options.check_values(options, "topology_options")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        sizes = options.get("sizes")
        if "sizes" in self.options.defaults() and sizes is not None and n is not None and len(sizes) != n:
            raise ConfigError(f"topology_options.sizes must list {n} sample counts, one per client (or be unset: a "
                              f"run passes its partition's), got {len(sizes)}: {sizes!r}")


# why a scheme cannot reweigh the surviving links of a gossip step (`dfl.network.faults` reweighs each step's graph)
_UNDER_FAILURES = {
    "uniform": "is doubly stochastic on regular graphs only, and failures make the graph irregular",
    "fastest": "optimises W for one graph, and every gossip step has another",
}
_SCHEME_OPTIONS: dict[str, type[Spec]] = {"lazy": LazyOptions, "sample-count": SampleCountOptions}
WEIGHTS: dict[str, WeightsCard] = {
    scheme: WeightsCard(scheme, KIND.get(scheme, "doubly"), "sizes" in _SCHEME_OPTIONS.get(scheme, Spec).defaults(),
                        _UNDER_FAILURES.get(scheme), scheme in NEEDS_REGULAR, scheme in NEEDS_UNDIRECTED,
                        _SCHEME_OPTIONS.get(scheme, Spec))
    for scheme in topologies.SCHEMES
}
"""Every weight scheme's card, in `topologies.SCHEMES` order."""
if {name: card.options.defaults() for name, card in WEIGHTS.items() if card.options.defaults()} != OPTIONS:
    raise ImportError("the weight schemes' option specs (dfl.graphs.WEIGHTS) must declare exactly "
                      "topologies.weights.OPTIONS, the pure library's defaults")
SCHEME_OPTION = {spec.name: card.name for card in WEIGHTS.values() for spec in card.specs()}
"""The scheme each weight-scheme option belongs to (base: lazy, sizes: sample-count)."""


def weights_of(config: Config) -> tuple[WeightsCard, str]:
    """The card of the scheme a run of `config` weighs its graph with, and a custom matrix's own `stochastic`.

    The scheme is the topology's default when `weights` is unset; `stochastic` is "doubly" but for a custom matrix.
    Under weights = lazy with a `base` scheme that cannot reweigh failures (uniform, fastest), that base's card: lazy
    keeps its base's needs (a regular graph, an undirected one).
    """
    scheme = config.weights or default_weights(config.topology)
    card = WEIGHTS.get(scheme) or WeightsCard(scheme, "doubly", False)  # "given": the topology's own W
    base = WEIGHTS.get(config.topology_options.get("base") or "")
    if card.under_failures is None and base is not None and base.under_failures is not None:
        card = base
    stochastic = config.topology_options.get("stochastic", "doubly") if config.topology == "custom" else "doubly"
    return card, stochastic


def _check_scheme_options(config: Config, scheme: str) -> None:
    """The options of the weight scheme in `topology_options` (base, sizes): each belongs to `scheme`, inside its spec.

    A topology whose W is given (its paper's, a custom matrix) takes none: its own check says so.
    """
    options = config.topology_options
    for name in options:
        owner = SCHEME_OPTION.get(name)
        if owner is not None and owner != scheme:
            raise ConfigError(f"topology_options.{name} is an option of weights = {owner} only, not of weights = "
                              f"{scheme} (dfl list weights)")
    if scheme in WEIGHTS:
        WEIGHTS[scheme].check_values(options, config.clients if isinstance(config.clients, int) else None)


def spectral_summary(name: str, n: int | None, weights: str | None = None, *, gossip_steps: int = 1,
                     gamma: float = 0.9, eps: float = 1e-3, start_eps: float = 1e-3, params: int = 1_000_000,
                     **options: Any) -> dict[str, Any]:
    """The spectral summary of topology `name` on n clients (`dfl topology`).

    Degrees (min, mean, max), which of W's sums are 1 (`stochastic`: doubly, row or column), λ = ‖W − J‖₂ (one-sided W:
    |λ₂(W)|), the spectral gap 1 − λ, the contraction of Q = `gossip_steps` steps (‖W^Q − J‖₂, or the one-sided kind's
    consensus error, `topologies.directed`), the second singular value σ₂(W) of a static W, the spread [min, max] of n·π
    (π the Perron vector: the clients' weights in a row-stochastic consensus, push-sum's limit weights for a
    column-stochastic W; [1, 1] when doubly stochastic), Φ, the effective number of neighbours at γ = `gamma`, and the
    gossip steps that shrink disagreement by `eps`; and the measures of `topologies.measures`: the steps to exact
    consensus (finite-time topologies), ‖W_t − J‖₂ per step (the largest over one period) and of one period's
    product, the peers per step (max, mean), the bytes all clients send per round of Q steps for a model of `params`
    float32 parameters, and the steps until a random start is within `start_eps` of consensus. A quantity that is
    not defined for this topology (e.g. λ of a time-varying one, Φ of a one-sided W) is None.
    """
    topo = analyse(name, n, weights, **options)
    deg = topo.degrees()
    lam = _defined(topo.second_eigenvalue)
    doubly = topo.stochastic == "doubly"
    spread = _defined(lambda: [float(v) for v in directed.influence(topo.sparse(0), topo.stochastic)]) \
        if not topo.is_time_varying else _defined(lambda: [float(topo.n * v) for v in (
            topo.stationary().min(), topo.stationary().max())])
    return {
        "topology": name, "n": topo.n, "weights": topo.weights, "stochastic": topo.stochastic,
        "degree": [int(deg.min()), float(deg.mean()), int(deg.max())],
        "lambda": lam,
        "spectral_gap": None if lam is None else 1.0 - lam,
        "gossip_lambda": _defined(topo.gossip_lambda, gossip_steps),
        "sigma2": None if topo.is_time_varying else _defined(directed.second_singular_value, topo.sparse(0)),
        "pi_spread": spread,
        "phi": None if lam is None or not doubly else topologies.phi(lam, topo.n, gossip_steps),
        "effective_neighbors": _defined(topo.effective_neighbors, gamma),
        "consensus_steps": _defined(topo.consensus_steps, eps),  # refused for random-k above 2048 clients
        "exact_steps": _defined(measures.exact_steps, topo) if doubly else None,
        "step_norm": _defined(lambda: max(measures.step_norms(topo))) if doubly else None,
        "period_norm": _defined(measures.period_norm, topo) if doubly else None,
        "peers": list(measures.peers(topo)),
        "bytes_per_round": measures.sends_per_round(topo, gossip_steps) * 4 * params,
        "random_start_steps": _defined(measures.random_start_steps, topo, start_eps) if doubly else None,
        "Q": gossip_steps, "gamma": gamma, "eps": eps, "start_eps": start_eps, "params": params,
    }


def _defined(fn, *args):
    try:
        return fn(*args)
    except ValueError:  # undefined for this topology (e.g. lambda of random-k)
        return None

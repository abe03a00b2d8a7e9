"""The topology registry: every name the config field `topology` takes, `topologies.build`'s built-ins first.

`TOPOLOGIES` (entry-point group `dfl.topologies`) maps a name to a factory. Register your own network as

    @dfl.topologies.register("two-cliques")
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
`BuiltinTopology` that calls `topologies.build(name, n, weights, **options)`.

What a run can mix with. The engine gossips X <- W X. A doubly stochastic W (every scheme but the three below, and
every matrix unless said otherwise) keeps the average. A row-stochastic W (weights = "row-stochastic" or
"sample-count", the DisPFL `random-pull` topology, a `custom` matrix with stochastic = "row") is allowed as an
explicit choice: the clients still reach consensus, but on a weighted average pi^T x (pi the left Perron vector
of W), biased unless pi = 1/n (`topologies.directed`). A column-stochastic W (weights = "column-stochastic",
stochastic = "column") keeps the sum but not the average; only push-sum's de-biased ratio x/y makes it an
average, so a run takes it only with an algorithm that mixes by push-sum (`Algorithm.push_sum`: dfedavg,
dfedavgm, dfedsam, dfedsam-mgs; SGP is dfedavg with one local step) and refuses it otherwise (`check_config`,
`build`); `dfl topology` analyses and draws any. Sample-count weights take the clients' sample counts from the
option `sizes`, or from the run's partition when it is unset.
"""

from __future__ import annotations

import inspect
from typing import Any

import networkx as nx
import numpy as np
import scipy.sparse as sp

import topologies
from dfl import signatures
from dfl.errors import ConfigError
from dfl.registry import Registry
from topologies import directed, graphs
from topologies.build import CUSTOM_OPTIONS, HIERARCHICAL, STATIC, TIME_VARYING, default_weights
from topologies.errors import TopologyError
from topologies.validation import check_connected, check_stochastic
from topologies.weights import KIND

TOPOLOGIES: Registry = Registry("topology", group="dfl.topologies")
USAGE = "f(n, *, option=default, ...) returning a gossip matrix W [n, n], a networkx graph or a topologies.Topology"


class BuiltinTopology:
    """A topology of the `topologies` package, built by `topologies.build(name, n, weights, **options)`."""

    def __init__(self, name: str):
        self.name = name
        if name == "one-peer":  # its schedule class takes the base graph's adjacency; the options are build's
            self.kind = "time-varying"
            self.__doc__ = TIME_VARYING[name][0].__doc__
            self.options = {"graph": "exponential", "graph_options": None}
        elif name in STATIC or name in TIME_VARYING:
            builder, option_names = STATIC.get(name) or TIME_VARYING[name]
            self.kind = "static" if name in STATIC else "time-varying"
            self.__doc__ = builder.__doc__  # `dfl list` shows its first paragraph
            params = inspect.signature(builder.__init__ if isinstance(builder, type) else builder).parameters
            self.options = {k: params[k].default if k in params else signatures.REQUIRED for k in option_names}
        elif name == "hierarchical":
            self.kind = "static"
            self.__doc__ = ("A graph inside each of `groups` equal blocks of clients and a graph between the blocks: "
                            "W = W_outer ⊗ W_inner (inner full: BlueFog's hierarchical neighbour allreduce).\n\n"
                            "See topologies.hierarchical.")
            self.options = dict(zip(HIERARCHICAL, (signatures.REQUIRED, "full", "ring", None, None)))
        else:  # custom: exactly one of its sources is given
            self.kind = "custom"
            self.__doc__ = ("Your own network: graph=, an edge list (path= or edges=), or W itself (matrix=).\n\n"
                            "A networkx graph or an edge-list file is weighted by the scheme (directed=True reads "
                            "an edge list as u -> v); the matrix is an array or a .npy, .csv or .mtx file "
                            "(symmetric=True also requires W = W^T; stochastic= doubly, row or column).")
            self.options = dict.fromkeys(CUSTOM_OPTIONS)

    def __call__(self, n: int | None, weights: str | None = None, **options: Any) -> topologies.Topology:
        return topologies.build(self.name, n, weights, **options)

    def __repr__(self) -> str:
        return f"BuiltinTopology({self.name!r})"


for _name in topologies.NAMES:
    TOPOLOGIES.register(_name, BuiltinTopology(_name))
del _name


def _check(name: str, factory: Any) -> None:
    signatures.check("topology", name, factory, (1,), USAGE)


def register(name: str, factory: Any = None, *, replace: bool = False) -> Any:
    """Register `factory(n, *, option=default, ...)` as topology `name` (a decorator without `factory`); its
    signature is checked here, what it returns when a run builds it."""
    if factory is None:
        return lambda target: register(name, target, replace=replace)
    _check(name, factory)
    return TOPOLOGIES.register(name, factory, replace=replace)


def topology_options(name: str) -> dict[str, Any]:
    """The options topology `name` accepts, with their defaults ("required" for one without a default)."""
    factory = TOPOLOGIES.get(name)
    if isinstance(factory, BuiltinTopology):
        return dict(factory.options)
    _check(name, factory)
    return signatures.options(factory)


def build(name: str, n: int | None, weights: str | None = None, *, push_sum: bool = False,
          **options: Any) -> topologies.Topology:
    """The validated topology `name` on n clients that a run mixes with: a built-in from `topologies.build`, or
    a registered factory's result adopted as described in the module docstring. Errors are ValueErrors naming the
    topology; a column-stochastic W is refused unless the run's algorithm mixes by push-sum (`push_sum`, module
    docstring; `analyse` builds any W for `dfl topology`)."""
    topo = analyse(name, n, weights, **options)
    if topo.stochastic == "column" and not push_sum:
        raise TopologyError(column_refusal(f"{name}'s W"))
    return topo


PUSH_SUM_ALGORITHMS = ("dfedavg", "dfedavgm", "dfedsam", "dfedsam-mgs")  # the built-ins with `Algorithm.push_sum`


def column_refusal(what: str, algorithm: str | None = None) -> str:
    """Why a run refuses a column-stochastic W, naming what gave it and the allowed alternatives (one line)."""
    by = f"{algorithm!r} does not mix by push-sum" if algorithm else "this run does not mix by push-sum"
    return (f"{what} is column-stochastic: gossip X <- W X keeps its sum but not its average, which takes push-sum's "
            f"weights y <- W y and the ratio x/y, and {by}; use one of {', '.join(PUSH_SUM_ALGORITHMS)} (push-sum), "
            "a doubly stochastic scheme (metropolis, ...) or weights = row-stochastic (consensus on a weighted "
            "average), or analyse and draw W with `dfl topology`")


def is_column_stochastic(config) -> bool:
    """Whether `config` asks for a column-stochastic W (weights = column-stochastic, or a custom matrix with
    stochastic = column): the W that only push-sum averages."""
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


def run_options(config) -> dict[str, Any]:
    """The options the run builds its topology with: `topology_options`, and the run's seed for a topology
    with a seed option (random graphs follow the run's seed) unless they set one."""
    options = dict(config.topology_options)
    if "seed" in topology_options(config.topology):
        options.setdefault("seed", config.seed)
    return options


LINK_FAULTS = ("link_failure", "offline")  # Config fields of the unreliable network (dfl.network.faults)


def check_config(config, centralized: bool = False, push_sum: bool = False) -> None:
    """The topology's part of `dfl.validate`, before anything is built: `topology` is registered, `weights`
    (when set) is a scheme of `topologies.SCHEMES`; a column-stochastic W is refused unless the algorithm mixes by
    push-sum (`push_sum`: `Algorithm.push_sum`, module docstring), and with push-sum only synchronous, exact
    gossip; sample-count weights have their `sizes`, one per client, when given (a run passes its partition's by
    default); a directed or one-sided topology is not combined with link faults (a failed directed link breaks
    the balance that keeps W doubly stochastic); and the options fit the topology: for a built-in, also their
    values on `clients` nodes and the memory building it takes (`topologies.check`). A centralized algorithm
    mixes over the complete graph, checked instead. What needs the graph itself (a random graph's connectivity,
    uniform weights on an irregular graph, a custom graph or file) is known when it is built."""
    factory = TOPOLOGIES.require(config.topology, "topology")
    if config.weights is not None and config.weights not in topologies.SCHEMES:
        raise ConfigError(f"weights must be one of {', '.join(topologies.SCHEMES)}; got {config.weights!r}")
    options = config.topology_options
    scheme = config.weights or default_weights(config.topology)
    stochastic = options.get("stochastic", "doubly") if config.topology == "custom" else "doubly"
    if is_column_stochastic(config):
        field, what = ("weights", "the W of weights = column-stochastic") if config.weights == "column-stochastic" \
            else ("topology_options", "a custom matrix with stochastic = column")
        if not push_sum:
            raise ConfigError(f"{field}: " + column_refusal(what, config.algorithm))
        if config.compressor != "none" or config.mode != "sync":
            setting = f"compressor = {config.compressor}" if config.compressor != "none" else f"mode = {config.mode}"
            raise ConfigError(f"{field}: {what} mixes by push-sum, whose weights need every message exactly and in "
                              f"step; {setting} does not carry them (use compressor = none and mode = sync)")
    if scheme == "sample-count" or "sizes" in options:
        sizes = options.get("sizes")
        if scheme != "sample-count":
            raise ConfigError(f"topology_options sizes (the clients' sample counts) apply to weights = sample-count "
                              f"only, not to weights = {scheme}")
        # unset: a run passes its partition's training-sample counts (`dfl.engine.setup.build_topology`)
        if sizes is not None and isinstance(config.clients, int) and (
                not isinstance(sizes, (list, tuple)) or len(sizes) != config.clients):
            raise ConfigError(f"topology_options sizes must list {config.clients} sample counts (one per client), "
                              f"got {sizes!r}")
    fault = next((name for name in LINK_FAULTS if getattr(config, name, 0)), None)
    one_sided = KIND.get(scheme, "doubly") != "doubly" or stochastic != "doubly"
    directed_graph = config.topology in ("directed-ring", "one-peer", "random-pull") or (
        config.topology == "custom" and options.get("directed"))
    if fault is not None and (one_sided or directed_graph):
        what = f"weights = {scheme} (a one-sided W)" if one_sided else f"the directed {config.topology}"
        raise ConfigError(f"{fault} = {getattr(config, fault)} needs an undirected topology with doubly stochastic "
                          f"weights, but {what} is not: a failed link would break the balance of W's sums; use an "
                          "undirected topology (ring, grid, ...) with metropolis, max-degree or lazy weights")
    try:
        if centralized:
            topologies.check("full", config.clients)
        elif isinstance(factory, BuiltinTopology):
            topologies.check(config.topology, config.clients, config.weights, **run_options(config))
        else:
            signatures.resolve("topology", config.topology, factory, run_options(config))
    except ValueError as exc:
        raise ConfigError(f"topology: {exc}") from None


def spectral_summary(name: str, n: int | None, weights: str | None = None, *, gossip_steps: int = 1,
                     gamma: float = 0.9, eps: float = 1e-3, **options: Any) -> dict[str, Any]:
    """The spectral summary of topology `name` on n clients (`dfl topology`): degrees (min, mean, max), which of
    W's sums are 1 (`stochastic`: doubly, row or column), λ = ‖W − J‖₂ (one-sided W: |λ₂(W)|), the spectral gap
    1 − λ, the contraction of Q = `gossip_steps` steps (‖W^Q − J‖₂, or the one-sided kind's consensus error,
    `topologies.directed`), the second singular value σ₂(W) of a static W, the spread [min, max] of n·π (π the
    Perron vector: the clients' weights in a row-stochastic consensus, push-sum's limit weights for a
    column-stochastic W; [1, 1] when doubly stochastic), Φ, the effective number of neighbours at γ = `gamma`,
    and the gossip steps that shrink disagreement by `eps`. A quantity that is not defined for this topology
    (e.g. λ of a time-varying one, Φ of a one-sided W) is None."""
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
        "Q": gossip_steps, "gamma": gamma, "eps": eps,
    }


def _defined(fn, *args):
    try:
        return fn(*args)
    except ValueError:  # undefined for this topology (e.g. lambda of random-k)
        return None

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
from topologies import graphs
from topologies.build import CUSTOM_SOURCES, EDGES_ALIAS, STATIC, TIME_VARYING
from topologies.errors import TopologyError
from topologies.validation import check_connected, check_stochastic

TOPOLOGIES: Registry = Registry("topology", group="dfl.topologies")
USAGE = "f(n, *, option=default, ...) returning a gossip matrix W [n, n], a networkx graph or a topologies.Topology"


class BuiltinTopology:
    """A topology of the `topologies` package, built by `topologies.build(name, n, weights, **options)`."""

    def __init__(self, name: str):
        self.name = name
        if name in STATIC or name in TIME_VARYING:
            builder, option_names = STATIC.get(name) or TIME_VARYING[name]
            self.kind = "static" if name in STATIC else "time-varying"
            self.__doc__ = builder.__doc__  # `dfl list` shows its first paragraph
            params = inspect.signature(builder.__init__ if isinstance(builder, type) else builder).parameters
            self.options = {k: params[k].default if k in params else signatures.REQUIRED for k in option_names}
        else:  # custom: exactly one of its sources is given
            self.kind = "custom"
            self.__doc__ = ("Your own network: graph=, an edge list (path= or edges=), or W itself (matrix=).\n\n"
                            "A networkx graph or an edge-list file is weighted by the scheme; the matrix is an "
                            "array or a .npy, .csv or .mtx file (symmetric=True also requires W = W^T).")
            self.options = dict.fromkeys((*CUSTOM_SOURCES, EDGES_ALIAS, "symmetric"))

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


def build(name: str, n: int | None, weights: str | None = None, **options: Any) -> topologies.Topology:
    """The validated topology `name` on n clients: a built-in from `topologies.build`, or a registered factory's
    result adopted as described in the module docstring. Errors are ValueErrors naming the topology."""
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


def check_config(config, centralized: bool = False) -> None:
    """The topology's part of `dfl.validate`, before anything is built: `topology` is registered, `weights`
    (when set) is a scheme of `topologies.SCHEMES`, and the options fit the topology; for a built-in, also their
    values on `clients` nodes and the memory building it takes (`topologies.check`); a centralized algorithm
    mixes over the complete graph, checked instead. What needs the graph itself (a random graph's connectivity,
    uniform weights on an irregular graph, a custom graph or file) is known when it is built."""
    factory = TOPOLOGIES.require(config.topology, "topology")
    if config.weights is not None and config.weights not in topologies.SCHEMES:
        raise ConfigError(f"weights must be one of {', '.join(topologies.SCHEMES)}; got {config.weights!r}")
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
    """The spectral summary of topology `name` on n clients (`dfl topology`): degrees (min, mean, max),
    λ = |λ₂(W)|, the spectral gap 1 − λ, ‖W^Q − J‖₂ for Q = `gossip_steps`, Φ, the effective number of
    neighbours at γ = `gamma`, and the gossip steps that shrink disagreement by `eps`. A quantity that is
    not defined for this topology (e.g. λ of a time-varying one) is None."""
    topo = build(name, n, weights, **options)
    deg = topo.degrees()
    lam = _defined(topo.second_eigenvalue)
    return {
        "topology": name, "n": topo.n, "weights": topo.weights,
        "degree": [int(deg.min()), float(deg.mean()), int(deg.max())],
        "lambda": lam,
        "spectral_gap": None if lam is None else 1.0 - lam,
        "gossip_lambda": topo.gossip_lambda(gossip_steps),
        "phi": None if lam is None else topologies.phi(lam, topo.n, gossip_steps),
        "effective_neighbors": _defined(topo.effective_neighbors, gamma),
        "consensus_steps": _defined(topo.consensus_steps, eps),  # refused for random-k above 2048 clients
        "Q": gossip_steps, "gamma": gamma, "eps": eps,
    }


def _defined(fn, *args):
    try:
        return fn(*args)
    except ValueError:  # undefined for this topology (e.g. lambda of random-k)
        return None

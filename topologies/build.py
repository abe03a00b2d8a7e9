"""`build(name, n, weights, **options)`: the one entry point that turns a name into a validated Topology."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import scipy.sparse as sp

from topologies import graphs
from topologies.hierarchical import Hierarchical
from topologies.schedules import OnePeer, OnePeerExponential, RandomK, RandomPull
from topologies.topology import Topology
from topologies.validation import check_connected, check_kind, check_stochastic
from topologies.weights import KIND, SCHEMES, check_scheme, sparse_weights

STATIC = {
    "ring": (graphs.ring, ()),
    "grid": (graphs.grid, ("shape", "periodic")),
    "exponential": (graphs.exponential, ("symmetric", "exponent_base")),
    "full": (graphs.full, ()),
    "star": (graphs.star, ("centre",)),
    "hypercube": (graphs.hypercube, ()),
    "random-regular": (graphs.random_regular, ("degree", "seed")),
    "erdos-renyi": (graphs.erdos_renyi, ("p", "seed")),
    "directed-ring": (graphs.directed_ring, ()),
}
TIME_VARYING = {
    "one-peer-exponential": (OnePeerExponential, ()),
    "one-peer": (OnePeer, ("graph", "graph_options")),
    "random-k": (RandomK, ("k", "seed")),
    "random-pull": (RandomPull, ("k", "seed")),
}
HIERARCHICAL = ("groups", "inner", "outer", "inner_options", "outer_options")
CUSTOM_SOURCES = ("graph", "path", "matrix")
EDGES_ALIAS = "edges"  # the name for path= (an edge-list file)
CUSTOM_OPTIONS = (*CUSTOM_SOURCES, EDGES_ALIAS, "symmetric", "directed", "stochastic")
NAMES = (*STATIC, *TIME_VARYING, "hierarchical", "custom")
# random-k step graphs are irregular (uniform is not doubly stochastic there) and change every step
# (an optimisation per step would dominate the run), so only the closed-form schemes are offered
RANDOM_K_SCHEMES = ("metropolis", "max-degree", "lazy")
# random-pull is a pull graph (in-degree k, out-degrees vary): only the one-sided schemes weigh it
RANDOM_PULL_SCHEMES = ("row-stochastic", "sample-count", "column-stochastic")
# the base graph of a one-peer schedule, or a graph of a hierarchical topology: a static built-in
BASE_GRAPHS = (*STATIC,)
# options every graph-weighted topology takes besides its own: the scheme under 'lazy', the sample counts
SCHEME_OPTIONS = ("base", "sizes")


def _option_names(name: str) -> tuple[str, ...]:
    if name == "custom":
        return CUSTOM_OPTIONS
    if name == "hierarchical":
        return HIERARCHICAL
    return (STATIC.get(name) or TIME_VARYING[name])[1]


def default_weights(name: str) -> str:
    """The weight scheme `name` uses when none is given: row-stochastic for random-pull (DisPFL's 1/(k + 1)),
    metropolis for the others."""
    return "row-stochastic" if name == "random-pull" else "metropolis"


def _split_options(name: str, options: dict) -> tuple[dict, str | None, object]:
    allowed = _option_names(name)
    unknown = sorted(set(options) - set(allowed) - set(SCHEME_OPTIONS))
    if unknown:
        listed = ", ".join((*allowed, "base (with weights='lazy')", "sizes (with weights='sample-count')"))
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for topology {name!r}; allowed: {listed}")
    base = options.pop("base", None)
    sizes = options.pop("sizes", None)
    return options, base, sizes


def _scheme_label(scheme: str, base: str | None) -> str:
    return f"lazy({base or 'metropolis'})" if scheme == "lazy" else scheme


def build(name: str, n: int | None, weights: str | None = None, **options) -> Topology:
    """Build and validate a topology.

    name: one of NAMES. n: number of clients (for `custom`, None takes it from the graph, file or matrix).
    weights: one of metropolis (the default; random-pull: row-stochastic), uniform, max-degree, lazy (option base=
    picks the scheme under it, default metropolis), fastest, and the one-sided row-stochastic, column-stochastic and
    sample-count (option sizes= the clients' sample counts); see `topologies.weights` for which apply to directed
    graphs. The W of a one-sided scheme is only row- or column-stochastic (`Topology.stochastic`).
    `custom` takes exactly one of graph= (networkx graph), path= or its alias edges= (edge-list file, weighted
    by the scheme; directed=True reads `u v` as u -> v) or matrix= (the W itself: dense or scipy sparse, or the
    path of a .npy, .csv or .mtx file, relative to the current directory; then weights must be left unset,
    symmetric=True also requires W = W^T, and stochastic= says which sums must be 1: doubly (default), row or
    column). Topology options: grid shape=(r, c) (default near-square; a prime n > 3 needs it), periodic=;
    exponential symmetric=, exponent_base= (default 2); star centre= (default 0); random-regular degree=, seed=;
    erdos-renyi p=, seed=; random-k and random-pull k=, seed=; one-peer graph= (a static built-in's name, default
    exponential, or a networkx graph), graph_options=; hierarchical groups=, inner=, outer=, inner_options=,
    outer_options= (`topologies.hierarchical`).
    """
    if name not in NAMES:
        raise ValueError(f"unknown topology {name!r}; allowed: {', '.join(NAMES)}")
    options, base, sizes = _split_options(name, dict(options))
    if weights is not None and weights not in SCHEMES:
        raise ValueError(f"weights must be one of {', '.join(SCHEMES)}; got {weights!r}")
    if name != "custom":
        graphs.check_n(n)
    if name == "custom":
        return _build_custom(n, weights, base, sizes, options)
    scheme = weights or default_weights(name)
    label = _scheme_label(scheme, base)
    kind = KIND.get(scheme, "doubly")
    if name == "hierarchical":
        return _build_hierarchical(n, weights, base, sizes, options)
    if name in TIME_VARYING:
        bad_base = base not in (None, "metropolis", "max-degree")
        if name == "random-k" and (scheme not in RANDOM_K_SCHEMES or bad_base):
            raise ValueError(f"random-k supports weights {', '.join(RANDOM_K_SCHEMES)} (lazy with base "
                             f"metropolis or max-degree); got weights={label!r}")
        if name == "random-pull" and scheme not in RANDOM_PULL_SCHEMES:
            raise ValueError(f"random-pull (each client averages k peers it pulls: in-degree k, uneven out-degrees) "
                             f"supports weights {', '.join(RANDOM_PULL_SCHEMES)}; got weights={label!r}")
        schedule = _one_peer(n, **options) if name == "one-peer" else TIME_VARYING[name][0](n, **options)

        def step_matrix(step: int) -> sp.csr_array:
            return sparse_weights(schedule.adjacency_at(step), schedule.directed, scheme, base, name, sizes)

        return Topology(name, schedule=schedule, step_matrix=step_matrix, weights=label,
                        symmetric=name == "random-k", stochastic=kind)
    if name == "full" and kind == "doubly":
        # every scheme averages exactly on K_n: W = a I + (1 - a) J is described by a alone (n^2 entries would
        # not fit at 100,000 clients), and the n(n-1)/2-edge networkx graph is built only if someone asks
        check_scheme(scheme, base)
        if sizes is not None:
            raise ValueError(f"option sizes (sample counts) applies to weights='sample-count' only, not to {scheme!r}")
        return Topology(name, n=n, averaging=0.5 if scheme == "lazy" else 0.0, graph=lambda: graphs.full(n),
                        weights=label, symmetric=True)
    A, directed = _adjacency(name, n, options)
    W = sparse_weights(A, directed, scheme, base, name, sizes)
    # fastest may zero an edge's weight: keep the graph itself so neighbours and degrees stay the graph's
    graph = graphs.from_adjacency(A, directed) if scheme == "fastest" or base == "fastest" \
        else (lambda: graphs.from_adjacency(A, directed))
    return Topology(name, graph=graph, W=W, weights=label, symmetric=not directed, stochastic=kind)


def _adjacency(name: str, n: int, options: dict) -> tuple[sp.csr_array, bool]:
    """Receive adjacency and directedness of the static built-in `name` (`full` too, as K_n's adjacency)."""
    if name == "full":
        return graphs.adjacency_of(graphs.full(n))
    return graphs.ADJACENCY[name](n, **options)


def _one_peer(n: int, graph: object = "exponential", graph_options: object = None) -> OnePeer:
    """BlueFog's one-peer schedule of a base graph: a static built-in's name (with its options) or a networkx graph."""
    graph_options = {} if graph_options is None else graph_options
    if not isinstance(graph_options, dict):
        raise ValueError(f"graph_options must be a table of the base graph's options, got {graph_options!r}")
    if isinstance(graph, nx.Graph):
        if graph_options:
            raise ValueError("graph_options apply to a named base graph, not to a networkx graph")
        return OnePeer(graphs.adjacency_of(graphs.from_networkx(graph, n))[0])
    if graph not in BASE_GRAPHS:
        raise ValueError(f"one-peer option graph must be a static topology ({', '.join(BASE_GRAPHS)}) or a "
                         f"networkx graph, got {graph!r}")
    _, allowed = STATIC[graph]
    unknown = sorted(set(graph_options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown graph_options {', '.join(unknown)} for base graph {graph!r}; allowed: "
                         f"{', '.join(allowed) or 'none'}")
    return OnePeer(_adjacency(graph, n, dict(graph_options))[0])


def _build_hierarchical(n: int, weights: str | None, base: str | None, sizes: object, options: dict) -> Topology:
    if sizes is not None:
        raise ValueError("hierarchical does not take sizes: weights='sample-count' is not offered for it")
    parts = {}
    for level, default in (("inner", "full"), ("outer", "ring")):
        name = options.get(level, default)
        if name not in BASE_GRAPHS:
            raise ValueError(f"hierarchical option {level} must be a static topology ({', '.join(BASE_GRAPHS)}), "
                             f"got {name!r}")
        level_options = options.get(f"{level}_options") or {}
        if not isinstance(level_options, dict):
            raise ValueError(f"{level}_options must be a table of the {level} graph's options, got {level_options!r}")
        parts[level] = (name, dict(level_options))
    hierarchy = Hierarchical(n, options.get("groups"))

    def level(which: str, size: int) -> Topology:
        name, level_options = parts[which]
        lazy_base = {"base": base} if base is not None else {}
        try:
            return build(name, size, weights, **level_options, **lazy_base)
        except ValueError as err:
            raise ValueError(f"hierarchical {which} graph ({name} on {size} clients): {err}") from None

    inner, outer = level("inner", hierarchy.size), level("outer", hierarchy.groups)
    if inner.stochastic != outer.stochastic:  # one scheme weighs both, so this cannot happen; keep it explicit
        raise ValueError("hierarchical: the inner and outer graphs must have the same kind of W")
    return Topology("hierarchical", W=hierarchy.matrix(outer.sparse(0), inner.sparse(0)),
                    weights=_scheme_label(weights or "metropolis", base),
                    symmetric=inner.symmetric and outer.symmetric, stochastic=inner.stochastic,
                    groups=hierarchy.labels())


def _build_custom(n: int | None, weights: str | None, base: str | None, sizes: object,
                  options: dict) -> Topology:
    given = [key for key in (*CUSTOM_SOURCES, EDGES_ALIAS) if options.get(key) is not None]
    if len(given) != 1:
        raise ValueError(f"custom needs exactly one of the options {', '.join(CUSTOM_SOURCES)}; "
                         f"got {', '.join(given) or 'none'} ({EDGES_ALIAS}= is another name for path=)")
    source = given[0]
    symmetric = options.get("symmetric")
    if symmetric is not None and (source != "matrix" or not isinstance(symmetric, bool)):
        raise ValueError("custom option symmetric= is True or False, and applies to matrix= only "
                         "(a graph's weights are symmetric when the graph is undirected)")
    stochastic = options.get("stochastic")
    if stochastic is not None and source != "matrix":
        raise ValueError("custom option stochastic= applies to matrix= only (a graph's W is as stochastic as its "
                         "weights scheme makes it: row-stochastic, column-stochastic, or doubly for the others)")
    directed = options.get("directed")
    if directed is not None and source not in ("path", EDGES_ALIAS):
        raise ValueError("custom option directed= applies to an edge-list file (path= or edges=); a networkx graph "
                         "is directed when it is a DiGraph")
    if source == "matrix":
        if sizes is not None:
            raise ValueError("custom with matrix= uses the matrix as W: option sizes does not apply")
        return _custom_matrix(n, weights, base, options["matrix"], bool(symmetric),
                              check_kind("doubly" if stochastic is None else stochastic))
    if source == "graph":
        G = graphs.from_networkx(options["graph"], n)
    else:
        G = graphs.from_edge_list(options[source], n, option=source,
                                  directed=False if directed is None else directed)
    scheme = weights or "metropolis"
    W = sparse_weights(*graphs.adjacency_of(G), scheme, base, "custom graph", sizes)
    return Topology("custom", graph=G, W=W, weights=_scheme_label(scheme, base),
                    symmetric=not G.is_directed(), stochastic=KIND.get(scheme, "doubly"))


def _custom_matrix(n: int | None, weights: str | None, base: str | None, given: object,
                   symmetric: bool, stochastic: str = "doubly") -> Topology:
    if weights is not None or base is not None:
        raise ValueError("custom with matrix= uses the matrix as W: leave weights (and base) unset")
    label = "matrix"
    if isinstance(given, (str, Path)):
        label = str(given)
        W = graphs.load_matrix(given)
    elif sp.issparse(given):
        W = sp.csr_array(given, dtype=np.float64)
    else:
        try:
            W = np.array(given, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("matrix must be a square [n, n] array of numbers") from None
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise ValueError(f"matrix must be a square [n, n] array with n >= 1, got shape {W.shape}")
    if n is not None and graphs.check_n(n) != W.shape[0]:
        raise ValueError(f"n = {n} does not match the {label} of shape {W.shape}")
    if label == "matrix":
        return Topology("custom", W=W, weights="given", symmetric=symmetric, stochastic=stochastic)
    # the checks the Topology repeats (O(nnz)), here so the message names the file
    W = check_stochastic(W, symmetric, label, stochastic)
    check_connected(W, label)
    try:
        return Topology("custom", W=W, weights="given", symmetric=symmetric, stochastic=stochastic)
    except ValueError as err:  # the contraction check (an eigen-solve: not repeated here): name the file too
        raise ValueError(f"{label}: {err}") from None

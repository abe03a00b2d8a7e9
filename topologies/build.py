"""`build(name, n, weights, **options)`: the one entry point that turns a name into a validated Topology."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from topologies import graphs
from topologies.schedules import OnePeerExponential, RandomK
from topologies.topology import Topology
from topologies.validation import check_connected, check_stochastic
from topologies.weights import SCHEMES, check_scheme, sparse_weights

STATIC = {
    "ring": (graphs.ring, ()),
    "grid": (graphs.grid, ("shape", "periodic")),
    "exponential": (graphs.exponential, ("symmetric",)),
    "full": (graphs.full, ()),
    "star": (graphs.star, ()),
    "hypercube": (graphs.hypercube, ()),
    "random-regular": (graphs.random_regular, ("degree", "seed")),
    "erdos-renyi": (graphs.erdos_renyi, ("p", "seed")),
}
TIME_VARYING = {
    "one-peer-exponential": (OnePeerExponential, ()),
    "random-k": (RandomK, ("k", "seed")),
}
CUSTOM_SOURCES = ("graph", "path", "matrix")
EDGES_ALIAS = "edges"  # the name for path= (an edge-list file)
NAMES = (*STATIC, *TIME_VARYING, "custom")
# random-k step graphs are irregular (uniform is not doubly stochastic there) and change every step
# (an optimisation per step would dominate the run), so only the closed-form schemes are offered
RANDOM_K_SCHEMES = ("metropolis", "max-degree", "lazy")


def _option_names(name: str) -> tuple[str, ...]:
    if name == "custom":
        return (*CUSTOM_SOURCES, EDGES_ALIAS, "symmetric")
    return (STATIC.get(name) or TIME_VARYING[name])[1]


def _split_options(name: str, options: dict) -> tuple[dict, str | None]:
    allowed = _option_names(name)
    unknown = sorted(set(options) - set(allowed) - {"base"})
    if unknown:
        listed = ", ".join((*allowed, "base (with weights='lazy')"))
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for topology {name!r}; allowed: {listed}")
    base = options.pop("base", None)
    return options, base


def _scheme_label(scheme: str, base: str | None) -> str:
    return f"lazy({base or 'metropolis'})" if scheme == "lazy" else scheme


def build(name: str, n: int | None, weights: str | None = None, **options) -> Topology:
    """Build and validate a topology.

    name: one of NAMES. n: number of clients (for `custom`, None takes it from the graph, file or matrix).
    weights: one of metropolis (the default), uniform, max-degree, lazy (option base= picks the scheme under
    it, default metropolis), fastest; see `topologies.weights` for which apply to directed graphs.
    `custom` takes exactly one of graph= (networkx graph), path= or its alias edges= (edge-list file, weighted
    by the scheme) or matrix= (the W itself: dense or scipy sparse, or the path of a .npy, .csv or .mtx file,
    relative to the current directory; then weights must be left unset, and symmetric=True also requires
    W = W^T). Topology options: grid shape=(r, c) (default
    near-square; a prime n > 3 needs it), periodic=; exponential symmetric=; random-regular degree=, seed=;
    erdos-renyi p=, seed=; random-k k=, seed=.
    """
    if name not in NAMES:
        raise ValueError(f"unknown topology {name!r}; allowed: {', '.join(NAMES)}")
    options, base = _split_options(name, dict(options))
    if weights is not None and weights not in SCHEMES:
        raise ValueError(f"weights must be one of {', '.join(SCHEMES)}; got {weights!r}")
    if name != "custom":
        graphs.check_n(n)
    if name == "custom":
        return _build_custom(n, weights, base, options)
    scheme = weights or "metropolis"
    label = _scheme_label(scheme, base)
    if name in TIME_VARYING:
        bad_base = base not in (None, "metropolis", "max-degree")
        if name == "random-k" and (scheme not in RANDOM_K_SCHEMES or bad_base):
            raise ValueError(f"random-k supports weights {', '.join(RANDOM_K_SCHEMES)} (lazy with base "
                             f"metropolis or max-degree); got weights={label!r}")
        schedule = TIME_VARYING[name][0](n, **options)

        def step_matrix(step: int) -> sp.csr_array:
            return sparse_weights(schedule.adjacency_at(step), schedule.directed, scheme, base, name)

        return Topology(name, schedule=schedule, step_matrix=step_matrix, weights=label,
                        symmetric=name == "random-k")
    if name == "full":
        # every scheme averages exactly on K_n: W = a I + (1 - a) J is described by a alone (n^2 entries would
        # not fit at 100,000 clients), and the n(n-1)/2-edge networkx graph is built only if someone asks
        check_scheme(scheme, base)
        return Topology(name, n=n, averaging=0.5 if scheme == "lazy" else 0.0, graph=lambda: graphs.full(n),
                        weights=label, symmetric=True)
    A, directed = graphs.ADJACENCY[name](n, **options)
    W = sparse_weights(A, directed, scheme, base, name)
    # fastest may zero an edge's weight: keep the graph itself so neighbours and degrees stay the graph's
    graph = graphs.from_adjacency(A, directed) if scheme == "fastest" or base == "fastest" \
        else (lambda: graphs.from_adjacency(A, directed))
    return Topology(name, graph=graph, W=W, weights=label, symmetric=not directed)


def _build_custom(n: int | None, weights: str | None, base: str | None, options: dict) -> Topology:
    given = [key for key in (*CUSTOM_SOURCES, EDGES_ALIAS) if options.get(key) is not None]
    if len(given) != 1:
        raise ValueError(f"custom needs exactly one of the options {', '.join(CUSTOM_SOURCES)}; "
                         f"got {', '.join(given) or 'none'} ({EDGES_ALIAS}= is another name for path=)")
    source = given[0]
    symmetric = options.get("symmetric")
    if symmetric is not None and (source != "matrix" or not isinstance(symmetric, bool)):
        raise ValueError("custom option symmetric= is True or False, and applies to matrix= only "
                         "(a graph's weights are symmetric when the graph is undirected)")
    if source == "matrix":
        return _custom_matrix(n, weights, base, options["matrix"], bool(symmetric))
    if source == "graph":
        G = graphs.from_networkx(options["graph"], n)
    else:
        G = graphs.from_edge_list(options[source], n, option=source)
    scheme = weights or "metropolis"
    W = sparse_weights(*graphs.adjacency_of(G), scheme, base, "custom graph")
    return Topology("custom", graph=G, W=W, weights=_scheme_label(scheme, base),
                    symmetric=not G.is_directed())


def _custom_matrix(n: int | None, weights: str | None, base: str | None, given: object,
                   symmetric: bool) -> Topology:
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
        return Topology("custom", W=W, weights="given", symmetric=symmetric)
    # the checks the Topology repeats (O(nnz)), here so the message names the file
    W = check_stochastic(W, symmetric, label)
    check_connected(W, label)
    try:
        return Topology("custom", W=W, weights="given", symmetric=symmetric)
    except ValueError as err:  # the contraction check (an eigen-solve: not repeated here): name the file too
        raise ValueError(f"{label}: {err}") from None

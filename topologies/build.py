"""`build(name, n, weights, **options)`: the one entry point that turns a name into a validated Topology."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from topologies import graphs, limits
from topologies.errors import TopologyError
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
        raise TopologyError(f"unknown option(s) {', '.join(unknown)} for topology {name!r}; allowed: {listed}")
    base = options.pop("base", None)
    return options, base


def edge_count(name: str, n: int, options: dict) -> int:
    """The directed edges the graph of `name` on n clients holds while it is built (time-varying: those of the
    steps a schedule keeps), from n and the options alone; an option of the wrong type counts as its minimum
    (the builder refuses it)."""
    log = max(1, (n - 1).bit_length())
    if name in ("ring", "star"):
        return 2 * n
    if name == "grid":
        return 4 * n
    if name in ("exponential", "hypercube", "one-peer-exponential"):
        return 2 * n * log
    per_node = {"random-regular": "degree", "random-k": "k"}.get(name)
    if per_node is not None:
        value = options.get(per_node)
        return n * value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else n
    if name == "erdos-renyi":
        p = options.get("p")
        ok = isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1
        return int(p * n * n) if ok else n
    return n  # full: W = a I + (1 - a) J is described by a alone


def check_size(name: str, n: int, options: dict) -> None:
    """Refuse a topology whose construction would need more memory than this machine has free (an estimate
    from `edge_count` and `limits.EDGE_BYTES`), before anything is allocated."""
    edges = edge_count(name, n, options)
    need = limits.EDGE_BYTES * edges + limits.NODE_BYTES * n
    free = limits.available_memory()
    if need > free:
        raise TopologyError(f"{name} on n = {n:,} clients needs ~{limits.gib(need)} of memory to build ({edges:,} "
                            f"edges), more than the {limits.gib(free)} available; use fewer clients")


def check(name: str, n: int | None, weights: str | None = None, **options) -> tuple[dict, str | None]:
    """Every check of `build` that needs no construction, in microseconds: the name, the options and their
    values (grid shape, exponential symmetric, hypercube n, random-regular degree, erdos-renyi p, random-k k,
    seeds), the weights scheme, n, and the memory building it would take. What needs the graph itself (uniform
    weights on an irregular graph, a random graph's connectivity, a custom graph, file or matrix) is checked
    by `build`. Returns (the options without base, base)."""
    if name not in NAMES:
        raise TopologyError(f"unknown topology {name!r}; allowed: {', '.join(NAMES)}")
    options, base = _split_options(name, dict(options))
    if weights is not None and weights not in SCHEMES:
        raise TopologyError(f"weights must be one of {', '.join(SCHEMES)}; got {weights!r}")
    if name == "custom":
        _check_sources(options)
        return options, base
    n = graphs.check_n(n)
    scheme = weights or "metropolis"
    check_scheme(scheme, base)
    if name == "random-k" and (scheme not in RANDOM_K_SCHEMES or base not in (None, "metropolis", "max-degree")):
        raise TopologyError(f"random-k supports weights {', '.join(RANDOM_K_SCHEMES)} (lazy with base "
                            f"metropolis or max-degree); got weights={_scheme_label(scheme, base)!r}")
    if "seed" in options:
        graphs._check_seed(options["seed"])
    if name == "grid":
        graphs._grid_shape_option(n, options.get("shape"), options.get("periodic", False))
    elif name == "exponential":
        graphs._check_symmetric(options.get("symmetric", False))
    elif name == "hypercube":
        graphs.check_hypercube(n)
    elif name == "random-regular":
        graphs.check_degree(n, options.get("degree"))
    elif name == "erdos-renyi":
        graphs.check_probability(options.get("p"))
    elif name == "random-k":
        RandomK(n, **options)  # its constructor checks n, k and seed and allocates nothing
    check_size(name, n, options)
    return options, base


def _check_sources(options: dict) -> None:
    """custom: exactly one source, and a source file that exists (what is in it is read by `build`)."""
    given = [key for key in (*CUSTOM_SOURCES, EDGES_ALIAS) if options.get(key) is not None]
    if len(given) != 1:
        raise TopologyError(f"custom needs exactly one of the options {', '.join(CUSTOM_SOURCES)}; "
                            f"got {', '.join(given) or 'none'} ({EDGES_ALIAS}= is another name for path=)")
    value = options[given[0]]
    if given[0] != "graph" and isinstance(value, (str, Path)) and not Path(value).is_file():
        what = "matrix file" if given[0] == "matrix" else f"{given[0]}: edge-list file"
        state = "is not a file" if Path(value).exists() else "does not exist"
        raise TopologyError(f"{what} {str(value)!r} {state}")


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
    options, base = check(name, n, weights, **options)
    if name == "custom":
        return _build_custom(n, weights, base, options)
    scheme = weights or "metropolis"
    label = _scheme_label(scheme, base)
    if name in TIME_VARYING:
        schedule = TIME_VARYING[name][0](n, **options)

        def step_matrix(step: int) -> sp.csr_array:
            return sparse_weights(schedule.adjacency_at(step), schedule.directed, scheme, base, name)

        return Topology(name, schedule=schedule, step_matrix=step_matrix, weights=label,
                        symmetric=name == "random-k")
    if name == "full":
        # every scheme averages exactly on K_n: W = a I + (1 - a) J is described by a alone (n^2 entries would
        # not fit at 100,000 clients), and the n(n-1)/2-edge networkx graph is built only if someone asks
        return Topology(name, n=n, averaging=0.5 if scheme == "lazy" else 0.0, graph=lambda: graphs.full(n),
                        weights=label, symmetric=True)
    A, directed = graphs.ADJACENCY[name](n, **options)
    W = sparse_weights(A, directed, scheme, base, name)
    # fastest may zero an edge's weight: keep the graph itself so neighbours and degrees stay the graph's
    graph = graphs.from_adjacency(A, directed) if scheme == "fastest" or base == "fastest" \
        else (lambda: graphs.from_adjacency(A, directed))
    return Topology(name, graph=graph, W=W, weights=label, symmetric=not directed)


def _build_custom(n: int | None, weights: str | None, base: str | None, options: dict) -> Topology:
    source = next(key for key in (*CUSTOM_SOURCES, EDGES_ALIAS) if options.get(key) is not None)  # one: `check`
    symmetric = options.get("symmetric")
    if symmetric is not None and (source != "matrix" or not isinstance(symmetric, bool)):
        raise TopologyError("custom option symmetric= is True or False, and applies to matrix= only "
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
        raise TopologyError("custom with matrix= uses the matrix as W: leave weights (and base) unset")
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
            raise TopologyError("matrix must be a square [n, n] array of numbers") from None
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise TopologyError(f"matrix must be a square [n, n] array with n >= 1, got shape {W.shape}")
    if n is not None and graphs.check_n(n) != W.shape[0]:
        raise TopologyError(f"n = {n} does not match the {label} of shape {W.shape}")
    if label != "matrix":
        # the checks the Topology repeats (O(nnz)), here so the message names the file
        W = check_stochastic(W, symmetric, label)
        check_connected(W, label)
    return Topology("custom", W=W, weights="given", symmetric=symmetric)

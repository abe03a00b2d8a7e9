"""`build(name, n, weights, **options)`: the one entry point that turns a name into a validated Topology."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import scipy.sparse as sp

from topologies import base_graph, equitopo, graphs, limits
from topologies import matcha as matcha_module
from topologies.directed import check_kind
from topologies.errors import TopologyError
from topologies.hierarchical import Hierarchical
from topologies.schedules import OnePeer, OnePeerExponential, RandomK, RandomPull
from topologies.topology import Topology
from topologies.validation import check_connected, check_stochastic
from topologies.weights import KIND, SCHEMES, check_scheme, sparse_weights

STATIC: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "ring": (graphs.ring, ()),
    "grid": (graphs.grid, ("shape", "periodic")),
    "exponential": (graphs.exponential, ("symmetric", "exponent_base")),
    "full": (graphs.full, ()),
    "star": (graphs.star, ("centre",)),
    "hypercube": (graphs.hypercube, ()),
    "random-regular": (graphs.random_regular, ("degree", "seed")),
    "erdos-renyi": (graphs.erdos_renyi, ("p", "seed")),
    "directed-ring": (graphs.directed_ring, ()),
    "d-equistatic": (equitopo.DEquiStatic, ("M", "epsilon", "delta", "seed")),
    "u-equistatic": (equitopo.UEquiStatic, ("M", "epsilon", "delta", "seed")),
}
def _base_adjacency(n: int, graph: object, graph_options: object, name: str) -> sp.csr_array:
    """The receive adjacency of a one-peer or matcha base graph.

    A static built-in's name (with its options) or a networkx graph.
    """
    graph_options = {} if graph_options is None else graph_options
    if not isinstance(graph_options, dict):
        raise TopologyError(f"graph_options must be a table of the base graph's options, got {graph_options!r}")
    if isinstance(graph, nx.Graph):
        if graph_options:
            raise TopologyError("graph_options apply to a named base graph, not to a networkx graph")
        return graphs.adjacency_of(graphs.from_networkx(graph, n))[0]
    if graph not in BASE_GRAPHS:
        raise TopologyError(f"{name} option graph must be a static topology ({', '.join(BASE_GRAPHS)}) or a "
                            f"networkx graph, got {graph!r}")
    _, allowed = STATIC[graph]
    unknown = sorted(set(graph_options) - set(allowed))
    if unknown:
        raise TopologyError(f"unknown graph_options {', '.join(unknown)} for base graph {graph!r}; allowed: "
                            f"{', '.join(allowed) or 'none'}")
    return _adjacency(graph, n, dict(graph_options))[0]


def matcha(n: int, graph: object = "exponential", graph_options: object = None, budget: float = 0.5,
           seed: int = 0) -> matcha_module.Matcha:
    """MATCHA (`topologies.matcha`) over a base graph named as one-peer's (a directed one is taken undirected)."""
    return matcha_module.Matcha(_base_adjacency(n, graph, graph_options, "matcha"), budget, seed)


TIME_VARYING: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "one-peer-exponential": (OnePeerExponential, ()),
    "one-peer": (OnePeer, ("graph", "graph_options")),
    "random-k": (RandomK, ("k", "seed")),
    "random-pull": (RandomPull, ("k", "seed")),
    "base-graph": (base_graph.BaseGraph, ("k",)),
    "simple-base-graph": (base_graph.SimpleBaseGraph, ("k",)),
    "od-equidyn": (equitopo.ODEquiDyn, ("eta", "M", "seed")),
    "ou-equidyn": (equitopo.OUEquiDyn, ("eta", "M", "seed")),
    "matcha": (matcha, ("graph", "graph_options", "budget", "seed")),
}
# topologies whose papers define their weights: W (or each W_t) is theirs, so `weights` stays unset
OWN_WEIGHTS = ("d-equistatic", "u-equistatic", "base-graph", "simple-base-graph", "od-equidyn", "ou-equidyn",
               "matcha")
HIERARCHICAL = ("groups", "inner", "outer", "inner_options", "outer_options")
CUSTOM_SOURCES = ("graph", "path", "matrix")
EDGES_ALIAS = "edges"  # the name for path= (an edge-list file)
CUSTOM_OPTIONS = (*CUSTOM_SOURCES, EDGES_ALIAS, "symmetric", "directed", "stochastic")
NAMES = (*STATIC, *TIME_VARYING, "hierarchical", "custom")
# random-k step graphs are irregular (uniform is not doubly stochastic there) and change every step
# (an optimisation per step would dominate the run), so only the closed-form schemes are offered
RANDOM_K_SCHEMES = ("metropolis", "max-degree", "lazy", "row-stochastic", "column-stochastic", "sample-count")
# random-pull is a pull graph (in-degree k, out-degrees vary): only the one-sided schemes weigh it
RANDOM_PULL_SCHEMES = ("row-stochastic", "sample-count", "column-stochastic")
# the base graph of a one-peer schedule or of MATCHA, or a graph of a hierarchical topology: a static built-in
# weighted by a scheme
BASE_GRAPHS = tuple(name for name in STATIC if name not in OWN_WEIGHTS)
# options every graph-weighted topology takes besides its own: the scheme under 'lazy', the sample counts
SCHEME_OPTIONS = ("base", "sizes")


def _option_names(name: str) -> tuple[str, ...]:
    if name == "custom":
        return CUSTOM_OPTIONS
    if name == "hierarchical":
        return HIERARCHICAL
    return (STATIC.get(name) or TIME_VARYING[name])[1]


def default_weights(name: str) -> str:
    """The weight scheme topology `name` uses when none is given.

    Row-stochastic for random-pull (DisPFL's w_ij = 1/(k + 1) on a client's k pulls and itself), "given" for the
    topologies that define their own weights (`OWN_WEIGHTS`), metropolis (w_ij = 1/(1 + max(d_i, d_j)) on each
    edge) for the others.
    """
    if name in OWN_WEIGHTS:
        return "given"
    return "row-stochastic" if name == "random-pull" else "metropolis"


def _split_options(name: str, options: dict) -> tuple[dict, str | None, object]:
    allowed = _option_names(name)
    unknown = sorted(set(options) - set(allowed) - set(SCHEME_OPTIONS))
    if unknown:
        listed = ", ".join((*allowed, "base (with weights='lazy')", "sizes (with weights='sample-count')"))
        raise TopologyError(f"unknown option(s) {', '.join(unknown)} for topology {name!r}; allowed: {listed}")
    base = options.pop("base", None)
    sizes = options.pop("sizes", None)
    return options, base, sizes


def edge_count(name: str, n: int, options: dict, scheme: str = "metropolis") -> int:
    """The directed edges the graph of `name` on n clients holds while it is built, from n and the options alone.

    Time-varying: those of the steps a schedule keeps; hierarchical: the nonzeros of W_out ⊗ W_in. An option of
    the wrong type counts as its minimum (the builder refuses it).
    """
    log = max(1, (n - 1).bit_length())
    if name in ("ring", "star"):
        return 2 * n
    if name in ("grid", "directed-ring"):
        return 4 * n
    if name in ("exponential", "hypercube", "one-peer-exponential"):
        return 2 * n * log
    per_node = {"random-regular": "degree", "random-k": "k", "random-pull": "k"}.get(name)
    if per_node is not None:
        value = options.get(per_node)
        return n * value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else n
    if name == "erdos-renyi":
        p = options.get("p")
        if isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1:
            return int(p * n * n)
        return n
    if name in ("one-peer", "matcha"):
        graph, graph_options = options.get("graph", "exponential"), options.get("graph_options") or {}
        ok = isinstance(graph, str) and graph in BASE_GRAPHS and isinstance(graph_options, dict)
        return edge_count(graph, n, graph_options) if ok else n
    if name in ("base-graph", "simple-base-graph"):  # tau <= 2 log_(k+1) n + 2 steps of <= (k + 1) n entries
        k = options.get("k", 1)
        k = k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else 1
        return (2 * log + 2) * (min(k, n) + 1) * n
    if name in ("d-equistatic", "u-equistatic"):
        try:
            M = equitopo.samples(n, name, options.get("M"), options.get("epsilon"), options.get("delta"))
        except TopologyError:
            return n
        return (2 if name == "u-equistatic" else 1) * (M + 1) * n
    if name in ("od-equidyn", "ou-equidyn"):
        return 2 * n
    if name == "hierarchical":
        groups = options.get("groups")
        if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= n:
            return n
        inner, outer = _level_edges(options, "inner", n // groups), _level_edges(options, "outer", groups)
        return (outer + groups) * (inner + n // groups)
    # full: W = a I + (1 - a) J is described by a alone; a one-sided scheme weighs K_n's n(n - 1) edges
    return n if KIND.get(scheme, "doubly") == "doubly" else n * n


def _level_edges(options: dict, level: str, size: int) -> int:
    """The edges of one level of a hierarchical topology (`full` inside a group is its dense s x s block)."""
    name = options.get(level, "full" if level == "inner" else "ring")
    level_options = options.get(f"{level}_options") or {}
    if not isinstance(name, str) or name not in STATIC or not isinstance(level_options, dict):
        return size
    return size * size if name == "full" else edge_count(name, size, level_options)


def check_size(name: str, n: int, options: dict, scheme: str = "metropolis") -> None:
    """Refuse a topology whose construction would need more memory than this machine has free.

    The need is estimated before anything is allocated: `limits.EDGE_BYTES` per edge of `edge_count` plus
    `limits.NODE_BYTES` per client.

    Raises:
        TopologyError: the estimate exceeds `limits.available_memory()`.
    """
    edges = edge_count(name, n, options, scheme)
    need = limits.EDGE_BYTES * edges + limits.NODE_BYTES * n
    free = limits.available_memory()
    if need > free:
        raise TopologyError(f"{name} on n = {n:,} clients needs ~{limits.gib(need)} of memory to build ({edges:,} "
                            f"edges), more than the {limits.gib(free)} available; use fewer clients")


def check(name: str, n: int | None, weights: str | None = None, **options) -> tuple[dict, str | None, object]:
    """Every check of `build` that needs no construction, in microseconds.

    Checked: the name, the options and their values (grid shape, exponential symmetric and exponent_base, star
    centre, hypercube n, random-regular degree, erdos-renyi p, random-k and random-pull k, seeds, one-peer's base
    graph, hierarchical groups and levels), the weights scheme, n, and the memory building it would take. What
    needs the graph itself (uniform weights on an irregular graph, a random graph's connectivity, sample counts, a
    custom graph, file or matrix) is checked by `build`.

    Args:
        name: the topology, one of NAMES.
        n: the number of clients (None only for `custom`, which takes it from its source).
        weights: the weight scheme, one of `topologies.weights.SCHEMES`, or None for `default_weights(name)`.
        **options: the topology's own options, and base (the scheme under 'lazy') and sizes (sample counts).

    Returns:
        (the options without base and sizes, base, sizes).

    Raises:
        TopologyError: the first check that fails, naming the option and what is allowed.
    """
    if not isinstance(name, str) or name not in NAMES:
        raise TopologyError(f"unknown topology {name!r}; allowed: {', '.join(NAMES)}")
    options, base, sizes = _split_options(name, dict(options))
    if weights is not None and weights not in SCHEMES:
        raise TopologyError(f"weights must be one of {', '.join(SCHEMES)}; got {weights!r}")
    if name == "custom":
        _check_sources(options)
        return options, base, sizes
    n = graphs.check_n(n)
    if name in OWN_WEIGHTS:
        given = [f"{key}={value!r}" for key, value in (("weights", weights), ("base", base), ("sizes", sizes))
                 if value is not None]
        if given:
            raise TopologyError(f"{name} defines its own weights (its paper's W): leave weights unset, got "
                                f"{', '.join(given)}")
        _check_options(name, n, weights, base, options)
        check_size(name, n, options)
        return options, base, sizes
    scheme = weights or default_weights(name)
    check_scheme(scheme, base)
    label = _scheme_label(scheme, base)
    if name == "random-k" and (scheme not in RANDOM_K_SCHEMES or base not in (None, "metropolis", "max-degree")):
        raise TopologyError(f"random-k supports weights {', '.join(RANDOM_K_SCHEMES)} (lazy with base "
                            f"metropolis or max-degree); got weights={label!r}")
    if name == "random-pull" and scheme not in RANDOM_PULL_SCHEMES:
        raise TopologyError(f"random-pull (each client averages k peers it pulls: in-degree k, uneven out-degrees) "
                            f"supports weights {', '.join(RANDOM_PULL_SCHEMES)}; got weights={label!r}")
    _check_options(name, n, weights, base, options)
    check_size(name, n, options, scheme)
    return options, base, sizes


def _check_options(name: str, n: int, weights: str | None, base: str | None, options: dict) -> None:
    """The values of the options of the built-in topology `name` on n clients, without building anything."""
    if "seed" in options:
        graphs._check_seed(options["seed"])
    if name == "grid":
        graphs._grid_shape_option(n, options.get("shape"), options.get("periodic", False))
    elif name == "exponential":
        graphs._check_symmetric(options.get("symmetric", False))
        graphs.check_exponent_base(options.get("exponent_base", 2))
    elif name == "star":
        graphs._check_centre(n, options.get("centre", 0))
    elif name == "hypercube":
        graphs.check_hypercube(n)
    elif name == "random-regular":
        graphs.check_degree(n, options.get("degree"))
    elif name == "erdos-renyi":
        graphs.check_probability(options.get("p"))
    elif name in ("random-k", "random-pull"):
        TIME_VARYING[name][0](n, **options)  # its constructor checks n, k and seed and allocates nothing
    elif name == "one-peer":
        _check_one_peer(n, **options)
    elif name in ("base-graph", "simple-base-graph"):
        base_graph.check_k(options.get("k", 1), n, name)
    elif name in ("d-equistatic", "u-equistatic"):
        graphs.check_n(n, minimum=2)
        equitopo.samples(n, name, options.get("M"), options.get("epsilon"), options.get("delta"))
    elif name in ("od-equidyn", "ou-equidyn"):
        graphs.check_n(n, minimum=2)
        equitopo.check_eta(options.get("eta", 0.5))
        if options.get("M") is not None:
            equitopo.check_samples(options["M"], name)
    elif name == "matcha":
        _check_matcha(n, **options)
    elif name == "hierarchical":
        _check_hierarchical(n, weights, base, options)


def _check_matcha(n: int, graph: object = "exponential", graph_options: object = None, budget: object = 0.5,
                  seed: object = 0) -> None:
    """matcha: its budget, its size (dense eigensolves) and its base graph (as one-peer's), before anything is built."""
    matcha_module.check_budget(budget)
    if n > limits.DENSE_SPECTRAL_LIMIT:
        raise TopologyError(f"matcha on n = {n:,} clients: its activation probabilities and alpha take dense "
                            f"eigensolves, refused above topologies.limits.DENSE_SPECTRAL_LIMIT = "
                            f"{limits.DENSE_SPECTRAL_LIMIT}")
    _check_one_peer(n, graph, graph_options, "matcha")


def _check_one_peer(n: int, graph: object = "exponential", graph_options: object = None,
                    name: str = "one-peer") -> None:
    """one-peer's (or matcha's) base graph, named with its options (checked as that topology), before it is built."""
    if isinstance(graph, nx.Graph):
        return  # its nodes are checked against n when it is read (`graphs.from_networkx`)
    graph_options = {} if graph_options is None else graph_options
    if not isinstance(graph_options, dict):
        raise TopologyError(f"graph_options must be a table of the base graph's options, got {graph_options!r}")
    if not isinstance(graph, str) or graph not in BASE_GRAPHS:
        raise TopologyError(f"{name} option graph must be a static topology ({', '.join(BASE_GRAPHS)}) or a "
                            f"networkx graph, got {graph!r}")
    unknown = sorted(set(graph_options) - set(STATIC[graph][1]))
    if unknown:
        raise TopologyError(f"unknown graph_options {', '.join(unknown)} for base graph {graph!r}; allowed: "
                            f"{', '.join(STATIC[graph][1]) or 'none'}")
    try:
        check(graph, n, **graph_options)
    except TopologyError as err:
        raise TopologyError(f"{name} base graph ({graph} on {n:,} clients): {err}") from None


def _hierarchical_levels(options: dict) -> dict[str, tuple[str, dict]]:
    """The two levels of a hierarchical topology: {"inner": (graph, its options), "outer": ...}.

    Defaults: full inside a group, a ring between groups. Each level must be a static topology with a table of
    options (else a TopologyError naming the option).
    """
    levels = {}
    for level, default in (("inner", "full"), ("outer", "ring")):
        name = options.get(level, default)
        if not isinstance(name, str) or name not in BASE_GRAPHS:
            raise TopologyError(f"hierarchical option {level} must be a static topology ({', '.join(BASE_GRAPHS)}), "
                                f"got {name!r}")
        level_options = options.get(f"{level}_options") or {}
        if not isinstance(level_options, dict):
            raise TopologyError(f"{level}_options must be a table of the {level} graph's options, got "
                                f"{level_options!r}")
        levels[level] = (name, dict(level_options))
    return levels


def _check_hierarchical(n: int, weights: str | None, base: str | None, options: dict) -> None:
    """hierarchical: groups divides n, and each level is a static topology whose options fit it on its size."""
    hierarchy = Hierarchical(n, options.get("groups"))
    sizes = {"inner": hierarchy.size, "outer": hierarchy.groups}
    for level, (name, level_options) in _hierarchical_levels(options).items():
        size = sizes[level]
        try:
            check(name, size, weights, **level_options, **({"base": base} if base is not None else {}))
        except TopologyError as err:
            raise TopologyError(f"hierarchical {level} graph ({name} on {size} clients): {err}") from None


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
    options, base, sizes = check(name, n, weights, **options)
    if name == "custom":
        return _build_custom(n, weights, base, sizes, options)
    n = graphs.check_n(n)  # checked by `check` already: here it narrows int | None to int
    if name in OWN_WEIGHTS:
        return _build_own(name, n, options)
    scheme = weights or default_weights(name)
    label = _scheme_label(scheme, base)
    kind = KIND.get(scheme, "doubly")
    if name == "hierarchical":
        return _build_hierarchical(n, weights, base, sizes, options)
    if name in TIME_VARYING:
        schedule = _one_peer(n, **options) if name == "one-peer" else TIME_VARYING[name][0](n, **options)

        def step_matrix(step: int) -> sp.csr_array:
            return sparse_weights(schedule.adjacency_at(step), schedule.directed, scheme, base, name, sizes)

        return Topology(name, schedule=schedule, step_matrix=step_matrix, weights=label,
                        symmetric=name == "random-k" and kind == "doubly", stochastic=kind)
    if name == "full" and kind == "doubly":
        # every scheme averages exactly on K_n: W = a I + (1 - a) J is described by a alone (n^2 entries would
        # not fit at 100,000 clients), and the n(n-1)/2-edge networkx graph is built only if someone asks
        if sizes is not None:
            raise TopologyError(f"option sizes (sample counts) applies to weights='sample-count' only, not to "
                                f"{scheme!r}")
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
    return OnePeer(_base_adjacency(n, graph, graph_options, "one-peer"))


def _build_own(name: str, n: int, options: dict) -> Topology:
    """A topology whose paper defines its W (`OWN_WEIGHTS`): EquiStatic's static W, or a schedule's W_t."""
    if name in STATIC:
        static = STATIC[name][0](n, **options)
        return Topology(name, W=static.matrix(), weights="given", symmetric=name == "u-equistatic")
    schedule = TIME_VARYING[name][0](n, **options)
    return Topology(name, schedule=schedule, step_matrix=schedule.step_matrix, weights="given",
                    symmetric=not schedule.directed, signed=name == "matcha")


def _build_hierarchical(n: int, weights: str | None, base: str | None, sizes: object, options: dict) -> Topology:
    parts = _hierarchical_levels(options)
    hierarchy = Hierarchical(n, options.get("groups"))
    per_client = weights == "sample-count"  # sample counts differ per client: no W_in common to every group

    def level(which: str, size: int) -> Topology:
        name, level_options = parts[which]
        lazy_base = {"base": base} if base is not None else {}
        try:  # sample-count: the level's graph (its support), weighed below on the whole hierarchy
            return build(name, size, "row-stochastic" if per_client else weights, **level_options, **lazy_base)
        except ValueError as err:
            raise TopologyError(f"hierarchical {which} graph ({name} on {size} clients): {err}") from None

    inner, outer = level("inner", hierarchy.size), level("outer", hierarchy.groups)
    if per_client:  # the scheme on the hierarchy's graph, the support of W_out ⊗ W_in, as on any other graph
        support = hierarchy.matrix(outer.sparse(0), inner.sparse(0))
        A = sp.csr_array((support != 0).astype(np.float64))
        A.setdiag(0.0)
        A.eliminate_zeros()
        return Topology("hierarchical", W=sparse_weights(A, False, "sample-count", None, "hierarchical", sizes),
                        weights="sample-count", symmetric=False, stochastic="row", groups=hierarchy.labels())
    if sizes is not None:  # sizes go with weights = sample-count only
        raise TopologyError(f"option sizes (sample counts) applies to weights='sample-count' only, not to "
                            f"{weights or 'metropolis'!r}")
    if inner.stochastic != outer.stochastic:  # one scheme weighs both, so this cannot happen; keep it explicit
        raise TopologyError("hierarchical: the inner and outer graphs must have the same kind of W")
    return Topology("hierarchical", W=hierarchy.matrix(outer.sparse(0), inner.sparse(0)),
                    weights=_scheme_label(weights or "metropolis", base),
                    symmetric=inner.symmetric and outer.symmetric, stochastic=inner.stochastic,
                    groups=hierarchy.labels())


def _build_custom(n: int | None, weights: str | None, base: str | None, sizes: object,
                  options: dict) -> Topology:
    given = [key for key in (*CUSTOM_SOURCES, EDGES_ALIAS) if options.get(key) is not None]
    if len(given) != 1:
        raise TopologyError(f"custom needs exactly one of the options {', '.join(CUSTOM_SOURCES)}; "
                            f"got {', '.join(given) or 'none'} ({EDGES_ALIAS}= is another name for path=)")
    source = given[0]
    symmetric = options.get("symmetric")
    if symmetric is not None and (source != "matrix" or not isinstance(symmetric, bool)):
        raise TopologyError("custom option symmetric= is True or False, and applies to matrix= only "
                            "(a graph's weights are symmetric when the graph is undirected)")
    stochastic = options.get("stochastic")
    if stochastic is not None and source != "matrix":
        raise TopologyError("custom option stochastic= applies to matrix= only (a graph's W is as stochastic as its "
                            "weights scheme makes it: row-stochastic, column-stochastic, or doubly for the others)")
    directed = options.get("directed")
    if directed is not None and source not in ("path", EDGES_ALIAS):
        raise TopologyError("custom option directed= applies to an edge-list file (path= or edges=); a networkx graph "
                            "is directed when it is a DiGraph")
    if source == "matrix":
        schemes = {key: value for key, value in (("weights", weights), ("base", base)) if value is not None}
        if schemes:
            raise TopologyError(f"custom with matrix= uses the matrix as W: leave {' and '.join(schemes)} unset, got "
                                + ", ".join(f"{key}={value!r}" for key, value in schemes.items()))
        if sizes is not None:
            raise TopologyError("custom with matrix= uses the matrix as W: option sizes does not apply")
        return _custom_matrix(n, options["matrix"], bool(symmetric),
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


def _custom_matrix(n: int | None, given: object, symmetric: bool, stochastic: str = "doubly") -> Topology:
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
    if label == "matrix":
        return Topology("custom", W=W, weights="given", symmetric=symmetric, stochastic=stochastic)
    # the checks the Topology repeats (O(nnz)), here so the message names the file
    W = check_stochastic(W, symmetric, label, stochastic)
    check_connected(W, label)
    try:
        return Topology("custom", W=W, weights="given", symmetric=symmetric, stochastic=stochastic)
    except ValueError as err:  # the contraction check (an eigen-solve: not repeated here): name the file too
        raise TopologyError(f"{label}: {err}") from None

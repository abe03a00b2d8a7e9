"""`dfl topology`: spectral analysis of communication topologies, as a table, JSON, or a plot; or a drawing.

Dfl topology ring --clients 64 --gossip-steps 4
dfl topology show custom --matrix W.npy          # your own W (.npy, .csv, .mtx), or --edges graph.edgelist
dfl topology compare --clients 16 32 64 --topologies ring grid exponential full --plot gap.png
dfl topology show two-cliques --clients 16 --options bridges=2   # a registered topology (dfl.graphs)
dfl topology draw one-peer --clients 8 --out one-peer.png        # the graph itself, one panel per step
dfl topology draw ring --clients 8                               # ... into a new runs/topology-ring-<time>.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from dfl import graphs as topology_registry
from dfl.cli.lists import add_list
from dfl.cli.run import key_value
from dfl.errors import ConfigError
from dfl.graphs import TOPOLOGIES, topology_options
from dfl.registry import suggest
from topologies import draw as drawing
from topologies import spectral
from topologies.weights import LAZY_BASES, SCHEMES

DEFAULT_COMPARE = ("ring", "grid", "exponential", "full")
# CLI flag -> build() option; a row gets only the options its topology accepts in `compare` mode
OPTION_FLAGS = ("degree", "p", "k", "seed", "shape", "periodic", "symmetric", "path", "edges", "matrix",
                "exponent_base", "centre", "groups", "inner", "outer", "graph", "directed", "stochastic", "M",
                "epsilon", "delta", "eta", "budget")
COLUMNS = (
    ("topology", "topology"), ("n", "n"), ("weights", "weights"), ("degree", "degree min/mean/max"),
    ("lambda", "lambda"), ("spectral_gap", "gap"), ("gossip_lambda", "lambda^Q"), ("stochastic", "W"),
    ("sigma2", "sigma_2"), ("pi_spread", "n*pi min/max"), ("phi", "Phi"), ("effective_neighbors", "n_eff"),
    ("consensus_steps", "steps"), ("exact_steps", "exact"), ("step_norm", "|W_t-J| max"),
    ("period_norm", "|period-J|"), ("peers", "peers max/mean"), ("bytes_per_round", "bytes/round"),
    ("random_start_steps", "steps(x0)"),
)
COMMANDS = ("compare", "show", "draw")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `topology` subcommand to the `dfl` parser."""
    p = subparsers.add_parser(
        "topology", help="spectral analysis of communication topologies",
        description="Print lambda = ||W - J||_2, the spectral gap, lambda of Q gossip steps, the DFedSAM-MGS "
                    "Phi term, the effective number of neighbours and the consensus steps of a topology, or "
                    "of several with 'compare'; for a row- or column-stochastic W (directed graphs) lambda is "
                    "|lambda_2(W)|, lambda^Q the consensus error of Q steps, and sigma_2 and the spread of n*pi "
                    "(pi: the Perron vector) say how far W is from doubly stochastic. For time-varying topologies "
                    "read the steps to exact consensus, ||W_t - J||_2 per step and over a period, the peers per "
                    "step, the bytes per round and the steps from a random start (topologies.measures). "
                    "'draw NAME --out FILE' draws "
                    "the graph instead. Undefined values print as '-' (JSON null); infinite ones as inf (JSON "
                    "\"inf\").")
    names = tuple(TOPOLOGIES)  # the built-ins, then registered ones (dfl.graphs)

    def canonical(text: str) -> str:  # "Ring", "random_regular": the registered spelling
        close = suggest(text, (*names, *COMMANDS))
        return close if close is not None and close.lower() == text.strip().lower().replace("_", "-") else text

    p.add_argument("topology", choices=(*names, *COMMANDS), metavar="TOPOLOGY", type=canonical,
                   help=f"one of {', '.join(names)}, or 'compare' (with --topologies); 'show NAME' is the "
                        "same as NAME; 'draw NAME --out FILE' draws it")
    p.add_argument("name", nargs="?", choices=names, metavar="NAME", type=canonical,
                   help="the topology after 'show' or 'draw'")
    add_list(p, "--clients", item=int, what="integers", metavar="N", help="number(s) of clients n")
    _analysis_flags(p)
    _option_flags(p)
    _output_flags(p)
    p.set_defaults(handler=run)
    return p


def _analysis_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the analysis itself: which topologies, the weights, Q, and the spectral quantities' knobs."""
    add_list(p, "--topologies", metavar="NAME", help=f"topologies for 'compare' (default: {' '.join(DEFAULT_COMPARE)})")
    p.add_argument("--weights", choices=SCHEMES, help="weight scheme (default metropolis)")
    p.add_argument("--base", choices=LAZY_BASES, help="scheme under --weights lazy (default metropolis)")
    p.add_argument("--gossip-steps", "-Q", type=int, default=1, metavar="Q",
                   help="gossip steps Q (default 1)")
    p.add_argument("--gamma", type=float, default=0.951,
                   help="decay for effective neighbours (default 0.951)")
    p.add_argument("--eps", type=float, default=0.1, help="consensus error target for steps (default 0.1)")
    p.add_argument("--start-eps", dest="start_eps", type=float, default=1e-3,
                   help="consensus error target for steps(x0), the steps from a random start (default 1e-3)")
    p.add_argument("--params", type=int, default=1_000_000, metavar="P",
                   help="model parameters (float32) for bytes/round, all clients' sends in a round (default 1000000)")



def _option_flags(p: argparse.ArgumentParser) -> None:
    """The built-in topologies' options, one flag each (`OPTION_FLAGS`), and --options for any topology's."""
    p.add_argument("--seed", type=int,
                   help="seed of random-regular, erdos-renyi, random-k, EquiTopo, matcha (default 0)")
    p.add_argument("--degree", type=int, help="random-regular degree")
    p.add_argument("--p", type=float, help="erdos-renyi edge probability")
    p.add_argument("--k", type=int,
                   help="random-k, random-pull: peers per node and step; base-graph: max peers per step")
    p.add_argument("--M", type=int, help="EquiTopo: the basis matrices drawn (equistatic degree)")
    p.add_argument("--epsilon", type=float, help="d-/u-equistatic: the bound on ||W - J||_2 (with --delta: M)")
    p.add_argument("--delta", type=float, help="d-/u-equistatic: the probability the bound fails (the paper's p)")
    p.add_argument("--eta", type=float, help="od-/ou-equidyn: the weight of the exchanged model (default 0.5)")
    p.add_argument("--budget", type=float,
                   help="matcha: expected fraction of the matchings used per step (default 0.5)")
    p.add_argument("--shape", type=int, nargs=2, metavar=("ROWS", "COLS"), help="grid shape")
    p.add_argument("--periodic", action="store_true", default=None, help="grid: wrap around (torus)")
    p.add_argument("--symmetric", action="store_true", default=None,
                   help="exponential: undirected variant; custom --matrix: require W = W^T")
    p.add_argument("--exponent-base", dest="exponent_base", type=int, metavar="B",
                   help="exponential: hops B^k (default 2; BlueFog's symmetric variant uses 4)")
    p.add_argument("--centre", type=int, metavar="I", help="star: the centre client (default 0)")
    p.add_argument("--groups", type=int, metavar="G", help="hierarchical: number of groups (divides --clients)")
    p.add_argument("--inner", metavar="NAME", help="hierarchical: the graph inside each group (default full)")
    p.add_argument("--outer", metavar="NAME", help="hierarchical: the graph between groups (default ring)")
    p.add_argument("--graph", metavar="NAME", help="one-peer, matcha: the base graph (default exponential)")
    p.add_argument("--directed", action="store_true", default=None,
                   help="custom --edges/--path: read each line 'u v' as u -> v")
    p.add_argument("--stochastic", choices=("doubly", "row", "column"),
                   help="custom --matrix: which sums of W must be 1 (default doubly)")
    p.add_argument("--path", help="custom: edge-list file, one 'u v' per line")
    p.add_argument("--edges", metavar="FILE", help="custom: edge-list file (networkx format), same as --path")
    p.add_argument("--matrix", metavar="FILE",
                   help="custom: the gossip matrix W itself, a .npy, .csv or .mtx (Matrix Market) file")
    p.add_argument("--options", nargs="+", metavar="KEY=VALUE", type=key_value, default=[],
                   help="topology options as key=value (Python literals), e.g. those of a registered topology; "
                        "the flags above are the built-ins' options")



def _output_flags(p: argparse.ArgumentParser) -> None:
    """What is printed or drawn: a table, JSON, the gap plot, or (draw) the graph's figure."""
    p.add_argument("--json", action="store_true", help="print JSON (a list of rows) instead of a table")
    p.add_argument("--plot", metavar="FILE.png", help="draw the spectral gap against n per topology")
    p.add_argument("--out", metavar="FILE", help=f"draw: the figure file ({', '.join(drawing.FORMATS)}; default: a "
                   "new runs/topology-<name>-<YYYYmmdd-HHMMSS>.png)")
    p.add_argument("--steps", type=int, metavar="S",
                   help=f"draw: panels of a time-varying topology (default one period, at most {drawing.STEP_LIMIT})")
    p.add_argument("--layout", choices=drawing.LAYOUTS, default="auto", help="draw: node placement (default auto)")


def _options(args: argparse.Namespace, name: str, compare: bool) -> dict:
    given = {flag: getattr(args, flag) for flag in OPTION_FLAGS if getattr(args, flag) is not None}
    for key, value in args.options:
        if key in given:
            raise ConfigError(f"option {key} is given twice (--{key.replace('_', '-')} and --options {key}=...)")
        given[key] = value
    if args.base is not None:
        given["base"] = args.base
    if compare:  # one flag set serves several topologies: each takes what it understands
        given = {k: v for k, v in given.items() if k in topology_options(name) or k == "base"}
    if "shape" in given:
        given["shape"] = tuple(given["shape"])
    return given


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list) and len(value) == 2:
        lo, hi = value
        return f"{lo:.3g}/{hi:.3g}"
    if isinstance(value, list):
        lo, mean, hi = value
        return f"{lo}/{mean:.3g}/{hi}"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """Aligned text table, one row per (topology, n)."""
    header = [title for _, title in COLUMNS]
    body = [[_cell(row[key]) for key, _ in COLUMNS] for row in rows]
    widths = [max(len(r[c]) for r in [header, *body]) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if c >= 3 else cell.ljust(w) for c, (cell, w) in
                       enumerate(zip(r, widths))).rstrip() for r in [header, *body]]
    first = rows[0]
    note = (f"Q = {first['Q']} gossip step(s); n_eff at gamma = {first['gamma']}; steps to shrink "
            f"disagreement by eps = {first['eps']}; exact: steps to exact consensus; |W_t-J| max over one period's "
            f"steps, |period-J| of their product; bytes/round: all clients, a {first['params']:,}-parameter fp32 "
            f"model; steps(x0): from a random start to error {first['start_eps']}")
    return "\n".join([note, *lines])


def _jsonable(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _check_args(args: argparse.Namespace) -> None:
    args.draw = args.topology == "draw"
    if args.topology in ("show", "draw"):
        if args.name is None:
            raise ConfigError(f"'dfl topology {args.topology}' needs a topology name: one of {', '.join(TOPOLOGIES)}")
        args.topology, args.name = args.name, None
    elif args.name is not None:
        raise ConfigError(f"unexpected argument {args.name!r} after {args.topology!r} (did you mean "
                          f"'dfl topology show {args.name}'?)")
    spectral.check_steps(args.gossip_steps)
    spectral.check_gamma(args.gamma)
    spectral.check_eps(args.eps)
    spectral.check_eps(args.start_eps)
    if args.params < 1:
        raise ConfigError(f"--params must be an integer >= 1 (model parameters), got {args.params}")
    if args.topology == "compare":
        names = args.topologies or list(DEFAULT_COMPARE)
        bad = [t for t in names if t not in TOPOLOGIES or t == "custom"]
        if bad:
            allowed = ", ".join(t for t in TOPOLOGIES if t != "custom")
            raise ConfigError(f"--topologies: unknown {', '.join(bad)}; allowed: {allowed}")
    elif args.topologies:
        raise ConfigError("--topologies only applies to 'dfl topology compare'")
    from_file = args.path or args.edges or args.matrix
    if args.clients is None and not (args.topology == "custom" and from_file):
        raise ConfigError("--clients is required (one or more numbers of clients)")
    if args.clients is not None and any(n < 1 for n in args.clients):
        raise ConfigError(f"--clients must be integers >= 1, got {' '.join(map(str, args.clients))}")
    drawing_flags = [f"--{flag}" for flag in ("out", "steps") if getattr(args, flag) is not None]
    if args.layout != "auto":
        drawing_flags.append("--layout")
    if args.draw:
        if args.clients is not None and len(args.clients) > 1:
            raise ConfigError("'dfl topology draw' draws one topology: give one --clients N")
        if args.plot or args.json:
            raise ConfigError("'dfl topology draw' makes a figure of the graph; --plot and --json belong to the "
                             "analysis (dfl topology NAME)")
    elif drawing_flags:
        raise ConfigError(f"{', '.join(drawing_flags)} only apply to 'dfl topology draw NAME'")
    for option, path in (("--plot", args.plot), ("--out", args.out if args.draw else None)):
        if path:  # a file dfl did not write is never replaced (dfl.directories), checked before any work
            from dfl.directories import check_output_plot

            check_output_plot(path, option)


def _draw(topo, args: argparse.Namespace) -> Path:
    """Draw into --out, or into a new runs/topology-<name>-<time>.png (reserved empty first, removed on failure)."""
    from dfl.directories import RUNS, figure_metadata, reserve_new_file

    out = Path(args.out) if args.out is not None else reserve_new_file(f"topology-{args.topology}", ".png", RUNS)
    try:
        return drawing.draw(topo, out, steps=args.steps, layout=args.layout,
                            metadata=figure_metadata(out.suffix.lower().lstrip(".")))
    except BaseException:
        if args.out is None and out.is_file() and out.stat().st_size == 0:
            out.unlink()
        raise


def run(args: argparse.Namespace) -> int:
    """Handler of `dfl topology`: 0 on success, 2 with a message on stderr for bad input."""
    try:
        _check_args(args)
        if args.draw:
            n = args.clients[0] if args.clients else None
            topo = topology_registry.analyse(args.topology, n, args.weights, **_options(args, args.topology, False))
            print(f"wrote {_draw(topo, args)}")
            return 0
        compare = args.topology == "compare"
        names = (args.topologies or list(DEFAULT_COMPARE)) if compare else [args.topology]
        rows = []
        for name in names:
            for n in args.clients or [None]:
                try:
                    rows.append(topology_registry.spectral_summary(
                        name, n, args.weights, gossip_steps=args.gossip_steps, gamma=args.gamma, eps=args.eps,
                        start_eps=args.start_eps, params=args.params, **_options(args, name, compare)))
                except ValueError as err:
                    if not compare:
                        raise
                    # compare goes on without a topology that does not exist at this n (e.g. grid on 17 clients)
                    print(f"dfl topology compare: skipped {name} on {n} clients: {err}", file=sys.stderr)
        if args.plot:
            from dfl.report import plots  # matplotlib only when a plot is asked for

            plots.gap_vs_clients(rows, args.plot)
    except (ValueError, OSError) as err:
        print(f"dfl topology: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{k: _jsonable(v) for k, v in row.items()} for row in rows], indent=1))
    else:
        print(format_table(rows))
    return 0

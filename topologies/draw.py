"""A figure of a topology: its clients and its links weighted by W (networkx + matplotlib).

Arrows are drawn where W is not symmetric, one panel per gossip step of a time-varying schedule, and the groups of
a hierarchical topology each on a circle of their own.

    topologies.draw.draw(topologies.build("one-peer", 8), "one-peer.png", steps=3)

Edge j -> i is drawn when W[i, j] > 0 (i receives from j, the row = receiver convention), its width proportional to
W[i, j]; a symmetric W is drawn with plain lines (one per pair), anything else with arrows. Each client's
self-weight W[i, i] sets the size of its node. Up to LABEL_LIMIT clients the weights are written on the links.
matplotlib is imported only here, and with its non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import scipy.sparse as sp

from topologies import spectral
from topologies.errors import TopologyError
from topologies.topology import Topology

FORMATS = (".png", ".svg", ".pdf")
DRAW_LIMIT = 256  # more clients than this make an unreadable figure
STEP_LIMIT = 16  # panels at most (a period longer than this is cut, and the title says so)
LABEL_LIMIT = 12  # clients up to which each link's weight is printed
LAYOUTS = ("auto", "circular", "spring", "kamada-kawai", "shell")
GROUP_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
                 "#ccb974", "#64b5cd")


def _check_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise TopologyError(f"figure file {str(path)!r}: unsupported extension {path.suffix or '(none)'!r}; use one of "
                            f"{', '.join(FORMATS)}")
    return path


def _steps(topology: Topology, steps: int | None) -> tuple[int, str]:
    """How many panels, and a note when a time-varying schedule is cut short."""
    if not topology.is_time_varying:
        return 1, ""
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= STEP_LIMIT:
            raise TopologyError(f"steps must be an integer in 1..{STEP_LIMIT}, got {steps!r}")
        return int(steps), ""
    period = topology.period
    if period is None:
        return 4, " (first 4 steps; it never repeats)"
    if period > STEP_LIMIT:
        return STEP_LIMIT, f" (first {STEP_LIMIT} of its {period} steps)"
    return period, ""


def _positions(n: int, layout: str, groups: np.ndarray | None, graph: nx.Graph, name: str) -> dict:
    if layout == "auto":
        layout = "grouped" if groups is not None else "grid" if name == "grid" else "circular"
    if layout == "grouped":  # each group on its own small circle, the groups on a large one
        labels = np.asarray(groups)
        count = int(labels.max()) + 1
        pos = {}
        for g in range(count):
            members = np.flatnonzero(labels == g)
            cx, cy = math.cos(2 * math.pi * g / count), math.sin(2 * math.pi * g / count)
            r = 0.8 * math.sin(math.pi / max(count, 2)) if count > 1 else 0.8
            for a, i in enumerate(members):
                t = 2 * math.pi * a / len(members)
                pos[int(i)] = (3 * cx + r * math.cos(t), 3 * cy + r * math.sin(t))
        return pos
    if layout == "grid":
        cols = math.ceil(math.sqrt(n))
        for c in range(int(math.isqrt(n)), 0, -1):
            if n % c == 0:
                cols = n // c
                break
        return {i: (i % cols, -(i // cols)) for i in range(n)}
    if layout == "circular":
        return nx.circular_layout(graph)
    if layout == "spring":
        return nx.spring_layout(graph, seed=0)
    if layout == "kamada-kawai":
        return nx.kamada_kawai_layout(graph)
    return nx.shell_layout(graph)


def _panel(ax: Any, W: sp.csr_array, pos: dict, groups: np.ndarray | None, title: str) -> None:
    n = W.shape[0]
    symmetric = spectral.is_symmetric(W)
    coo = sp.coo_array(W)
    off = coo.row != coo.col
    G = nx.Graph() if symmetric else nx.DiGraph()
    G.add_nodes_from(range(n))
    for i, j, w in zip(coo.row[off].tolist(), coo.col[off].tolist(), coo.data[off].tolist()):
        if symmetric and j > i:
            continue
        G.add_edge(j, i, weight=w)  # j -> i: i receives from j
    widths = [0.5 + 4.0 * d["weight"] for _, _, d in G.edges(data=True)]
    diag = W.diagonal()
    colours = [GROUP_COLOURS[int(groups[i]) % len(GROUP_COLOURS)] for i in range(n)] if groups is not None \
        else GROUP_COLOURS[0]
    size = 300 if n <= 32 else 120 if n <= 100 else 40
    # a negative self-weight (MATCHA's I - alpha L_t) draws as the smallest node
    nx.draw_networkx_nodes(G, pos, ax=ax, node_size=[size * (0.4 + max(d, 0.0)) for d in diag], node_color=colours)
    edge_options = dict(arrows=True, arrowstyle="-|>", arrowsize=10, connectionstyle="arc3,rad=0.12",
                        node_size=size) if not symmetric else {}
    nx.draw_networkx_edges(G, pos, ax=ax, width=widths, edge_color="#555555", alpha=0.7, **edge_options)
    if n <= 32:
        nx.draw_networkx_labels(G, pos, ax=ax, font_size=8, font_color="white")
    if n <= LABEL_LIMIT:
        labels = {(u, v): f"{d['weight']:.2g}" for u, v, d in G.edges(data=True)}
        nx.draw_networkx_edge_labels(G, pos, edge_labels=labels, ax=ax, font_size=6, label_pos=0.3,
                                     rotate=False, connectionstyle=edge_options.get("connectionstyle", "arc3"))
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()


def draw(topology: Topology, path: str | Path, *, steps: int | None = None, layout: str = "auto",
         title: str | None = None, metadata: dict[str, str] | None = None) -> Path:
    """Draw `topology` into `path` and return the path.

    Args:
        topology: a `topologies.Topology` (static, time-varying or hierarchical), at most DRAW_LIMIT clients.
        path: the figure file; its extension (.png, .svg or .pdf) picks the format; folders are created.
        steps: panels of a time-varying schedule (default None: one period, at most STEP_LIMIT; 4 steps of a
            schedule that never repeats); a static topology is one panel.
        layout: "auto" (default: circular; a grid as a grid; the groups of a hierarchical topology on circles of
            their own), "circular", "spring", "kamada-kawai" or "shell".
        title: the figure's title (default: name, n, weights and, for a one-sided W, its kind).
        metadata: matplotlib's `savefig(metadata=...)` (e.g. {"Software": ...} for a PNG, {"Creator": ...} for an
            SVG or PDF: dfl marks its figures so).

    Returns:
        The path written.

    Raises:
        ValueError: an unsupported extension or layout, more than DRAW_LIMIT clients, steps outside 1..STEP_LIMIT.
    """
    path = _check_path(path)
    if layout not in LAYOUTS:
        raise TopologyError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if topology.n > DRAW_LIMIT:
        raise TopologyError(f"{topology.name} has n = {topology.n} clients; a drawing is readable up to {DRAW_LIMIT}")
    count, note = _steps(topology, steps)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = _figure(plt, topology, count, layout)
    fig.suptitle(title or default_title(topology, note), fontsize=10)
    fig.tight_layout()
    try:
        _save(fig, path, metadata)
    finally:
        plt.close(fig)
    return path


def default_title(topology: Topology, note: str = "") -> str:
    """Name, n, weights and, for a one-sided W whose scheme does not already say it (sample-count), its kind."""
    kind = f"{topology.stochastic}-stochastic"
    said = topology.stochastic == "doubly" or topology.weights == kind
    return f"{topology.name}, n = {topology.n}, weights {topology.weights}{'' if said else f', {kind}'}{note}"


def _figure(plt: Any, topology: Topology, count: int, layout: str) -> Any:
    """A figure of `count` panels, at most 4 a row, one per gossip step from step 0 (unused cells blanked)."""
    groups = getattr(topology, "groups", None)
    pos = _positions(topology.n, layout, groups, topology.graph_at(0), topology.name)
    cols = min(count, 4)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.4 * rows + 0.4), squeeze=False)
    for step in range(count):
        label = f"step {step}" if topology.is_time_varying else ""
        _panel(axes[step // cols][step % cols], topology.sparse(step), pos, groups, label)
    for k in range(count, rows * cols):
        axes[k // cols][k % cols].set_axis_off()
    return fig


def _save(fig: Any, path: Path, metadata: dict[str, str] | None) -> None:
    """Write `fig` to `path` in the format its extension names, at 150 dpi, creating its folder.

    Atomically (a temporary file next to it, then a rename): an existing figure is replaced whole or not at all.
    By hand rather than dfl.files' writer: this package imports nothing of dfl.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format=path.suffix.lower().lstrip("."), dpi=150, metadata=metadata)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

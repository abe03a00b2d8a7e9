"""Finite-time topologies against the exponential graphs at equal communication (docs/how-to/topology-study.md).

Question. The Base-(k+1) paper (Takezawa et al., NeurIPS 2023) reports that its graphs, which reach exact consensus
after a few steps for every number of clients n, give decentralized learning higher accuracy than the exponential and
one-peer exponential graphs at the same or less communication. Does that hold in dfl for D-PSGD and DFedSAM on
heterogeneous data, for n = 16 and 32 (powers of 2, where the one-peer exponential graph is also exact) and n = 24
(where it is not)? And where do EquiTopo (OD-EquiDyn) and MATCHA fall?

Regime, fixed before the runs: MNIST-1D (dfl's default, 4000 samples), Dirichlet α = 0.1 (strongly heterogeneous),
dfl's default model (`cnn1d`) and learning rate, 30 rounds, evaluated every 5 rounds; n = 16, 24, 32; seeds 0, 1, 2
(a seed fixes the split, the initialisation and every random topology's draws, so cells are paired by seed).
Topologies, each with about one model sent per client per gossip step except where said:
  base-1   base-graph, k = 1 (one peer per step);
  base-2   base-graph, k = 2 (at most two peers per step);
  one-peer one-peer-exponential (one peer per step);
  exp      exponential (static, directed; ceil(log2 n) = 4, 5, 5 peers per step);
  equidyn  od-equidyn, η = 0.5, all offsets (one peer per step);
  matcha   matcha on the exponential graph's links, budget 1 / (their mean degree): one expected peer per step.
Algorithms:
  D-PSGD (`dpsgd`): one gossip step per SGD step, a round being dfl's default local work (one epoch: as many steps
    as the largest client's batches), so the communication per round is the topology's peers per step times those
    steps: equal for base-1, one-peer, equidyn and matcha; base-2 sends at most twice and exp four to five times as
    much.
  DFedSAM (`dfedsam-mgs`, the multi-gossip DFedSAM, ρ and the local epoch at dfl's defaults) with Q gossip steps per
    round chosen so that every topology sends about four models per client per round: Q = 4 for base-1, one-peer,
    equidyn and matcha, Q = 2 for base-2, Q = 1 for exp (4-5 models).
The bytes actually sent are recorded (`bytes_sent_total`) and the figure plots against them.
6 topologies × 2 algorithms × 3 sizes × 3 seeds = 108 runs. Nothing was tuned. A run took 6-11 s at n = 32
(20 rounds, on the shared 2-core CPU), so the study takes about 20 minutes. Before the expectations below were
written, two timing runs (base-graph, n = 32, 20 rounds, seed 0) had been seen: 38.6% (DFedSAM, Q = 4) and 31.8%
(D-PSGD); they are not part of the results.

Pre-registered expectations (written and committed before the study ran; each is marked holds / fails / inconclusive):
  E1 (the paper's claim, not a power of 2) at n = 24, base-1 beats one-peer in final test accuracy, for D-PSGD and for
     DFedSAM (equal communication);
  E2 (the mechanism) at n = 24, base-1 ends with a smaller consensus distance than one-peer, for both algorithms;
  E3 (powers of 2: both exact) at n = 16 and 32, base-1 and one-peer are within 2 points of each other, for both
     algorithms;
  E4 (the paper's claim against the exponential graph) base-2 beats exp in final test accuracy at n = 24 and 32, for
     both algorithms (for D-PSGD base-2 sends at most half as much);
  E5 (EquiTopo and MATCHA) base-1 beats equidyn and matcha in final test accuracy at n = 24 and 32, for DFedSAM
     (equal communication).

Statistics. A comparison "A beats B" takes the per-seed differences d = A − B (paired by seed) and their 95% Student-t
interval (t = 4.30 for 3 seeds); holds: the interval lies above 0 (below 0 for "smaller"); fails: it lies entirely on
the other side; inconclusive otherwise. "Within 2 points" is two comparisons, d > −0.02 and d < +0.02. An expectation
made of several comparisons holds if all hold, fails if any fails, and is inconclusive otherwise (the rule and code
of benchmarks/heterogeneity_study.py). A diverged run is listed and never averaged in; its seed drops out of a
comparison.

    /work/bin/bench-lock python benchmarks/topology_study.py --out runs/topology \
        --results benchmarks/results/topology-2026-11-28 --figure docs/figures/topology_study.png
    python benchmarks/topology_study.py --quick --out /tmp/quick   # tiny, for CI: no accuracy meaning
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.heterogeneity_study import Comparison, paired  # noqa: E402 (after the path)
from benchmarks.study_runs import Study, run_or_read, study_main  # noqa: E402

SIZES = (16, 24, 32)
SEEDS = (0, 1, 2)
ALGORITHMS = ("dpsgd", "dfedsam-mgs")
LABELS = {"dpsgd": "D-PSGD", "dfedsam-mgs": "DFedSAM (Q gossip steps)"}
TOPOLOGIES = ("base-1", "base-2", "one-peer", "exp", "equidyn", "matcha")
ROUNDS, EVERY = 30, 5
METRICS = ("test_acc", "client_acc_mean", "consensus_distance", "bytes_sent_total")


def matcha_budget(n: int) -> float:
    """1 / the mean degree of the exponential graph's undirected links: one expected peer per step."""
    from topologies import graphs

    A, _ = graphs.exponential_adjacency(n, symmetric=True)
    return 1.0 / (A.nnz / n)


def topology(name: str, n: int) -> tuple[dict, int]:
    """(the Config fields of a topology, DFedSAM's gossip steps Q for about four models per client per round)."""
    return {
        "base-1": ({"topology": "base-graph", "topology_options": {"k": 1}}, 4),
        "base-2": ({"topology": "base-graph", "topology_options": {"k": 2}}, 2),
        "one-peer": ({"topology": "one-peer-exponential"}, 4),
        "exp": ({"topology": "exponential"}, 1),
        "equidyn": ({"topology": "od-equidyn", "topology_options": {"eta": 0.5}}, 4),
        "matcha": ({"topology": "matcha", "topology_options": {"graph": "exponential", "budget": matcha_budget(n)}},
                   4),
    }[name]


def grid(quick: bool):
    """(algorithm, topology, n, seed, config) of every run."""
    import dfl

    sizes, seeds, names = ((8,), (0,), ("base-1", "one-peer", "matcha")) if quick else (SIZES, SEEDS, TOPOLOGIES)
    for algorithm in ALGORITHMS:
        for name in names:
            for n in sizes:
                fields, Q = topology(name, n)
                for seed in seeds:
                    base = dict(clients=n, algorithm=algorithm, partition="dirichlet", alpha=0.1, seed=seed,
                                rounds=ROUNDS, eval_every=EVERY, progress=False, **fields)
                    if quick:
                        base.update(rounds=2, eval_every=1, model="mlp", model_options={"hidden": [8]},
                                    dataset_options={"num_samples": 600})
                    if algorithm == "dfedsam-mgs":
                        base["gossip_steps"] = Q
                    yield algorithm, name, n, seed, dfl.Config(**base)


def run_all(out: Path, quick: bool) -> list[dict]:
    """Run every cell into out/NAME (a finished run is read back, not rerun); one record per run with its curve."""
    records = []
    for algorithm, name, n, seed, config in grid(quick):
        run_dir = out / f"{algorithm}-{name}-n{n}-seed{seed}"
        summary = run_or_read(config, run_dir)
        curve = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        curve = [{k: r[k] for k in ("round", *METRICS) if k in r} for r in curve if "test_acc" in r]
        records.append({"algorithm": algorithm, "topology": name, "n": n, "seed": seed, "status": summary["status"],
                        "wall_seconds": summary.get("wall_seconds"), "gossip_steps": config.gossip_steps,
                        **{k: summary[k] for k in METRICS if k in summary}, "curve": curve})
    return records


def values(records: list[dict], metric: str, **match) -> dict[int, float]:
    """seed -> metric of the completed runs matching `match`."""
    return {r["seed"]: r[metric] for r in records if r["status"] == "completed" and metric in r
            and all(r[k] == v for k, v in match.items())}


def cell(records: list[dict], metric: str, scale: float, digits: int, **match) -> str:
    """mean ± sd over the seeds (the statistic of the reports, `dfl.report.Stat`), and the diverged count."""
    from dfl.report import Stat

    group = [r for r in records if all(r[k] == v for k, v in match.items())]
    if not group:
        return "not run"
    done = [r[metric] for r in group if r["status"] == "completed"]
    stat = Stat.of(done)
    if stat.mean is None:
        return f"all {len(group)} diverged"
    sd = "—" if stat.std is None else f"{scale * stat.std:.{digits}f}"
    text = f"{scale * stat.mean:.{digits}f} ± {sd}"
    return text + (f" ({len(group) - len(done)} diverged)" if len(done) < len(group) else "")


def tables(records: list[dict]) -> str:
    """Per algorithm: rows topology, columns n: test accuracy (%), consensus distance, MB sent per client."""
    sizes = sorted({r["n"] for r in records})
    names = [t for t in TOPOLOGIES if any(r["topology"] == t for r in records)]
    lines = []
    for algorithm in ALGORITHMS:
        for metric, title, scale, digits in (("test_acc", "final test accuracy (%)", 100, 1),
                                             ("consensus_distance", "final consensus distance", 1, 3),
                                             ("bytes_sent_total", "MB sent by all clients", 1e-6, 1)):
            lines += [f"### {LABELS[algorithm]}: {title}, mean ± sd over seeds", "",
                      "| topology | " + " | ".join(f"n = {n}" for n in sizes) + " |", "|---|" + "---:|" * len(sizes)]
            lines += [f"| {t} | " + " | ".join(
                cell(records, metric, scale, digits, algorithm=algorithm, topology=t, n=n) for n in sizes) + " |"
                for t in names]
            lines.append("")
    return "\n".join(lines)


def expectations(records: list[dict]) -> list[tuple[str, str, list[Comparison]]]:
    """E1-E5 of the module docstring, each as its comparisons."""
    def v(metric, algorithm, name, n):
        return values(records, metric, algorithm=algorithm, topology=name, n=n)

    def beats(a, b, algorithm, n, metric="test_acc", smaller=False):
        return paired(f"{LABELS[algorithm]}, n = {n}: {a} − {b} ({metric})", v(metric, algorithm, a, n),
                      v(metric, algorithm, b, n), below=smaller)

    def within(a, b, algorithm, n, points=0.02):
        pair = (v("test_acc", algorithm, a, n), v("test_acc", algorithm, b, n))
        return [paired(f"{LABELS[algorithm]}, n = {n}: {a} − {b} > −{points:g}", *pair, threshold=-points),
                paired(f"{LABELS[algorithm]}, n = {n}: {a} − {b} < +{points:g}", *pair, threshold=points, below=True)]

    return [
        ("E1", "at n = 24, base-1 beats one-peer in final test accuracy (both algorithms)",
         [beats("base-1", "one-peer", a, 24) for a in ALGORITHMS]),
        ("E2", "at n = 24, base-1 ends with a smaller consensus distance than one-peer (both algorithms)",
         [beats("base-1", "one-peer", a, 24, "consensus_distance", smaller=True) for a in ALGORITHMS]),
        ("E3", "at n = 16 and 32, base-1 and one-peer are within 2 points (both algorithms)",
         [c for a in ALGORITHMS for n in (16, 32) for c in within("base-1", "one-peer", a, n)]),
        ("E4", "base-2 beats exp in final test accuracy at n = 24 and 32 (both algorithms)",
         [beats("base-2", "exp", a, n) for a in ALGORITHMS for n in (24, 32)]),
        ("E5", "DFedSAM: base-1 beats equidyn and matcha in final test accuracy at n = 24 and 32",
         [beats("base-1", other, "dfedsam-mgs", n) for other in ("equidyn", "matcha") for n in (24, 32)]),
    ]


def figure(records: list[dict], path: Path, n: int = 24) -> None:
    """Test accuracy and consensus distance against MB sent (all clients), mean over seeds, at n clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from dfl.directories import figure_metadata

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex="col")
    for col, algorithm in enumerate(ALGORITHMS):
        for name in TOPOLOGIES:
            runs = [r for r in records if (r["algorithm"], r["topology"], r["n"], r["status"]) ==
                    (algorithm, name, n, "completed") and r["curve"]]
            if not runs:
                continue
            length = min(len(r["curve"]) for r in runs)
            x = np.mean([[p["bytes_sent_total"] / 1e6 for p in r["curve"][:length]] for r in runs], axis=0)
            for row, metric in enumerate(("test_acc", "consensus_distance")):
                y = np.mean([[p[metric] for p in r["curve"][:length]] for r in runs], axis=0)
                axes[row, col].plot(x, 100 * y if metric == "test_acc" else y, marker="o", ms=3, label=name)
        axes[0, col].set_title(f"{LABELS[algorithm]}, n = {n}, Dirichlet 0.1")
        axes[1, col].set_xlabel("MB sent by all clients")
        axes[1, col].set_yscale("log")
    axes[0, 0].set_ylabel("test accuracy (%)")
    axes[1, 0].set_ylabel("consensus distance")
    axes[0, 1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata=figure_metadata("png"))
    plt.close(fig)


STUDY = Study(__doc__, "topology", "Finite-time topologies vs exponential graphs (benchmarks/topology_study.py)",
              "2 rounds, 8 clients, base-1, one-peer and matcha, one seed (CI)", run_all,
              lambda records, quick: tables(records), expectations,
              figure=lambda records, path, quick: figure(records, path, n=8 if quick else 24),
              figure_help="write the figure of accuracy and consensus distance vs bytes sent")


def main(argv=None) -> int:  # noqa: D103 (the module docstring is the help)
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Accuracy and consensus under client-level differential privacy, per topology (docs/how-to/differential-privacy.md).

Question. Each client clips its round update to C and adds N(0, σ²C² I) before gossiping (`dp_clip`, `dp_noise`).
How much accuracy and consensus does DFedSAM lose as σ grows, on a ring (slow mixing, two neighbours) against the
complete graph (every message averaged with all the others), and what ε does each σ buy?

Regime, fixed before the runs: MNIST-1D (dfl's default, 4000 samples), 16 clients, Dirichlet α = 0.3 (the default
split), `mlp` with one hidden layer of 32 units (d = 1,642), DFedSAM with its defaults (ρ = 0.01, momentum 0.9, lr
0.1, 5 local steps of batch 32), 50 rounds, C ∈ {0.1, 1}, δ = 1e-5, σ ∈ {0, 0.5, 1, 2}, seeds 0, 1, 2 (a seed fixes
the split and the initialisation: the cells are paired by seed). σ = 0 is clipping without noise (ε = ∞); "no DP" is
the run without clipping. ε depends on σ and the rounds only (C cancels out). Nothing was tuned: the two C bracket
the update norms of calibration runs (C = 1 and 0.3 at σ = 0 on the default 16k-parameter mlp clipped little and
much).

    python benchmarks/privacy_study.py --out runs/privacy --results benchmarks/results/privacy-2026-11-26
    python benchmarks/privacy_study.py --quick --out /tmp/quick   # tiny, for CI: no accuracy meaning
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.study_runs import Study, run_or_read, study_main  # noqa: E402 (after the path)

TOPOLOGIES = ("ring", "full")
CLIPS = (0.1, 1.0)
NOISES = (0.0, 0.5, 1.0, 2.0)
SEEDS = (0, 1, 2)
METRICS = ("test_acc", "client_acc_mean", "consensus_distance")


def base_config(quick: bool):
    """The study's regime (module docstring); `quick`: 2 rounds of 8 clients, for the test."""
    import dfl

    if quick:
        return dfl.Config(algorithm="dfedsam", clients=8, model="mlp", model_options={"hidden": [8]},
                          dataset_options={"num_samples": 600}, rounds=2, eval_every=2, progress=False)
    return dfl.Config(algorithm="dfedsam", clients=16, model="mlp", model_options={"hidden": [32]}, rounds=50,
                      eval_every=50, progress=False)


def cells(quick: bool):
    """(topology, C and σ or None (no DP), seed, config) of every run."""
    base = base_config(quick)
    settings = [None] + ([(0.1, 1.0)] if quick else [(c, s) for c in CLIPS for s in NOISES])
    for topology in TOPOLOGIES:
        for setting in settings:
            for seed in (0,) if quick else SEEDS:
                dp = {} if setting is None else {"dp_clip": setting[0], "dp_noise": setting[1]}
                yield topology, setting, seed, base.replace(topology=topology, seed=seed, **dp)


def run_all(out: Path, quick: bool) -> list[dict]:
    """Run every cell into out/NAME (a finished run is read back, not rerun); one record per run."""
    records = []
    for topology, setting, seed, config in cells(quick):
        name = f"{topology}-{'nodp' if setting is None else f'C{setting[0]:g}-sigma{setting[1]:g}'}-seed{seed}"
        summary = run_or_read(config, out / name)  # a diverged run is listed, never averaged in
        clip, noise = setting or (None, None)
        records.append({"topology": topology, "clip": clip, "noise": noise, "seed": seed, "status": summary["status"],
                        **{k: summary[k] for k in (*METRICS, "dp_epsilon") if k in summary}})
    return records


def table(records: list[dict]) -> str:
    """The Markdown table: mean ± std over seeds of each metric, per topology, C and σ, with ε."""
    lines = ["| topology | C | σ | ε (δ = 1e-5) | test acc (%) | client acc (%) | consensus distance |",
             "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["topology"], r["clip"], r["noise"]), []).append(r)

    def cell(values, scale=1.0, digits=1):
        mean = statistics.mean(values) * scale
        std = statistics.stdev(values) * scale if len(values) > 1 else 0.0
        return f"{mean:.{digits}f} ± {std:.{digits}f}"

    for (topology, clip, noise), group in groups.items():
        rs = [r for r in group if r["status"] == "completed"]
        diverged = f" ({len(group) - len(rs)} of {len(group)} diverged)" if len(rs) < len(group) else ""
        eps = group[0].get("dp_epsilon")
        shown_eps = "no DP" if noise is None else "∞" if eps is None else f"{eps:.1f}"
        if not rs:
            lines.append(f"| {topology} | {clip:g} | {noise:g} | {shown_eps} | all {len(group)} diverged | | |")
            continue
        shown_c, shown_s = ("—", "—") if clip is None else (f"{clip:g}", f"{noise:g}")
        lines.append(f"| {topology} | {shown_c} | {shown_s} | {shown_eps} | {cell([r['test_acc'] for r in rs], 100)}"
                     f"{diverged} | {cell([r['client_acc_mean'] for r in rs], 100)} | "
                     f"{cell([r['consensus_distance'] for r in rs], 1, 3)} |")
    return "\n".join(lines) + "\n"


STUDY = Study(__doc__, "privacy", "Differential privacy vs topology (benchmarks/privacy_study.py)",
              "2 rounds, 8 clients, no DP and C 0.1 σ 1, one seed (CI)", run_all, lambda records, quick: table(records))


def main(argv=None) -> int:  # noqa: D103 (the module docstring is the help)
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())

"""A pre-registered study of gradient tracking and push-sum across data heterogeneity (issue 39, deliverable 6).

Question. Gradient tracking (DSGT, K-GT) is meant to remove the bias that heterogeneous data gives D-PSGD and the
local-step methods (DFedAvg, DFedSAM); push-sum is meant to keep the exact average on a column-stochastic W where
row-stochastic mixing (DisPFL's `random-pull`) optimises a π-weighted objective. Does either matter on MNIST-1D, and
does the effect grow with heterogeneity (Dirichlet α: 0.05 strong, 0.3 moderate, 10 near IID)?

Regime, fixed before any run and the same for every run of a pair: MNIST-1D (dfl's embedded default, 4000 samples),
16 clients, Dirichlet α per part, `mlp` (200-200), 200 rounds of 5 local steps (batch 32), lr 0.1 constant
(lr_decay 1: D-PSGD's heterogeneity bias is O(η ζ) for a constant step and vanishes with a decayed one, so a
constant step is the regime the tracking theory addresses; it is not tuned), momentum 0 everywhere (the tracking
rules are written for plain gradient steps and K-GT/DSGT run plain SGD, so the baselines do too: DFedSAM's default
momentum 0.9 would compare momentum, not tracking), ρ = 0.05 for every SAM run (not searched: the pairs share it),
no weight decay. 3 seeds; a seed fixes the data split and the initialisation, so comparisons are paired by seed.
No setting was searched or tuned. Before writing the expectations below, four one-seed calibration runs at α = 0.05
(seed 0, 200 rounds, for timing) were seen: DFedAvg 46.8% vs K-GT 52.1% (consensus 0.74 vs 0.51), and DFedSAM on
random-pull k = 2 with push-sum 49.8% vs row-stochastic 50.0%. They are not part of the results.

Part A, tracking (undirected ring, Metropolis weights: doubly stochastic, slow mixing), three matched pairs:
  - `dpsgd` vs `dsgt`: one gradient step per gossip (5 steps and 5 gossips a round; DSGT sends 2 vectors per link);
  - `dfedavg` vs `kgt`: 5 local steps then one gossip (K-GT sends 2 vectors per link, outer_lr 1);
  - `dfedsam` vs `kgt-sam`: 5 local SAM steps (ρ = 0.05) then one gossip.
Part B, directed (DFedSAM, ρ = 0.05, on DisPFL's `random-pull` with k = 2 pulls a round, time-varying):
  - `push-sum`: weights = column-stochastic (each client splits what it sends), mixed by push-sum (exact average);
  - `row`: the random-pull default, row-stochastic (each client averages what it pulls: a biased average);
  - `ring`: the undirected ring, Metropolis (two neighbours, as k = 2 pulls: about the same communication).

Pre-registered expectations (written before the study ran; each is marked holds / fails / inconclusive):
  E1 tracking beats its baseline at α = 0.05 (test accuracy of the averaged model), for each pair;
  E2 tracking's gain grows as α shrinks: gain(0.05) > gain(0.3) > gain(10), for each pair;
  E3 at α = 10 (near IID) tracking gains less than 1 point, for each pair;
  E4 tracking lowers the consensus distance at α = 0.05, for each pair;
  E5 tracking also raises the mean accuracy of the client models at α = 0.05, for each pair;
  E6 push-sum is not worse than row-stochastic mixing: non-inferiority with a 1-point margin, at every α;
  E7 push-sum's advantage over row-stochastic mixing is larger at α = 0.05 than at α = 10;
  E8 push-sum on random-pull (k = 2) beats the undirected ring at α = 0.05 (a random graph mixes faster).

Statistics. For a comparison "A > B" the per-seed differences d = A − B give the mean, a 95% confidence interval
(Student t, n − 1 degrees of freedom) and a sign count. **holds**: the interval lies above the threshold (0, or −1
point for E6's non-inferiority, and for E3 "below 1 point": its upper end lies below +1 point); **fails**: it lies
entirely on the other side; **inconclusive** otherwise. An expectation made of several comparisons holds if all
hold, fails if any fails, and is inconclusive otherwise. Failed or diverged runs are listed and never averaged in.
With 3 seeds the interval is wide (t = 4.30): a small effect shows as inconclusive, not as a failure.

One command (rerunning resumes; each cell group is a `dfl sweep` under OUT/):

    python benchmarks/heterogeneity_study.py --out runs/heterogeneity --parallel 2 \
        --results benchmarks/results/heterogeneity-2026-11-26
    python benchmarks/heterogeneity_study.py --quick --out /tmp/quick   # tiny, for CI: no accuracy meaning
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PAIRS = (("dpsgd", "dsgt"), ("dfedavg", "kgt"), ("dfedsam", "kgt-sam"))  # (baseline, tracking)
SAM = ("dfedsam", "kgt-sam")
DIRECTED = {  # Part B's variants: topology settings of DFedSAM
    "push-sum": {"topology": "random-pull", "topology_options": {"k": 2}, "weights": "column-stochastic"},
    "row": {"topology": "random-pull", "topology_options": {"k": 2}},  # row-stochastic: random-pull's default
    "ring": {"topology": "ring"},
}
RHO = 0.05
MARGIN = 0.01  # 1 accuracy point: E3's and E6's threshold
LEVEL = 0.95


@dataclass
class Regime:
    clients: int
    samples: int  # MNIST-1D num_samples
    model_options: dict
    rounds: int
    local_steps: int
    eval_every: int
    seeds: int
    alphas: tuple[float, ...]  # strong to weak heterogeneity

    def base(self) -> dict:
        return {"dataset": "mnist1d", "dataset_options": {"num_samples": self.samples}, "clients": self.clients,
                "partition": "dirichlet", "model": "mlp", "model_options": self.model_options,
                "rounds": self.rounds, "local_steps": self.local_steps, "batch_size": 32, "lr": 0.1,
                "lr_decay": 1.0, "momentum": 0.0, "weight_decay": 0.0, "eval_every": self.eval_every,
                "progress": False, "threads": 1}


FULL = Regime(clients=16, samples=4000, model_options={}, rounds=200, local_steps=5, eval_every=20, seeds=3,
              alphas=(0.05, 0.3, 10.0))
QUICK = Regime(clients=6, samples=600, model_options={"hidden": [16]}, rounds=3, local_steps=2, eval_every=3,
               seeds=2, alphas=(0.05, 10.0))


# ------------------------------------------------------------------------------------------------ running
def groups(regime: Regime) -> dict[str, tuple[dict, dict]]:
    """Each cell group as a sweep: name -> (base, vary). Seed varies slowest, so a study stopped early stays
    paired."""
    seeds, alphas = list(range(regime.seeds)), list(regime.alphas)
    ring = {**regime.base(), "topology": "ring"}
    out = {}
    for baseline, tracking in PAIRS:
        base = {**ring, "rho": RHO} if baseline in SAM else ring
        out[f"A-{baseline}-{tracking}"] = (base, {"seed": seeds, "alpha": alphas, "algorithm": [baseline, tracking]})
    for variant, settings in DIRECTED.items():
        out[f"B-{variant}"] = ({**regime.base(), "algorithm": "dfedsam", "rho": RHO, **settings},
                               {"seed": seeds, "alpha": alphas})
    return out


def run_all(out: Path, regime: Regime, parallel: int) -> None:
    from dfl.workflows.sweep import Sweep, run_sweep

    for name, (base, vary) in groups(regime).items():
        sweep = Sweep(base=base, vary=vary, name=name, parallel=parallel)
        print(f"\n== {name}: {math.prod(len(v) for v in vary.values())} runs", flush=True)
        run_sweep(sweep, out / name, parallel=parallel)


# ------------------------------------------------------------------------------------------------ analysis
def values(out: Path, group: str, metric: str, **match) -> dict[int, float]:
    """seed -> final `metric` of the group's completed runs whose config matches `match`."""
    from dfl.report.runs import load_runs

    found = {}
    if not (out / group).is_dir():
        return found
    for r in load_runs(out / group):
        if r.status == "completed" and all(r.config.get(k) == v for k, v in match.items()):
            value = (r.final or {}).get(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                found[int(r.config["seed"])] = float(value)
    return found


def not_completed(out: Path, regime: Regime) -> list[str]:
    from dfl.report.runs import load_runs

    lines = []
    for group in groups(regime):
        if (out / group).is_dir():
            lines += [f"- {group}/{r.name}: {r.status} {r.summary.get('error') or ''}".rstrip()
                      for r in load_runs(out / group) if r.status != "completed"]
    return lines


@dataclass
class Comparison:
    label: str
    diffs: list[float]  # per seed, oriented so that the expectation says "> threshold"
    threshold: float = 0.0
    below: bool = False  # the expectation says "< threshold" (E3)
    scale: float = 100.0  # accuracy in points; 1 for consensus distances

    def interval(self) -> tuple[float, float, float] | None:
        """(mean, low, high) of the 95% Student-t interval of the mean difference; None below 2 seeds."""
        from scipy import stats

        n = len(self.diffs)
        if n < 2:
            return None
        mean = sum(self.diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in self.diffs) / (n - 1))
        half = float(stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * sd / math.sqrt(n)
        return mean, mean - half, mean + half

    @property
    def verdict(self) -> str:
        ci = self.interval()
        if ci is None:
            return "not run"
        _, low, high = ci
        if self.below:
            return "holds" if high < self.threshold else "fails" if low > self.threshold else "inconclusive"
        return "holds" if low > self.threshold else "fails" if high < self.threshold else "inconclusive"

    def to_dict(self) -> dict:
        ci = self.interval()
        return {"label": self.label, "diffs": self.diffs, "threshold": self.threshold, "below": self.below,
                "mean": ci and ci[0], "ci95": ci and [ci[1], ci[2]], "positive": sum(d > 0 for d in self.diffs),
                "verdict": self.verdict}

    def row(self) -> str:
        ci = self.interval()
        if ci is None:
            return f"| {self.label} | — | — | {len(self.diffs)} seeds | — | not run |"
        s, unit = self.scale, " pts" if self.scale == 100.0 else ""
        side = "<" if self.below else ">"
        return (f"| {self.label} | {s * ci[0]:+.2f}{unit} | [{s * ci[1]:+.2f}, {s * ci[2]:+.2f}] | "
                f"{sum(d > 0 for d in self.diffs)}/{len(self.diffs)} | {side} {s * self.threshold:+g} | "
                f"**{self.verdict}** |")


def paired(label: str, a: dict[int, float], b: dict[int, float], **kw) -> Comparison:
    seeds = sorted(set(a) & set(b))
    return Comparison(label, [a[s] - b[s] for s in seeds], **kw)


def verdict(comps: list[Comparison]) -> str:
    verdicts = [c.verdict for c in comps]
    if not verdicts or all(v == "not run" for v in verdicts):
        return "not run"
    if "fails" in verdicts:
        return "fails"
    return "holds" if all(v == "holds" for v in verdicts) else "inconclusive"


def expectations(out: Path, regime: Regime) -> list[tuple[str, str, list[Comparison]]]:
    strong, weak = regime.alphas[0], regime.alphas[-1]

    def cell(group, metric, **match):
        return values(out, group, metric, **match)

    def gain(baseline, tracking, alpha, metric="test_acc"):
        g = f"A-{baseline}-{tracking}"
        return diff(cell(g, metric, algorithm=tracking, alpha=alpha), cell(g, metric, algorithm=baseline, alpha=alpha))

    def push_gain(alpha, other="row"):
        return diff(cell("B-push-sum", "test_acc", alpha=alpha), cell(f"B-{other}", "test_acc", alpha=alpha))

    found = []
    found.append(("E1", f"tracking beats its baseline at α = {strong:g} (test accuracy, averaged model)",
                  [paired(f"{t} − {b} at α={strong:g}", gain(b, t, strong), {s: 0.0 for s in gain(b, t, strong)})
                   for b, t in PAIRS]))
    comps = []
    for b, t in PAIRS:
        for hi, lo in zip(regime.alphas, regime.alphas[1:]):
            comps.append(paired(f"{t} − {b}: gain at α={hi:g} − gain at α={lo:g}", gain(b, t, hi), gain(b, t, lo)))
    found.append(("E2", "tracking's gain grows as α shrinks", comps))
    found.append(("E3", f"at α = {weak:g} tracking gains less than 1 point",
                  [paired(f"{t} − {b} at α={weak:g}", gain(b, t, weak), {s: 0.0 for s in gain(b, t, weak)},
                          threshold=MARGIN, below=True) for b, t in PAIRS]))
    found.append(("E4", f"tracking lowers the consensus distance at α = {strong:g}",
                  [paired(f"consensus {b} − {t} at α={strong:g}",
                          cell(f"A-{b}-{t}", "consensus_distance", algorithm=b, alpha=strong),
                          cell(f"A-{b}-{t}", "consensus_distance", algorithm=t, alpha=strong), scale=1.0)
                   for b, t in PAIRS]))
    found.append(("E5", f"tracking raises the mean accuracy of the client models at α = {strong:g}",
                  [paired(f"client mean {t} − {b} at α={strong:g}", gain(b, t, strong, "client_acc_mean"),
                          {s: 0.0 for s in gain(b, t, strong, "client_acc_mean")}) for b, t in PAIRS]))
    found.append(("E6", "push-sum is not worse than row-stochastic mixing (margin 1 point), every α",
                  [paired(f"push-sum − row at α={a:g}", push_gain(a), {s: 0.0 for s in push_gain(a)},
                          threshold=-MARGIN) for a in regime.alphas]))
    found.append(("E7", f"push-sum's advantage over row-stochastic mixing is larger at α = {strong:g} than at "
                  f"α = {weak:g}", [paired(f"(push-sum − row) at α={strong:g} − at α={weak:g}", push_gain(strong),
                                           push_gain(weak))]))
    found.append(("E8", f"push-sum on random-pull (k = 2) beats the undirected ring at α = {strong:g}",
                  [paired(f"push-sum − ring at α={strong:g}", push_gain(strong, "ring"),
                          {s: 0.0 for s in push_gain(strong, "ring")})]))
    return found


def diff(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def mean_sd(xs: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """'mean ± sd' of `xs` times `scale` (the statistic of the reports, `dfl.report.Stat`); 'not run' for none."""
    from dfl.report import Stat

    stat = Stat.of(xs)
    if stat.mean is None:
        return "not run"
    sd = stat.std if stat.std is not None else float("nan")
    return f"{scale * stat.mean:.{digits}f} ± {scale * sd:.{digits}f}"


def cells(out: Path, regime: Regime) -> list[dict]:
    """Every cell: group, algorithm or variant, α, and per-seed test accuracy, client mean accuracy, consensus
    distance and the accuracy change over the last 20% of rounds."""
    from dfl.report.runs import load_runs

    rows = []
    for group in groups(regime):
        for alpha in regime.alphas:
            names = [a for pair in PAIRS if group == f"A-{pair[0]}-{pair[1]}" for a in pair] or [group[2:]]
            for name in names:
                match = {"alpha": alpha, **({"algorithm": name} if group.startswith("A-") else {})}
                row = {"group": group, "name": name, "alpha": alpha}
                for metric in ("test_acc", "client_acc_mean", "consensus_distance"):
                    row[metric] = values(out, group, metric, **match)
                late = {}
                if (out / group).is_dir():
                    for r in load_runs(out / group):
                        if r.status == "completed" and all(r.config.get(k) == v for k, v in match.items()):
                            acc = [m for m in r.metrics if isinstance(m.get("test_acc"), (int, float))]
                            earlier = [m for m in acc if m["round"] <= 0.8 * acc[-1]["round"]] or acc[:1]
                            late[int(r.config["seed"])] = acc[-1]["test_acc"] - earlier[-1]["test_acc"]
                row["last_fifth_change"] = late
                rows.append(row)
    return rows


def cell_table(rows: list[dict], part: str) -> list[str]:
    lines = ["| α | algorithm | test accuracy, averaged model (%) | mean of client models (%) | consensus distance "
             "| change over last 20% of rounds (pts) |", "|---|---|---|---|---|---|"]
    for row in rows:
        if row["group"].startswith(part):
            lines.append(f"| {row['alpha']:g} | {row['name']} | {mean_sd(list(row['test_acc'].values()))} | "
                         f"{mean_sd(list(row['client_acc_mean'].values()))} | "
                         f"{mean_sd(list(row['consensus_distance'].values()), 1.0, 3)} | "
                         f"{mean_sd(list(row['last_fifth_change'].values()))} |")
    return lines


def report(out: Path, regime: Regime, seconds: float, cpu_seconds: float) -> tuple[str, dict]:
    found = expectations(out, regime)
    rows = cells(out, regime)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or "unknown"
    md = [f"# Heterogeneity study: gradient tracking and push-sum across Dirichlet α ({time.strftime('%Y-%m-%d')}, "
          f"commit {commit}, {platform.machine()} {sys.platform}, {seconds / 60:.1f} min wall, "
          f"{cpu_seconds / 60:.1f} CPU-min this invocation)\n",
          f"Regime: MNIST-1D ({regime.samples} samples), {regime.clients} clients, Dirichlet α ∈ "
          f"{{{', '.join(f'{a:g}' for a in regime.alphas)}}}, mlp, {regime.rounds} rounds × {regime.local_steps} "
          f"local steps (batch 32), lr 0.1 constant, momentum 0, ρ = {RHO:g} for SAM runs, {regime.seeds} seeds "
          "(paired). Values: mean ± std over seeds after the last round.\n",
          "## Expectations (pre-registered)\n", "| | expectation | verdict |", "|---|---|---|"]
    md += [f"| {eid} | {text} | **{verdict(comps)}** |" for eid, text, comps in found]
    md += ["", "## Paired comparisons\n", "Per comparison: mean of the per-seed differences, its 95% Student-t "
           "interval, seeds with a positive difference, the threshold the expectation names, verdict. Accuracy in "
           "points, consensus distance as it is.\n",
           "| comparison | mean | 95% interval | positive | expects | verdict |", "|---|---|---|---|---|---|"]
    for eid, _, comps in found:
        md += [c.row().replace("| ", f"| {eid}: ", 1) for c in comps]
    md += ["", "## Part A: tracking on the ring\n", *cell_table(rows, "A-"), "",
           "## Part B: DFedSAM on random-pull (k = 2): push-sum, row-stochastic, and the ring\n",
           *cell_table(rows, "B-")]
    missing = not_completed(out, regime)
    md += ["", "## Runs not completed\n", "\n".join(missing) if missing else "none"]
    record = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "regime": regime.__dict__ | {"rho": RHO},
              "wall_seconds": seconds, "cpu_seconds": cpu_seconds,
              "expectations": [{"id": eid, "statement": text, "verdict": verdict(comps),
                                "comparisons": [c.to_dict() for c in comps]} for eid, text, comps in found],
              "cells": rows, "not_completed": missing}
    return "\n".join(md) + "\n", record


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/heterogeneity", help="study directory (rerunning resumes)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time (each with 1 thread)")
    p.add_argument("--quick", action="store_true", help="a tiny version for CI (6 clients, 3 rounds, 2 seeds)")
    p.add_argument("--results", metavar="PREFIX", help="also write PREFIX.md and PREFIX.json (default: only "
                   "OUT/heterogeneity.md and .json)")
    p.add_argument("--report-only", action="store_true", help="run nothing: report the runs on disk")
    args = p.parse_args(argv)
    regime = QUICK if args.quick else FULL
    out = Path(args.out)
    tic, cpu = time.perf_counter(), cpu_seconds()
    if not args.report_only:
        run_all(out, regime, args.parallel)
    text, record = report(out, regime, time.perf_counter() - tic, cpu_seconds() - cpu)
    targets = [out / "heterogeneity"] + ([Path(args.results)] if args.results else [])
    for prefix in targets:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        prefix.with_name(prefix.name + ".md").write_text(text)
        prefix.with_name(prefix.name + ".json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n" + text)
    print("written: " + ", ".join(f"{t}.md, {t}.json" for t in targets))


if __name__ == "__main__":
    main()

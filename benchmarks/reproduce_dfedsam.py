"""A pre-registered reproduction of the DFedSAM paper's claims (Shi et al., "Improving the model consistency of
decentralized federated learning", ICML 2023, arXiv 2302.04083; Tables 1-2 and the flatness figure).

The claims, written down before running (each is marked holds / fails / inconclusive by the rule below):
  (a) accuracy ring < grid < exponential < full, for every decentralized algorithm (Table 2);
  (b) DFedSAM-MGS > DFedSAM > DFedAvgM > DFedAvg > D-PSGD, on every topology (Tables 1-2);
  (c) the gain of MGS over DFedSAM is largest on the sparsest topology (ring);
  (d) SAM gives a smaller top Hessian eigenvalue of the averaged model than no SAM (DFedSAM vs DFedAvgM);
  (e) SAM and MGS reduce the consensus distance (DFedSAM < DFedAvgM, DFedSAM-MGS < DFedSAM);
  (f) more heterogeneity (Dirichlet 0.3 vs IID) hurts decentralized FL more than centralized FL
      (DFedAvg vs FedAvg and DFedSAM vs FedSAM, Table 1).

Matched comparisons. DFedAvgM, DFedSAM and DFedSAM-MGS all run local momentum 0.9 (dfl's defaults: the paper's
Algorithm 1 carries a heavy-ball term, y^{t,-1} = y^{t,0}, and the DisPFL-derived code runs SGD momentum 0.9);
DFedAvg and D-PSGD are plain SGD by definition, so DFedAvgM > DFedAvg is the momentum comparison itself. D-PSGD
is compared twice: at equal communication (one SGD step and one gossip per round, the paper's D-PSGD: same rounds
and bytes as DFedAvg) in the main table, and at equal local computation (K SGD steps, each followed by a gossip:
K times DFedAvg's bytes) in its own row. Claim (f) compares plain-SGD algorithms (FedAvg vs DFedAvg, FedSAM vs
DFedSAM with momentum 0) on the ring.

ρ is chosen before the main runs by a search (`--rhos`) for DFedSAM on the ring, scored by the averaged model's
accuracy on a validation split (10% of each client's training data, `local_test_fraction`, metric
`global_acc_mean`), never on the test set; the main runs use the chosen ρ for every SAM algorithm.

Statistics. Every cell has `--seeds` seeds (same seed = same data split and initialisation, so comparisons are
paired across seeds); cells in a close comparison get `--close-seeds` in total. A comparison "A > B" uses the
per-seed differences d = A − B: **holds** if mean(d) > 0 and the one-sided paired t-test gives p < 0.05,
**fails** if mean(d) < 0 with p < 0.05 for the opposite direction, **identical** if d = 0 for every seed (the
same computation, e.g. DFedSAM-MGS and DFedSAM on `full`, where W = J: a strict ">" is false by construction),
**inconclusive** otherwise. A claim made of several comparisons holds if all hold, fails if any fails or is
identical, and is inconclusive otherwise. A comparison is
"close" if it is inconclusive with the first seeds. Convergence: a run counts as converged if its test accuracy
changed by at most 1 percentage point over the last 20% of rounds; the report gives the fraction per part.
Missing, failed or diverged runs are listed and never averaged in; a claim without its runs is "not run".

Convergence of plain SGD. At the main budget (`rounds`) the momentum methods are flat but the plain-SGD ones (DFedAvg,
D-PSGD, and claim (f)'s runs, all momentum 0: lr 0.1 without momentum takes ~10x smaller steps) are still climbing.
So every plain-SGD run is run again to `long_rounds` (3x) under OUT/long/ (same parts, names and seeds; each
resumes its `rounds`-round run's checkpoint, which is exact: the same numbers as running it from scratch), and every
claim gets a second verdict "at convergence": plain-SGD cells at `long_rounds`, momentum cells at `rounds`. Only
DFedAvgM > DFedAvg (claim b) then mixes budgets, in DFedAvg's favour (3x the rounds): if it holds there, it holds a
fortiori at equal rounds; the other comparisons stay at equal rounds.

Second sweep, fixed before it ran: at Dirichlet 0.3 the dense end of claim (a) (exponential vs full) is flat for the
momentum methods. Hypothesis: a one-gossip-step consensus error only costs accuracy when local models drift apart,
i.e. under stronger heterogeneity. Part `alpha-0.05` reruns DFedAvgM, DFedSAM and DFedSAM-MGS on the three densest
topologies at Dirichlet SECOND_ALPHA = 0.05 (otherwise the main regime, `--seeds` seeds) and tests the same
comparisons of claim (a) there, beside their values at 0.3.

One command; rerunning resumes (each part is a `dfl sweep` under OUT/):

    python benchmarks/reproduce_dfedsam.py --out runs/reproduce-dfedsam --parallel 2
    python benchmarks/reproduce_dfedsam.py --quick --out /tmp/quick     # a tiny version (no accuracy meaning)
    python benchmarks/reproduce_dfedsam.py --parts hetero,long --out ...  # some steps only (the rest: "not run")
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TOPOLOGIES = ("ring", "grid", "exponential", "full")  # sparse to dense
DECENTRALIZED = ("dpsgd", "dfedavg", "dfedavgm", "dfedsam", "dfedsam-mgs")  # claim (b), weakest first
HETERO_PAIRS = (("dfedavg", "fedavg"), ("dfedsam", "fedsam"))  # claim (f): (decentralized, centralized)
PARTS = ("main", "dpsgd-equal-comm", "hetero-dirichlet", "hetero-iid")
PLAIN_SGD = ("dpsgd", "dfedavg", "fedavg")  # no local momentum by definition (the others default to 0.9)
LONG = "long"  # OUT/long/: the plain-SGD runs again with long_rounds
SECOND_ALPHA = 0.05
SECOND = f"alpha-{SECOND_ALPHA:g}"  # the second sweep's part
SECOND_ALGORITHMS = ("dfedavgm", "dfedsam", "dfedsam-mgs")
STEPS = ("dpsgd-equal-comm", "main", "hetero", "close-seeds", "long", "second")  # --parts, in the order they run
ALPHA = 0.3
P_LEVEL = 0.05
FLAT_POINTS = 0.01  # convergence: |Δ test accuracy| over the last 20% of rounds


@dataclass
class Regime:
    clients: int
    samples: int  # mnist1d num_samples
    model: str
    model_options: dict
    rounds: int
    long_rounds: int  # the plain-SGD runs again with this many rounds (> rounds)
    eval_every: int
    seeds: int
    close_seeds: int
    rhos: tuple[float, ...]
    topologies: tuple[str, ...]

    def base(self) -> dict:
        return {"dataset": "mnist1d", "dataset_options": {"num_samples": self.samples}, "clients": self.clients,
                "partition": "dirichlet", "alpha": ALPHA, "model": self.model, "model_options": self.model_options,
                "rounds": self.rounds, "eval_every": self.eval_every, "local_epochs": 1, "batch_size": 32,
                "lr": 0.1, "lr_decay": 0.998, "progress": False}


FULL = Regime(clients=32, samples=20000, model="cnn1d", model_options={}, rounds=100, long_rounds=300, eval_every=5,
              seeds=3, close_seeds=5, rhos=(0.02, 0.05, 0.1, 0.2, 0.5, 1.0), topologies=TOPOLOGIES)
QUICK = Regime(clients=8, samples=1200, model="mlp", model_options={"hidden": [32]}, rounds=4, long_rounds=6,
               eval_every=2, seeds=2, close_seeds=2, rhos=(0.01, 0.05), topologies=("ring", "full"))


# ------------------------------------------------------------------------------------------------ running
def run_part(out: Path, name: str, base: dict, vary: dict, parallel: int) -> None:
    from dfl.workflows.sweep import Sweep, run_sweep

    sweep = Sweep(base=base, vary=vary, name=name, parallel=parallel)
    print(f"\n== part {name}: {math.prod(len(v) for v in vary.values())} runs")
    run_sweep(sweep, out / name, parallel=parallel)


def load(out: Path, part: str, converged: bool = False) -> list:
    """Run records of one part (dfl.report.runs.load_runs), with its extra seeds from close-seeds/PART-*; none if
    the part was not run. `converged`: the plain-SGD runs from OUT/long/ (long_rounds) instead."""
    from dfl.report.runs import load_runs

    if converged:
        return [r for r in load(out, part) if not plain_sgd(r.config)] + load(out / LONG, part)
    runs = []
    for sweep in [out / part, *sorted((out / "close-seeds").glob(f"{part}--*"))]:
        if sweep.is_dir():
            runs += [not_extended(r, sweep) for r in load_runs(sweep)]
    return runs


def not_extended(run, sweep: Path):
    """The run, marked "not extended" (so never counted as completed) when it has fewer rounds than its sweep's
    [base] rounds: in OUT/long/, a copied short run that the long pass has not resumed yet."""
    import dataclasses

    from dfl.workflows.sweep import SweepError, load_sweep

    try:
        rounds = load_sweep(sweep / "sweep.toml").base["rounds"]
    except (OSError, KeyError, SweepError):
        return run
    if run.config.get("rounds") == rounds:
        return run
    return dataclasses.replace(run, summary={**run.summary, "status": f"not extended to {rounds} rounds"})


def plain_sgd(config: dict) -> bool:
    """A run without local momentum: D-PSGD, DFedAvg, FedAvg, or any run with momentum 0 (claim f's)."""
    return config.get("algorithm") in PLAIN_SGD or config.get("momentum") == 0


def study_sweeps(out: Path) -> list[str]:
    """The study's sweeps, relative to OUT: its parts and their close-seed sweeps."""
    found = [p for p in PARTS if (out / p / "sweep.toml").is_file()]
    return found + [f"close-seeds/{p.name}" for p in sorted((out / "close-seeds").glob("*--*"))
                    if (p / "sweep.toml").is_file()]


def long_spec(base: dict, vary: dict, long_rounds: int) -> tuple[dict, dict] | None:
    """A sweep's plain-SGD runs with `long_rounds`: (base, vary) keeping the run names and seeds; None if the sweep
    has no plain-SGD run."""
    algorithms = vary.get("algorithm", [base.get("algorithm")])
    keep = [a for a in algorithms if plain_sgd({**base, "algorithm": a})]
    if not keep:
        return None
    return {**base, "rounds": long_rounds}, ({**vary, "algorithm": keep} if "algorithm" in vary else dict(vary))


def run_long(out: Path, regime: Regime, parallel: int) -> None:
    """Every plain-SGD run of the study again with `regime.long_rounds` rounds, under OUT/long/ with the same layout.
    Each starts from a copy of its `rounds`-round run when that completed (resuming a checkpoint is exact, so this
    equals a run from scratch and saves a third of the work); the sweep then resumes it because `rounds` grew."""
    import shutil

    from dfl.workflows.sweep import Sweep, load_sweep, run_sweep

    for part in study_sweeps(out):
        short = load_sweep(out / part / "sweep.toml")
        spec = long_spec(short.base, short.vary, regime.long_rounds)
        if spec is None:
            continue
        sweep = Sweep(base=spec[0], vary=spec[1], name=f"{short.name}-long", parallel=parallel)
        for planned in sweep.plan():
            source, target = out / part / "runs" / planned.name, out / LONG / part / "runs" / planned.name
            summary = source / "summary.json"
            if not target.exists() and summary.is_file() and (source / "checkpoint.pt").is_file() and \
                    json.loads(summary.read_text()).get("status") == "completed":
                shutil.copytree(source, target)
        print(f"\n== {LONG}/{part}: {len(sweep.plan())} plain-SGD runs to {regime.long_rounds} rounds")
        run_sweep(sweep, out / LONG / part, parallel=parallel)


def run_hetero(out: Path, regime: Regime, rho: float, algorithms: list[str], parallel: int) -> None:
    """Claim (f)'s parts: `algorithms` on the ring with plain SGD (FedAvg has no local momentum), at Dirichlet
    ALPHA and at IID, every seed."""
    hetero = {**regime.base(), "topology": "ring", "rho": rho, "momentum": 0.0}
    vary = {"seed": list(range(regime.seeds)), "algorithm": algorithms}
    run_part(out, "hetero-dirichlet", hetero, vary, parallel)
    iid = {k: v for k, v in hetero.items() if k != "alpha"}
    run_part(out, "hetero-iid", {**iid, "partition": "iid"}, vary, parallel)


def accuracy_drop(out: Path, algorithm: str, converged: bool = False) -> dict[int, float]:
    """seed -> test accuracy at IID minus at Dirichlet ALPHA (claim f), over the seeds both parts completed."""
    iid = cell_values(load(out, "hetero-iid", converged), "test_acc", algorithm=algorithm)
    skew = cell_values(load(out, "hetero-dirichlet", converged), "test_acc", algorithm=algorithm)
    return {s: iid[s] - skew[s] for s in set(iid) & set(skew)}


def choose_rho(out: Path, regime: Regime, parallel: int, run: bool = True) -> tuple[float, list[str]]:
    """ρ with the best mean validation accuracy (global_acc_mean on the local validation splits) of DFedSAM on
    the ring over 2 seeds; returns it with the search table's lines. ρ = 0 (no SAM: DFedAvgM with the same
    momentum, data and seeds) runs as a reference and is never chosen: it shows what SAM adds on validation, and
    how the consensus distance moves with ρ (claim e)."""
    base = {**regime.base(), "algorithm": "dfedsam", "topology": "ring", "local_test_fraction": 0.1}
    if run:
        run_part(out, "rho-search", base, {"rho": [0.0, *regime.rhos], "seed": [0, 1]}, parallel)
    scores: dict[float, list[float]] = {}
    consensus: dict[float, list[float]] = {}
    for r in load(out, "rho-search"):
        value = (r.final or {}).get("global_acc_mean")
        if r.status == "completed" and isinstance(value, (int, float)):
            scores.setdefault(r.config["rho"], []).append(value)
            distance = (r.final or {}).get("consensus_distance")
            if isinstance(distance, (int, float)):
                consensus.setdefault(r.config["rho"], []).append(distance)
    if not any(rho > 0 for rho in scores):
        raise SystemExit("rho search: no completed run with a validation accuracy (global_acc_mean); see "
                         f"{out / 'rho-search'}")
    lines = ["| ρ | validation accuracy (%) | consensus distance | runs |", "|---|---|---|---|"]
    for rho in sorted(scores):
        v, c = scores[rho], consensus.get(rho, [])
        shown = f"{sum(c) / len(c):.3g}" if c else "—"
        name = "0 (no SAM: DFedAvgM, reference)" if rho == 0 else f"{rho:g}"
        lines.append(f"| {name} | {100 * sum(v) / len(v):.2f} | {shown} | {len(v)} |")
    scores = {rho: v for rho, v in scores.items() if rho > 0}
    best = max(scores, key=lambda k: (sum(scores[k]) / len(scores[k]), -k))
    if len(scores) > 1 and best in (min(scores), max(scores)):
        lines.append(f"\nThe chosen ρ = {best:g} is at the edge of the searched grid: the best ρ may lie beyond it.")
    return best, lines


# ------------------------------------------------------------------------------------------------ analysis
def cell_values(runs: list, metric: str, **match) -> dict[int, float]:
    """seed -> final `metric` of the completed runs whose config matches `match` (other runs left out)."""
    values = {}
    for r in runs:
        if all(r.config.get(k) == v for k, v in match.items()) and r.status == "completed":
            if metric == "hessian_top_eig":
                found = [m[metric] for m in r.metrics if isinstance(m.get(metric), (int, float))]
                value = found[-1] if found else None
            else:
                value = (r.final or {}).get(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                values[int(r.config["seed"])] = float(value)
    return values


@dataclass
class Comparison:
    label: str  # "A > B"
    diffs: list[float]  # per seed, oriented so that the claim says > 0
    p: float | None  # one-sided paired t-test p-value for mean(d) > 0
    p_opposite: float | None

    @property
    def verdict(self) -> str:
        if len(self.diffs) < 2:
            return "not run"
        if all(d == 0 for d in self.diffs):  # the same numbers seed by seed: the same computation, not noise
            return "identical"
        mean = sum(self.diffs) / len(self.diffs)
        if mean > 0 and self.p is not None and self.p < P_LEVEL:
            return "holds"
        if mean < 0 and self.p_opposite is not None and self.p_opposite < P_LEVEL:
            return "fails"
        return "inconclusive"

    def row(self, scale: float = 100.0, unit: str = " pts") -> str:
        if not self.diffs:
            return f"| {self.label} | — | — | 0 | not run |"
        mean = sum(self.diffs) / len(self.diffs)
        sd = (math.sqrt(sum((d - mean) ** 2 for d in self.diffs) / (len(self.diffs) - 1))
              if len(self.diffs) > 1 else float("nan"))
        p = "—" if self.p is None else f"{self.p:.3g}"
        return (f"| {self.label} | {scale * mean:+.2f} ± {scale * sd:.2f}{unit} | {p} | {len(self.diffs)} | "
                f"**{self.verdict}** |")


def compare(label: str, a: dict[int, float], b: dict[int, float]) -> Comparison:
    """The claim a > b on the seeds both have: paired one-sided t-tests both ways."""
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    if len(diffs) < 2:
        return Comparison(label, diffs, None, None)
    if all(d == diffs[0] for d in diffs):  # no spread: the t statistic is undefined
        return Comparison(label, diffs, 0.0 if diffs[0] > 0 else 1.0, 0.0 if diffs[0] < 0 else 1.0)
    test = stats.ttest_1samp(diffs, 0.0)
    half = float(test.pvalue) / 2
    mean = sum(diffs) / len(diffs)
    return Comparison(label, diffs, half if mean > 0 else 1 - half, half if mean < 0 else 1 - half)


def claim_verdict(comparisons: list[Comparison]) -> str:
    """fails if a comparison fails or is identical (a strict "A > B" is false when A and B are the same runs);
    holds if all hold; not run if none ran; inconclusive otherwise."""
    verdicts = [c.verdict for c in comparisons]
    if not verdicts or all(v == "not run" for v in verdicts):
        return "not run"
    if "fails" in verdicts or "identical" in verdicts:
        return "fails"
    if all(v == "holds" for v in verdicts):
        return "holds"
    return "inconclusive" + (" (some comparisons not run)" if "not run" in verdicts else "")


def claims(out: Path, regime: Regime, converged: bool = False) -> list[tuple[str, str, list[Comparison], str]]:
    """(claim id, statement, comparisons, what the numbers are) for (a)-(f); `converged`: plain-SGD cells at
    long_rounds (their labels say so), the others at rounds."""
    main, comm = load(out, "main", converged), load(out, "dpsgd-equal-comm", converged)
    topos = regime.topologies

    def tag(algorithm):
        return f"{algorithm}@{regime.long_rounds}" if converged and algorithm in PLAIN_SGD else algorithm

    def acc(runs, **match):
        return cell_values(runs, "test_acc", **match)

    def main_acc(algorithm, topology):  # D-PSGD of the main table: equal communication
        if algorithm == "dpsgd":
            return acc(comm, topology=topology)
        return acc(main, algorithm=algorithm, topology=topology)

    out_claims = []
    comps = [compare(f"{tag(a)} on {t2} > on {t1}", main_acc(a, t2), main_acc(a, t1))
             for a in DECENTRALIZED for t1, t2 in zip(topos, topos[1:])]
    out_claims.append(("a", "accuracy ring < grid < exponential < full, every algorithm", comps,
                       "test accuracy difference"))
    order = DECENTRALIZED
    comps = [compare(f"{tag(hi)} > {tag(lo)} on {t}", main_acc(hi, t), main_acc(lo, t))
             for t in topos for lo, hi in zip(order, order[1:])]
    out_claims.append(("b", "DFedSAM-MGS > DFedSAM > DFedAvgM > DFedAvg > D-PSGD (equal communication), every "
                       "topology", comps, "test accuracy difference"))

    def gain(t):
        mgs, sam = main_acc("dfedsam-mgs", t), main_acc("dfedsam", t)
        return {s: mgs[s] - sam[s] for s in set(mgs) & set(sam)}

    comps = [compare(f"MGS gain on {topos[0]} > on {t}", gain(topos[0]), gain(t)) for t in topos[1:]]
    out_claims.append(("c", f"the MGS gain over DFedSAM is largest on the sparsest topology ({topos[0]})", comps,
                       "difference of gains"))

    def hess(a, t):
        return cell_values(main, "hessian_top_eig", algorithm=a, topology=t)

    comps = [compare(f"λ_max(H) dfedavgm > dfedsam on {t}", hess("dfedavgm", t), hess("dfedsam", t)) for t in topos]
    out_claims.append(("d", "SAM gives a smaller top Hessian eigenvalue than no SAM (DFedSAM vs DFedAvgM)", comps,
                       "top Hessian eigenvalue difference"))

    def cons(a, t):
        return cell_values(main, "consensus_distance", algorithm=a, topology=t)

    comps = [compare(f"consensus {hi} > {lo} on {t}", cons(hi, t), cons(lo, t))
             for t in topos if t != "full" for hi, lo in (("dfedavgm", "dfedsam"), ("dfedsam", "dfedsam-mgs"))]
    out_claims.append(("e", "SAM and MGS reduce the consensus distance (full averaging excluded: it is 0)", comps,
                       "consensus distance difference"))

    rounds = f" at {regime.long_rounds} rounds" if converged else ""
    comps = [compare(f"drop IID→Dir({ALPHA}) {dec} > {cen}{rounds}", accuracy_drop(out, dec, converged),
                     accuracy_drop(out, cen, converged)) for dec, cen in HETERO_PAIRS]
    out_claims.append(("f", f"heterogeneity (Dirichlet {ALPHA} vs IID) hurts DFL more than CFL", comps,
                       "difference of accuracy drops"))
    return out_claims


def run_second(out: Path, base: dict, regime: Regime, parallel: int) -> None:
    """The second sweep: the momentum methods on the densest topologies at Dirichlet SECOND_ALPHA."""
    run_part(out, SECOND, {**base, "alpha": SECOND_ALPHA}, {"seed": list(range(regime.seeds)), "algorithm": list(
        SECOND_ALGORITHMS), "topology": list(regime.topologies[-3:])}, parallel)


def second_lines(out: Path, regime: Regime) -> list[str]:
    """Claim (a)'s dense-end comparisons at Dirichlet ALPHA (main part) and SECOND_ALPHA (second sweep), with the
    consensus distance per topology at SECOND_ALPHA."""
    main, second = load(out, "main"), load(out, SECOND)
    if not second:
        return ["not run"]
    topos = regime.topologies[-3:]
    lines = [f"| comparison | Dirichlet {ALPHA} | verdict | Dirichlet {SECOND_ALPHA:g} | verdict | seeds |",
             "|---|---|---|---|---|---|"]
    for a in SECOND_ALGORITHMS:
        for t1, t2 in zip(topos, topos[1:]):
            cells = [compare("", cell_values(runs, "test_acc", algorithm=a, topology=t2),
                             cell_values(runs, "test_acc", algorithm=a, topology=t1)) for runs in (main, second)]
            shown = []
            for c in cells:
                shown += [f"{100 * sum(c.diffs) / len(c.diffs):+.2f} pts" if c.diffs else "—", f"**{c.verdict}**"]
            lines.append(f"| {a} on {t2} > on {t1} | " + " | ".join(shown) + f" | {len(cells[1].diffs)} |")
    lines += ["", f"Test accuracy and consensus distance at Dirichlet {SECOND_ALPHA:g} (mean over seeds):", "",
              "| algorithm | " + " | ".join(f"{t}: accuracy (%), consensus" for t in topos) + " |",
              "|---|" + "---|" * len(topos)]
    for a in SECOND_ALGORITHMS:
        row = []
        for t in topos:
            acc = list(cell_values(second, "test_acc", algorithm=a, topology=t).values())
            cons = list(cell_values(second, "consensus_distance", algorithm=a, topology=t).values())
            row.append(f"{100 * sum(acc) / len(acc):.2f}, {sum(cons) / len(cons):.3g}" if acc and cons else "not run")
        lines.append(f"| {a} | " + " | ".join(row) + " |")
    return lines


def close_cells(out: Path, regime: Regime) -> set[tuple[str, str]]:
    """(algorithm, topology) cells of the main table that take part in an inconclusive accuracy comparison."""
    cells = set()
    for cid, _, comps, _ in claims(out, regime):
        if cid not in ("a", "b", "c"):
            continue
        for c in comps:
            if c.verdict == "inconclusive":
                words = c.label.replace("MGS gain", "dfedsam-mgs dfedsam").split()
                algos = [w for w in words if w in DECENTRALIZED]
                topo = [w for w in words if w in regime.topologies]
                cells.update((a, t) for a in algos for t in topo)
    return cells


def last_fifth_change(run) -> float | None:
    """Test accuracy after the last round minus that at 80% of the rounds (None for a run without both)."""
    if run.status != "completed" or len(run.metrics) < 2:
        return None
    last = run.metrics[-1]
    earlier = [m for m in run.metrics if m["round"] <= 0.8 * last["round"]] or run.metrics[:1]
    return float(last["test_acc"] - earlier[-1]["test_acc"])


def convergence(runs: list) -> tuple[int, int, float]:
    """(converged, completed, mean change): converged = test accuracy within FLAT_POINTS over the last 20% of
    rounds; the mean of that change over the completed runs (nan for none)."""
    changes = [c for c in map(last_fifth_change, runs) if c is not None]
    mean = sum(changes) / len(changes) if changes else float("nan")
    return sum(abs(c) <= FLAT_POINTS for c in changes), len(changes), mean


def convergence_lines(out: Path, regime: Regime) -> list[str]:
    """Per part and algorithm: runs flat over the last 20% of rounds, and the mean change there (a fixed budget
    compares algorithms that are still climbing at their budget, not at their limit: the table says which)."""
    lines = ["| part | rounds | algorithm | flat runs | mean change over the last 20% of rounds (pts) |",
             "|---|---|---|---|---|"]
    for root, rounds in ((out, regime.rounds), (out / LONG, regime.long_rounds)):
        for part in (*PARTS, SECOND) if root == out else PARTS:
            by_algorithm: dict[str, list] = {}
            for r in load(root, part):
                by_algorithm.setdefault(r.config["algorithm"], []).append(r)
            for algorithm, runs in by_algorithm.items():
                flat, total, mean = convergence(runs)
                if total:
                    lines.append(f"| {part} | {rounds} | {algorithm} | {flat} of {total} | {100 * mean:+.2f} |")
    return lines


def cell_table(out: Path, regime: Regime, converged: bool = False) -> list[str]:
    """Test accuracy per algorithm and topology; `converged`: only the plain-SGD rows, at long_rounds."""
    main, comm = load(out / LONG if converged else out, "main"), load(out / LONG if converged else out,
                                                                      "dpsgd-equal-comm")
    lines = ["| algorithm (momentum) | " + " | ".join(regime.topologies) + " |",
             "|---|" + "---|" * len(regime.topologies)]
    rows = [("dpsgd (equal communication: 1 step, 1 gossip / round; 0)", comm, {}),
            ("dpsgd (equal computation: K steps, K gossips / round; 0)", main, {"algorithm": "dpsgd"}),
            ("dfedavg (0)", main, {"algorithm": "dfedavg"}), ("dfedavgm (0.9)", main, {"algorithm": "dfedavgm"}),
            ("dfedsam (0.9)", main, {"algorithm": "dfedsam"}), ("dfedsam-mgs (0.9, Q = 4)", main,
                                                                 {"algorithm": "dfedsam-mgs"})]
    if converged:
        rows = rows[:3]
    for name, runs, match in rows:
        cells = [mean_std(list(cell_values(runs, "test_acc", topology=t, **match).values()))
                 for t in regime.topologies]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def mean_std(values: list[float]) -> str:
    """'mean ± std (n=k)' in percent (the statistic of the reports, `dfl.report.Stat`); 'not run' for no values."""
    from dfl.report import Stat

    stat = Stat.of(values)
    if stat.mean is None:
        return "not run"
    sd = stat.std if stat.std is not None else float("nan")
    return f"{100 * stat.mean:.2f} ± {100 * sd:.2f} (n={stat.n})"


def hetero_table(out: Path, regime: Regime) -> list[str]:
    """Claim (f)'s accuracies: each algorithm at IID and Dirichlet ALPHA, after `rounds` and `long_rounds`."""
    lines = [f"| algorithm | IID, {regime.rounds} rounds | Dir({ALPHA}), {regime.rounds} rounds | IID, "
             f"{regime.long_rounds} rounds | Dir({ALPHA}), {regime.long_rounds} rounds |", "|---|---|---|---|---|"]
    for algorithm in (a for pair in HETERO_PAIRS for a in pair):
        cells = [mean_std(list(cell_values(load(root, part), "test_acc", algorithm=algorithm).values()))
                 for root in (out, out / LONG) for part in ("hetero-iid", "hetero-dirichlet")]
        lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
    return lines


RECORD_FILES = ("sweep.toml", "sweep.json", "config.toml", "summary.json", "metrics.jsonl")


def export_records(out: Path, target: Path) -> int:
    """Copy the study's run records (configs, summaries, metrics, sweep files; no checkpoints or parameters) to
    `target`, keeping the layout, so `--report-only --out TARGET` rebuilds the report from a few MB that can be
    kept with the results. Returns the number of files copied."""
    import shutil

    copied = 0
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if path.is_file() and path.name in RECORD_FILES:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / rel)
            copied += 1
    return copied


def not_completed(out: Path) -> list[str]:
    lines = []
    for root, prefix in ((out, ""), (out / LONG, f"{LONG}/")):
        for part in ("rho-search", *PARTS, SECOND):
            for r in load(root, part):
                if r.status != "completed":
                    lines.append(f"- {prefix}{part}/{r.name}: {r.status} {r.summary.get('error') or ''}".rstrip())
    return lines


def _scale(what: str) -> tuple[float, str]:
    """Accuracy differences in percentage points, other quantities as they are."""
    return (100.0, " (percentage points)") if any(w in what for w in ("accuracy", "drop", "gain")) else (1.0, "")


def plot_claims(out: Path, study: list, suffix: str = "") -> list[Path]:
    """One figure per claim: the per-seed differences of each comparison (0 = no effect), mean ± std."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paths = []
    for cid, statement, comps, what in study:
        scale, unit = _scale(what)
        fig = Figure(figsize=(9.0, 1.8 + 0.35 * max(len(comps), 1)), dpi=110, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        for i, c in enumerate(comps):
            color = {"holds": "C2", "fails": "C3", "identical": "C3"}.get(c.verdict, "C7")
            ax.scatter([scale * d for d in c.diffs], [i] * len(c.diffs), color=color, s=14, alpha=0.7)
            if c.diffs:
                mean = scale * sum(c.diffs) / len(c.diffs)
                ax.plot([mean], [i], "|", color=color, markersize=14, markeredgewidth=2)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(comps)), [f"{c.label} [{c.verdict}]" for c in comps], fontsize=7)
        ax.invert_yaxis()
        # figure-wide title and wrapped label: long tick labels shrink the axes, and an axes title would be clipped
        ax.set_xlabel(textwrap.fill(f"{what} per seed{unit or ''} (dots: seeds, bar: mean; the claim says > 0)",
                                    60), fontsize=8)
        fig.suptitle(textwrap.fill(f"({cid}) {statement}", 90), fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
        path = out / "plots" / f"claim_{cid}{suffix}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
        paths.append(path)
    return paths


def comparison_lines(study: list, only: tuple[str, ...] | None = None, suffix: str = "") -> list[str]:
    """Each claim's comparisons (mean ± std of the per-seed differences, p-value, verdict), as markdown."""
    md = []
    for cid, statement, comps, what in study:
        if only is not None and cid not in only:
            continue
        scale, unit = _scale(what)
        md += [f"\n### ({cid}) {statement}{suffix}: {claim_verdict(comps)}\n", f"Per comparison: mean ± std of the "
               f"per-seed {what}, one-sided paired t-test p-value.\n", "| comparison | difference | p | seeds | "
               "verdict |", "|---|---|---|---|---|", *(c.row(scale, " pts" if unit else "") for c in comps)]
        if any(c.verdict == "identical" for c in comps):
            md.append("\n*identical*: the two cells give the same numbers for every seed, so they are the same "
                      "computation (on `full` with Metropolis weights W = J, so W^Q = W and DFedSAM-MGS is DFedSAM): "
                      "a strict \">\" cannot hold there, and the claim fails on it by construction, not by noise.")
    return md


def report(out: Path, regime: Regime, rho: float, rho_lines: list[str], seconds: float) -> str:
    study = claims(out, regime)
    settled = claims(out, regime, converged=True)
    changed = ("a", "b", "f")  # the claims with a plain-SGD cell; (c)-(e) compare momentum runs only
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or "unknown"
    md = [f"# DFedSAM claims, reproduced ({time.strftime('%Y-%m-%d')}, commit {commit}, {platform.machine()} "
          f"{platform.processor() or ''} {sys.platform}, {seconds / 60:.0f} min this invocation)\n",
          f"Regime: MNIST-1D ({regime.samples} samples), {regime.clients} clients, Dirichlet {ALPHA}, "
          f"{regime.model}, {regime.rounds} rounds, 1 local epoch, batch 32, lr 0.1 × 0.998^t, ρ = {rho:g} "
          f"(searched), Q = 4 for MGS, {regime.seeds} seeds (up to {regime.close_seeds} in close cells). Test "
          "accuracy of the averaged model after the last round, mean ± std over seeds.\n",
          "## Test accuracy (%)\n", *cell_table(out, regime), "",
          f"## Test accuracy (%) of the plain-SGD runs at {regime.long_rounds} rounds\n",
          *cell_table(out, regime, converged=True), "",
          "## Claim (f)'s runs: test accuracy (%) on the ring, plain SGD\n", *hetero_table(out, regime), "",
          "## ρ search (DFedSAM, ring, validation split = 10% of each client's data)\n", *rho_lines, "",
          "## Claims\n", f"At {regime.rounds} rounds: every cell at the same rounds. At convergence: plain-SGD cells "
          f"(momentum 0) at {regime.long_rounds} rounds, the others at {regime.rounds} (where they are flat: see "
          "Convergence).\n", f"| claim | at {regime.rounds} rounds | at convergence |", "|---|---|---|"]
    md += [f"| ({cid}) {statement} | **{claim_verdict(comps)}** | **{claim_verdict(later)}** |"
           for (cid, statement, comps, _), (_, _, later, _) in zip(study, settled)]
    md += comparison_lines(study)
    md.append(f"\n## At convergence: plain-SGD cells at {regime.long_rounds} rounds\n\n(c)-(e) compare momentum runs "
              "only: the same as above.")
    md += comparison_lines(settled, only=changed, suffix=" (at convergence)")
    md.append(f"\n## Second sweep: claim (a)'s dense end at Dirichlet {SECOND_ALPHA:g}\n\nFixed before it ran: if the "
              "dense end is flat at 0.3 because the consensus error of a dense graph is too small to matter, stronger "
              "heterogeneity should bring the ordering back. One-sided paired t-tests as above.\n")
    md += second_lines(out, regime)
    md.append("\n## Convergence (flat: test accuracy within 1 point over the last 20% of rounds)\n")
    md += convergence_lines(out, regime)
    missing = not_completed(out)
    md.append("\n## Runs not completed\n\n" + ("\n".join(missing) if missing else "none"))
    figures = plot_claims(out, study) + plot_claims(out, [c for c in settled if c[0] in changed], "_converged")
    md.append("\n## Figures\n\n" + "\n".join(f"- {p.relative_to(out)}" for p in figures))
    text = "\n".join(md) + "\n"
    (out / "study.md").write_text(text)
    def listed(comps):
        return [{"label": x.label, "diffs": x.diffs, "p": x.p, "verdict": x.verdict} for x in comps]

    (out / "claims.json").write_text(json.dumps(
        {cid: {"statement": s, "verdict": claim_verdict(c), "comparisons": listed(c),
               "verdict_at_convergence": claim_verdict(later), "comparisons_at_convergence": listed(later)}
         for (cid, s, c, _), (_, _, later, _) in zip(study, settled)}, indent=1))
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/reproduce-dfedsam", help="study directory (rerunning resumes)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p.add_argument("--quick", action="store_true", help="a tiny version for CI (8 clients, 4 rounds, 2 seeds)")
    p.add_argument("--rounds", type=int, help="override the regime's rounds")
    p.add_argument("--long-rounds", type=int, help="rounds of the plain-SGD runs' second pass (default 3x rounds)")
    p.add_argument("--samples", type=int, help="override the regime's MNIST-1D num_samples")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing more: write the report from the runs on disk (missing ones: 'not run')")
    p.add_argument("--seeds", type=int, help="override the regime's seeds per cell")
    p.add_argument("--close-seeds", type=int, help="seeds of close cells (default 5; = --seeds: none extra)")
    p.add_argument("--parts", default=",".join(STEPS),
                   help=f"comma-separated steps to run, in the study's order (default: all of {', '.join(STEPS)}); "
                        "the ρ search always runs first; the report marks what was not run 'not run'")
    p.add_argument("--export", metavar="DIR", help="after the report, copy the run records (no checkpoints) to DIR; "
                   "`--report-only --out DIR` rebuilds the report from them")
    args = p.parse_args()
    steps = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown or not steps:
        p.error(f"--parts: unknown step(s) {unknown or args.parts!r}; allowed: {', '.join(STEPS)}")
    regime = QUICK if args.quick else FULL
    if args.rounds:
        regime.rounds = args.rounds
        regime.long_rounds = 3 * args.rounds
    if args.long_rounds:
        regime.long_rounds = args.long_rounds
    if regime.long_rounds <= regime.rounds:
        p.error(f"--long-rounds must exceed the rounds ({regime.rounds}); got {regime.long_rounds}")
    if args.samples:
        regime.samples = args.samples
    if args.seeds:
        regime.seeds = max(args.seeds, 2)
        regime.close_seeds = max(regime.close_seeds, regime.seeds)
    if args.close_seeds:
        regime.close_seeds = max(args.close_seeds, regime.seeds)
    out = Path(args.out)
    tic = time.perf_counter()
    seeds = list(range(regime.seeds))
    rho, rho_lines = choose_rho(out, regime, args.parallel, run=not args.report_only)
    print(f"\nchosen rho = {rho:g}")
    base = {**regime.base(), "rho": rho, "hessian_every": regime.rounds}
    equal_comm = {**{k: v for k, v in regime.base().items() if k != "local_epochs"}, "algorithm": "dpsgd",
                  "local_steps": 1}
    if args.report_only:
        print("\n" + report(out, regime, rho, rho_lines, time.perf_counter() - tic))
        export(out, args.export)
        return
    # seed slowest: every cell gets its first seeds before any gets its last (a study stopped early stays paired)
    if "dpsgd-equal-comm" in steps:  # cheap: first
        run_part(out, "dpsgd-equal-comm", equal_comm, {"seed": seeds, "topology": list(regime.topologies)},
                 args.parallel)
    if "main" in steps:
        run_part(out, "main", base, {"seed": seeds, "algorithm": list(DECENTRALIZED),
                                     "topology": list(regime.topologies)}, args.parallel)
    if "hetero" in steps:
        run_hetero(out, regime, rho, [a for pair in HETERO_PAIRS for a in pair], args.parallel)
    extra = list(range(regime.seeds, regime.close_seeds))
    close = sorted(close_cells(out, regime)) if extra and "close-seeds" in steps else []
    if close:
        print(f"\nclose cells, {len(extra)} more seeds: {close}")
        for a, t in close:  # D-PSGD's main-table cell is the equal-communication one
            part, cell = ("dpsgd-equal-comm", equal_comm) if a == "dpsgd" else ("main", {**base, "algorithm": a})
            run_part(out / "close-seeds", f"{part}--{a}-{t}", {**cell, "topology": t}, {"seed": extra},
                     args.parallel)
    if "long" in steps:
        run_long(out, regime, args.parallel)  # the plain-SGD runs of the parts on disk
    if "second" in steps:
        run_second(out, base, regime, args.parallel)
    print("\n" + report(out, regime, rho, rho_lines, time.perf_counter() - tic))
    print(f"written: {out / 'study.md'}, {out / 'claims.json'}, {out / 'plots'}/")
    export(out, args.export)


def export(out: Path, target: str | None) -> None:
    if target:
        print(f"exported {export_records(out, Path(target))} record files to {target}/ (rebuild: --report-only "
              f"--out {target})")


if __name__ == "__main__":
    main()

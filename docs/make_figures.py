"""Regenerate the figures of the docs (docs/figures/*.png) with the project's own commands, at small sizes.

    python docs/make_figures.py                 # about 2 minutes on 2 idle CPU cores, 3-5 on a busy machine
    python docs/make_figures.py --only claims   # only the studies' figures, from their results (seconds)
    python docs/make_figures.py --only runs     # only the figures drawn from runs (nearly all of the time)

Every figure is made by the project's own code: `dfl sweep` + its report, `dfl topology compare --plot`, `dfl topology
draw` and
`dfl landscape` in a temporary directory, and the reproduction study's own `plot_claims`
(benchmarks/reproduce_dfedsam.py) from its committed results (benchmarks/results/*.json), then copied here:
nothing in docs/figures/ is drawn by hand."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"

# Four topologies, DFedSAM-MGS, MNIST-1D, 16 clients, 30 rounds: the report's accuracy and consensus figures.
SWEEP = """\
[sweep]
name = "docs-topologies"
[base]
clients = 16
rounds = 30
eval_every = 3
progress = false
[vary]
topology = ["ring", "grid", "exponential", "full"]
"""


def dfl(*args: str, cwd: Path) -> None:
    command = [sys.executable, "-m", "dfl.cli", *args]
    print("+ dfl", " ".join(args), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)


def shrink(png: Path) -> None:
    """Keep a committed figure small: 256 colours (the plots use few), optimised PNG."""
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)


# The reproduction study's full run (2026-11-23): per-seed differences of every comparison, and the quantity each
# claim compares (the x axis of its figure).
STUDY = ROOT / "benchmarks" / "results" / "reproduce_dfedsam-2026-11-23.json"
WHAT = {"a": "test accuracy difference", "b": "test accuracy difference", "c": "difference of gains",
        "d": "top Hessian eigenvalue difference", "e": "consensus distance difference",
        "f": "difference of accuracy drops"}


def claim_figures(work: Path) -> list[Path]:
    """docs/figures/claim_{a..f}.png: the study's figures at 100 rounds, redrawn from its committed results."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.reproduce_dfedsam import Comparison, plot_claims

    study = []
    for cid, claim in json.loads(STUDY.read_text()).items():
        comparisons = []
        for c in claim["comparisons"]:
            # the JSON keeps the one-sided p of "> 0"; the other side's is its complement (reproduce_dfedsam.compare)
            comparison = Comparison(c["label"], c["diffs"], c["p"], None if c["p"] is None else 1 - c["p"])
            assert comparison.verdict == c["verdict"], (cid, c)
            comparisons.append(comparison)
        study.append((cid, claim["statement"], comparisons, WHAT[cid]))
    return [Path(shutil.copy(path, FIGURES / path.name)) for path in plot_claims(work, study)]


TOPOLOGY_STUDY = ROOT / "benchmarks" / "results" / "topology-2026-11-28.json"


def topology_study_figure(work: Path) -> list[Path]:
    """docs/figures/topology_study.png: the topology study's accuracy and consensus distance against bytes sent,
    redrawn from its committed results (benchmarks/topology_study.py)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.topology_study import figure

    figure(json.loads(TOPOLOGY_STUDY.read_text())["records"], work / "topology_study.png")
    return [Path(shutil.copy(work / "topology_study.png", FIGURES / "topology_study.png"))]


def run_figures(work: Path) -> list[Path]:
    """accuracy.png, consensus.png (a 4-topology sweep's report), spectral_gap.png, topology_*.png (`dfl topology
    draw`), landscape.png."""
    (work / "topologies.toml").write_text(SWEEP)
    dfl("sweep", "topologies.toml", "--out", "sweep", cwd=work)
    plots = work / "sweep" / "report" / "plots"
    made = [Path(shutil.copy(plots / name, FIGURES / name)) for name in ("accuracy.png", "consensus.png")]
    # drawn into the work directory and copied: dfl overwrites only figures it wrote, and `shrink` drops the
    # metadata by which it recognises them
    dfl("topology", "compare", "--clients", "16", "32", "64", "128", "--topologies", "ring", "grid",
        "exponential", "full", "--plot", "spectral_gap.png", cwd=work)
    dfl("topology", "draw", "one-peer-exponential", "--clients", "8", "--out", "topology_one_peer.png", cwd=work)
    dfl("topology", "draw", "hierarchical", "--clients", "16", "--groups", "4", "--outer", "ring", "--out",
        "topology_hierarchical.png", cwd=work)
    dfl("topology", "draw", "base-graph", "--clients", "6", "--k", "1", "--out", "topology_base_graph.png", cwd=work)
    made += [Path(shutil.copy(work / name, FIGURES / name))
             for name in ("spectral_gap.png", "topology_one_peer.png", "topology_hierarchical.png",
                          "topology_base_graph.png")]
    run = work / "sweep" / "runs" / "topology=ring"
    dfl("landscape", str(run), "--points", "11", "--samples", "500", cwd=work)
    made.append(Path(shutil.copy(run / "plots" / "landscape.png", FIGURES / "landscape.png")))
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("runs", "claims"), help="make only these figures")
    only = parser.parse_args(argv).only
    FIGURES.mkdir(parents=True, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory() as tmp:
        if only != "runs":
            made += claim_figures(Path(tmp)) + topology_study_figure(Path(tmp))
        if only != "claims":
            made += run_figures(Path(tmp))
    for png in made:
        shrink(png)
        print(f"{png.relative_to(ROOT)}: {png.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()

"""benchmarks/topology_study.py: its quick mode runs end to end, its tables, verdicts and figure follow the stated
rules."""

from __future__ import annotations

import json

import pytest

from benchmarks import topology_study as study
from benchmarks.heterogeneity_study import verdict
from tests.helpers import run_script


@pytest.mark.slow  # a subprocess of 6 tiny runs (8 clients, 2 rounds), read back by a second one
def test_the_quick_topology_study_runs_and_writes_its_tables_and_figure(tmp_path):
    results = tmp_path / "results" / "topology-test"
    figure = tmp_path / "topology.png"
    run_script("topology_study.py", "--quick", "--out", str(tmp_path / "runs"), "--results", str(results),
               "--figure", str(figure))
    data = json.loads(results.with_suffix(".json").read_text())
    cells = [(r["algorithm"], r["topology"], r["n"]) for r in data["records"]]
    assert cells == [(a, t, 8) for a in study.ALGORITHMS for t in ("base-1", "one-peer", "matcha")]
    assert all(r["status"] == "completed" and r["curve"] for r in data["records"])
    q = {(r["algorithm"], r["topology"]): r["gossip_steps"] for r in data["records"]}
    assert q[("dfedsam-mgs", "base-1")] == 4 and q[("dpsgd", "base-1")] is None
    assert [e["verdict"] for e in data["expectations"]] == ["not run"] * 5  # n = 8 only: no cell is compared
    text = results.with_suffix(".md").read_text()
    assert "| base-1 |" in text and "## Pre-registered expectations" in text
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a rerun reads the finished runs back instead of running them again
    assert ": completed" not in run_script("topology_study.py", "--quick", "--out", str(tmp_path / "runs"))


def record(algorithm, name, n, seed, acc, consensus=0.1, status="completed"):
    return {"algorithm": algorithm, "topology": name, "n": n, "seed": seed, "status": status,
            **({"test_acc": acc, "consensus_distance": consensus} if status == "completed" else {})}


def test_expectations_follow_the_paired_rule():
    base = [record(a, "base-1", 24, s, 0.60 + 0.01 * s) for a in study.ALGORITHMS for s in range(3)]
    better = [record(a, "one-peer", 24, s, 0.50 + 0.012 * s) for a in study.ALGORITHMS for s in range(3)]
    worse = [record(a, "one-peer", 24, s, 0.70 + 0.01 * s) for a in study.ALGORITHMS for s in range(3)]
    mixed = [record(a, "one-peer", 24, s, acc) for a in study.ALGORITHMS for s, acc in enumerate((0.55, 0.66, 0.60))]
    assert verdict(study.expectations(base + better)[0][2]) == "holds"
    assert verdict(study.expectations(base + worse)[0][2]) == "fails"
    assert verdict(study.expectations(base + mixed)[0][2]) == "inconclusive"
    diverged = [record("dpsgd", "one-peer", 24, 2, None, status="diverged")]
    e1 = study.expectations(base + better[:2] + diverged + better[3:])[0][2][0]
    assert len(e1.diffs) == 2  # the diverged seed drops out
    assert study.cell(base + diverged, "test_acc", 100, 1, algorithm="dpsgd", topology="one-peer", n=24) == \
        "all 1 diverged"


def test_matcha_budget_is_one_expected_peer_per_step():
    import topologies

    for n in (16, 24, 32):
        topo = topologies.build("matcha", n, graph="exponential", budget=study.matcha_budget(n), seed=0)
        mean = sum(topo.out_degrees(t).mean() for t in range(400)) / 400
        assert 0.75 < mean < 1.25, (n, mean)

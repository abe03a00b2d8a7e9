"""benchmarks/byzantine_study.py: its quick mode runs end to end, its tables and verdicts follow the stated rules."""

from __future__ import annotations

import json

import pytest

from benchmarks import byzantine_study as study
from tests.helpers import run_script


@pytest.mark.slow  # two subprocesses of 12 tiny runs: about 5 s alone, more beside another worker
def test_the_quick_byzantine_study_runs_and_writes_its_tables(tmp_path):
    results = tmp_path / "results" / "byzantine-test"
    run_script("byzantine_study.py", "--quick", "--out", str(tmp_path / "runs"), "--results", str(results))
    data = json.loads(results.with_suffix(".json").read_text())
    records = data["records"]
    gossip = [(r["topology"], r["attack"], r["aggregator"]) for r in records if r["block"] == "gossip"]
    assert gossip == [(t, a, g) for t in ("ring", "full") for a in ("none", "gaussian")
                      for g in ("mean", "clipped-gossip")]
    server = [(r["attack"], r["aggregator"]) for r in records if r["block"] == "server"]
    assert server == [(a, g) for a in ("none", "gaussian") for g in ("mean", "krum")]
    # the Byzantine set is drawn from the seed: the same two clients in every attacked run, none without attack
    attacked = {tuple(r["byzantine_clients"]) for r in records if r["attack"] != "none"}
    assert len(attacked) == 1 and len(next(iter(attacked))) == 2
    assert all(r["byzantine_clients"] == [] for r in records if r["attack"] == "none")
    # one seed: no interval, so no expectation can be judged
    assert [e["verdict"] for e in data["expectations"]] == ["not run"] * 5
    text = results.with_suffix(".md").read_text()
    assert text.count("\n| ring |") == 2 and text.count("\n| full |") == 2 and "\n| gaussian |" in text
    # a rerun reads the finished runs back instead of running them again
    assert ": completed" not in run_script("byzantine_study.py", "--quick", "--out", str(tmp_path / "runs"))


def record(topology, attack, rule, seed, acc, status="completed", block="gossip"):
    return {"block": block, "topology": topology, "attack": attack, "aggregator": rule, "seed": seed,
            "status": status, **({"test_acc": acc} if status == "completed" else {})}


def test_diverged_runs_are_counted_apart_and_enter_only_the_wrecked_comparisons_at_chance():
    records = [record("ring", "gaussian", "mean", 0, 0.11), record("ring", "gaussian", "mean", 1, 0.12),
               record("ring", "gaussian", "mean", 2, None, status="diverged")]
    assert study.cell(records) == "11.5 ± 0.7 (1 of 3 diverged)"
    assert study.cell(records[2:]) == "all 1 diverged" and study.cell([]) == "not run"
    assert study.accuracies(records, "gossip", "gaussian", "mean", "ring") == {0: 0.11, 1: 0.12}
    e1 = study.expectations(records)[0][2][0]  # ring: mean under gaussian below 15%
    assert e1.diffs == [0.11, 0.12, study.CHANCE] and e1.verdict == "holds"


def test_a_paired_comparison_fails_only_when_its_whole_interval_is_on_the_wrong_side():
    none = [record("full", "none", "mean", s, a) for s, a in enumerate((0.50, 0.52, 0.51))]

    def e3(median):  # E3 on the full graph: median below mean gossip without attack
        runs = none + [record("full", "none", "median", s, a) for s, a in enumerate(median)]
        return study.expectations(runs)[2][2][1].verdict

    assert e3((0.40, 0.43, 0.41)) == "holds"
    assert e3((0.60, 0.62, 0.61)) == "fails"
    assert e3((0.45, 0.56, 0.50)) == "inconclusive"

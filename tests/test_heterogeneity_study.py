"""benchmarks/heterogeneity_study.py --quick runs end to end and writes its report files (no accuracy asserted:
the quick regime has no accuracy meaning)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_study_runs_every_cell_and_writes_its_report(tmp_path):
    out, results = tmp_path / "study", tmp_path / "results" / "heterogeneity-test"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "heterogeneity_study.py"), "--quick", "--out",
                           str(out), "--results", str(results)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(results.with_suffix(".json").read_text())
    assert [e["id"] for e in record["expectations"]] == [f"E{i}" for i in range(1, 9)]
    assert record["not_completed"] == []
    # every cell has both quick seeds: 3 pairs x 2 algorithms x 2 alphas in part A, 3 variants x 2 alphas in B
    assert len(record["cells"]) == 18 and all(len(c["test_acc"]) == 2 for c in record["cells"])
    assert all(e["verdict"] in ("holds", "fails", "inconclusive") for e in record["expectations"])
    text = results.with_suffix(".md").read_text()
    assert text == (out / "heterogeneity.md").read_text()
    assert "| E8 |" in text and "## Part B" in text and "not run" not in text

"""The runs of a study script: each one run into its own folder once, and read back when the script runs again.

Shared by benchmarks/privacy_study.py and benchmarks/byzantine_study.py (benchmarks/heterogeneity_study.py runs its
grid as a `dfl sweep`).
"""

from __future__ import annotations

import json
from pathlib import Path

FINISHED = ("completed", "diverged")  # a run in one of these states is read back, not run again


def run_or_read(config, run_dir: Path) -> dict:
    """The summary of `config`'s run in `run_dir`: read back when it finished there, else run now (and say so).

    A run that diverges is a result, not an error (its summary says "diverged"; the studies list it and never average
    it in); one line per run made: its name, status, test accuracy and wall time.
    """
    import dfl
    from dfl.errors import DivergenceError

    summary_file = run_dir / "summary.json"
    if summary_file.exists() and json.loads(summary_file.read_text()).get("status") in FINISHED:
        return json.loads(summary_file.read_text())
    try:
        summary = dfl.run(config, out=run_dir, overwrite=True).summary
    except DivergenceError:
        summary = json.loads(summary_file.read_text())
    print(f"{run_dir.name}: {summary['status']} {summary.get('test_acc', float('nan')):.4f} "
          f"({summary.get('wall_seconds', float('nan')):.1f} s)", flush=True)
    return summary

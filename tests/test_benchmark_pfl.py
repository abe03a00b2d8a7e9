"""benchmarks/pfl.py: one pfl round is one dfl round, and the script runs both systems at toy size (pfl is an
optional extra, `pip install -e ".[pfl]"`: these tests skip without it)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import benchmark_module, run_script

pytest.importorskip("pfl", reason="pfl is an optional extra: pip install -e '.[pfl]'")


def test_one_pfl_round_equals_one_dfl_round():
    """Full-batch steps (no sampling on either side), unequal shards: pfl's FederatedAveraging with
    WeightByDatapoints and a central SGD of lr 1 ends at dfl's n_i-weighted FedAvg round, to float precision."""
    import torch

    import dfl

    bench = benchmark_module("pfl.py", "pfl_benchmark")
    workload = bench.Workload(model="mlp", clients=3, rounds=1, samples=200, partition="dirichlet-class", alpha=0.5,
                              batch_size=0, local_steps=3, lr=0.1)
    config, data, *_ = bench.pfl_setup(workload)
    assert len({len(idx) for idx in data.client_indices}) > 1  # unequal n_i: the weighting matters
    record = bench.run_pfl(workload, threads=1)
    pfl_params = torch.cat([torch.tensor(p) for p in record["final_params"]])
    result = dfl.run(config)
    assert not torch.equal(result.params[0], result.initial_params[0])
    assert torch.allclose(result.params[0], pfl_params, atol=1e-6), (result.params[0] - pfl_params).abs().max()
    with pytest.raises(ValueError, match="full-batch"):
        bench.pfl_setup(bench.Workload(model="mlp", clients=3, samples=200, local_steps=3))


def test_pfl_benchmark_runs_both_systems_at_toy_size(tmp_path):
    out = run_script("pfl.py", "--models", "mlp", "--clients", "3", "--rounds", "2", "--repeats", "1",
                     "--samples", "300", "--dfl-threads", "1", "--pfl-workers", "1", "2",
                     "--markdown", str(tmp_path / "r.md"))
    assert re.search(r"dfl 1t\s+[\d.]+ s/round", out) and re.search(r"pfl x2\s+[\d.]+ s/round", out)
    assert re.search(r"pfl x1 / dfl 1t: [\d.]+x", out)
    table = (tmp_path / "r.md").read_text()
    assert "| mlp × 3 |" in table and "pfl 0.6" in table

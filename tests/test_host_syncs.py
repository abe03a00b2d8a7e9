"""No host synchronisation per local step: the synchronous engine's round does the same reads-back and
host-to-device copies whatever its number of local steps (so none per step), evaluation none per batch, and the
asynchronous mode nothing back to the host within a round (`benchmarks/host_syncs.py` counts them on the CPU)."""

from __future__ import annotations

import pytest
import torch

import dfl
from benchmarks.host_syncs import CASES, HostSyncCounter, per_local_step, round_counts

BASE = dfl.Config(clients=8, model="mlp", model_options={"hidden": [16]}, dataset="mnist1d",
                  dataset_options={"num_samples": 600}, batch_size=8, eval_every=1, seed=0, train_eval_samples=50)


def test_the_counter_sees_what_would_synchronise():
    x = torch.arange(6.0)
    with HostSyncCounter() as counter:
        x.sum().item()
        x.tolist()
        bool(x[0] > 0)
        x[x > 2]  # a boolean mask: the host must learn the size
        torch.nonzero(x)
        torch.as_tensor([1, 2])
        y = x * 2 + 1  # none of these
        y.index_select(0, torch.zeros(2, dtype=torch.long, device=x.device))
    assert counter.syncs["item"] == 1 and counter.syncs["tolist"] == 1 and counter.syncs["bool"] == 1
    assert "aten._local_scalar_dense" not in counter.syncs  # item's own, not counted twice
    assert counter.syncs["aten.index (bool mask)"] == 1 and counter.syncs["aten.nonzero"] == 1
    assert counter.uploads["as_tensor"] == 1


@pytest.mark.parametrize("case", CASES)
def test_no_host_sync_per_local_step(case):
    counts = per_local_step(BASE.replace(**CASES[case]))
    assert counts["syncs_per_local_step"] == 0, counts
    assert counts["uploads_per_local_step"] == 0, counts
    # what a round does read back: the finiteness check's count, agreed by all processes
    assert counts["rounds"][0]["syncs"] == 1, counts


def test_no_host_sync_per_local_step_with_uneven_clients():
    """Epoch mode on a Dirichlet split: clients take different numbers of steps and drop out of later steps; the
    rows still taking steps are built once per round, not looked up on the host per step."""
    config = BASE.replace(partition="dirichlet", alpha=0.3)
    one, three = (round_counts(config.replace(local_epochs=e)) for e in (1, 3))
    assert (one["syncs"], one["uploads"]) == (three["syncs"], three["uploads"]), (one, three)


def test_evaluation_reads_back_per_metric_not_per_batch():
    few = round_counts(BASE.replace(eval_batch_size=500), phase="evaluate")
    many = round_counts(BASE.replace(eval_batch_size=16), phase="evaluate")
    assert few["syncs"] == many["syncs"], (few, many)


@pytest.mark.parametrize("algorithm", ["dfedsam", "dpsgd"])
def test_the_asynchronous_mode_reads_nothing_back_within_a_round(algorithm):
    counts = round_counts(BASE.replace(mode="async", algorithm=algorithm, link_latency=0.5, stragglers=0.5))
    assert counts["syncs"] == 1, counts  # the finiteness check only

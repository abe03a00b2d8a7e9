"""Personalized evaluation (`local_test_fraction`): the stratified local split (proportions, rounding, determinism,
what training sees), personal/global accuracy against a per-client reference loop, bad input, the report."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

import dfl
from dfl.config import Config, ConfigError
from dfl.data import FederatedData
from dfl.data.local_test import split_sizes, stratified_split
from dfl.engine.experiment import Experiment
from dfl.engine.validation import validate
from dfl.models import build_model
from dfl.network.comm import LocalCommunicator
from dfl.report import write_report
from dfl.training.clients import ParamLayout
from dfl.training.evaluate import _per_client_batch, client_accuracies, evaluate_row, local_accuracies

CLASSES = 4
SIZES = (2, 3, 9, 14, 25, 40)  # small clients hit the >= 1 train / >= 1 test clamps


def skewed_data(sizes=SIZES, seed: int = 0) -> FederatedData:
    """Clients with different sizes and label mixes (client i leans to label i mod 4), 6 features."""
    g = torch.Generator().manual_seed(seed)
    train = []
    for i, n in enumerate(sizes):
        y = torch.where(torch.rand(n, generator=g) < 0.6, torch.full((n,), i % CLASSES),
                        torch.randint(0, CLASSES, (n,), generator=g))
        train.append((torch.randn(n, 6, generator=g) + y[:, None], y))
    test = (torch.randn(20, 6, generator=g), torch.arange(20) % CLASSES)
    return FederatedData.from_arrays(train=train, test=test, num_classes=CLASSES)


def config(**changes) -> Config:
    values = dict(clients=len(SIZES), rounds=2, eval_every=1, model="mlp", model_options={"hidden": [8]},
                  local_steps=2, batch_size=4, progress=False, train_eval_samples=0, local_test_fraction=0.3,
                  topology="ring", algorithm="dfedsam", eval_batch_size=8)
    return Config(**{**values, **changes})


# ---------------------------------------------------------------------------------------------- the split
def test_split_sizes_round_half_up_and_keep_one_of_each():
    assert split_sizes(np.array([2, 3, 4, 10, 11, 100]), 0.1).tolist() == [1, 1, 1, 1, 1, 10]
    assert split_sizes(np.array([2, 3, 4, 10, 11, 100]), 0.9).tolist() == [1, 2, 3, 9, 10, 90]
    assert split_sizes(np.array([10, 14]), 0.25).tolist() == [3, 4]  # 2.5 -> 3, 3.5 -> 4


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.8])
def test_split_is_stratified_within_rounding(fraction):
    data = skewed_data(sizes=(2, 3, 9, 14, 25, 40, 7, 101))
    split = data.split_local_test(fraction, seed=4)
    before = data.label_histograms()
    test = np.array(split.partition_info()["local_test_label_histograms"])
    t = test.sum(axis=1)
    n = before.sum(axis=1)
    assert t.tolist() == np.clip(np.floor(fraction * n + 0.5), 1, n - 1).astype(int).tolist()
    # each label's share of the test part is its share of the client's data, within rounding
    assert np.all(np.abs(test - t[:, None] * before / n[:, None]) < 1)
    assert np.all(test[before == 0] == 0)
    assert (split.label_histograms() + test == before).all()
    for i in range(data.num_clients):  # train and test parts partition the client's original samples
        train_i, test_i = split.client_indices[i].numpy(), split.local_test_indices[i].numpy()
        assert len(np.intersect1d(train_i, test_i)) == 0
        assert np.array_equal(np.sort(np.r_[train_i, test_i]), np.sort(data.client_indices[i].numpy()))


def test_split_apportions_by_largest_remainder():
    # one client, labels 0..2 with 5, 3, 2 samples, 4 test samples: shares 2.0, 1.2, 0.8 -> 2, 1, 1
    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)
    mask = stratified_split(labels, np.arange(10), np.array([10]), 0.4, seed=0)
    assert np.bincount(labels[mask], minlength=3).tolist() == [2, 1, 1]


def test_split_is_deterministic_in_the_seed():
    data = skewed_data()
    a, b, c = (data.split_local_test(0.3, seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.local_test_indices, b.local_test_indices))
    assert all(torch.equal(x, y) for x, y in zip(a.client_indices, b.client_indices))
    assert any(not torch.equal(x, y) for x, y in zip(a.local_test_indices, c.local_test_indices))
    info = a.partition_info()
    assert info["local_test_fraction"] == 0.3
    assert info["local_test_sizes"] == a.local_test_sizes.tolist()
    assert info["sizes"] == (data.sizes - a.local_test_sizes).tolist()
    assert "local_test_sizes" not in data.partition_info()


def test_training_sees_only_the_local_train_parts():
    data = skewed_data()
    cfg = config(local_steps=None, local_epochs=1)
    exp = Experiment(validate(cfg), data, None, False, LocalCommunicator(len(SIZES)), False)
    split = data.split_local_test(0.3, cfg.seed)
    assert exp.trainer.data.sizes.tolist() == split.sizes.tolist()
    schedule = exp.trainer.schedule(0)
    # one epoch: ceil(n_train / B) steps, and every real sample of the round is one of the client's train rows
    width = schedule.batch_size
    assert schedule.steps_per_client.tolist() == [-(-n // width) for n in split.sizes.tolist()]
    for i in range(len(SIZES)):
        seen = schedule.index[i][schedule.weight[i] > 0]
        assert sorted(seen.tolist()) == sorted(split.client_indices[i].tolist())  # each train sample once
        assert not set(seen.tolist()) & set(split.local_test_indices[i].tolist())


# ---------------------------------------------------------------------------------------------- the metrics
def reference(model, layout, X, mean, data):
    """Per-client loop: evaluate_row of x_i (personal) and of x̄ (global) on client i's local test set."""
    personal, global_ = [], []
    for i, idx in enumerate(data.local_test_indices):
        x, y = data.train_x[idx], data.train_y[idx]
        personal.append(evaluate_row(model, layout, X[i], x, y, 5)[0])
        global_.append(evaluate_row(model, layout, mean, x, y, 5)[0])
    return np.array(personal), np.array(global_)


@pytest.mark.parametrize("chunk, min_per_client", [(0, 1), (1, 1), (4, 1), (4, 16), (0, 64)])
def test_local_accuracies_equal_a_per_client_loop(chunk, min_per_client, device):
    data = skewed_data(sizes=(2, 3, 9, 14, 25, 40, 7, 101, 60)).split_local_test(0.4, seed=0).to(device)
    torch.manual_seed(0)
    model = build_model("mlp", (6,), CLASSES, hidden=[8]).to(device)
    layout = ParamLayout.of(model)
    X = torch.randn(data.num_clients, layout.dim, device=device)
    mean = X.mean(dim=0)
    sizes = data.local_test_sizes.to(device)
    local = (torch.cat(data.local_test_indices).to(device), torch.cumsum(sizes, 0) - sizes, sizes)
    # batch 3 per client: several blocks, and clients drop out of the later ones (test sizes 1 .. 40)
    # min_per_client 16 or 64: fewer, wider blocks (most clients padded and masked)
    personal, global_ = local_accuracies(model, layout, X, mean, data.train_x, data.train_y, local, 3, chunk,
                                         min_per_client)
    want_personal, want_global = reference(model, layout, X, mean, data)
    np.testing.assert_allclose(personal.cpu().numpy(), want_personal, atol=1e-12)
    np.testing.assert_allclose(global_.cpu().numpy(), want_global, atol=1e-12)
    assert 0 < want_personal.mean() < 1 and len(set(want_personal.tolist())) > 2  # not a degenerate model


@pytest.mark.parametrize("chunk, min_per_client", [(0, 1), (4, 1), (4, 32), (0, 1000)])
def test_client_accuracies_equal_a_per_client_loop(chunk, min_per_client, device):
    """Every row of X on the shared test set, whatever the clients per call and the samples per client per call
    (`min_per_client` 1000 > the test set: one call per chunk)."""
    data = skewed_data(sizes=(30,) * 9).to(device)
    torch.manual_seed(0)
    model = build_model("mlp", (6,), CLASSES, hidden=[8]).to(device)
    layout = ParamLayout.of(model)
    X = torch.randn(data.num_clients, layout.dim, device=device)
    x, y = data.train_x[:150], data.train_y[:150]
    accs = client_accuracies(model, layout, X, x, y, 8, chunk, min_per_client)
    want = [evaluate_row(model, layout, X[i], x, y, 7)[0] for i in range(data.num_clients)]
    np.testing.assert_allclose(accs.cpu().numpy(), want, atol=1e-6)
    assert len(set(want)) > 2  # not a degenerate model


def test_evaluation_reads_the_weights_once_per_training_batch():
    """The evaluation batch is split over a chunk's clients with a floor: without one a chunk of 10,000 clients gets
    1 sample per client per call (every layer a matrix-vector product); dfl.run passes the training batch size."""
    assert _per_client_batch(1024, 10_000, 10_000) == 1
    assert _per_client_batch(1024, 10_000, 10_000, min_per_client=32) == 32
    assert _per_client_batch(1024, 16, 16, min_per_client=32) == 256  # small chunks keep the wider rule


def test_client_accuracy_on_all_test_samples_at_scale_warns_and_a_subset_does_not(monkeypatch):
    import warnings

    from dfl.engine import experiment

    monkeypatch.setattr(experiment, "CLIENT_EVAL_WARN_PASSES", 10)  # 6 clients × the test set is far above
    data = skewed_data()
    with pytest.warns(UserWarning, match=r"client_eval_samples = 0: every evaluation runs each of the 6 clients"):
        dfl.run(config(local_test_fraction=0.0, rounds=1, client_eval_samples=0), data=data)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="client_eval_samples")
        result = dfl.run(config(local_test_fraction=0.0, rounds=1, client_eval_samples=5), data=data)
    last = result.history[-1]
    assert last["client_acc_min"] * 5 == pytest.approx(round(last["client_acc_min"] * 5))  # counts out of 5


def test_run_metrics_equal_the_reference(tmp_path, device):
    data = skewed_data()
    cfg = config(device=device, client_chunk=4)
    result = dfl.run(cfg, data=data, out=tmp_path / "run")
    split = data.split_local_test(cfg.local_test_fraction, cfg.seed).to(device)
    torch.manual_seed(0)
    model = build_model("mlp", (6,), CLASSES, hidden=[8]).to(device)
    X = result.params.to(device)
    personal, global_ = reference(model, ParamLayout.of(model), X, X.mean(dim=0), split)
    last = result.history[-1]
    for name, values in (("personal_acc", personal), ("global_acc", global_)):
        # every client counts once (mean of per-client accuracies, not pooled over samples); std over clients
        assert last[f"{name}_mean"] == pytest.approx(values.mean(), abs=1e-6)
        assert last[f"{name}_std"] == pytest.approx(values.std(), abs=1e-6)
        assert last[f"{name}_min"] == pytest.approx(values.min(), abs=1e-6)
        assert result.summary[f"{name}_mean"] == last[f"{name}_mean"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["global_acc_min"] == last["global_acc_min"]
    partition = json.loads((tmp_path / "run" / "partition.json").read_text())
    assert partition["local_test_sizes"] == split.local_test_sizes.tolist()
    assert partition["sizes"] == split.sizes.tolist()


@pytest.mark.parametrize("fraction", [0.0, 0.3])
def test_personal_train_accuracy_equals_a_per_client_loop(fraction, device):
    """`personal_train_eval`: client i's own row on its own training data (the local train part when there are
    local tests), mean/std/min over clients, against evaluate_row per client."""
    data = skewed_data()
    result = dfl.run(config(device=device, client_chunk=4, local_test_fraction=fraction, personal_train_eval=True),
                     data=data)
    split = data.split_local_test(fraction, 0) if fraction else data
    torch.manual_seed(0)
    model = build_model("mlp", (6,), CLASSES, hidden=[8]).to(device)
    layout = ParamLayout.of(model)
    X = result.params.to(device)
    split = split.to(device)
    want = np.array([evaluate_row(model, layout, X[i], split.train_x[idx], split.train_y[idx], 5)[0]
                     for i, idx in enumerate(split.client_indices)])
    last = result.history[-1]
    assert last["personal_train_acc_mean"] == pytest.approx(want.mean(), abs=1e-6)
    assert last["personal_train_acc_std"] == pytest.approx(want.std(), abs=1e-6)
    assert last["personal_train_acc_min"] == pytest.approx(want.min(), abs=1e-6)
    assert len(set(want.tolist())) > 2  # not a degenerate model
    assert ("personal_acc_mean" in last) == bool(fraction)


def test_without_local_tests_there_are_no_personal_metrics():
    result = dfl.run(config(local_test_fraction=0.0, rounds=1), data=skewed_data())
    assert not any(k.startswith(("personal_", "global_acc")) for k in result.history[-1])


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("value", [1.0, 1.5, -0.1, float("nan"), "0.2", True])
def test_fraction_outside_the_interval_is_rejected(value):
    with pytest.raises(ConfigError, match="local_test_fraction"):
        validate(config(local_test_fraction=value))


def test_a_client_that_would_have_no_training_data_is_an_error():
    data = skewed_data(sizes=(5, 1, 6, 4, 7, 8))
    with pytest.raises(ConfigError, match=r"client 1 has 1 sample\(s\); a local test split needs at least 2"):
        dfl.run(config(), data=data)
    with pytest.raises(ValueError, match=r"must be a number in \(0, 1\)"):
        skewed_data().split_local_test(0.0, seed=0)


def test_data_split_twice_is_an_error():
    split = skewed_data().split_local_test(0.3, seed=0)
    with pytest.raises(ValueError, match="already has local test sets"):
        split.split_local_test(0.3, seed=0)
    with pytest.raises(ConfigError, match="pass it unsplit and set local_test_fraction"):
        dfl.run(config(local_test_fraction=0.0), data=split)


# ---------------------------------------------------------------------------------------------- report
def test_report_shows_personal_and_global_accuracy(tmp_path):
    for seed, (personal, global_) in enumerate([(0.80, 0.60), (0.90, 0.64)]):
        path = tmp_path / "runs" / f"s{seed}"
        path.mkdir(parents=True)
        cfg = config(seed=seed, rounds=5)
        (path / "config.toml").write_text(cfg.to_toml())
        record = {"round": 5, "test_acc": 0.5, "train_loss": 0.4, "consensus_distance": 0.01, "bytes_sent_total": 10,
                  "personal_acc_mean": personal, "personal_acc_std": 0.1, "personal_acc_min": personal - 0.2,
                  "global_acc_mean": global_, "global_acc_std": 0.05, "global_acc_min": global_ - 0.1}
        (path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        (path / "summary.json").write_text(json.dumps({
            "algorithm": cfg.algorithm, "topology": cfg.topology, "lambda": 0.5, "gossip_steps": 1,
            "lambda_Q": 0.5, "clients": len(SIZES), "status": "completed", "rounds": 5, "rounds_completed": 5}))
    files = write_report(tmp_path / "runs")
    md = files["report.md"].read_text()
    assert "## Final personalized accuracy" in md and "## Final global accuracy" in md
    assert f"85.00 ± {100 * math.sqrt(0.005):.2f}" in md and f"62.00 ± {100 * math.sqrt(0.0008):.2f}" in md
    rows = list(csv.DictReader(files["runs.csv"].open()))
    assert [float(r["personal_acc_min"]) for r in rows] == pytest.approx([0.6, 0.7])
    assert float(next(csv.DictReader(files["settings.csv"].open()))["global_acc_mean_mean"]) == pytest.approx(0.62)

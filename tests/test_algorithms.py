"""Gossip is exact and the decentralized algorithms keep their special cases (the design contracts "gossip is exact"
and "special cases hold", docs/architecture.md#design-contracts)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl.config import Config
from dfl.engine.validation import resolved
from dfl.errors import ConfigError
from dfl.network.comm import LocalCommunicator
from dfl.network.gossip import Gossip
from dfl.training.local import LocalRule
from tests.helpers import base_config, reference_trainer, small_data


def run(config, data=None):
    return dfl.run(config, data=data or small_data(config.clients))


# ------------------------------------------------------------------ gossip
@pytest.mark.parametrize("Q", [1, 3, 7])
def test_gossip_q_steps_equal_matrix_power(Q, device):
    topo = topologies.build("ring", 10)
    X = torch.randn(10, 33, dtype=torch.float32)
    out = Gossip(topo, LocalCommunicator(10), torch.float32, device).mix(X.to(device), 0, Q)
    reference = np.linalg.matrix_power(topo.W, Q) @ X.double().numpy()
    np.testing.assert_allclose(out.cpu().numpy(), reference, atol=1e-5)


def test_time_varying_gossip_is_product_and_one_peer_exponential_averages_exactly(device):
    topo = topologies.build("one-peer-exponential", 8)
    X = torch.randn(8, 16, dtype=torch.float64)
    gossip = Gossip(topo, LocalCommunicator(8), torch.float64, device)
    expected = X.numpy()
    for s in range(5, 8):
        expected = topo.matrix(s) @ expected
    np.testing.assert_allclose(gossip.mix(X.to(device), 5, 3).cpu().numpy(), expected, atol=1e-12)
    # log2(8) = 3 consecutive steps reach the exact average
    np.testing.assert_allclose(gossip.mix(X.to(device), 0, 3).cpu().numpy(), np.tile(X.mean(0).numpy(), (8, 1)),
                               atol=1e-12)


def test_models_sent_count_out_neighbours_times_q():
    topo = topologies.build("ring", 16)
    gossip = Gossip(topo, LocalCommunicator(16), torch.float32, torch.device("cpu"))
    assert gossip.sends(0, 4).tolist() == [8] * 16


# ------------------------------------------------------------------ algorithms
def test_dfedsam_mgs_round_is_local_sam_then_w_to_the_q(device):
    config = base_config(algorithm="dfedsam-mgs", rho=0.05, gossip_steps=3, rounds=1, device=device)
    data = small_data()
    result = run(config, data)
    # reference: the same local SAM steps, then W^Q in float64
    trainer = reference_trainer(config, data.to(device))
    Y = trainer.train(result.initial_params.to(device), 0, 0.1, LocalRule(rho=0.05, momentum=0.9)).Y.cpu()  # default
    W3 = np.linalg.matrix_power(topologies.build("ring", 8).W, 3)
    np.testing.assert_allclose(result.params.numpy(), W3 @ Y.double().numpy(), atol=1e-5)


def test_dfedsam_with_rho_zero_is_dfedavg(device):
    a = run(base_config(algorithm="dfedsam", rho=0.0, momentum=0.0, device=device))
    b = run(base_config(algorithm="dfedavg", device=device))
    torch.testing.assert_close(a.params, b.params)
    # with the defaults (momentum 0.9 for both: matched momentum) it is DFedAvgM
    c = run(base_config(algorithm="dfedsam", rho=0.0, device=device))
    d = run(base_config(algorithm="dfedavgm", device=device))
    torch.testing.assert_close(c.params, d.params)


def test_dfedsam_mgs_with_one_gossip_step_is_dfedsam(device):
    a = run(base_config(algorithm="dfedsam-mgs", gossip_steps=1, rho=0.02, device=device))
    b = run(base_config(algorithm="dfedsam", rho=0.02, device=device))
    torch.testing.assert_close(a.params, b.params)
    assert [h["test_acc"] for h in a.history] == [h["test_acc"] for h in b.history]


def test_dfedavgm_with_zero_momentum_is_dfedavg_and_momentum_matters(device):
    a = run(base_config(algorithm="dfedavgm", momentum=0.0, device=device))
    b = run(base_config(algorithm="dfedavg", device=device))
    c = run(base_config(algorithm="dfedavgm", device=device))
    torch.testing.assert_close(a.params, b.params)
    assert not torch.allclose(c.params, b.params)


def test_dfedavg_on_full_topology_keeps_consensus(device):
    result = run(base_config(algorithm="dfedavg", topology="full", device=device))
    assert all(h["consensus_distance"] < 1e-10 for h in result.history)
    torch.testing.assert_close(result.params, result.params[:1].expand_as(result.params))


def test_dpsgd_matches_matrix_recursion(device):
    """X^{k+1} = W X^k − γ G(X^k) with full-batch gradients."""
    config = base_config(algorithm="dpsgd", batch_size=0, local_steps=3, rounds=1, device=device)
    data = small_data()
    result = run(config, data)
    trainer = reference_trainer(config, data.to(device))
    W = torch.tensor(topologies.build("ring", 8).W, dtype=torch.float64, device=device)
    X = result.initial_params.clone().to(device)
    schedule = trainer.schedule(0)
    for k in range(3):
        G, _ = trainer.gradient(X, schedule.batch(k))
        X = (W @ X.double()).float() - 0.1 * G
    torch.testing.assert_close(result.params, X.cpu(), atol=1e-5, rtol=1e-5)


def test_consensus_improves_with_more_gossip_steps(device):
    one = run(base_config(algorithm="dfedsam-mgs", gossip_steps=1, rounds=2, device=device))
    many = run(base_config(algorithm="dfedsam-mgs", gossip_steps=10, rounds=2, device=device))
    assert many.history[-1]["consensus_distance"] < one.history[-1]["consensus_distance"]


# ------------------------------------------------------------------ options, metrics, failures
def test_an_option_the_algorithm_does_not_read_is_refused_naming_those_that_do():
    with pytest.raises(ConfigError, match=r"^rho = 0.05 is not read by dfedavg; remove it, or use an algorithm that "
                                          r"reads it: dfedsam, dfedsam-mgs, .*fedsam"):
        run(base_config(algorithm="dfedavg", rho=0.05))
    with pytest.raises(ConfigError, match=r"rho = 0.05 is not read by dpsgd.*; momentum = 0.9 is not read by dpsgd"):
        dfl.validate(dfl.Config(algorithm="dpsgd", rho=0.05, momentum=0.9))  # every one at once
    with pytest.raises(ConfigError, match="asam_eta = 0.5 applies only to sam = asam"):
        dfl.validate(dfl.Config(algorithm="dfedsam", asam_eta=0.5))


def test_metrics_and_bytes(device):
    result = run(base_config(algorithm="dfedsam-mgs", gossip_steps=2, rounds=2, device=device))
    record = result.history[-1]
    for key in ("test_acc", "test_loss", "client_acc_mean", "client_acc_std", "client_acc_min",
                "client_acc_max", "train_loss", "consensus_distance", "bytes_sent", "lr", "seconds_per_round"):
        assert key in record and np.isfinite(record[key]), key
    d = result.params.shape[1]
    assert record["bytes_sent"] == 8 * 2 * 2 * d * 4  # clients × ring degree × Q × model bytes
    assert len(record["client_acc"]) == 8
    assert record["client_acc_min"] <= record["client_acc_mean"] <= record["client_acc_max"]


def test_run_directory_files_and_no_overwrite(tmp_path):
    data = small_data()
    out = tmp_path / "run"
    result = dfl.run(base_config(), data=data, out=out)
    for name in ("config.toml", "metrics.jsonl", "summary.json", "partition.json", "params.pt", "checkpoint.pt"):
        assert (out / name).is_file(), name
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    assert Config.from_toml(out / "config.toml") == resolved(result.config)  # with the defaults the run resolved
    saved = torch.load(out / "params.pt")
    torch.testing.assert_close(saved["params"], result.params)
    with pytest.raises(FileExistsError, match="already exists"):
        dfl.run(base_config(), data=data, out=out)
    dfl.run(base_config(), data=data, out=out, overwrite=True)


def test_divergence_stops_with_round_and_clients_and_keeps_metrics(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(dfl.DivergenceError, match=r"round \d+.*client"):
        dfl.run(base_config(lr=1e30, rounds=5), data=small_data(), out=out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and "round" in summary["error"]


def test_same_seed_same_result_and_different_seed_differs(device):
    a = run(base_config(device=device))
    b = run(base_config(device=device))
    c = run(base_config(seed=1, device=device))
    torch.testing.assert_close(a.params, b.params)
    assert not torch.allclose(a.params, c.params)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"algorithm": "fedsgd"}, "algorithm must be one of"),
        ({"topology": "moebius"}, "topology must be one of"),
        ({"rounds": 0}, "rounds must be >= 1"),
        ({"lr": -1.0}, "lr must be > 0"),
        ({"local_epochs": 1, "local_steps": 2}, "only one of local_epochs and local_steps"),
        ({"momentum": 1.5}, "momentum must be in"),
        ({"sam": "gsam"}, "sam must be one of"),
        ({"clients": 5}, "clients = 5 but the given data has 8"),
    ],
)
def test_bad_config_is_a_clear_error(changes, match):
    with pytest.raises(ValueError, match=match):
        run(base_config(**changes), data=small_data())


def test_centralized_runs_record_full_topology_and_average_loss_over_participants():
    full = run(base_config(algorithm="fedavg", rounds=1))
    part = run(base_config(algorithm="fedavg", rounds=1, participation=0.25))
    assert full.summary["topology"] == "full" and full.summary["lambda"] == pytest.approx(0.0, abs=1e-12)
    # 2 of 8 clients train; their mean loss is on the scale of the full-participation loss, not a quarter of it
    assert part.history[0]["train_loss"] > 0.5 * full.history[0]["train_loss"]
    with pytest.raises(ConfigError, match="topology = 'grid': fedavg is centralized .* reads no topology"):
        dfl.validate(base_config(algorithm="fedavg", rounds=1, topology="grid"))

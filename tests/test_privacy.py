"""Client-level differential privacy (`dfl.training.privacy`, `dfl.training.accountant`, the `dp_*` options).

The mechanism: the clipping is exact, the noise has std σC and is a function of (seed, client, release) only, σ = 0
with a clip no update reaches is the run without DP bit for bit. The accountant: ε is the Gaussian mechanism's RDP
converted as Balle et al. (2020) do, grows with the releases and shrinks with σ. The algorithms that take DP: after
one round, changing one client's data moves every other client's model (what it received) by at most a few C, so
nothing unclipped leaves a client. Refusals come before torch loads; a world of two, a resumed run and partial
participation give what they must.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dfl
from dfl import algorithms
from dfl.data import draws
from dfl.errors import ConfigError
from dfl.training import accountant, privacy
from dfl.training.privacy import ClientPrivacy, clip_updates, noise_seed
from dfl.training.privacy_settings import PrivacySettings
from tests.helpers import (
    assert_same_history,
    assert_world_of_two_gives_the_single_process_result,
    blob_data,
    interrupted,
    run_script,
    tiny_config,
)

ROOT = Path(__file__).resolve().parents[1]
DP_KEYS = {"dp_epsilon", "dp_delta", "dp_releases"}
# the algorithms whose every message is a post-processing of their trained models (the cards' `dp`)
PRIVATE = {"dfedavg", "dfedavgm", "dfedsam", "dfedsam-mgs", "fedavg", "fedsam", "fedavgsm", "feddyn", "fedgloss",
           "fedprox", "fedadam", "fedyogi", "fedadagrad"}
# servers whose step is normalised per coordinate (η m/(√v + τ)): still a post-processing of the releases, but the
# step is about η per coordinate whatever the clip, so one client's influence is not bounded by a few C
ADAPTIVE_SERVERS = {"fedadam", "fedyogi", "fedadagrad"}


def data(sizes=(10, 12, 9, 11, 10, 8), shift: float = 0.0):
    return blob_data(list(sizes), shift=shift, seed=3)


# ------------------------------------------------------------------------------------------------ the mechanism
def test_clipping_leaves_short_updates_bitwise_and_scales_long_ones_to_exactly_c():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 50, generator=g)
    delta = torch.randn(3, 50, generator=g)
    delta[0] *= 0.5 / delta[0].norm()  # norm 0.5 < C
    delta[1] *= 7.0 / delta[1].norm()  # norm 7 > C
    delta[2] = 0  # no update
    Y = X + delta
    before = Y.clone()
    clip_updates(Y, X, 2.0)
    assert torch.equal(Y[0], before[0]) and torch.equal(Y[2], before[2])
    assert (Y[1] - X[1]).norm().item() == pytest.approx(2.0, rel=1e-6)
    torch.testing.assert_close((Y[1] - X[1]) / 2.0, delta[1] / 7.0)  # the direction is kept


def test_the_noise_has_std_sigma_c_per_coordinate_and_independent_rows():
    settings = PrivacySettings(clip=2.0, noise=0.7, delta=1e-5)
    privacy = ClientPrivacy(settings, seed=5, client_ids=[0, 1, 2, 3])
    d = 200_000
    X = torch.zeros(4, d)
    noise = privacy.release(X.clone(), X, [0, 1, 2, 3], 0)  # Δ = 0: the release is the noise alone
    std = settings.std
    # a sample std of n normal draws is within a few sqrt(1/(2n)) ≈ 0.0016 of the true one (relative): 1.5% is > 9 SE
    for row in noise:
        assert row.std().item() == pytest.approx(std, rel=0.015)
        assert abs(row.mean().item()) < 6 * std / math.sqrt(d)
    corr = torch.corrcoef(noise)
    assert (corr - torch.eye(4)).abs().max().item() < 6 / math.sqrt(d)  # distinct clients draw distinct noise
    assert privacy.releases.tolist() == [1, 1, 1, 1]


def test_a_clients_noise_depends_on_seed_client_and_release_only():
    settings = PrivacySettings(clip=1.0, noise=1.0, delta=1e-5)
    X = torch.zeros(3, 64)
    together = ClientPrivacy(settings, 9, [3, 4, 5]).release(X.clone(), X, [3, 4, 5], 0)
    alone = ClientPrivacy(settings, 9, [5]).release(X[:1].clone(), X[:1], [5], 0)  # another process layout
    assert torch.equal(together[2], alone[0])
    privacy = ClientPrivacy(settings, 9, [5])
    first, second = (privacy.release(X[:1].clone(), X[:1], [5], t) for t in (0, 3))
    assert torch.equal(first, alone) and not torch.equal(first, second)  # the release index moves the draw on
    assert privacy.releases.tolist() == [2]
    with pytest.raises(RuntimeError, match="trained twice in round 3"):  # what bounds the counts the accountant reads
        privacy.release(X[:1].clone(), X[:1], [5], 3)
    assert noise_seed(9, 5, 0) != noise_seed(10, 5, 0) != noise_seed(9, 6, 0)


def test_sigma_zero_and_a_clip_no_update_reaches_is_the_run_without_dp_bit_for_bit():
    for algorithm in ("dfedsam", "fedavg"):
        config = tiny_config(algorithm=algorithm)
        plain = dfl.run(config, data=data())
        private = dfl.run(config.replace(dp_clip=1e30, dp_noise=0.0), data=data())
        assert torch.equal(plain.params, private.params), algorithm
        stripped = [{k: v for k, v in h.items() if k not in DP_KEYS} for h in private.history]
        assert_same_history(stripped, plain.history, algorithm)
        assert [h["dp_epsilon"] for h in private.history] == [None] * 4  # σ = 0: no finite ε
        assert [h["dp_releases"] for h in private.history] == [1, 2, 3, 4]


def test_dp_changes_the_run_and_reports_epsilon_in_metrics_and_summary(tmp_path):
    config = tiny_config(algorithm="dfedsam", dp_clip=0.5, dp_noise=1.0)
    plain = dfl.run(tiny_config(algorithm="dfedsam"), data=data())
    result = dfl.run(config, data=data(), out=tmp_path / "run")
    assert not torch.equal(plain.params, result.params)
    eps = [h["dp_epsilon"] for h in result.history]
    assert eps == [accountant.epsilon(PrivacySettings(0.5, 1.0, 1e-5), t) for t in (1, 2, 3, 4)]
    assert result.summary["dp_epsilon"] == eps[-1] and result.summary["dp"]["sensitivity"] == 1.0
    assert "dp_epsilon" not in plain.history[-1] and "dp" not in plain.summary


# ------------------------------------------------------------------------------------------------ the accountant
def balle_epsilon(noise: float, releases: int, delta: float) -> float:
    """min over a dense grid of α of T α Δ²/(2σ²C²) + log((α−1)/α) − (log δ + log α)/(α − 1) (Δ = 2C)."""
    alpha = np.linspace(1.0005, 5000, 4_000_000)
    rdp = releases * alpha * 4 / (2 * noise ** 2)
    return float(np.min(rdp + np.log((alpha - 1) / alpha) - (np.log(delta) + np.log(alpha)) / (alpha - 1)))


@pytest.mark.parametrize("noise,releases", [(1.0, 1), (2.0, 10), (4.0, 100), (8.0, 1000)])
def test_epsilon_is_the_gaussian_mechanisms_rdp_converted(noise, releases):
    got = accountant.epsilon(PrivacySettings(1.0, noise, 1e-5), releases)
    want = balle_epsilon(noise, releases, 1e-5)
    # the accountant minimizes over its own finite list of orders: never below the dense minimum, and close to it
    assert want - 1e-9 <= got <= want * 1.01


def test_epsilon_grows_with_the_releases_and_shrinks_with_sigma():
    eps = [accountant.epsilon(PrivacySettings(1.0, 2.0, 1e-5), t) for t in (0, 1, 5, 50, 500)]
    assert eps[0] == 0 and all(a < b for a, b in zip(eps, eps[1:]))
    by_sigma = [accountant.epsilon(PrivacySettings(1.0, s, 1e-5), 50) for s in (0.5, 1.0, 2.0, 8.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))
    assert accountant.epsilon(PrivacySettings(1.0, 0.0, 1e-5), 3) == math.inf
    # the clip C cancels out: the noise is σC against a sensitivity 2C
    assert accountant.epsilon(PrivacySettings(5.0, 2.0, 1e-5), 50) == eps[3]


# --------------------------------------------------------------------------------- which algorithms take DP
def test_the_algorithms_that_take_dp_are_those_that_send_only_their_trained_models():
    assert set(algorithms.able("dp")) == PRIVATE
    for name in algorithms.ALGORITHMS.declared():
        assert algorithms.ALGORITHMS.get(name).card.dp == (name in PRIVATE), name  # the class binds its card


@pytest.mark.parametrize("algorithm", sorted(PRIVATE - ADAPTIVE_SERVERS))
def test_one_clients_data_moves_the_others_by_at_most_a_few_clips(algorithm):
    """Client 0's data replaced (inputs scaled ×100, labels changed): after one round, every other client's model —
    built from what it received — moves by at most a few C (the server's or the gossip's weight on client 0's update
    is <= 1, FedDyn and FedGLoSS add one more 1/m share of it), while without DP it moves by far more."""
    clip = 1e-3
    config = tiny_config(algorithm=algorithm, rounds=1, lr=0.5, local_steps=4, topology="full",
                         dp_clip=clip, dp_noise=0.0)
    base = data()
    changed = data()
    changed.train_x[0] = changed.train_x[0] * 100
    changed.train_y[0] = (changed.train_y[0] + 1) % 3

    def others(config, d):
        return dfl.run(config, data=d).params[1:]

    moved = (others(config, base) - others(config, changed)).norm(dim=1).max().item()
    assert moved <= 4 * clip * 1.0001, moved
    plain = config.replace(dp_clip=0.0, dp_noise=None)
    assert (others(plain, base) - others(plain, changed)).norm(dim=1).max().item() > 100 * clip


def test_partial_participation_counts_only_the_rounds_a_client_trained():
    config = tiny_config(algorithm="fedavg", participation=0.5, rounds=6, dp_clip=1.0, dp_noise=1.0)
    result = dfl.run(config, data=data())
    from dfl.algorithms.server import sample_participants

    trained = sum(sample_participants(config.seed, t, 6, 0.5, "uniform").astype(int) for t in range(6))
    assert [h["dp_releases"] for h in result.history][-1] == trained.max() < 6


# ------------------------------------------------------------------------------------------------ refusals
REFUSE = """
import sys
import dfl
from dfl.errors import ConfigError
for changes in {cases}:
    try:
        dfl.validate(dfl.Config(**changes))
        print('accepted', changes)
    except ConfigError as exc:
        print(str(exc).count(chr(10)), str(exc))
print('torch' in sys.modules)
"""

REFUSALS = {
    "dp_noise = 1.0 applies only with differential privacy on": {"dp_noise": 1.0},
    "dp_delta = 0.001 applies only with differential privacy on": {"dp_delta": 1e-3},
    "dp_clip = 1: dsgt sends more than its trained models": {"dp_clip": 1.0, "algorithm": "dsgt"},
    "dp_clip = 1: fedavglm sends more": {"dp_clip": 1.0, "algorithm": "fedavglm"},
    "dp_clip = 1: scaffold sends more": {"dp_clip": 1.0, "algorithm": "scaffold"},
    "dp_clip = 1 does not apply to dpsgd: it sends its model at every": {"dp_clip": 1.0, "algorithm": "dpsgd"},
    "dp_clip = 1 is not available in mode = async": {"dp_clip": 1.0, "algorithm": "dfedsam", "mode": "async"},
    "dp_clip = 1 with aggregation = size": {"dp_clip": 1.0, "algorithm": "fedavg", "aggregation": "size"},
    "dp_clip = 1 with weights = sample-count": {"dp_clip": 1.0, "weights": "sample-count"},
    "dp_clip must be": {"dp_clip": -1.0},
    "dp_delta must be in (0, 1)": {"dp_clip": 1.0, "dp_delta": 1.0},
}


def test_refusals_are_one_line_each_and_come_before_torch_loads():
    cases = list(REFUSALS.values())
    proc = subprocess.run([sys.executable, "-c", REFUSE.format(cases=cases)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "False"  # torch never loaded
    for want, line in zip(REFUSALS, lines[:-1]):
        count, message = line.split(" ", 1)
        assert count == "0" and want in message, (want, line)
    assert "dfedavg, dfedavgm, dfedsam, dfedsam-mgs, fedavg, fedsam, fedavgsm, feddyn, fedgloss" in lines[2]


@pytest.mark.parametrize("changes", [
    {"compressor": "top-k", "algorithm": "dfedavg"},  # CHOCO sends Q(ỹ − x̂): a post-processing of the release
    {"topology": "custom", "algorithm": "dfedavg",  # push-sum sends (w ∘ z + ỹ − z, w): z and w are public
     "topology_options": {"matrix": [[0.5, 0, 0.5], [0.5, 0.5, 0], [0, 0.5, 0.5]]}, "clients": 3},
    {"link_failure": 0.2, "stragglers": 0.5},  # faults decide who hears what, not what a message holds
])
def test_settings_that_only_post_process_the_release_are_accepted(changes):
    config = tiny_config(dp_clip=1.0, **changes)
    dfl.validate(config)


def test_a_wrong_dp_config_is_refused_by_run_too():
    with pytest.raises(ConfigError, match="dp_clip = 1: kgt sends more"):
        dfl.run(tiny_config(algorithm="kgt", dp_clip=1.0), data=data())


# --------------------------------------------------------------------------------- the draws (dfl.data.draws)
def test_a_generator_per_row_gives_the_noise_it_always_gave():
    """The per-row path (the CPU's, and CUDA's for d > 2^16) is bit for bit the loop it replaced."""
    seeds = [noise_seed(9, c, 0) for c in (3, 4, 5)]
    Y = privacy.add_noise(torch.zeros(3, 64), 0.5, seeds)
    before = torch.empty(3, 64)
    generator = torch.Generator()
    for row, seed in enumerate(seeds):
        generator.manual_seed(seed)
        torch.randn(64, generator=generator, out=before[row])
    assert torch.equal(Y, 0.5 * before)


def test_the_batched_counter_draw_is_for_cuda_and_small_rows_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert draws.batched(410, cuda) and draws.batched(2**16, cuda)
    assert not draws.batched(2**16 + 1, cuda) and not draws.batched(410, cpu)


def test_counter_normals_are_standard_and_each_row_a_function_of_its_key(monkeypatch):
    keys = np.array([noise_seed(1, c, 0) for c in range(6)], dtype=np.uint64)
    d = 100_001  # odd: the last Box-Muller pair gives one value
    Z = draws.counter_normals(keys, torch.empty(6, d))
    # rows drawn apart (another world size, chunk or a resume) and in other tiles are the same, bit for bit
    monkeypatch.setattr(draws, "_TILE_ELEMENTS", 4096)
    assert torch.equal(draws.counter_normals(keys[[4, 1]], torch.empty(2, d)), Z[[4, 1]])
    z = Z.double().flatten().numpy()
    from scipy import stats

    assert abs(z.mean()) < 6 / math.sqrt(z.size) and z.std() == pytest.approx(1.0, abs=6 / math.sqrt(2 * z.size))
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert stats.kstest(Z[:, 0::2].flatten().numpy(), "norm").pvalue > 1e-4  # cosines and sines alike
    corr = torch.corrcoef(Z)
    assert (corr - torch.eye(6)).abs().max().item() < 6 / math.sqrt(d)  # distinct clients draw distinct noise
    lag = torch.corrcoef(torch.stack([Z[:, :-1].flatten(), Z[:, 1:].flatten()]))[0, 1].item()
    assert abs(lag) < 6 / math.sqrt(Z.numel())  # neighbouring coordinates independent
    assert torch.equal(draws.counter_normals(keys, torch.empty(6, d, dtype=torch.float64)).float(), Z)


def test_dp_runs_with_the_batched_draw_do_not_depend_on_the_chunk_and_resume_exactly(tmp_path, monkeypatch):
    """The counter-based draw (CUDA's for small models), forced on the CPU: the same run whatever the client chunk
    (rows drawn in other blocks), a resumed run equal to the uninterrupted one, and not the per-row path's numbers."""
    config = tiny_config(dp_clip=0.5, dp_noise=0.8, algorithm="dfedsam")
    per_row = dfl.run(config, data=data())
    monkeypatch.setattr(draws, "batched", lambda d, device: True)
    full = dfl.run(config, data=data(), out=tmp_path / "full")
    assert not torch.equal(full.params, per_row.params)
    chunked = dfl.run(config.replace(client_chunk=4), data=data())
    assert torch.equal(chunked.params, full.params)
    resumed = interrupted(config, 2, tmp_path / "part", data())
    assert torch.equal(resumed.params, full.params)
    assert_same_history(resumed.history, full.history)


# ------------------------------------------------------------------------------ process layout and resume
@pytest.mark.slow
def test_a_world_of_two_gives_the_single_process_result(tmp_path):
    """Two gloo processes (spawned), each holding half the clients, draw every client's noise as one process does."""
    assert_world_of_two_gives_the_single_process_result(tmp_path, {
        "dfedsam": {"algorithm": "dfedsam", "dp_clip": 0.05, "dp_noise": 0.8},
        "fedavg": {"algorithm": "fedavg", "participation": 0.5, "dp_clip": 0.05, "dp_noise": 0.8},
    })


@pytest.mark.parametrize("changes", [
    {"algorithm": "dfedsam-mgs", "gossip_steps": 2},
    {"algorithm": "fedavg", "participation": 0.5},
])
def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path, changes):
    config = tiny_config(dp_clip=0.5, dp_noise=0.8, **changes)
    full = dfl.run(config, data=data(), out=tmp_path / "full")
    resumed = interrupted(config, 2, tmp_path / "part", data())
    assert torch.equal(resumed.params, full.params)
    assert_same_history(resumed.history, full.history)


# ------------------------------------------------------------------------------------------------ the study
@pytest.mark.slow
def test_the_quick_privacy_study_runs_and_writes_its_table(tmp_path):
    results = tmp_path / "results" / "privacy-test"
    run_script("privacy_study.py", "--quick", "--out", str(tmp_path / "runs"), "--results", str(results))
    import json

    records = json.loads(results.with_suffix(".json").read_text())["records"]
    assert [(r["topology"], r["noise"]) for r in records] == [("ring", None), ("ring", 1.0), ("full", None),
                                                              ("full", 1.0)]
    assert all(("dp_epsilon" in r) == (r["noise"] is not None) for r in records)
    text = results.with_suffix(".md").read_text()
    assert text.count("\n| ring |") == 2 and "| full | 0.1 | 1 | 16.5 |" in text

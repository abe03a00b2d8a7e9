"""Base-(k+1), EquiTopo and MATCHA in runs: every algorithm and network model the math allows, one-line refusals
(before torch loads) where it does not, and results that do not depend on the number of processes."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import dfl
from dfl.config import Config
from dfl.errors import ConfigError
from tests.helpers import ROOT, assert_world_size_invariant, blob_data, tiny_config

pytestmark = pytest.mark.timeout(300)

NEW = {
    "base-graph": {"k": 1},
    "simple-base-graph": {"k": 2},
    "d-equistatic": {"M": 3},
    "u-equistatic": {"M": 3},
    "od-equidyn": {},
    "ou-equidyn": {"eta": 0.5, "M": 3},
    "matcha": {"budget": 0.5},
}


def _finite(result) -> None:
    assert result.summary["status"] == "completed"
    assert torch.isfinite(result.params).all()
    assert all(math.isfinite(h["test_acc"]) for h in result.history)


@pytest.mark.parametrize("algorithm", ["dfedsam-mgs", "dpsgd"])
@pytest.mark.parametrize("name", NEW)
def test_tiny_runs_of_every_new_topology(name, algorithm):
    result = dfl.run(tiny_config(algorithm=algorithm, topology=name, topology_options=NEW[name], rounds=2),
                     data=blob_data([6, 7, 8, 6, 7, 8]))
    _finite(result)
    assert result.summary["topology"] == name and result.summary["weights"] == "given"
    assert result.summary["bytes_sent_total"] > 0


@pytest.mark.parametrize("algorithm", ["dsgt", "kgt", "dfedavg"])
@pytest.mark.parametrize("name", ["base-graph", "ou-equidyn", "u-equistatic", "matcha"])
def test_gradient_tracking_and_others_run_on_them(name, algorithm):
    _finite(dfl.run(tiny_config(algorithm=algorithm, topology=name, topology_options=NEW[name], rounds=2),
                    data=blob_data([6, 7, 8, 6, 7, 8])))


@pytest.mark.parametrize("name", ["base-graph", "u-equistatic", "ou-equidyn", "matcha"])
def test_link_failures_on_the_undirected_ones(name):
    result = dfl.run(tiny_config(topology=name, topology_options=NEW[name], link_failure=0.3, rounds=2),
                     data=blob_data([6, 7, 8, 6, 7, 8]))
    _finite(result)
    assert 0 < result.history[-1]["links_up"] <= 1


def test_compression_on_a_static_equitopo():
    result = dfl.run(tiny_config(topology="u-equistatic", topology_options={"M": 4}, compressor="top-k",
                                 compression=0.5, rounds=2), data=blob_data([6, 7, 8, 6, 7, 8]))
    _finite(result)


@pytest.mark.parametrize(("changes", "message"), [
    ({"topology": "d-equistatic", "topology_options": {"M": 3}, "link_failure": 0.1}, "d-equistatic is directed"),
    ({"topology": "od-equidyn", "offline": 0.1}, "od-equidyn is directed"),
    ({"topology": "base-graph", "compressor": "top-k"}, "needs a static topology, but base-graph changes"),
    ({"topology": "matcha", "compressor": "qsgd"}, "needs a static topology, but matcha changes"),
    ({"topology": "ou-equidyn", "mode": "async", "algorithm": "dfedsam"}, "mode = async needs a static topology"),
    ({"topology": "base-graph", "weights": "metropolis"}, "base-graph defines its own weights"),
    ({"topology": "u-equistatic", "weights": "column-stochastic", "topology_options": {"M": 2}},
     "u-equistatic defines its own weights"),
    ({"topology": "d-equistatic"}, "d-equistatic needs option M"),
    ({"topology": "d-equistatic", "topology_options": {"M": 3, "epsilon": 0.5}}, "either M or epsilon"),
    ({"topology": "base-graph", "topology_options": {"k": 0}}, r"topology_options.k must be >= 1"),
    ({"topology": "od-equidyn", "topology_options": {"eta": 1.5}}, r"topology_options.eta must be in \(0, 1\]"),
    ({"topology": "matcha", "topology_options": {"budget": 0}}, r"topology_options.budget must be in \(0, 1\]"),
    ({"topology": "matcha", "topology_options": {"graph": "u-equistatic"}}, "matcha option graph must be"),
    ({"topology": "matcha", "aggregator": "median"}, "matcha's W has negative entries"),
])
def test_refusals_are_one_line_and_before_torch(changes, message):
    with pytest.raises(ConfigError, match=message) as err:
        dfl.validate(Config(**{"clients": 8, **changes}))
    assert "\n" not in str(err.value)


def test_refusals_come_before_torch_loads():
    code = ("import sys, dfl; from dfl.errors import ConfigError\n"
            "try:\n dfl.validate(dfl.Config(clients=8, topology='base-graph', compressor='top-k'))\n"
            "except ConfigError as e:\n print('refused', 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "refused False", out.stderr[-2000:]


def test_a_random_family_follows_the_run_seed():
    data = blob_data([6, 7, 8, 6, 7, 8])
    a = dfl.run(tiny_config(topology="od-equidyn", seed=1, rounds=2), data=data)
    b = dfl.run(tiny_config(topology="od-equidyn", seed=1, rounds=2), data=data)
    c = dfl.run(tiny_config(topology="od-equidyn", seed=1, topology_options={"seed": 7}, rounds=2), data=data)
    torch.testing.assert_close(a.params, b.params, rtol=0, atol=0)
    assert not torch.equal(a.params, c.params)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ou-equidyn", "matcha"])
def test_world_of_two_equals_world_of_one(tmp_path, name):
    config = tiny_config(algorithm="dfedsam-mgs", gossip_steps=2, topology=name, topology_options=NEW[name],
                         rounds=3, dist_timeout=60.0)
    assert_world_size_invariant(tmp_path, config, blob_data([6, 7, 8, 6, 7, 8]))


@pytest.mark.slow
def test_torchrun_world_of_two_equals_world_of_one(tmp_path):
    """od-equidyn (random per step) launched by torchrun on 2 gloo processes: the summary of the 1-process run."""
    import json
    import os

    argv = ["--clients", "4", "--rounds", "2", "--eval-every", "1", "--model", "logreg", "--dataset", "mnist1d",
            "--dataset-options", "num_samples=600", "--local-steps", "2", "--no-progress", "--topology",
            "od-equidyn", "--algorithm", "dfedsam-mgs", "--gossip-steps", "3", "--train-eval-samples", "50",
            "--backend", "gloo", "--dist-timeout", "60"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                           "dfl.cli", "run", *argv, "--out", str(tmp_path / "two")], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    one = subprocess.run([sys.executable, "-m", "dfl.cli", "run", *argv, "--out", str(tmp_path / "one")], env=env,
                         capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stderr[-4000:]
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert (a["processes"], b["processes"]) == (1, 2)
    for key in ("test_acc", "test_loss", "consensus_distance", "train_loss", "bytes_sent_total"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key

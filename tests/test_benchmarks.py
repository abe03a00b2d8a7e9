"""The benchmark scripts run end to end at toy sizes and print their report lines (no timing asserted)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, benchmark_module, run_script


@pytest.mark.slow
def test_throughput_reports_both_loops_and_their_ratio():
    out = run_script("throughput.py", "--clients", "4", "--local-steps", "1", "--rounds", "2", "--model", "mlp",
                     "--threads", "1")
    assert "4 clients × 1 SAM steps, mlp" in out and "median of 2 alternating rounds" in out
    rates = re.findall(r"^\s+(sequential reference|dfl engine):\s+([\d.]+) client-steps/s", out, re.M)
    assert [name for name, _ in rates] == ["sequential reference", "dfl engine"]
    assert all(float(rate) > 0 for _, rate in rates)
    assert re.search(r"speed-up, dfl engine:\s+[\d.]+x", out)
    assert re.search(r"one SAM step = [\d.]+ MFLOP", out)


@pytest.mark.slow
def test_throughput_replays_the_engines_matmuls(tmp_path):
    out = run_script("throughput.py", "--clients", "3", "--local-steps", "2", "--rounds", "1", "--model", "cnn1d",
                     "--threads", "1", "--json", str(tmp_path / "t.json"))
    record = json.loads((tmp_path / "t.json").read_text())
    # cnn1d per SAM step: 2 passes x (2 convolutions, 1 bmm forward; 1 bmm + 1 convolution_backward per layer,
    # the first layer's without an input gradient: 2 bmm + 2 convolution_backward)
    assert record["matmul_kernels"]["calls"] == 2 * 2 * 7
    assert 0 < record["loops"]["matmuls alone"]["fraction_of_peak"]
    assert re.search(r"matmuls alone:.*GFLOP/s \(\d+% of matmul peak", out)
    assert re.search(r"time outside them: -?\d+% of an engine round", out)


def test_recorded_matmuls_are_all_of_the_engines_arithmetic():
    """The recorder sees every matmul kernel of the engine's local training (the batched ones vmap lowers to):
    for an mlp they add up to exactly the FLOPs of the SAM steps counted on the plain model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from dfl.config import Config
    from dfl.data import FederatedData
    from dfl.models import build_model
    from dfl.training.clients import ParamLayout, initial_stack
    from dfl.training.local import LocalRule, LocalTrainer

    throughput = benchmark_module("throughput.py", "throughput")
    clients, steps = 4, 3
    config = Config(clients=clients, model="mlp", batch_size=16, local_steps=steps, seed=0)
    data = FederatedData.build("mnist1d", clients, "iid", seed=0)
    torch.manual_seed(0)
    model = build_model("mlp", tuple(data.input_shape), data.num_classes)
    trainer = LocalTrainer(model, ParamLayout.of(model), data, list(range(clients)), config)
    X = initial_stack(model, clients, torch.device("cpu"))
    rule = LocalRule(rho=0.05)
    trainer.train(X, 0, 0.1, rule)  # the first call also probes the memory plan
    calls = throughput.record_matmuls(lambda: trainer.train(X, 1, 0.1, rule))
    replay = throughput.matmul_replay(calls)
    with FlopCounterMode(display=False) as counter:
        replay()
    x, y = data.train_x[:16], data.train_y[:16]
    assert counter.get_total_flops() == clients * steps * throughput.sam_step_flops(model, x, y, 0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.slow
def test_repeat_runs_benchmark_toy_size():
    out = run_script("repeat_runs.py", "--clients", "6", "--samples", "600", "--runs", "2", "--local-steps", "1",
                     "--client-eval-samples", "50")
    runs = re.findall(r"run (\d): .* peak +([\d.]+) GiB, client_chunk (\d+), test_acc ([\d.]+)", out)
    assert [r[0] for r in runs] == ["1", "2"]
    assert runs[0][3] == runs[1][3]  # same seed, same accuracy
    assert "resident after the last run" in out


@pytest.mark.slow
def test_gossip_benchmark_single_process():
    out = run_script("gossip.py", "--clients", "4", "--dim", "1000", "--worlds", "0", "--repeat", "2", "--copy-mib",
                     "8")
    assert "ring, m=4 clients x d=1000" in out
    assert re.search(r"copy bandwidth .*GB/s", out) and re.search(r"dense matmul W @ X: .*% of copy", out)
    assert re.search(r"engine \(dense\): .*% of copy", out)  # m = 4: the cost rule picks the dense product


@pytest.mark.slow
def test_gossip_benchmark_times_a_round_of_q_steps_three_ways():
    out = run_script("gossip.py", "--clients", "64", "--dim", "500", "--gossip-steps", "4", "--worlds", "0",
                     "--repeat", "2", "--copy-mib", "8")
    assert "gossip round of Q = 4 steps: ring, m=64" in out
    for way in (r"engine \(one circulant pass, 9 offsets\)", "4 steps one by one", r"dense matmul W\^4 @ X"):
        assert re.search(way + r": .*% of copy", out), way


@pytest.mark.slow
def test_scale_benchmark_toy_size():
    out = run_script("scale.py", "--runs", "logreg:40", "mlp:12", "--rounds", "2", "--samples", "6",
                     "--local-steps", "1", "--batch-size", "4", "--client-eval-samples", "10", "--test-fraction", "0.3")
    rows = re.findall(r"^(logreg|mlp)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%", out, re.M)
    assert [(r[0], r[1]) for r in rows] == [("logreg", "40"), ("mlp", "12")]
    assert all(float(r[3]) >= 0 and 0 <= float(r[6]) <= 100 for r in rows)


def _study():
    return benchmark_module("reproduce_dfedsam.py", "reproduce_dfedsam")


def test_study_verdicts_follow_the_paired_test():
    """The study's rule: holds (mean > 0, one-sided paired p < 0.05), fails (the same the other way),
    inconclusive otherwise, not run with < 2 paired seeds; a claim fails if any comparison fails."""
    study = _study()
    base = {0: 0.80, 1: 0.82, 2: 0.79, 3: 0.81}
    better = study.compare("a > b", {s: v + 0.03 + 0.001 * s for s, v in base.items()}, base)
    worse = study.compare("a > b", {s: v - 0.03 - 0.001 * s for s, v in base.items()}, base)
    noisy = study.compare("a > b", {0: 0.85, 1: 0.78, 2: 0.80, 3: 0.80}, base)
    unpaired = study.compare("a > b", {5: 0.9, 6: 0.9}, base)  # no seed in common
    assert (better.verdict, worse.verdict, noisy.verdict, unpaired.verdict) == (
        "holds", "fails", "inconclusive", "not run")
    assert better.p < 0.05 < better.p_opposite
    assert study.claim_verdict([better, noisy]) == "inconclusive"
    assert study.claim_verdict([better, worse]) == "fails"
    assert study.claim_verdict([better, better]) == "holds"
    assert study.claim_verdict([unpaired]) == "not run"
    same = study.compare("a > b", base, base)  # the same runs: a strict ">" is false by construction
    assert same.verdict == "identical" and study.claim_verdict([better, same]) == "fails"
    assert "**holds**" in better.row()


def test_study_long_pass_keeps_the_plain_sgd_runs_with_their_names_and_seeds():
    """The convergence pass reruns exactly the momentum-0 runs (D-PSGD, DFedAvg, FedAvg, any momentum = 0 part)
    with more rounds, keeping every other field, so each run name and seed pairs with its short run."""
    study = _study()
    vary = {"seed": [0, 1], "algorithm": ["dpsgd", "dfedavg", "dfedavgm", "dfedsam"], "topology": ["ring"]}
    base, long_vary = study.long_spec({"rounds": 100, "lr": 0.1}, vary, 300)
    assert base == {"rounds": 300, "lr": 0.1}
    assert long_vary == {**vary, "algorithm": ["dpsgd", "dfedavg"]}
    hetero = {"rounds": 100, "momentum": 0.0}  # claim (f): every algorithm at momentum 0
    assert study.long_spec(hetero, {"algorithm": ["dfedsam", "fedsam"]}, 300)[1] == {"algorithm": ["dfedsam", "fedsam"]}
    assert study.long_spec({"algorithm": "dpsgd"}, {"seed": [3]}, 300) == ({"algorithm": "dpsgd", "rounds": 300},
                                                                            {"seed": [3]})
    assert study.long_spec({"rounds": 100}, {"algorithm": ["dfedavgm", "dfedsam-mgs"]}, 300) is None


def test_study_long_run_not_yet_extended_is_never_counted(tmp_path):
    """A short run copied into OUT/long/ but not resumed yet (fewer rounds than its sweep's base) is listed as
    not extended, never averaged in as a long-budget result."""
    from dfl.report.runs import RunRecord
    from dfl.workflows.sweep import Sweep

    study = _study()
    (tmp_path / "sweep.toml").write_text(Sweep(base={"rounds": 300}, vary={"seed": [0]}).to_toml())
    copied = RunRecord(tmp_path / "runs" / "seed=0", "seed=0", {"rounds": 100}, {"status": "completed"}, [])
    extended = RunRecord(tmp_path / "runs" / "seed=0", "seed=0", {"rounds": 300}, {"status": "completed"}, [])
    assert study.not_extended(copied, tmp_path).status == "not extended to 300 rounds"
    assert study.not_extended(extended, tmp_path).status == "completed"


@pytest.mark.slow
def test_study_runs_only_the_chosen_parts_and_rebuilds_from_exported_records(tmp_path):
    """--parts second: the ρ search and the second sweep, the rest reported "not run"; --export copies the run
    records without checkpoints, and --report-only on the copy gives the same verdicts."""
    out, kept = tmp_path / "study", tmp_path / "records"
    run_script("reproduce_dfedsam.py", "--quick", "--out", str(out), "--parts", "second", "--export", str(kept))
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["alpha-0.05", "plots", "rho-search"]
    claims = json.loads((out / "claims.json").read_text())
    assert claims["b"]["verdict"] == "not run" and claims["f"]["verdict"] == "not run"
    second = (out / "study.md").read_text().split("## Second sweep")[1].split("## Convergence")[0]
    assert second.count("| dfedsam") >= 2 and "not run" not in second.split("Dirichlet 0.05 (mean")[1]
    assert not list(kept.rglob("*.pt")) and (kept / "alpha-0.05" / "sweep.toml").is_file()
    run_script("reproduce_dfedsam.py", "--quick", "--out", str(kept), "--report-only")
    assert json.loads((kept / "claims.json").read_text()) == claims
    assert (kept / "study.md").read_text().split("## Test accuracy")[1] == \
        (out / "study.md").read_text().split("## Test accuracy")[1]


def test_study_rejects_an_unknown_part(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reproduce_dfedsam.py"), "--quick", "--out",
                           str(tmp_path), "--parts", "second,bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--parts: unknown step(s) ['bogus']; allowed: dpsgd-equal-comm" in proc.stderr
    assert not any(tmp_path.iterdir())  # rejected before anything ran


def test_exported_records_are_not_ignored_by_git(tmp_path):
    """An export committed under benchmarks/results keeps its run directories (`<part>/runs/<name>/`): an unanchored
    `runs/` rule in .gitignore would leave them out of the commit."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    exported = "benchmarks/results/reproduce_dfedsam-2099-01-01-records/main/runs/seed=0/metrics.jsonl"
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0

    assert not ignored(exported) and ignored("runs/exp32/metrics.jsonl")


def _flower_script():
    return benchmark_module("flower.py", "flower_benchmark")


def test_flower_benchmark_gives_both_sides_the_same_workload(tmp_path):
    """No Flower needed: the shards the Flower clients load are dfl's client split, the model starts from dfl's
    initial weights, and with full-batch steps (no sampling on either side) the Flower client's loop followed by
    FedAvg's n_i-weighted average is dfl's FedAvg round, to float precision."""
    import torch

    import dfl

    bench = _flower_script()
    workload = bench.Workload(model="mlp", clients=3, rounds=1, samples=200, partition="dirichlet-class", alpha=0.5,
                              batch_size=0, local_steps=3, lr=0.1)
    config, data, model = bench.build(workload)
    assert (config.algorithm, config.aggregation, config.lr, config.lr_decay, config.batch_size,
            config.local_steps, config.clients) == ("fedavg", "size", 0.1, 1.0, 0, 3, 3)
    assert {k: workload.train_config()[k] for k in ("lr", "batch_size", "local_steps", "momentum")} == {
        "lr": 0.1, "batch_size": 0, "local_steps": 3, "momentum": 0.0}
    bench.save_shards(data, tmp_path / "shards.pt")
    blob = torch.load(tmp_path / "shards.pt")
    assert len(blob["shards"]) == 3 and len({len(y) for _, y in blob["shards"]}) > 1  # unequal n_i
    for (x, y), idx in zip(blob["shards"], data.client_indices):
        assert torch.equal(x, data.train_x[idx]) and torch.equal(y, data.train_y[idx])

    result = dfl.run(config)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert result.initial_params.shape[1] == flat.numel() == sum(p.numel() for p in model.parameters())
    assert torch.equal(result.initial_params[0], flat)

    states, sizes = [], []
    for client, (x, y) in enumerate(blob["shards"]):
        local = bench.build(workload)[2]
        bench.train_client(local, x, y, workload.train_config(), 1, client)
        states.append(torch.cat([p.detach().reshape(-1) for p in local.parameters()]))
        sizes.append(len(y))
    weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    averaged = (weights[:, None] * torch.stack(states)).sum(0)
    assert torch.allclose(result.params[0], averaged, atol=1e-5)
    with pytest.raises(ValueError, match="no local momentum"):
        bench.Workload(momentum=0.9).config()


@pytest.mark.slow
def test_flower_benchmark_dfl_side_alone():
    out = run_script("flower.py", "--dfl-only", "--models", "mlp", "--clients", "3", "--rounds", "2", "--repeats",
                     "1", "--samples", "300")
    assert "mlp x 3 clients" in out
    assert re.search(r"dfl:\s+[\d.]+ s/round .* final test acc [\d.]+", out) and "flower" not in out


def test_flower_benchmark_runs_both_systems_at_toy_size(tmp_path):
    pytest.importorskip("flwr", reason="Flower is an optional extra: pip install -e '.[flower]'")
    out = run_script("flower.py", "--models", "mlp", "--clients", "3", "--rounds", "2", "--repeats", "1",
                     "--samples", "300", "--cpus-per-client", "1", "--markdown", str(tmp_path / "r.md"))
    assert re.search(r"dfl:\s+[\d.]+ s/round", out)
    assert re.search(r"flower \(num_cpus 1.0 per client\): [\d.]+ s/round .* flower/dfl [\d.]+x", out)
    table = (tmp_path / "r.md").read_text()
    assert "| mlp × 3 |" in table and "flwr 1." in table


@pytest.mark.slow
def test_rank_memory_benchmark_reports_every_rank_of_each_world(tmp_path):
    """Toy size: torchrun worlds 1 and 2 (gloo), one record per rank with its peak, the table with the ratios."""
    out = run_script("rank_memory.py", "--clients", "6", "--worlds", "1", "2", "--json", str(tmp_path / "r.json"),
                     "--markdown", str(tmp_path / "r.md"))
    records = json.loads((tmp_path / "r.json").read_text())["records"]
    assert [(r["world"], r["rank"], r["exit"]) for r in records] == [(1, 0, 0), (2, 0, 0), (2, 1, 0)]
    assert all(r["peak_rss_bytes"] > 0 and r["clients"] == 6 for r in records)
    assert re.search(r"world 2: rank 0 [\d.]+ GiB \([\d.]+x\), rank 1 [\d.]+ GiB \([\d.]+x\)", out), out
    table = (tmp_path / "r.md").read_text()
    assert table.count("| 6 |") == 3 and "ratio to world 1" in table

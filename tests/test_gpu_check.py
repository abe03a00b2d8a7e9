"""benchmarks/gpu_check.py: its CPU dry run (--allow-cpu, toy sizes) writes a report with every section, and
without CUDA it refuses to run. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = ["# dfl GPU check", "## Summary", "## Device", "## Paper setting", "## Determinism",
            "## Engine paths on a one-rank group", "## Host syncs",
            "## Checkpoint memory", "## Gossip", "## Two processes", "## Throughput", "## Engine tests",
            "## Failures"]
KEYS = ["device", "preflight", "paper", "determinism", "syncs", "engine", "memory", "gossip", "multi", "fp32", "bf16",
        "compile", "tests"]


def run_check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: gpu_check would run")
def test_without_cuda_it_exits_2_with_one_clear_line(tmp_path):
    proc = run_check("--out", str(tmp_path / "report.md"))
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert len(message.splitlines()) == 1 and "no CUDA device" in message and "--allow-cpu" in message
    assert not (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_cpu_dry_run_writes_a_report_with_every_section(tmp_path):
    # --toy keeps toy sizes on a GPU machine too; with no --out the report goes under $OUT. Without pytest's plugins
    # (as on the GPU image, which lacks pytest-markdown-docs that pyproject's addopts names) the test step still runs
    proc = run_check("--allow-cpu", "--quick", "--toy",
                     env=dict(os.environ, OUT=str(tmp_path), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"))
    report = tmp_path / "gpu_report.md"
    assert report.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    text = report.read_text()
    assert proc.returncode == 0, text
    for section in SECTIONS:
        assert f"\n{section}\n" in f"\n{text}", section
    assert "## Failures\n\nnone" in text and "finished in" in text

    data = json.loads((tmp_path / "gpu_report.json").read_text())
    assert data["mode"] == "toy"
    steps = {step["key"]: step for step in data["steps"]}
    assert list(steps) == KEYS
    assert all(step["status"] == "ok" for key, step in steps.items() if key != "compile"), {
        k: (v["status"], v["result"], v["tail"][-600:]) for k, v in steps.items() if v["status"] != "ok"}
    assert steps["compile"]["status"] == "skipped"  # --quick
    assert steps["tests"]["data"]["passed"] >= 1 and steps["tests"]["data"]["failed"] == 0
    assert steps["tests"]["data"]["env"] == f"DFL_TEST_DEVICE={data['device']}"
    for precision in ("fp32", "bf16"):
        record = steps[precision]["data"]["record"]
        assert record["precision"] == precision and record["random_data"] and record["dataset"] == "cifar10"
        assert set(record["loops"]) == {"sequential reference", "dfl engine", "matmuls alone"}
        assert all(loop["client_steps_per_s"] > 0 for loop in record["loops"].values())
        assert record["peak_gflops"] > 0 and record["speedup"]["dfl engine"]["median"] > 0
        assert "random data of CIFAR-10's shape: no --data-root" in steps[precision]["tail"]
        assert f"| {precision} | dfl engine |" in text
    # the engine paths through dfl's own one-rank group (gloo here, NCCL on a GPU), each resumed and compared
    engine = steps["engine"]["data"]
    assert engine["backend"] == "gloo" and len(engine["cases"]) == 6 and "every collective, once" in engine["cases"]
    assert all(case["ok"] and case["max_abs_diff"] <= 1e-4 for case in engine["cases"].values())
    syncs = steps["syncs"]["data"]["record"]
    assert all(v["syncs_per_local_step"] == 0 for k, v in syncs.items() if k != "evaluation")
    memory = steps["memory"]["data"]
    assert 0 < memory["checkpoint_peak_bytes"] <= memory["planned_bytes"]
    assert steps["gossip"]["data"]["method"] and "--worlds 0" in steps["gossip"]["command"]
    # two gloo processes: the same metrics as one, and a SIGKILLed rank named by the other
    # the paper's setting (toy sizes): rounds and the one evaluation timed, the projections under a stable key
    projection = data["projection"]
    assert list(projection) == ["cnn"] and steps["paper"]["data"]["projection"] == projection
    cnn = projection["cnn"]
    assert cnn["rounds_timed"] == 2 and not cnn["from_first_round"] and cnn["evaluation_measured"]
    assert cnn["rounds_1000_s"] == pytest.approx(1000 * cnn["seconds_per_round"] + 100 * cnn["evaluation_s"])
    assert cnn["rounds_500_s"] == pytest.approx(500 * cnn["seconds_per_round"] + 50 * cnn["evaluation_s"])
    assert "| cnn |" in text and "1,000 rounds" in text
    # determinism: the CPU's runs are equal in both modes; the other keys readable at the top level
    assert data["determinism"]["deterministic"]["equal"] and data["determinism"]["fast"]["equal"]
    assert set(data["host_syncs"]["per_round"]) == set(data["host_syncs"]["per_local_step"]) and all(
        v["syncs"] == 1 for v in data["host_syncs"]["per_round"].values())  # the one finiteness read back
    assert set(data["throughput"]) == {"fp32", "bf16"} and data["schema"] == gpu_check.REPORT_SCHEMA
    multi = steps["multi"]["data"]
    assert multi["world2_vs_world1"]["same_count"] and multi["world2_vs_world1"]["max_relative_diff"] <= 1e-3
    assert multi["killed"]["reported"] and "rank 0 stopped because rank 1 stopped responding" in \
        multi["killed"]["rank0_error"]


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    proc = run_check("--dry-run", "--out", str(tmp_path / "report.md"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("gpu_check plan: ") and "budget" in lines[0]
    for n, key in enumerate(gpu_check.STEPS, 1):
        assert any(line.startswith(f"{n:>2}. {key[1]}") for line in lines), key
    assert "benchmarks/gossip.py" in proc.stdout and "--gossip-steps 4" in proc.stdout
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("mode,gpus", [("full", 1), ("quick", 1)])
def test_on_one_gpu_the_step_limits_fit_the_budget_and_seven_minutes(mode, gpus):
    check = gpu_check.Check(gpu_check.parse_args([]), "cuda", mode, Path("report.md"), gpus=gpus)
    assert check.planned_seconds() <= check.budget <= 420
    assert not check.runs("multi") and check.runs("paper")
    plan = check.plan()
    assert "skipped: one GPU" in plan and f"add up to {check.planned_seconds()} s" in plan
    assert "-o addopts=" in plan  # the test step does not depend on the repository's pytest plugins


def test_a_step_whose_limit_does_not_fit_is_skipped_for_the_budget(tmp_path):
    check = gpu_check.Check(gpu_check.parse_args(["--budget", "30"]), "cpu", "toy", tmp_path / "r.md")
    step = check.by_key["paper"]
    check.step_paper(step)
    assert step.status == "skipped" and step.result.startswith("skipped: budget") and not step.failed


def test_projection_takes_the_rounds_after_the_first_and_the_evaluations_of_the_schedule():
    record = {"device": "cuda", "models": {
        "vgg11": {"rounds": [30.0, 12.0, 10.0], "evaluation_s": 4.0, "num_params": 9_000_000, "sync_debug": [3, 2, 2]},
        "resnet18": {"rounds": [50.0], "evaluation_s": 6.0, "cut": "1 round(s)"},
        "cnn": {"rounds": []}}}
    paper = dict(gpu_check.PAPER)
    got = gpu_check.projection(record, paper)
    assert set(got) == {"vgg11", "resnet18"}  # a model with no round timed has no projection
    vgg = got["vgg11"]
    assert vgg["seconds_per_round"] == 12.0 and vgg["rounds_1000_s"] == 12.0 * 1000 + 4.0 * 100
    assert vgg["rounds_500_s"] == 12.0 * 500 + 4.0 * 50 and vgg["sync_debug_per_round"] == 2
    assert got["resnet18"]["from_first_round"] and got["resnet18"]["seconds_per_round"] == 50.0


def test_pack_deps_copies_the_pure_python_dependencies(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "DEPS_DIR", tmp_path / ".gpu_deps")
    assert gpu_check.main(["--pack-deps"]) == 0
    for name in gpu_check.PACKED_DEPS:
        assert (tmp_path / ".gpu_deps" / name / "__init__.py").is_file()
    assert str(tmp_path / ".gpu_deps") in gpu_check.python_path().split(os.pathsep)


@pytest.mark.slow
def test_the_paper_worker_stops_a_run_whose_next_round_would_not_fit_and_still_evaluates(tmp_path):
    paper = dict(gpu_check.MODES["toy"]["paper"], rounds=3)
    out = tmp_path / "paper.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--worker", "paper", "cpu", json.dumps(paper), str(out), "0.5"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cnn = json.loads(out.read_text())["models"]["cnn"]
    assert len(cnn["rounds"]) == 1 and cnn["evaluation_s"] > 0 and cnn["cut"].startswith("1 round(s)")
    got = gpu_check.projection({"models": {"cnn": cnn}}, paper)["cnn"]
    assert got["from_first_round"] and got["evaluation_measured"] and got["cut"]

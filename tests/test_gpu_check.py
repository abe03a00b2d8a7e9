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
SECTIONS = ["# dfl GPU check", "## Summary", "## Device", "## Engine paths on a one-rank group", "## Host syncs",
            "## Checkpoint memory", "## Gossip", "## Two processes", "## Throughput", "## Engine tests",
            "## Failures"]
KEYS = ["device", "preflight", "engine", "syncs", "memory", "gossip", "multi", "fp32", "bf16", "tests", "compile"]


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
    # --toy keeps toy sizes on a GPU machine too; with no --out the report goes under $OUT
    proc = run_check("--allow-cpu", "--quick", "--toy", env=dict(os.environ, OUT=str(tmp_path)))
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


def test_pack_deps_copies_the_pure_python_dependencies(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "DEPS_DIR", tmp_path / ".gpu_deps")
    assert gpu_check.main(["--pack-deps"]) == 0
    for name in gpu_check.PACKED_DEPS:
        assert (tmp_path / ".gpu_deps" / name / "__init__.py").is_file()
    assert str(tmp_path / ".gpu_deps") in gpu_check.python_path().split(os.pathsep)

"""Check dfl's GPU path with one command and write one markdown report.

    python benchmarks/gpu_check.py                 # at most --budget 540 s (estimated 5-8 min on one H100)
    python benchmarks/gpu_check.py --quick         # ~3 minutes (budget 200 s): fewer tests, no compile timing
    python benchmarks/gpu_check.py --allow-cpu     # no GPU: the same steps on the CPU at toy sizes (a dry run)

(The times are estimates: no GPU has run this script yet. The budget is hard: no step starts, or runs on,
past it, so the default stays inside the device tool's 10 minutes per command.)

Steps, in this order (each a subprocess with its own timeout, all within the time budget; a failing step is
recorded with the tail of its output and the check goes on):

  1. device: nvidia-smi, torch.cuda device name and memory, torch / CUDA / cuDNN / Triton versions;
  2. preflight: `import dfl` with this repository on PYTHONPATH (no install needed);
  3. engine tests: `DFL_TEST_DEVICE=cuda python -m pytest -q` on the engine / algorithm equivalence tests;
  4. throughput, fp32 and bf16: benchmarks/throughput.py, ResNet-18 x 100 clients on random CIFAR-10-shaped
     data, vectorized engine vs the sequential reference loop, TFLOP/s and % of the measured matmul peak;
  5. gossip: benchmarks/gossip.py on the device (dense W @ X against the copy bandwidth);
  6. dfl run: a one-process `torchrun ... -m dfl.cli run --device cuda --backend nccl`, seconds per round;
  7. collectives: NCCL all_gather / all_reduce through `DistributedCommunicator` in a world of one (a
     one-process run uses no process group, so step 6 alone never touches NCCL);
  8. throughput with --compile (last: compiling ResNet-18 takes minutes; skipped with --quick).

The report goes to --out, default `$OUT/gpu_report.md` when $OUT is set (the device tool returns files
written there), else `gpu_report.md`; `gpu_report.json` beside it holds the same numbers. Both are
rewritten after every step, so a session cut short still leaves a report. Exit status: 0 when every
step passed, 1 when any failed or ran out of time, 2 when there is no CUDA (without --allow-cpu).

The GPU image has PyTorch but not dfl's small pure-Python dependencies (tomli-w, mnist1d) and no network:
`python benchmarks/gpu_check.py --pack-deps` (on a machine where dfl runs) copies them into `.gpu_deps/`,
which this script puts on PYTHONPATH when it exists; carry that folder to the GPU machine.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPS_DIR = ROOT / ".gpu_deps"
PACKED_DEPS = ("tomli_w", "mnist1d")  # dfl's pure-Python dependencies that the GPU image lacks
NO_CUDA_EXIT = 2
ENGINE_TESTS = ["tests/test_local.py", "tests/test_algorithms.py", "tests/test_centralized.py",
                "tests/test_precision.py", "tests/test_compile.py"]

# Sizes per mode. "toy" is what --allow-cpu runs on a machine without CUDA (and --toy anywhere).
MODES = {
    "full": dict(
        budget=540, tests=ENGINE_TESTS, test_filter="not world_size",  # world-size tests: gloo on the CPU
        model="resnet18", clients=100, local_steps=2, batch_size=32, rounds=3, samples=500, compile=True,
        gossip=["--clients", "100", "--dim", "11200000", "--repeat", "10"],
        run=["--rounds", "3", "--clients", "8", "--eval-every", "1"],
    ),
    "quick": dict(
        budget=200, tests=["tests/test_local.py", "tests/test_algorithms.py", "tests/test_precision.py"],
        test_filter="not world_size",
        model="resnet18", clients=100, local_steps=1, batch_size=32, rounds=2, samples=100, compile=False,
        gossip=["--clients", "100", "--dim", "11200000", "--repeat", "5"],
        run=["--rounds", "3", "--clients", "8", "--eval-every", "1"],
    ),
    "toy": dict(
        budget=300, tests=["tests/test_local.py"], test_filter="vectorized_equals_sequential and sgd",
        model="logreg", clients=2, local_steps=1, batch_size=4, rounds=1, samples=8, compile=True,
        gossip=["--clients", "4", "--dim", "1000", "--repeat", "2", "--copy-mib", "8"],
        run=["--rounds", "1", "--clients", "4", "--dataset-options", "num_samples=600", "--eval-every", "1"],
    ),
}
# Step time limits (s), each further capped by what is left of the budget.
TIMEOUTS = dict(tests=300, fp32=180, bf16=150, gossip=120, run=180, collectives=90, compile=300)


@dataclass
class Step:
    key: str
    title: str
    status: str = "not run"  # ok, FAILED, TIMEOUT, not run, skipped
    seconds: float = 0.0
    result: str = ""  # one line for the summary table
    command: str = ""
    tail: str = ""  # the end of the output, kept for failures
    data: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in ("FAILED", "TIMEOUT", "not run")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="report path (default $OUT/gpu_report.md, else gpu_report.md)")
    p.add_argument("--quick", action="store_true", help="~3 minutes: fewer tests, shorter rounds, no compile")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without CUDA, run the same steps on the CPU at toy sizes instead of exiting 2")
    p.add_argument("--toy", action="store_true", help="toy sizes even on a GPU (a smoke test of this script)")
    p.add_argument("--budget", type=float, default=None,
                   help="total seconds for all steps (default 540 full, 200 --quick, 300 toy)")
    p.add_argument("--test-workers", type=int, default=4,
                   help="pytest-xdist workers for the engine tests on CUDA when xdist is installed (0 = none)")
    p.add_argument("--pack-deps", action="store_true",
                   help=f"copy {', '.join(PACKED_DEPS)} from this Python into .gpu_deps/ (to carry), then exit")
    p.add_argument("--collectives-worker", default=None, help=argparse.SUPPRESS)  # internal: step 7's process
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------- environment
def python_path() -> str:
    """PYTHONPATH for every subprocess: this repository (dfl, topologies, benchmarks) and .gpu_deps."""
    parts = [str(ROOT)] + ([str(DEPS_DIR)] if DEPS_DIR.is_dir() else [])
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def use_local_paths() -> None:
    for path in ([DEPS_DIR] if DEPS_DIR.is_dir() else []) + [ROOT]:
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def pack_deps() -> int:
    DEPS_DIR.mkdir(exist_ok=True)
    for name in PACKED_DEPS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            print(f"gpu_check: {name} is not importable here; install dfl's dependencies first", file=sys.stderr)
            return 1
        source = Path(next(iter(spec.submodule_search_locations)))
        target = DEPS_DIR / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        print(f"copied {source} -> {target}")
    print(f"carry {DEPS_DIR} to the GPU machine (device tool: carry=[\"{DEPS_DIR.name}\"]); gpu_check puts it "
          "on PYTHONPATH")
    return 0


def report_path(out: str | None) -> Path:
    if out:
        return Path(out)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_report.md"
    return Path("gpu_report.md")


def tail(text: str, lines: int = 40, chars: int = 4000) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])[-chars:]


# ---------------------------------------------------------------------------------------------- the check
class Check:
    def __init__(self, args, device: str, mode: str, out: Path):
        self.args = args
        self.device = device  # "cuda" or "cpu"
        self.mode = mode
        self.sizes = MODES[mode]
        self.out = out
        self.budget = args.budget if args.budget is not None else self.sizes["budget"]
        self.compile = self.sizes["compile"] and not args.quick
        self.start = time.monotonic()
        self.started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.finished = False
        self.tmp = Path(tempfile.mkdtemp(prefix="dfl_gpu_check_"))
        self.env = dict(os.environ, PYTHONPATH=python_path(), PYTHONUNBUFFERED="1")
        if device == "cpu":
            self.env.setdefault("OMP_NUM_THREADS", "1")  # toy sizes: no thread oversubscription
        self.steps = [Step("device", "device"), Step("preflight", "preflight: import dfl"),
                      Step("tests", "engine tests"), Step("fp32", "throughput fp32"),
                      Step("bf16", "throughput bf16"), Step("gossip", "gossip bandwidth"),
                      Step("run", "dfl run (torchrun, 1 process)"), Step("collectives", "collectives"),
                      Step("compile", "throughput with compile")]
        self.by_key = {s.key: s for s in self.steps}

    def remaining(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    # ------------------------------------------------------------------ subprocesses
    def run_cmd(self, step: Step, cmd: list[str], limit: float, env: dict | None = None) -> tuple[int | None, str]:
        """Run cmd in its own process group; kill the whole group at the time limit. (rc or None, output)."""
        step.command = shlex.join(cmd).replace(shlex.quote(sys.executable), "python")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=limit)
            return proc.returncode, output
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            return None, output + f"\n[gpu_check: killed after {limit:.0f} s]"

    def limit(self, key: str) -> float | None:
        """This step's time limit: its own, capped by the budget left; None when too little is left."""
        left = self.remaining() - 3
        return None if left < 10 else min(TIMEOUTS[key], left)

    def execute(self, step: Step, fn) -> None:
        print(f"[{self.steps.index(step) + 1}/{len(self.steps)}] {step.title} ...", flush=True)
        tic = time.monotonic()
        try:
            fn(step)
        except Exception as exc:  # a bug in a step's parsing must not lose the other steps
            step.status, step.result = "FAILED", f"{type(exc).__name__}: {exc}"
            step.tail = tail(step.tail + f"\n{type(exc).__name__}: {exc}")
        step.seconds = time.monotonic() - tic
        print(f"    {step.status} ({step.seconds:.1f} s) {step.result}", flush=True)
        self.write()

    def subprocess_step(self, step: Step, key: str, cmd: list[str], env: dict | None = None):
        """Run a step's command; on failure fill status/result/tail and return None, else the output."""
        limit = self.limit(key)
        if limit is None:
            step.status, step.result = "not run", f"time budget ({self.budget:.0f} s) used up"
            return None
        rc, output = self.run_cmd(step, cmd, limit, env)
        step.data["limit_s"] = round(limit)
        if rc is None:
            step.status, step.result, step.tail = "TIMEOUT", f"killed after {limit:.0f} s", tail(output)
            return None
        if rc != 0:
            step.status, step.tail = "FAILED", tail(output)
            step.result = f"exit status {rc}: " + (output.strip().splitlines() or [""])[-1][:200]
            return None
        step.tail = tail(output, lines=15)
        return output

    # ------------------------------------------------------------------ steps
    def step_device(self, step: Step) -> None:
        import torch

        info = {"python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
                "CUDA build": torch.version.cuda or "none", "cpu cores": os.cpu_count(),
                "platform": platform.platform()}
        if torch.backends.cudnn.is_available():
            info["cuDNN"] = torch.backends.cudnn.version()
        for name in ("triton", "numpy"):
            try:
                info[name] = __import__(name).__version__
            except Exception as exc:
                info[name] = f"not importable ({type(exc).__name__})"
        info["C++ compiler"] = next((shutil.which(c) for c in ("g++", "clang++", "c++") if shutil.which(c)), "none")
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update({"GPU": torch.cuda.get_device_name(0), "GPUs visible": torch.cuda.device_count(),
                         "GPU memory": f"{props.total_memory / 2**30:.1f} GiB",
                         "compute capability": f"{props.major}.{props.minor}",
                         "multiprocessors": props.multi_processor_count,
                         "NCCL": ".".join(map(str, torch.cuda.nccl.version()))})
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            info["dfl commit"] = (commit + (" + local changes" if dirty else "")) or "unknown"
        except Exception:
            info["dfl commit"] = "unknown (no git)"
        smi = shutil.which("nvidia-smi")
        if smi:
            try:
                q = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm",
                                    "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
                info["nvidia-smi"] = q.stdout.strip() or q.stderr.strip()
                step.data["nvidia_smi"] = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
            except Exception as exc:
                info["nvidia-smi"] = f"failed: {exc}"
        else:
            info["nvidia-smi"] = "not found"
        step.data["info"] = info
        step.status = "ok"
        step.result = f"{info.get('GPU', 'no GPU: CPU dry run')}, torch {info['torch']}, CUDA {info['CUDA build']}"
        for key, value in info.items():
            print(f"    {key}: {value}")

    def step_preflight(self, step: Step) -> None:
        use_local_paths()
        try:
            import dfl  # noqa: F401
            import topologies  # noqa: F401
        except Exception as exc:
            step.status = "FAILED"
            missing = getattr(exc, "name", None)
            step.result = f"import dfl failed: {type(exc).__name__}: {exc}"
            if missing in PACKED_DEPS:
                step.result += (f" (run `python benchmarks/gpu_check.py --pack-deps` where dfl runs and carry "
                                f"{DEPS_DIR.name}/)")
            step.tail = step.result
            return
        step.status, step.result = "ok", f"dfl from {Path(sys.modules['dfl'].__file__).parent}"
        step.data["deps_dir"] = str(DEPS_DIR) if DEPS_DIR.is_dir() else None

    def step_tests(self, step: Step) -> None:
        junit = self.tmp / "tests.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *self.sizes["tests"], "-k", self.sizes["test_filter"]]
        if self.device == "cuda" and self.args.test_workers > 0 and importlib.util.find_spec("xdist"):
            cmd += ["-n", str(self.args.test_workers)]  # tiny tests are launch-bound: run a few processes at once
        env = dict(self.env, DFL_TEST_DEVICE=self.device)
        output = self.subprocess_step(step, "tests", cmd, env)
        counts = junit_counts(junit) if junit.is_file() else pytest_counts(step.tail if output is None else output)
        step.data.update(counts)
        step.data["env"] = f"DFL_TEST_DEVICE={self.device}"
        text = step.tail if output is None else output
        step.data["failing"] = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)[:30]
        summary = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "errors", "skipped") if counts.get(k))
        if output is not None:
            step.status, step.result = "ok", summary or "no tests ran"
            if not counts.get("passed"):
                step.status = "FAILED"
        elif summary:
            step.result = f"{summary} ({step.result})"

    def throughput(self, step: Step, key: str, precision: str, compile_: bool = False) -> None:
        s = self.sizes
        path = self.tmp / f"throughput_{key}.json"
        cmd = [sys.executable, "benchmarks/throughput.py", "--model", s["model"], "--dataset", "cifar10",
               "--clients", str(s["clients"]), "--local-steps", str(s["local_steps"]),
               "--batch-size", str(s["batch_size"]), "--rounds", str(s["rounds"]),
               "--random-samples", str(s["samples"]), "--precision", precision, "--device", self.device,
               "--json", str(path)]
        if compile_:
            cmd.append("--compile")
        if self.device == "cpu":
            cmd += ["--threads", "1"]
        output = self.subprocess_step(step, key, cmd)
        if output is None:
            return
        record = json.loads(path.read_text())
        step.data["record"] = record
        engine = "dfl engine, compile" if compile_ else "dfl engine"
        loops = record["loops"]
        fast, ref = loops[engine], loops["sequential reference"]
        speed = record["speedup"][engine]["median"]
        step.status = "ok"
        step.result = (f"engine {fast['client_steps_per_s']:.0f} vs sequential {ref['client_steps_per_s']:.0f} "
                       f"client-steps/s ({speed:.2f}x); engine {fast['gflops'] / 1e3:.2f} TFLOP/s = "
                       f"{fast['fraction_of_peak']:.0%} of {record['peak_dtype']} matmul peak "
                       f"{record['peak_gflops'] / 1e3:.1f} TFLOP/s; its matmul kernels alone "
                       f"{loops['matmuls alone']['fraction_of_peak']:.0%}")
        if compile_:
            step.result += f"; first (compiling) round {record['first_round_s'][engine]:.0f} s"

    def step_gossip(self, step: Step) -> None:
        cmd = [sys.executable, "benchmarks/gossip.py", *self.sizes["gossip"], "--worlds", "--device", self.device]
        output = self.subprocess_step(step, "gossip", cmd)
        if output is None:
            return
        copy = re.search(r"copy bandwidth .*?([\d.]+) GB/s", output)
        dense = re.search(r"dense matmul W @ X:\s+([\d.]+) ms .*?([\d.]+) GB/s\s+\(\s*([\d.]+)% of copy\)", output)
        step.data["lines"] = [line for line in output.splitlines() if "GB/s" in line or "gossip step" in line
                              or "multi-process" in line]
        if not (copy and dense):
            step.status, step.result = "FAILED", "could not read gossip.py's output"
            step.tail = tail(output)
            return
        step.data.update(copy_gbs=float(copy.group(1)), matmul_ms=float(dense.group(1)),
                         matmul_gbs=float(dense.group(2)), percent_of_copy=float(dense.group(3)))
        step.status = "ok"
        step.result = (f"W @ X {dense.group(1)} ms, {dense.group(2)} GB/s = {dense.group(3)}% of copy bandwidth "
                       f"{copy.group(1)} GB/s")

    def step_run(self, step: Step) -> None:
        out_dir = self.tmp / "run"
        backend = "nccl" if self.device == "cuda" else "gloo"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=1",
               "-m", "dfl.cli", "run", "--device", self.device, "--backend", backend, *self.sizes["run"],
               "--no-progress", "--out", str(out_dir)]
        output = self.subprocess_step(step, "run", cmd)
        if output is None:
            return
        summary = json.loads((out_dir / "summary.json").read_text())
        rounds = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line]
        per_round = [r["seconds_per_round"] for r in rounds if "seconds_per_round" in r]
        step.data.update(status=summary.get("status"), device=summary.get("device"),
                         rounds=summary.get("rounds_completed"), wall_seconds=summary.get("wall_seconds"),
                         seconds_per_round=per_round, test_acc=summary.get("test_acc"),
                         model=summary.get("model"), dataset=summary.get("dataset"), clients=summary.get("clients"),
                         backend=backend)
        if summary.get("status") != "completed" or not str(summary.get("device", "")).startswith(self.device):
            step.status = "FAILED"
            step.result = f"run status {summary.get('status')!r} on device {summary.get('device')!r}"
            step.tail = tail(output)
            return
        later = per_round[1:] or per_round
        step.status = "ok"
        step.result = (f"completed {summary.get('rounds_completed')} rounds on {summary.get('device')}: "
                       f"{statistics.median(later):.3f} s/round (first round {per_round[0]:.2f} s)")

    def step_collectives(self, step: Step) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--collectives-worker", self.device]
        output = self.subprocess_step(step, "collectives", cmd)
        if output is None:
            return
        line = next((x for x in reversed(output.splitlines()) if x.startswith("{")), None)
        if line is None:
            step.status, step.result, step.tail = "FAILED", "no result line", tail(output)
            return
        step.data.update(json.loads(line))
        errors = ", ".join(f"{k} {v['max_abs_error']:.1e}" for k, v in step.data["results"].items())
        step.status = "ok"
        step.result = f"{step.data['backend']}, world of one: mix_steps max error {errors}"

    # ------------------------------------------------------------------ driver
    def run(self) -> int:
        self.execute(self.by_key["device"], self.step_device)
        self.execute(self.by_key["preflight"], self.step_preflight)
        rest = [("tests", self.step_tests),
                ("fp32", lambda s: self.throughput(s, "fp32", "fp32")),
                ("bf16", lambda s: self.throughput(s, "bf16", "bf16")),
                ("gossip", self.step_gossip),
                ("run", self.step_run),
                ("collectives", self.step_collectives),
                ("compile", lambda s: self.throughput(s, "compile", "fp32", compile_=True))]
        for key, fn in rest:
            step = self.by_key[key]
            if self.by_key["preflight"].status != "ok":
                step.status, step.result = "not run", "dfl does not import (see preflight)"
            elif key == "compile" and not self.compile:
                step.status, step.result = "skipped", "--quick: compiling takes minutes; run without --quick"
            else:
                self.execute(step, fn)
                continue
            self.write()
        failed = [s.title for s in self.steps if s.failed]
        self.finished = True
        self.write()
        shutil.rmtree(self.tmp, ignore_errors=True)
        print(f"report: {self.out}" + (f"; FAILED: {', '.join(failed)}" if failed else "; every step ok"))
        return 1 if failed else 0

    # ------------------------------------------------------------------ the report
    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(render(self))
        data = {"mode": self.mode, "device": self.device, "started": self.started_at, "budget_s": self.budget,
                "elapsed_s": time.monotonic() - self.start, "command": " ".join(sys.argv),
                "steps": [asdict(s) for s in self.steps]}
        self.out.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str) + "\n")


def junit_counts(path: Path) -> dict:
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    total, fails, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"passed": total - fails - errors - skipped, "failed": fails, "errors": errors, "skipped": skipped}


def pytest_counts(text: str) -> dict:
    counts = {}
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", text):
        counts["errors" if word.startswith("error") else word] = int(n)
    return counts


def _fmt_time(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def render(check: Check) -> str:
    s = check.sizes
    elapsed = time.monotonic() - check.start
    lines = [
        "# dfl GPU check", "",
        f"- started {check.started_at}; "
        + (f"finished in {elapsed:.0f} s" if check.finished else f"{elapsed:.0f} s so far (unfinished)")
        + f" of a {check.budget:.0f} s budget",
        f"- command: `{shlex.join(['python', *sys.argv])}`",
        f"- mode: **{check.mode}** on **{check.device}**"
        + (" (toy sizes: a dry run of the script, not a GPU measurement)" if check.mode == "toy" else ""),
        "",
        "## Summary", "",
        "| step | status | time | result |", "| --- | --- | --- | --- |",
    ]
    for step in check.steps:
        status = step.status if step.status in ("ok", "skipped") else f"**{step.status}**"
        lines.append(f"| {step.title} | {status} | {_fmt_time(step.seconds)} | {_cell(step.result)} |")

    device = check.by_key["device"]
    lines += ["", "## Device", "", "| item | value |", "| --- | --- |"]
    lines += [f"| {k} | {_cell(str(v))} |" for k, v in device.data.get("info", {}).items()]
    if device.data.get("nvidia_smi"):
        lines += ["", "```", device.data["nvidia_smi"].rstrip(), "```"]

    tests = check.by_key["tests"]
    lines += ["", "## Engine tests", "",
              f"`{tests.data.get('env', 'DFL_TEST_DEVICE=' + check.device)} {tests.command or '(not run)'}`", "",
              "| passed | failed | errors | skipped |", "| --- | --- | --- | --- |",
              "| " + " | ".join(str(tests.data.get(k, "-")) for k in ("passed", "failed", "errors", "skipped")) + " |"]
    if tests.data.get("failing"):
        lines += ["", "Failing:", *[f"- `{name}`" for name in tests.data["failing"]]]

    lines += ["", "## Throughput", "",
              f"benchmarks/throughput.py: DFedSAM rounds, {s['model']} x {s['clients']} clients, {s['local_steps']} "
              f"local SAM steps of batch {s['batch_size']}, random data of CIFAR-10's shape ({s['samples']} samples "
              f"per client), median of {s['rounds']} alternating rounds after a warm-up. % of peak is against a "
              "large matmul measured in the same process in the run's precision (fp32 = TF32 off).", "",
              "| run | loop | client-steps/s | s/round | TFLOP/s | % of peak | peak TFLOP/s | speed-up |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key in ("fp32", "bf16", "compile"):
        step = check.by_key[key]
        record = step.data.get("record")
        if not record:
            lines.append(f"| {key} | - | {step.status} | | | | | |")
            continue
        for name, loop in record["loops"].items():
            speed = record["speedup"].get(name, {}).get("median")
            lines.append(f"| {key} | {name} | {loop['client_steps_per_s']:.1f} | {loop['seconds_per_round']:.3f} | "
                         f"{loop['gflops'] / 1e3:.3f} | {loop['fraction_of_peak']:.1%} | "
                         f"{record['peak_gflops'] / 1e3:.1f} ({record['peak_dtype']}) | "
                         f"{'' if speed is None else f'{speed:.2f}x'} |")

    gossip = check.by_key["gossip"]
    lines += ["", "## Gossip", "", f"`{gossip.command or 'benchmarks/gossip.py (not run)'}`", ""]
    lines += ["```", *gossip.data.get("lines", ["(no output)"]), "```"]

    run = check.by_key["run"]
    lines += ["", "## dfl run", "", f"`{run.command or '(not run)'}`", "",
              "A world of one: dfl uses its in-process communicator, so the backend flag is validated but no "
              "process group is created (NCCL is exercised under Collectives).", ""]
    if run.data.get("seconds_per_round"):
        lines += ["| status | device | rounds | s/round (each) | wall s | test acc |",
                  "| --- | --- | --- | --- | --- | --- |",
                  f"| {run.data['status']} | {run.data['device']} | {run.data['rounds']} | "
                  f"{', '.join(f'{x:.3f}' for x in run.data['seconds_per_round'])} | "
                  f"{run.data['wall_seconds']:.1f} | {run.data['test_acc']:.3f} |"]

    coll = check.by_key["collectives"]
    lines += ["", "## Collectives", "",
              "`DistributedCommunicator` on a one-process group (NCCL on CUDA, gloo on the CPU): gossip through "
              "all_gather (allgather mode) and all_reduce (complete graph), checked against float64 W² X.", ""]
    if coll.data.get("results"):
        lines += ["| case | max abs error | bytes moved |", "| --- | --- | --- |"]
        lines += [f"| {k} | {v['max_abs_error']:.2e} | {v['bytes_moved']} |" for k, v in coll.data["results"].items()]
    else:
        lines.append(f"({coll.status})")

    failures = [step for step in check.steps if step.failed]
    lines += ["", "## Failures", ""]
    if not failures:
        lines.append("none")
    for step in failures:
        lines += [f"### {step.title}: {step.status}", "", _cell(step.result) or "(no result)", ""]
        if step.command:
            lines += [f"`{step.command}`", ""]
        if step.tail:
            lines += ["```", step.tail, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------- step 7's process
def collectives_worker(device_name: str) -> int:
    """A one-process group (NCCL on CUDA, gloo on the CPU); gossip through DistributedCommunicator."""
    import socket
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    use_local_paths()
    import topologies
    from dfl.engine.distributed import DistributedCommunicator

    device = torch.device(device_name)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    try:
        m, d = 8, 4096
        X = torch.randn(m, d, generator=torch.Generator().manual_seed(0)).to(device)
        results = {}
        for topology, mode in (("ring", "allgather"), ("ring", "p2p"), ("full", "p2p")):
            W = topologies.build(topology, m).matrix(0)
            comm = DistributedCommunicator(m, mode, device)
            Y = comm.mix_steps([W, W], X)
            if device.type == "cuda":
                torch.cuda.synchronize()
            reference = (W @ W) @ X.double().cpu().numpy()
            error = float(np.abs(Y.double().cpu().numpy() - reference).max())
            results[f"{topology}/{mode}"] = {"max_abs_error": error, "bytes_moved": comm.bytes_moved}
        ok = all(r["max_abs_error"] < 1e-4 for r in results.values())
        print(json.dumps({"backend": backend, "device": str(device), "results": results, "ok": ok}))
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.pack_deps:
        return pack_deps()
    if args.collectives_worker:
        return collectives_worker(args.collectives_worker)
    try:
        import torch
    except Exception as exc:
        print(f"gpu_check: cannot import torch ({type(exc).__name__}: {exc})", file=sys.stderr)
        return NO_CUDA_EXIT
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}); run it on a "
              "GPU machine, or pass --allow-cpu for a toy-size dry run on the CPU", file=sys.stderr)
        return NO_CUDA_EXIT
    device = "cuda" if cuda else "cpu"
    mode = "toy" if args.toy or not cuda else ("quick" if args.quick else "full")
    out = report_path(args.out)
    print(f"gpu_check: {mode} mode on {device}, report {out}", flush=True)
    return Check(args, device, mode, out).run()


if __name__ == "__main__":
    sys.exit(main())

"""The one command for a lent GPU machine: check dfl's GPU path and write one report (JSON + markdown).

    python benchmarks/gpu_check.py --dry-run       # print the plan (steps, commands, time limits); run nothing
    python benchmarks/gpu_check.py                 # everything, within --budget 480 s (8 minutes on one H100)
    python benchmarks/gpu_check.py --quick         # ~4 minutes (budget 240 s): smaller sizes, no compile
    python benchmarks/gpu_check.py --allow-cpu     # no GPU: the same steps on the CPU at toy sizes (gloo for NCCL)

(The times are estimates: no GPU has run this script yet. The budget is hard: no step starts, or runs on, past
it, so the default stays inside the device tool's 10 minutes per command.)

Steps, in this order (each a subprocess with its own time limit, all within the budget; a failing step is
recorded with the tail of its output and the check goes on):

  1. device: nvidia-smi, GPU name, memory, count; torch / CUDA / cuDNN / NCCL / Triton versions, C compilers;
  2. preflight: `import dfl` with this repository on PYTHONPATH (no install needed);
  3. engine paths on a one-rank NCCL group made by dfl's own set-up (`dfl.engine.distributed.init_process_group`
     and `DistributedCommunicator`): asynchronous mode, CHOCO with link faults, SCAFFOLD with partial
     participation, each checkpointed and resumed, against the same runs in one process without a group;
  4. host syncs: `benchmarks/host_syncs.py --device cuda`: reads-back and uploads per local step (dfl's counter)
     and torch's own sync-debug count per local step and per evaluation;
  5. checkpoint memory: a run with evaluation and checkpoints; the device's peak during a checkpoint and over the
     run against the memory planner's estimate (`summary.json` memory_estimate);
  6. gossip: `benchmarks/gossip.py --gossip-steps 4` (Q = 4, ring): the method the engine chose on this device
     (calibrated: dense, one circulant pass or step by step) and the bandwidth of each, against the copy
     bandwidth; with 2+ GPUs also p2p / all_gather between two NCCL processes (`--worlds 2`);
  7. two processes (2+ GPUs; gloo workers in a CPU dry run): `torchrun --nproc_per_node=2 -m dfl.cli run` with
     NCCL through dfl's own init against the same run in one process (world 2 = world 1), then a world of two
     whose rank 1 is SIGKILLed in round 2: rank 0 must stop with PeerFailure naming rank 1, within seconds;
  8. throughput, fp32 and bf16: benchmarks/throughput.py, ResNet-18 on random CIFAR-10-shaped data, the engine
     against the sequential reference loop: client-steps/s, TFLOP/s and % of the measured matmul peak;
  9. engine tests: `DFL_TEST_DEVICE=cuda python -m pytest` on the engine / algorithm equivalence tests;
 10. throughput with compile (`Config.compile`: Triton kernels; the small CIFAR CNN, so compiling fits).

The report goes to --out, default `$OUT/gpu_report.md` when $OUT is set (the device tool returns files written
there), else `gpu_report.md`; `gpu_report.json` beside it holds the same numbers. Both are rewritten after every
step, so a session cut short still leaves a report. Exit status: 0 when every step passed (or was skipped for
want of a second GPU), 1 when any failed or ran out of time, 2 when there is no CUDA (without --allow-cpu).

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
import socket
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
        budget=480, tests=ENGINE_TESTS, test_filter="not world_size",  # world-size tests: gloo on the CPU
        model="resnet18", clients=50, local_steps=2, batch_size=32, rounds=2, samples=200, compile=True,
        compile_model="cnn", compile_clients=100,
        gossip=["--clients", "100", "--dim", "11200000", "--repeat", "5"],
        engine=dict(clients=16, model="mlp", samples=4000), memory=dict(clients=64, model="cnn1d"),
        multi=dict(clients=16, rounds=3, model="mlp"), syncs=["--clients", "32"],
    ),
    "quick": dict(
        budget=240, tests=["tests/test_local.py", "tests/test_algorithms.py"], test_filter="not world_size",
        model="resnet18", clients=20, local_steps=1, batch_size=32, rounds=2, samples=100, compile=False,
        compile_model="cnn", compile_clients=32,
        gossip=["--clients", "100", "--dim", "2000000", "--repeat", "3"],
        engine=dict(clients=8, model="mlp", samples=2000), memory=dict(clients=32, model="cnn1d"),
        multi=dict(clients=8, rounds=3, model="mlp"), syncs=["--clients", "16"],
    ),
    "toy": dict(
        budget=420, tests=["tests/test_local.py"], test_filter="vectorized_equals_sequential and sgd",
        model="logreg", clients=2, local_steps=1, batch_size=4, rounds=1, samples=8, compile=True,
        compile_model="logreg", compile_clients=2,
        gossip=["--clients", "8", "--dim", "1000", "--repeat", "2", "--copy-mib", "8"],
        engine=dict(clients=4, model="logreg", samples=600), memory=dict(clients=4, model="logreg"),
        multi=dict(clients=4, rounds=3, model="logreg"), syncs=["--clients", "4"],
    ),
}
# Step time limits (s), each further capped by what is left of the budget.
TIMEOUTS = dict(engine=90, syncs=60, memory=60, gossip=60, multi=120, fp32=70, bf16=60, tests=120, compile=150)
KILL_ROUND = 2  # step 7: rank 1 kills itself at the start of this round (1-based)


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


STEPS = (("device", "device"), ("preflight", "preflight: import dfl"),
         ("engine", "engine paths on a one-rank NCCL group"), ("syncs", "host syncs per local step"),
         ("memory", "checkpoint memory vs planner"), ("gossip", "gossip at Q = 4: method and bandwidth"),
         ("multi", "two processes: world 2 = world 1, a killed rank"), ("fp32", "throughput fp32"),
         ("bf16", "throughput bf16"), ("tests", "engine tests"), ("compile", "throughput with compile"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="report path (default $OUT/gpu_report.md, else gpu_report.md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (steps, commands, limits) and exit")
    p.add_argument("--quick", action="store_true", help="~4 minutes: smaller sizes, fewer tests, no compile")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without CUDA, run the same steps on the CPU at toy sizes instead of exiting 2")
    p.add_argument("--toy", action="store_true", help="toy sizes even on a GPU (a smoke test of this script)")
    p.add_argument("--budget", type=float, default=None,
                   help="total seconds for all steps (default 480 full, 240 --quick, 420 toy)")
    p.add_argument("--test-workers", type=int, default=4,
                   help="pytest-xdist workers for the engine tests on CUDA when xdist is installed (0 = none)")
    p.add_argument("--pack-deps", action="store_true",
                   help=f"copy {', '.join(PACKED_DEPS)} from this Python into .gpu_deps/ (to carry), then exit")
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
    def __init__(self, args, device: str, mode: str, out: Path, gpus: int = 0):
        self.args = args
        self.device = device  # "cuda" or "cpu"
        self.mode = mode
        self.gpus = gpus
        self.sizes = MODES[mode]
        self.out = out
        self.budget = args.budget if args.budget is not None else self.sizes["budget"]
        self.compile = self.sizes["compile"] and not args.quick
        self.start = time.monotonic()
        self.started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.finished = False
        self.tmp = Path(tempfile.mkdtemp(prefix="dfl_gpu_check_"))
        self.env = dict(os.environ, PYTHONPATH=python_path(), PYTHONUNBUFFERED="1")
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            self.env.pop(name, None)
        if device == "cpu":
            self.env.setdefault("OMP_NUM_THREADS", "1")  # toy sizes: no thread oversubscription
        self.steps = [Step(key, title) for key, title in STEPS]
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

    def worker(self, step: Step, key: str, name: str, *args: str) -> dict | None:
        """Run one of this script's workers (`--worker name ...`); its last output line is a JSON record."""
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, self.device, *args]
        output = self.subprocess_step(step, key, cmd)
        if output is None:
            return None
        line = next((x for x in reversed(output.splitlines()) if x.startswith("{")), None)
        if line is None:
            step.status, step.result, step.tail = "FAILED", "no result line", tail(output)
            return None
        return json.loads(line)

    def step_engine(self, step: Step) -> None:
        record = self.worker(step, "engine", "engine", json.dumps(self.sizes["engine"]), str(self.tmp / "engine"))
        if record is None:
            return
        step.data.update(record)
        bad = [k for k, v in record["cases"].items() if not v["ok"]]
        step.status = "FAILED" if bad else "ok"
        step.result = (f"{record['backend']} one-rank group by dfl's init: "
                       + ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'} (max diff {v['max_abs_diff']:.1e})"
                                   for k, v in record["cases"].items()))

    def step_syncs(self, step: Step) -> None:
        path = self.tmp / "syncs.json"
        cmd = [sys.executable, "benchmarks/host_syncs.py", "--device", self.device, *self.sizes["syncs"],
               "--json", str(path)]
        if self.subprocess_step(step, "syncs", cmd) is None:
            return
        record = json.loads(path.read_text())
        step.data["record"] = record
        cases = {k: v for k, v in record.items() if k != "evaluation"}
        per_step = {k: (v["syncs_per_local_step"], v["sync_debug_per_local_step"]) for k, v in cases.items()}
        step.status = "ok" if all(a == 0 and b == 0 for a, b in per_step.values()) else "FAILED"
        step.result = "per local step (dfl's counter / torch sync-debug): " + ", ".join(
            f"{k} {a:g}/{b:g}" for k, (a, b) in per_step.items()) + (
            f"; an evaluation: {record['evaluation']['syncs']} reads back, sync-debug "
            f"{record['evaluation']['sync_debug']}")

    def step_memory(self, step: Step) -> None:
        record = self.worker(step, "memory", "memory", json.dumps(self.sizes["memory"]), str(self.tmp / "memory"))
        if record is None:
            return
        step.data.update(record)
        step.status = "ok" if record["checkpoint_peak_bytes"] <= record["planned_bytes"] else "FAILED"
        mib = {k: record[k] / 2**20 for k in ("planned_bytes", "run_peak_bytes", "checkpoint_peak_bytes")}
        step.result = (f"{record['clients']} clients x {record['num_params']:,} params: planner "
                       f"{mib['planned_bytes']:.0f} MiB; peak over the run {mib['run_peak_bytes']:.0f} MiB, during a "
                       f"checkpoint {mib['checkpoint_peak_bytes']:.0f} MiB ({record['how']})")

    def step_gossip(self, step: Step) -> None:
        worlds = ["2"] if self.device == "cuda" and self.gpus >= 2 else ["0"]
        cmd = [sys.executable, "benchmarks/gossip.py", *self.sizes["gossip"], "--gossip-steps", "4",
               "--worlds", *worlds, "--device", self.device]
        output = self.subprocess_step(step, "gossip", cmd)
        if output is None:
            return
        copy = re.search(r"copy bandwidth .*?([\d.]+) GB/s", output)
        chosen = re.search(r"1 process, engine \(([^)]*)\):\s+([\d.]+) ms", output)
        dense = re.search(r"dense matmul W\^4 @ X:\s+([\d.]+) ms .*?([\d.]+) GB/s\s+\(\s*([\d.]+)% of copy\)", output)
        step.data["lines"] = [line for line in output.splitlines() if "GB/s" in line or "gossip" in line
                              or "multi-process" in line or "calibrat" in line or "processes" in line]
        if not (copy and chosen):
            step.status, step.result = "FAILED", "could not read gossip.py's output"
            step.tail = tail(output)
            return
        step.data.update(copy_gbs=float(copy.group(1)), method=chosen.group(1), engine_ms=float(chosen.group(2)))
        if dense:
            step.data.update(matmul_ms=float(dense.group(1)), percent_of_copy=float(dense.group(3)))
        step.status = "ok"
        step.result = (f"engine chose {chosen.group(1)}: {chosen.group(2)} ms per round of 4 steps"
                       + (f"; dense W^4 @ X {dense.group(1)} ms" if dense else "")
                       + f"; copy bandwidth {copy.group(1)} GB/s")

    def step_multi(self, step: Step) -> None:
        if self.device == "cuda" and self.gpus < 2:
            step.status, step.result = "skipped", f"{self.gpus} GPU visible: NCCL needs one GPU per process"
            return
        limit = self.limit("multi")
        if limit is None:
            step.status, step.result = "not run", f"time budget ({self.budget:.0f} s) used up"
            return
        deadline = time.monotonic() + limit
        s = self.sizes["multi"]
        backend = "nccl" if self.device == "cuda" else "gloo"
        common = ["--clients", str(s["clients"]), "--model", s["model"], "--dataset", "mnist1d", "--dataset-options",
                  "num_samples=2000", "--eval-every", "1", "--checkpoint-every", "1", "--local-steps", "2",
                  "--device", self.device, "--backend", backend, "--no-progress", "--dist-timeout", "120",
                  "--topology", "ring", "--gossip-steps", "2"]
        args = ["run", "--rounds", str(s["rounds"]), *common, "--overwrite"]
        one, two = self.tmp / "world1", self.tmp / "world2"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
                    "-m", "dfl.cli", "run"]
        # world 2 stops one round short, then resumes: sharded checkpoints (DCP) written and read through the group
        commands = [("world 1", [sys.executable, "-m", "dfl.cli", *args, "--out", str(one)]),
                    ("world 2", [*torchrun, "--rounds", str(s["rounds"] - 1), *common, "--overwrite", "--out",
                                 str(two)]),
                    ("world 2 resumed", [*torchrun, "--resume", str(two), "--rounds", str(s["rounds"])])]
        outputs = []
        for label, cmd in commands:
            rc, output = self.run_cmd(step, cmd, max(1.0, deadline - time.monotonic()))
            outputs.append(f"$ {shlex.join(cmd)}\n{output}")
            if rc != 0:
                step.status = "TIMEOUT" if rc is None else "FAILED"
                step.result, step.tail = f"{label}: exit status {rc}", tail(output)
                return
        diffs = compare_metrics(one / "metrics.jsonl", two / "metrics.jsonl")
        step.data.update(world2_vs_world1=diffs)
        killed = self.killed_rank(args, deadline)
        step.data.update(killed=killed)
        step.command = (f"{shlex.join(commands[1][1])}; then {shlex.join(commands[2][1])}; then a killed rank (env:// "
                        "launch, 2 processes)")
        same = diffs["max_relative_diff"] <= 1e-3
        reported = killed.get("reported", False)
        step.status = "ok" if same and reported else "FAILED"
        step.result = (f"{backend}: world 2 (checkpointed, resumed) vs world 1 max relative metric difference "
                       f"{diffs['max_relative_diff']:.1e} over {diffs['records']} records; rank 1 SIGKILLed in round "
                       f"{KILL_ROUND}: "
                       + (f"rank 0 stopped {killed['seconds_after_kill']:.1f} s later with "
                          f"'{killed['rank0_error'][:160]}'" if reported else
                          f"not reported ({killed.get('problem', 'see data')})"))
        if not (same and reported):
            step.tail = tail("\n".join(outputs + [killed.get("output", "")]))

    def killed_rank(self, args: list[str], deadline: float) -> dict:
        """Two processes started with dfl's env:// set-up (no torchrun agent, which would stop the others itself);
        rank 1 SIGKILLs itself at the start of round KILL_ROUND. Rank 0 must stop with PeerFailure naming rank 1."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        stamp = self.tmp / "killed_at"
        procs = []
        for rank in range(2):
            env = dict(self.env, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "kill", self.device, "1",
                   str(KILL_ROUND), str(stamp), "--", *args, "--out", str(self.tmp / "killed")]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True))
        outputs = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                out += "\n[gpu_check: killed at the step's time limit]"
            outputs.append(out)
        ended = time.time()
        lines = [line for line in outputs[0].splitlines() if "PeerFailure" in line or "error" in line.lower()]
        error = lines[-1].strip() if lines else ""
        killed_at = float(stamp.read_text()) if stamp.is_file() else None
        record = {"rank0_exit": procs[0].returncode, "rank1_exit": procs[1].returncode, "rank0_error": error,
                  "output": f"rank 0:\n{tail(outputs[0])}\nrank 1:\n{tail(outputs[1])}"}
        if killed_at is None:
            return {**record, "reported": False, "problem": "rank 1 never reached the kill"}
        record["seconds_after_kill"] = ended - killed_at
        record["reported"] = procs[1].returncode == -signal.SIGKILL and "PeerFailure" in error and "rank 1" in error
        if not record["reported"]:
            record["problem"] = f"rank 0 said: {error or 'nothing'}"
        return record

    def throughput(self, step: Step, key: str, precision: str, compile_: bool = False) -> None:
        s = self.sizes
        path = self.tmp / f"throughput_{key}.json"
        model, clients = (s["compile_model"], s["compile_clients"]) if compile_ else (s["model"], s["clients"])
        cmd = [sys.executable, "benchmarks/throughput.py", "--model", model, "--dataset", "cifar10",
               "--clients", str(clients), "--local-steps", str(s["local_steps"]),
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
        step.result = (f"{model} x {clients}: engine {fast['client_steps_per_s']:.0f} vs sequential "
                       f"{ref['client_steps_per_s']:.0f} client-steps/s ({speed:.2f}x); engine "
                       f"{fast['gflops'] / 1e3:.2f} TFLOP/s = {fast['fraction_of_peak']:.0%} of {record['peak_dtype']} "
                       f"matmul peak {record['peak_gflops'] / 1e3:.1f} TFLOP/s; its matmul kernels alone "
                       f"{loops['matmuls alone']['fraction_of_peak']:.0%}")
        if compile_:
            step.result += f"; first (compiling) round {record['first_round_s'][engine]:.0f} s"

    # ------------------------------------------------------------------ driver
    def functions(self) -> dict:
        return {"device": self.step_device, "preflight": self.step_preflight, "engine": self.step_engine,
                "syncs": self.step_syncs, "memory": self.step_memory, "gossip": self.step_gossip,
                "multi": self.step_multi, "fp32": lambda s: self.throughput(s, "fp32", "fp32"),
                "bf16": lambda s: self.throughput(s, "bf16", "bf16"), "tests": self.step_tests,
                "compile": lambda s: self.throughput(s, "compile", "fp32", compile_=True)}

    def plan(self) -> str:
        """What `run` would do, step by step (`--dry-run`)."""
        s = self.sizes
        two = self.device == "cpu" or self.gpus >= 2
        what = {
            "device": "nvidia-smi, torch.cuda properties, versions (in this process)",
            "preflight": "import dfl, topologies (in this process)",
            "engine": f"gpu_check.py --worker engine {self.device}: every collective once; {s['engine']['model']} x "
                      f"{s['engine']['clients']} clients: async, CHOCO + link faults, SCAFFOLD; 2 rounds, checkpoint, "
                      "resume to 3",
            "syncs": f"benchmarks/host_syncs.py --device {self.device} {' '.join(s['syncs'])}",
            "memory": f"gpu_check.py --worker memory {self.device}: {s['memory']['model']} x "
                      f"{s['memory']['clients']} clients, evaluation and checkpoint every round",
            "gossip": f"benchmarks/gossip.py {' '.join(s['gossip'])} --gossip-steps 4 --worlds "
                      f"{'2' if self.device == 'cuda' and self.gpus >= 2 else '0'} --device {self.device}",
            "multi": ("torchrun --standalone --nproc_per_node=2 -m dfl.cli run ... (checkpointed, then --resume) vs "
                      f"python -m dfl.cli run ...; then 2 processes (env://), rank 1 SIGKILLed in round {KILL_ROUND}")
                     if two else
                     f"skipped: {self.gpus} GPU visible",
            "fp32": f"benchmarks/throughput.py --model {s['model']} --dataset cifar10 --clients {s['clients']} "
                    f"--precision fp32",
            "bf16": f"benchmarks/throughput.py --model {s['model']} ... --precision bf16",
            "tests": f"DFL_TEST_DEVICE={self.device} python -m pytest {' '.join(s['tests'])} -k '{s['test_filter']}'",
            "compile": (f"benchmarks/throughput.py --model {s['compile_model']} --clients {s['compile_clients']} "
                        "--compile") if self.compile else "skipped (--quick)",
        }
        lines = [f"gpu_check plan: {self.mode} mode on {self.device} ({self.gpus} GPU(s)), budget {self.budget:.0f} s, "
                 f"report {self.out} (+ {self.out.with_suffix('.json').name})"]
        for n, step in enumerate(self.steps, 1):
            limit = TIMEOUTS.get(step.key)
            lines.append(f"{n:>2}. {step.title:<52} {'limit ' + str(limit) + ' s' if limit else '':<12} "
                         f"{what[step.key]}")
        total = sum(TIMEOUTS.values())
        lines.append(f"step limits add up to {total} s; the budget ({self.budget:.0f} s) stops the check earlier if "
                     "the steps run long (later steps are then reported 'not run')")
        return "\n".join(lines)

    def run(self) -> int:
        functions = self.functions()
        for step in self.steps:
            if step.key not in ("device", "preflight") and self.by_key["preflight"].status != "ok":
                step.status, step.result = "not run", "dfl does not import (see preflight)"
            elif step.key == "compile" and not self.compile:
                step.status, step.result = "skipped", "--quick: compiling takes minutes; run without --quick"
            else:
                self.execute(step, functions[step.key])
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
        data = {"mode": self.mode, "device": self.device, "gpus": self.gpus, "started": self.started_at,
                "budget_s": self.budget, "elapsed_s": time.monotonic() - self.start, "command": " ".join(sys.argv),
                "steps": [asdict(s) for s in self.steps]}
        self.out.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str) + "\n")


def compare_metrics(a: Path, b: Path) -> dict:
    """The largest relative difference of the numeric metrics of two metrics.jsonl (timing and traffic left out)."""
    skip = {"seconds_per_round", "bytes_moved", "bytes_moved_round", "round"}
    ra = [json.loads(x) for x in a.read_text().splitlines() if x.strip()]
    rb = [json.loads(x) for x in b.read_text().splitlines() if x.strip()]
    worst, where = 0.0, None
    for x, y in zip(ra, rb):
        for key, value in x.items():
            if key in skip or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            other = y.get(key)
            if not isinstance(other, (int, float)):
                continue
            diff = abs(value - other) / max(abs(value), abs(other), 1e-6)
            if diff > worst:
                worst, where = diff, f"round {x.get('round')} {key}"
    return {"records": min(len(ra), len(rb)), "same_count": len(ra) == len(rb), "max_relative_diff": worst,
            "where": where}


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
        f"- mode: **{check.mode}** on **{check.device}** ({check.gpus} GPU(s))"
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

    engine = check.by_key["engine"]
    lines += ["", "## Engine paths on a one-rank group", "",
              "dfl's own set-up (`init_process_group`, `DistributedCommunicator`) on one rank: every collective goes "
              "through the backend. 'every collective, once' calls each communicator method (all_to_all_single with "
              "rows and with zero-size splits, float64 all_reduce, all_gather_into_tensor, barrier, assemble_rows) "
              "against the same arithmetic done locally; each other case runs 2 rounds, checkpoints, resumes to 3, and "
              "is compared with the same run in one process without a group.", ""]
    if engine.data.get("cases"):
        lines += ["| case | ok | max abs difference | seconds |", "| --- | --- | --- | --- |"]
        lines += [f"| {k} | {v['ok']} | {v['max_abs_diff']:.2e} | {v['seconds']:.1f} |"
                  for k, v in engine.data["cases"].items()]
    else:
        lines.append(f"({engine.status})")

    syncs = check.by_key["syncs"]
    lines += ["", "## Host syncs", "", f"`{syncs.command or '(not run)'}`", ""]
    record = syncs.data.get("record")
    if record:
        lines += ["| case | reads back per local step | uploads per local step | torch sync-debug per local step |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {k} | {v['syncs_per_local_step']:g} | {v['uploads_per_local_step']:g} | "
                  f"{v['sync_debug_per_local_step']:g} |" for k, v in record.items() if k != "evaluation"]

    memory = check.by_key["memory"]
    lines += ["", "## Checkpoint memory", "", _cell(memory.result) or f"({memory.status})"]

    gossip = check.by_key["gossip"]
    lines += ["", "## Gossip", "", f"`{gossip.command or 'benchmarks/gossip.py (not run)'}`", ""]
    lines += ["```", *gossip.data.get("lines", ["(no output)"]), "```"]

    multi = check.by_key["multi"]
    lines += ["", "## Two processes", "", f"`{multi.command or '(not run)'}`", "", _cell(multi.result) or
              f"({multi.status})"]

    lines += ["", "## Throughput", "",
              f"benchmarks/throughput.py: DFedSAM rounds, {s['model']} x {s['clients']} clients (compile: "
              f"{s['compile_model']} x {s['compile_clients']}), {s['local_steps']} local SAM steps of batch "
              f"{s['batch_size']}, random data of CIFAR-10's shape ({s['samples']} samples per client), median of "
              f"{s['rounds']} alternating rounds after a warm-up. % of peak is against a large matmul measured in the "
              "same process in the run's precision (fp32 = PyTorch's default: TF32 off for matmuls).", "",
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

    tests = check.by_key["tests"]
    lines += ["", "## Engine tests", "",
              f"`{tests.data.get('env', 'DFL_TEST_DEVICE=' + check.device)} {tests.command or '(not run)'}`", "",
              "| passed | failed | errors | skipped |", "| --- | --- | --- | --- |",
              "| " + " | ".join(str(tests.data.get(k, "-")) for k in ("passed", "failed", "errors", "skipped")) + " |"]
    if tests.data.get("failing"):
        lines += ["", "Failing:", *[f"- `{name}`" for name in tests.data["failing"]]]

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


# ---------------------------------------------------------------------------------------------- workers
def engine_worker(device_name: str, sizes: str, root: str) -> int:
    """Step 3: dfl's own process-group set-up on one rank (NCCL on CUDA, gloo on the CPU), then each engine path
    run, checkpointed and resumed through it, against the same run in this process without a group."""
    use_local_paths()
    import torch

    import dfl
    from dfl.engine.distributed import DistributedCommunicator, init_process_group

    s = json.loads(sizes)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if device_name == "cuda" else "gloo"
    base = dfl.Config(clients=s["clients"], model=s["model"], dataset="mnist1d",
                      dataset_options={"num_samples": s["samples"]}, local_steps=2, batch_size=16, eval_every=1,
                      rounds=3, progress=False, device=device_name, backend=backend, seed=1, dist_timeout=120.0)
    cases = {"async dfedsam": dict(algorithm="dfedsam", mode="async", link_latency=0.2, stragglers=0.3),
             "async dpsgd": dict(algorithm="dpsgd", mode="async"),
             "CHOCO + link faults": dict(algorithm="dfedavg", compressor="random-k", compression=0.3,
                                         link_failure=0.2, offline=0.1),
             "scaffold, half participate": dict(algorithm="scaffold", participation=0.5),
             "dfedsam-mgs ring, Q = 4": dict(algorithm="dfedsam-mgs", topology="ring", gossip_steps=4)}
    init_process_group(base)
    device = torch.device(device_name, 0) if device_name == "cuda" else torch.device("cpu")
    comm = DistributedCommunicator(s["clients"], "p2p", device, owns_group=True)
    results = {}
    try:
        tic = time.perf_counter()
        try:
            diff = communicator_calls(device)
            results["every collective, once"] = {"ok": diff <= 1e-5, "max_abs_diff": diff,
                                                 "seconds": time.perf_counter() - tic}
        except Exception as exc:
            results["every collective, once"] = {"ok": False, "max_abs_diff": float("nan"),
                                                 "seconds": time.perf_counter() - tic,
                                                 "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"every collective, once: {type(exc).__name__}: {exc}", flush=True)
        for name, changes in cases.items():
            config = base.replace(**changes)
            tic = time.perf_counter()
            out = Path(root) / name.replace(" ", "_").replace(",", "").replace("+", "")
            try:
                dfl.run(config.replace(rounds=2), out=out, comm=comm)
                resumed = dfl.run(config, out=out, comm=comm, resume=True)
                reference = dfl.run(config)  # one process, no group
                diff = float((resumed.params - reference.params).abs().max())
                results[name] = {"ok": diff <= 1e-4, "max_abs_diff": diff, "seconds": time.perf_counter() - tic}
            except Exception as exc:
                results[name] = {"ok": False, "max_abs_diff": float("nan"), "seconds": time.perf_counter() - tic,
                                 "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
    finally:
        comm.close()
    print(json.dumps({"backend": backend, "device": device_name, "cases": results}))
    return 0 if all(r["ok"] for r in results.values()) else 1


def communicator_calls(device) -> float:
    """Every method of `DistributedCommunicator` once, on the one-rank group, against the same arithmetic done here.

    One rank still moves every buffer through the backend (NCCL on a GPU): all_to_all_single to itself, with rows
    and with zero-size splits and an empty input (what a rank with no neighbour on another process sends); float64
    all_reduce; all_gather_into_tensor (allgather gossip); barrier with device_ids; assemble_rows. Returns the
    largest absolute difference.
    """
    import numpy as np
    import torch

    from dfl.engine.distributed import DistributedCommunicator

    m = 6
    p2p = DistributedCommunicator(m, "p2p", device)
    gathered = DistributedCommunicator(m, "allgather", device)
    X = torch.randn(m, 5, generator=torch.Generator().manual_seed(0)).to(device)
    W = 0.5 * np.eye(m) + 0.25 * np.roll(np.eye(m), 1, axis=1) + 0.25 * np.roll(np.eye(m), -1, axis=1)
    mixed = torch.tensor(W @ W, dtype=torch.float32, device=device) @ X
    send = torch.tensor([4, 0], device=device)
    empty = torch.empty(0, dtype=torch.long, device=device)
    value = torch.tensor([1.5, -2.0], dtype=torch.float64, device=device)
    checks = [
        (p2p.exchange_rows(X, send, [2], [2], 2), X[send]),
        (p2p.exchange_rows(X, empty, [0], [0], 0), X[:0]),
        (p2p.sum(value), value),
        (p2p.mean_rows(X), X.double().mean(0).float()),
        (p2p.gather_rows(X), X),
        (gathered.mix_steps([W, W], X), mixed),
        (p2p.mix_steps([W, W], X), mixed),
        (p2p.assemble_rows(X), X.cpu()),
    ]
    p2p.barrier()
    for got, want in checks:
        if got.shape != want.shape or got.device.type != want.device.type:
            raise AssertionError(f"{tuple(got.shape)} on {got.device}, expected {tuple(want.shape)} on {want.device}")
    return max((float((got.double() - want.double()).abs().max()) if got.numel() else 0.0) for got, want in checks)


def memory_worker(device_name: str, sizes: str, root: str) -> int:
    """Step 5: a run with evaluation and a checkpoint every round; the device's peak over the run and during each
    checkpoint (CUDA: the allocator's peak; CPU: dfl's PeakTracker over the tensors a checkpoint allocates) against
    the planner's estimate of what a round holds."""
    use_local_paths()
    import torch

    import dfl
    from dfl.engine import checkpoint as ckpt
    from dfl.engine import experiment
    from dfl.training.memory import PeakTracker

    s = json.loads(sizes)
    cuda = device_name == "cuda"
    peaks = []
    original = experiment.Experiment.checkpoint

    def checkpoint(self, t):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            original(self, t)
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
        else:
            held = sum(v.numel() * v.element_size() for v in ckpt.local_rows(self.algorithm).values())
            with PeakTracker() as tracker:
                original(self, t)
            peaks.append(held + tracker.peak)

    experiment.Experiment.checkpoint = checkpoint
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    config = dfl.Config(clients=s["clients"], model=s["model"], dataset="mnist1d",
                        dataset_options={"num_samples": max(2000, 20 * s["clients"])}, rounds=3, eval_every=1,
                        local_steps=2, progress=False, device=device_name, seed=0)
    result = dfl.run(config, out=Path(root) / "run")
    run_peak = torch.cuda.max_memory_allocated() if cuda else max(peaks)
    estimate = result.summary["memory_estimate"]
    planned = estimate["stack_bytes"] + estimate["fixed_bytes"] + estimate["chunk"] * estimate["bytes_per_client"]
    print(json.dumps({"clients": s["clients"], "num_params": result.summary["num_params"], "planned_bytes": planned,
                      "run_peak_bytes": run_peak, "checkpoint_peak_bytes": max(peaks), "estimate": estimate,
                      "how": "torch.cuda.max_memory_allocated" if cuda else
                      "held rows + PeakTracker of the checkpoint's allocations"}))
    return 0


def kill_worker(device_name: str, rank_to_kill: str, at_round: str, stamp: str, args: list[str]) -> int:
    """Step 7: one rank of a two-process `dfl run` (dfl's env:// set-up); rank `rank_to_kill` SIGKILLs itself at
    the start of round `at_round` (1-based), after writing the time to `stamp`."""
    use_local_paths()
    from dfl.cli import main
    from dfl.engine import experiment

    original = experiment.Experiment.train_round

    def train_round(self, t):
        if self.comm.rank == int(rank_to_kill) and t + 1 == int(at_round):
            Path(stamp).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, t)

    experiment.Experiment.train_round = train_round
    return main(args)


def worker(argv: list[str]) -> int:
    name, *rest = argv
    if name == "engine":
        return engine_worker(*rest)
    if name == "memory":
        return memory_worker(*rest)
    if name == "kill":
        device, rank, at, stamp, *dfl_args = rest
        return kill_worker(device, rank, at, stamp, dfl_args[1:] if dfl_args[:1] == ["--"] else dfl_args)
    raise SystemExit(f"unknown worker {name!r}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:  # internal: one of the steps' processes (`--worker NAME DEVICE ...`)
        return worker(argv[1:])
    args = parse_args(argv)
    if args.pack_deps:
        return pack_deps()
    try:
        import torch
    except Exception as exc:
        print(f"gpu_check: cannot import torch ({type(exc).__name__}: {exc})", file=sys.stderr)
        return NO_CUDA_EXIT
    cuda = torch.cuda.is_available()
    if not cuda and not (args.allow_cpu or args.dry_run):
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}); run it on a "
              "GPU machine, or pass --allow-cpu for a toy-size dry run on the CPU", file=sys.stderr)
        return NO_CUDA_EXIT
    device = "cuda" if cuda else "cpu"
    mode = "toy" if args.toy or not cuda else ("quick" if args.quick else "full")
    out = report_path(args.out)
    check = Check(args, device, mode, out, gpus=torch.cuda.device_count() if cuda else 0)
    if args.dry_run:
        print(check.plan())
        shutil.rmtree(check.tmp, ignore_errors=True)
        return 0
    print(f"gpu_check: {mode} mode on {device}, report {out}", flush=True)
    return check.run()


if __name__ == "__main__":
    sys.exit(main())

"""The one command for a lent GPU machine: check dfl's GPU path and write one report (JSON + markdown).

    python benchmarks/gpu_check.py --pack-deps     # where dfl runs: copy what the GPU image lacks into .gpu_deps/
    python benchmarks/gpu_check.py --dry-run       # print the plan (steps, commands, time limits); run nothing
    python benchmarks/gpu_check.py                 # everything, within --budget 400 s (under 7 minutes on one H100)
    python benchmarks/gpu_check.py --quick         # ~4 minutes (budget 240 s): smaller sizes, no compile
    python benchmarks/gpu_check.py --allow-cpu     # no GPU: the same steps on the CPU at toy sizes (gloo for NCCL)

(The times are estimates: no GPU has run this script yet.) Each step is a subprocess with its own time limit
(`LIMITS`); on one GPU the limits of the steps that run add up to at most the budget, so the check ends inside it
whatever a step does. A step whose limit no longer fits in what is left of the budget is not started: it is
reported "skipped: budget". A failing step is recorded with the tail of its output and the check goes on.

Steps, in this order (most wanted first):

  1. device: nvidia-smi, GPU name, memory, count; torch / CUDA / cuDNN / NCCL / Triton versions, C compilers;
  2. preflight: `import dfl` with this repository on PYTHONPATH (no install needed);
  3. paper setting: DFedSAM-MGS (Q = 4, random-pull k = 10) with 100 clients, ResNet-18 and VGG-11 on CIFAR-shaped
     random data, 5 local epochs of batch 128, 2 rounds and one evaluation each; seconds per round and per evaluation,
     device peak, torch's sync count per round, and the projected time of 1,000 rounds and of Table 1's 500;
  4. determinism: a conv model run twice with `kernels = "deterministic"` (must be equal bit for bit) and twice with
     `kernels = "fast"` (the difference reported);
  5. host syncs: `benchmarks/host_syncs.py --device cuda`: reads-back and uploads per local step and per round
     (dfl's counter) and torch's own sync-debug count, per local step, per round and per evaluation;
  6. engine paths on a one-rank NCCL group made by dfl's own set-up (`dfl.engine.distributed.init_process_group`
     and `DistributedCommunicator`): asynchronous mode, CHOCO with link faults, SCAFFOLD with partial
     participation, each checkpointed and resumed, against the same runs in one process without a group;
  7. checkpoint memory: a run with evaluation and checkpoints; the device's peak during a checkpoint and over the
     run against the memory planner's estimate (`summary.json` memory_estimate);
  8. gossip: `benchmarks/gossip.py --gossip-steps 4` (Q = 4, ring): the method the engine chose on this device
     and the bandwidth of each, against the copy bandwidth; with 2+ GPUs also p2p / all_gather between two NCCL
     processes (`--worlds 2`; "skipped: one GPU" otherwise);
  9. two processes (2+ GPUs, "skipped: one GPU" otherwise; gloo workers in a CPU dry run): `torchrun
     --nproc_per_node=2 -m dfl.cli run` with NCCL through dfl's own init against the same run in one process
     (world 2 = world 1), then a world of two whose rank 1 is SIGKILLed in round 2: rank 0 must stop with
     PeerFailure naming rank 1, within seconds;
 10. throughput, fp32 and bf16: benchmarks/throughput.py, ResNet-18 on random CIFAR-10-shaped data, the engine
     against the sequential per-client loop: client-steps/s, TFLOP/s and % of the measured matmul peak;
 11. throughput with compile (`Config.compile`: Triton kernels; the small CIFAR CNN, so compiling fits);
 12. engine tests: `DFL_TEST_DEVICE=cuda python -m pytest -o addopts=""` on the engine / algorithm equivalence tests
     (addopts cleared: the repository's pytest plugins, such as pytest-markdown-docs, need not be there).

The report goes to --out, default `$OUT/gpu_report.md` when $OUT is set (the device tool returns files written
there), else `gpu_report.md`; `gpu_report.json` beside it holds the same numbers, with the stable top-level keys
`projection`, `determinism`, `host_syncs` and `throughput` (docs/how-to/gpu-check.md lists the fields). Both are
rewritten after every step, so a session cut short still leaves a report. Exit status: 0 when every step passed
(or was skipped: one GPU, budget, --quick), 1 when any failed or ran out of time, 2 when there is no CUDA (without
--allow-cpu).

The GPU image has PyTorch, numpy, scipy, networkx, pytest but not dfl's small pure-Python dependencies (tomli-w,
mnist1d, opacus) and no network: `python benchmarks/gpu_check.py --pack-deps` (on a machine where dfl runs) copies
them into `.gpu_deps/`, which this script puts on PYTHONPATH when it exists; carry that folder to the GPU machine.
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
# dfl's pure-Python dependencies that the GPU image lacks (its package list: numpy, scipy, networkx, tqdm, matplotlib,
# scikit-learn, typing-extensions, opt-einsum, pytest, pytest-xdist are there; opacus loads only with DP)
PACKED_DEPS = ("tomli_w", "mnist1d", "opacus")
NO_CUDA_EXIT = 2
# the engine tests of step 12, without their slow ones (compiling, worlds of processes): within its 30 s on a GPU
ENGINE_TESTS = ["tests/test_local.py", "tests/test_precision.py", "tests/test_algorithms.py"]

# The paper's setting (launch/configs/dfedsam-table1-cifar10.toml): DFedSAM-MGS, 100 clients, 5 local epochs of batch
# 128, lr 0.1 x0.998, rho 0.01, weight decay 5e-4, Q = 4 on random-pull k = 10, 500 samples per client (CIFAR-10's
# 50,000 / 100), evaluated every 10 rounds on the 10,000 test samples (and train_eval_samples = 5000).
# The paper step's worker gives model i until PAPER_SHARES[i] of its time (the last model: all of it), and stops
# PAPER_MARGIN_S before the step's limit; the evaluation is estimated at EVALUATION_ESTIMATE x a round (100 clients x
# 2,000 test samples plus 15,000 for the averaged model, against 250,000 training samples x 5 epochs with SAM).
PAPER_SHARES = [0.4]
PAPER_MARGIN_S = 8
EVALUATION_ESTIMATE = 0.25
PAPER = dict(clients=100, per_client=500, test=10_000, local_epochs=5, batch_size=128, rounds=2,
             models=["vgg11", "resnet18"], eval_every=10, projections=[1000, 500])

# Sizes per mode. "toy" is what --allow-cpu runs on a machine without CUDA (and --toy anywhere).
MODES = {
    "full": dict(
        budget=400, tests=ENGINE_TESTS, test_filter="not world_size", markers="not slow",  # world sizes: gloo
        model="resnet18", clients=50, local_steps=2, batch_size=32, rounds=2, samples=200, compile=True,
        compile_model="cnn", compile_clients=100, paper=PAPER,
        determinism=dict(model="cnn", clients=16, samples=64, local_steps=4),
        gossip=["--clients", "100", "--dim", "11200000", "--repeat", "5"],
        engine=dict(clients=16, model="mlp", samples=4000), memory=dict(clients=64, model="cnn1d"),
        multi=dict(clients=16, rounds=3, model="mlp"), syncs=["--clients", "32"],
    ),
    "quick": dict(
        budget=240, tests=["tests/test_local.py"], test_filter="not world_size", markers="not slow",
        model="resnet18", clients=20, local_steps=1, batch_size=32, rounds=2, samples=100, compile=False,
        compile_model="cnn", compile_clients=32, paper={**PAPER, "local_epochs": 1, "models": ["vgg11"]},
        determinism=dict(model="cnn", clients=8, samples=32, local_steps=2),
        gossip=["--clients", "100", "--dim", "2000000", "--repeat", "3"],
        engine=dict(clients=8, model="mlp", samples=2000), memory=dict(clients=32, model="cnn1d"),
        multi=dict(clients=8, rounds=3, model="mlp"), syncs=["--clients", "16"],
    ),
    "toy": dict(
        budget=600, tests=["tests/test_local.py"], test_filter="vectorized_equals_sequential and sgd", markers="",
        model="logreg", clients=2, local_steps=1, batch_size=4, rounds=1, samples=8, compile=True,
        compile_model="logreg", compile_clients=2,
        paper=dict(PAPER, clients=4, per_client=8, test=32, local_epochs=1, batch_size=4, models=["cnn"]),
        determinism=dict(model="cnn", clients=4, samples=8, local_steps=1),
        gossip=["--clients", "8", "--dim", "1000", "--repeat", "2", "--copy-mib", "8"],
        engine=dict(clients=4, model="logreg", samples=600), memory=dict(clients=4, model="logreg"),
        multi=dict(clients=4, rounds=3, model="logreg"), syncs=["--clients", "4"],
    ),
}
# Step time limits (s). On a GPU ("full"), the limits of the steps that run on one GPU add up to the budget (400 s:
# with CUDA's start-up in each process and the compile warm-up inside them, the check ends within 7 minutes); device
# and preflight run in this process (LIMITS counts 10 s for them). The toy mode's limits suit a busy 2-core CPU.
LIMITS = {
    "full": dict(inline=10, paper=140, determinism=25, syncs=20, engine=35, memory=20, gossip=15, multi=90, fp32=25,
                 bf16=20, compile=60, tests=30),
    "quick": dict(inline=10, paper=70, determinism=20, syncs=15, engine=25, memory=15, gossip=15, multi=60, fp32=20,
                  bf16=15, compile=0, tests=35),
    "toy": dict(inline=10, paper=90, determinism=60, syncs=60, engine=90, memory=60, gossip=60, multi=120, fp32=70,
                bf16=60, compile=150, tests=120),
}
REPORT_SCHEMA = 2  # gpu_report.json's layout (docs/how-to/gpu-check.md); raised when a stable key changes
KILL_ROUND = 2  # step 9: rank 1 kills itself at the start of this round (1-based)


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
         ("paper", "paper setting: 100 clients, DFedSAM-MGS"), ("determinism", "deterministic and fast kernels"),
         ("syncs", "host syncs per local step and round"), ("engine", "engine paths on a one-rank NCCL group"),
         ("memory", "checkpoint memory vs planner"), ("gossip", "gossip at Q = 4: method and bandwidth"),
         ("multi", "two processes: world 2 = world 1, a killed rank"), ("fp32", "throughput fp32"),
         ("bf16", "throughput bf16"), ("compile", "throughput with compile"), ("tests", "engine tests"))
INLINE = ("device", "preflight")  # run in this process


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="report path (default $OUT/gpu_report.md, else gpu_report.md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (steps, commands, limits) and exit")
    p.add_argument("--quick", action="store_true", help="~4 minutes: smaller sizes, fewer tests, no compile")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without CUDA, run the same steps on the CPU at toy sizes instead of exiting 2")
    p.add_argument("--toy", action="store_true", help="toy sizes even on a GPU (a smoke test of this script)")
    p.add_argument("--budget", type=float, default=None,
                   help="total seconds for all steps (default 400 full, 240 --quick, 600 toy)")
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
        self.limits = LIMITS[mode]
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
        """This step's time limit (LIMITS); None when it no longer fits in what is left of the budget."""
        own = self.limits[key]
        return own if own <= self.remaining() else None

    def skip_for_budget(self, step: Step, key: str) -> None:
        step.status = "skipped"
        step.result = (f"skipped: budget (its limit {self.limits[key]} s > {max(0.0, self.remaining()):.0f} s left of "
                       f"{self.budget:.0f} s)")

    def runs(self, key: str) -> bool:
        """Whether step `key` runs at all in this check (not skipped for want of a GPU or by --quick)."""
        if key == "multi":
            return self.device == "cpu" or self.gpus >= 2
        if key == "compile":
            return self.compile
        return True

    def planned_seconds(self) -> int:
        """The limits of the steps that run, added (with LIMITS["inline"] for those that run in this process)."""
        return self.limits["inline"] + sum(self.limits[k] for k, _ in STEPS if k not in INLINE and self.runs(k))

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
            self.skip_for_budget(step, key)
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
        # addopts cleared: pyproject's "--markdown-docs" needs pytest-markdown-docs, which the GPU image lacks
        cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *self.sizes["tests"], "-k", self.sizes["test_filter"]] + (
                   ["-m", self.sizes["markers"]] if self.sizes["markers"] else [])
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
        per_round = {k: (v["rounds"][-1]["syncs"], v["rounds"][-1]["sync_debug"]) for k, v in cases.items()}
        step.data["per_round"] = {k: {"K": v["K"][-1], "syncs": a, "sync_debug": b}
                                  for (k, v), (a, b) in zip(cases.items(), per_round.values())}
        step.result = "per local step (dfl's counter / torch sync-debug): " + ", ".join(
            f"{k} {a:g}/{b:g}" for k, (a, b) in per_step.items()) + "; per round of 6 local steps: " + ", ".join(
            f"{k} {a}/{b}" for k, (a, b) in per_round.items()) + (
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
        if worlds == ["0"] and self.device == "cuda":
            step.data["two_processes"] = "skipped: one GPU"
        step.result = (f"engine chose {chosen.group(1)}: {chosen.group(2)} ms per round of 4 steps"
                       + (f"; dense W^4 @ X {dense.group(1)} ms" if dense else "")
                       + f"; copy bandwidth {copy.group(1)} GB/s"
                       + ("; p2p / all_gather between two processes: skipped: one GPU"
                          if step.data.get("two_processes") else ""))

    def step_multi(self, step: Step) -> None:
        if not self.runs("multi"):
            step.status, step.result = "skipped", f"skipped: one GPU ({self.gpus} visible: NCCL needs one per process)"
            return
        limit = self.limit("multi")
        if limit is None:
            self.skip_for_budget(step, "multi")
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

    def step_paper(self, step: Step) -> None:
        """The paper's setting per model: seconds per round and per evaluation, peak, syncs; the projections."""
        out = self.tmp / "paper.json"
        paper = self.sizes["paper"]
        # the worker stops its runs itself before the step's limit (PAPER_SHARES), so a slow model is cut, not killed
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "paper", self.device, json.dumps(paper),
               str(out), str(max(1, self.limits["paper"] - PAPER_MARGIN_S))]
        output = self.subprocess_step(step, "paper", cmd)
        record = json.loads(out.read_text()) if out.is_file() else None  # written after every round: kept on a kill
        if record is None:
            if output is not None:
                step.status, step.result, step.tail = "FAILED", "no record written", tail(output)
            return
        step.data["record"] = record
        step.data["projection"] = projection(record, paper)
        done = {name: m for name, m in record["models"].items() if m.get("rounds")}
        parts = []
        for name, p in step.data["projection"].items():
            parts.append(f"{name} ({p['num_params'] / 1e6:.1f}M) {p['seconds_per_round']:.1f} s/round"
                         + (" (first round only, warm-up included)" if p["from_first_round"] else "")
                         + (f" [cut: {p['cut']}]" if p["cut"] else "")
                         + f", evaluation {p['evaluation_s']:.1f} s: 1,000 rounds ~{p['rounds_1000_s'] / 3600:.1f} h, "
                         f"500 rounds ~{p['rounds_500_s'] / 3600:.1f} h")
        missing = [m for m in paper["models"] if m not in done or done[m].get("evaluation_s") is None]
        if output is not None and not missing:
            step.status = "ok"
        elif output is not None:
            step.status = "FAILED"
        step.result = "; ".join(parts) + (f"; not measured: {', '.join(missing)} ({step.result or step.status})"
                                          if missing else "")

    def step_determinism(self, step: Step) -> None:
        record = self.worker(step, "determinism", "determinism", json.dumps(self.sizes["determinism"]))
        if record is None:
            return
        step.data.update(record)
        exact = record["deterministic"]["equal"]
        step.status = "ok" if exact else "FAILED"
        same = "equal bit for bit" if exact else f"DIFFER (max {record['deterministic']['max_abs_diff']:.1e})"
        step.result = (f"{record['model']} x {record['clients']}, two runs each: deterministic {same}; fast "
                       f"{'equal' if record['fast']['equal'] else 'differ'} (max abs difference "
                       f"{record['fast']['max_abs_diff']:.1e}); deterministic, half the chunk: max abs difference "
                       f"{record['chunk']['max_abs_diff']:.1e}")

    # ------------------------------------------------------------------ driver
    def functions(self) -> dict:
        return {"device": self.step_device, "preflight": self.step_preflight, "paper": self.step_paper,
                "determinism": self.step_determinism, "engine": self.step_engine,
                "syncs": self.step_syncs, "memory": self.step_memory, "gossip": self.step_gossip,
                "multi": self.step_multi, "fp32": lambda s: self.throughput(s, "fp32", "fp32"),
                "bf16": lambda s: self.throughput(s, "bf16", "bf16"), "tests": self.step_tests,
                "compile": lambda s: self.throughput(s, "compile", "fp32", compile_=True)}

    def plan(self) -> str:
        """What `run` would do, step by step (`--dry-run`)."""
        s = self.sizes
        paper = s["paper"]
        what = {
            "device": "nvidia-smi, torch.cuda properties, versions (in this process)",
            "preflight": "import dfl, topologies (in this process)",
            "paper": f"gpu_check.py --worker paper {self.device}: dfedsam-mgs Q = 4, {paper['clients']} clients x "
                     f"{paper['per_client']} CIFAR-shaped samples, {' and '.join(paper['models'])}, "
                     f"{paper['local_epochs']} local epochs of batch {paper['batch_size']}, {paper['rounds']} rounds, "
                     f"one evaluation; projected {' and '.join(map(str, paper['projections']))} rounds",
            "determinism": f"gpu_check.py --worker determinism {self.device}: {s['determinism']['model']} x "
                           f"{s['determinism']['clients']}, kernels deterministic and fast, two runs each",
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
                     if self.runs("multi") else f"skipped: one GPU ({self.gpus} visible)",
            "fp32": f"benchmarks/throughput.py --model {s['model']} --dataset cifar10 --clients {s['clients']} "
                    f"--precision fp32",
            "bf16": f"benchmarks/throughput.py --model {s['model']} ... --precision bf16",
            "tests": f"DFL_TEST_DEVICE={self.device} python -m pytest -o addopts= {' '.join(s['tests'])} -k "
                     f"'{s['test_filter']}'" + (f" -m '{s['markers']}'" if s["markers"] else ""),
            "compile": (f"benchmarks/throughput.py --model {s['compile_model']} --clients {s['compile_clients']} "
                        "--compile") if self.compile else "skipped (--quick)",
        }
        lines = [f"gpu_check plan: {self.mode} mode on {self.device} ({self.gpus} GPU(s)), budget {self.budget:.0f} s, "
                 f"report {self.out} (+ {self.out.with_suffix('.json').name})"]
        for n, step in enumerate(self.steps, 1):
            limit = f"limit {self.limits[step.key]} s" if step.key not in INLINE and self.runs(step.key) else ""
            lines.append(f"{n:>2}. {step.title:<52} {limit:<12} {what[step.key]}")
        total = self.planned_seconds()
        lines.append(f"the limits of the steps that run add up to {total} s ({self.limits['inline']} s counted for the "
                     f"steps in this process) against the budget of {self.budget:.0f} s; a step whose limit no longer "
                     "fits in what is left is not started ('skipped: budget')")
        return "\n".join(lines)

    def run(self) -> int:
        functions = self.functions()
        for step in self.steps:
            if step.key not in INLINE and self.by_key["preflight"].status != "ok":
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
    def summaries(self) -> dict:
        """The report's stable top-level keys (docs/how-to/gpu-check.md): read these, not the steps' data."""
        paper, det = self.by_key["paper"].data, self.by_key["determinism"].data
        syncs = self.by_key["syncs"].data.get("record") or {}
        throughput = {}
        for key in ("fp32", "bf16", "compile"):
            record = self.by_key[key].data.get("record")
            if record:
                throughput[key] = {
                    "model": record["model"], "precision": record["precision"],
                    "peak_tflops": record["peak_gflops"] / 1e3, "peak_dtype": record["peak_dtype"],
                    "loops": {name: {"client_steps_per_s": loop["client_steps_per_s"],
                                     "seconds_per_round": loop["seconds_per_round"], "tflops": loop["gflops"] / 1e3,
                                     "fraction_of_peak": loop["fraction_of_peak"]}
                              for name, loop in record["loops"].items()},
                    "speedup_vs_loop": {name: v["median"] for name, v in record["speedup"].items()}}
        return {
            "projection": paper.get("projection", {}),
            "determinism": {k: det[k] for k in ("deterministic", "fast", "chunk") if k in det},
            "host_syncs": {
                "per_local_step": {k: {"syncs": v["syncs_per_local_step"], "uploads": v["uploads_per_local_step"],
                                       "sync_debug": v["sync_debug_per_local_step"]}
                                   for k, v in syncs.items() if k != "evaluation"},
                "per_round": self.by_key["syncs"].data.get("per_round", {}),
                "per_evaluation": syncs.get("evaluation", {}),
                "paper_per_round": {name: p["sync_debug_per_round"] for name, p in
                                    paper.get("projection", {}).items()}},
            "throughput": throughput,
        }

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(render(self))
        data = {"schema": REPORT_SCHEMA, "mode": self.mode, "device": self.device, "gpus": self.gpus,
                "gpu": self.by_key["device"].data.get("info", {}).get("GPU"),
                "torch": self.by_key["device"].data.get("info", {}).get("torch"), "started": self.started_at,
                "budget_s": self.budget, "elapsed_s": time.monotonic() - self.start, "finished": self.finished,
                "command": " ".join(sys.argv), **self.summaries(), "steps": [asdict(s) for s in self.steps]}
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

    paper = check.by_key["paper"]
    setting = s["paper"]
    lines += ["", "## Paper setting", "",
              f"DFedSAM-MGS (Q = 4, random-pull k = 10), {setting['clients']} clients x {setting['per_client']} "
              f"CIFAR-shaped random samples, {setting['local_epochs']} local epochs of batch {setting['batch_size']}, "
              f"lr 0.1, rho 0.01, weight decay 5e-4, fp32, kernels deterministic, client_chunk auto; "
              f"{setting['rounds']} rounds, one evaluation ({setting['test']:,} test samples, 2,000 per client). "
              f"Seconds per round: the median of the rounds after the first (warm-up excluded). Projection: that "
              f"x rounds + one evaluation every {setting['eval_every']} rounds, on this one GPU.", ""]
    if paper.data.get("projection"):
        lines += ["| model | params | chunk | first round | s/round | evaluation | peak | syncs/round | "
                  + " | ".join(f"{n:,} rounds" for n in setting["projections"]) + " |",
                  "| --- " * (8 + len(setting["projections"])) + "|"]
        for name, p in paper.data["projection"].items():
            peak = "-" if p["peak_bytes"] is None else f"{p['peak_bytes'] / 2**30:.1f} GiB"
            lines.append(f"| {name} | {p['num_params'] / 1e6:.1f}M | {p['client_chunk']} | "
                         f"{p['first_round_s']:.1f} s | {p['seconds_per_round']:.2f} s | {p['evaluation_s']:.1f} s | "
                         f"{peak} | "
                         f"{'-' if p['sync_debug_per_round'] is None else p['sync_debug_per_round']} | "
                         + " | ".join(f"{p[f'rounds_{n}_s'] / 3600:.2f} h" for n in setting["projections"]) + " |")
    else:
        lines.append(f"({paper.status})")

    det = check.by_key["determinism"]
    lines += ["", "## Determinism", "",
              "The same run twice per `kernels` mode (final parameters compared), and the deterministic run with half "
              "the client chunk (what another world size changes).", ""]
    if det.data.get("deterministic"):
        lines += ["| comparison | equal bit for bit | max abs difference |", "| --- | --- | --- |"]
        for key, label in (("deterministic", "deterministic, two runs"), ("fast", "fast, two runs"),
                           ("chunk", "deterministic, chunk vs half the chunk")):
            lines.append(f"| {label} | {det.data[key]['equal']} | {det.data[key]['max_abs_diff']:.2e} |")
    else:
        lines.append(f"({det.status})")

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
        lines += ["| case | reads back per local step | uploads per local step | torch sync-debug per local step | "
                  "reads back per round (K = 6) | torch sync-debug per round |", "| --- " * 6 + "|"]
        lines += [f"| {k} | {v['syncs_per_local_step']:g} | {v['uploads_per_local_step']:g} | "
                  f"{v['sync_debug_per_local_step']:g} | {v['rounds'][-1]['syncs']} | "
                  f"{v['rounds'][-1]['sync_debug']} |"
                  for k, v in record.items() if k != "evaluation"]

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


def cifar_shaped(clients: int, per_client: int, test: int, seed: int = 0):
    """Seeded N(0, 1) images [3, 32, 32] with uniform labels of 10 classes: `per_client` training samples per client
    and `test` test samples, crop-flip augmentation as for the real CIFAR-10 (the work per round is the real set's)."""
    import torch

    from dfl.data import FederatedData

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(clients * per_client, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (clients * per_client,), generator=g)
    train = list(zip(x.split(per_client), y.split(per_client)))
    test_set = (torch.randn(test, 3, 32, 32, generator=g), torch.randint(0, 10, (test,), generator=g))
    return FederatedData.from_arrays(train=train, test=test_set, num_classes=10, name="cifar10-random",
                                     augment="crop-flip")


def paper_config(paper: dict, model: str, device_name: str):
    """The Table 1 run of `model` (launch/configs/dfedsam-table1-cifar10.toml) for `paper['rounds']` rounds, evaluated
    once, at the end."""
    import dfl

    return dfl.Config(clients=paper["clients"], model=model, algorithm="dfedsam-mgs", gossip_steps=4,
                      topology="random-pull", topology_options={"k": min(10, paper["clients"] - 1)},
                      local_epochs=paper["local_epochs"], batch_size=paper["batch_size"], lr=0.1, lr_decay=0.998,
                      rho=0.01, weight_decay=5e-4, rounds=paper["rounds"], eval_every=paper["rounds"],
                      train_eval_samples=5000, device=device_name, progress=False, seed=0)


class OutOfTime(Exception):
    """Raised by the paper worker's timed round when the next round would not end within the model's share."""


def paper_worker(device_name: str, sizes: str, out: str, seconds: str) -> int:
    """Step 3: the paper's setting, model by model: each round timed (and torch's sync count on CUDA), the one
    evaluation timed, the device's peak; the record rewritten to `out` after every round (a kill keeps what was
    measured). Model i may run until PAPER_SHARES[i] of `seconds` have passed: a round that would not end by then (by
    the last round's time) is not started; the evaluation is then run after the rounds done, and the run stops."""
    use_local_paths()
    import torch

    import dfl
    from benchmarks.host_syncs import SyncDebug
    from dfl.engine.experiment import Experiment

    paper = json.loads(sizes)
    cuda = device_name == "cuda"
    started, seconds = time.monotonic(), float(seconds)
    shares = PAPER_SHARES[: len(paper["models"]) - 1] + [1.0]
    data = cifar_shaped(paper["clients"], paper["per_client"], paper["test"])
    record: dict = {"setting": {k: v for k, v in paper.items() if k != "models"}, "device": device_name, "models": {}}
    current: dict = {"model": None, "rounds": [], "sync_debug": []}
    last_stats: list = []  # the latest round's statistics (for an evaluation run after a cut)
    train_round, evaluate = Experiment.train_round, Experiment.evaluate

    def save():
        Path(out).write_text(json.dumps(record, indent=1))

    def timed_round(self, t):
        current.setdefault("num_params", self.layout.dim)
        if current["rounds"]:  # another round (and the evaluation after it) must end within the model's share
            last = current["rounds"][-1]
            if time.monotonic() + last * (1.05 + EVALUATION_ESTIMATE) > current["deadline"]:
                current["cut"] = f"{len(current['rounds'])} round(s): the next would not end within the step's limit"
                timed_evaluation(self, t - 1, last_stats.pop())
                raise OutOfTime
        with SyncDebug(self.device) as debug:
            tic = time.perf_counter()
            stats = train_round(self, t)  # ends with torch.cuda.synchronize on CUDA
            seconds = time.perf_counter() - tic
        current["client_chunk"] = self.trainer.chunk
        current["memory_estimate"] = self.trainer.memory_estimate
        current["rounds"].append(seconds)
        current["sync_debug"].append(debug.count if cuda else None)
        if cuda:
            current["peak_bytes"] = torch.cuda.max_memory_allocated()
        print(f"{current['model']}: round {t + 1} {seconds:.2f} s", flush=True)
        save()
        last_stats[:] = [stats]
        return stats

    def timed_evaluation(self, t, stats):
        tic = time.perf_counter()
        metrics = evaluate(self, t, stats)  # its metrics are read back: the device is done
        current["evaluation_s"] = time.perf_counter() - tic
        print(f"{current['model']}: evaluation {current['evaluation_s']:.2f} s", flush=True)
        save()
        return metrics

    Experiment.train_round, Experiment.evaluate = timed_round, timed_evaluation
    for model, share in zip(paper["models"], shares):
        current = {"model": model, "rounds": [], "sync_debug": [], "deadline": started + share * seconds}
        record["models"][model] = current
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            dfl.run(paper_config(paper, model, device_name), data=data)
        except OutOfTime:
            pass
        last_stats.clear()
        current.pop("deadline")
        save()
    print(json.dumps({"models": list(record["models"])}))
    return 0


def projection(record: dict, paper: dict) -> dict:
    """Per model: seconds per round (median of the rounds after the first, whose warm-up it leaves out; the first alone
    if that is all there is), seconds per evaluation, and the projected seconds of each of `paper['projections']`
    rounds (one GPU, fp32, kernels "deterministic"), with an evaluation every `paper['eval_every']` rounds."""
    out = {}
    for name, m in record["models"].items():
        rounds = m.get("rounds") or []
        if not rounds:
            continue
        steady = rounds[1:] or rounds
        per_round = sorted(steady)[len(steady) // 2]
        evaluation = m.get("evaluation_s")
        syncs = [c for c in m.get("sync_debug", [])[1:] or m.get("sync_debug", []) if c is not None]
        entry = {"seconds_per_round": per_round, "first_round_s": rounds[0], "rounds_timed": len(rounds),
                 "cut": m.get("cut"),
                 "from_first_round": len(rounds) == 1, "evaluation_s": evaluation or 0.0,
                 "evaluation_measured": evaluation is not None, "eval_every": paper["eval_every"],
                 "num_params": m.get("num_params", 0), "client_chunk": m.get("client_chunk"),
                 "peak_bytes": m.get("peak_bytes"), "sync_debug_per_round": max(syncs) if syncs else None,
                 "clients": paper["clients"], "local_epochs": paper["local_epochs"],
                 "batch_size": paper["batch_size"], "gossip_steps": 4,
                 "gpus": 1 if record.get("device") == "cuda" else 0, "precision": "fp32",
                 "kernels": "deterministic", "device": record.get("device")}
        for total in paper["projections"]:
            entry[f"rounds_{total}_s"] = per_round * total + (evaluation or 0.0) * (total // paper["eval_every"])
        out[name] = entry
    return out


def determinism_worker(device_name: str, sizes: str) -> int:
    """Step 4: one conv run twice with kernels "deterministic" and twice with "fast"; and "deterministic" with half
    the client chunk (what another world size changes). Prints the largest differences of the final parameters."""
    use_local_paths()
    import torch

    import dfl

    s = json.loads(sizes)
    data = cifar_shaped(s["clients"], s["samples"], s["samples"], seed=1)
    base = dfl.Config(clients=s["clients"], model=s["model"], algorithm="dfedsam-mgs", topology="ring",
                      gossip_steps=4, local_steps=s["local_steps"], batch_size=8, rounds=2, eval_every=2,
                      client_chunk=s["clients"], device=device_name, progress=False, seed=0)

    def compare(a, b) -> dict:
        return {"equal": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max())}

    runs = {mode: [dfl.run(base.replace(kernels=mode), data=data).params for _ in range(2)]
            for mode in ("deterministic", "fast")}
    half = dfl.run(base.replace(client_chunk=max(1, s["clients"] // 2)), data=data).params
    print(json.dumps({"model": s["model"], "clients": s["clients"], "device": device_name,
                      "deterministic": compare(*runs["deterministic"]), "fast": compare(*runs["fast"]),
                      "chunk": compare(runs["deterministic"][0], half)}))
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
    if name == "paper":
        return paper_worker(*rest)
    if name == "determinism":
        return determinism_worker(*rest)
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

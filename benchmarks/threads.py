"""Thread settings on an idle and on a busy machine: which thread count and OpenMP wait behaviour keeps dfl fast.

The benchmark makes the load itself: for each load level it starts that many busy processes beside the run (0, 1
and 2 of them by default; `--busy-kind torch`, the default: another torch job without dfl, one thread per core
and libgomp's default spin, running small matmuls, like a neighbouring test suite; `python`: a Python loop that
never sleeps, one core's worth of work), then runs every
setting in a fresh Python process, alternating the settings (A, B, C, A, B, C, ...), so a drift of the machine
hits all of them. For every run it records the wall time of `dfl.run` (set-up, rounds and evaluations), the
seconds per round, the 1-minute load average after the run and the mean number of runnable tasks seen while it
ran (`procs_running` of /proc/stat, sampled every 0.2 s: the instantaneous load, which the 1-minute average only
approaches).

A setting is environment variables read when torch loads its OpenMP runtime, plus what a process can change
later (torch's intra-op and inter-op thread counts, a thread count per phase). The OpenMP runtime of torch's
CPU wheel on Linux is GNU libgomp (`torch/lib/libgomp.so.1`): it reads OMP_WAIT_POLICY and GOMP_SPINCOUNT
(KMP_BLOCKTIME is Intel's libiomp and is ignored here). libgomp's default spin before a waiting thread sleeps is
300,000 iterations of a `pause` loop (GOMP_SPINCOUNT unset, fewer threads than CPUs), milliseconds on a CPU whose
`pause` takes ~140 cycles; OMP_WAIT_POLICY=PASSIVE is a spin count of 0.

Settings (`--settings`; `NAME` or `NAME:VALUE`):
  today        torch's defaults, as before dfl chose threads: one thread per core, libgomp's default spin
               (torch is imported before dfl, so dfl's start-up cannot change the OpenMP environment)
  auto         dfl's default (`threads = "auto"`, nothing set by hand): what `dfl run` does now
  threads:N    N threads (OMP_NUM_THREADS=N), libgomp's default spin
  passive      OMP_WAIT_POLICY=PASSIVE: a waiting thread sleeps at once
  spin:N       GOMP_SPINCOUNT=N: spin N times, then sleep
  interop:N    torch.set_num_interop_threads(N) beside today's setting
  evalthreads:N  today's setting for training, N threads while evaluating (a per-phase thread count)
  loadaware    threads = cores minus the busy tasks seen at start (procs_running - 1), today's spin

Workloads (`--workloads`): `main`, the default job (`dfl run`: DFedSAM-MGS, ring, 16 clients, cnn1d,
MNIST-1D) for `--rounds` rounds, evaluation every 5 rounds; `fedavg-MODEL-CLIENTS` (e.g. `fedavg-mlp-10`,
`fedavg-cnn1d-100`), FedAvg with one local epoch per round, the workload of benchmarks/flower.py and pfl.py,
evaluation every round.

    python benchmarks/threads.py --loads 0 1 2 --repeats 2 --markdown out.md --json out.json
    python benchmarks/threads.py --loads 2 --settings today auto threads:1 passive spin:10000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_SETTINGS = ["today", "auto", "threads:1", "passive", "spin:10000"]
OMP_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME",
            "DFL_THREADS")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def procs_running() -> int:
    """Runnable tasks right now, this process's sampling thread included (/proc/stat)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------------------------------------ the worker
def workload_config(name: str, rounds: int):
    import dfl

    if name == "main":
        return dfl.Config(rounds=rounds, progress=False)
    if name.startswith("fedavg-"):  # fedavg-MODEL-CLIENTS, e.g. fedavg-mlp-10, fedavg-cnn1d-100
        from benchmarks.flower import Workload

        _, model, clients = {"fedavg-mlp10": "fedavg-mlp-10"}.get(name, name).split("-")
        return Workload(model=model, clients=int(clients), rounds=rounds).config()
    raise SystemExit(f"unknown workload {name!r}")


def worker(setting: str, workload: str, rounds: int, out: Path) -> None:
    name, _, value = setting.partition(":")
    busy_at_start = procs_running() - 1  # this process itself is running
    if name in ("today", "interop", "evalthreads", "loadaware"):
        import torch  # before dfl: dfl's start-up sees torch loaded and leaves the OpenMP environment alone
    import dfl  # isort: skip (after torch or before it, as the setting says)
    import torch

    config = workload_config(workload, rounds)
    threads = None
    if name in ("today", "interop", "evalthreads"):
        threads = cores()
    elif name == "loadaware":
        threads = max(1, cores() - max(0, busy_at_start))
    elif name in ("threads", "passive", "spin"):
        threads = int(os.environ.get("OMP_NUM_THREADS", cores()))
    if threads is not None:
        torch.set_num_threads(threads)
        if "threads" in {f.name for f in __import__("dataclasses").fields(config)}:
            config = config.replace(threads=threads)
    if name == "interop":
        torch.set_num_interop_threads(int(value))
    if name == "evalthreads":
        from dfl.engine.experiment import Experiment

        evaluate = Experiment.evaluate

        def evaluate_with(self, *args, **kwargs):
            before = torch.get_num_threads()
            torch.set_num_threads(int(value))
            try:
                return evaluate(self, *args, **kwargs)
            finally:
                torch.set_num_threads(before)

        Experiment.evaluate = evaluate_with
    tic = time.perf_counter()
    result = dfl.run(config)
    wall = time.perf_counter() - tic
    out.write_text(json.dumps({
        "wall_s": wall, "run_s": result.summary["wall_seconds"], "rounds": rounds,
        "test_acc": result.history[-1]["test_acc"], "torch_threads": torch.get_num_threads(),
        "busy_at_start": busy_at_start,
        "env": {k: os.environ[k] for k in OMP_VARS if k in os.environ}}))


def setting_env(setting: str) -> dict[str, str]:
    """The environment of a setting's process: os.environ without the OpenMP variables, then the setting's."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    name, _, value = setting.partition(":")
    if name == "threads":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = value
    elif name == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif name == "spin":
        env["GOMP_SPINCOUNT"] = value
    elif name not in ("today", "auto", "interop", "evalthreads", "loadaware"):
        raise SystemExit(f"unknown setting {setting!r}")
    return env


# ------------------------------------------------------------------------------------------------ the driver
def spawn(setting: str, workload: str, rounds: int) -> dict:
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            samples.append(procs_running() - 1)  # the sampling thread itself

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", setting, "--worker-out", str(out),
               "--workloads", workload, "--rounds", str(rounds)]
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        tic = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=setting_env(setting))
        process_s = time.perf_counter() - tic
        stop.set()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit(f"{setting} worker failed:\n{proc.stderr[-3000:]}")
        record = json.loads(out.read_text())
    record.update(setting=setting, workload=workload, process_s=process_s,
                  loadavg_1min_after=os.getloadavg()[0],
                  runnable_mean=statistics.fmean(samples) if samples else float("nan"))
    return record


# A busy neighbour: "python" is a loop that never sleeps (one core's worth of work, no threads); "torch" is another
# torch job as it runs without dfl (torch imported alone: one thread per core, libgomp's default spin) doing
# small matmuls in a loop, like a neighbouring test suite or training script.
BUSY = {"python": "while True: pass",
        "torch": "import torch\nx, w = torch.randn(256, 512), torch.randn(512, 512)\nwhile True: (x @ w).relu_().sum()"}


def start_busy(count: int, kind: str) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    return [subprocess.Popen([sys.executable, "-c", BUSY[kind]], stdin=subprocess.DEVNULL, env=env)
            for _ in range(count)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait()


def span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def table(records: list[dict], settings: list[str]) -> list[str]:
    """One row per (workload, busy kind, busy processes): each setting's median wall seconds and its ratio to the
    best setting of the row, the loads seen, and dfl's default against the best and against today's default."""
    med = statistics.median
    rows = ["| workload | busy | load: 1-min avg after / runnable seen | " + " | ".join(settings)
            + " | auto / best | auto / today |", "|---|---|---|" + "---:|" * (len(settings) + 2)]
    def key(r: dict) -> tuple:
        return r["workload"], r.get("busy_kind", "python"), r["busy"]

    for workload, kind, busy in sorted({key(r) for r in records}):
        group = [r for r in records if key(r) == (workload, kind, busy)]
        walls = {s: [r["wall_s"] for r in group if r["setting"] == s] for s in settings}
        best = min(med(v) for v in walls.values() if v)
        loads = [r["loadavg_1min_after"] for r in group]
        runnable = [r["runnable_mean"] for r in group]
        cells = [f"{med(v):.1f} ({med(v) / best:.2f}×)" if v else "—" for v in walls.values()]
        auto, today = walls.get("auto"), walls.get("today")
        cells.append(f"{med(auto) / best:.2f}×" if auto else "—")
        cells.append(f"{med(auto) / med(today):.2f}×" if auto and today else "—")
        rows.append(f"| {workload} | {busy} × {kind} | {span(loads, '{:.1f}')} / {span(runnable, '{:.1f}')} | "
                    + " | ".join(cells) + " |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", nargs="+", type=int, default=[0, 1, 2], help="busy processes beside the run")
    p.add_argument("--busy-kind", choices=sorted(BUSY), default="torch",
                   help="what a busy process runs: another torch job (default) or a plain Python loop")
    p.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS)
    p.add_argument("--workloads", nargs="+", default=["main", "fedavg-mlp-10", "fedavg-cnn1d-100"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None, metavar="PATH", help="the records (appended to when the file exists)")
    p.add_argument("--markdown", default=None, metavar="PATH")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.workloads[0], args.rounds, Path(args.worker_out))
    for s in args.settings:
        setting_env(s)  # refuse a mistyped setting before any run
    import torch

    head = (f"{platform.machine()}, {cores()} cores, torch {torch.__version__}, "
            f"{torch.__config__.parallel_info().splitlines()[-1].strip()}")
    print(head, flush=True)
    records: list[dict] = []
    if args.json and Path(args.json).is_file():
        records = json.loads(Path(args.json).read_text())["records"]
    for busy in args.loads:
        procs = start_busy(busy, args.busy_kind)
        try:
            time.sleep(2.0 if busy else 0.0)
            for workload in args.workloads:
                for repeat in range(args.repeats):
                    for setting in args.settings:  # alternating: A, B, C, A, B, C
                        record = spawn(setting, workload, args.rounds)
                        record.update(busy=busy, busy_kind=args.busy_kind, repeat=repeat)
                        records.append(record)
                        print(f"busy {busy} {workload:13s} {setting:14s} wall {record['wall_s']:6.1f} s "
                              f"(process {record['process_s']:5.1f} s) threads {record['torch_threads']} "
                              f"load {record['loadavg_1min_after']:.1f} runnable {record['runnable_mean']:.1f} "
                              f"acc {record['test_acc']:.3f}", flush=True)
                        if args.json:
                            Path(args.json).write_text(json.dumps({"head": head, "records": records}, indent=1))
        finally:
            stop_busy(procs)
    settings = list(dict.fromkeys(r["setting"] for r in records))
    lines = table(records, settings)
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text(f"# Thread settings under load ({time.strftime('%Y-%m-%d')})\n\n{head}.\n\n"
                                       f"Command: `python benchmarks/threads.py {' '.join(sys.argv[1:])}`\n\n"
                                       "Median wall seconds of `dfl.run` per setting (its ratio to the best "
                                       "setting of the row).\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

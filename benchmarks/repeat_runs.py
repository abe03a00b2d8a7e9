"""Several `dfl.run` calls in one process: does each one plan, fit and run as the first did?

A script, a notebook or a sweep in one process runs one experiment after another, often keeping each `Result`.
This runs the same configuration `--runs` times in one process and prints, per run: seconds, the process's
resident memory at its start, its peak resident memory during the run (Linux `VmHWM`, reset before each run),
the client chunk it planned and its final test accuracy (equal across runs: same seed).

    python benchmarks/repeat_runs.py                                  # mlp × 10,000 clients, 2 runs, Results kept
    python benchmarks/repeat_runs.py --drop-results --clients 2000
"""

from __future__ import annotations

import argparse
import gc
import time

import dfl
from dfl.config import Config


def status_gib(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in GiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Reset the process's peak resident memory (VmHWM) to its current one (Linux clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--model", default="mlp")
    p.add_argument("--samples", type=int, default=125_000, help="MNIST-1D samples (train and test together)")
    p.add_argument("--local-steps", type=int, default=2)
    p.add_argument("--client-eval-samples", type=int, default=1000)
    p.add_argument("--drop-results", action="store_true", help="drop each Result before the next run")
    args = p.parse_args()
    config = Config(model=args.model, clients=args.clients, rounds=1, algorithm="dfedsam", partition="iid",
                    dataset_options={"num_samples": args.samples}, local_steps=args.local_steps,
                    client_eval_samples=args.client_eval_samples, progress=False)
    print(f"{args.runs} runs of dfedsam, {args.model} × {args.clients:,} clients, 1 round of {args.local_steps} "
          f"steps, MNIST-1D {args.samples:,} samples, Results {'dropped' if args.drop_results else 'kept'}")
    kept = []
    for i in range(1, args.runs + 1):
        reset_peak()
        start, tic = status_gib("VmRSS"), time.perf_counter()
        result = dfl.run(config)
        print(f"  run {i}: {time.perf_counter() - tic:6.1f} s, resident at start {start:5.2f} GiB, peak "
              f"{status_gib('VmHWM'):5.2f} GiB, client_chunk {result.summary['client_chunk']}, "
              f"test_acc {result.history[-1]['test_acc']:.4f}", flush=True)
        if not args.drop_results:
            kept.append(result)
        del result
        gc.collect()
    print(f"  resident after the last run: {status_gib('VmRSS'):.2f} GiB ({len(kept)} Results kept)")


if __name__ == "__main__":
    main()

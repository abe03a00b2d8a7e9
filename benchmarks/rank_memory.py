"""Peak memory per rank: one `dfl run` under torchrun with 1 and with P processes (gloo on the CPU), each rank's
peak resident set (`getrusage(RUSAGE_SELF).ru_maxrss`) reported next to the world-1 peak.

A run hosts m clients as rows of one [m, d] stack; with P processes each rank should hold only its block of
m/P rows, so its peak should be about 1/P of the world-1 peak plus a fixed part (the interpreter, torch, the
data, the model). The run does everything that used to gather all m rows onto every rank: one round of training,
an evaluation (averaged model, every client, consensus distance), a checkpoint, the final parameters (params.pt in
one process; params.shards/, every rank its own rows, under torchrun) and the Result.

    python benchmarks/rank_memory.py                               # mlp x 3,000 clients, worlds 1 and 2
    python benchmarks/rank_memory.py --clients 3000 6000 --worlds 1 2 --json out.json --markdown out.md

Each (clients, world) is a fresh `torchrun --standalone --nproc_per_node=P -m benchmarks.rank_memory --worker
...` whose ranks run `dfl run` in-process and write their own peak to a file; rounds, evaluation and checkpoint
settings are the same for every world. OMP_NUM_THREADS=1 per rank (two ranks share the 2-core machine). No
timing is measured, so a loaded machine changes nothing but the wall time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_args(clients: int, out: Path, samples_per_client: int) -> list[str]:
    """The `dfl run` arguments of one measurement: mlp on MNIST-1D, one round, evaluated and checkpointed."""
    return ["run", "--clients", str(clients), "--model", "mlp", "--dataset", "mnist1d",
            "--dataset-options", f"num_samples={clients * samples_per_client}", "--partition", "iid",
            "--rounds", "1", "--eval-every", "1", "--checkpoint-every", "1", "--local-steps", "2",
            "--client-eval-samples", "100", "--train-eval-samples", "200", "--no-progress", "--device", "cpu",
            "--backend", "gloo", "--dist-timeout", "600", "--out", str(out)]


def worker(report_dir: str, args: list[str]) -> int:
    """One torchrun rank: `dfl run args`, then this process's peak RSS to report_dir/rank<r>.json."""
    from dfl.cli import main

    code = main(args)
    rank = int(os.environ.get("RANK", "0"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    Path(report_dir, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "peak_rss_bytes": peak, "exit": code}))
    return code or 0


def measure(clients: int, world: int, samples_per_client: int) -> list[dict]:
    """Peak RSS of every rank of one torchrun world (rank order)."""
    work = Path(tempfile.mkdtemp(prefix="dfl_rank_memory_"))
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               "-m", "benchmarks.rank_memory", "--worker", str(work), "--",
               *run_args(clients, work / "run", samples_per_client)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"world {world}, {clients} clients failed:\n{proc.stdout[-2000:]}\n"
                               f"{proc.stderr[-4000:]}")
        ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(world)]
        summary = json.loads((work / "run" / "summary.json").read_text())
        for r in ranks:
            r.update(clients=clients, world=world, num_params=summary["num_params"],
                     stack_bytes=clients * summary["num_params"] * 4)
        return ranks
    finally:
        shutil.rmtree(work, ignore_errors=True)


def markdown(records: list[dict], command: str) -> str:
    gib = 2**30
    lines = ["# Peak memory per rank", "",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or 'cpu'}, "
             f"torch {__import__('torch').__version__}, gloo, one thread per rank", "", f"`{command}`", "",
             "mlp (d = 50,410) on MNIST-1D (iid), one round of dfedsam-mgs with evaluation, checkpoint, final "
             "parameters and the Result. Ratio: the rank's peak RSS over the world-1 peak of the same m.", "",
             "| clients | [m, d] stack | world | rank | peak RSS | ratio to world 1 |",
             "| --- | --- | --- | --- | --- | --- |"]
    one = {r["clients"]: r["peak_rss_bytes"] for r in records if r["world"] == 1}
    for r in records:
        base = one.get(r["clients"])
        ratio = f"{r['peak_rss_bytes'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['clients']:,} | {r['stack_bytes'] / gib:.2f} GiB | {r['world']} | {r['rank']} | "
                     f"{r['peak_rss_bytes'] / gib:.2f} GiB | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        split = argv.index("--")
        return worker(argv[1], argv[split + 1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[3000], help="m (default 3000)")
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2], help="process counts (default 1 2)")
    p.add_argument("--samples-per-client", type=int, default=10, help="MNIST-1D samples per client (default 10)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the records to PATH (JSON)")
    p.add_argument("--markdown", default=None, metavar="PATH", help="write the table to PATH (markdown)")
    args = p.parse_args(argv)
    if 1 not in args.worlds:
        p.error("--worlds must include 1 (the reference every ratio is taken against)")
    records = []
    for clients in args.clients:
        for world in sorted(args.worlds):
            ranks = measure(clients, world, args.samples_per_client)
            records += ranks
            base = next(r["peak_rss_bytes"] for r in records if r["clients"] == clients and r["world"] == 1)
            print(f"clients {clients:>6}  world {world}: " + ", ".join(
                f"rank {r['rank']} {r['peak_rss_bytes'] / 2**30:.2f} GiB ({r['peak_rss_bytes'] / base:.2f}x)"
                for r in ranks), flush=True)
    command = "python benchmarks/rank_memory.py " + " ".join(argv)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "records": records}, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(records, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())

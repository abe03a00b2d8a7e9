"""Scale: setup time, seconds per round, the gossip share of a round and peak memory for m = 1k … 100k clients.

Every size runs `dfl.run` in its own process (so its peak RSS is its own) on FedProx's Synthetic(1, 1)
data (generated offline; `--samples` per client), DFedSAM-MGS with Q = 4 on a ring, one process:

    python benchmarks/scale.py                                   # logreg 1k, 10k, 100k; mlp 1k, 10k
    python benchmarks/scale.py --runs logreg:100000 --rounds 3

For each run it prints
- setup: seconds from `dfl.run` to the start of round 1 (data, partition, topology, model, stack,
  the memory probe that sets `client_chunk = "auto"`);
- s/round: wall time of a round (local training + gossip), median over the rounds;
- local / gossip: the time in `LocalTrainer.train` and in `Gossip.mix`, and the gossip share of a round;
- round / local: how many times a round takes its local training alone (1 = no overhead at all);
- eval: seconds of one evaluation (averaged model, every client's accuracy on `--client-eval-samples`
  test samples, consensus distance), which runs every `eval_every` rounds, not every round;
- peak RSS of the process and the chunk that "auto" chose.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

DEFAULT_RUNS = ("logreg:1000", "logreg:10000", "logreg:100000", "mlp:1000", "mlp:10000")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=list(DEFAULT_RUNS), metavar="MODEL:CLIENTS")
    p.add_argument("--rounds", type=int, default=3, help="rounds per run after a warm-up round (default 3, >= 2)")
    p.add_argument("--samples", type=int, default=20, help="training samples per client (default 20)")
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--gossip-steps", type=int, default=4)
    p.add_argument("--topology", default="ring")
    p.add_argument("--client-eval-samples", type=int, default=500)
    p.add_argument("--test-fraction", type=float, default=0.1, help="of each client's samples (default 0.1)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is stopped")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one MODEL:CLIENTS here
    args = p.parse_args(argv)
    for spec in args.runs + ([args.one] if args.one else []):
        model, _, clients = spec.partition(":")
        if model not in ("logreg", "mlp", "cnn1d") or not clients.isdigit() or int(clients) < 2:
            p.error(f"--runs entries are MODEL:CLIENTS with MODEL in logreg, mlp and CLIENTS >= 2; got {spec!r}")
    return args


def run_one(args) -> dict:
    """One size in this process: dfl.run with timers around local training and gossip."""
    import torch

    import dfl
    import dfl.engine.setup as setup
    import dfl.network.gossip as gossip_module
    from dfl.network.gossip import Gossip
    from dfl.training.local import LocalTrainer

    model, clients = args.one.split(":")
    clients = int(clients)
    timers = {"train": [], "mix": [], "round_start": []}

    class TimedTrainer(LocalTrainer):
        def train(self, *a, **k):
            timers["round_start"].append(time.perf_counter())
            tic = time.perf_counter()
            out = super().train(*a, **k)
            timers["train"].append(time.perf_counter() - tic)
            return out

    class TimedGossip(Gossip):
        def mix(self, *a, **k):
            tic = time.perf_counter()
            out = super().mix(*a, **k)
            timers["mix"].append(time.perf_counter() - tic)
            return out

    setup.LocalTrainer = TimedTrainer  # Experiment builds the run's trainer in this module (setup.trainer)
    gossip_module.Gossip = TimedGossip  # the run's Gossip is built from this module (run_network.Network.gossip)
    # ~args.samples training samples per client: LogNormal with σ = 0 is exactly e^μ, plus min_samples
    base = max(2, args.samples // 2)
    options = {"num_clients": clients, "size_log_mean": math.log(args.samples - base + 1), "size_log_sigma": 0.0,
               "min_samples": base, "test_fraction": args.test_fraction}
    config = dfl.Config(
        algorithm="dfedsam-mgs", gossip_steps=args.gossip_steps, topology=args.topology, clients=clients,
        dataset="synthetic", partition="natural", dataset_options=options, model=model, rounds=args.rounds + 1,
        local_steps=args.local_steps, batch_size=args.batch_size, eval_every=10**6, train_eval_samples=0,
        client_eval_samples=args.client_eval_samples, progress=False, device="cpu",
    )
    torch.manual_seed(0)
    start = time.perf_counter()
    result = dfl.run(config)
    total = time.perf_counter() - start
    rounds = result.summary["rounds_completed"]
    # round 1 (index 0) warms up; the last round also evaluates, so rounds are timed from train start to the
    # next train start, and the evaluation is what the last round took beyond its training and gossip
    starts = timers["round_start"]
    timed = range(1, len(starts) - 1)  # round 0 warms up; the last one evaluates
    if not timed:
        raise SystemExit("scale.py needs --rounds >= 2")
    round_times = [starts[i + 1] - starts[i] for i in timed]
    train = [timers["train"][i] for i in timed]
    mix = [timers["mix"][i] for i in timed]
    eval_seconds = max(0.0, start + total - starts[-1] - timers["train"][-1] - timers["mix"][-1])
    per_round = statistics.median(round_times)
    return {
        "model": model, "clients": clients, "params": result.summary["num_params"],
        "setup_s": starts[0] - start, "round_s": per_round, "local_s": statistics.median(train),
        "gossip_s": statistics.median(mix),
        # ratios per round, then the median: a change of machine load between rounds cancels
        "gossip_share": statistics.median(g / r for g, r in zip(mix, round_times)),
        "round_over_local": statistics.median(r / t for r, t in zip(round_times, train)), "eval_s": eval_seconds,
        "rounds": rounds, "client_chunk": result.summary["client_chunk"],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "test_acc": result.summary.get("test_acc"),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return 0
    print(f"DFedSAM-MGS (Q = {args.gossip_steps}) on a {args.topology}, Synthetic(1,1) ~{args.samples} samples per "
          f"client, {args.local_steps} SAM steps of batch {args.batch_size}, one process, CPU "
          f"({os.cpu_count()} cores); each size in its own process")
    header = (f"{'model':7s} {'clients':>8s} {'setup s':>8s} {'s/round':>8s} {'local s':>8s} {'gossip s':>8s} "
              f"{'gossip %':>8s} {'rnd/local':>9s} {'eval s':>7s} {'peak GiB':>8s} {'chunk':>6s}")
    print(header)
    results, failed = [], 0
    for spec in args.runs:
        command = [sys.executable, os.path.abspath(__file__), "--one", spec, "--runs", spec]
        for flag in ("rounds", "samples", "local_steps", "batch_size", "gossip_steps", "topology",
                     "client_eval_samples", "test_fraction"):
            command += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{spec}: stopped after {args.timeout:.0f} s")
            failed += 1
            continue
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"{spec}: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            failed += 1
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        results.append(r)
        print(f"{r['model']:7s} {r['clients']:8d} {r['setup_s']:8.1f} {r['round_s']:8.2f} {r['local_s']:8.2f} "
              f"{r['gossip_s']:8.3f} {100 * r['gossip_share']:7.1f}% {r['round_over_local']:9.2f} "
              f"{r['eval_s']:7.1f} {r['peak_rss_gib']:8.2f} {r['client_chunk']:6d}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

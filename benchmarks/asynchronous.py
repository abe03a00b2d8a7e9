"""Cost of the asynchronous mode (`mode = "async"`, `dfl.engine.asynchronous`) per client update, against the
synchronous engine on the same setup: DFedAvg and D-PSGD on MNIST-1D (iid), `mlp`, a ring, one process.

    python benchmarks/asynchronous.py                       # 128 clients, 5 local steps, 6 rounds after a warm-up
    python benchmarks/asynchronous.py --clients 256 --rounds 4

The variants of one algorithm share the data and run in one process, round by round in turn, so a change in machine
load hits all of them; the ratio to the synchronous round is the median of the per-round ratios. Printed per
variant: seconds per round (median), milliseconds per client update (a DFedAvg update = one client's K local steps
and its mix; a D-PSGD update = one step and a mix), the ratio, the waves per round (vectorized batches of events;
1 = as batched as a synchronous round) and the share of the async rounds spent in the event clocks
(`dfl.network.async_events`, pure Python). Variants: sync; async with equal speeds; async with 25% stragglers
(4× slower) and unbounded staleness; the same with max_staleness = 1.
"""

from __future__ import annotations

import argparse
import statistics
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6, help="timed rounds, after one warm-up round (default 6)")
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--model", default="mlp")
    p.add_argument("--topology", default="ring")
    return p.parse_args(argv)


VARIANTS = {
    "sync": dict(mode="sync"),
    "async, equal speeds": dict(mode="async"),
    "async, 25% stragglers": dict(mode="async", stragglers=0.25),
    "async, 25% stragglers, max_staleness 1": dict(mode="async", stragglers=0.25, max_staleness=1),
}


def compare(args, algorithm: str) -> dict[str, dict]:
    """Every variant of `algorithm`, round by round in turn."""
    from dfl.config import Config
    from dfl.engine.experiment import Experiment
    from dfl.engine.setup import build_data
    from dfl.engine.validation import validate
    from dfl.network import async_events
    from dfl.network.comm import LocalCommunicator

    base = dict(algorithm=algorithm, clients=args.clients, model=args.model, topology=args.topology,
                local_steps=args.local_steps, rounds=args.rounds + 1, progress=False, device="cpu", partition="iid")
    data = build_data(validate(Config(**base)))
    runs = {name: Experiment(validate(Config(**base, **changes)), data, None, False, LocalCommunicator(args.clients),
                             False) for name, changes in VARIANTS.items()}
    seconds = {name: [] for name in runs}
    clock = {name: 0.0 for name in runs}
    advance = async_events.EventSchedule.advance
    current = [None]

    def timed(self, mixes):
        tic = time.perf_counter()
        try:
            return advance(self, mixes)
        finally:
            clock[current[0]] += time.perf_counter() - tic

    async_events.EventSchedule.advance = timed
    try:
        for t in range(args.rounds + 1):
            for name, exp in runs.items():
                current[0] = name
                tic = time.perf_counter()
                exp.train_round(t)
                if t > 0:  # round 0 warms up (first calls, allocations)
                    seconds[name].append(time.perf_counter() - tic)
                else:
                    clock[name] = 0.0
    finally:
        async_events.EventSchedule.advance = advance
    updates = args.clients * (args.local_steps if algorithm == "dpsgd" else 1)
    out = {}
    for name, exp in runs.items():
        engine = getattr(exp.algorithm, "engine", None)
        per_round = statistics.median(seconds[name])
        out[name] = {"s/round": per_round, "ms/update": 1000 * per_round / updates,
                     "ratio": statistics.median(s / b for s, b in zip(seconds[name], seconds["sync"])),
                     "waves/round": None if engine is None else engine.waves / (args.rounds + 1),
                     "clock share": clock[name] / sum(seconds[name])}
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"{args.clients} clients, {args.model}, {args.topology}, {args.local_steps} local steps, MNIST-1D "
          f"(iid), median of {args.rounds} rounds after a warm-up, variants in turn")
    print("| algorithm | variant | s/round | ms per client update | vs sync (median ratio) | waves/round | clocks |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for algorithm in ("dfedavg", "dpsgd"):
        for name, r in compare(args, algorithm).items():
            waves = "—" if r["waves/round"] is None else f"{r['waves/round']:.1f}"
            print(f"| {algorithm} | {name} | {r['s/round']:.3f} | {r['ms/update']:.2f} | {r['ratio']:.2f}× | "
                  f"{waves} | {100 * r['clock share']:.1f}% |", flush=True)


if __name__ == "__main__":
    main()

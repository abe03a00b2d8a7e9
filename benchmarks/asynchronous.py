"""Cost of the asynchronous mode (`mode = "async"`, `dfl.asynchronous`) per client update, against the synchronous
engine on the same setup: DFedAvg and D-PSGD on MNIST-1D, `mlp`, a ring, one process.

    python benchmarks/asynchronous.py                       # 128 clients, 5 local steps, 6 rounds after a warm-up
    python benchmarks/asynchronous.py --clients 256 --rounds 4

For each variant it prints the seconds per round (median of the rounds after the first), the milliseconds per
client update (a DFedAvg update = one client's K local steps and its mix; a D-PSGD update = one step and a
mix), the waves per round (vectorized batches of events; 1 = as batched as the synchronous round) and the share
of a round spent in the event clocks (`dfl.async_events`, pure Python). Variants: sync; async with equal speeds;
async with 25% stragglers (4× slower) and unbounded staleness; the same with max_staleness = 1.
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


def measure(args, algorithm: str, changes: dict) -> dict:
    import dfl
    from dfl import async_events
    from dfl.config import Config

    config = Config(algorithm=algorithm, clients=args.clients, model=args.model, topology=args.topology,
                    local_steps=args.local_steps, rounds=args.rounds + 1, eval_every=args.rounds + 1,
                    progress=False, client_eval_samples=100, train_eval_samples=100, device="cpu",
                    partition="iid", **changes)
    clock = [0.0]
    advance = async_events.EventSchedule.advance

    def timed(self, mixes):
        tic = time.perf_counter()
        try:
            return advance(self, mixes)
        finally:
            clock[0] += time.perf_counter() - tic

    async_events.EventSchedule.advance = timed
    try:
        from dfl import runner

        seconds = []
        train_round = runner.Experiment.train_round

        def wrapped(self, t):
            tic = time.perf_counter()
            out = train_round(self, t)
            seconds.append(time.perf_counter() - tic)
            engine = getattr(self.algorithm, "engine", None)
            waves.append(engine.waves if engine is not None else t + 1)
            return out

        waves: list[int] = []
        runner.Experiment.train_round = wrapped
        try:
            dfl.run(config)
        finally:
            runner.Experiment.train_round = train_round
    finally:
        async_events.EventSchedule.advance = advance
    timed_rounds = seconds[1:]
    per_round = statistics.median(timed_rounds)
    updates = args.clients if algorithm != "dpsgd" else args.clients * args.local_steps
    return {"s/round": per_round, "ms/update": 1000 * per_round / updates,
            "waves/round": (waves[-1] - waves[0]) / max(len(waves) - 1, 1) if changes.get("mode") == "async" else None,
            "clock share": clock[0] / sum(seconds) if changes.get("mode") == "async" else 0.0}


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"{args.clients} clients, {args.model}, {args.topology}, {args.local_steps} local steps, MNIST-1D "
          f"(iid), median of {args.rounds} rounds after a warm-up")
    print("| algorithm | variant | s/round | ms per client update | vs sync | waves/round | clock share |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for algorithm in ("dfedavg", "dpsgd"):
        base = None
        for name, changes in VARIANTS.items():
            r = measure(args, algorithm, changes)
            base = base or r["s/round"]
            waves = "—" if r["waves/round"] is None else f"{r['waves/round']:.1f}"
            print(f"| {algorithm} | {name} | {r['s/round']:.3f} | {r['ms/update']:.2f} | "
                  f"{r['s/round'] / base:.2f}× | {waves} | {100 * r['clock share']:.0f}% |", flush=True)


if __name__ == "__main__":
    main()

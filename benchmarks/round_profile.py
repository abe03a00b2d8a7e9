"""Where a complete `dfl.run` round spends its time (torch.profiler), by part of the round.

Runs `dfl.run` (no run directory) for each (algorithm, model) case, e.g. FedAvg and DFedSAM-MGS on mlp and
cnn1d with 100 clients, and profiles the rounds after `--warmup` rounds. The script does not change the
engine: it wraps a few of its functions in `torch.profiler.record_function` ranges (by patching them in this
process only) and attributes every profiled op's self time to the innermost range it runs in:

- fwd/bwd matmul: matrix products and convolutions (mm, addmm, bmm, matmul, convolution ops and their
  backward) inside the vectorized gradient calls (`LocalTrainer._grad`, vmap(grad(loss)));
- fwd/bwd other: every other op in those calls (activations, cross-entropy, reductions, vmap's copies);
- local other: the rest of `LocalTrainer.train` (split/join of the stacked rows, the SAM point, the update,
  momentum, the loss sum);
- sampling: `RoundSchedule` (the round's index schedule, `batch`: gather of x/y/weights);
- gossip: `Gossip.mix` (and the algorithm's round outside local training: "round other");
- checks: the runner's finiteness check (`_check_finite`);
- evaluation: `Experiment.evaluate` (metrics of evaluated rounds: the averaged model on the test set, every
  client on the test set, consensus distance) and `record`, its matmuls/convolutions separately;
- python/unattributed: wall time of the profiled rounds not covered by any op above (interpreter, profiler).

The share outside the model's forward/backward is everything but the two fwd/bwd rows, once over the whole
profiled rounds and once with the evaluation rows left out (the rounds' training alone; evaluation runs every
`--eval-every` rounds and is mostly the model's forward on the test set). Profiler overhead inflates op-heavy
parts, and so does a busy machine (with 2 threads on 2 shared cores every parallel op can wait a time slice);
the unprofiled seconds per round of the same run are printed next to it.

    python benchmarks/round_profile.py                       # FedAvg & DFedSAM-MGS × mlp & cnn1d, 100 clients
    python benchmarks/round_profile.py --models logreg --clients 300 --algorithms dfedsam
    python benchmarks/round_profile.py --md benchmarks/results/round_profile-DATE.md
    python benchmarks/round_profile.py --pfl-workload --algorithms fedavg --models mlp --clients 100 --threads 1

`--pfl-workload` profiles the FedAvg workload of benchmarks/pfl.py and benchmarks/flower.py instead (MNIST-1D,
20,000 samples, IID, one local epoch of batch-32 SGD, lr 0.1, size-weighted averaging). Every case also reports
the achieved GFLOP/s of its local training (the FLOPs of the model's forward and backward per sample, counted by
`torch.utils.flop_counter`, times the samples a round trains on) against an fp32 matmul peak measured in the same
process (benchmarks/throughput.py's 2048² product), over the unprofiled round and over the profiled fwd/bwd time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import itertools
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.flower, benchmarks.throughput

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import dfl
import dfl.engine.experiment as experiment
from benchmarks import throughput  # noqa: E402
from dfl.config import Config
from dfl.data.sampler import RoundSchedule
from dfl.network.gossip import Gossip
from dfl.training.local import LocalTrainer

MATMUL_OPS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "aten::_mkldnn_convolution",
    "aten::mkldnn_convolution", "aten::convolution", "aten::_convolution", "aten::convolution_backward", "aten::conv1d",
    "aten::conv2d", "aten::addbmm", "aten::_convolution_mode", "aten::thnn_conv2d", "aten::_slow_conv2d_forward",
    "aten::_slow_conv2d_backward",
}
RANGES = ["dfl:fwd_bwd", "dfl:local", "dfl:sampling", "dfl:gossip", "dfl:round", "dfl:checks", "dfl:evaluation"]
ROWS = ["fwd/bwd matmul", "fwd/bwd other", "local other", "sampling", "gossip", "round other", "checks",
        "evaluation matmul", "evaluation other", "python/unattributed"]


def _wrap(fn, label):
    @functools.wraps(fn)
    def wrapped(*a, **k):
        with record_function(label):
            return fn(*a, **k)
    return wrapped


@contextlib.contextmanager
def instrumented(state):
    """Patch the engine's parts with record_function ranges; start the profiler before round `state['start']`."""
    saved = []

    def patch(owner, name, new):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    init = LocalTrainer.__init__

    def trainer_init(self, *a, **k):
        init(self, *a, **k)
        self._grad = _wrap(self._grad, "dfl:fwd_bwd")

    patch(LocalTrainer, "__init__", trainer_init)
    patch(LocalTrainer, "train", _wrap(LocalTrainer.train, "dfl:local"))
    patch(RoundSchedule, "__init__", _wrap(RoundSchedule.__init__, "dfl:sampling"))
    patch(RoundSchedule, "batch", _wrap(RoundSchedule.batch, "dfl:sampling"))
    patch(Gossip, "mix", _wrap(Gossip.mix, "dfl:gossip"))
    patch(experiment, "_check_finite", _wrap(experiment._check_finite, "dfl:checks"))
    patch(experiment.Experiment, "evaluate", _wrap(experiment.Experiment.evaluate, "dfl:evaluation"))
    patch(experiment.Experiment, "record", _wrap(experiment.Experiment.record, "dfl:evaluation"))
    train_round = experiment.Experiment.train_round

    def timed_round(self, t):
        if t == state["start"]:
            state["prof"].start()
            state["tic"] = time.perf_counter()
        elif t < state["start"]:
            tic = time.perf_counter()
            out = train_round(self, t)
            state["plain"].append(time.perf_counter() - tic)
            return out
        with record_function("dfl:round"):
            return train_round(self, t)

    patch(experiment.Experiment, "train_round", timed_round)
    try:
        yield
    finally:
        for owner, name, old in reversed(saved):
            setattr(owner, name, old)


def attribute(events) -> dict[str, float]:
    """Self CPU time (µs) of every op by row (innermost dfl range; matmul ops separately)."""
    out = defaultdict(float)
    for ev in events:
        if ev.name.startswith("dfl:") or ev.name.startswith("ProfilerStep"):
            continue
        label, p = None, ev.cpu_parent
        while p is not None:
            if p.name in RANGES:
                label = p.name
                break
            p = p.cpu_parent
        t = ev.self_cpu_time_total
        if label == "dfl:fwd_bwd":
            out["fwd/bwd matmul" if ev.name in MATMUL_OPS else "fwd/bwd other"] += t
        elif label == "dfl:local":
            out["local other"] += t
        elif label == "dfl:sampling":
            out["sampling"] += t
        elif label == "dfl:gossip":
            out["gossip"] += t
        elif label == "dfl:round":
            out["round other"] += t
        elif label == "dfl:checks":
            out["checks"] += t
        elif label == "dfl:evaluation":
            out["evaluation matmul" if ev.name in MATMUL_OPS else "evaluation other"] += t
        else:
            out["python/unattributed"] += t  # ops outside any range (e.g. the runner between rounds)
    return out


def case_config(algorithm: str, model: str, clients: int, rounds: int, eval_every: int, pfl_workload: bool) -> Config:
    """The run to profile: dfl's defaults, or benchmarks/pfl.py's FedAvg workload (`--pfl-workload`)."""
    if not pfl_workload:
        return Config(algorithm=algorithm, model=model, clients=clients, rounds=rounds, eval_every=eval_every)
    from benchmarks.flower import Workload

    config = Workload(model=model, clients=clients, rounds=rounds).config()
    return config.replace(algorithm=algorithm, eval_every=eval_every, threads=torch.get_num_threads())


def training_gflop(config: Config) -> float:
    """GFLOP of one round's local training: the model's forward + backward FLOPs per sample (a batch of the
    config's size through torch's FLOP counter) times the samples a round trains on (every client's shard once per
    local epoch; local_steps: K batches per client). SAM steps count twice."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from dfl.engine.setup import build_data
    from dfl.models import build_model

    data = build_data(config)
    net = build_model(config.model, tuple(data.input_shape), data.num_classes, **config.model_options)
    b = config.batch_size or 32
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(data.train_x[:b]), data.train_y[:b]).backward()
    per_sample = counter.get_total_flops() / b
    sizes = [len(i) for i in data.client_indices]
    if config.local_steps:
        samples = config.local_steps * sum(min(b, n) for n in sizes)
    else:
        samples = config.local_epochs * sum(sizes)
    from dfl.algorithms import resolve_hyperparameters

    passes = 2 if resolve_hyperparameters(config).get("rho", 0) > 0 else 1
    return per_sample * samples * passes / 1e9


def profile_case(algorithm: str, model: str, clients: int, rounds: int, warmup: int, eval_every: int,
                 extra: dict, pfl_workload: bool = False) -> dict:
    config = case_config(algorithm, model, clients, warmup + rounds, eval_every, pfl_workload).replace(**extra)
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
    state = {"start": warmup, "prof": prof, "plain": [], "tic": None}
    with instrumented(state):
        dfl.run(config)
        wall = time.perf_counter() - state["tic"]
        prof.stop()
    rows = attribute(prof.events())
    covered = sum(rows.values())
    rows["python/unattributed"] += max(0.0, wall * 1e6 - covered)
    total = sum(rows.values())
    return {"algorithm": algorithm, "model": model, "clients": clients, "rounds": rounds,
            "ms_per_round": {k: rows.get(k, 0.0) / 1e3 / rounds for k in ROWS},
            "total_ms": total / 1e3 / rounds, "wall_ms": wall * 1e3 / rounds,
            "plain_ms": 1e3 * min(state["plain"][1:] or state["plain"] or [float("nan")]),
            "gflop": training_gflop(config)}


def table(results: list[dict]) -> str:
    head = "| part of a round | " + " | ".join(f"{r['algorithm']} {r['model']}×{r['clients']}" for r in results) + " |"
    lines = [head, "|" + "---|" * (len(results) + 1)]
    for k in ROWS:
        cells = [f"{r['ms_per_round'][k]:.1f} ms ({100 * r['ms_per_round'][k] / r['total_ms']:.0f}%)" for r in results]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    outside = [100 * (1 - (r["ms_per_round"]["fwd/bwd matmul"] + r["ms_per_round"]["fwd/bwd other"]) / r["total_ms"])
               for r in results]
    lines.append("| **profiled round** | " + " | ".join(f"**{r['total_ms']:.1f} ms**" for r in results) + " |")
    lines.append("| outside the model's fwd/bwd | " + " | ".join(f"{o:.0f}%" for o in outside) + " |")
    fwd_bwd = [r["ms_per_round"]["fwd/bwd matmul"] + r["ms_per_round"]["fwd/bwd other"] for r in results]
    training = [r["total_ms"] - r["ms_per_round"]["evaluation matmul"] - r["ms_per_round"]["evaluation other"]
                for r in results]
    lines.append("| outside the model's fwd/bwd, evaluation left out | " + " | ".join(
        f"{100 * (1 - f / t):.0f}%" for f, t in zip(fwd_bwd, training)) + " |")
    lines.append("| outside the matmuls | " + " | ".join(
        f"{100 * (1 - r['ms_per_round']['fwd/bwd matmul'] / r['total_ms']):.0f}%" for r in results) + " |")
    lines.append("| round without profiler (warm-up, min) | " + " | ".join(f"{r['plain_ms']:.1f} ms" for r in results)
                 + " |")
    if all("peak_gflops" in r for r in results):
        lines.append("| local training GFLOP a round | " + " | ".join(f"{r['gflop']:.2f}" for r in results) + " |")
        lines.append("| GFLOP/s over the unprofiled round (% of peak) | " + " | ".join(
            f"{r['gflop'] / r['plain_ms'] * 1e3:.1f} ({100 * r['gflop'] / r['plain_ms'] * 1e3 / r['peak_gflops']:.0f}%)"
            for r in results) + " |")
        lines.append("| GFLOP/s over the profiled fwd/bwd kernels (% of peak) | " + " | ".join(
            f"{r['gflop'] / r['ms_per_round']['fwd/bwd matmul'] * 1e3:.1f} "
            f"({100 * r['gflop'] / r['ms_per_round']['fwd/bwd matmul'] * 1e3 / r['peak_gflops']:.0f}%)"
            for r in results) + " |")
        lines.append("| fp32 matmul peak (2048², same process) | " + " | ".join(
            f"{r['peak_gflops']:.1f} GFLOP/s" for r in results) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithms", default="fedavg,dfedsam-mgs")
    p.add_argument("--models", default="mlp,cnn1d")
    p.add_argument("--clients", type=int, nargs="+", default=[100])
    p.add_argument("--rounds", type=int, default=5, help="profiled rounds (after the warm-up)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=5, help="rounds between evaluations (part of the profile)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--pfl-workload", action="store_true",
                   help="benchmarks/pfl.py's FedAvg workload (MNIST-1D 20,000, IID, 1 epoch of batch 32, lr 0.1)")
    p.add_argument("--md", default=None, metavar="PATH", help="also write the table (markdown) to PATH")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for algorithm, model, clients in itertools.product(args.algorithms.split(","), args.models.split(","),
                                                       args.clients):
        r = profile_case(algorithm, model, clients, args.rounds, args.warmup, args.eval_every, {}, args.pfl_workload)
        r["peak_gflops"] = throughput.matmul_peak_gflops(torch.device("cpu"), 2048)
        print(f"{algorithm} {model}×{clients}: {r['total_ms']:.1f} ms/round profiled, "
              f"{r['plain_ms']:.1f} unprofiled", flush=True)
        results.append(r)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    header = (f"# Round profile, {stamp}\n\nMachine: {cpu}, {torch.get_num_threads()} torch threads, torch "
              f"{torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}.\n"
              f"Command: `python benchmarks/round_profile.py --algorithms {args.algorithms} --models {args.models} "
              f"--clients {' '.join(map(str, args.clients))} --rounds {args.rounds} --warmup {args.warmup} "
              f"--eval-every {args.eval_every}{' --threads ' + str(args.threads) if args.threads else ''}"
              f"{' --pfl-workload' if args.pfl_workload else ''}`"
              f"\n\nSelf CPU time per round (ms, share of the profiled round), rounds {args.warmup + 1}–"
              f"{args.warmup + args.rounds}, every {args.eval_every}th evaluated.\n\n")
    text = header + table(results) + "\n"
    print(text)
    if args.md:
        with open(args.md, "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()

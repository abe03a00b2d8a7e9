"""Centralized FL baselines on MNIST-1D with Dirichlet label skew: final test accuracy, mean ± std over seeds.

Runs FedAvg, SCAFFOLD, FedSAM, MoFedSAM, FedCM, DOMO and FedGLoSS (docs/reference/update-rules.md) with `dfl.run` on
Dirichlet α ∈ {0.1, 0.6} partitions, one run per seed (the seed changes the partition, the initial model and
the client sampling), and prints a Markdown table of the global model's test accuracy after the last round.
Not a unit test: the numbers depend on the scale you choose. The defaults (30 rounds) finish in a few minutes
on 2 idle CPU cores but leave the models undertrained; `--rounds 100 --local-epochs 2` took about 15 minutes
on a loaded 2-core machine. A paper-scale run is e.g. `--clients 100 --participation 0.1 --rounds 500`.

    python benchmarks/reproduce_centralized.py
    python benchmarks/reproduce_centralized.py --rounds 100 --model cnn1d --seeds 0 1 2 --alphas 0.1 0.3 0.6
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dfl
from dfl import Config

ALGORITHMS = ("fedavg", "scaffold", "fedsam", "mofedsam", "fedcm", "domo", "fedgloss")
# Per-algorithm settings used here (the rest are each algorithm's defaults, see docs/reference/update-rules.md).
# DOMO: η_g = 1 − β, one of the two server lrs the spec suggests sweeping (η_g = 1 with β = 0.9 is a 10×
# larger effective step). FedGLoSS: the CIFAR-10 radii 0.15 are large for this small model; a smaller ρ
# matching FedSAM's is used, β = 10 as in the paper.
SETTINGS: dict[str, dict] = {
    "fedsam": {"rho": 0.05},
    "mofedsam": {"rho": 0.05},
    "domo": {"server_lr": 0.1, "domo_alpha": 1.0},
    "fedgloss": {"rho": 0.05, "server_rho": 0.05, "fedgloss_beta": 10.0},
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    p.add_argument("--alphas", nargs="+", type=float, default=[0.1, 0.6], help="Dirichlet concentrations")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--participation", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--model", default="mlp")
    p.add_argument("--hidden", nargs="+", type=int, default=[100], help="MLP hidden widths (model mlp only)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--device", default="auto")
    return p.parse_args()


def experiment(args, algorithm: str, alpha: float, seed: int) -> float:
    config = Config(
        name=f"{algorithm}-a{alpha}-s{seed}", seed=seed, algorithm=algorithm, topology="full",
        clients=args.clients, dataset="mnist1d", partition="dirichlet", alpha=alpha, model=args.model,
        model_options={"hidden": args.hidden} if args.model == "mlp" else {},
        lr=args.lr, lr_decay=1.0, batch_size=args.batch_size, local_epochs=args.local_epochs,
        rounds=args.rounds, eval_every=args.rounds, participation=args.participation, device=args.device,
        progress=False, **SETTINGS.get(algorithm, {}),
    )
    return dfl.run(config).history[-1]["test_acc"]


def main() -> None:
    args = parse_args()
    model = f"mlp {args.hidden}" if args.model == "mlp" else args.model
    print(f"MNIST-1D, {args.clients} clients, participation {args.participation}, {args.rounds} rounds, "
          f"model {model}, lr {args.lr}, batch {args.batch_size}, {args.local_epochs} local epoch(s); "
          f"seeds {args.seeds}; settings {SETTINGS}\n")
    header = "| algorithm | " + " | ".join(f"Dir({a})" for a in args.alphas) + " | s/run |"
    print(header)
    print("|" + "---|" * (len(args.alphas) + 2))
    for algorithm in args.algorithms:
        cells, tic = [], time.perf_counter()
        for alpha in args.alphas:
            accs = np.array([experiment(args, algorithm, alpha, seed) for seed in args.seeds]) * 100
            cells.append(f"{accs.mean():.1f} ± {accs.std():.1f}")
        per_run = (time.perf_counter() - tic) / (len(args.alphas) * len(args.seeds))
        print(f"| {algorithm} | " + " | ".join(cells) + f" | {per_run:.1f} |", flush=True)


if __name__ == "__main__":
    main()

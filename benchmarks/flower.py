"""FedAvg in dfl vs the same FedAvg in Flower's simulation engine: seconds per round and final test accuracy.

The workload is built once, from one `Workload`, for both systems (`build`): the dataset and its client split come
from dfl's own data module (`dfl.engine.setup.build_data`, the function every `dfl.run` uses), the model from
`dfl.models.build_model` after `torch.manual_seed(seed)` (as `dfl.run` seeds it), so both systems start from the
same weights, train the same torch module on the same client shards and evaluate on the same test set.

  dfl      `dfl.run(Config(algorithm="fedavg", aggregation="size", lr_decay=1, ...))`: every client a row of one
           [m, d] tensor, local training vectorized with torch.func.vmap, in one process.
  Flower   `flwr.simulation.run_simulation` with a `ServerApp` running `flwr.serverapp.strategy.FedAvg` (weighted
           by num-examples, i.e. by n_i like aggregation = "size") and a `ClientApp` whose train step is a plain
           PyTorch loop (`train_client`): load the global weights into the module, a fresh `torch.optim.SGD`
           (same lr, no momentum), a shuffled `DataLoader` over the client's shard (same batch size, the last batch
           short as in dfl), E local epochs (or K steps), and the trained state dict back. Clients run in Ray
           actors; `--cpus-per-client` sets Ray's `client_resources` (and the actor's torch threads), so 2 cores
           hold 2 actors of 1 thread each (1.0) or 1 actor of 2 threads (2.0).

Fairness choices. Full participation, a constant learning rate, plain SGD (dfl's FedAvg has no local momentum, so
the Flower client's `torch.optim.SGD` gets momentum 0), the global model evaluated on the test set after every
round in both (Flower: a server-side `evaluate_fn`; no federated evaluation), and that evaluation excluded from the
round time in both: dfl times `algorithm.round` only (its metrics' `seconds_per_round`, with `eval_every = 1`),
Flower's round is the time between the end of one `evaluate_fn` call and the start of the next (send, client training,
serialization, aggregation). Each system runs in its own fresh Python process (no shared Ray or thread state), and
the repeats alternate the two systems (dfl, Flower, dfl, Flower, ...), so a change in machine load hits both. The
steady-state time is the median of rounds 2..R; one-time start-up is reported apart: for dfl the set-up inside
`dfl.run` (data, model, trainer) and the first round; for Flower the time from `run_simulation` to the first
evaluation (Ray start, actor pool) and the first round (actors load their shard on first use). The shards reach
the actors as one file the driver writes (`torch.save`), loaded once per actor process, never pickled per message.
Every Flower setting tried is reported; the ratio uses the fastest Flower setting (the one most fair to Flower).
`--dfl-threads 1` runs dfl on one core while Flower's two 1-CPU actors use both: on a shared 2-core machine two
OpenMP threads that wait on each other lose most of their time (docs/benchmarks.md has the numbers).
Batch orders differ (dfl's counter-based sampler vs a seeded DataLoader), so accuracies agree in distribution,
not bit for bit; `tests/test_benchmarks.py` checks with full-batch steps (no sampling) that `train_client` +
weighted averaging equals dfl's FedAvg round to float precision.

    python benchmarks/flower.py                                  # cnn1d and mlp x 10 and 100 clients
    python benchmarks/flower.py --rounds 5 --dfl-threads 1 --cpus-per-client 1   # as in results/flower-2026-11-25.md
    python benchmarks/flower.py --models mlp --clients 10 --rounds 5 --repeats 1
    python benchmarks/flower.py --dfl-only                       # no Flower installed: the dfl side alone
    python benchmarks/flower.py --markdown results.md --json results.json

Flower is an optional extra: `pip install -e ".[flower]"` (flwr[simulation], which brings Ray).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/flower.py`: the workers import this file as benchmarks.flower
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Workload:
    """Everything both systems share: data, split, model, local training and rounds."""

    model: str = "cnn1d"
    clients: int = 10
    rounds: int = 10
    dataset: str = "mnist1d"
    samples: int = 20000  # MNIST-1D samples (80% train, 20% test)
    partition: str = "iid"
    alpha: float | None = None  # Dirichlet partitions only
    local_epochs: int = 1
    local_steps: int = 0  # > 0: K steps per round instead of epochs
    batch_size: int = 32  # 0 = full batch (no shuffle)
    lr: float = 0.1
    momentum: float = 0.0  # dfl's FedAvg is plain local SGD (it ignores momentum): 0 on both sides
    seed: int = 0

    def config(self):
        """The dfl.Config of this workload (FedAvg, full participation, n_i-weighted, constant lr)."""
        import dfl

        if self.momentum:
            raise ValueError("dfl's fedavg takes plain SGD steps (no local momentum); keep momentum = 0")
        local = {"local_steps": self.local_steps} if self.local_steps else {"local_epochs": self.local_epochs}
        return dfl.Config(
            algorithm="fedavg", clients=self.clients, rounds=self.rounds, dataset=self.dataset,
            dataset_options={"num_samples": self.samples} if self.dataset == "mnist1d" else {},
            partition=self.partition, alpha=self.alpha, model=self.model, batch_size=self.batch_size,
            lr=self.lr, lr_decay=1.0, participation=1.0, aggregation="size", server_lr=1.0,
            seed=self.seed, eval_every=1, train_eval_samples=0, client_eval_samples=100, device="cpu",
            progress=False, **local,
        )

    def train_config(self) -> dict:
        """What the Flower server sends each client with the global weights (a flwr ConfigRecord)."""
        return {"lr": self.lr, "momentum": self.momentum, "batch_size": self.batch_size,
                "local_epochs": self.local_epochs, "local_steps": self.local_steps, "seed": self.seed}


def build(workload: Workload):
    """(dfl config, FederatedData, initial model) of the workload, built as `dfl.run` builds them."""
    import torch

    from dfl.engine.setup import build_data
    from dfl.models import build_model

    config = workload.config()
    data = build_data(config)
    torch.manual_seed(workload.seed)  # as dfl.models.setup.model_for_run: the same initial weights
    model = build_model(workload.model, tuple(data.input_shape), data.num_classes)
    return config, data, model


def save_shards(data, path: Path) -> None:
    """One file with every client's shard (exactly dfl's client_indices rows) and the test set."""
    import torch

    torch.save({"shards": [(data.train_x[i], data.train_y[i]) for i in data.client_indices],
                "test": (data.test_x, data.test_y), "input_shape": tuple(data.input_shape),
                "num_classes": data.num_classes}, path)


def train_client(model, x, y, hp: dict, server_round: int, client: int) -> float:
    """The Flower client's local training, a plain PyTorch loop: fresh SGD (lr, momentum), a shuffled DataLoader
    of batch_size over the shard (0 = full batch, no shuffle), local_epochs epochs or local_steps steps. Returns
    the mean training loss."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    full = hp["batch_size"] == 0 or hp["batch_size"] >= len(y)
    generator = torch.Generator().manual_seed(hp["seed"] * 1_000_003 + server_round * 10_007 + client)
    loader = DataLoader(TensorDataset(x, y), batch_size=len(y) if full else hp["batch_size"], shuffle=not full,
                        generator=generator)
    opt = torch.optim.SGD(model.parameters(), lr=hp["lr"], momentum=hp["momentum"])
    model.train()
    steps = hp["local_steps"] or hp["local_epochs"] * len(loader)
    total, done = 0.0, 0
    while done < steps:
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            total, done = total + float(loss.detach()), done + 1
            if done == steps:
                break
    return total / steps


def accuracy(model, x, y) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        correct = sum(int((model(xb).argmax(1) == yb).sum()) for xb, yb in zip(x.split(1024), y.split(1024)))
    model.train()
    return correct / len(y)


# ----------------------------------------------------------------------------------------------- Flower side
_ACTOR: dict = {}  # per Ray actor process: the loaded shards and the model, built once


def _actor_state(path: str, model_name: str, threads: int):
    if _ACTOR.get("path") != path:
        import torch

        from dfl.models import build_model

        torch.set_num_threads(threads)
        blob = torch.load(path)
        _ACTOR.update(path=path, shards=blob["shards"],
                      model=build_model(model_name, blob["input_shape"], blob["num_classes"]))
    return _ACTOR


def _client_app():
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cfg = msg.content["config"]
        state = _actor_state(cfg["shards"], cfg["model"], int(cfg["threads"]))
        client = int(context.node_config["partition-id"])
        x, y = state["shards"][client]
        model = state["model"]
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        loss = train_client(model, x, y, dict(cfg), int(cfg["server_round"]), client)
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"train_loss": loss, "num-examples": len(y)})}),
                       reply_to=msg)

    return app


CLIENT_APP = None  # built on first use in the process that imports benchmarks.flower (Flower only)


def run_flower(workload: Workload, cpus_per_client: float, workdir: Path) -> dict:
    import logging

    import torch
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    import benchmarks.flower as module  # the importable copy: Ray pickles its ClientApp by reference

    logging.getLogger("flwr").setLevel(logging.WARNING)
    tic = time.perf_counter()
    config, data, model = build(workload)
    shards = workdir / "shards.pt"
    save_shards(data, shards)
    build_s = time.perf_counter() - tic
    threads = max(1, int(cpus_per_client))
    marks: list[tuple[int, float, float]] = []  # (round, evaluate_fn entered, left)
    accs: list[float] = []
    eval_model = copy.deepcopy(model)  # the server's copy for evaluate_fn

    class Strategy(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            config = ConfigRecord({**config, "server_round": server_round})
            return super().configure_train(server_round, arrays, config, grid)

    def evaluate(server_round: int, arrays) -> MetricRecord:
        entered = time.perf_counter()
        eval_model.load_state_dict(arrays.to_torch_state_dict())
        accs.append(accuracy(eval_model, data.test_x, data.test_y))
        marks.append((server_round, entered, time.perf_counter()))
        return MetricRecord({"test_acc": accs[-1]})

    server = ServerApp()

    @server.main()
    def main(grid, context) -> None:
        strategy = Strategy(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=workload.clients,
                            min_available_nodes=workload.clients)
        train_config = ConfigRecord({**workload.train_config(), "shards": str(shards), "model": workload.model,
                                     "threads": threads})
        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=workload.rounds,
                       train_config=train_config, evaluate_fn=evaluate)

    backend = {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0},
               "init_args": {"num_cpus": os.cpu_count(), "log_to_driver": False}}
    start = time.perf_counter()
    run_simulation(server_app=server, client_app=module.client_app(), num_supernodes=workload.clients,
                   backend_config=backend)
    end = time.perf_counter()
    if len(marks) != workload.rounds + 1:
        raise RuntimeError(f"Flower finished {len(marks) - 1} of {workload.rounds} rounds")
    rounds = [marks[r][1] - marks[r - 1][2] for r in range(1, len(marks))]
    # Ray and the actor pool start inside the first round's send: time to the end of round 1, with the driver's
    # build (data, model, shard file) as dfl's set-up includes its build
    return {"system": "flower", "cpus_per_client": cpus_per_client, "threads_per_client": threads,
            "to_round1_s": build_s + marks[1][1] - start, "shutdown_s": end - marks[-1][2],
            "round_s": rounds, "test_acc": accs[1:], "params": sum(p.numel() for p in model.parameters()),
            "torch_threads_driver": torch.get_num_threads()}


def client_app():
    global CLIENT_APP
    if CLIENT_APP is None:
        CLIENT_APP = _client_app()
    return CLIENT_APP


# -------------------------------------------------------------------------------------------------- dfl side
def run_dfl(workload: Workload, threads: int = 0, compile: bool = False) -> dict:
    """dfl's run of the workload in this process: `threads` torch threads (0: dfl's default, "auto"), `compile`:
    Config.compile (the compilation falls into the start-up: set-up and the first round)."""
    import dfl  # before torch, as `dfl ...` does: dfl's OpenMP settings (dfl.threads) apply

    # isort: split
    import torch

    config = workload.config().replace(threads=threads or "auto", compile=compile)
    tic = time.perf_counter()
    result = dfl.run(config)
    total = time.perf_counter() - tic
    rounds = [h["seconds_per_round"] for h in result.history]  # eval_every = 1: one round each, eval excluded
    setup = total - result.summary["wall_seconds"]  # inside dfl.run, before round 1: data, model, trainer
    return {"system": "dfl", "to_round1_s": setup + rounds[0], "round_s": rounds,
            "test_acc": [h["test_acc"] for h in result.history], "params": result.summary["num_params"],
            "client_chunk": result.summary["client_chunk"], "threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------------------ driver
def worker(args) -> None:
    """One system, one workload, in this process; the record goes to --worker-out as JSON."""
    workload = Workload(**json.loads(args.worker_workload))
    if args.worker == "dfl":
        record = run_dfl(workload, args.worker_threads)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            record = run_flower(workload, args.worker_cpus, Path(tmp))
    Path(args.worker_out).write_text(json.dumps(record))


def spawn(workload: Workload, system: str, cpus: float = 0.0, threads: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", system, "--worker-out", str(out),
               "--worker-workload", json.dumps(asdict(workload)), "--worker-cpus", str(cpus),
               "--worker-threads", str(threads)]
        tic = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"{system} worker failed:\n{proc.stderr[-3000:]}")
        record = json.loads(out.read_text())
        record["process_s"] = time.perf_counter() - tic
        record["loadavg_1min_after"] = os.getloadavg()[0]
        return record


def steady(record: dict) -> float:
    """Median seconds of rounds 2..R (round 1 alone when R = 1)."""
    rounds = record["round_s"]
    return statistics.median(rounds[1:] or rounds)


def startup(record: dict) -> float:
    """One-time start-up: the time to the end of round 1 minus one steady-state round."""
    return record["to_round1_s"] - steady(record)


def span(values: list[float], fmt: str = "{:.3f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def summarize(workload: Workload, runs: list[dict], flower_settings: list[float]) -> dict:
    dfl_runs = [r for r in runs if r["system"] == "dfl"]
    row = {"model": workload.model, "clients": workload.clients, "params": dfl_runs[0]["params"],
           "dfl_round_s": [steady(r) for r in dfl_runs], "dfl_first_s": [r["round_s"][0] for r in dfl_runs],
           "dfl_startup_s": [startup(r) for r in dfl_runs], "dfl_acc": [r["test_acc"][-1] for r in dfl_runs],
           "flower": {}}
    for cpus in flower_settings:
        fl = [r for r in runs if r["system"] == "flower" and r["cpus_per_client"] == cpus]
        if fl:
            row["flower"][str(cpus)] = {
                "round_s": [steady(r) for r in fl], "first_s": [r["round_s"][0] for r in fl],
                "startup_s": [startup(r) for r in fl], "acc": [r["test_acc"][-1] for r in fl],
                "ratio": [steady(f) / steady(d) for f, d in zip(fl, dfl_runs)]}
    if row["flower"]:
        best = min(row["flower"], key=lambda c: statistics.median(row["flower"][c]["round_s"]))
        row["best_flower"] = best
    return row


def print_row(row: dict) -> list[str]:
    med = statistics.median
    lines = [f"{row['model']} x {row['clients']} clients ({row['params']:,} params)",
             f"  dfl:  {med(row['dfl_round_s']):.3f} s/round (runs {span(row['dfl_round_s'])}), first round "
             f"{span(row['dfl_first_s'])} s, start-up {span(row['dfl_startup_s'], '{:.1f}')} s, final test acc "
             f"{span(row['dfl_acc'])}"]
    for cpus, fl in row["flower"].items():
        lines.append(f"  flower (num_cpus {cpus} per client): {med(fl['round_s']):.3f} s/round (runs "
                     f"{span(fl['round_s'])}), first round {span(fl['first_s'])} s, start-up "
                     f"{span(fl['startup_s'], '{:.1f}')} s, final test acc {span(fl['acc'])}; "
                     f"flower/dfl {med(fl['ratio']):.1f}x (runs {span(fl['ratio'], '{:.1f}')})")
    if "best_flower" in row:
        fl = row["flower"][row["best_flower"]]
        lines.append(f"  speed-up of dfl over the fastest Flower setting (num_cpus {row['best_flower']}): "
                     f"{med(fl['ratio']):.1f}x")
    print("\n".join(lines), flush=True)
    return lines


def markdown(rows: list[dict], args, versions: dict) -> str:
    med = statistics.median
    all_loads = [run["loadavg_1min_after"] for r in rows for run in r["runs"]]
    loads = f"{min(all_loads):.1f}–{max(all_loads):.1f}"
    dfl_threads = "/".join(sorted({str(run["threads"]) for r in rows for run in r["runs"] if run["system"] == "dfl"}))
    local = f"{args.local_steps} local steps" if args.local_steps else f"{args.local_epochs} local epoch(s)"
    head = (f"# dfl vs Flower's simulation, FedAvg ({time.strftime('%Y-%m-%d')})\n\n"
            f"Machine: {versions['machine']}. Versions: "
            f"{', '.join(f'{k} {v}' for k, v in versions.items() if k != 'machine')}.\n\n"
            f"Command: `{' '.join(['python', 'benchmarks/flower.py', *sys.argv[1:]])}`\n\n"
            f"Workload: {args.dataset} ({args.samples} samples, {args.partition} split), "
            f"{local} of plain SGD (batch {args.batch_size}, lr {args.lr}, no momentum) per round, full "
            f"participation, {args.rounds} rounds, the global model evaluated on the test set after every round "
            f"(not timed), {args.repeats} repeat(s) per system alternating dfl / Flower, each run in a fresh "
            f"process, dfl with {dfl_threads} torch thread(s); 1-minute load average of the machine after each run: "
            f"{loads}. s/round = median of "
            f"rounds 2..R of a run; the table gives the median over runs and the "
            f"range in brackets.\n\n")
    settings = sorted({c for r in rows for c in r["flower"]}, key=float)
    cols = "".join(f"Flower, num_cpus {c}/client s/round | " for c in settings)
    out = [head, f"| model × clients | dfl s/round | {cols}Flower/dfl (fastest Flower) | test acc dfl | "
                 "test acc Flower (fastest) | start-up dfl / Flower s |",
           "|---|" + "---:|" * (len(settings) + 4) + "---|"]
    for r in rows:
        cells = [f"{r['model']} × {r['clients']}", f"{med(r['dfl_round_s']):.3f} ({span(r['dfl_round_s'])})"]
        for c in settings:
            fl = r["flower"].get(c)
            cells.append(f"{med(fl['round_s']):.3f} ({span(fl['round_s'])})" if fl else "—")
        best = r["flower"].get(r.get("best_flower"))
        cells += [f"**{med(best['ratio']):.1f}×** ({span(best['ratio'], '{:.1f}')})" if best else "—",
                  span(r["dfl_acc"]), span(best["acc"]) if best else "—",
                  f"{span(r['dfl_startup_s'], '{:.1f}')} / {span(best['startup_s'], '{:.1f}') if best else '—'}"]
        out.append("| " + " | ".join(cells) + " |")
    out.append("\nStart-up = time to the end of round 1 (dfl: set-up inside `dfl.run` and round 1; Flower: the "
               "driver's build, `run_simulation` starting Ray and the actor pool, actors loading their shard, "
               "round 1) minus one steady round. First rounds alone (s, dfl / fastest Flower):")
    for r in rows:
        best = r["flower"].get(r.get("best_flower"))
        out.append(f"- {r['model']} × {r['clients']}: {span(r['dfl_first_s'])} / "
                   f"{span(best['first_s']) if best else '—'}")
    return "\n".join(out) + "\n"


def versions() -> dict:
    import torch

    found = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs ({_cpu_name()}), {platform.system()}",
             "python": platform.python_version(), "torch": torch.__version__}
    for name in ("flwr", "ray"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = "not installed"
    return found


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def parse_args():
    w = Workload()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["cnn1d", "mlp"])
    p.add_argument("--clients", nargs="+", type=int, default=[10, 100])
    p.add_argument("--rounds", type=int, default=w.rounds)
    p.add_argument("--dataset", default=w.dataset)
    p.add_argument("--samples", type=int, default=w.samples, help="MNIST-1D samples (80%% train)")
    p.add_argument("--partition", default=w.partition)
    p.add_argument("--alpha", type=float, default=None)
    p.add_argument("--local-epochs", type=int, default=w.local_epochs)
    p.add_argument("--local-steps", type=int, default=0, help="K steps per round instead of epochs")
    p.add_argument("--batch-size", type=int, default=w.batch_size)
    p.add_argument("--lr", type=float, default=w.lr)
    p.add_argument("--seed", type=int, default=w.seed)
    p.add_argument("--repeats", type=int, default=2, help="runs of each system, alternating (default 2)")
    p.add_argument("--cpus-per-client", nargs="+", type=float, default=[1.0, 2.0],
                   help="Flower client_resources num_cpus settings to try (default 1 2)")
    p.add_argument("--dfl-threads", type=int, default=0,
                   help="torch threads of the dfl process (0 = dfl's default, threads = \"auto\")")
    p.add_argument("--dfl-only", action="store_true", help="run the dfl side only (no Flower needed)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--markdown", default=None, metavar="PATH")
    p.add_argument("--worker", choices=["dfl", "flower"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--worker-workload", help=argparse.SUPPRESS)
    p.add_argument("--worker-cpus", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--worker-threads", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args()


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    if not args.dfl_only:
        try:
            import flwr  # noqa: F401
        except ImportError:
            raise SystemExit("flwr is not installed: pip install -e '.[flower]', or run with --dfl-only") from None
    found = versions()
    print(f"{found['machine']}; " + ", ".join(f"{k} {v}" for k, v in found.items() if k != "machine"), flush=True)
    rows = []
    for model in args.models:
        for clients in args.clients:
            workload = Workload(model=model, clients=clients, rounds=args.rounds, dataset=args.dataset,
                                samples=args.samples, partition=args.partition, alpha=args.alpha,
                                local_epochs=args.local_epochs, local_steps=args.local_steps,
                                batch_size=args.batch_size, lr=args.lr, seed=args.seed)
            runs = []
            for _ in range(args.repeats):  # alternate: dfl, each Flower setting, dfl, ...
                runs.append(spawn(workload, "dfl", threads=args.dfl_threads))
                if not args.dfl_only:
                    runs += [spawn(workload, "flower", cpus) for cpus in args.cpus_per_client]
            row = summarize(workload, runs, [] if args.dfl_only else args.cpus_per_client)
            row["runs"] = runs
            print_row(row)
            rows.append(row)
            # after every workload, so an interrupted sweep keeps what it measured
            if args.json:
                Path(args.json).write_text(json.dumps({"versions": found, "args": vars(args), "rows": rows},
                                                      indent=1) + "\n")
            if args.markdown:
                Path(args.markdown).write_text(markdown(rows, args, found))


if __name__ == "__main__":
    main()

"""FedAvg in dfl vs the same FedAvg in Apple's pfl-research simulator (pfl 0.6): seconds per round, start-up, accuracy.

The workload is benchmarks/flower.py's (`Workload`, built by its `build`): the dataset and client split from dfl's
own data module, the model from `dfl.models.build_model` after `torch.manual_seed(seed)`, so both systems start
from the same weights, train the same torch module on the same client shards and evaluate on the same test set.

  dfl   `dfl.run(Config(algorithm="fedavg", aggregation="size", lr_decay=1, ...))` (`flower.run_dfl`): every client
        a row of one [m, d] tensor, local training vectorized with torch.func.vmap, in one process.
  pfl   `pfl.algorithm.FederatedAveraging` on a `pfl.aggregate.simulate.SimulatedBackend`, as pfl's own PyTorch
        benchmarks set it up: a `pfl.model.pytorch.PyTorchModel` around the same module (a `loss` and a `metrics`
        method added), `torch.optim.SGD` as the local optimizer (same lr, no momentum) and as the central optimizer
        (lr 1: the new model is the weighted mean of the clients' models), `WeightByDatapoints` (n_i-weighted, as
        dfl's aggregation = "size"), a `FederatedDataset.from_slices`-style dataset whose user dataset is the
        client's shard in a fresh seeded order each time it is sampled (as a shuffled DataLoader; pfl cuts it into
        batches of batch_size, the last one short as in dfl), cohort = every client, the "minimize_reuse" sampler
        (each client once per round). pfl trains the clients one after the other in its per-user loop; with
        `--pfl-workers 2` it runs as pfl does on several processes (torchrun, gloo: each worker trains its share of
        the cohort and the statistics are all-reduced), one torch thread each.

Timing as in benchmarks/flower.py: the global model is evaluated on the test set after every round in both, outside
the timed round (dfl: `seconds_per_round` with `eval_every = 1`; pfl: the time between the end of one
`after_central_iteration` callback, where the evaluation runs, and the start of the next). s/round is the median of
rounds 2..R; start-up is the time to the end of round 1 minus one steady round (dfl: set-up inside `dfl.run`; pfl:
building the workload, the pfl model and dataset, torchrun's process group with several workers). pfl evaluates
every user before and after training in its first round (iteration 0 is always an evaluation round); that falls into
its start-up. Each run is a fresh Python process and the systems alternate (dfl, pfl, pfl x 2, dfl, ...).
`tests/test_benchmark_pfl.py` checks that one pfl round equals one dfl round to float precision with full-batch
steps (no sampling on either side).

    python benchmarks/pfl.py                                     # cnn1d and mlp x 10 and 100 clients
    python benchmarks/pfl.py --rounds 5 --repeats 2 --markdown out.md --json out.json
    python benchmarks/pfl.py --models mlp --clients 10 --rounds 3 --repeats 1
    python benchmarks/pfl.py --profile --models cnn1d --rounds 3   # where a round's time goes, both systems

pfl is an optional extra: `pip install -e ".[pfl]"` (pfl[pytorch] 0.6.0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python benchmarks/pfl.py` puts benchmarks/ first on the path, where this file would shadow the pfl package:
# the repository root instead (benchmarks.flower, dfl)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.flower import Workload, build, run_dfl, span, startup, steady  # noqa: E402
from benchmarks.flower import versions as _versions  # noqa: E402


# --------------------------------------------------------------------------------------------------- pfl side
def pfl_setup(workload: Workload):
    """(dfl config, data, torch module, pfl PyTorchModel, FederatedDataset, FederatedAveraging, its hyperparameters)
    of the workload, built as pfl's PyTorch benchmarks build theirs."""
    import torch
    import torch.nn.functional as F
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Weighted
    from pfl.model.pytorch import PyTorchModel

    if workload.momentum:
        raise ValueError("dfl's fedavg takes plain SGD steps (no local momentum); keep momentum = 0")
    config, data, net = build(workload)

    class Module(torch.nn.Module):
        """The workload's module with what pfl's PyTorchModel calls: `loss` (mean cross-entropy, the objective
        dfl's clients minimise) and `metrics`."""

        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

        def loss(self, x, y, eval=False):
            return F.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y, eval=False):
            logits = self(x)
            return {"loss": Weighted(float(F.cross_entropy(logits, y, reduction="sum")), len(y)),
                    "accuracy": Weighted(float((logits.argmax(1) == y).sum()), len(y))}

    module = Module(net)
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    shards = [(data.train_x[idx], data.train_y[idx]) for idx in data.client_indices]
    draws = [0] * len(shards)

    def make_dataset_fn(user_id: int):
        x, y = shards[user_id]
        if workload.batch_size:  # a fresh seeded order each time the client is sampled (a shuffled loader)
            draws[user_id] += 1
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(
                workload.seed * 1_000_003 + draws[user_id] * 10_007 + user_id))
            x, y = x[order], y[order]
        return Dataset(raw_data=[x, y], user_id=str(user_id))

    sampler = get_user_sampler("minimize_reuse", list(range(len(shards))))
    dataset = FederatedDataset(make_dataset_fn, sampler)
    full = workload.batch_size == 0
    if workload.local_steps and not full:
        raise ValueError("the pfl side runs K local steps only with full-batch steps (batch_size = 0); pfl's "
                         "local_num_steps stops within the first epoch")
    epochs = workload.local_steps if full and workload.local_steps else workload.local_epochs
    train = NNTrainHyperParams(local_learning_rate=workload.lr, local_num_epochs=epochs,
                               local_batch_size=None if full else workload.batch_size)
    params = NNAlgorithmParams(central_num_iterations=workload.rounds, evaluation_frequency=10**9,
                               train_cohort_size=workload.clients, val_cohort_size=0)
    return config, data, module, model, dataset, FederatedAveraging(), params, train, NNEvalHyperParams(
        local_batch_size=1024)


def run_pfl(workload: Workload, threads: int = 1) -> dict:
    """pfl's simulation of the workload in this process (a torchrun worker of several when WORLD_SIZE > 1)."""
    import torch

    torch.set_num_threads(threads)
    tic = time.perf_counter()
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.callback.base import TrainingProcessCallback
    from pfl.internal.ops.selector import get_framework_module

    from benchmarks.flower import accuracy

    _, data, module, model, dataset, algorithm, params, train, evaluation = pfl_setup(workload)
    world = get_framework_module().distributed.world_size
    marks: list[tuple[float, float]] = []  # (callback entered, left) per round
    accs: list[float] = []

    class Timer(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            marks.append((time.perf_counter(), time.perf_counter()))
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            entered = time.perf_counter()
            accs.append(accuracy(module, data.test_x, data.test_y))  # every worker: they leave together
            marks.append((entered, time.perf_counter()))
            return False, type(aggregate_metrics)()

    backend = SimulatedBackend(training_data=dataset, val_data=None, postprocessors=[WeightByDatapoints()])
    build_s = time.perf_counter() - tic
    algorithm.run(algorithm_params=params, backend=backend, model=model, model_train_params=train,
                  model_eval_params=evaluation, callbacks=[Timer()])
    if len(marks) != workload.rounds + 1:
        raise RuntimeError(f"pfl finished {len(marks) - 1} of {workload.rounds} rounds")
    rounds = [marks[r][0] - marks[r - 1][1] for r in range(1, len(marks))]
    return {"system": "pfl", "workers": world, "threads": torch.get_num_threads(),
            "to_round1_s": build_s + marks[1][0] - marks[0][1], "round_s": rounds, "test_acc": accs,
            "params": sum(p.numel() for p in module.parameters()),
            "final_params": [p.detach().reshape(-1).tolist() for p in module.parameters()]
            if workload.clients <= 3 and workload.samples <= 400 else None}


# ------------------------------------------------------------------------------------------------ profile
CONV_OPS = {"aten::convolution", "aten::_convolution", "aten::convolution_backward", "aten::mkldnn_convolution",
            "aten::_mkldnn_convolution", "aten::conv1d", "aten::_convolution_mode", "aten::thnn_conv2d",
            "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward"}
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::addbmm"}
PARTS = ("data", "convolution kernels", "matmul kernels", "elementwise and other ops", "evaluation",
         "python and dispatch")


def attribute(events, wall_s: float, rounds: int) -> dict[str, float]:
    """ms per round by part: every op's self CPU time goes to evaluation or data when it runs inside those ranges
    (`dfl:evaluation`, `dfl:sampling`), else to its kind (convolution, matmul, the rest); what the ops do not
    cover of the wall time is Python and dispatch (the interpreter, the framework's per-op overhead)."""
    out = dict.fromkeys(PARTS, 0.0)
    for ev in events:
        if ev.name.startswith("dfl:") or ev.name.startswith("ProfilerStep"):
            continue
        label, p = None, ev.cpu_parent
        while p is not None and label is None:
            label = {"dfl:evaluation": "evaluation", "dfl:sampling": "data"}.get(p.name)
            p = p.cpu_parent
        part = label or ("convolution kernels" if ev.name in CONV_OPS else
                         "matmul kernels" if ev.name in MATMUL_OPS else "elementwise and other ops")
        out[part] += ev.self_cpu_time_total / 1e3
    out["python and dispatch"] = max(0.0, wall_s * 1e3 - sum(out.values()))
    return {k: v / rounds for k, v in out.items()}


def profile_dfl(workload: Workload) -> dict[str, float]:
    """dfl's rounds 2..R under torch.profiler (benchmarks/round_profile.py's ranges)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import dfl
    from benchmarks import round_profile

    prof = profile(activities=[ProfilerActivity.CPU])
    state = {"start": 1, "prof": prof, "plain": [], "tic": None}
    with round_profile.instrumented(state):
        dfl.run(workload.config().replace(threads=torch.get_num_threads()))
        wall = time.perf_counter() - state["tic"]
        prof.stop()
    return attribute(prof.events(), wall, workload.rounds - 1)


def profile_pfl(workload: Workload) -> dict[str, float]:
    """pfl's rounds 2..R under torch.profiler: the same parts (its user datasets as data, the callback's test-set
    accuracy as evaluation)."""
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.callback.base import TrainingProcessCallback
    from torch.profiler import ProfilerActivity, profile, record_function

    from benchmarks.flower import accuracy

    _, data, module, model, dataset, algorithm, params, train, evaluation = pfl_setup(workload)
    make = dataset.make_dataset_fn

    def make_dataset_fn(user_id):
        with record_function("dfl:sampling"):
            return make(user_id)

    dataset.make_dataset_fn = make_dataset_fn
    prof = profile(activities=[ProfilerActivity.CPU])
    state: dict = {}

    class Profiled(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            with record_function("dfl:evaluation"):
                accuracy(module, data.test_x, data.test_y)
            if central_iteration == 0:
                prof.start()
                state["tic"] = time.perf_counter()
            return False, type(aggregate_metrics)()

    backend = SimulatedBackend(training_data=dataset, val_data=None, postprocessors=[WeightByDatapoints()])
    algorithm.run(algorithm_params=params, backend=backend, model=model, model_train_params=train,
                  model_eval_params=evaluation, callbacks=[Profiled()])
    wall = time.perf_counter() - state["tic"]
    prof.stop()
    return attribute(prof.events(), wall, workload.rounds - 1)


def profile_table(args) -> str:
    """One column per (model x clients, system), one row per part of a round, ms per round."""
    import torch

    torch.set_num_threads(1)
    columns: list[tuple[str, dict]] = []
    for model in args.models:
        for clients in args.clients:
            workload = Workload(model=model, clients=clients, rounds=args.rounds, dataset=args.dataset,
                                samples=args.samples, partition=args.partition, alpha=args.alpha,
                                local_epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
            for name, fn in (("dfl", profile_dfl), ("pfl", profile_pfl)):
                columns.append((f"{name} {model} × {clients}", fn(workload)))
                print(f"profiled {columns[-1][0]}: {sum(columns[-1][1].values()):.1f} ms/round", flush=True)
    lines = ["| part of a round (ms, 1 thread) | " + " | ".join(c for c, _ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for part in PARTS:
        lines.append(f"| {part} | " + " | ".join(f"{v[part]:.1f} ({100 * v[part] / sum(v.values()):.0f}%)"
                                                   for _, v in columns) + " |")
    lines.append("| **round** | " + " | ".join(f"**{sum(v.values()):.1f}**" for _, v in columns) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ driver
def worker(args) -> None:
    workload = Workload(**json.loads(args.worker_workload))
    if args.worker == "dfl":
        record = run_dfl(workload, args.worker_threads, compile=args.worker_compile)
    else:
        record = run_pfl(workload, args.worker_threads)
        if int(os.environ.get("RANK", "0")) != 0:
            return
    Path(args.worker_out).write_text(json.dumps(record))


def spawn(workload: Workload, system: str, threads: int = 1, workers: int = 1, compile: bool = False) -> dict:
    """One run in a fresh process (pfl with several workers: torchrun --standalone, one process per worker)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        script = [str(Path(__file__).resolve()), "--worker", system, "--worker-out", str(out),
                  "--worker-workload", json.dumps(asdict(workload)), "--worker-threads", str(threads),
                  *(["--worker-compile"] if compile else [])]
        if workers > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={workers}",
                   *script]
        else:
            cmd = [sys.executable, *script]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        tic = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{system} worker failed:\n{proc.stderr[-3000:]}")
        record = json.loads(out.read_text())
        record.pop("final_params", None)
        record["process_s"] = time.perf_counter() - tic
        record["loadavg_1min_after"] = os.getloadavg()[0]
        record["setting"] = f"{system} x{workers}" if system == "pfl" else f"dfl {threads}t" + (
            " compiled" if compile else "")
        return record


def summarize(workload: Workload, runs: list[dict]) -> dict:
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    row = {"model": workload.model, "clients": workload.clients, "params": runs[0]["params"], "settings": {}}
    for s in settings:
        rs = [r for r in runs if r["setting"] == s]
        row["settings"][s] = {"round_s": [steady(r) for r in rs], "first_s": [r["round_s"][0] for r in rs],
                              "startup_s": [startup(r) for r in rs], "acc": [r["test_acc"][-1] for r in rs]}
    return row


def ratio(row: dict, pfl: str, dfl: str) -> list[float] | None:
    """pfl's steady s/round over dfl's, per pair of alternating runs."""
    a, b = row["settings"].get(pfl), row["settings"].get(dfl)
    if not a or not b:
        return None
    return [p / d for p, d in zip(a["round_s"], b["round_s"])]


def print_row(row: dict) -> None:
    med = statistics.median
    print(f"{row['model']} x {row['clients']} clients ({row['params']:,} params)")
    for s, v in row["settings"].items():
        print(f"  {s:8s} {med(v['round_s']):.3f} s/round (runs {span(v['round_s'], '{:.3f}')}), first round "
              f"{span(v['first_s'], '{:.3f}')} s, start-up {span(v['startup_s'], '{:.1f}')} s, final test acc "
              f"{span(v['acc'], '{:.3f}')}")
    for pfl in (s for s in row["settings"] if s.startswith("pfl")):
        for dfl in (s for s in row["settings"] if s.startswith("dfl")):
            r = ratio(row, pfl, dfl)
            print(f"  {pfl} / {dfl}: {med(r):.1f}x (runs {span(r, '{:.1f}')})")
    sys.stdout.flush()


def markdown(rows: list[dict], args, found: dict) -> str:
    med = statistics.median
    loads = [run["loadavg_1min_after"] for r in rows for run in r["runs"]]
    settings = list(dict.fromkeys(s for r in rows for s in r["settings"]))
    dfls = [s for s in settings if s.startswith("dfl")]
    pfls = [s for s in settings if s.startswith("pfl")]
    out = [f"# dfl vs pfl-research, FedAvg ({time.strftime('%Y-%m-%d')})\n",
           f"Machine: {found['machine']}. Versions: "
           + ", ".join(f"{k} {v}" for k, v in found.items() if k != "machine") + ".\n",
           f"Command: `python benchmarks/pfl.py {' '.join(sys.argv[1:])}`\n",
           f"Workload: {args.dataset} ({args.samples} samples, {args.partition} split), {args.local_epochs} local "
           f"epoch(s) of plain SGD (batch {args.batch_size}, lr {args.lr}) per round, full participation, "
           f"{args.rounds} rounds, {args.repeats} alternating repeat(s), each run a fresh process. 1-minute load "
           f"average after each run: {span(loads, '{:.1f}')}. s/round = median of rounds 2..R (the table: median "
           f"over runs, range in brackets); pfl/dfl ratios per pair of alternating runs.\n",
           "| model × clients | " + " | ".join(f"{s} s/round" for s in settings) + " | "
           + " | ".join(f"{p} / {d}" for p in pfls for d in dfls) + " | test acc " + " / ".join(settings)
           + " | start-up s " + " / ".join(settings) + " |",
           "|---|" + "---:|" * (len(settings) + len(pfls) * len(dfls)) + "---|---|"]
    for r in rows:
        st = r["settings"]
        cells = [f"{r['model']} × {r['clients']}"]
        cells += [f"{med(st[s]['round_s']):.3f} ({span(st[s]['round_s'], '{:.3f}')})" if s in st else "—"
                  for s in settings]
        for p in pfls:
            for d in dfls:
                q = ratio(r, p, d)
                cells.append(f"**{med(q):.1f}×** ({span(q, '{:.1f}')})" if q else "—")
        cells.append(" / ".join(span(st[s]["acc"], "{:.3f}") if s in st else "—" for s in settings))
        cells.append(" / ".join(span(st[s]["startup_s"], "{:.1f}") if s in st else "—" for s in settings))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def versions() -> dict:
    found = _versions()
    for name in ("flwr", "ray"):
        found.pop(name, None)
    try:
        from importlib.metadata import version

        found["pfl"] = version("pfl")
    except Exception:
        found["pfl"] = "not installed"
    return found


def parse_args():
    w = Workload()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["cnn1d", "mlp"])
    p.add_argument("--clients", nargs="+", type=int, default=[10, 100])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dataset", default=w.dataset)
    p.add_argument("--samples", type=int, default=w.samples)
    p.add_argument("--partition", default=w.partition)
    p.add_argument("--alpha", type=float, default=None)
    p.add_argument("--local-epochs", type=int, default=w.local_epochs)
    p.add_argument("--batch-size", type=int, default=w.batch_size)
    p.add_argument("--lr", type=float, default=w.lr)
    p.add_argument("--seed", type=int, default=w.seed)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dfl-threads", nargs="+", type=int, default=[1, 2],
                   help="torch threads of the dfl runs to measure (default 1 2)")
    p.add_argument("--dfl-compile", action="store_true",
                   help="also dfl on one thread with compile = true (compilation counted in its start-up)")
    p.add_argument("--pfl-workers", nargs="+", type=int, default=[1, 2],
                   help="pfl worker processes of one thread each (default 1 2)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--markdown", default=None, metavar="PATH")
    p.add_argument("--profile", action="store_true",
                   help="profile rounds 2..R of both systems in this process (torch.profiler, 1 thread) by part: data, "
                        "convolution and matmul kernels, other ops, evaluation, Python and dispatch")
    p.add_argument("--worker", choices=["dfl", "pfl"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--worker-workload", help=argparse.SUPPRESS)
    p.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker-compile", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args)
    try:
        import pfl  # noqa: F401
    except ImportError:
        raise SystemExit("pfl is not installed: pip install -e '.[pfl]'") from None
    if args.profile:
        text = profile_table(args)
        print(text)
        if args.markdown:
            Path(args.markdown).write_text(text)
        return
    found = versions()
    print(f"{found['machine']}; " + ", ".join(f"{k} {v}" for k, v in found.items() if k != "machine"), flush=True)
    rows = []
    for model in args.models:
        for clients in args.clients:
            workload = Workload(model=model, clients=clients, rounds=args.rounds, dataset=args.dataset,
                                samples=args.samples, partition=args.partition, alpha=args.alpha,
                                local_epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr,
                                seed=args.seed)
            runs = []
            for _ in range(args.repeats):  # alternate: dfl (each thread count), pfl (each worker count), dfl, ...
                runs += [spawn(workload, "dfl", threads=t) for t in args.dfl_threads]
                runs += [spawn(workload, "dfl", threads=1, compile=True)] if args.dfl_compile else []
                runs += [spawn(workload, "pfl", threads=1, workers=w) for w in args.pfl_workers]
            row = summarize(workload, runs)
            row["runs"] = runs
            print_row(row)
            rows.append(row)
            if args.json:
                Path(args.json).write_text(json.dumps({"versions": found, "args": vars(args), "rows": rows},
                                                      indent=1) + "\n")
            if args.markdown:
                Path(args.markdown).write_text(markdown(rows, args, found))


if __name__ == "__main__":
    main()

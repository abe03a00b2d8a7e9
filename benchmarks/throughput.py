"""One round of DFedSAM on m clients: our vectorized engine vs a faithful sequential reference.

The reference is the per-client loop of the DFedSAM/DisPFL "standalone" code bases: one shared
`nn.Module` into which each client's deep-copied state dict is loaded, a fresh `torch.optim.SGD` per
client and round, a `DataLoader` over the client's data, SAM as two backward passes (perturb,
backward, restore, step), a deep copy of the trained weights, and state-dict averaging with the
neighbours' weights key by key. Both run the same model, data,
batch size, number of local steps and topology, in the same process, alternating round by round, and the
script prints client-steps per second for both and the median of the per-round ratios (`--compile` adds
the engine with `Config.compile` as a third loop). It also counts the FLOPs of one SAM step
(`torch.utils.flop_counter`) and measures a large fp32 matmul in the same run, so both loops are
reported against the hardware limit as well (achieved GFLOP/s and the fraction of matmul peak, the
peak measured in the precision the run computes in: fp32 with TF32 off, bf16, or TF32).

The engine's own matmuls are also timed alone: one engine round runs under a dispatch-mode recorder that
notes every matmul and convolution kernel call (`aten.mm`, `bmm`, `addmm`, `baddbmm`, `convolution`,
`convolution_backward`, ...: the batched kernels vmap lowers to, with their shapes and strides), and the
"matmuls alone" loop replays those calls, in order, on fresh tensors of the same layout. Its share of the peak
is the ceiling for this model and batch shape on this machine: the engine can get no closer to the peak than
its matmuls do, and `1 - t(matmuls alone) / t(engine)` is the engine's time outside its matmuls.

`--end-to-end` adds another loop: complete `dfl.run` rounds (`Experiment.train_round` of a DFedSAM run with the
same model, data, batch size, steps, ρ and topology: the round's sampling, local training, gossip and the
finiteness check; no evaluation), against the same reference loop with its own data loading.

`--precision bf16` runs the engine with `Config(precision="bf16")` and the reference's forward passes
under `torch.autocast(bfloat16)` (the backward follows the forward's dtypes), both with fp32 weights.
`--dataset cifar10` / `cifar100` without `--data-root` uses seeded random data of that shape (3×32×32,
10 / 100 classes, `--random-samples` per client, crop-flip augmentation like the real set): the work per
step does not depend on pixel values, so throughput needs no files. `--json PATH` writes the numbers.

    python benchmarks/throughput.py                          # cnn1d, 32 clients, MNIST-1D, CPU
    python benchmarks/throughput.py --compile                # ... and the torch.compile'd engine
    python benchmarks/throughput.py --model resnet18 --dataset cifar10 --data-root DIR --clients 100
    python benchmarks/throughput.py --model resnet18 --dataset cifar10 --clients 100 --precision bf16 \
        --json bf16.json                                     # random CIFAR-10-shaped data
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from pathlib import Path

import dfl  # noqa: F401 (first: dfl's OpenMP settings apply before torch loads, as in every `dfl ...`)

# isort: split
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import topologies
from dfl.config import PRECISIONS, Config
from dfl.data import FederatedData
from dfl.models import build_model
from dfl.network.comm import LocalCommunicator
from dfl.network.gossip import Gossip
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.local import LocalRule, LocalTrainer
from dfl.training.memory import keep_freed_memory


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--dataset", default="mnist1d")
    p.add_argument("--data-root", default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--rho", type=float, default=0.01)
    p.add_argument("--topology", default="ring")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per loop, alternating (after one warm-up)")
    p.add_argument("--client-chunk", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="also time the engine with compile = true (torch.compile)")
    p.add_argument("--end-to-end", action="store_true",
                   help="also time complete dfl.run rounds (sampling, training, gossip, checks) as a third loop")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default, one per core)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (TF32 off), bf16 (autocast forward/backward, fp32 weights) or tf32 (CUDA only)")
    p.add_argument("--random-samples", type=int, default=500,
                   help="samples per client of the random CIFAR-shaped data (no --data-root), default 500")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the measured numbers to PATH (JSON)")
    args = p.parse_args()
    if args.random_samples < 1:
        p.error("--random-samples must be >= 1")
    return args


PEAK_REPEATS = 3  # matmul products per round for the peak (a 2048² fp32 product: ~0.1 s on the 2-core CPU)
RANDOM_SHAPES = {"cifar10": ("CIFAR-10", 10), "cifar100": ("CIFAR-100", 100)}


def random_cifar(dataset: str, clients: int, per_client: int, seed: int = 0) -> FederatedData:
    """Seeded N(0, 1) images [3, 32, 32] (the real set is normalized per channel) with uniform labels,
    `per_client` samples per client, crop-flip augmentation as for the real CIFAR."""
    _, classes = RANDOM_SHAPES[dataset]
    g = torch.Generator().manual_seed(seed)
    train = [(torch.randn(per_client, 3, 32, 32, generator=g), torch.randint(0, classes, (per_client,), generator=g))
             for _ in range(clients)]
    test = (torch.randn(100, 3, 32, 32, generator=g), torch.randint(0, classes, (100,), generator=g))
    return FederatedData.from_arrays(train=train, test=test, num_classes=classes, name=f"{dataset}-random",
                                     augment="crop-flip")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, *args) -> float:
    sync(device)
    tic = time.perf_counter()
    fn(*args)
    sync(device)
    return time.perf_counter() - tic


def engine_round(trainer, gossip, X, t, lr, rule):
    Y = trainer.train(X, t, lr, rule).Y
    return gossip.mix(Y, t, 1)


def autocast(device, precision: str):
    """The forward passes' autocast context: bf16 for precision "bf16", a no-op otherwise."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def loss_of(net, x, y, precision: str):
    """Cross-entropy of net(x) with the forward under autocast and the loss itself in fp32, as the engine."""
    with autocast(x.device, precision):
        logits = net(x)
    return F.cross_entropy(logits.float(), y)


def sam_step(net, opt, x, y, rho, precision: str = "fp32"):
    """davda54/sam-style: ascend to y + ε, take the gradient there, restore y, step."""
    opt.zero_grad()
    loss_of(net, x, y, precision).backward()
    params = [p for p in net.parameters() if p.grad is not None]
    with torch.no_grad():
        norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
        eps = [rho * p.grad / (norm + 1e-12) for p in params]
        for p, e in zip(params, eps):
            p.add_(e)
    opt.zero_grad()
    loss_of(net, x, y, precision).backward()
    with torch.no_grad():
        for p, e in zip(params, eps):
            p.sub_(e)
    opt.step()


def sam_step_flops(net, x, y, rho) -> int:
    """FLOPs of one SAM step (two forward/backward passes) as counted by torch's FLOP counter."""
    net = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    with FlopCounterMode(display=False) as counter:
        sam_step(net, opt, x, y, rho)
    return counter.get_total_flops()


MATMUL_KERNELS = {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm,
                  torch.ops.aten.addbmm, torch.ops.aten.convolution, torch.ops.aten.convolution_backward,
                  torch.ops.aten._convolution, torch.ops.aten.mkldnn_convolution}


def tensor_layout(a):
    """A tensor argument as ("tensor", shape, strides, dtype, device); anything else as itself."""
    return ("tensor", a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a


def is_tensor_layout(a) -> bool:
    return isinstance(a, tuple) and len(a) == 5 and a[0] == "tensor"


class MatmulRecorder(TorchDispatchMode):
    """Notes every matmul/convolution kernel call made inside it (the kernels autograd and vmap lower to) as
    (op, arguments), tensors kept by shape, strides and dtype only."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in MATMUL_KERNELS:
            self.calls.append((func, tree_map(tensor_layout, args), tree_map(tensor_layout, kwargs)))
        return func(*args, **kwargs)


def record_matmuls(fn) -> list:
    """The matmul/convolution kernel calls `fn()` makes, in order (`MatmulRecorder`)."""
    recorder = MatmulRecorder()
    with recorder:
        fn()
    return recorder.calls


def matmul_replay(calls):
    """A function that runs the recorded kernel calls in order on random tensors of the recorded layouts, made
    once: one tensor per distinct layout, shared by every call that reads that layout (a round repeats the same
    few layouts step after step, so the replay holds about one step's inputs, not a round's)."""
    made = {}

    def make(a):
        if not is_tensor_layout(a):
            return a
        if a not in made:
            _, shape, stride, dtype, device = a
            made[a] = torch.empty_strided(shape, stride, dtype=dtype, device=device).normal_()
        return made[a]

    ready = [(func, tree_map(make, args, is_leaf=is_tensor_layout), tree_map(make, kwargs, is_leaf=is_tensor_layout))
             for func, args, kwargs in calls]

    def replay(t=None):
        for func, args, kwargs in ready:
            func(*args, **kwargs)

    return replay


def set_tf32(enabled: bool) -> None:
    """TF32 for matmuls and cuDNN convolutions on or off, as `dfl.run` sets it for Config.precision (both TF32 APIs
    in agreement: `dfl.models.kernels`)."""
    from dfl.models import kernels

    kernels.set_matmul_tf32(enabled)
    kernels.set_conv_tf32(enabled)


def matmul_size(device, size: int, dtype=torch.float32, budget_s: float = 0.2) -> int:
    """The side of the square matmul that measures the peak: grows from 256 by doubling, up to `size`, while one
    product of the next size is expected (8x the last one timed) within budget_s: a CPU without bf16 instructions
    runs bf16 ~40x slower than fp32, and products of 2048 would take minutes there."""
    n = min(256, size)
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        a @ a  # warm-up
        sync(device)
        tic = time.perf_counter()
        a @ a
        sync(device)
        if n >= size or 8 * (time.perf_counter() - tic) > budget_s:
            return n
        n *= 2


def matmul_gflops(device, n: int, repeats: int, dtype=torch.float32) -> float:
    """Achieved GFLOP/s of `repeats` square n×n matmuls in `dtype` (fp32 ones follow the TF32 setting): the
    practical compute ceiling of this device for that precision."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up
    sync(device)
    tic = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - tic) / 1e9


def matmul_peak_gflops(device, size: int, repeats: int = 10, dtype=torch.float32, budget_s: float = 2.0) -> float:
    """`matmul_gflops` of the size `matmul_size` picks (budget_s / repeats per product)."""
    return matmul_gflops(device, matmul_size(device, size, dtype, budget_s / repeats), repeats, dtype)


def reference_round(trainer_model, client_states, loaders, steps, W, lr, rho, device, precision="fp32"):
    """DisPFL/DFedSAM "standalone" loop: one shared model; per client load a deep copy of its weights,
    build a fresh optimizer, train on its DataLoader, deep-copy the weights back; then every client
    averages its neighbours' state dicts key by key."""
    trained = []
    for i, state in enumerate(client_states):
        trainer_model.load_state_dict(copy.deepcopy(state))
        opt = torch.optim.SGD(trainer_model.parameters(), lr=lr)
        batches = iter(loaders[i])
        for _ in range(steps):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loaders[i])
                x, y = next(batches)
            sam_step(trainer_model, opt, x.to(device), y.to(device), rho, precision)
        trained.append(copy.deepcopy(trainer_model.state_dict()))
    mixed_states = []
    for i in range(len(trained)):
        mixed = copy.deepcopy(trained[i])
        for key in mixed:
            mixed[key] = sum(W[i, j] * trained[j][key] for j in range(len(trained)) if W[i, j] > 0)
        mixed_states.append(mixed)
    return mixed_states


def end_to_end_experiment(config: Config, data, args, lr: float):
    """A `dfl.run` experiment (no run directory) of DFedSAM with the benchmark's settings, set up but not run:
    its `train_round(t)` is one complete round."""
    from dfl.engine.distributed import communicator_from_env
    from dfl.engine.experiment import Experiment

    run_config = config.replace(algorithm="dfedsam", rho=args.rho, topology=args.topology, lr=lr,
                                momentum=0.0, weight_decay=0.0, rounds=args.rounds + 1, progress=False,
                                device=str(data.train_x.device), eval_every=10**6)
    return Experiment(run_config, data, None, False, communicator_from_env(run_config, args.clients), False)


def main():
    args = parse_args()
    keep_freed_memory()  # as dfl.run does on CPU: reused heap, not fresh zero-filled mappings per call
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if args.precision == "tf32" and device.type != "cuda":
        raise SystemExit(f"--precision tf32 needs a CUDA device (this run is on {device}); use fp32 or bf16")
    set_tf32(args.precision == "tf32")  # fp32 means true fp32 (cuDNN would otherwise use TF32 convolutions)
    config = Config(clients=args.clients, dataset=args.dataset, model=args.model, batch_size=args.batch_size,
                    local_steps=args.local_steps, client_chunk=args.client_chunk, seed=0, precision=args.precision)
    random_data = args.dataset in RANDOM_SHAPES and args.data_root is None
    if random_data:
        data = random_cifar(args.dataset, args.clients, args.random_samples).to(device)
    else:
        data = FederatedData.build(args.dataset, args.clients, "iid", seed=0, root=args.data_root).to(device)
    torch.manual_seed(0)
    model = build_model(args.model, tuple(data.input_shape), data.num_classes).to(device)
    layout = ParamLayout.of(model)
    topo = topologies.build(args.topology, args.clients)
    rule = LocalRule(rho=args.rho)
    lr = 0.01

    gossip = Gossip(topo, LocalCommunicator(args.clients), torch.float32, device)
    X = initial_stack(model, args.clients, device)
    engines = {"dfl engine": LocalTrainer(model, layout, data, list(range(args.clients)), config)}
    if args.compile:
        engines["dfl engine, compile"] = LocalTrainer(model, layout, data, list(range(args.clients)),
                                                      config.replace(compile=True))

    reference_model = copy.deepcopy(model)
    states = [copy.deepcopy(model.state_dict()) for _ in range(args.clients)]
    cpu = data.to(torch.device("cpu"))
    loaders = [
        DataLoader(TensorDataset(cpu.train_x[idx], cpu.train_y[idx]), batch_size=args.batch_size, shuffle=True)
        for idx in cpu.client_indices
    ]
    W = topo.W
    loops = {"sequential reference": lambda t: reference_round(
        reference_model, states, loaders, args.local_steps, W, lr, args.rho, device, args.precision)}
    for name, trainer in engines.items():
        loops[name] = lambda t, trainer=trainer: engine_round(trainer, gossip, X, t, lr, rule)
    if args.end_to_end:
        experiment = end_to_end_experiment(config, data, args, lr)
        loops["dfl.run round"] = experiment.train_round

    first = {name: timed(loop, device, 0) for name, loop in loops.items()}  # warm-up (and compiling)
    # After the warm-up, whose first call also probes the memory plan: the kernels of a steady round's local
    # training (a round index of its own, so the timed rounds are unchanged).
    kernel_calls = record_matmuls(lambda: engines["dfl engine"].train(X, args.rounds + 1, lr, rule))
    loops["matmuls alone"] = matmul_replay(kernel_calls)
    first["matmuls alone"] = timed(loops["matmuls alone"], device, 0)
    # Rounds alternate between the loops and each ratio is the median over rounds of that round's ratio, so a
    # change in machine load (shared CPUs swing by several x) hits both sides of a ratio alike. The matmul peak is
    # measured in every round too (PEAK_REPEATS products), and each loop's fraction of the peak is the median of
    # the per-round fractions, for the same reason.
    peak_dtype_t = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak_n = matmul_size(device, 8192 if device.type == "cuda" else 2048, peak_dtype_t)
    times = {name: [] for name in loops}
    peaks = []
    for t in range(1, args.rounds + 1):
        for name, loop in loops.items():
            times[name].append(timed(loop, device, t))
        peaks.append(matmul_gflops(device, peak_n, PEAK_REPEATS, peak_dtype_t))

    client_steps = args.clients * args.local_steps  # per round
    x0, y0 = next(iter(loaders[0]))
    flops = sam_step_flops(reference_model, x0.to(device), y0.to(device), args.rho)
    peak_dtype = "bf16" if args.precision == "bf16" else args.precision
    peak = statistics.median(peaks)
    if random_data:
        print(f"random data of {RANDOM_SHAPES[args.dataset][0]}'s shape: no --data-root "
              f"({args.random_samples} samples per client, seeded)")
    print(f"DFedSAM round: {args.clients} clients × {args.local_steps} SAM steps, {args.model} "
          f"({layout.dim:,} params), {args.dataset}, batch {args.batch_size}, {args.topology}, "
          f"device {device}, {torch.get_num_threads()} threads, precision {args.precision}, "
          f"median of {args.rounds} alternating rounds")
    reference = times["sequential reference"]
    record = {
        "model": args.model, "params": layout.dim, "dataset": args.dataset, "random_data": random_data,
        "clients": args.clients, "local_steps": args.local_steps, "batch_size": args.batch_size,
        "topology": args.topology, "rounds": args.rounds, "precision": args.precision, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "sam_step_mflop": flops / 1e6, "peak_gflops": peak, "peak_gflops_per_round": peaks, "peak_size": peak_n,
        "peak_dtype": peak_dtype,
        "loops": {}, "speedup": {}, "first_round_s": first,
    }
    # Every loop, the replay of the engine's kernels included, is measured against the same FLOPs of a round (torch's
    # FLOP counter would overcount the replayed grouped convolutions' backward: its formula ignores groups).
    work = client_steps * flops
    for name, seconds in times.items():
        rate = client_steps / statistics.median(seconds)
        fractions = [work / s / 1e9 / p for s, p in zip(seconds, peaks)]
        fraction = statistics.median(fractions)
        gflops = work / statistics.median(seconds) / 1e9
        steps = "(the engine's kernels)" + " " * 12 if name == "matmuls alone" else f"{rate:10.1f} client-steps/s"
        print(f"  {name + ':':22s} {steps}  {gflops:7.1f} GFLOP/s "
              f"({fraction:.0%} of matmul peak, per-round {min(fractions):.0%}-{max(fractions):.0%})")
        record["loops"][name] = {"client_steps_per_s": rate, "seconds_per_round": statistics.median(seconds),
                                 "gflops": gflops, "fraction_of_peak": fraction,
                                 "fraction_of_peak_range": [min(fractions), max(fractions)]}
    for name, seconds in times.items():
        if name not in ("sequential reference", "matmuls alone"):
            ratios = [r / o for r, o in zip(reference, seconds)]
            print(f"  speed-up, {name + ':':22s} {statistics.median(ratios):5.2f}x  "
                  f"(per-round ratios {min(ratios):.2f}-{max(ratios):.2f})")
            record["speedup"][name] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    outside = [1 - r / e for r, e in zip(times["matmuls alone"], times["dfl engine"])]
    print(f"  the engine's local training runs {len(kernel_calls)} matmul/convolution kernel calls a round; time "
          f"outside them: {statistics.median(outside):.0%} of an engine round "
          f"(per-round {min(outside):.0%}-{max(outside):.0%})")
    record["matmul_kernels"] = {"calls": len(kernel_calls), "outside_share": statistics.median(outside),
                                "outside_share_range": [min(outside), max(outside)]}
    if args.compile:
        print(f"  first round with torch.compile: {first['dfl engine, compile']:.1f} s (compiling)")
    print(f"  one SAM step = {flops / 1e6:.1f} MFLOP; {peak_dtype} matmul peak ({peak_n}², every round): median "
          f"{peak:.0f} GFLOP/s (range {min(peaks):.0f}-{max(peaks):.0f})")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()

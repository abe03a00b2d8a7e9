"""Time one gossip step X ← W X for m clients × d parameters, against the device's copy bandwidth.

    python benchmarks/gossip.py                         # small CPU defaults (m=16, d=262144, 2 and 4 workers)
    python benchmarks/gossip.py --clients 1000 --dim 50000 --worlds 0   # the engine target: ring, one process
    python benchmarks/gossip.py --clients 100 --dim 50000 --gossip-steps 4 --worlds 0   # a DFedSAM-MGS round (Q = 4)
    python benchmarks/gossip.py --clients 100 --dim 11200000 --worlds 2 4 8 --device cuda

`--worlds` takes the process counts of the multi-process part; `--worlds 0` is one process only (a bare `--worlds`
is an error: it used to mean "none", silently, and skipped NCCL even on a machine with 8 GPUs).

Single process: the engine's gossip step (`dfl.network.gossip.Gossip`: circulant shifts, CSR spmm, averaging or a
dense product, by its cost rule on the CPU and by a timed calibration on the run's own stack on a GPU, printed
with the times it measured) and, for m <= 4096, a dense matmul (W as an [m, m] matrix times the [m, d]
stack); a step must read and write the stack once, so its traffic is counted as 2·m·d·4 bytes (fp32).
With `--gossip-steps Q` it times a round of Q steps instead: the engine's path (for circulant graphs one pass of
the composed circulant, `dfl.network.gossip.compose_circulants`), the Q steps one by one, and the dense float64
product W^Q applied with one matmul; the traffic is still counted as one read and one write of the stack.
Multi-process: `DistributedCommunicator.mix_steps`
with gossip_mode "p2p" (neighbour rows only, one all_to_all_single) and "allgather" (the whole stack),
on gloo CPU workers, or NCCL when there is more than one GPU; achieved = bytes sent between processes
(all ranks together, `bytes_moved`) / time. The reference is a large tensor copy measured in the same
run, counted as read + write (2 × size / time), the usual way memory bandwidth is quoted.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import topologies
from dfl.training.memory import keep_freed_memory


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="m (default 16)")
    parser.add_argument("--dim", type=int, default=262_144, help="d parameters per client (default 2^18)")
    parser.add_argument("--topology", default="ring", help="topology name (topologies.NAMES), default ring")
    parser.add_argument("--gossip-steps", type=int, default=1,
                        help="Q gossip steps timed as one round, single process (default 1)")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4],
                        help="process counts of the multi-process part (default 2 4; 0 = one process only)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--repeat", type=int, default=10, help="timed repetitions (median reported)")
    parser.add_argument("--copy-mib", type=int, default=0, help="copy benchmark size (default 256 CPU, 1024 GPU)")
    args = parser.parse_args(argv)
    if args.topology not in topologies.NAMES:
        parser.error(f"--topology must be one of {', '.join(topologies.NAMES)}; got {args.topology!r}")
    if args.device not in ("auto", "cpu", "cuda"):
        parser.error(f"--device must be one of auto, cpu, cuda; got {args.device!r}")
    for name in ("clients", "dim", "repeat", "gossip_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.worlds == [0]:  # one process only
        return args
    if any(w < 2 or w > args.clients for w in args.worlds):
        parser.error(f"--worlds must be 0 (one process only) or process counts between 2 and --clients "
                     f"({args.clients}); got {args.worlds}")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn, device, repeat: int) -> float:
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeat):
        tic = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, mib: int, repeat: int) -> float:
    """Bytes/s of dst.copy_(src) for a large fp32 tensor, counted as read + write."""
    n = mib * 2**20 // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    t = _median_seconds(lambda: dst.copy_(src), device, repeat)
    return 2 * n * 4 / t


def engine_path(gossip, steps: int, X: torch.Tensor) -> str:
    """Which way `Gossip.mix` applies steps 0..steps-1 to X (its cost rule's choice on the CPU, its calibration's
    elsewhere)."""
    if gossip.topology.averaging is not None:
        return "averaging"
    method = gossip.method(0, steps, X)
    if method == "dense":
        return "dense"
    if method == "circulant":
        composed = gossip.circulant_product(0, steps)
        return "circulant shifts" if steps == 1 else f"one circulant pass, {len(composed)} offsets"
    return "step by step" if steps > 1 else ("circulant shifts" if gossip.step_operator(0).offsets else "CSR spmm")


def single_process(topology, m: int, d: int, device: torch.device, repeat: int, steps: int = 1):
    """(seconds, bytes/s) of `steps` gossip steps by the engine (`dfl.network.gossip.Gossip`, whichever path its cost
    rule picks), one by one (when steps > 1) and, where m allows, by a dense [m, m] matmul of their float64 product;
    traffic 2·m·d·4 B (read X, write the result)."""
    from dfl.network.comm import LocalCommunicator
    from dfl.network.gossip import Gossip, calibrations

    X = torch.randn(m, d, device=device)
    gossip = Gossip(topology, LocalCommunicator(m), torch.float32, device)
    path = engine_path(gossip, steps, X)  # calibrates first where the device is calibrated
    for found in calibrations().values():
        print("calibration on this stack: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in found["seconds"].items())
              + f" -> {found['method']}")
    t = _median_seconds(lambda: gossip.mix(X, 0, steps), device, repeat)
    out = {f"engine ({path})": (t, 2 * m * d * 4 / t)}
    if steps > 1 and topology.averaging is None:
        operators = [gossip.step_operator(s) for s in range(steps)]

        def one_by_one():
            Y = X
            for operator in operators:
                Y = operator(Y)
            return Y

        t = _median_seconds(one_by_one, device, repeat)
        out[f"{steps} steps one by one"] = (t, 2 * m * d * 4 / t)
    if m <= 4096:
        M = torch.tensor(gossip.product(0, steps), dtype=torch.float32, device=device)
        t = _median_seconds(lambda: M @ X, device, repeat)
        out["dense matmul W @ X" if steps == 1 else f"dense matmul W^{steps} @ X"] = (t, 2 * m * d * 4 / t)
    return out


def _worker(rank, world, port, args, device_type, queue):
    from dfl.config import Config
    from dfl.engine.distributed import DistributedCommunicator, init_process_group

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    # dfl's own set-up (as a torchrun rank: env://, cuda:LOCAL_RANK, NCCL bound to it), not a hand-made group
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    init_process_group(Config(device=device_type, dist_timeout=120.0))
    try:
        W = topologies.build(args.topology, args.clients).matrix(0)
        out = {}
        for mode in ("p2p", "allgather"):
            comm = DistributedCommunicator(args.clients, mode, device)
            X = torch.randn(len(comm.client_ids), args.dim, device=device)
            before = comm.bytes_moved
            comm.mix_steps([W], X)  # warm-up; also measures the bytes of one step
            step_bytes = comm.bytes_moved - before
            times = []
            for _ in range(args.repeat):
                comm.barrier()
                tic = time.perf_counter()
                comm.mix_steps([W], X)
                _sync(device)
                times.append(time.perf_counter() - tic)
            # a step is as slow as its slowest rank
            worst = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            out[mode] = (float(worst), step_bytes)
            comm.close()  # its heartbeat thread (the group is this worker's, destroyed below)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def multi_process(world: int, args, device_type: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, port, args, device_type, queue), nprocs=world, join=True,
                       start_method="spawn")
    return queue.get()


def _gb(x: float) -> str:
    return f"{x / 1e9:8.2f} GB/s"


def main(argv=None) -> None:
    args = parse_args(argv)
    keep_freed_memory()  # as dfl.run does on CPU: reused heap, not fresh zero-filled mappings per call
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    mib = args.copy_mib or (1024 if device.type == "cuda" else 256)
    m, d = args.clients, args.dim
    topology = topologies.build(args.topology, m)
    copy = copy_bandwidth(device, mib, args.repeat)
    stack_mb = m * d * 4 / 1e6
    what = "gossip step" if args.gossip_steps == 1 else f"gossip round of Q = {args.gossip_steps} steps"
    print(f"{what}: {args.topology}, m={m} clients x d={d} fp32 ({stack_mb:.1f} MB stack), device {device}")
    print(f"copy bandwidth ({mib} MiB tensor, read+write):                     {_gb(copy)}")
    for name, (t, bw) in single_process(topology, m, d, device, args.repeat, args.gossip_steps).items():
        print(f"1 process, {name + ':':43s} {t * 1e3:9.3f} ms   traffic 2·m·d·4 B  {_gb(bw)}  "
              f"({100 * bw / copy:5.1f}% of copy)")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if args.worlds == [0]:
        return
    if device.type == "cuda" and gpus < 2:
        print("multi-process: skipped (NCCL needs one GPU per process; this machine has "
              f"{gpus}); run with --device cpu for gloo workers")
        return
    if args.worlds and args.gossip_steps > 1:
        print("multi-process: one step each (--gossip-steps applies to the single process)")
    for world in args.worlds:
        if world == 0:
            continue
        if device.type == "cuda" and world > gpus:
            print(f"{world} processes: skipped ({gpus} GPUs)")
            continue
        results = multi_process(world, args, device.type)
        backend = "nccl" if device.type == "cuda" else "gloo"
        for mode, (t, moved) in results.items():
            rate = moved / t if t > 0 else float("nan")
            print(f"{world} processes ({backend}), {mode:9s}: {t * 1e3:9.3f} ms   moved {moved / 1e6:8.2f} MB "
                  f"{_gb(rate)}  ({100 * rate / copy:5.1f}% of copy)")


if __name__ == "__main__":
    main()

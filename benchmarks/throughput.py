"""One round of DFedSAM on m clients: our vectorized engine vs a faithful sequential reference.

The reference is the per-client loop of the DFedSAM/DisPFL code bases: one `nn.Module` per client,
`torch.optim.SGD`, SAM as two backward passes (perturb, backward, restore, step), deep copies of the
received models and state-dict averaging with the neighbours' weights. Both run the same model, data,
batch size, number of local steps and topology, in the same process, and the script prints
client-steps per second for both and the ratio.

    python benchmarks/throughput.py                          # cnn1d, 32 clients, MNIST-1D, CPU
    python benchmarks/throughput.py --model resnet18 --dataset cifar10 --data-root DIR --clients 100
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F

import topologies
from dfl.clients import ParamLayout, initial_stack
from dfl.comm import LocalCommunicator
from dfl.config import Config
from dfl.data import FederatedData
from dfl.gossip import Gossip
from dfl.local import LocalRule, LocalTrainer
from dfl.models import build_model


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
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per engine (after one warm-up)")
    p.add_argument("--client-chunk", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    return p.parse_args()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_round(trainer, gossip, X, t, lr, rule):
    Y = trainer.train(X, t, lr, rule).Y
    return gossip.mix(Y, t, 1)


def reference_round(models, optimizers, data, schedule, W, lr, rho, device):
    """The sequential loop: local SAM per client, then deep-copy + state-dict averaging."""
    B = schedule.batch_size
    for i, (net, opt) in enumerate(zip(models, optimizers)):
        for k in range(int(schedule.steps_per_client[i])):
            idx = schedule.index[i, k * B : (k + 1) * B]
            keep = schedule.weight[i, k * B : (k + 1) * B] > 0
            x, y = data.train_x[idx[keep]], data.train_y[idx[keep]]
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            params = [p for p in net.parameters() if p.grad is not None]
            with torch.no_grad():
                norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
                eps = [rho * p.grad / (norm + 1e-12) for p in params]
                for p, e in zip(params, eps):
                    p.add_(e)
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            with torch.no_grad():
                for p, e in zip(params, eps):
                    p.sub_(e)
            opt.step()
    snapshots = [copy.deepcopy(net.state_dict()) for net in models]  # what the clients "receive"
    for i, net in enumerate(models):
        mixed = {key: sum(W[i, j] * snapshots[j][key] for j in range(len(models)) if W[i, j] > 0)
                 for key in snapshots[i]}
        net.load_state_dict(mixed)


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    config = Config(clients=args.clients, dataset=args.dataset, model=args.model, batch_size=args.batch_size,
                    local_steps=args.local_steps, client_chunk=args.client_chunk, seed=0)
    data = FederatedData.build(args.dataset, args.clients, "iid", seed=0, root=args.data_root).to(device)
    torch.manual_seed(0)
    model = build_model(args.model, tuple(data.input_shape), data.num_classes).to(device)
    layout = ParamLayout.of(model)
    topo = topologies.build(args.topology, args.clients)
    rule = LocalRule(rho=args.rho)
    lr = 0.01

    trainer = LocalTrainer(model, layout, data, list(range(args.clients)), config)
    gossip = Gossip(topo, LocalCommunicator(args.clients), torch.float32, device)
    X = initial_stack(model, args.clients, device)
    X = engine_round(trainer, gossip, X, 0, lr, rule)  # warm-up
    sync(device)
    tic = time.perf_counter()
    for t in range(1, args.rounds + 1):
        X = engine_round(trainer, gossip, X, t, lr, rule)
    sync(device)
    ours = time.perf_counter() - tic

    models = [copy.deepcopy(model) for _ in range(args.clients)]
    optimizers = [torch.optim.SGD(net.parameters(), lr=lr) for net in models]
    W = topo.W
    reference_round(models, optimizers, data, trainer.schedule(0), W, lr, args.rho, device)  # warm-up
    sync(device)
    tic = time.perf_counter()
    for t in range(1, args.rounds + 1):
        reference_round(models, optimizers, data, trainer.schedule(t), W, lr, args.rho, device)
    sync(device)
    reference = time.perf_counter() - tic

    client_steps = args.clients * args.local_steps * args.rounds
    print(f"DFedSAM round: {args.clients} clients × {args.local_steps} SAM steps, {args.model} "
          f"({layout.dim:,} params), {args.dataset}, batch {args.batch_size}, {args.topology}, "
          f"device {device}, {torch.get_num_threads()} threads")
    print(f"  sequential reference: {client_steps / reference:10.1f} client-steps/s")
    print(f"  dfl engine:           {client_steps / ours:10.1f} client-steps/s")
    print(f"  speed-up:             {reference / ours:10.2f}x")


if __name__ == "__main__":
    main()

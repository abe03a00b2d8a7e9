"""Host synchronisations of the engine per local step, per gossip step and per evaluation, counted on any device.

A GPU runs ahead of the host until the host needs a value: `.item()`, `.tolist()`, `bool(t)`, `nonzero`, a
boolean mask, a device-to-host copy. Each of these waits for every queued kernel. On a GPU torch can report
them (`torch.cuda.set_sync_debug_mode`); on a CPU nothing waits, so this counter intercepts the operations that
*would* synchronise, wherever the tensors live:

- at the Python level (a `TorchFunctionMode`): `Tensor.item`, `tolist`, `cpu`, `__bool__`, `__int__`,
  `__float__` (reads back: "syncs"), and `torch.tensor`, `as_tensor`, `from_numpy` (host data entering torch:
  "uploads", a host-to-device copy on a GPU);
- at the dispatcher (a `TorchDispatchMode`, which also sees what vmap/grad run): `aten._local_scalar_dense`,
  `nonzero`, `masked_select`, `unique`, `repeat_interleave` without `output_size`, and indexing with a boolean
  mask (data-dependent shapes: the host must learn the size).

Host-side state the engine keeps on purpose (schedules, event clocks) is numpy, so whatever this counts is a
torch tensor read back, or host data sent, in the measured span. `Experiment.train_round` with K = 2 and K = 6
local steps gives the syncs per local step as the difference over 4; tests/test_host_syncs.py pins it at zero
for the synchronous engine.

    python benchmarks/host_syncs.py                    # CPU: counts per round and per local step
    python benchmarks/host_syncs.py --device cuda      # the same, plus torch's sync-debug count on the GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (`.numpy()` is not among them: it refuses a CUDA tensor, so on a GPU it only ever reads a host tensor; the read
# back of a device tensor is the `.cpu()` before it)
_READS = {torch.Tensor.item: "item", torch.Tensor.tolist: "tolist", torch.Tensor.cpu: "cpu",
          torch.Tensor.__bool__: "bool", torch.Tensor.__int__: "int", torch.Tensor.__float__: "float"}
_UPLOADS = {torch.tensor: "tensor", torch.as_tensor: "as_tensor"}


class HostSyncCounter:
    """`with HostSyncCounter() as c: ...`; then `c.syncs` and `c.uploads` (Counters by operation)."""

    def __init__(self):
        self.syncs: Counter = Counter()
        self.uploads: Counter = Counter()
        counter = self

        class Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func in _READS:
                    counter.syncs[_READS[func]] += 1
                    counter._reading += 1  # its own aten._local_scalar_dense is not counted again
                    try:
                        return func(*args, **(kwargs or {}))
                    finally:
                        counter._reading -= 1
                if func in _UPLOADS:
                    counter.uploads[_UPLOADS[func]] += 1
                return func(*args, **(kwargs or {}))

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = func.overloadpacket.__name__
                if name == "_local_scalar_dense" and counter._reading:
                    pass
                elif name in ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2",
                            "unique_consecutive", "unique_dim"):
                    counter.syncs[f"aten.{name}"] += 1
                elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) == 1:
                    counter.syncs["aten.repeat_interleave"] += 1
                elif name in ("index", "index_put", "index_put_") and any(
                        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())):
                    counter.syncs[f"aten.{name} (bool mask)"] += 1
                return func(*args, **kwargs)

        self._modes = (Function(), Dispatch())
        self._from_numpy = None
        self._reading = 0

    def __enter__(self):
        # torch.from_numpy takes no tensor and is not overridable by a TorchFunctionMode: wrapped while counting
        self._from_numpy = original = torch.from_numpy

        def from_numpy(array):
            self.uploads["from_numpy"] += 1
            return original(array)

        torch.from_numpy = from_numpy
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        torch.from_numpy = self._from_numpy

    def total(self) -> dict[str, int]:
        return {"syncs": sum(self.syncs.values()), "uploads": sum(self.uploads.values())}


class SyncDebug:
    """torch's own count on CUDA: `set_sync_debug_mode("warn")` warns at every synchronising call; counted here."""

    def __init__(self, device: torch.device):
        self.device, self.count, self._catch = device, 0, None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._catch = warnings.catch_warnings(record=True)
            self._records = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self._catch is not None:
            torch.cuda.set_sync_debug_mode("default")
            self.count = sum("synchroniz" in str(w.message) for w in self._records)
            self._catch.__exit__(*exc)


def round_counts(config, phase: str = "train", rounds: int = 2, device: str = "cpu") -> dict:
    """Counts of the last of `rounds` rounds of `config` (earlier rounds fill the caches): `phase` "train" is
    `Experiment.train_round` (local steps, gossip, the finiteness check), "evaluate" is `Experiment.evaluate`."""
    from dfl.engine.experiment import Experiment
    from dfl.engine.validation import validate
    from dfl.network.comm import LocalCommunicator

    config = validate(config.replace(device=device, rounds=rounds, progress=False))
    exp = Experiment(config, None, None, False, LocalCommunicator(config.clients), False)
    for t in range(rounds - 1):
        exp.train_round(t)
    t = rounds - 1
    with SyncDebug(exp.device) as debug:
        with HostSyncCounter() as counter:
            stats = exp.train_round(t)
            if phase == "evaluate":
                counter.syncs.clear(), counter.uploads.clear()
                exp.evaluate(t, stats)
    return {**counter.total(), "by_operation": dict(counter.syncs + counter.uploads), "sync_debug": debug.count}


def per_local_step(config, device: str = "cpu", steps: tuple[int, int] = (2, 6)) -> dict:
    """Syncs and uploads of a round at K = steps[0] and steps[1] local steps, and per local step (the difference)."""
    a, b = (round_counts(config.replace(local_steps=k, local_epochs=None), device=device) for k in steps)
    span = steps[1] - steps[0]
    return {"K": list(steps), "rounds": [a, b],
            "syncs_per_local_step": (b["syncs"] - a["syncs"]) / span,
            "uploads_per_local_step": (b["uploads"] - a["uploads"]) / span,
            "sync_debug_per_local_step": (b["sync_debug"] - a["sync_debug"]) / span}


CASES = {
    "dfedsam-mgs ring Q=4": dict(algorithm="dfedsam-mgs", topology="ring", gossip_steps=4),
    "dpsgd ring (gossip every step)": dict(algorithm="dpsgd", topology="ring"),
    "dfedavgm exponential": dict(algorithm="dfedavgm", topology="exponential"),
    "dfedsam ring, differential privacy": dict(algorithm="dfedsam", topology="ring", dp_clip=1.0, dp_noise=1.0),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    import dfl

    base = dfl.Config(clients=args.clients, model="mlp", dataset="mnist1d", dataset_options={"num_samples": 2000},
                      batch_size=8, eval_every=1, seed=0)
    out = {}
    for name, changes in CASES.items():
        out[name] = per_local_step(base.replace(**changes), device=args.device)
        r = out[name]
        print(f"{name:<32} syncs/round {r['rounds'][0]['syncs']:>3} (K=2) {r['rounds'][1]['syncs']:>3} (K=6): "
              f"{r['syncs_per_local_step']:.2f} per local step; uploads {r['uploads_per_local_step']:.2f} per local "
              f"step" + (f"; torch sync-debug {r['sync_debug_per_local_step']:.2f} per local step"
                         if args.device.startswith("cuda") else ""))
    evaluation = round_counts(base, phase="evaluate", device=args.device)
    out["evaluation"] = evaluation
    print(f"{'evaluation':<32} syncs {evaluation['syncs']}, uploads {evaluation['uploads']}"
          + (f", torch sync-debug {evaluation['sync_debug']}" if args.device.startswith("cuda") else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

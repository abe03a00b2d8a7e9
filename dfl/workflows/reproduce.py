"""The DFedSAM paper's Table 1 as one sweep: `dfl reproduce dfedsam-table1`.

Shi, Shen, Wei, Sun, Yuan, Wang & Tao, "Improving the model consistency of decentralized federated learning",
ICML 2023 (arXiv 2302.04083), Table 1: train accuracy, test accuracy and their gap of eight methods on CIFAR-10
and CIFAR-100 under several data splits. `table1_sweep` builds it as one `Sweep` with two case axes: `method`
(each method with its own settings, below) and `split`, times `seed` (and `dataset` with `full`). The sweep
machinery runs it, so rerunning the command skips what is done, and adding a method or a
seed runs only the new runs. `dfl.report.paper_table` prints it in the paper's layout.

Scales (the paper's settings, then what the laptop keeps of them):

- `full`: the paper's CIFAR-10 and CIFAR-100 setting, which is the DisPFL code base's (rong-dai/DisPFL, whose
  scripts the DFedSAM code derives from): 100 clients, 500 rounds, 5 local epochs of batch 128, lr 0.1 decayed
  x0.998 per round, weight decay 5e-4, gradient-norm clip 10 (every trainer of that code), ResNet-18 with
  GroupNorm (the code's `customized_resnet18`, dfl's `resnet18`; the poster names no model), random crop and flip.
  Network: the code's "random" topology, every client pulling the models of 10 clients drawn afresh each round
  and averaging 1/11 over them and itself (`random-pull`, k = 10, weights 1/(k+1)); 10 is the code's
  `client_num_per_round` = `frac` 0.1 x 100 clients, which is also the number of clients a centralized round
  samples.
- laptop (default): MNIST-1D (embedded; 4,000 samples, 3,200 to train), 16 clients, `cnn1d`, 40 rounds, 2 local
  epochs of batch 40 (4 steps an epoch, as 128 of the paper's 500 samples a client), the same lr, decay, weight
  decay and clip; `random-pull` with k = 5, which mixes about as fast as the paper's network (one gossip step
  leaves 0.56 of the disagreement, as for 100 clients and k = 10: `dfl topology random-pull --clients 16 --k 5`),
  and a centralized round samples those k = 5 clients (participation 5/16).
- `quick`: 8 clients, 4 rounds, one local epoch, one seed: to try the command (no accuracy meaning).

Fair-comparison notes: every method runs the same rounds, local epochs, batch, lr schedule, weight decay, clip and
data; what differs is what the paper's comparison gives each method:

- FedAvg and FedSAM (centralized) sample k clients per round (`participation` k/m: the code's `frac`, 0.1 at the
  paper's scale), average at the server and run plain local SGD / SAM without momentum (the code's default
  `--momentum 0`).
- D-PSGD takes one SGD step and one gossip step per round (`local_steps` 1): the same rounds and bytes as DFedAvg,
  1/K of its local computation (dfl's D-PSGD gossips once per local step, so K steps would send K times the bytes).
- DFedAvg: local SGD without momentum, one gossip step. DFedAvgM: the same with heavy-ball momentum 0.9.
- DFedSAM and DFedSAM-MGS: local SAM with momentum 0.9 (as DFedAvgM, so DFedSAM against DFedAvgM measures SAM;
  docs/reference/update-rules.md#dfedsam-and-dfedsam-mgs), rho 0.01 (the paper's value; FedSAM gets the same rho
  in place of its own default 0.1, so the two SAM methods differ only in the network), Q = 4 gossip steps for MGS.
- DisPFL (`dispfl`): the authors' CIFAR scripts' defaults (density 0.5 with ERK, a different initial mask per
  client, anneal factor 0.5, random regrowth, no momentum: docs/reference/update-rules.md#dispfl) on the same network.

What each cell is: every run holds out 20% of each client's data (10% with `full`), stratified by label, as the
client's local test set (`local_test_fraction`; the DisPFL code draws it from the test set instead), and scores
each client's own model on its own training data (`personal_train_eval`). The table's train accuracy is
`personal_train_acc_mean` and its test accuracy `personal_acc_mean` (each client's own model on its own local test
set, mean over clients): the personalized measure DisPFL is reported with, and for every other method the same
measure of its models (after the round's gossip, or the server's broadcast: then every client holds x̄).
"""

from __future__ import annotations

import os
from typing import Any

from dfl.errors import SweepError
from dfl.workflows.sweep import Sweep, apply_overrides

STUDY = "dfedsam-table1"
STUDIES = (STUDY,)

# the paper's rows, in its order
METHODS = ("fedavg", "fedsam", "dpsgd", "dfedavg", "dfedavgm", "dispfl", "dfedsam", "dfedsam-mgs")
CENTRALIZED = ("fedavg", "fedsam")
# the columns: the poster's Table 1 has Dirichlet 0.3, Dirichlet 0.6 and IID; the issue adds the pathological
# splits of the DisPFL code (2 and 5 classes per client)
SPLITS: dict[str, dict[str, Any]] = {
    "dir0.3": {"partition": "dirichlet", "alpha": 0.3},
    "dir0.6": {"partition": "dirichlet", "alpha": 0.6},
    "path2": {"partition": "pathological", "partition_options": {"classes_per_client": 2}},
    "path5": {"partition": "pathological", "partition_options": {"classes_per_client": 5}},
    "iid": {"partition": "iid"},
}
PAPER_RHO = 0.01  # DFedSAM's SAM radius, given to every SAM method
MGS_STEPS = 4
MOMENTUM = 0.9

COMMON: dict[str, Any] = {  # every scale: the code base's optimizer settings
    "lr": 0.1, "lr_decay": 0.998, "weight_decay": 5e-4, "clip_grad_norm": 10.0, "personal_train_eval": True,
}
SCALES: dict[str, dict[str, Any]] = {
    "laptop": {"dataset": "mnist1d", "model": "cnn1d", "clients": 16, "rounds": 40, "batch_size": 40,
               "local_epochs": 2, "neighbours": 5, "local_test_fraction": 0.2, "eval_every": 10,
               "train_eval_samples": 1000, "client_eval_samples": 200},
    "quick": {"dataset": "mnist1d", "model": "cnn1d", "clients": 8, "rounds": 4, "batch_size": 32,
              "local_epochs": 1, "neighbours": 3, "local_test_fraction": 0.2, "eval_every": 2,
              "train_eval_samples": 500},
    "full": {"model": "resnet18", "clients": 100, "rounds": 500, "batch_size": 128, "local_epochs": 5,
             "neighbours": 10, "local_test_fraction": 0.1, "eval_every": 10, "train_eval_samples": 5000,
             "client_eval_samples": 500},
}
FULL_DATASETS = ("cifar10", "cifar100")
DEFAULT_SEEDS = {"laptop": 3, "quick": 1, "full": 3}
# runs at once by default: the laptop scale one per core (each worker one thread; up to this many); --quick runs in
# this process (a worker's start, ~3 s of imports, is longer than a quick run); --full one at a time (one GPU)
MAX_PARALLEL = 8


def method_settings(method: str, scale: dict[str, Any]) -> dict[str, Any]:
    """The Config fields of one method at one scale: its algorithm, network, local work and hyperparameters."""
    epochs = {"local_epochs": scale["local_epochs"]}
    network = {"topology": "random-pull", "topology_options": {"k": scale["neighbours"]}}
    sam = {"rho": PAPER_RHO}
    server = {"topology": "full", "participation": scale["neighbours"] / scale["clients"]}
    per_method: dict[str, dict[str, Any]] = {
        "fedavg": {**server, **epochs},
        "fedsam": {**server, **sam, **epochs},
        "dpsgd": {**network, "local_steps": 1},
        "dfedavg": {**network, **epochs},
        "dfedavgm": {**network, "momentum": MOMENTUM, **epochs},
        "dispfl": {**network, **epochs},  # its card's defaults are the authors' scripts' (momentum 0)
        "dfedsam": {**network, **sam, "momentum": MOMENTUM, **epochs},
        "dfedsam-mgs": {**network, **sam, "momentum": MOMENTUM, "gossip_steps": MGS_STEPS, **epochs},
    }
    return {"algorithm": method, **per_method[method]}


def table1_sweep(
    *, full: bool = False, quick: bool = False, methods: list[str] | None = None, splits: list[str] | None = None,
    seeds: int | None = None, datasets: list[str] | None = None, data_root: str | None = None,
    rounds: int | None = None, overrides: dict[str, Any] | None = None,
) -> Sweep:
    """The Table 1 sweep: method x split x seed (x dataset with `full`), checked without torch.

    Args:
        full: the paper's CIFAR scale (needs `data_root`); else the laptop scale.
        quick: the tiny scale for trying the command (not with `full`).
        methods: rows, a subset of `METHODS` (default all eight).
        splits: columns, a subset of `SPLITS` (default all).
        seeds: seeds 0..seeds-1 (default 3; 1 with `quick`).
        datasets: `full` only: a subset of cifar10, cifar100 (default both).
        data_root: the directory of the CIFAR files (`full`).
        rounds: rounds per run instead of the scale's.
        overrides: other Config fields; a field a method or split sets is changed where it is set (e.g.
            local_epochs: every method but D-PSGD's one step).

    Raises:
        SweepError: one line for an unknown method, an unknown split or dataset, `full` with
            `quick` or without `data_root`, or an override of a field the sweep varies.
    """
    if full and quick:
        raise SweepError("--quick and --full exclude each other: --quick is a tiny laptop run, --full the paper's "
                         "CIFAR scale")
    scale_name = "full" if full else "quick" if quick else "laptop"
    scale = SCALES[scale_name]
    methods = _choose("--methods", methods, METHODS)
    splits = _choose("--splits", splits, tuple(SPLITS))
    overrides = dict(overrides or {})
    if full and data_root is None and "data_root" not in overrides:
        raise SweepError("--full trains on CIFAR-10/100 from local files and needs --data-root DIR (the directory "
                         "holding cifar-10-batches-py and cifar-100-python)")
    if not full and datasets:
        raise SweepError("--datasets is for --full (CIFAR-10/100); the laptop scale runs MNIST-1D")
    base: dict[str, Any] = {**COMMON, **{k: v for k, v in scale.items() if k not in ("neighbours", "local_epochs")}}
    if data_root is not None:
        base["data_root"] = data_root
    if rounds is not None:
        base["rounds"] = rounds
    cases = {"method": {m: method_settings(m, scale) for m in methods},
             "split": {s: dict(SPLITS[s]) for s in splits}}
    vary: dict[str, list[Any]] = {}
    if full:
        vary["dataset"] = _choose("--datasets", datasets, FULL_DATASETS)
    vary["seed"] = _seeds(DEFAULT_SEEDS[scale_name] if seeds is None else seeds)
    base, cases = _apply(base, cases, vary, overrides)
    name = f"{STUDY}-full" if full else f"{STUDY}-quick" if quick else STUDY
    parallel = 1 if full or quick else max(1, min(os.cpu_count() or 1, MAX_PARALLEL))
    return Sweep.from_dict({"sweep": {"name": name, "parallel": parallel}, "base": base, "cases": cases,
                            "vary": vary})


def _choose(flag: str, given: list[str] | None, allowed: tuple[str, ...]) -> list[str]:
    """`given` (default: all of `allowed`) checked against `allowed`, in the order of `allowed`, without repeats."""
    if given is None:
        return list(allowed)
    unknown = [g for g in given if g not in allowed]
    if unknown or not given:
        raise SweepError(f"{flag}: unknown value(s) {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(allowed)}")
    return [a for a in allowed if a in given]


def _seeds(n: int) -> list[int]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SweepError(f"--seeds must be an integer >= 1, got {n!r}")
    return list(range(n))


def _apply(base: dict[str, Any], cases: dict[str, dict[str, dict[str, Any]]], vary: dict[str, list[Any]],
           overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, Any]]]]:
    """`--set` overrides: into every method that sets the field (its head, for FIELD.KEY), else into the base.

    `local_steps` replaces every method's local work (`local_epochs`); the fields of the splits, the algorithm and
    the varied fields have their own flags.
    """
    split_fields = {k for values in cases["split"].values() for k in values}
    methods = list(cases["method"].values())
    for key, value in overrides.items():
        head = key.split(".", 1)[0]
        if head in vary or head in split_fields or head in ("algorithm", "name"):
            flag = {"algorithm": "--methods", "seed": "--seeds", "dataset": "--datasets"}.get(head, "--splits")
            raise SweepError(f"--set {key}: {head} is varied by this command; use {flag}")
        if head in ("local_steps", "local_epochs"):  # local work is local_epochs or local_steps, not both
            for values in methods:
                if "local_epochs" in values or head == "local_steps":
                    values.pop("local_epochs" if head == "local_steps" else "local_steps", None)
                    values[head] = value
            continue
        owners = [values for values in methods if head in values]
        for values in owners:
            values.update(apply_overrides(values, {key: value}))
        if not owners:
            base = apply_overrides(base, {key: value})
    return base, cases

"""Ready-made sweeps.

The DFedSAM paper's topology study (`dfl compare-topologies`) and one algorithm across topologies and gossip steps Q
(`dfl spectral-study`), as `Sweep` objects that `run_sweep` runs like any other.
"""

from __future__ import annotations

from typing import Any

from dfl.errors import ConfigError
from dfl.workflows.sweep import Sweep, SweepError, apply_overrides

# The laptop-scale setting of both presets: MNIST-1D, 16 clients, Dirichlet(0.3), the cnn1d model, one local
# epoch per round; every other field is the Config default (lr 0.1 decayed 0.998 per round, batch 32) and each
# algorithm's own hyperparameters (DFedSAM rho = 0.01; DFedSAM-MGS Q = 4; DFedAvgM momentum 0.9).
ALGORITHM_DEFAULTS_NOTE = (
    "Each algorithm runs with its own defaults, as the DFedSAM paper compares them: DFedSAM, DFedSAM-MGS and DFedAvgM "
    "train with heavy-ball momentum 0.9 and D-PSGD and DFedAvg with none; DFedSAM-MGS gossips Q = 4 times a round; "
    "D-PSGD gossips after every local step (a round of one epoch is about 7 steps at 16 clients: that many times "
    "the bytes of DFedAvg). The report's first section lists these differences; --set momentum=0 runs every "
    "algorithm without momentum (those that have none leave the field out), --set local_steps=K fixes the local "
    "work.")
LAPTOP_BASE: dict[str, Any] = {
    "dataset": "mnist1d", "clients": 16, "partition": "dirichlet", "alpha": 0.3, "model": "cnn1d",
    "rounds": 100, "eval_every": 5,
}

# `--full`: the DFedSAM paper's CIFAR-10 topology study (Shi et al., ICML 2023, Table 2: ring, grid, exponential,
# full). Sources: the ICML poster (arXiv 2302.04083; Table 2, Dirichlet 0.3 in Table 1) and
# docs/reference/update-rules.md#dfedsam-and-dfedsam-mgs (100 clients; lr 0.1 decayed 0.998 per round; 5 local epochs;
# batch 128; about 500 rounds; rho = 0.01; Q = 4 for DFedSAM-MGS; DFedAvgM momentum 0.9 -- the algorithms'
# defaults here) and docs/reference/update-rules.md#the-dispfl-lineage (weight decay 5e-4 of the DisPFL code base the
# paper builds on). Neither source names the CIFAR-10 network: VGG-11 (no BatchNorm) is
# this repo's model for that setting; check it against the full paper before quoting numbers.
FULL_BASE: dict[str, Any] = {
    "dataset": "cifar10", "clients": 100, "partition": "dirichlet", "alpha": 0.3, "model": "vgg11",
    "local_epochs": 5, "batch_size": 128, "lr": 0.1, "lr_decay": 0.998, "weight_decay": 5e-4, "rounds": 500,
    "eval_every": 10, "train_eval_samples": 5000,
}
PAPER_TOPOLOGIES = ["ring", "grid", "exponential", "full"]
PAPER_ALGORITHMS = ["dpsgd", "dfedavg", "dfedavgm", "dfedsam", "dfedsam-mgs"]


def compare_topologies_sweep(
    *, full: bool = False, rounds: int | None = None, seeds: int = 1, data_root: str | None = None,
    topologies: list[str] | None = None, algorithms: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Sweep:
    """Algorithm x topology x seed on the laptop (or `full`: the paper's CIFAR-10) setting.

    Each algorithm at its own defaults (`ALGORITHM_DEFAULTS_NOTE`: momentum, gossip steps and bytes differ with the
    algorithm; the report says so).
    """
    base = dict(FULL_BASE if full else LAPTOP_BASE)
    if data_root is not None:
        base["data_root"] = data_root
    for algorithm in algorithms or ():
        _decentralized("--algorithms", algorithm)
    vary: dict[str, list[Any]] = {"algorithm": list(algorithms or PAPER_ALGORITHMS),
                                  "topology": list(topologies or PAPER_TOPOLOGIES), "seed": _seeds(seeds)}
    return _preset("compare-topologies-full" if full else "compare-topologies", base, vary, rounds, overrides)


def spectral_study_sweep(
    *, algorithm: str = "dfedsam-mgs", topologies: list[str] | None = None, gossip_steps: list[int] | None = None,
    clients: list[int] | None = None, rounds: int | None = None, seeds: int = 1,
    overrides: dict[str, Any] | None = None,
) -> Sweep:
    """Topology x (clients) x gossip_steps x seed for one algorithm on the laptop setting.

    An algorithm without multiple gossip steps (no `gossip_steps` hyperparameter) gets no Q axis, and giving one is an
    error. One algorithm at its defaults (DFedSAM-MGS: momentum 0.9, rho 0.01): only the topology, Q and the clients
    differ between the runs, and Q multiplies the bytes a round sends.
    """
    from dfl.algorithms import ALGORITHMS  # no torch: the algorithms' cards

    try:
        ALGORITHMS.card(algorithm, "--algorithm")  # a registered name (or the closest one suggested)
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    _decentralized("--algorithm", algorithm)
    takes_q = ALGORITHMS.card(algorithm).reads("gossip_steps")
    if not takes_q and gossip_steps is not None:
        raise SweepError(f"--gossip-steps: {algorithm} does not take multiple gossip steps; use an algorithm "
                         "with gossip_steps (e.g. dfedsam-mgs) or leave --gossip-steps out")
    vary: dict[str, list[Any]] = {"topology": list(topologies or PAPER_TOPOLOGIES)}
    if clients:
        vary["clients"] = list(clients)
    if takes_q:
        vary["gossip_steps"] = list(gossip_steps or [1, 2, 4])
    vary["seed"] = _seeds(seeds)
    base = {**LAPTOP_BASE, "algorithm": algorithm}
    if clients:
        base.pop("clients")
    return _preset("spectral-study", base, vary, rounds, overrides)


def _decentralized(flag: str, algorithm: str) -> None:
    """A study that varies the topology needs an algorithm that gossips over it.

    A centralized one aggregates at a server (the complete graph) whatever the topology, so every topology would be the
    same run.
    """
    from dfl.algorithms import ALGORITHMS, is_centralized  # no torch: the algorithms' cards

    if algorithm in ALGORITHMS and is_centralized(algorithm):
        decentralized = [name for name in ALGORITHMS if not is_centralized(name)]
        raise SweepError(f"{flag}: {algorithm} is centralized (it aggregates at a server over the complete graph), "
                         f"so varying the topology changes nothing; use decentralized algorithms: "
                         f"{', '.join(decentralized)}")


def _seeds(n: int) -> list[int]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SweepError(f"--seeds must be an integer >= 1, got {n!r}")
    return list(range(n))


def _preset(name: str, base: dict[str, Any], vary: dict[str, list[Any]], rounds, overrides) -> Sweep:
    base = dict(base)
    if rounds is not None:
        base["rounds"] = rounds
    overrides = overrides or {}
    if "local_steps" in overrides:  # local work is local_epochs or local_steps, not both
        base.pop("local_epochs", None)
    for key, value in overrides.items():
        if key in vary:
            raise SweepError(f"--set {key}: {key} is varied by this command; use its own flag")
        if key == "name":
            raise SweepError("--set name: runs are named after their varied fields")
        base = apply_overrides(base, {key: value})
    return Sweep.from_dict({"sweep": {"name": name}, "base": base, "vary": vary})

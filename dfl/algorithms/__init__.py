"""Algorithm registry: name -> class, and hyperparameter resolution against a Config."""

from __future__ import annotations

import warnings

from dfl.algorithms.base import Algorithm, Context, RoundStats
from dfl.algorithms.dfedavg import DFedAvg, DFedAvgM
from dfl.algorithms.dfedsam import DFedSAM, DFedSAMMGS
from dfl.algorithms.domo import DOMO, DOMOS
from dfl.algorithms.dpsgd import DPSGD
from dfl.algorithms.fedavg import FedAvg, FedAvgSM, FedSAM
from dfl.algorithms.fedcm import FedCM, MoFedSAM
from dfl.algorithms.feddyn import FedDyn
from dfl.algorithms.fedgloss import FedGLoSS
from dfl.algorithms.mimelite import MimeLite
from dfl.algorithms.momentum import FedAvgLM, FedAvgLMZ, FedAvgSLM, FedAvgSLMZ
from dfl.algorithms.scaffold import Scaffold

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (DPSGD, DFedAvg, DFedAvgM, DFedSAM, DFedSAMMGS)
}
# Centralized FL: the complete-topology case, aggregation over sampled clients (dfl.algorithms.server).
CENTRALIZED: tuple[type[Algorithm], ...] = (
    FedAvg, FedSAM, MoFedSAM, FedCM, Scaffold, FedAvgSM, FedAvgLM, FedAvgLMZ, FedAvgSLM, FedAvgSLMZ,
    DOMO, DOMOS, MimeLite, FedDyn, FedGLoSS,
)
REGISTRY.update({cls.name: cls for cls in CENTRALIZED})
ALGORITHMS = tuple(REGISTRY)
# Config fields that only some algorithms read.
HYPERPARAMETERS = ("rho", "rho_schedule", "rho_ramp_rounds", "sam", "asam_eta", "momentum", "gossip_steps")
HYPERPARAMETERS += (  # centralized algorithms
    "participation", "participation_mode", "aggregation", "server_lr", "server_momentum", "fedcm_alpha",
    "domo_alpha", "feddyn_alpha", "fedgloss_beta", "server_rho",
)

__all__ = ["ALGORITHMS", "Algorithm", "Context", "RoundStats", "algorithm_class", "resolve_hyperparameters"]


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in REGISTRY:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {name!r}")
    return REGISTRY[name]


def resolve_hyperparameters(config, warn: bool = True) -> tuple[dict, list[str]]:
    """The algorithm's hyperparameters (its defaults overridden by set Config fields) and the names
    of Config fields that were set but do not apply to it (warned about, never silently dropped)."""
    cls = algorithm_class(config.algorithm)
    hp = dict(cls.hyperparameters)
    ignored = []
    for name in HYPERPARAMETERS:
        value = getattr(config, name)
        if value is None:
            continue
        if name in hp:
            hp[name] = value
        else:
            ignored.append(name)
    if "asam_eta" in hp and hp.get("sam") != "asam" and config.asam_eta is not None:
        ignored.append("asam_eta")
    if ignored and warn:
        warnings.warn(
            f"{config.algorithm} does not use {', '.join(ignored)}; ignoring "
            f"{', '.join(f'{n}={getattr(config, n)!r}' for n in ignored)}",
            stacklevel=2,
        )
    return hp, ignored

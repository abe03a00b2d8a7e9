"""Algorithm registry: name -> class, and hyperparameter resolution against a Config."""

from __future__ import annotations

import warnings

from dfl.algorithms.base import Algorithm, Context, RoundStats
from dfl.algorithms.dfedavg import DFedAvg, DFedAvgM
from dfl.algorithms.dfedsam import DFedSAM, DFedSAMMGS
from dfl.algorithms.dpsgd import DPSGD

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (DPSGD, DFedAvg, DFedAvgM, DFedSAM, DFedSAMMGS)
}
ALGORITHMS = tuple(REGISTRY)
# Config fields that only some algorithms read.
HYPERPARAMETERS = ("rho", "sam", "asam_eta", "momentum", "gossip_steps")

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

"""The built-in algorithms as the registry declares them: where each class lives, and its card.

The card holds what validation reads of an algorithm (`dfl.algorithms.check_config`): whether it is centralized,
the hyperparameters it reads with their defaults, and the local optimizers its rule is written for. Declaring the
built-ins by card keeps their modules (and torch) unimported until a run builds one, so a wrong config is refused
at once (`dfl.validate`, `dfl run`). The cards repeat the classes' attributes; `tests/test_fast_refusals.py`
keeps every card equal to the class it declares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ADAPTIVE = ("sgd", "adam", "adamw")  # algorithms whose rule uses local training only through its result
SGD = ("sgd",)
# the server rule's defaults (dfl.algorithms.server.SERVER_DEFAULTS)
SERVER = {"participation": 1.0, "participation_mode": "uniform", "aggregation": "uniform"}
RHO = {"rho_schedule": "constant", "rho_ramp_rounds": 0}  # the SAM radius schedule of every SAM algorithm


# the SAM variant of every SAM algorithm (dfl.algorithms.base.SAM_VARIANT_DEFAULTS)
SAM_VARIANT = {"sam": "sam", "asam_eta": 0.2, "asam_form": "kwon"}


def _sam(rho: float) -> dict[str, Any]:
    return {"rho": rho, **RHO, **SAM_VARIANT}


@dataclass(frozen=True)
class AlgorithmCard:
    """What validation reads of an algorithm class, without importing it.

    A registered class answers the same attributes itself (the registry's card of a class is the class).
    """

    hyperparameters: dict[str, Any] = field(default_factory=dict)
    centralized: bool = False
    local_optimizers: tuple[str, ...] = SGD
    check: Callable[[dict[str, Any]], None] | None = field(default=None, compare=False)
    # the algorithm's refusals of run settings its rule does not cover (`Algorithm.check_run`), given the Config
    run_check: Callable[[Any], None] | None = field(default=None, compare=False)
    push_sum: bool = False  # gossips through `Algorithm.mix`: runs on a column-stochastic W (push-sum)
    byzantine: bool = False  # shares only its models: runs with Byzantine clients and robust aggregators
    dp: bool = False  # every message is a post-processing of the trained models Y: takes dp_clip (`Algorithm.dp`)
    compression: bool = True  # gossips one model-sized stack per step: takes a compressor (`Algorithm.compression`)

    def check_hyperparameters(self, hp: dict[str, Any]) -> None:
        """Run the algorithm's own check of its resolved hyperparameters.

        The algorithm's own check of its resolved hyperparameters (`Algorithm.check_hyperparameters`), where it
        refines the generic ones: the same function the class calls.
        """
        if self.check is not None:
            self.check(hp)

    def check_run(self, config: Any) -> None:
        """The algorithm's refusals of the run's settings (`Algorithm.check_run`): the function the class calls too."""
        if self.run_check is not None:
            self.run_check(config)


def check_kgt(hp: dict[str, Any]) -> None:
    """K-GT's outer step size eta_s must be positive (`dfl.algorithms.kgt.KGT.check_hyperparameters`)."""
    if not hp["outer_lr"] > 0:
        raise ValueError(f"algorithm_options.outer_lr (K-GT's eta_s) must be > 0, got {hp['outer_lr']}")


def check_fedopt_form(hp: dict[str, Any]) -> None:
    """FedYogi and FedAdagrad take the paper's form or Flower's (`dfl.algorithms.fedopt`); torch is FedAdam's only."""
    if hp["fedopt_form"] == "torch":
        raise ValueError("fedopt_form = torch is torch.optim.Adam (pfl-research's FedAdam) and applies only to "
                         "algorithm = fedadam; fedyogi and fedadagrad take fedopt_form = paper or flower")


# DisPFL's options, the defaults of the authors' CIFAR scripts (rong-dai/DisPFL fedml_experiments/standalone/DisPFL/
# cifar10.sh: --dense_ratio 0.5 --anneal_factor 0.5 --dis_gradient_check --different_initial, ERK, momentum 0)
DISPFL = {"momentum": 0.0, "density": 0.5, "density_allocation": "erk", "erk_power": 1.0, "initial_masks": "different",
          "anneal_factor": 0.5, "anneal_rounds": 0, "regrowth": "random"}
DISPFL_CHOICES = {"density_allocation": ("erk", "uniform"), "initial_masks": ("different", "same"),
                  "regrowth": ("random", "gradient")}


def check_dispfl(hp: dict[str, Any]) -> None:
    """DisPFL's options in range (`dfl.algorithms.dispfl.DisPFL.check_hyperparameters`)."""
    for key, allowed in DISPFL_CHOICES.items():
        if hp[key] not in allowed:
            raise ValueError(f"algorithm_options.{key} must be one of {', '.join(allowed)}, got {hp[key]!r}")
    if not 0 < hp["density"] <= 1:
        raise ValueError(f"algorithm_options.density (DisPFL's target fraction of active weights) must be in (0, 1], "
                         f"got {hp['density']}")
    if not 0 <= hp["anneal_factor"] <= 1:
        raise ValueError(f"algorithm_options.anneal_factor (the fraction of active weights pruned and regrown in round "
                         f"0, annealed to 0) must be in [0, 1], got {hp['anneal_factor']}")
    if hp["anneal_rounds"] < 0:
        raise ValueError(f"algorithm_options.anneal_rounds (the rounds the anneal runs over; 0: the run's rounds) must "
                         f"be >= 0, got {hp['anneal_rounds']}")
    if not hp["erk_power"] >= 0:
        raise ValueError(f"algorithm_options.erk_power (the exponent of ERK's (sum of dims / size) scores) must be "
                         f">= 0, got {hp['erk_power']}")


def check_dispfl_run(config: Any) -> None:
    """What DisPFL's masked, count-normalised average cannot run with (`dfl.algorithms.dispfl.DisPFL.check_run`)."""
    if config.dp_clip > 0:
        raise ValueError(f"dp_clip = {config.dp_clip:g} does not apply to dispfl: its masks are chosen from the "
                         "trained weights (and, with regrowth = gradient, from a gradient of private data) and sent "
                         "with them, which the release's clipping and noise do not cover; use dp_clip = 0")
    if config.byzantine or config.aggregator != "mean":
        what = f"byzantine = {config.byzantine:g}" if config.byzantine else f"aggregator = {config.aggregator}"
        raise ValueError(f"{what} does not apply to dispfl: its average divides each weight by the neighbours whose "
                         "masks cover it, which the robust aggregators (over whole dense models) do not; use "
                         "byzantine = 0 and aggregator = mean")
    if config.compressor != "none":
        raise ValueError(f"compressor = {config.compressor} does not apply to dispfl: it already sends only its "
                         "masked weights, and its average needs each neighbour's exact weights and mask (CHOCO keeps "
                         "compressed dense copies); use compressor = none")
    if config.weights == "column-stochastic":
        raise ValueError("weights = column-stochastic (push-sum) does not apply to dispfl: each weight is averaged "
                         "over the neighbours whose masks cover it, normalised per receiver (a row-stochastic "
                         "average); use the topology's own weights (random-pull: 1/(k + 1)) or metropolis")


def _central(hp: dict[str, Any], local_optimizers: tuple[str, ...] = SGD, byzantine: bool = False,
             dp: bool = False) -> AlgorithmCard:
    return AlgorithmCard({**SERVER, **hp}, True, local_optimizers, byzantine=byzantine, dp=dp)


_FEDAVG = {"server_lr": 1.0}
_FEDCM = {**_FEDAVG, "fedcm_alpha": 0.1}
_LM = {**_FEDAVG, "momentum": 0.9}
_SLM = {**_LM, "server_momentum": 0.9}
_DOMO = {"momentum": 0.9, "server_momentum": 0.9, "server_lr": 1.0, "domo_alpha": 1.0}
_FEDADAM = {"server_lr": 0.01, "server_beta1": 0.9, "server_beta2": 0.99, "server_tau": 1e-3, "fedopt_form": "paper"}
_FEDADAGRAD = {"server_lr": 0.1, "server_beta1": 0.0, "server_tau": 1e-3, "fedopt_form": "paper"}
_TRACKING = {"rho_schedule": "constant", "rho_ramp_rounds": 0, **SAM_VARIANT}  # dsgt, kgt

# name -> ("module:Class", card), in the order `dfl list algorithms` shows them
BUILTINS: dict[str, tuple[str, AlgorithmCard]] = {
    "dpsgd": ("dfl.algorithms.dpsgd:DPSGD", AlgorithmCard({}, False, ADAPTIVE, byzantine=True)),
    "dfedavg": ("dfl.algorithms.dfedavg:DFedAvg",
                AlgorithmCard({}, False, ADAPTIVE, push_sum=True, byzantine=True, dp=True)),
    "dfedavgm": ("dfl.algorithms.dfedavg:DFedAvgM",
                 AlgorithmCard({"momentum": 0.9}, False, SGD, push_sum=True, byzantine=True, dp=True)),
    "dfedsam": ("dfl.algorithms.dfedsam:DFedSAM",
                AlgorithmCard({**_sam(0.01), "momentum": 0.9}, False, ADAPTIVE, push_sum=True, byzantine=True,
                              dp=True)),
    "dfedsam-mgs": ("dfl.algorithms.dfedsam:DFedSAMMGS",
                    AlgorithmCard({**_sam(0.01), "momentum": 0.9, "gossip_steps": 4}, False, ADAPTIVE,
                                  push_sum=True, byzantine=True, dp=True)),
    "dispfl": ("dfl.algorithms.dispfl:DisPFL",
               AlgorithmCard(DISPFL, False, SGD, check=check_dispfl, run_check=check_dispfl_run,
                             compression=False)),
    "dsgt": ("dfl.algorithms.dsgt:DSGT", AlgorithmCard({"rho": 0.0, **_TRACKING}, compression=False)),
    "dsgt-sam": ("dfl.algorithms.dsgt:DSGTSAM", AlgorithmCard({"rho": 0.01, **_TRACKING}, compression=False)),
    "kgt": ("dfl.algorithms.kgt:KGT",
            AlgorithmCard({"rho": 0.0, **_TRACKING, "outer_lr": 1.0}, check=check_kgt, compression=False)),
    "kgt-sam": ("dfl.algorithms.kgt:KGTSAM",
                AlgorithmCard({"rho": 0.01, **_TRACKING, "outer_lr": 1.0}, check=check_kgt, compression=False)),
    "fedavg": ("dfl.algorithms.fedavg:FedAvg", _central(_FEDAVG, ADAPTIVE, byzantine=True, dp=True)),
    "fedsam": ("dfl.algorithms.fedavg:FedSAM", _central({**_FEDAVG, **_sam(0.1)}, ADAPTIVE, byzantine=True, dp=True)),
    "mofedsam": ("dfl.algorithms.fedcm:MoFedSAM", _central({**_FEDCM, **_sam(0.1)})),
    "fedcm": ("dfl.algorithms.fedcm:FedCM", _central(_FEDCM)),
    "scaffold": ("dfl.algorithms.scaffold:Scaffold", _central(_FEDAVG)),
    "fedavgsm": ("dfl.algorithms.fedavg:FedAvgSM",
                 _central({**_FEDAVG, "server_momentum": 0.9}, ADAPTIVE, byzantine=True, dp=True)),
    "fedavglm": ("dfl.algorithms.momentum:FedAvgLM", _central(_LM)),
    "fedavglm-z": ("dfl.algorithms.momentum:FedAvgLMZ", _central(_LM)),
    "fedavgslm": ("dfl.algorithms.momentum:FedAvgSLM", _central(_SLM)),
    "fedavgslm-z": ("dfl.algorithms.momentum:FedAvgSLMZ", _central(_SLM)),
    "domo": ("dfl.algorithms.domo:DOMO", _central(_DOMO)),
    "domo-s": ("dfl.algorithms.domo:DOMOS", _central(_DOMO)),
    "mimelite": ("dfl.algorithms.mimelite:MimeLite", _central({**_FEDAVG, "server_momentum": 0.9})),
    "feddyn": ("dfl.algorithms.feddyn:FedDyn", _central({"feddyn_alpha": 0.01}, dp=True)),
    "fedgloss": ("dfl.algorithms.fedgloss:FedGLoSS", _central({
        **_FEDAVG, "rho": 0.15, **SAM_VARIANT, "server_rho": 0.15, "fedgloss_beta": 10.0,
        "rho_schedule": "linear", "rho_ramp_rounds": 0}, dp=True)),
    "fedprox": ("dfl.algorithms.fedprox:FedProx",
                _central({**_FEDAVG, "prox_mu": 0.01}, ADAPTIVE, byzantine=True, dp=True)),
    "fedadam": ("dfl.algorithms.fedopt:FedAdam", _central(_FEDADAM, ADAPTIVE, byzantine=True, dp=True)),
    "fedyogi": ("dfl.algorithms.fedopt:FedYogi",
                AlgorithmCard({**SERVER, **_FEDADAM}, True, ADAPTIVE, check_fedopt_form, byzantine=True, dp=True)),
    "fedadagrad": ("dfl.algorithms.fedopt:FedAdagrad",
                   AlgorithmCard({**SERVER, **_FEDADAGRAD}, True, ADAPTIVE, check_fedopt_form, byzantine=True,
                                 dp=True)),
}

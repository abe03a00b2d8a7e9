"""The built-in algorithms' cards: the one place each fact about a built-in algorithm is written.

Each built-in is one module with its class (the update rule) and one card here: where the class lives, the typed
spec of every hyperparameter it reads (name, type, default, allowed values, one line of help: `param`), and its
capabilities (`AlgorithmCard`). The class binds its card (`card = BUILTINS["dfedsam"].card`) and restates none of it;
its docstring's "Hyperparameters" section, `dfl list algorithms`, the flags' help, the options page and every check
read the card. Nothing here imports torch, so `dfl.validate` and the CLI answer before torch loads.

Shared specs are classes that a card's class extends: `ServerParams` (the sampling and weighting of every centralized
algorithm), `SAMParams` (the SAM radius, its variant and schedule). Redeclaring a field changes its default only
(`rho: float = param(0.1)`): its meaning is written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from dfl.algorithms.spec import ADAPTIVE, SGD, AlgorithmCard, Hyperparameters, param


# ------------------------------------------------------------------------------------------- shared specs
@dataclass(frozen=True)
class ServerParams(Hyperparameters):
    """Which clients a centralized algorithm's server samples each round, and how it weighs them."""

    participation: float = param(1.0, "the fraction of clients the server samples each round")
    participation_mode: str = param("uniform", "how: uniform (round(f·N) without replacement) or bernoulli (each "
                                               "client joins with probability f)")
    aggregation: str = param("uniform", "the participants' weights p_i: uniform (1/|S_t|) or size (n_i / Σ n_j)")


@dataclass(frozen=True)
class FedAvgParams(ServerParams):
    """A server that steps on the participants' mean update."""

    server_lr: float = param(1.0, "η_g, the server's step on the mean update (1 is plain averaging)")


@dataclass(frozen=True)
class SAMParams(Hyperparameters):
    """The SAM radius of every SAM algorithm, its variant and its schedule (`Context.rule`, `Context.rho`)."""

    rho: float = param(0.01, "the SAM radius ρ")
    rho_schedule: str = param("constant", "ρ constant, or ramped linearly from min(0.001, ρ) over rho_ramp_rounds")
    rho_ramp_rounds: int = param(0, "the rounds of the linear ramp of ρ (> 1 to ramp)")
    sam: str = param("sam", "sam (Foret et al. 2021) or asam (Kwon et al. 2021)")
    asam_eta: float = param(0.2, "ASAM's η (the form kwon)")
    asam_form: str = param("kwon", "the form of ASAM's scale T (`dfl.training.local`)")


# ------------------------------------------------------------------------------------------- decentralized
@dataclass(frozen=True)
class MomentumParams(Hyperparameters):
    """DFedAvgM: heavy-ball local SGD."""

    momentum: float = param(0.9, "the local heavy-ball coefficient θ (the buffer reset every round)")


@dataclass(frozen=True)
class DFedSAMParams(SAMParams):
    """DFedSAM: local SAM with heavy ball."""

    momentum: float = param(0.9, "the local heavy-ball coefficient μ, reset every round (0 gives the paper's plain "
                                 "SGD form)")


@dataclass(frozen=True)
class DFedSAMMGSParams(DFedSAMParams):
    """DFedSAM-MGS: DFedSAM with Q gossip steps."""

    gossip_steps: int = param(4, "Q, the gossip steps of a round (a time-varying graph's steps tQ … tQ+Q−1)")


@dataclass(frozen=True)
class TrackingParams(SAMParams):
    """DSGT: gradient tracking, of SAM gradients when ρ > 0 (dsgt-sam)."""

    rho: float = param(0.0)


@dataclass(frozen=True)
class TrackingSAMParams(SAMParams):
    """DSGT-SAM: tracking SAM gradients."""


@dataclass(frozen=True)
class KGTParams(TrackingParams):
    """K-GT: tracking with local steps."""

    outer_lr: float = param(1.0, "η_s, the step on the mixed models (1 gossips the local models themselves)",
                            interval="(0, inf)", short="K-GT's eta_s")


@dataclass(frozen=True)
class KGTSAMParams(KGTParams):
    """K-GT-SAM: K-GT with SAM local steps."""

    rho: float = param(0.01)


DENSITY_ALLOCATIONS = ("erk", "uniform")
INITIAL_MASKS = ("different", "same")
REGROWTHS = ("random", "gradient")


# DisPFL's defaults are those of the authors' CIFAR scripts (rong-dai/DisPFL fedml_experiments/standalone/DisPFL/
# cifar10.sh: --dense_ratio 0.5 --anneal_factor 0.5 --dis_gradient_check --different_initial, ERK, momentum 0)
@dataclass(frozen=True)
class DisPFLParams(Hyperparameters):
    """DisPFL: sparse personalized models."""

    momentum: float = param(0.0, "the local heavy-ball coefficient (the code's SGD default); the buffer is dense and "
                                 "reset every round, the mask applies to the weights only")
    density: float = param(0.5, "the target fraction of active weights over the whole model (`dense_ratio`)",
                           interval="(0, 1]", short="DisPFL's target fraction of active weights")
    density_allocation: str = param(
        "erk", "erk (per-tensor densities by Erdős–Rényi-kernel scores; a tensor above density 1 is dense) or uniform "
               "(every tensor, biases too, at `density`)", choices=DENSITY_ALLOCATIONS)
    erk_power: float = param(1.0, "the exponent of ERK's scores (Σ dims / Π dims)^power (`erk_power_scale`)",
                             interval="[0, inf)", short="the exponent of ERK's (sum of dims / size) scores")
    initial_masks: str = param("different", "different (each client draws its own random mask, the code's CIFAR "
                                            "scripts) or same (one random mask for every client)",
                               choices=INITIAL_MASKS)
    anneal_factor: float = param(
        0.5, "a, the fraction of each tensor's active weights replaced in round 0, annealed to 0 by α_t = (a/2)(1 + "
             "cos(π t/T)); 0 keeps the initial masks (`--static`)", interval="[0, 1]",
        short="the fraction of active weights pruned and regrown in round 0, annealed to 0")
    anneal_rounds: int = param(0, "T of the anneal; 0 is the run's rounds (which then cannot change on resume)",
                               interval="[0, inf)", short="the rounds the anneal runs over; 0: the run's rounds")
    regrowth: str = param("random", "the inactive coordinates regrown: random, or gradient (largest |∇f_i| at the "
                                    "trained model on the round's first minibatch)", choices=REGROWTHS)


# ------------------------------------------------------------------------------------------- centralized
@dataclass(frozen=True)
class FedSAMParams(SAMParams, FedAvgParams):
    """FedSAM: local SAM, FedAvg's server."""

    rho: float = param(0.1)


@dataclass(frozen=True)
class FedCMParams(FedAvgParams):
    """FedCM: client momentum from the server's last mean update."""

    fedcm_alpha: float = param(0.1, "α, the weight of the client's own gradient (1 gives FedAvg)")


@dataclass(frozen=True)
class MoFedSAMParams(SAMParams, FedCMParams):
    """MoFedSAM: FedCM with local SAM."""

    rho: float = param(0.1)


@dataclass(frozen=True)
class ServerMomentumParams(FedAvgParams):
    """FedAvgSM, MimeLite: momentum at the server."""

    server_momentum: float = param(0.9, "β, the server momentum (0 gives FedAvg)")


@dataclass(frozen=True)
class LocalMomentumParams(FedAvgParams):
    """FedAvgLM: local momentum kept across rounds."""

    momentum: float = param(0.9, "μ, the local momentum")


@dataclass(frozen=True)
class LocalServerMomentumParams(LocalMomentumParams):
    """FedAvgSLM: local and server momentum."""

    server_momentum: float = param(0.9, "β, the server momentum")


@dataclass(frozen=True)
class DOMOParams(ServerParams):
    """DOMO: server momentum fused into the local steps."""

    momentum: float = param(0.9, "μ, the local momentum (the buffer reset every round)")
    server_momentum: float = param(0.9, "β, the server momentum")
    server_lr: float = param(1.0, "η_g, the server's step")
    domo_alpha: float = param(1.0, "α, how much server momentum the clients fuse (0 gives FedAvgSLM-Z)")


@dataclass(frozen=True)
class FedDynParams(ServerParams):
    """FedDyn: dynamic regularisation."""

    feddyn_alpha: float = param(0.01, "α, the dynamic regulariser's weight")


@dataclass(frozen=True)
class FedGLoSSParams(SAMParams, FedAvgParams):
    """FedGLoSS: server SAM with ADMM-style client regularisation; `rho` is the client radius ρ_l."""

    rho: float = param(0.15)
    rho_schedule: str = param("linear")
    server_rho: float = param(0.15, "the server radius ρ (ramped with ρ_l under the linear schedule)")
    fedgloss_beta: float = param(10.0, "β, the ADMM penalty (α = 1/β of FedDyn)")


@dataclass(frozen=True)
class FedProxParams(FedAvgParams):
    """FedProx: a proximal term in every local objective."""

    prox_mu: float = param(0.01, "μ, the proximal coefficient (0 gives FedAvg; 0.01: the authors' optimizer's "
                                 "default, the middle of their README's grid {0.001, 0.01, 0.1, 0.5, 1})")


@dataclass(frozen=True)
class FedOptParams(FedAvgParams):
    """FedAdagrad: Adagrad at the server; the base of FedAdam's and FedYogi's."""

    server_lr: float = param(0.1, "η, the server step (the paper's best for CIFAR-10: 10^-1 for FedAdagrad, 10^-2 "
                                  "for FedAdam and FedYogi; it tunes η per task)")
    server_beta1: float = param(0.0, "β1, the first moment's decay (FedAdagrad: 0, no momentum, as the authors' Keras "
                                     "Adagrad and Flower's FedAdagrad; β1 > 0 is Algorithm 2's momentum line)")
    server_tau: float = param(1e-3, "τ, the adaptivity (the authors' recommended 10^-3)")
    fedopt_form: str = param("paper", "paper (v_{−1} = τ², no bias correction), flower (Flower's: v_{−1} = 0; "
                                      "FedAdam's step bias-corrected) or torch (torch.optim.Adam, as pfl-research; "
                                      "FedAdam only)")


@dataclass(frozen=True)
class FedAdamParams(FedOptParams):
    """FedAdam and FedYogi: adaptive server optimizers with a second-moment decay."""

    server_lr: float = param(0.01)
    server_beta1: float = param(0.9)
    server_beta2: float = param(0.99, "β2, the second moment's decay (the paper's value)")


def check_fedopt_form(hp: Any) -> None:
    """FedYogi and FedAdagrad take the paper's form or Flower's; torch is FedAdam's only."""
    if hp.fedopt_form == "torch":
        raise ValueError("fedopt_form = torch is torch.optim.Adam (pfl-research's FedAdam) and applies only to "
                         "algorithm = fedadam; fedyogi and fedadagrad take fedopt_form = paper or flower")


# ------------------------------------------------------------------------------------------- the cards
# what every centralized algorithm is unless its card says more (`dfl.algorithms.server.ServerAlgorithm`'s card)
SERVER = AlgorithmCard(ServerParams, centralized=True, sends="its update up, the global model down")


class Builtin(NamedTuple):
    """A built-in algorithm: where its class lives ("module:Class") and its card."""

    target: str
    card: AlgorithmCard


TRACKER = ("it gossips a tracker or correction beside its models each step, while compressed gossip (CHOCO) keeps "
           "one public copy per client, of the models; compressing both is another algorithm (BEER, Zhao et al., "
           "NeurIPS 2022), not built in")
DISPFL_REFUSALS = {
    "dp": "its masks are chosen from the trained weights (and, with regrowth = gradient, from a gradient of private "
          "data) and sent with them, which the release's clipping and noise do not cover",
    "byzantine": "its average divides each weight by the neighbours whose masks cover it, which the robust "
                 "aggregators (over whole dense models) do not",
    "compression": "it already sends only its masked weights, and its average needs each neighbour's exact weights "
                   "and mask (CHOCO keeps compressed dense copies)",
    "push_sum": "each weight is averaged over the neighbours whose masks cover it, normalised per receiver (a "
                "row-stochastic average)",
}


def _dispfl_round_bytes(d: int, itemsize: int) -> int:
    """DisPFL's round beyond the plan's three [m, d] temporaries (dfl.algorithms.dispfl.DisPFL.round).

    Its message [M ⊙ Y, M] and the mix of it are [m, 2d] each: four [m, d] stacks at the mix, one more than the plan
    counts, beside the new masks m_i' ([m, d] bool). Gradient regrowth peaks lower (Y, its gathered rows, their
    gradients, the scores: four). The prune's sorts add about twice `dispfl.SORT_BYTES` whatever the clients, no stack.
    """
    return d * itemsize + d


def _gossip(hp: type[Hyperparameters], *, sends: str, **flags: Any) -> AlgorithmCard:
    return AlgorithmCard(hp, sends=sends, **flags)


def _model_gossip(hp: type[Hyperparameters], local_optimizers: tuple[str, ...], asynchronous: str) -> AlgorithmCard:
    """A decentralized algorithm that sends only its trained models through `Algorithm.mix`."""
    return AlgorithmCard(hp, False, local_optimizers, push_sum=True, byzantine=True, dp=True, asynchronous="local"
                         if asynchronous == "local" else asynchronous, sends="its trained model")


def _tracking(hp: type[Hyperparameters], sends: str) -> AlgorithmCard:
    return AlgorithmCard(hp, compression=False, sends=sends, refusals={"compression": TRACKER})


def _central(hp: type[Hyperparameters], local_optimizers: tuple[str, ...] = SGD, *, byzantine: bool = False,
             dp: bool = False, sends: str = "its update up, the global model down",
             check: Any = None) -> AlgorithmCard:
    return AlgorithmCard(hp, True, local_optimizers, byzantine=byzantine, dp=dp, sends=sends, check=check)


BUILTINS: dict[str, Builtin] = {  # in the order `dfl list algorithms` shows them
    "dpsgd": Builtin("dfl.algorithms.dpsgd:DPSGD", AlgorithmCard(
        Hyperparameters, False, ADAPTIVE, byzantine=True, asynchronous="step", sends="its model, every local step",
        refusals={"dp": "it sends its model at every local step (K messages a round), while the client-level release "
                        "clips and noises one update per round, so the messages between releases are not covered"})),
    "dfedavg": Builtin("dfl.algorithms.dfedavg:DFedAvg", _model_gossip(Hyperparameters, ADAPTIVE, "local")),
    "dfedavgm": Builtin("dfl.algorithms.dfedavg:DFedAvgM", _model_gossip(MomentumParams, SGD, "local")),
    "dfedsam": Builtin("dfl.algorithms.dfedsam:DFedSAM", _model_gossip(DFedSAMParams, ADAPTIVE, "local")),
    "dfedsam-mgs": Builtin("dfl.algorithms.dfedsam:DFedSAMMGS", _model_gossip(DFedSAMMGSParams, ADAPTIVE, "local")),
    "dispfl": Builtin("dfl.algorithms.dispfl:DisPFL", AlgorithmCard(
        DisPFLParams, compression=False, sends="its masked weights (and its mask when it changed)",
        refusals=DISPFL_REFUSALS, round_bytes=_dispfl_round_bytes)),
    "dsgt": Builtin("dfl.algorithms.dsgt:DSGT", _tracking(TrackingParams, "its model and its gradient tracker")),
    "dsgt-sam": Builtin("dfl.algorithms.dsgt:DSGTSAM", _tracking(TrackingSAMParams,
                                                                  "its model and its gradient tracker")),
    "kgt": Builtin("dfl.algorithms.kgt:KGT", _tracking(KGTParams, "its model step and its correction")),
    "kgt-sam": Builtin("dfl.algorithms.kgt:KGTSAM", _tracking(KGTSAMParams, "its model step and its correction")),
    "fedavg": Builtin("dfl.algorithms.fedavg:FedAvg", _central(FedAvgParams, ADAPTIVE, byzantine=True, dp=True)),
    "fedsam": Builtin("dfl.algorithms.fedavg:FedSAM", _central(FedSAMParams, ADAPTIVE, byzantine=True, dp=True)),
    "mofedsam": Builtin("dfl.algorithms.fedcm:MoFedSAM", _central(MoFedSAMParams)),
    "fedcm": Builtin("dfl.algorithms.fedcm:FedCM", _central(FedCMParams)),
    "scaffold": Builtin("dfl.algorithms.scaffold:Scaffold", _central(
        FedAvgParams, sends="its update and its control-variate change up, the model and c down")),
    "fedavgsm": Builtin("dfl.algorithms.fedavg:FedAvgSM", _central(ServerMomentumParams, ADAPTIVE, byzantine=True,
                                                                   dp=True)),
    "fedavglm": Builtin("dfl.algorithms.momentum:FedAvgLM", _central(LocalMomentumParams)),
    "fedavglm-z": Builtin("dfl.algorithms.momentum:FedAvgLMZ", _central(LocalMomentumParams)),
    "fedavgslm": Builtin("dfl.algorithms.momentum:FedAvgSLM", _central(LocalServerMomentumParams)),
    "fedavgslm-z": Builtin("dfl.algorithms.momentum:FedAvgSLMZ", _central(LocalServerMomentumParams)),
    "domo": Builtin("dfl.algorithms.domo:DOMO", _central(DOMOParams)),
    "domo-s": Builtin("dfl.algorithms.domo:DOMOS", _central(DOMOParams)),
    "mimelite": Builtin("dfl.algorithms.mimelite:MimeLite", _central(
        ServerMomentumParams, sends="its update and its full-batch gradient up, the model and the momentum down")),
    "feddyn": Builtin("dfl.algorithms.feddyn:FedDyn", _central(FedDynParams, dp=True)),
    "fedgloss": Builtin("dfl.algorithms.fedgloss:FedGLoSS", _central(FedGLoSSParams, dp=True)),
    "fedprox": Builtin("dfl.algorithms.fedprox:FedProx", _central(FedProxParams, ADAPTIVE, byzantine=True, dp=True)),
    "fedadam": Builtin("dfl.algorithms.fedopt:FedAdam", _central(FedAdamParams, ADAPTIVE, byzantine=True, dp=True)),
    "fedyogi": Builtin("dfl.algorithms.fedopt:FedYogi", _central(FedAdamParams, ADAPTIVE, byzantine=True, dp=True,
                                                                 check=check_fedopt_form)),
    "fedadagrad": Builtin("dfl.algorithms.fedopt:FedAdagrad", _central(FedOptParams, ADAPTIVE, byzantine=True, dp=True,
                                                                       check=check_fedopt_form)),
}

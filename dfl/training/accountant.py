r"""The privacy accountant: ε of a client after its releases, by Rényi DP (Google's dp-accounting).

Each release of client i is one Gaussian mechanism (`dfl.training.privacy`): an update of L2 sensitivity Δ = 2C under
the replace-one neighbouring relation (`dfl.training.privacy_settings.NEIGHBOURING`) with noise of std σC, i.e. noise
multiplier z = σC/Δ = σ/2. Its Rényi DP at order α is α/(2z²) (Mironov, CSF 2017, Prop. 7); T releases compose to

    ε_RDP(α) = T α Δ² / (2σ²C²) = 2Tα / σ²,

converted to (ε, δ)-DP by `dp_accounting.rdp.RdpAccountant` (the conversion of Balle et al., AISTATS 2020, Thm. 21,
minimized over its orders), as DP-FedSAM (Shi et al., CVPR 2023, Thm. 2) accounts. No amplification by subsampling
is claimed: a client's ε counts only the rounds it trained, but which rounds those are is not treated as secret.
Only the clients' release counts enter, so the worst client is the one that released most.
"""

from __future__ import annotations

import math

from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import RdpAccountant

from dfl.training.privacy_settings import PrivacySettings


def epsilon(settings: PrivacySettings, releases: int) -> float:
    """The ε at δ = `settings.delta` of a client after `releases` releases (inf when σ = 0, 0 before any release)."""
    if releases == 0:
        return 0.0
    if settings.noise == 0:
        return math.inf
    accountant = RdpAccountant()
    accountant.compose(SelfComposedDpEvent(GaussianDpEvent(settings.noise_multiplier), releases))
    return float(accountant.get_epsilon(settings.delta))


def report(settings: PrivacySettings, releases: int) -> dict[str, float | int | None]:
    """The metrics of a round: the worst client's ε (None when σ = 0: no finite ε), δ and its release count."""
    eps = epsilon(settings, releases)
    return {"dp_epsilon": eps if math.isfinite(eps) else None, "dp_delta": settings.delta, "dp_releases": releases}

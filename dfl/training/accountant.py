r"""The privacy accountant: ε of a client after its releases, by Rényi DP (Opacus's RDP analysis).

Each release of client i is one Gaussian mechanism (`dfl.training.privacy`): an update of L2 sensitivity Δ = 2C under
the replace-one neighbouring relation (`dfl.training.privacy_settings.NEIGHBOURING`) with noise of std σC, i.e. noise
multiplier z = σC/Δ = σ/2. Its Rényi DP at order α is α/(2z²) (Mironov, CSF 2017, Prop. 7); T releases compose to

    ε_RDP(α) = T α Δ² / (2σ²C²) = 2Tα / σ²,

computed by `opacus.accountants.analysis.rdp.compute_rdp` (sampling rate 1) and converted to (ε, δ)-DP by its
`get_privacy_spent` (the conversion of Balle et al., AISTATS 2020, Thm. 21, minimized over Opacus's default orders,
`RDPAccountant.DEFAULT_ALPHAS`), as DP-FedSAM (Shi et al., CVPR 2023, Thm. 2) accounts. No amplification by subsampling
is claimed: a client's ε counts only the rounds it trained, but which rounds those are is not treated as secret.
Only the clients' release counts enter, so the worst client is the one that released most.
"""

from __future__ import annotations

import math

from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp

from dfl.training.privacy_settings import PrivacySettings


def epsilon(settings: PrivacySettings, releases: int) -> float:
    """The ε at δ = `settings.delta` of a client after `releases` releases (inf when σ = 0, 0 before any release)."""
    if releases == 0:
        return 0.0
    if settings.noise == 0:
        return math.inf
    orders = RDPAccountant.DEFAULT_ALPHAS
    divergence = rdp.compute_rdp(q=1.0, noise_multiplier=settings.noise_multiplier, steps=releases, orders=orders)
    eps, _ = rdp.get_privacy_spent(orders=orders, rdp=divergence, delta=settings.delta)
    return float(eps)


def report(settings: PrivacySettings, releases: int) -> dict[str, float | int | None]:
    """The metrics of a round: the worst client's ε (None when σ = 0: no finite ε), δ and its release count."""
    eps = epsilon(settings, releases)
    return {"dp_epsilon": eps if math.isfinite(eps) else None, "dp_delta": settings.delta, "dp_releases": releases}

"""The options of client-level differential privacy and their checks, torch-free so `dfl.validate` answers at once.

`dp_clip` (the clipping norm C; 0 = off), `dp_noise` (the noise multiplier σ) and `dp_delta` (the δ of the reported
ε) configure the mechanism of `dfl.training.privacy` and the accountant of `dfl.training.accountant`
(docs/how-to/differential-privacy.md). `check_config` is their part of `dfl.validate`: a DP field set while DP is
off is refused in one line naming the field; an algorithm that sends something the mechanism does not protect, and
the settings that would reveal a client's data size or that the accountant does not model, are refused by the table
of what combines with what (`dfl.engine.combinations`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dfl.config import Config
from dfl.errors import ConfigError

DEFAULT_NOISE = 1.0  # σ when dp_noise is unset
DEFAULT_DELTA = 1e-5  # δ when dp_delta is unset
OPTIONAL_FIELDS = ("dp_noise", "dp_delta")  # fields that apply only with dp_clip > 0
# The neighbouring relation the guarantee is stated for: client i's whole dataset replaced by any other, so two
# clipped updates differ by at most 2C in L2 norm (`SENSITIVITY` × C); every message is seen on its own (no secure
# aggregation), so adding or removing a client is not a relation a neighbour's view allows.
NEIGHBOURING = "replace-one client"
SENSITIVITY = 2.0


@dataclass(frozen=True)
class PrivacySettings:
    """The resolved options of the mechanism: clipping norm C, noise multiplier σ, the reported ε's δ.

    Attributes:
        clip: C > 0, the L2 norm each round update is clipped to.
        noise: σ >= 0; the noise added to a release is N(0, σ²C² I).
        delta: δ in (0, 1).
    """

    clip: float
    noise: float
    delta: float

    @property
    def std(self) -> float:
        """σC, the noise's standard deviation per coordinate."""
        return self.noise * self.clip

    @property
    def noise_multiplier(self) -> float:
        """σC / Δ with Δ = 2C: the noise in units of the L2 sensitivity, what the accountant composes."""
        return self.noise / SENSITIVITY

    @classmethod
    def of(cls, config: Config) -> PrivacySettings | None:
        """The settings of `config`, or None when differential privacy is off (dp_clip = 0)."""
        if not config.dp_clip:
            return None
        noise = DEFAULT_NOISE if config.dp_noise is None else config.dp_noise
        delta = DEFAULT_DELTA if config.dp_delta is None else config.dp_delta
        return cls(float(config.dp_clip), float(noise), float(delta))


def check_config(config: Config) -> None:
    """The differential-privacy part of `dfl.validate`: dp_noise and dp_delta only with DP on (ConfigError naming one).

    What DP runs with (the algorithms whose card says every message is a post-processing of the trained models, the
    synchronous mode, weights that do not reveal a client's data size) is `dfl.engine.combinations`'s.
    """
    if PrivacySettings.of(config) is None:
        for name in OPTIONAL_FIELDS:
            if getattr(config, name) is not None:
                raise ConfigError(f"{name} = {getattr(config, name)} applies only with differential privacy on: set "
                                  f"dp_clip > 0 (the clipping norm C) or remove {name}")

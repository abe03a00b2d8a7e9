"""What the compared runs share, and what differs between them beyond the axes the report varies.

A comparison is fair when the runs differ only where the study varies them. Each algorithm brings its own defaults:
DFedSAM trains with heavy-ball momentum 0.9 where D-PSGD has none, DFedSAM-MGS gossips Q = 4 times a round, D-PSGD
gossips after every local step. So the report lists, per setting, the quantities that decide what a run spends and
how far it steps (`QUANTITIES`), flags each that differs between settings that agree on every axis but the
algorithm, and lists the settings every run shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dfl.config import Config
from dfl.report.layout import format_value, label
from dfl.report.metrics import as_number
from dfl.report.settings import SETTING_FIELDS, Setting, canonical
from dfl.report.tables import markdown_table

# fields always listed among the shared settings (others only when they are not at their default)
CORE_FIELDS = ("dataset", "clients", "partition", "alpha", "model", "rounds", "lr", "lr_schedule", "batch_size",
               "local_epochs", "local_steps", "local_optimizer")
DEFAULTS = Config().to_dict()


def _momentum(setting: Setting) -> float:
    """The heavy-ball momentum of local SGD (0 when the algorithm has none)."""
    value = setting.values.get("momentum")
    return float(value) if isinstance(value, (int, float)) else 0.0


def _local_work(setting: Setting) -> str:
    steps, epochs = setting.values.get("local_steps"), setting.values.get("local_epochs")
    return f"{steps} steps" if steps is not None else f"{epochs or 1} epoch{'s' if (epochs or 1) != 1 else ''}"


def _effective_lr(setting: Setting) -> float | None:
    """The step heavy-ball SGD takes in a steady direction, lr / (1 − momentum) (lr itself for Adam)."""
    lr = as_number(setting.values.get("lr"))
    if lr is None:
        return None
    if setting.values.get("local_optimizer", "sgd") != "sgd":
        return lr
    return lr / (1.0 - _momentum(setting))


def _round_bytes(setting: Setting) -> float | None:
    """Bytes all clients sent in the last evaluated round (mean over the setting's runs)."""
    values = [v for v in (as_number((r.final or {}).get("bytes_sent")) for r in setting.runs) if v is not None]
    return sum(values) / len(values) if values else None


def _models_sent(setting: Setting) -> float | None:
    """Models (or their compressed bytes, in model sizes) each client sent in the last round: gossips x neighbours."""
    sent, run = _round_bytes(setting), setting.runs[0]
    params, clients = as_number(run.summary.get("num_params")), as_number(run.summary.get("clients"))
    if sent is None or not params or not clients:
        return None
    return sent / (4.0 * params * clients)


def _gossip_steps(setting: Setting) -> int:
    value = setting.values.get("gossip_steps")
    return int(value) if isinstance(value, int) else 1


# (column heading, the value of a setting, how it is shown, the Config fields it follows)
QUANTITIES: tuple[tuple[str, Callable[[Setting], Any], Callable[[Any], str], tuple[str, ...]], ...] = (
    ("local momentum", _momentum, lambda v: f"{v:g}", ("momentum",)),
    ("local work per round", _local_work, str, ("local_steps", "local_epochs")),
    ("effective lr = lr/(1 − momentum)", _effective_lr, lambda v: "—" if v is None else f"{v:.3g}",
     ("lr", "momentum")),
    ("gossip steps Q per exchange", _gossip_steps, str, ("gossip_steps",)),
    ("models sent per client per round", _models_sent, lambda v: "—" if v is None else f"{v:.3g}", ()),
    ("MiB sent per round (all clients)", _round_bytes, lambda v: "—" if v is None else f"{v / 2**20:.3g}", ()),
)


def differing(settings: list[Setting], axes: list[str]) -> list[str]:
    """The QUANTITIES (headings) that differ between settings equal on every axis but `algorithm`.

    Those differences come with the algorithm (its defaults), not with what the study varies: a quantity that
    differs only across the other axes (bytes across topologies) is the study itself, and one whose fields are
    axes (momentum varied on purpose) too.
    """
    others = [a for a in axes if a != "algorithm"]
    found = []
    for heading, value, shown, fields in QUANTITIES:
        if any(f in axes for f in fields):
            continue
        seen: dict[str, set[str]] = {}
        for s in settings:
            seen.setdefault(canonical([s.values.get(a) for a in others]), set()).add(shown(value(s)))
        if any(len(v) > 1 for v in seen.values()):
            found.append(heading)
    return found


def shared_settings(settings: list[Setting]) -> list[str]:
    """`field = value` of each setting field every run shares: the core ones, and any other not at its default."""
    shared = []
    for name in SETTING_FIELDS:
        values = {canonical(s.values.get(name)) for s in settings}
        if len(values) != 1:
            continue
        value = settings[0].values.get(name)
        if value is None or value == {} or (name not in CORE_FIELDS and value == DEFAULTS.get(name)):
            continue
        shared.append(f"{name} = {format_value(value)}")
    return shared


def comparison_section(settings: list[Setting], axes: list[str]) -> str:
    """report.md's "What the runs share and what differs" section (Markdown), for settings laid out on `axes`."""
    if not settings:
        return ""
    names = [a for a in axes if len({canonical(s.values.get(a)) for s in settings}) > 1] or axes[:1]
    flagged = differing(settings, axes)
    rows = [[label(s.values, names)] + [shown(value(s)) for _, value, shown, _ in QUANTITIES] for s in settings]
    headings = [", ".join(names) or "setting"] + [h + (" ⚠" if h in flagged else "") for h, *_ in QUANTITIES]
    if flagged:
        verdict = (f"**⚠ Differs beyond the varied axes ({', '.join(axes)}):** {', '.join(flagged)}. These come with "
                   "each algorithm's defaults, not with what the study varies: set them where the algorithms read "
                   "them (e.g. `--set momentum=0`, which the algorithms without momentum leave out, or `--set "
                   "local_steps=K`) to compare on an equal footing, or read the tables with them in mind.")
    else:
        verdict = f"Nothing of the quantities below differs beyond the varied axes ({', '.join(axes)})."
    shared = shared_settings(settings)
    return (f"## What the runs share and what differs\n\n{verdict}\n\n{markdown_table(headings, rows)}\n\n"
            f"**Shared by every run** (besides the fields at their defaults): {', '.join(shared) or 'nothing'}. Each "
            "run's config.toml holds every setting, its algorithm's defaults included.\n")

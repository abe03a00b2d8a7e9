"""A sweep spec: its tables parsed and checked, and planned into one validated Config per run.

`[base]` Config fields, `[vary]` lists (their cartesian product is the runs), `[sweep]` name and parallel, `[slurm]`
launcher defaults; parsed and checked (`Sweep.from_dict`, `load_sweep`) and planned into validated Configs
(`Sweep.plan`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from dfl.config import MAX_NAME, NAME_RE, Config
from dfl.errors import ConfigError, FileReadError, SweepError
from dfl.files import read_toml
from dfl.workflows.launchers import SlurmOptions
from dfl.workflows.sweep.naming import run_name

TABLES = ("sweep", "base", "vary", "slurm")
SWEEP_KEYS = ("name", "parallel")
CONFIG_FIELDS = tuple(f.name for f in fields(Config))
TABLE_FIELDS = tuple(f.name for f in fields(Config) if str(f.type).startswith("dict"))  # dotted keys vary these


@dataclass(frozen=True)
class PlannedRun:
    """One combination of a sweep.

    Its run `name`, the varied fields (`overrides`), its validated `config` (whose `name` is the run name) and the
    `[base]` fields left out of it because its run does not read them (`left_out`, e.g. `rho` for dpsgd).
    """

    name: str
    overrides: dict[str, Any]
    config: Config
    left_out: tuple[str, ...] = ()


@dataclass
class Sweep:
    """A parsed sweep spec: `base` Config fields, `vary` field -> list of values (in key order).

    `name` names the sweep (and its default directory), `parallel` is the local pool's runs at once, `slurm` the
    [slurm] table (the defaults of the submitit launchers).
    """

    base: dict[str, Any] = field(default_factory=dict)
    vary: dict[str, list[Any]] = field(default_factory=dict)
    name: str = "sweep"
    parallel: int = 1
    slurm: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, spec: dict[str, Any], where: str = "sweep spec") -> Sweep:
        """The sweep of a spec's tables, its tables and fields checked.

        The values are not checked here: `plan()` validates every combination's Config.

        Raises:
            SweepError: one line naming `where`, the table and the key, for a table or key dfl does not know, a
                [vary] value that is not a non-empty list, or a field set in both [base] and [vary].
        """
        loose = [k for k, v in spec.items() if not isinstance(v, dict)]
        if loose:
            raise SweepError(f"{where}: key(s) {', '.join(loose)} outside a table; put Config fields under [base] "
                             "and lists of values under [vary]")
        unknown = [k for k in spec if k not in TABLES]
        if unknown:
            raise SweepError(f"{where}: unknown table(s) {', '.join(f'[{k}]' for k in unknown)}; allowed: "
                             + ", ".join(f"[{t}]" for t in TABLES))
        meta, base, vary, slurm = (dict(spec.get(t, {})) for t in TABLES)
        SlurmOptions.from_table(slurm, where=f"{where}: [slurm]")  # a bad option fails before anything runs
        name, parallel = _sweep_table(meta, where)
        base, vary = nest_dotted(base, where), flatten_tables(vary)
        _check_fields(base, vary, where)
        return cls(base=base, vary=vary, name=name, parallel=parallel, slurm=slurm)

    def to_dict(self) -> dict[str, Any]:
        """The spec's tables, as `from_dict` reads them."""
        out = {"sweep": {"name": self.name, "parallel": self.parallel}, "base": dict(self.base),
               "vary": {k: list(v) for k, v in self.vary.items()}}
        if self.slurm:
            out["slurm"] = dict(self.slurm)
        return out

    def to_toml(self) -> str:
        """The spec as a sweep file (what SWEEP/sweep.toml holds)."""
        return tomli_w.dumps(self.to_dict())

    def plan(self) -> list[PlannedRun]:
        """Every combination, first [vary] key slowest, each Config validated (errors name the run).

        A `[base]` field is shared by the runs that read it: a run whose algorithm, dataset or topology does not read
        it (`rho` for dpsgd, `data_root` for mnist1d, a topology for a centralized algorithm) leaves it out (its
        `left_out`, which `dfl sweep` says). A varied field a run does not read is refused (those runs would repeat).
        """
        keys = list(self.vary)
        planned: list[PlannedRun] = []
        seen: dict[str, dict[str, Any]] = {}
        for combination in itertools.product(*(self.vary[k] for k in keys)):
            overrides = dict(zip(keys, combination))
            name = run_name(overrides)
            if name in seen:
                raise SweepError(f"runs {seen[name]} and {overrides} get the same name {name!r}; make the [vary] "
                                 "values distinct")
            seen[name] = overrides
            values = {**apply_overrides(self.base, overrides), "name": name}
            left_out = _unread_base(values, self.base, overrides)
            values = {k: v for k, v in values.items() if k not in left_out}
            planned.append(PlannedRun(name, overrides, _validated(name, values), left_out))
        return planned

    def runs(self) -> list[tuple[str, Config]]:
        """(name, validated Config) per combination."""
        return [(p.name, p.config) for p in self.plan()]


def _sweep_table(meta: dict[str, Any], where: str) -> tuple[str, int]:
    """The [sweep] table's `name` and `parallel`, checked."""
    bad = [k for k in meta if k not in SWEEP_KEYS]
    if bad:
        raise SweepError(f"{where}: unknown key(s) {', '.join(bad)} in [sweep]; allowed: {', '.join(SWEEP_KEYS)}")
    name = meta.get("name", "sweep")
    if not isinstance(name, str) or len(name) > MAX_NAME or not NAME_RE.fullmatch(name):
        raise SweepError(f"{where}: [sweep] name must be 1-{MAX_NAME} letters, digits and ._=,- not starting "
                         f"with '.'; got {name!r}")
    parallel = meta.get("parallel", 1)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise SweepError(f"{where}: [sweep] parallel must be an integer >= 1, got {parallel!r}")
    return name, parallel


def _check_fields(base: dict[str, Any], vary: dict[str, Any], where: str) -> None:
    """[base] and [vary] name Config fields (or FIELD.KEY of a table field), each in one table, not `name`.

    Each [vary] value is a non-empty list.
    """
    for table, values in (("base", base), ("vary", vary)):
        unknown = [k for k in values if k not in CONFIG_FIELDS and not is_table_key(k)]
        if unknown:
            raise SweepError(f"{where}: unknown Config field(s) {', '.join(unknown)} in [{table}]; known "
                             f"fields: {', '.join(CONFIG_FIELDS)} (and FIELD.KEY for the tables "
                             f"{', '.join(TABLE_FIELDS)})")
        if "name" in values:
            raise SweepError(f"{where}: 'name' cannot be set in [{table}]: each run is named after its varied "
                             "fields; name the sweep with [sweep] name = \"...\"")
    for key, values in vary.items():
        if not isinstance(values, list):
            raise SweepError(f"{where}: [vary] {key} must be a list of values, got {values!r} (a single value "
                             "belongs in [base])")
        if not values:
            raise SweepError(f"{where}: [vary] {key} is an empty list; give at least one value")
    both = [k for k in vary if k in base]
    for key in filter(is_table_key, vary):  # algorithm_options.clip vs algorithm_options = {clip = 1}
        head, sub = key.split(".", 1)
        if head in vary:
            raise SweepError(f"{where}: [vary] has both {head} and {key}; vary the whole table or its keys")
        if isinstance(base.get(head), dict) and sub in base[head]:
            both.append(key)
    if both:
        raise SweepError(f"{where}: field(s) {', '.join(both)} in both [base] and [vary]; keep each in one")


def load_sweep(path: str | Path) -> Sweep:
    """Read a sweep TOML file (`[base]`, `[vary]`, optional `[sweep]`); every combination is validated."""
    path = Path(path)
    try:
        spec = read_toml(path, "sweep file")
    except FileReadError as exc:
        raise SweepError(str(exc)) from None
    sweep = Sweep.from_dict(spec, where=f"sweep file {path}")
    sweep.plan()  # fail fast on a typo in any combination
    return sweep


def is_table_key(key: str) -> bool:
    """`field.key` for a table-valued Config field (e.g. `algorithm_options.clip`)."""
    head, dot, sub = key.partition(".")
    return bool(dot) and head in TABLE_FIELDS and bool(sub)


def nest_dotted(base: dict[str, Any], where: str) -> dict[str, Any]:
    """A quoted dotted key in [base] ("algorithm_options.clip" = 0.5) becomes a key of its table."""
    out = {k: v for k, v in base.items() if not is_table_key(k)}
    for key in [k for k in base if is_table_key(k)]:
        head, sub = key.split(".", 1)
        table = out.setdefault(head, {})
        if not isinstance(table, dict) or sub in table:
            raise SweepError(f"{where}: [base] {key} clashes with [base] {head} = {table!r}; set it once")
        out[head] = {**table, sub: base[key]}
    return out


def flatten_tables(vary: dict[str, Any]) -> dict[str, Any]:
    """[vary] with one dotted key per entry of a table of lists.

    TOML's unquoted `algorithm_options.clip = [...]` in [vary] arrives as a table of lists. (A whole table varied
    as a value is a list of tables, and stays as it is.)
    """
    out: dict[str, Any] = {}
    for key, values in vary.items():
        if key in TABLE_FIELDS and isinstance(values, dict):
            out.update({f"{key}.{sub}": v for sub, v in values.items()})
        else:
            out[key] = values
    return out


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The Config values of one run: `base` with the varied fields set (a dotted key sets one key of a table)."""
    values = dict(base)
    for key, value in overrides.items():
        if is_table_key(key):
            head, sub = key.split(".", 1)
            table = values.get(head) or {}  # not a table: left for Config validation to name
            values[head] = {**table, sub: value} if isinstance(table, dict) else table
        else:
            values[key] = value
    return values



def left_out_lines(planned: list[PlannedRun]) -> list[str]:
    """One line per `[base]` field that some runs leave out (they do not read it): how many, and an example run."""
    runs: dict[str, list[str]] = {}
    for p in planned:
        for name in p.left_out:
            runs.setdefault(name, []).append(p.name)
    return [f"[base] {name} is left out of {len(names)} of {len(planned)} runs, which do not read it (e.g. "
            f"{names[0]})" for name, names in runs.items()]


def _unread_base(values: dict[str, Any], base: dict[str, Any], overrides: dict[str, Any]) -> tuple[str, ...]:
    """The `[base]` fields (not varied) that the run of `values` would not read (`dfl.validate`'s `unread_fields`)."""
    from dfl.engine.validation import unread_fields

    try:
        config = Config.from_dict(values)
    except (ConfigError, TypeError):  # the run's own validation names what is wrong
        return ()
    varied = {key.split(".", 1)[0] for key in overrides}
    return tuple(name for name in unread_fields(config) if name in base and name not in varied)


def _validated(name: str, values: dict[str, Any]) -> Config:
    """The validated Config of run `name` (its hyperparameters resolved too); a `SweepError` naming the run."""
    from dfl.engine.validation import validate

    try:
        config = validate(Config.from_dict(values))
    except (ConfigError, TypeError) as exc:
        raise SweepError(f"run {name}: {exc}") from exc
    return config


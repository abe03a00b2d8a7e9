"""A sweep spec: its tables parsed and checked, and planned into one validated Config per run.

`[base]` Config fields, `[cases]` named bundles of Config fields per axis and `[vary]` lists (the runs are the
cartesian product of the case axes and the lists), `[sweep]` name and parallel, `[slurm]` launcher defaults; parsed
and checked (`Sweep.from_dict`, `load_sweep`) and planned into validated Configs (`Sweep.plan`).

A case axis is for settings that go together: `[cases.method.fedavg]` with `algorithm = "fedavg"` and
`participation = 0.1`, `[cases.method.dpsgd]` with `algorithm = "dpsgd"` and `local_steps = 1`, and every run
takes one case of each axis. Its runs are named after the case (`method=fedavg,seed=0`).
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from dfl.config import MAX_NAME, NAME_RE, Config
from dfl.errors import ConfigError, FileReadError, SweepError
from dfl.files import read_toml
from dfl.workflows.launchers import SlurmOptions
from dfl.workflows.sweep.naming import run_name

TABLES = ("sweep", "base", "cases", "vary", "slurm")
SWEEP_KEYS = ("name", "parallel")
CONFIG_FIELDS = tuple(f.name for f in fields(Config))
TABLE_FIELDS = tuple(f.name for f in fields(Config) if str(f.type).startswith("dict"))  # dotted keys vary these


@dataclass(frozen=True)
class PlannedRun:
    """One combination of a sweep.

    Its run `name`, the varied fields (`overrides`) and its validated `config` (whose `name` is the run name).
    """

    name: str
    overrides: dict[str, Any]  # the varied fields, and the case of each case axis by its name
    config: Config


@dataclass
class Sweep:
    """A parsed sweep spec: `base` Config fields, `vary` field -> list of values (in key order).

    `cases` axis -> case name -> the Config fields of that case (axes in key order, before the `vary` keys). `name`
    names the sweep (and its default directory), `parallel` is the local pool's runs at once, `slurm` the [slurm]
    table (the defaults of the submitit launchers).
    """

    base: dict[str, Any] = field(default_factory=dict)
    vary: dict[str, list[Any]] = field(default_factory=dict)
    cases: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    name: str = "sweep"
    parallel: int = 1
    slurm: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, spec: dict[str, Any], where: str = "sweep spec") -> Sweep:
        """The sweep of a spec's tables, its tables and fields checked.

        The values are not checked here: `plan()` validates every combination's Config.

        Raises:
            SweepError: one line naming `where`, the table and the key, for a table or key dfl does not know, a
                [vary] value that is not a non-empty list, a case that is not a table, or a field set in two of
                [base], [vary] and the case axes.
        """
        loose = [k for k, v in spec.items() if not isinstance(v, dict)]
        if loose:
            raise SweepError(f"{where}: key(s) {', '.join(loose)} outside a table; put Config fields under [base] "
                             "and lists of values under [vary]")
        unknown = [k for k in spec if k not in TABLES]
        if unknown:
            raise SweepError(f"{where}: unknown table(s) {', '.join(f'[{k}]' for k in unknown)}; allowed: "
                             + ", ".join(f"[{t}]" for t in TABLES))
        meta, base, cases, vary, slurm = (dict(spec.get(t, {})) for t in TABLES)
        SlurmOptions.from_table(slurm, where=f"{where}: [slurm]")  # a bad option fails before anything runs
        name, parallel = _sweep_table(meta, where)
        base, vary = nest_dotted(base, where), flatten_tables(vary)
        _check_fields(base, vary, where)
        cases = _check_cases(cases, base, vary, where)
        return cls(base=base, vary=vary, cases=cases, name=name, parallel=parallel, slurm=slurm)

    def to_dict(self) -> dict[str, Any]:
        """The spec's tables, as `from_dict` reads them."""
        out: dict[str, Any] = {"sweep": {"name": self.name, "parallel": self.parallel}, "base": dict(self.base)}
        if self.cases:
            out["cases"] = {axis: {case: dict(values) for case, values in named.items()}
                            for axis, named in self.cases.items()}
        out["vary"] = {k: list(v) for k, v in self.vary.items()}
        if self.slurm:
            out["slurm"] = dict(self.slurm)
        return out

    def to_toml(self) -> str:
        """The spec as a sweep file (what SWEEP/sweep.toml holds)."""
        return tomli_w.dumps(self.to_dict())

    def plan(self) -> list[PlannedRun]:
        """Every combination, the case axes then the [vary] keys, the first slowest; each Config validated.

        Errors name the run.
        """
        keys = [*self.cases, *self.vary]
        choices = [list(named) for named in self.cases.values()] + [self.vary[k] for k in self.vary]
        planned: list[PlannedRun] = []
        seen: dict[str, dict[str, Any]] = {}
        for combination in itertools.product(*choices):
            overrides = dict(zip(keys, combination))
            name = run_name(overrides)
            if name in seen:
                raise SweepError(f"runs {seen[name]} and {overrides} get the same name {name!r}; make the [vary] "
                                 "values distinct")
            seen[name] = overrides
            base = dict(self.base)
            for axis, named in self.cases.items():
                base.update(named[overrides[axis]])
            varied = {k: overrides[k] for k in self.vary}
            values = {**apply_overrides(base, varied), "name": name}
            planned.append(PlannedRun(name, overrides, _validated(name, values)))
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


def _check_cases(cases: dict[str, Any], base: dict[str, Any], vary: dict[str, Any],
                 where: str) -> dict[str, dict[str, dict[str, Any]]]:
    """[cases], checked: axis -> case name -> a table of Config fields.

    Each field is set by one axis only and in neither [base] nor [vary]; an axis is not a Config field (nor varied)
    and has at least one case.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    owner: dict[str, str] = {}  # field -> the axis that sets it
    for axis, named in cases.items():
        if axis in CONFIG_FIELDS or axis in vary or is_table_key(axis):
            raise SweepError(f"{where}: [cases.{axis}]: {axis} is a Config field; name a case axis after what its "
                             "cases are (e.g. method, split) and vary a field itself in [vary]")
        if not isinstance(named, dict) or not named:
            raise SweepError(f"{where}: [cases.{axis}] must hold at least one case, a table of Config fields "
                             f"([cases.{axis}.NAME]), got {named!r}")
        out[axis] = {}
        for case, values in named.items():
            if not isinstance(values, dict):
                raise SweepError(f"{where}: [cases.{axis}.{case}] must be a table of Config fields, got {values!r}")
            values = nest_dotted(values, f"{where}: [cases.{axis}.{case}]")
            unknown = [k for k in values if k not in CONFIG_FIELDS or k == "name"]
            if unknown:
                raise SweepError(f"{where}: [cases.{axis}.{case}]: unknown Config field(s) {', '.join(unknown)}; "
                                 f"known fields: {', '.join(f for f in CONFIG_FIELDS if f != 'name')}")
            for key in values:
                if key in base or key in vary or any(k.split(".", 1)[0] == key for k in vary):
                    table = "[base]" if key in base else "[vary]"
                    raise SweepError(f"{where}: field {key} in both {table} and [cases.{axis}.{case}]; keep each "
                                     "field in one table")
                if owner.setdefault(key, axis) != axis:
                    raise SweepError(f"{where}: field {key} set by both case axes [cases.{owner[key]}] and "
                                     f"[cases.{axis}]; set each field on one axis")
            out[axis][case] = values
    return out


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



def _validated(name: str, values: dict[str, Any]) -> Config:
    """The validated Config of run `name` (its hyperparameters resolved too); a `SweepError` naming the run."""
    from dfl.algorithms import resolve_hyperparameters
    from dfl.engine.validation import validate

    try:
        config = validate(Config.from_dict(values))
        with warnings.catch_warnings():  # ignored options are reported when the run starts
            warnings.simplefilter("ignore")
            resolve_hyperparameters(config)
    except (ConfigError, TypeError) as exc:
        raise SweepError(f"run {name}: {exc}") from exc
    return config


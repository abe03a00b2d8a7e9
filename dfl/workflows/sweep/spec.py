"""A sweep spec: its tables parsed and checked, and planned into one validated Config per run.

`[base]` Config fields, `[cases]` named bundles of Config fields per axis and `[vary]` lists (the runs are the
cartesian product of the case axes and the lists), `[sweep]` name and parallel, `[slurm]` launcher defaults; parsed
and checked (`Sweep.from_dict`, `load_sweep`) and planned into validated Configs (`Sweep.plan`).

A case axis is for settings that go together: `[cases.method.fedavg]` with `algorithm = "fedavg"` and
`participation = 0.1`, `[cases.method.dpsgd]` with `algorithm = "dpsgd"` and `local_steps = 1`, and every run
takes one case of each axis. Its runs are named after the case (`method=fedavg,seed=0`).
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from dfl.config import MAX_NAME, NAME_RE, Config, unknown_field_hint
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

    Its run `name`, the varied fields (`overrides`), its validated `config` (whose `name` is the run name) and the
    `[base]` fields left out of it because its run does not read them (`left_out`, e.g. `rho` for dpsgd).
    """

    name: str
    overrides: dict[str, Any]  # the varied fields, and the case of each case axis by its name
    config: Config
    left_out: tuple[str, ...] = ()


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
            SweepError: every mistake at once, each naming `where`, the table and the key: a table or key dfl does not
                know (with the one meant), a [vary] value that is not a non-empty list, a case that is not a table, or
                a field set in two of [base], [vary] and the case axes.
        """
        sweep, problems = cls.parse(spec, where)
        if problems:
            raise SweepError("; ".join(problems))
        return sweep

    @classmethod
    def parse(cls, spec: dict[str, Any], where: str = "sweep spec") -> tuple[Sweep, list[str]]:
        """The sweep of a spec's right parts, and what is wrong with the others (`from_dict`'s mistakes).

        A wrong table or key is left out of the sweep, so that `load_sweep` can validate the runs of the rest and say
        every mistake of a file at once.
        """
        problems = []
        loose = [k for k, v in spec.items() if not isinstance(v, dict)]
        if loose:
            problems.append(f"{where}: key(s) {', '.join(loose)} outside a table; put Config fields under [base] "
                            "and lists of values under [vary]")
        for key in (k for k in spec if k not in TABLES):
            close = difflib.get_close_matches(key.lower(), TABLES, n=1)
            problems.append(f"{where}: unknown table [{key}]" + (f" (did you mean [{close[0]}]?)" if close else
                            "; allowed: " + ", ".join(f"[{t}]" for t in TABLES)))
        meta, base, cases, vary, slurm = (dict(v) if isinstance(v := spec.get(t, {}), dict) else {} for t in TABLES)
        try:
            SlurmOptions.from_table(slurm, where=f"{where}: [slurm]")  # a bad option fails before anything runs
        except (SweepError, ConfigError, ValueError) as exc:
            problems.append(str(exc))
            slurm = {}
        try:
            name, parallel = _sweep_table(meta, where)
        except SweepError as exc:
            problems.append(str(exc))
            name, parallel = "sweep", 1
        try:
            base = nest_dotted(base, where)
        except SweepError as exc:
            problems.append(str(exc))
            base = {k: v for k, v in base.items() if not is_table_key(k)}
        vary = flatten_tables(vary)
        found, wrong = _field_problems(base, vary, where)
        base = {k: v for k, v in base.items() if ("base", k) not in wrong}
        vary = {k: v for k, v in vary.items() if ("vary", k) not in wrong}
        try:
            cases = _check_cases(cases, base, vary, where)
        except SweepError as exc:
            found.append(str(exc))
            cases = {}
        return cls(base=base, vary=vary, cases=cases, name=name, parallel=parallel, slurm=slurm), problems + found

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

        Errors name the run (every mistake of every run at once). A `[base]` field is shared by the runs that read
        it: a run whose algorithm, dataset or topology does not read it (`rho` for dpsgd, `data_root` for mnist1d, a
        topology for a centralized algorithm) leaves it out (its `left_out`, which `dfl sweep` says). A varied field,
        or a case's, that a run does not read is refused (those runs would repeat).
        """
        from dfl.engine.validation import validate

        keys = [*self.cases, *self.vary]
        choices = [list(named) for named in self.cases.values()] + [self.vary[k] for k in self.vary]
        planned: list[PlannedRun] = []
        seen: dict[str, dict[str, Any]] = {}
        failed: dict[str, list[str]] = {}  # each mistake -> the runs that have it
        for combination in itertools.product(*choices):
            overrides = dict(zip(keys, combination))
            name = run_name(overrides)
            if name in seen:
                raise SweepError(f"runs {seen[name]} and {overrides} get the same name {name!r}; make the [vary] "
                                 "values distinct")
            seen[name] = overrides
            base = dict(self.base)
            chosen: dict[str, Any] = {}  # the fields the run's cases set: bundles, read as a varied field is
            for axis, named in self.cases.items():
                chosen.update(named[overrides[axis]])
            base.update(chosen)
            varied = {k: overrides[k] for k in self.vary}
            values = {**apply_overrides(base, varied), "name": name}
            left_out = _unread_base(values, self.base, {**varied, **chosen})
            values = {k: v for k, v in values.items() if k not in left_out}
            try:
                planned.append(PlannedRun(name, overrides, validate(Config.from_dict(values)), left_out))
            except (ConfigError, TypeError) as exc:
                for problem in getattr(exc, "problems", [str(exc)]):
                    failed.setdefault(problem, []).append(name)
        if failed:
            raise SweepError(_failed_runs(failed))
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


def _field_problems(base: dict[str, Any], vary: dict[str, Any], where: str) -> tuple[list[str], set]:
    """What is wrong with [base] and [vary], every mistake at once, and the wrong (table, key)s.

    Both name Config fields (or FIELD.KEY of a table field; an unknown one with the field meant), each in one
    table, not `name`; each [vary] value is a non-empty list.
    """
    problems, wrong = [], set()
    for table, values in (("base", base), ("vary", vary)):
        for key in (k for k in values if k not in CONFIG_FIELDS and not is_table_key(k)):
            problems.append(f"{where}: unknown Config field {key!r} in [{table}]{unknown_field_hint(key)}")
            wrong.add((table, key))
        if "name" in values:
            problems.append(f"{where}: 'name' cannot be set in [{table}]: each run is named after its varied "
                            "fields; name the sweep with [sweep] name = \"...\"")
            wrong.add((table, "name"))
    for key, values in vary.items():
        if not isinstance(values, list):
            problems.append(f"{where}: [vary] {key} must be a list of values, got {values!r} (a single value "
                            "belongs in [base])")
            wrong.add(("vary", key))
        elif not values:
            problems.append(f"{where}: [vary] {key} is an empty list; give at least one value")
            wrong.add(("vary", key))
    both = [k for k in vary if k in base]
    for key in filter(is_table_key, vary):  # algorithm_options.clip vs algorithm_options = {clip = 1}
        head, sub = key.split(".", 1)
        if head in vary:
            problems.append(f"{where}: [vary] has both {head} and {key}; vary the whole table or its keys")
            wrong.add(("vary", key))
        if isinstance(base.get(head), dict) and sub in base[head]:
            both.append(key)
    if both:
        problems.append(f"{where}: field(s) {', '.join(both)} in both [base] and [vary]; keep each in one")
        wrong.update(("vary", key) for key in both)
    return problems, wrong


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
            if "name" in values:
                raise SweepError(f"{where}: [cases.{axis}.{case}]: 'name' cannot be set in a case: each run is "
                                 "named after its cases and varied fields")
            unknown = [k for k in values if k not in CONFIG_FIELDS]
            if unknown:
                raise SweepError(f"{where}: [cases.{axis}.{case}]: unknown Config field(s) "
                                 + ", ".join(f"{k!r}{unknown_field_hint(k)}" for k in unknown))
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


def load_sweep(path: str | Path, overrides: dict[str, Any] | None = None) -> Sweep:
    """Read a sweep TOML file (`[base]`, `[vary]`, optional `[sweep]`); every combination is validated.

    `overrides` (`dfl sweep --set FIELD=VALUE`) replace `[base]` fields before the combinations are validated; one
    that is varied in `[vary]` is refused.
    """
    path = Path(path)
    try:
        spec = read_toml(path, "sweep file")
    except FileReadError as exc:
        raise SweepError(str(exc)) from None
    sweep, problems = Sweep.parse(spec, where=f"sweep file {path}")
    if overrides:
        clash = sorted(key for key in overrides if key in sweep.vary)
        problems += [f"--set {', '.join(clash)}: varied in [vary]; edit the sweep file instead"] if clash else []
        base = apply_overrides(sweep.base, {k: v for k, v in overrides.items() if k not in clash})
        sweep = Sweep(base=base, vary=sweep.vary, cases=sweep.cases, name=sweep.name, parallel=sweep.parallel,
                      slurm=sweep.slurm)
    try:
        sweep.plan()  # every mistake of every combination, before anything runs
    except SweepError as exc:
        problems.append(str(exc))
    if problems:
        raise SweepError("; ".join(problems))
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


SHOWN_PROBLEMS = 8  # distinct mistakes a refused sweep lists (then how many more)


def _failed_runs(failed: dict[str, list[str]]) -> str:
    """Every mistake of a sweep's runs, once each, with the runs it is in.

    "run NAME: ..." or "runs NAME and 15 more: ..." (a mistake of [base] is in every run).
    """
    said = [f"run {names[0]}: {problem}" if len(names) == 1 else
            f"runs {names[0]} and {len(names) - 1} more: {problem}" for problem, names in failed.items()]
    more = f"; and {len(said) - SHOWN_PROBLEMS} more mistakes" if len(said) > SHOWN_PROBLEMS else ""
    return "; ".join(said[:SHOWN_PROBLEMS]) + more


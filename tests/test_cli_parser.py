"""Safe run names and seed bounds; a light, fast and described CLI parser."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from dfl.cli import COMMANDS, build_parser, main
from dfl.config import MAX_NAME, MAX_SEED, Config, ConfigError, options
from dfl.engine.validation import validate


# ------------------------------------------------------------------------------------------- names and seeds
@pytest.mark.parametrize("name", ["../../x", "..", ".", "", "a/b", "/abs", ".hidden", "a b", "x\n", "é", "a" * 201,
                                  "runs\\x"])
def test_unsafe_names_are_rejected(name):
    with pytest.raises(ConfigError, match="name"):
        validate(Config(name=name))


@pytest.mark.parametrize("name", ["default", "my-run_1.2", "algorithm=dfedsam,seed=0", "a" * MAX_NAME, "-x", "x."])
def test_safe_names_pass(name):
    validate(Config(name=name))


def test_name_error_names_the_allowed_characters():
    with pytest.raises(ConfigError, match=r'letters, digits and "\._-=,"'):
        validate(Config(name="../../x"))


def test_non_string_name_is_rejected():
    with pytest.raises(ConfigError, match="name must be a non-empty string"):
        validate(Config(name=3))


@pytest.mark.parametrize("seed", [2**63, 2**64, 2**64 + 5])
def test_seed_above_the_bound_is_a_clear_error(seed):
    with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\^63 - 1\]"):
        validate(Config(seed=seed))


def test_largest_seed_passes_and_survives_toml():
    config = validate(Config(seed=MAX_SEED))
    import tomllib

    assert tomllib.loads(config.to_toml())["seed"] == MAX_SEED


def test_cli_rejects_path_name_before_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert main(["run", "--name", "../../escaped", "--rounds", "1"]) == 2
    assert "name may contain only" in capsys.readouterr().err
    assert not (tmp_path.parent.parent / "escaped").exists()
    assert list((tmp_path / "runs").iterdir()) == []


def test_sweep_run_names_are_valid_config_names():
    from dfl.workflows.sweep import run_name

    name = run_name({"algorithm": "dfedsam-mgs", "topology_options": {"shape": (4, 4)}, "lr": 0.05, "seed": 3})
    validate(Config(name=name))


# -------------------------------------------------------------------------------------------------- the parser
def test_every_config_field_has_help_and_a_flag():
    names = [f.name for f in fields(Config)]
    described = {o.name: o for o in options()}
    assert list(described) == names
    assert all(isinstance(o.help, str) and o.help.strip() and o.section for o in described.values())
    run = build_parser("run")._defaults["subparsers"]["run"]
    flags = {action.dest for action in run._actions}
    assert set(names) <= flags, set(names) - flags
    for o in described.values():
        if o.choices is not None:  # a fixed set: the default is one of them, the flag shows them
            assert o.default is None or o.default in o.choices, o.name


def test_every_run_option_is_described():
    run = build_parser("run")._defaults["subparsers"]["run"]
    for action in run._actions:
        assert action.help and action.help.strip(), action.option_strings or action.dest
        assert not action.help.startswith("default "), action.option_strings


@pytest.mark.parametrize("field_name, registry", [
    ("algorithm", ("dfl.algorithms", "ALGORITHMS")), ("dataset", ("dfl.data", "DATASETS")),
    ("partition", ("dfl.data", "PARTITIONS")), ("model", ("dfl.models", "MODELS")),
    ("topology", ("topologies", "NAMES")), ("weights", ("topologies", "SCHEMES")),
])
def test_help_lists_every_registered_name(field_name, registry):
    import importlib
    import re

    from dfl.cli.run import option_help

    names = getattr(importlib.import_module(registry[0]), registry[1])
    help_text = {o.name: option_help(o) for o in options()}[field_name]
    listed = {"topology": "topologies", "weights": "weights", "partition": "partitions", "dataset": "datasets"}
    if field_name in listed:  # their packages import networkx, which the parser does not load: dfl list names them
        assert f"dfl list {listed[field_name]}" in help_text
        return
    words = set(re.findall(r"[a-z0-9-]+", help_text))
    assert set(names) <= words, set(names) - words


def test_command_table_matches_the_modules():
    full = build_parser()._defaults["subparsers"]
    assert list(full) == list(COMMANDS)
    sub_action = next(a for a in build_parser()._actions if a.dest == "command")
    helps = {choice.dest: choice.help for choice in sub_action._choices_actions}
    assert helps == {name: help_text for name, (_, help_text) in COMMANDS.items()}


# `dfl topology` takes its choices (topology names, weight schemes) from the `topologies` package, which imports
# networkx and scipy (~0.4 s); every other parser imports neither
@pytest.mark.parametrize("command, heavy", [
    *((command, ("torch", "matplotlib", "networkx", "dfl.engine.runner"))
      for command in ("", "run", "report", "landscape", "sweep", "list", "compare-topologies", "spectral-study")),
    ("topology", ("torch", "matplotlib", "dfl.engine.runner")),
])
def test_building_the_parser_imports_no_heavy_module(command, heavy):
    code = (f"import sys, dfl.cli as c; c.build_parser({command!r}); "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("argv", [["run", "--no-such-option"], ["--help"], ["run", "--help"], ["nosuch"]])
def test_argument_errors_and_help_do_not_import_torch(argv):
    code = ("import sys, dfl.cli as c\n"
            f"try:\n    c.main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    assert err.strip().endswith("False"), err


def test_unknown_option_names_the_command_and_suggests(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--roudns", "3", "--out", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "dfl run: error: unrecognized arguments: --roudns" in err
    assert "did you mean --rounds" in err


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name, (_, help_text) in COMMANDS.items():
        assert name in out and help_text.split()[0] in out


@pytest.mark.slow
def test_import_dfl_is_light_but_engine_still_reachable():
    code = "import sys, dfl; light = 'torch' not in sys.modules; print(light, callable(dfl.run), dfl.Result.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True", "Result"]


def test_allowed_values_come_from_the_field_description():
    from dfl.config import Interval

    assert Interval.parse("[0, 1)").describe() == "in [0, 1)"
    assert Interval.parse("(0, inf)").describe() == "> 0" and Interval.parse("[1, inf)").describe() == ">= 1"
    described = {o.name: o for o in options()}
    assert described["momentum"].allowed == "in [0, 1)" and described["sam"].allowed == "one of sam, asam"
    with pytest.raises(ConfigError, match=r"^momentum must be in \[0, 1\), got 1.0$"):
        Config(momentum=1.0).validate()
    with pytest.raises(ConfigError, match=r"^rounds must be an integer >= 1, got None$"):
        Config(rounds=None).validate()  # a field that cannot be unset is not skipped when None
    run = build_parser("run")._defaults["subparsers"]["run"]
    helps = {action.dest: action.help for action in run._actions}
    assert "(in [0, 1))" in helps["momentum"] and "(>= 1; default 200)" in helps["rounds"]


# ------------------------------------------------------------------------------------------- list flags
@pytest.mark.parametrize("command,flag,items,expected", [
    ("topology", "--topologies", ["ring", "grid"], ["ring", "grid"]),
    ("topology", "--clients", ["16", "64"], [16, 64]),
    ("compare-topologies", "--topologies", ["ring", "grid"], ["ring", "grid"]),
    ("compare-topologies", "--algorithms", ["dfedavg", "dfedsam"], ["dfedavg", "dfedsam"]),
    ("spectral-study", "--topologies", ["ring", "full"], ["ring", "full"]),
    ("spectral-study", "--gossip-steps", ["1", "4"], [1, 4]),
    ("spectral-study", "--clients", ["8", "16"], [8, 16]),
    ("report", "--rows", ["algorithm", "seed"], ["algorithm", "seed"]),
    ("report", "--cols", ["topology", "alpha"], ["topology", "alpha"]),
    ("run", "--lr-milestones", ["100", "150"], [100, 150]),
    ("run", "--adam-betas", ["0.9", "0.99"], [0.9, 0.99]),
])
def test_a_list_flag_takes_spaces_or_commas_under_every_command(command, flag, items, expected):
    """One syntax for every flag that takes a list (dfl.cli.lists), said in its --help."""
    parser = build_parser(command)
    head = {"topology": ["topology", "compare"], "report": ["report", "runs"]}.get(command, [command])
    dest = flag[2:].replace("-", "_")
    for argv in (items, [",".join(items)], [items[0] + ",", *items[1:]]):
        assert getattr(parser.parse_args([*head, flag, *argv]), dest) == expected
    command_parser = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith(command))
    assert "space- or comma-separated" in " ".join(command_parser.format_help().split())
    with pytest.raises(SystemExit):  # no item (a flag that allows an empty list: an item of the wrong type)
        parser.parse_args([*head, flag, "," if command != "run" else "x"])

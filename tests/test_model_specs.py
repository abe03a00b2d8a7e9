"""Each fact once: list options' item ranges, plug-in models' option specs, and the flags' help from the cards.

- `param(..., items=...)`: a list option declares its items' type and range; `dfl.validate` refuses a bad list in one
  line naming the option and the allowed values (mlp's `hidden`), and the factory agrees with the spec.
- `dfl.models.register(..., options=Spec)`: the spec must be the factory's signature, and a plug-in model's options
  are then checked by `dfl.validate` and listed by `dfl list models`.
- `dfl run --help` and the options page say each algorithm hyperparameter's defaults as the algorithms' cards
  declare them (`dfl.cli.run.algorithm_defaults`).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import dfl
from dfl.algorithms import HYPERPARAMETERS
from dfl.algorithms.builtin import BUILTINS, DFedSAMMGSParams
from dfl.cli.run import algorithm_defaults, option_help
from dfl.config import options
from dfl.errors import ConfigError
from dfl.specs import Spec, param

OPTIONS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "options.md"


@dataclass(frozen=True)
class ListOptions(Spec):
    widths: tuple[int, ...] = param((4,), "widths", items="[1, inf)")
    scales: list[float] = param([1.0], "scales", items="(0, 1]")
    anything: list = param([], "numbers >= 0", items="[0, inf)")
    shape: list | None = param(None, "an optional pair", items="[1, inf)")


@pytest.mark.parametrize(("name", "value", "bad"), [
    ("widths", -3, "-3"), ("widths", [8, 0], "[8, 0] (item 1: 0)"), ("widths", [8, 2.5], "(item 1: 2.5)"),
    ("widths", [8, True], "(item 1: True)"), ("widths", "88", "'88'"), ("widths", {"a": 1}, "{'a': 1}"),
    ("scales", [0.5, 0], "(item 1: 0)"), ("scales", [1.5], "(item 0: 1.5)"), ("scales", [float("nan")], "nan"),
    ("anything", [-1], "(item 0: -1)"), ("shape", [4, 0], "(item 1: 0)"),
])
def test_a_list_outside_its_items_range_is_refused_naming_the_option_and_the_allowed_values(name, value, bad):
    spec = {p.name: p for p in ListOptions.specs()}[name]
    with pytest.raises(ValueError) as err:
        spec.check(value, "model_options")
    message = str(err.value)
    assert message.startswith(f"model_options.{name} must be {spec.allowed}, got ") and bad in message
    assert "\n" not in message


@pytest.mark.parametrize(("name", "value"), [
    ("widths", [8]), ("widths", (4, 4)), ("widths", []), ("scales", [1, 0.5]), ("scales", (1.0,)),
    ("anything", [0, 2.5, 3]), ("shape", None), ("shape", (4, 4)),
])
def test_a_list_inside_its_items_range_passes(name, value):
    {p.name: p for p in ListOptions.specs()}[name].check(value, "model_options")


def test_the_allowed_values_of_a_list_say_its_items_type_and_range():
    allowed = {p.name: p.allowed for p in ListOptions.specs()}
    assert allowed == {"widths": "a list of ints >= 1", "scales": "a list of floats in (0, 1]",
                       "anything": "a list of numbers >= 0", "shape": "a list of numbers >= 1"}
    assert "widths: widths. Allowed: a list of ints >= 1. Defaults to (4,)." in ListOptions.docstring_args()


@pytest.mark.parametrize("hidden", [-3, [8, 0], [16, -1], "wide", [8.5]])
def test_mlp_hidden_is_refused_by_validate_as_its_spec_says(hidden):
    with pytest.raises(ConfigError) as err:
        dfl.validate(dfl.Config(model="mlp", model_options={"hidden": hidden}))
    assert str(err.value).startswith(f"model_options.hidden must be a list of ints >= 1, got {hidden!r}")


def test_mlp_hidden_refusal_loads_no_torch():
    code = ("import sys, dfl\n"
            "try:\n    dfl.validate(dfl.Config(model='mlp', model_options={'hidden': [8, 0]}))\n"
            "except ValueError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["model_options.hidden must be a list of ints >= 1, got [8, 0] (item 1: 0)", "False"]


@pytest.mark.parametrize("hidden", [(), [8], (3, 5), [-3], [0], [8, 2.5], 7])
def test_the_mlp_factory_and_its_spec_agree(hidden):
    """What the card allows builds; what it refuses, the factory refuses too (a spec looser than the factory fails)."""
    from dfl.errors import ModelError
    from dfl.models import MODELS, build_model

    spec = {p.name: p for p in MODELS.card("mlp").spec.specs()}["hidden"]
    try:
        spec.check(hidden, "model_options")
    except ValueError:
        with pytest.raises(ModelError):
            build_model("mlp", (1, 8), 3, hidden=hidden)
    else:
        assert build_model("mlp", (1, 8), 3, hidden=hidden) is not None


# ----------------------------------------------------------------------------------------- plug-in models
@dataclass(frozen=True)
class WidthOptions(Spec):
    width: int = param(16, "the hidden width", interval="[1, inf)")
    dropout: float = param(0.0, "the dropout probability", interval="[0, 1)")
    blocks: tuple[int, ...] = param((2,), "layers per block", items="[1, inf)")


def _factory(input_shape, num_classes, *, width=16, dropout=0.0, blocks=(2,)):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(40, width), nn.ReLU(), nn.Linear(width, num_classes))


@pytest.fixture
def plugin():
    from dfl.models import MODELS
    from dfl.models.builtin import SPECS

    yield "spec-model"
    MODELS.unregister("spec-model")
    SPECS.pop("spec-model", None)


@pytest.mark.parametrize(("options", "message"), [
    ({"width": 0}, "model_options.width must be >= 1, got 0"),
    ({"dropout": 1.0}, "model_options.dropout must be in [0, 1), got 1.0"),
    ({"blocks": [2, 0]}, "model_options.blocks must be a list of ints >= 1, got [2, 0] (item 1: 0)"),
    ({"depth": 3}, "unknown option(s) depth for model 'spec-model'; allowed options: width=16, dropout=0.0"),
])
def test_a_plugin_model_registered_with_a_spec_is_validated_by_it(plugin, options, message):
    dfl.models.register(plugin, _factory, options=WidthOptions)
    with pytest.raises(ConfigError) as err:
        dfl.validate(dfl.Config(model=plugin, model_options=options))
    assert message in str(err.value) and "\n" not in str(err.value)
    dfl.validate(dfl.Config(model=plugin, model_options={"width": 8, "blocks": [1, 3]}))


def test_a_plugin_models_spec_is_listed(plugin, capsys):
    from dfl.cli import main

    dfl.models.register(plugin, options=WidthOptions)(_factory)  # as a decorator
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert "width=16 (int, >= 1): the hidden width" in out
    assert "blocks=(2,) (tuple[int, ...], a list of ints >= 1): layers per block" in out


def test_a_plugin_models_spec_must_be_its_signature(plugin):
    from dfl.errors import ModelError
    from dfl.models import MODELS

    def narrower(input_shape, num_classes, *, width=8, dropout=0.0, blocks=(2,)):
        raise AssertionError("never built")

    def kwargs(input_shape, num_classes, **options):
        raise AssertionError("never built")

    with pytest.raises(ModelError, match=r"its options spec .* is not its signature's .*'width': 8"):
        dfl.models.register(plugin, narrower, options=WidthOptions)
    with pytest.raises(ModelError, match="keyword-only parameters, not \\*\\*kwargs"):
        dfl.models.register(plugin, kwargs, options=WidthOptions)
    with pytest.raises(ModelError, match="must be a dfl.specs.Spec subclass"):
        dfl.models.register(plugin, _factory, options={"width": 16})
    assert plugin not in MODELS.names()


def test_a_plugin_replaced_without_a_spec_loses_it(plugin):
    from dfl.models import MODELS

    dfl.models.register(plugin, _factory, options=WidthOptions)
    assert MODELS.card(plugin).spec is WidthOptions

    def other(input_shape, num_classes, *, width=16):
        raise AssertionError("never built")

    dfl.models.register(plugin, other, replace=True)
    assert MODELS.card(plugin).spec is None
    dfl.validate(dfl.Config(model=plugin, model_options={"width": 0}))  # its own range now: the factory's to check


# ----------------------------------------------------------------------------------------- the flags' help
def _card_defaults(name: str) -> dict[str, str]:
    """Algorithm -> its card's default of Config field `name`, as the help shows it."""
    out = {}
    for algorithm, builtin in BUILTINS.items():
        for spec in builtin.card.specs():
            if spec.name == name:
                out[algorithm] = f"{spec.default:g}" if isinstance(spec.default, float) else str(spec.default)
    return out


@pytest.mark.parametrize("name", HYPERPARAMETERS)
def test_each_hyperparameter_flag_says_the_defaults_of_the_cards(name):
    defaults = _card_defaults(name)
    text = algorithm_defaults(name)
    if not defaults:
        assert text == ""
        return
    assert text.startswith("unset = the algorithm's: ")
    named: dict[str, str] = {}
    rest = None
    for part in text.removeprefix("unset = the algorithm's: ").split("; "):
        value, _, names = part.partition(" for ")
        if names == "the others" or not names:
            rest = value
        else:
            named.update(dict.fromkeys(names.split(", "), value))
    assert set(named) <= set(defaults)
    for algorithm, value in defaults.items():
        assert named.get(algorithm, rest) == value, (name, algorithm)


def test_the_help_follows_a_change_of_a_card(monkeypatch):
    from dfl.cli import build_parser

    @dataclass(frozen=True)
    class SevenSteps(DFedSAMMGSParams):
        gossip_steps: int = param(7)

    builtin = BUILTINS["dfedsam-mgs"]
    assert algorithm_defaults("gossip_steps") == "unset = the algorithm's: 4 for dfedsam-mgs"
    monkeypatch.setitem(BUILTINS, "dfedsam-mgs", builtin._replace(
        card=dataclasses.replace(builtin.card, hyperparameters=SevenSteps)))
    assert algorithm_defaults("gossip_steps") == "unset = the algorithm's: 7 for dfedsam-mgs"
    run = build_parser("run")._defaults["subparsers"]["run"]  # built from the cards as they are now
    help_text = " ".join(run.format_help().split())
    assert "gossip steps Q per round (unset = the algorithm's: 7 for dfedsam-mgs)" in help_text


def test_the_options_page_shows_the_same_defaults():
    page = OPTIONS_PAGE.read_text()
    for opt in options():
        if opt.name in HYPERPARAMETERS and algorithm_defaults(opt.name):
            row = next(line for line in page.splitlines() if line.startswith(f"| `{opt.name}` |"))
            assert option_help(opt).replace("|", "\\|").replace("<", "&lt;") in row, opt.name


def test_the_config_does_not_restate_the_algorithms_defaults():
    for opt in options():
        if opt.name in HYPERPARAMETERS:
            assert not re.search(r"unset = ", opt.help), (opt.name, opt.help)


# ----------------------------------------------------------------------------------------- partitions
def test_the_partitioners_module_does_not_restate_the_partitions_options():
    import dfl.data.partitioners as partitioners
    from dfl.data import PARTITIONS, partition_specs

    for name in PARTITIONS.names():
        for spec in partition_specs(name):
            if not spec.required:
                assert f"{spec.name}={spec.default!r}" not in partitioners.__doc__, (name, spec.name)
                assert f"{spec.name}={spec.default}" not in partitioners.__doc__, (name, spec.name)


def test_which_builtins_a_flag_offers_comes_from_the_cards(monkeypatch):
    from dfl.cli.run import capability_lists

    lists = capability_lists()
    decentralized = lists["algorithm"].split("; centralized: ")[0].removeprefix("decentralized: ").split(", ")
    assert decentralized == [name for name, b in BUILTINS.items() if not b.card.centralized]
    assert lists["mode"] == "async runs with " + ", ".join(
        name for name, b in BUILTINS.items() if b.card.asynchronous)
    # a card that loses its asynchronous form leaves --mode's help
    builtin = BUILTINS["dfedsam-mgs"]
    monkeypatch.setitem(BUILTINS, "dfedsam-mgs", builtin._replace(
        card=dataclasses.replace(builtin.card, asynchronous=None)))
    assert "dfedsam-mgs" not in capability_lists()["mode"]


def test_config_help_lists_no_builtin_by_hand():
    """Which algorithms, topologies, ... a field offers or serves is said by the cards (`capability_lists`)."""
    from dfl.graphs import BUILTINS as TOPOLOGY_BUILTINS

    algorithms = set(BUILTINS)
    topologies = {t.name for t in TOPOLOGY_BUILTINS} - {"full", "custom", "star"}  # also plain words
    for opt in options():
        words = set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", opt.help))
        if opt.name in ("algorithm", "mode", "local_optimizer", "compressor"):
            assert not words & algorithms, (opt.name, words & algorithms)
        if opt.name == "topology":
            assert not words & topologies, words & topologies


def test_the_options_page_shows_the_card_lists():
    from dfl.cli.run import capability_lists

    page = OPTIONS_PAGE.read_text()
    for name, said in capability_lists().items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        assert said.replace("|", "\\|") in row, name

"""The table of what combines with what (`dfl.engine.combinations`) and its generated page.

The page (docs/reference/combinations.md) is what the generator writes now; every value of its axes works alone;
`dfl.validate` refuses a cell exactly when the page says so, with the page's reason; the rules read capabilities,
not names, so a plug-in's card is held to them; and all of it answers before torch loads.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from itertools import combinations as pairs
from pathlib import Path

import pytest

import dfl
from dfl import algorithms, graphs
from dfl.algorithms import AlgorithmCard
from dfl.config import Config
from dfl.engine import combinations
from dfl.errors import ConfigError
from dfl.network.byzantine_settings import AGGREGATORS, ATTACKS

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gen_combinations", ROOT / "docs" / "gen_combinations.py")
gen = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gen
spec.loader.exec_module(gen)

CELLS = [(change, other) for a, b in pairs(gen.AXES, 2) for _, change in gen.AXES[a] for _, other in gen.AXES[b]]


def test_the_page_is_what_the_table_says():
    assert gen.PAGE.read_text() == gen.page(), "run python docs/gen_combinations.py"


@pytest.mark.parametrize("axis", list(gen.AXES))
def test_each_value_of_an_axis_works_alone(axis):
    for label, change in gen.AXES[axis]:
        config, world = gen.config_of(change)
        dfl.validate(config)
        assert combinations.refusal(config, world) is None, (axis, label)


def test_validate_refuses_a_cell_exactly_when_the_table_does():
    refused = 0
    for cell in CELLS:
        config, world = gen.config_of(*cell)
        reason = combinations.refusal(config, world)
        if world > 1:  # a torchrun world's rules are checked when it starts, not by dfl.validate
            assert reason is None or reason in combinations.reasons(config, world)
            continue
        if reason is None:
            dfl.validate(config)
        else:
            refused += 1
            with pytest.raises(ConfigError) as caught:
                dfl.validate(config)
            assert reason in caught.value.problems, (cell, reason, caught.value.problems)
            assert "\n" not in reason
    assert refused >= 40  # the page is not all "works"


def test_every_rule_is_on_the_page_and_refuses_some_cell():
    page = gen.PAGE.read_text()
    for rule in combinations.RULES:
        assert rule.summary.replace("|", "\\|") in page


def test_the_rules_name_no_component():
    """Validators ask capabilities: no algorithm, topology, weight scheme or aggregator is named in the table."""
    source = (ROOT / "dfl" / "engine" / "combinations.py").read_text()
    names = {*algorithms.ALGORITHMS.names(), *graphs.TOPOLOGIES, *AGGREGATORS.names(), *ATTACKS.names()} - {"mean"}
    literals = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
                and isinstance(node.value, str)}
    assert not names & literals, names & literals


def test_a_plug_in_card_is_held_to_the_same_rules(monkeypatch):
    card = AlgorithmCard(compression=False, asynchronous=None, refusals={"compression": "it gossips a sketch"})
    monkeypatch.setitem(algorithms.ALGORITHMS._cards, "sketchy", card)
    monkeypatch.setattr(algorithms.ALGORITHMS, "names", lambda: [*algorithms.BUILTINS, "sketchy"])
    refusal = combinations.refusal(Config(algorithm="sketchy", compressor="top-k"))
    assert refusal is not None
    assert refusal.startswith("compressor = top-k does not apply to sketchy: it gossips a sketch; use compressor")
    assert "mode = async runs" in combinations.refusal(Config(algorithm="sketchy", mode="async"))
    assert combinations.refusal(Config(algorithm="sketchy")) is None


def test_a_world_of_two_refuses_byzantine_clients_before_any_work():
    config = Config(algorithm="dfedavg", byzantine=1, attack="ipm")
    assert combinations.refusal(config) is None
    assert "torchrun world of 2 processes" in combinations.refusal(config, world=2)


def test_the_table_answers_before_torch_loads():
    code = ("import sys, dfl; from dfl.engine import combinations; "
            "print(combinations.refusal(dfl.Config(algorithm='dsgt', compressor='top-k'))[:40]); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.splitlines() == ["compressor = top-k does not apply to dsg", "False"], proc.stderr

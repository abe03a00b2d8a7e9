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


REGULARITY_CASES = [(name, n, options) for name in graphs.TOPOLOGIES.names() if name != "custom"
                    for n in (1, 2, 3, 4, 6, 8, 9, 12, 16)
                    for options in [dict(graphs.TOPOLOGIES.get(name).example), {"periodic": True},
                                    {"shape": (1, n)}, {"p": 1.0}, {"degree": 2},
                                    {"groups": 2, "inner": "star"}, {"groups": 2, "outer": "star"}]
                    if set(options) <= set(graphs.topology_options(name))]


def test_a_topologys_regularity_is_the_built_graphs():
    """Where a card knows whether the graph is regular (uniform weights need it), building it with uniform weights
    succeeds exactly when the card says regular (a drawn graph, whose card does not leave uniform weights to the
    chance of its draw, may be regular where it says not); options that are wrong at n are left to their own check."""
    import topologies

    known = 0
    for name, n, options in REGULARITY_CASES:
        regular = graphs.facts(name, options, n).regular
        if regular is None or not graphs.facts(name, options, n).takes("uniform"):
            continue
        try:
            topologies.build(name, n, "metropolis", **options).matrix(0)
        except ValueError:
            continue  # options that do not fit n (a hypercube of 6, a prime grid): refused by its own check
        known += 1
        try:
            topo = topologies.build(name, n, "uniform", **options)
            built = all(topo.matrix(step) is not None for step in range(3))
        except ValueError as exc:
            assert "uniform" in str(exc), (name, n, options, exc)
            built = False
        drawn = "seed" in graphs.topology_options(name)
        assert built == regular or (built and drawn), (name, n, options)
    assert known >= 50


@pytest.mark.parametrize("changes, field", [
    (dict(weights="uniform", topology="star"), "weights"),
    (dict(weights="lazy", topology="grid", topology_options={"base": "uniform"}), "weights"),
    (dict(weights="fastest", topology="directed-ring"), "weights"),
    (dict(weights="sample-count", topology="custom", topology_options={"matrix": [[0.5, 0.5], [0.5, 0.5]]},
          clients=2), "topology"),
    (dict(algorithm="fedavg", aggregator="krum", participation=0.5, participation_mode="bernoulli"),
     "participation_mode")])
def test_the_weights_needs_and_krums_participants_are_the_tables(changes, field):
    """Refused by the table in one line naming the field, and by `dfl.validate` with that line alone."""
    config = Config(**{"clients": 8, **changes})
    reason = combinations.refusal(config)
    assert reason is not None and reason.split(" ", 1)[0].rstrip(":") == field, reason
    with pytest.raises(ConfigError) as caught:
        dfl.validate(config)
    assert caught.value.problems == [reason]


def test_what_only_the_built_graph_tells_is_left_to_the_build():
    """An Erdős–Rényi draw with p = 1 is K_n; a custom graph's degrees are read when it is built."""
    assert combinations.refusal(Config(clients=8, weights="uniform", topology="erdos-renyi",
                                       topology_options={"p": 1.0})) is None
    assert graphs.facts("custom", {"path": "edges.txt"}, 8).regular is None
    assert combinations.refusal(Config(clients=8, weights="uniform", topology="grid",
                                       topology_options={"periodic": True})) is None
    assert combinations.refusal(Config(clients=8, weights="fastest", topology="exponential",
                                       topology_options={"symmetric": True})) is None

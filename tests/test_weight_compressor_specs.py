"""The weight schemes' and the compressors' cards own their options (`dfl.specs`), and the checks read them.

A weight scheme's options (lazy's `base`, sample-count's `sizes`) are its `dfl.graphs.WeightsCard` spec, equal to the
pure library's `topologies.weights.OPTIONS`; a compressor's `compression` is its `CompressorCard`'s typed param. The
refusals name the field from the spec in one line before torch loads; `dfl list` and the options page show them; a
one-peer schedule whose steps are not permutations is refused by `dfl.validate` exactly where the build refuses it.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

import dfl
import topologies
from dfl.errors import ConfigError, RegistryError
from dfl.graphs import TOPOLOGIES, WEIGHTS, BuiltinTopology
from dfl.network import settings
from dfl.specs import Spec, param
from topologies import weights as pure_weights


def _refusal(**fields) -> str:
    with pytest.raises(ConfigError) as err:
        dfl.validate(dfl.Config(**{"clients": 8, **fields}))
    return str(err.value)


def _json(capsys, category: str) -> dict:
    from dfl.cli import main

    assert main(["list", category, "--json"]) == 0
    return {e["name"]: e for e in json.loads(capsys.readouterr().out)[category]}


# ------------------------------------------------------------------------------------------------ weights
def test_weight_specs_are_the_pure_librarys_options():
    declared = {name: card.options.defaults() for name, card in WEIGHTS.items() if card.specs()}
    assert declared == pure_weights.OPTIONS
    assert tuple(WEIGHTS) == pure_weights.SCHEMES
    base = WEIGHTS["lazy"].specs()[0]
    assert base.choices == pure_weights.LAZY_BASES and base.default == pure_weights.lazy_base(None)
    for choice in base.choices:  # every choice the spec offers is one the library builds
        assert pure_weights.lazy_base(choice) == choice
    assert WEIGHTS["sample-count"].sizes and not WEIGHTS["lazy"].sizes  # the capability follows the spec
    for card in WEIGHTS.values():
        for spec in card.specs():
            assert spec.help and "\n" not in spec.help


@pytest.mark.parametrize("change", ["OPTIONS['lazy']['base'] = 'uniform'", "OPTIONS['fastest'] = {'steps': 10}",
                                    "del OPTIONS['sample-count']"])
def test_a_spec_that_differs_from_the_pure_librarys_options_is_refused_at_import(change):
    code = (f"from topologies.weights import OPTIONS\n{change}\n"
            "try:\n    import dfl.graphs\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "must declare exactly topologies.weights.OPTIONS" in out


@pytest.mark.parametrize(("fields", "message"), [
    ({"weights": "lazy", "topology_options": {"base": "bogus"}},
     "topology_options.base must be one of metropolis, uniform, max-degree, fastest, got 'bogus'"),
    ({"weights": "metropolis", "topology_options": {"base": "uniform"}},
     "topology_options.base is an option of weights = lazy only, not of weights = metropolis (dfl list weights)"),
    ({"topology_options": {"sizes": [1] * 8}},
     "topology_options.sizes is an option of weights = sample-count only, not of weights = metropolis"),
    ({"weights": "sample-count", "topology_options": {"sizes": [1, 2]}},
     "topology_options.sizes must list 8 sample counts, one per client (or be unset: a run passes its partition's), "
     "got 2: [1, 2]"),
    ({"weights": "sample-count", "topology_options": {"sizes": [1, 2, 3, 4, 5, 6, 7, -8]}},
     "topology_options.sizes must be a list of floats > 0, got [1, 2, 3, 4, 5, 6, 7, -8] (item 7: -8)"),
    ({"weights": "sample-count", "topology_options": {"sizes": [1, 2, 3, 4, 5, 6, 7, float("nan")]}},
     "topology_options.sizes must be a list of floats > 0"),
    ({"weights": "sample-count", "topology_options": {"sizes": "many"}},
     "topology_options.sizes must be a list of floats > 0, got 'many'"),
])
def test_a_bad_weight_option_is_refused_in_one_line_naming_it(fields, message):
    text = _refusal(**fields)
    assert text.startswith(message) and "\n" not in text and ";" not in text


def test_valid_weight_options_pass():
    dfl.validate(dfl.Config(clients=8, weights="lazy", topology_options={"base": "max-degree"}))
    dfl.validate(dfl.Config(clients=8, weights="sample-count", topology_options={"sizes": [1, 2, 3, 4, 5, 6, 7, 8.5]}))
    dfl.validate(dfl.Config(clients=8, weights="sample-count"))  # unset: the run passes its partition's


def test_a_weight_option_refusal_loads_no_torch():
    code = ("import sys, dfl\n"
            "try:\n    dfl.validate(dfl.Config(weights='lazy', topology_options={'base': 'x'}))\n"
            "except ValueError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["topology_options.base must be one of metropolis, uniform, max-degree, fastest, got "
                                "'x'", "False"]


def test_list_weights_shows_each_schemes_spec(capsys):
    entries = _json(capsys, "weights")
    assert list(entries) == list(pure_weights.SCHEMES)
    assert entries["lazy"]["options"] == {"base": "metropolis"}
    assert entries["lazy"]["specs"]["base"] == {"type": "str", "allowed": "one of " + ", ".join(
        pure_weights.LAZY_BASES), "help": "the scheme W_base made lazy"}
    sizes = entries["sample-count"]
    assert sizes["options"] == {"sizes": None}  # not "required": a run passes its partition's counts
    assert "unset: a run passes its partition's" in sizes["specs"]["sizes"]["help"]
    assert sizes["specs"]["sizes"]["allowed"] == "a list of floats > 0"
    assert entries["column-stochastic"]["capabilities"]["stochastic"] == "column"
    assert "specs" not in entries["metropolis"] and entries["metropolis"]["options"] == {}
    from dfl.cli import main

    assert main(["list", "weights"]) == 0
    out = capsys.readouterr().out
    assert "base='metropolis' (str, one of metropolis, uniform, max-degree, fastest): the scheme W_base made" in out


def test_a_topology_with_its_own_w_refuses_a_weight_scheme_once():
    text = _refusal(topology="d-equistatic", weights="lazy", topology_options={"base": "uniform", "M": 3})
    assert text.count("defines its own weights") == 1 and ";" not in text
    text = _refusal(topology="d-equistatic", weights="sample-count", topology_options={"sizes": [1] * 8, "M": 3})
    assert text.count("defines its own weights") == 1 and ";" not in text
    text = _refusal(topology="d-equistatic", topology_options={"base": "uniform", "M": 3})  # weights unset
    assert text == "topology: d-equistatic defines its own weights (its paper's W): leave weights unset, got " \
                   "base='uniform'"
    text = _refusal(topology="custom", clients=2, weights="lazy", topology_options={"matrix": [[0.5, 0.5],
                                                                                             [0.5, 0.5]]})
    assert text.count("uses the matrix as W") == 1 and ";" not in text


def test_the_cli_says_an_own_w_topologys_scheme_once(capsys, tmp_path):
    from dfl.cli import main

    code = main(["run", "--topology", "d-equistatic", "--weights", "lazy", "--topology-options", "base=uniform", "M=3",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.count("defines its own weights") == 1 and ";" not in err


# ------------------------------------------------------------------------------------------------ one-peer
BASES = [("ring", {}), ("exponential", {}), ("exponential", {"symmetric": True}), ("full", {}), ("directed-ring", {}),
         ("hypercube", {}), ("random-regular", {"degree": 3}), ("random-regular", {"degree": 4}),
         ("grid", {"periodic": True}), ("grid", {}), ("star", {}), ("erdos-renyi", {"p": 1.0})]
SCHEMES = [None, "uniform", "max-degree", "lazy", "row-stochastic", "sample-count"]


def _built(n: int, weights: str | None, graph: str, graph_options: dict) -> str | None:
    try:
        topologies.build("one-peer", n, weights, graph=graph, graph_options=graph_options,
                         **({"sizes": list(range(1, n + 1))} if weights == "sample-count" else {}))
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize(("graph", "graph_options"), BASES)
def test_one_peer_is_refused_by_validation_exactly_where_the_build_refuses_it(n, graph, graph_options):
    for weights in SCHEMES:
        built = _built(n, weights, graph, graph_options)
        options = {"graph": graph, "graph_options": graph_options}
        try:
            dfl.validate(dfl.Config(clients=n, topology="one-peer", weights=weights, topology_options=options))
            refused = None
        except ConfigError as exc:
            refused = str(exc)
        assert (refused is None) == (built is None), (weights, built, refused)
        if refused is not None:
            assert refused.startswith(f"topology: one-peer over {graph}: ") and "\n" not in refused
            assert "weights = row-stochastic" in refused  # the way out


def test_one_peer_over_an_irregular_base_with_uniform_weights_is_refused_before_torch():
    code = ("import sys, dfl\n"
            "try:\n    dfl.validate(dfl.Config(clients=8, topology='one-peer', weights='uniform', "
            "topology_options={'graph': 'star'}))\n"
            "except ValueError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith("topology: one-peer over star: its clients have different degrees, so its steps are not "
                             "permutations and weights = uniform cannot")
    assert out[1] == "False"


def test_one_peer_over_a_networkx_graph_is_checked_too():
    import networkx as nx

    card = TOPOLOGIES.get("one-peer")
    with pytest.raises(ValueError, match="^one-peer over the given graph: its clients have different degrees"):
        card.check_schedule(8, "uniform", {"graph": nx.star_graph(7)})  # 8 nodes
    card.check_schedule(8, "uniform", {"graph": nx.cycle_graph(8)})
    card.check_schedule(8, "row-stochastic", {"graph": nx.star_graph(7)})


def test_circulant_cards_give_one_peer_permutations():
    from dfl.graphs import _one_peer_collision

    circulant = [name for name, factory in TOPOLOGIES.items()
                 if isinstance(factory, BuiltinTopology) and factory.circulant]
    assert circulant == ["ring", "exponential", "full", "directed-ring"]
    for name in circulant:
        for n in (5, 8, 12):
            assert _one_peer_collision(n, name, {}) is None, (name, n)


# ------------------------------------------------------------------------------------------------ seed
def test_the_topology_seed_option_is_declared_once():
    seeds = [spec for name, factory in TOPOLOGIES.items() if isinstance(factory, BuiltinTopology)
             for spec in factory.specs() if spec.name == "seed"]
    assert len(seeds) == 9
    for spec in seeds:
        assert (spec.default, spec.type, spec.interval.text) == (0, "int", "[0, inf)")
        assert spec.help.startswith("the seed of ") and spec.help.endswith(
            " (a run passes its own seed unless this is set)")


# ------------------------------------------------------------------------------------------------ compressors
def test_each_compressor_binds_its_card_and_the_card_is_its_behaviour():
    from dfl.network import compression

    for name in settings.COMPRESSORS.names():
        card, cls = settings.COMPRESSORS.card(name), settings.COMPRESSORS.get(name)
        assert cls.card is card and card.name == name and card.option.specs()[0].name == "compression"
        built = compression.build(name)
        assert built.compression == card.default and built.name == name
        spec = card.param
        low, high = spec.interval.low, spec.interval.high
        card.check(high)  # the closed end is allowed
        refusal = rf"^compression must be {re.escape(spec.help)}.*for compressor = {name}; got "
        for outside in ((low,) if not spec.interval.low_closed else ()) + (high + 1, -1):  # refused, naming it
            with pytest.raises(ValueError, match=refusal):
                card.check(outside)
    assert settings.CARDS["qsgd"].check(4.0) == 4 and isinstance(settings.CARDS["qsgd"].check(4.0), int)
    with pytest.raises(ValueError, match="an integer in \\[2, 16\\]"):
        settings.CARDS["qsgd"].check(4.5)


def test_the_cards_message_sizes_are_what_the_classes_count():
    from dfl.network import compression

    d, itemsize = 1000, 4
    top, rand, qsgd = compression.build("top-k", 0.1), compression.build("random-k", 0.1), compression.build("qsgd", 6)
    assert settings.CARDS["top-k"].sends.startswith("k·(4 + itemsize) bytes")
    assert top.message_bytes(d, itemsize) == 100 * (4 + itemsize)
    assert settings.CARDS["random-k"].sends.startswith("k·itemsize bytes")
    assert rand.message_bytes(d, itemsize) == 100 * itemsize
    assert settings.CARDS["qsgd"].sends.startswith("⌈d·b/8⌉ + itemsize bytes")
    assert qsgd.message_bytes(d, itemsize) == math.ceil(d * 6 / 8) + itemsize
    assert top.omega(d) == rand.omega(d) == 0.1  # k/d
    s = 2 ** 5 - 1
    assert qsgd.omega(d) == pytest.approx(1 / (1 + min(d / s**2, math.sqrt(d) / s)))  # 1/τ


@pytest.mark.parametrize(("fields", "message"), [
    ({"compressor": "top-k", "compression": 1.5},
     "compression must be the fraction of coordinates kept, in (0, 1], for compressor = top-k; got 1.5"),
    ({"compressor": "qsgd", "compression": 1},
     "compression must be the bits per coordinate (sign included), an integer in [2, 16], for compressor = qsgd; "
     "got 1"),
    ({"compression": 0.5},
     "compression = 0.5 applies to compressed gossip, but compressor = none (exact gossip); set compressor = top-k, "
     "random-k or qsgd, or unset compression"),
])
def test_a_bad_compression_is_refused_in_one_line(fields, message):
    assert _refusal(algorithm="dfedavg", **fields) == message


def test_list_compressors_shows_each_cards_option_and_facts(capsys):
    entries = _json(capsys, "compressors")
    assert list(entries) == list(settings.COMPRESSORS.names())
    for name, entry in entries.items():
        card = settings.COMPRESSORS.card(name)
        assert entry["options"] == {"compression": card.default}
        assert entry["specs"]["compression"] == {"type": card.param.type, "allowed": card.param.allowed,
                                                 "help": card.param.help}
        assert entry["capabilities"] == {"unbiased": card.unbiased, "omega": card.omega, "sends": card.sends}
    from dfl.cli import main

    assert main(["list", "compressors"]) == 0
    out = capsys.readouterr().out
    assert "compression=8 (int, in [2, 16]): the bits per coordinate (sign included)" in out
    assert "compression=0.1 (float, in (0, 1]): the fraction of coordinates kept" in out


@dataclass(frozen=True)
class _Levels(Spec):
    compression: int = param(3, "the levels kept", interval="[1, 10]")


def test_a_plugin_compressor_declares_the_same_card(capsys):
    from dfl.network.compression import Compressor

    class Levels(Compressor):
        card = settings.CompressorCard("levels", _Levels, unbiased=True, omega="1/2", sends="d bytes")

        def __call__(self, D, U=None):
            return D

        def message_bytes(self, d, itemsize):
            return d

        def omega(self, d):
            return 0.5

    settings.COMPRESSORS.register("levels", Levels)
    try:
        assert settings.COMPRESSORS.card("levels") is Levels.card
        assert _refusal(algorithm="dfedavg", compressor="levels", compression=11) == (
            "compression must be the levels kept, an integer in [1, 10], for compressor = levels; got 11")
        dfl.validate(dfl.Config(clients=8, algorithm="dfedavg", compressor="levels", compression=4))
        entries = _json(capsys, "compressors")
        assert entries["levels"]["specs"]["compression"]["allowed"] == "in [1, 10]"
        assert entries["levels"]["capabilities"]["unbiased"] is True
    finally:
        settings.COMPRESSORS.unregister("levels")

    class NoCard:
        pass

    with pytest.raises(RegistryError, match="must be a class with `card = CompressorCard"):
        settings.COMPRESSORS.register("no-card", NoCard)
    with pytest.raises(TypeError, match="one field, compression"):
        settings.CompressorCard("two", Spec, unbiased=False, omega="", sends="")
    assert "no-card" not in settings.COMPRESSORS.names()


def test_the_options_page_shows_the_weight_and_compressor_specs():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference_for_test", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = gen.options_page()
    assert "### weights = lazy" in page and "| `base` | `str` | `'metropolis'` | one of metropolis" in page
    assert "### weights = sample-count" in page
    for name in settings.COMPRESSORS.names():
        card = settings.COMPRESSORS.card(name)
        assert f"| `{name}` | {card.param.help} | `{card.param.type}` | `{card.default!r}` |" in page

"""The option specs of the extension points (`dfl.specs`): topologies, models, datasets and partitions declare each
option once.

Type, default, allowed values and one help line; the builders' own defaults agree with them, `dfl.validate` refuses
a value outside them in one line naming the option and the allowed values, and the docstrings' Args are generated.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import dfl
from dfl.data import PARTITIONS, partition_options, partition_specs
from dfl.data.partitioners import SPECS, register
from dfl.errors import ConfigError
from dfl.graphs import TOPOLOGIES, BuiltinTopology
from dfl.specs import REQUIRED, Spec, param
from topologies.build import STATIC, TIME_VARYING, _option_names


@pytest.mark.parametrize("name", TOPOLOGIES.declared() or TOPOLOGIES.names())
def test_topology_spec_names_the_builders_options_with_their_defaults(name):
    factory = TOPOLOGIES.get(name)
    if not isinstance(factory, BuiltinTopology):
        pytest.skip("a registered factory: its signature is its spec")
    specs = {spec.name: spec for spec in factory.specs()}
    assert tuple(specs) == _option_names(name)  # what topologies.build accepts, in its order
    builder = (STATIC.get(name) or TIME_VARYING.get(name) or (None,))[0]
    if builder is not None:
        params = inspect.signature(builder).parameters
        for key, spec in specs.items():
            if key in params:
                assert spec.default == params[key].default, (name, key)
    for spec in specs.values():
        assert spec.help and "\n" not in spec.help, (name, spec.name)  # one line of help each
        assert f"    {spec.name}: {spec.help.rstrip('.')}." in factory.__doc__  # its Args line is generated


def test_builtin_partitions_declare_a_spec_equal_to_their_signature():
    for name in PARTITIONS.names():
        fn = PARTITIONS.get(name)
        if not fn.__module__.startswith("dfl."):
            continue
        assert name in SPECS, name
        assert {s.name: s.default for s in partition_specs(name)} == partition_options(name)
        for spec in partition_specs(name):
            assert spec.help and f"{spec.name}: {spec.help.rstrip('.')}." in fn.__doc__


def test_a_spec_that_differs_from_the_signature_is_refused():
    @dataclass_spec
    class Wrong(Spec):
        k: int = param(3, "k", interval="[1, inf)")

    def method(labels, num_clients, rng, *, k=2):
        return []

    with pytest.raises(ValueError, match="is not its signature's"):
        register("spec-mismatch", method, options=Wrong)
    assert "spec-mismatch" not in PARTITIONS.names()


def dataclass_spec(cls):
    from dataclasses import dataclass

    return dataclass(frozen=True)(cls)


@pytest.mark.parametrize(("field", "options", "message"), [
    ("topology", {"topology": "erdos-renyi", "topology_options": {"p": 2}},
     "topology_options.p must be in [0, 1], got 2"),
    ("topology", {"topology": "star", "topology_options": {"centre": -1}}, "topology_options.centre must be >= 0"),
    ("topology", {"topology": "random-k", "topology_options": {"k": 0}}, "topology_options.k must be >= 1, got 0"),
    ("topology", {"topology": "exponential", "topology_options": {"exponent_base": 1}},
     "topology_options.exponent_base must be >= 2, got 1"),
    ("topology", {"topology": "grid", "topology_options": {"periodic": "yes"}},
     "topology_options.periodic must be true or false, got 'yes'"),
    ("topology", {"topology": "grid", "topology_options": {"shape": [4, 0]}},
     "topology_options.shape must be a list of ints >= 1, got [4, 0] (item 1: 0)"),
    ("topology", {"topology": "matcha", "topology_options": {"budget": 0}},
     "topology_options.budget must be in (0, 1]"),
    ("topology", {"topology": "hierarchical", "topology_options": {"groups": 2, "inner": "mesh"}},
     "topology_options.inner must be one of ring, grid"),
    ("model", {"model": "cnn", "model_options": {"variant": "lenet"}},
     "model_options.variant must be one of auto, mcmahan, cifar, got 'lenet'"),
    ("model", {"model": "cnn1d", "model_options": {"conv_impl": "fft"}},
     "model_options.conv_impl must be one of auto, unfold, native, got 'fft'"),
    ("dataset", {"dataset_options": {"num_samples": 5}}, "dataset_options.num_samples must be >= 20, got 5"),
    ("dataset", {"dataset_options": {"test_fraction": 1.0}},
     "dataset_options.test_fraction must be in (0, 1), got 1.0"),
    ("dataset", {"dataset": "digits", "dataset_options": {"seed": -1}}, "dataset_options.seed must be >= 0, got -1"),
    ("dataset", {"dataset": "synthetic", "partition": "natural", "dataset_options": {"num_clients": 8,
                                                                                     "min_samples": 1}},
     "dataset_options.min_samples must be >= 2, got 1"),
    ("partition", {"partition": "shards", "partition_options": {"classes_per_client": 0}},
     "partition_options.classes_per_client must be >= 1, got 0"),
    ("partition", {"partition": "similarity", "partition_options": {"similarity": 1.5}},
     "partition_options.similarity must be in [0, 1], got 1.5"),
    ("partition", {"partition": "dirichlet-class", "partition_options": {"max_retries": -1}},
     "partition_options.max_retries must be >= 0, got -1"),
])
def test_a_value_outside_the_spec_is_refused_in_one_line(field, options, message):
    with pytest.raises(ConfigError) as err:
        dfl.validate(dfl.Config(clients=8, **options))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_default_and_a_valid_value_pass():
    dfl.validate(dfl.Config(clients=2, topology="custom", topology_options={"stochastic": "row", "matrix": [
        [0.5, 0.5], [0.5, 0.5]]}))
    dfl.validate(dfl.Config(clients=8, topology="hierarchical", topology_options={"groups": 2, "inner": "ring"}))
    dfl.validate(dfl.Config(clients=8, partition="similarity", partition_options={"similarity": 0.5}))


def test_refusals_load_no_torch():
    code = ("import sys, dfl\n"
            "try:\n    dfl.validate(dfl.Config(topology='erdos-renyi', topology_options={'p': 3}))\n"
            "except ValueError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["topology_options.p must be in [0, 1], got 3", "False"]


def test_list_prints_each_options_type_range_and_help(capsys):
    from dfl.cli import main

    assert main(["list", "topologies"]) == 0
    out = capsys.readouterr().out
    assert "exponent_base=2 (int, >= 2): the base b of the hops b^k" in out
    assert main(["list", "partitions", "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)["partitions"]}
    assert entries["similarity"]["specs"]["similarity"] == {
        "type": "float", "allowed": "in [0, 1]", "help": "the share s dealt IID (1: IID, 0: fully sorted)"}
    assert entries["similarity"]["options"] == {"similarity": REQUIRED}


def test_builtin_datasets_declare_a_spec_equal_to_their_loaders_signature():
    from dfl import signatures
    from dfl.data import DATASETS, dataset_options, dataset_specs

    for name in DATASETS.declared():
        loader = DATASETS.get(name)
        specs = dataset_specs(name)
        assert {s.name: s.default for s in specs} == dataset_options(name) == signatures.options(loader), name
        for spec in specs:  # one line of help each, and the loader's Args line generated from it
            assert spec.help and "\n" not in spec.help, (name, spec.name)
            assert f"    {spec.name}: {spec.help.rstrip('.')}." in loader.__doc__, (name, spec.name)
    assert [name for name in DATASETS.declared() if dataset_specs(name)] == ["mnist1d", "digits", "synthetic"]


def test_a_dataset_spec_that_differs_from_the_signature_is_refused():
    from dfl.data import DATASETS
    from dfl.data.dataset import SPECS
    from dfl.data.dataset import register as register_dataset

    @dataclass_spec
    class Wrong(Spec):
        size: int = param(3, "size", interval="[1, inf)")

    def loader(*, size=2):
        raise AssertionError("never loaded")

    with pytest.raises(ValueError, match="is not its signature's"):
        register_dataset("spec-mismatch", loader, options=Wrong)
    assert "spec-mismatch" not in DATASETS.names() and "spec-mismatch" not in SPECS


def test_a_registered_datasets_spec_is_checked_and_listed(capsys):
    from dfl.cli import main
    from dfl.data import DATASETS, dataset_specs
    from dfl.data.dataset import SPECS
    from dfl.data.dataset import register as register_dataset

    @dataclass_spec
    class SizeOptions(Spec):
        size: int = param(2, "the samples drawn", interval="[1, inf)")

    def loader(*, size=2):
        raise AssertionError("never loaded")

    register_dataset("spec-plugin", loader, options=SizeOptions)
    try:
        assert [s.name for s in dataset_specs("spec-plugin")] == ["size"]
        with pytest.raises(ConfigError, match=r"^dataset_options.size must be >= 1, got 0$"):
            dfl.validate(dfl.Config(dataset="spec-plugin", dataset_options={"size": 0}))
        assert main(["list", "datasets"]) == 0
        assert "size=2 (int, >= 1): the samples drawn" in capsys.readouterr().out
    finally:
        DATASETS.unregister("spec-plugin")
        SPECS.pop("spec-plugin", None)


def test_a_dataset_refusal_loads_no_torch():
    code = ("import sys, dfl\n"
            "try:\n    dfl.validate(dfl.Config(dataset_options={'num_samples': 3}))\n"
            "except ValueError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["dataset_options.num_samples must be >= 20, got 3", "False"]


def test_builtin_models_declare_a_spec_equal_to_their_factorys_signature():
    from dfl.models import MODELS
    from dfl.models.builtin import describe
    from dfl.models.registry import model_options

    for name in MODELS.declared():
        factory, spec = MODELS.get(name), MODELS.card(name).spec
        assert spec is not None, name
        assert spec.defaults() == model_options(name) == describe(name, factory).options, name
        for option in spec.specs():  # one line of help each, and the factory's Args line generated from it
            assert option.help and "\n" not in option.help, (name, option.name)
            assert f"    {option.name}: {option.help.rstrip('.')}." in factory.__doc__, (name, option.name)


def test_a_model_refusal_loads_no_torch():
    code = ("import sys, dfl\n"
            "try:\n    dfl.validate(dfl.Config(model='resnet20', dataset='digits', model_options={'groups': 0}))\n"
            "except ValueError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["model_options.groups must be >= 1, got 0", "False"]

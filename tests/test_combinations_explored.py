"""Defects found by covering sets over axes the CI covering set lacks (issue 45's reviewer, run first), each pinned.

A model that does not take the dataset's samples (cnn1d on digits' images, an image CNN on mnist1d's signals or
synthetic's vectors, VGG-11 below 32x32) was accepted by `dfl.validate` and failed only when the run built it; so did
a ResNet whose GroupNorm `groups` does not divide its stage widths. Both are facts of the model's card now
(`dfl.models.builtin.ModelCard.inputs`, `dfl.models.shapes`), asked before torch loads with the dataset card's sample
shape, or the caller's own data's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import dfl
from dfl.config import Config
from dfl.data import FederatedData
from dfl.engine import combinations
from dfl.errors import ConfigError, ModelError
from dfl.models import MODELS
from dfl.models.builtin import BUILTINS
from tests.helpers import ROOT

TINY = dict(clients=4, rounds=1, local_steps=1, batch_size=8, algorithm="dfedavg", eval_every=1,
            train_eval_samples=16, client_eval_samples=16, progress=False, threads=1, device="cpu")
# each built-in dataset's sample shape (its card's, before loading), and a colour image's
SAMPLES = {"mnist1d": (1, 40), "digits": (1, 8, 8), "synthetic": (60,), "cifar-like": (3, 32, 32)}
MISMATCHES = [("cnn1d", {}, "digits"), ("cnn", {}, "mnist1d"), ("cnn", {}, "synthetic"),
              ("cnn", {"variant": "cifar"}, "digits"), ("resnet20", {}, "synthetic"), ("resnet18", {}, "mnist1d"),
              ("vgg11", {}, "digits")]


def _own_data(clients: int, shape: tuple[int, ...]) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    n = 12 * clients
    return FederatedData(torch.randn(n, *shape, generator=g), torch.randint(0, 3, (n,), generator=g),
                         [torch.arange(i, n, clients) for i in range(clients)], torch.randn(9, *shape, generator=g),
                         torch.randint(0, 3, (9,), generator=g), 3, shape)


@pytest.mark.parametrize("model, options, dataset", MISMATCHES)
def test_a_model_that_does_not_take_the_datasets_samples_is_refused_by_validate_naming_the_models_that_do(
        model, options, dataset, tmp_path):
    config = Config(**TINY, model=model, model_options=options, dataset=dataset)
    with pytest.raises(ConfigError) as refused:
        dfl.validate(config)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"model = {model} takes ")
    assert f"dataset {dataset} has samples of shape {SAMPLES[dataset]}" in message
    fits = [name for name in BUILTINS if _builds(name, {}, SAMPLES[dataset])]
    assert fits and all(name in message for name in fits), message
    with pytest.raises(ConfigError) as again:
        dfl.run(config, out=tmp_path / "run")
    assert str(again.value) == message and not (tmp_path / "run").exists()


def _builds(name: str, options: dict, shape: tuple[int, ...]) -> bool:
    try:
        MODELS.get(name)(shape, 10, **options)
    except ModelError:
        return False
    return True


@pytest.mark.parametrize("shape", list(SAMPLES.values()), ids=list(SAMPLES))
@pytest.mark.parametrize("name, options", [(name, {}) for name in BUILTINS] + [
    ("cnn", {"variant": "cifar"}), ("cnn", {"variant": "mcmahan"}), ("resnet20", {"groups": 4})])
def test_a_models_card_takes_exactly_the_samples_its_builder_takes(name, options, shape):
    """The card's `inputs` (asked before torch) and the builder (at build time) are one fact: they agree."""
    card = BUILTINS[name][1]
    assert (card.inputs(shape, {**card.options, **options}) is None) == _builds(name, options, shape)


@pytest.mark.parametrize("model, groups", [("resnet20", 3), ("resnet20", 32), ("resnet18", 3)])
def test_resnet_groups_that_do_not_divide_its_stage_widths_are_refused_by_validate(model, groups):
    with pytest.raises(ConfigError) as refused:
        dfl.validate(Config(**TINY, model=model, model_options={"groups": groups}, dataset="digits"))
    message = str(refused.value)
    assert "\n" not in message, message
    assert message.startswith(f"model_options.groups = {groups}: GroupNorm's groups must divide"), message
    with pytest.raises(ModelError, match="groups must divide every stage width"):
        MODELS.get(model)((1, 8, 8), 10, groups=groups)


def test_own_data_is_what_the_model_is_checked_against(tmp_path):
    """With the caller's data, its samples decide: cnn on (1, 12) signals refused naming the given data; cnn1d runs
    on them although the config's dataset (digits) holds images; an own model is not judged by its card."""
    data = _own_data(4, (1, 12))
    config = Config(**TINY, model="cnn", dataset="digits")
    with pytest.raises(ConfigError, match=r"^model = cnn takes images.*but the given data has samples of shape "
                                          r"\(1, 12\): use logreg, mlp or cnn1d"):
        dfl.validate(config, data)
    result = dfl.run(config.replace(model="cnn1d"), data=data, out=tmp_path / "run")
    assert result.summary["status"] == "completed"
    own = dfl.run(config, data=data, out=tmp_path / "own", model=torch.nn.Sequential(torch.nn.Flatten(),
                                                                                     torch.nn.Linear(12, 3)))
    assert own.summary["status"] == "completed"


NO_TORCH = """
import json, sys
import dfl
from dfl.config import Config
from dfl.errors import ConfigError
messages = []
for values in json.load(sys.stdin):
    try:
        dfl.validate(Config(**values))
    except ConfigError as exc:
        messages.append(str(exc))
print(json.dumps({"refused": len(messages), "torch": "torch" in sys.modules}))
"""


def test_the_model_refusals_come_before_torch_loads():
    configs = [dict(TINY, model=model, model_options=options, dataset=dataset) for model, options, dataset in
               MISMATCHES] + [dict(TINY, model="resnet20", model_options={"groups": 3})]
    proc = subprocess.run([sys.executable, "-c", NO_TORCH], input=json.dumps(configs), capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"refused": len(configs), "torch": False}


@pytest.mark.parametrize("changes, field", [
    (dict(straggler_slowdown=2.0), "straggler_slowdown"), (dict(straggler_slowdown=2.0, mode="async"),
                                                           "straggler_slowdown"),
    (dict(hessian_samples=100), "hessian_samples"), (dict(hessian_iters=5), "hessian_iters")])
def test_an_option_whose_switch_is_off_is_refused_not_ignored(changes, field):
    """Set without what reads it (stragglers, hessian_every), nothing read it: a run used to accept it silently."""
    with pytest.raises(ConfigError) as refused:
        dfl.validate(Config(**TINY, model="logreg", **changes))
    problem = next(p for p in refused.value.problems if p.startswith(field))
    assert "\n" not in problem and "applies only with hessian_every" in problem if "hessian" in field else \
        "but stragglers = 0" in problem, problem


@pytest.mark.parametrize("changes", [dict(stragglers=0.5, straggler_slowdown=2.0),
                                     dict(hessian_every=1, hessian_samples=100, hessian_iters=5)])
def test_the_same_option_with_its_switch_on_is_valid(changes):
    dfl.validate(Config(**TINY, model="logreg", **changes))


@pytest.mark.parametrize("changes, message", [
    (dict(partition="similarity", partition_options={"similarity": "half"}),
     "partition_options.similarity must be a number in [0, 1], got 'half'"),
    (dict(partition="shards", partition_options={"classes_per_client": "2"}),
     "partition_options.classes_per_client must be an integer >= 1, got '2'"),
    (dict(partition="dirichlet", partition_options={"sigma": [0.5]}),
     "partition_options.sigma must be a number >= 0, got [0.5]"),
    (dict(topology="od-equidyn", topology_options={"eta": True}),
     "topology_options.eta must be a number in (0, 1], got True"),
])
def test_a_non_number_for_a_numeric_option_is_refused_by_validate_naming_it(changes, message):
    """A partition's own checks run only once the data is loaded: a string for its number used to pass validate and
    fail after loading, in a message naming neither partition_options nor the option's range."""
    with pytest.raises(ConfigError) as refused:
        dfl.validate(Config(**TINY, model="logreg", **changes))
    assert message in refused.value.problems


def test_dpsgd_with_dp_is_refused_for_its_own_reason():
    """D-PSGD sends only its model, but at every local step: the refusal used to say it sends "gradients, trackers,
    buffers or step counts"."""
    with pytest.raises(ConfigError) as refused:
        dfl.validate(Config(**{**TINY, "algorithm": "dpsgd"}, model="logreg", dp_clip=0.1))
    message = str(refused.value)
    assert message.startswith("dp_clip = 0.1 does not apply to dpsgd: it sends its model at every local step")
    assert "trackers" not in message


def test_the_update_rules_page_lists_every_algorithm_that_takes_dp():
    from dfl import algorithms

    page = (ROOT / "docs" / "reference" / "update-rules.md").read_text()
    line = " ".join(page.split("- Taken by the algorithms whose card sets `dp`")[1].split("\n\n")[0].split())
    listed = [name.strip(" .") for name in line.split(":", 1)[1].split(",")]
    assert listed == algorithms.able("dp")


def test_a_world_of_more_processes_than_clients_is_refused_by_the_table():
    config = Config(**TINY, model="logreg")
    assert combinations.refusal(config, world=4) is None
    message = combinations.refusal(config, world=5)
    assert message == ("clients = 4 is fewer than the 5 processes of the torchrun world, and every process hosts at "
                       "least one client: use at most 4 processes, or more clients")


@pytest.mark.parametrize("argv, message", [
    (["99", "--clients", "4"], "clients = 4 is fewer than the 99 processes"),
    (["2", "--algorithm", "fedavg", "--byzantine", "1", "--attack", "gaussian", "--aggregator", "median"],
     "byzantine = 1: a torchrun world of 2 processes is not supported"),
])
def test_dfl_torchrun_applies_the_tables_world_rules_before_starting_processes(argv, message, tmp_path, capsys,
                                                                                 monkeypatch):
    """`dfl torchrun 99 --clients 4` used to start 99 processes (minutes of torch imports on a laptop) for each to
    refuse; the table's rules of a world of N are now asked first, and nothing starts."""
    from dfl.cli import main
    from dfl.workflows import torchrun

    def launched(*args):
        raise AssertionError("processes were started")

    monkeypatch.setattr(torchrun, "launch", launched)
    assert main(["torchrun", *argv, "--rounds", "1", "--model", "logreg", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


COLUMN = [[0.5 if (j - i) % 8 in (0, 1) else 0.0 for j in range(8)] for i in range(8)]  # columns sum to 1
CUSTOM_COLUMN = dict(topology="custom", topology_options={"matrix": COLUMN, "stochastic": "column"})


@pytest.mark.parametrize("changes, message", [
    (dict(algorithm="dispfl"), "topology_options stochastic = column (push-sum) does not apply to dispfl: each weight "
     "is averaged over the neighbours whose masks cover it, normalised per receiver (a row-stochastic average); use a "
     "matrix with stochastic = row or doubly"),
    (dict(byzantine=1, attack="gaussian"), "topology_options stochastic = column (push-sum) is not modelled with "
     "byzantine = 1: use a matrix with stochastic = row or doubly"),
])
def test_a_column_stochastic_custom_matrix_is_refused_naming_topology_options(changes, message):
    """A custom matrix's own stochastic was named as if it were a field ("stochastic = column ...") or as weights
    ("weights = column-stochastic ..."), with the advice of a weight scheme, which a custom matrix does not take."""
    with pytest.raises(ConfigError) as refused:
        dfl.validate(Config(**{**TINY, **changes, **CUSTOM_COLUMN, "clients": 8}, model="logreg"))
    assert refused.value.problems == [message]


@pytest.mark.parametrize("changes", [CUSTOM_COLUMN, dict(weights="column-stochastic")])
def test_a_centralized_algorithm_with_a_push_sum_w_is_refused_once_without_the_matrix(changes):
    """A server reads no W: the centralized rule said so, and the push-sum rule said it again; the refusal quoted the
    whole custom matrix (a line as long as the matrix)."""
    with pytest.raises(ConfigError) as refused:
        dfl.validate(Config(**{**TINY, "algorithm": "fedavg", **changes, "clients": 8}, model="logreg"))
    assert len(refused.value.problems) == 1, refused.value.problems
    message = refused.value.problems[0]
    assert "fedavg is centralized" in message and len(message) < 400 and "0.5" not in message, message


def test_a_sweeps_base_option_is_left_out_of_the_runs_whose_switch_is_off(tmp_path, capsys):
    """The options refused when their switch is off (stragglers, hessian_every, Adam, the lr schedule) go, as [base]
    fields, only to the runs that read them, as every unread [base] field does: the sweep was refused whole."""
    from dfl.cli import main

    spec = tmp_path / "sweep.toml"
    spec.write_text('[base]\nrounds = 1\nmodel = "logreg"\nalgorithm = "dfedavg"\nstraggler_slowdown = 2.0\n'
                    'hessian_iters = 5\nadam_eps = 1e-6\n[vary]\nstragglers = [0.0, 0.5]\nhessian_every = [0, 1]\n'
                    'local_optimizer = ["sgd", "adam"]\n')
    assert main(["sweep", str(spec), "--dry-run", "--out", str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    for name in ("straggler_slowdown", "hessian_iters", "adam_eps"):
        assert f"[base] {name} is left out of 4 of 8 runs, which do not read it" in out, out

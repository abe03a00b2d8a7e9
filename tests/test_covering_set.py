"""Every pair of options, tested (issue 45): an all-pairs covering set of tiny runs over dfl's configuration axes.

The axes (`AXES`) are read from the registries where dfl lists its built-ins (every algorithm, topology, weight
scheme, partition, compressor, attack and robust rule) plus a few values of each other option: mode, differential
privacy, participation, server aggregation, local optimizer, SAM variant and radius schedule, momentum, gossip steps,
link failures, offline clients, stragglers, model, precision, kernels, learning-rate schedule, local work, client
chunk, personalized evaluation, the dataset (signals or images) and the client count. `tests/covering.py` generates
the covering set from them: every pair of values of two axes is held by a case the rules allow, or refused by the
rules in every context the generator tried.

The rules are one function, `refusal(config, world)`: `dfl.validate` (each field on its own, each component's own
checks, and the table of what combines with what at world 1), then the table itself in a world of `world` processes
(`dfl.engine.combinations.refusal`). Each allowed case is run, tiny (8 clients, 2
rounds of mnist1d with 400 samples, a logistic regression unless the model axis says otherwise, one thread), and must
complete with finite metrics; each refused pair must be refused by `dfl.validate` in one line naming a field, before
torch loads, and `dfl.run` must refuse it the same way before any work. A sample of the allowed cases is run by two
gloo processes (equal to one process), and a sample is SIGKILLed after a round and resumed (equal to the
uninterrupted run, every metric but the wall time). A combination the rules allowed but the run refused once built
(four were found so: `FORMER_DEFECTS`) is now refused by the table, pinned by a regression test.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import signal
import subprocess
import sys
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl import algorithms
from dfl.config import AGGREGATIONS, LOCAL_OPTIMIZERS, Config, field_of
from dfl.data.partitioners import PARTITIONS
from dfl.engine import combinations
from dfl.engine.results import read_metrics
from dfl.errors import ConfigError
from dfl.network import settings as network_settings
from dfl.network.byzantine_settings import AGGREGATORS, ATTACKS
from tests import covering
from tests.helpers import ROOT, TIMING, assert_worlds_of_two_equal_one

pytestmark = pytest.mark.timeout(300)  # a hang guard only

CLIENTS = 8  # a power of two (hypercube), even (random-regular of degree 3), two groups of 4 (hierarchical)
BASE = dict(
    seed=0, clients=CLIENTS, rounds=2, dataset="mnist1d", dataset_options={"num_samples": 400}, model="logreg",
    local_steps=2, batch_size=8, lr=0.05, eval_every=2, train_eval_samples=32, client_eval_samples=32,
    eval_batch_size=256, client_chunk=0, device="cpu", threads=1, progress=False, dist_timeout=60.0,
)
BASE_ALGORITHM = "dfedavg"  # takes every network option (compression, push-sum, async, Byzantine clients, DP)
# the options a topology cannot run without, at 8 clients; a new topology that needs one fails
# test_every_value_runs_in_some_case until it is added here
RING = (np.eye(CLIENTS) + np.roll(np.eye(CLIENTS), 1, 1) + np.roll(np.eye(CLIENTS), -1, 1)) / 3
TOPOLOGY_OPTIONS: dict[str, dict[str, Any]] = {
    "random-regular": {"degree": 3}, "erdos-renyi": {"p": 0.5}, "d-equistatic": {"M": 2}, "u-equistatic": {"M": 2},
    "random-k": {"k": 2}, "random-pull": {"k": 2}, "hierarchical": {"groups": 2},
    "custom": {"matrix": RING.tolist()},
}
PARTITION_CHANGES: dict[str, dict[str, Any]] = {
    "similarity": {"partition_options": {"similarity": 0.5}},
    "natural": {"dataset": "synthetic", "dataset_options": {"num_clients": CLIENTS, "size_log_sigma": 0.5}},
}


def _values(field: str, names, changes=None) -> list[tuple[str, dict[str, Any]]]:
    return [(name, {field: name, **(changes or {}).get(name, {})}) for name in names]


def _builtin_partitions() -> list[str]:
    return [name for name in PARTITIONS.names() if PARTITIONS.source(name).startswith("dfl.")]


def _axes() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Axis -> its values as (label, the Config fields it sets); the first value of each is the base case's."""
    algorithm_names = [BASE_ALGORITHM, *(a for a in algorithms.ALGORITHMS.declared() if a != BASE_ALGORITHM)]
    topology_changes = {name: {"topology_options": options} for name, options in TOPOLOGY_OPTIONS.items()}
    off = ("off", {})
    return {
        "algorithm": _values("algorithm", algorithm_names),
        "topology": _values("topology", topologies.NAMES, topology_changes),
        "weights": [("default", {}), *_values("weights", topologies.SCHEMES)],
        "partition": _values("partition", ["dirichlet", *(p for p in _builtin_partitions() if p != "dirichlet")],
                             PARTITION_CHANGES),
        "mode": [("sync", {}), ("async", {"mode": "async"})],
        "compressor": [("none", {}), *_values("compressor", network_settings.COMPRESSORS.names())],
        # noise std dp_clip x dp_noise of 0.05 and 0.03 per coordinate: a larger one diverges a CNN in two rounds
        "dp": [off, ("dp", {"dp_clip": 0.05}), ("dp-noise", {"dp_clip": 0.1, "dp_noise": 0.3, "dp_delta": 1e-4})],
        "attack": [off, *((a, {"byzantine": 1, "attack": a}) for a in ATTACKS.declared())],
        "aggregator": [("mean", {}), *_values("aggregator", [a for a in AGGREGATORS.declared() if a != "mean"],
                                              {"centered-clipping": {"clip_radius": 1.0}})],
        "participation": [("all", {}), ("half", {"participation": 0.5}),
                          ("bernoulli", {"participation": 0.5, "participation_mode": "bernoulli"})],
        "aggregation": [("default", {}), *_values("aggregation", AGGREGATIONS)],
        "optimizer": [("sgd", {}), *_values("local_optimizer", [o for o in LOCAL_OPTIMIZERS if o != "sgd"]),
                      ("adam-keep", {"local_optimizer": "adam", "local_optimizer_state": "keep"})],
        "sam": [("default", {}), ("sam", {"sam": "sam"}), ("asam", {"sam": "asam"}),
                ("asam-dp-fedsam", {"sam": "asam", "asam_form": "dp-fedsam"})],
        "rho_schedule": [("default", {}), ("linear", {"rho_schedule": "linear", "rho_ramp_rounds": 2})],
        "momentum": [("default", {}), ("0.5", {"momentum": 0.5})],
        "gossip_steps": [("default", {}), ("2", {"gossip_steps": 2})],
        "link_failure": [off, ("0.2", {"link_failure": 0.2}), ("bursts", {"link_failure": 0.2,
                                                                         "link_failure_burst": 2.0})],
        "offline": [off, ("0.2", {"offline": 0.2})],
        "stragglers": [off, ("0.5", {"stragglers": 0.5}), ("deadline", {"stragglers": 0.5, "round_deadline": 5.0})],
        "model": [("logreg", {}), ("mlp", {"model": "mlp", "model_options": {"hidden": [8]}}),
                  ("cnn1d", {"model": "cnn1d"})],
        # images (digits, 8 x 8) beside mnist1d's signals: which model takes which is its card's (cnn1d is refused on
        # images; an image CNN is left out, as an undefended attack diverges it in two rounds), and an odd client
        # count beside 8 (most topologies' options are 8's: the rules say which)
        "dataset": [("mnist1d", {}), ("digits", {"dataset": "digits", "dataset_options": {}})],
        "clients": [("8", {}), ("7", {"clients": 7})],
        "precision": [("fp32", {}), ("bf16", {"precision": "bf16"})],
        "kernels": [("deterministic", {}), ("fast", {"kernels": "fast"})],
        "lr_schedule": [("exponential", {}), ("cosine", {"lr_schedule": "cosine"}),
                        ("step", {"lr_schedule": "step", "lr_milestones": [1]})],
        "local_work": [("2-steps", {}), ("1-epoch", {"local_steps": None, "local_epochs": 1})],
        "client_chunk": [("all", {}), ("auto", {"client_chunk": "auto"}), ("3", {"client_chunk": 3})],
        "personal_eval": [off, ("local-test", {"local_test_fraction": 0.25, "personal_train_eval": True})],
    }


AXES = _axes()
NAMES = list(AXES)
FIELDS = {f.name for f in fields(Config)}
DEFAULTS = Config()
# the Config fields each axis sets: a refusal naming one of them blames the axis
AXIS_FIELDS = [{key for _, changes in AXES[axis] for key in changes} for axis in NAMES]


def refusal(config: Config, world: int = 1) -> str | None:
    """Why the rules refuse `config` in a world of `world` processes (one line), or None when they allow it.

    The one oracle of this module: `dfl.validate` (each field on its own and the components' own checks, which the
    table of what combines with what leaves to them, and the table at world 1), then the table's answer for a world
    of `world` processes (`dfl.engine.combinations.refusal`: e.g. Byzantine clients need one process).
    """
    try:
        dfl.validate(config)
    except ConfigError as exc:
        return str(exc)
    return combinations.refusal(config, world)


def config_of(case: covering.Case) -> Config:
    """The tiny run of a case: `BASE` with the fields each of its values sets."""
    values = dict(BASE)
    for axis, index in zip(NAMES, case):
        values.update(AXES[axis][index][1])
    return Config(**values)


def named_fields(message: str) -> set[str]:
    """The Config fields a refusal names."""
    return {word for word in re.findall(r"[a-z][a-z0-9_]*", message) if word in FIELDS}


# Combinations `dfl.validate` allowed that a run refused only once it had built them (a ConfigError after torch loaded,
# instead of validate's line before), found by this covering set (issue 45) and now refused by the table of what
# combines with what: the fields each is about, examples (BASE with these changes), and the fields its refusal names.
FORMER_DEFECTS: dict[str, tuple[list[dict[str, Any]], set[str]]] = {
    "uniform-irregular": ([dict(weights="uniform", topology=name, topology_options=TOPOLOGY_OPTIONS.get(name, {}))
                           for name in ("grid", "star", "erdos-renyi")], {"weights", "topology"}),
    "fastest-directed": ([dict(weights="fastest", topology=name) for name in
                          ("exponential", "directed-ring", "one-peer-exponential", "one-peer")],
                         {"weights", "topology"}),
    "custom-sample-count": ([dict(weights="sample-count", topology="custom",
                                  topology_options={"matrix": RING.tolist()})], {"weights", "topology"}),
    "krum-bernoulli": ([dict(algorithm="fedavg", aggregator="krum", participation=0.5, participation_mode="bernoulli",
                             **threat) for threat in ({"byzantine": 1, "attack": "gaussian"}, {})],
                       {"aggregator", "participation_mode"}),
}


def _oracle(case: covering.Case) -> list[frozenset[int]] | None:
    message = refusal(config_of(case))
    if message is None:
        return None
    return [_blamed(case, problem) for problem in message.split("; ")]


def _blamed(case: covering.Case, problem: str) -> frozenset[int]:
    """The axes a refusal's problem blames: those setting a field it names ("compressor = top-k ...", "weights: ...")
    or whose value it names ("... not defined for 'dsgt'")."""
    named = set(re.findall(r"\b([a-z_]+) = ", problem)) | {field_of(problem)}
    words = set(re.findall(r"[\w.-]+", problem))
    return frozenset(i for i, (axis, index) in enumerate(zip(NAMES, case)) if AXIS_FIELDS[i] & named or any(
        isinstance(value, str) and value in words for value in AXES[axis][index][1].values()))


@functools.cache
def plan() -> covering.Plan:
    """The covering set (deterministic: the axes and the rules fix it)."""
    return covering.cover([len(AXES[axis]) for axis in NAMES], _oracle)


def label(case: covering.Case) -> str:
    """"algorithm/topology" and every other value that is not the base's, e.g. "dsgt/grid weights=lazy mode=async"."""
    parts = [f"{AXES['algorithm'][case[0]][0]}/{AXES['topology'][case[1]][0]}"]
    parts += [f"{axis}={AXES[axis][index][0]}" for axis, index in zip(NAMES[2:], case[2:]) if index]
    return " ".join(parts)


def pair_label(pair: covering.Pair) -> str:
    a, v, b, w = pair
    return f"{NAMES[a]}={AXES[NAMES[a]][v][0]} x {NAMES[b]}={AXES[NAMES[b]][w][0]}"


CASES = plan().cases


def _finite(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(map(_finite, value))
    if isinstance(value, dict):
        return all(map(_finite, value.values()))
    return True  # None (a metric not taken this round), strings, booleans


def assert_completed_and_finite(result: dfl.Result, what: str) -> None:
    assert result.summary["status"] == "completed", what
    assert result.history and result.history[-1]["round"] == result.summary["rounds"], what
    for record in result.history:
        bad = {key: value for key, value in record.items() if not _finite(value)}
        assert not bad, f"{what}: round {record['round']} has non-finite metrics {bad}"
    assert torch.isfinite(result.params).all(), what
# ------------------------------------------------------------------------------------------- the covering set
@pytest.mark.parametrize("case", CASES, ids=[f"{i:03d}-{AXES['algorithm'][case[0]][0]}-{AXES['topology'][case[1]][0]}"
                                             for i, case in enumerate(CASES)])
def test_an_allowed_case_completes_with_finite_metrics(case, tmp_path):
    config = config_of(case)
    result = dfl.run(config, out=tmp_path / "run")
    assert_completed_and_finite(result, label(case))
    assert read_metrics(tmp_path / "run") == result.history


def test_every_pair_is_in_an_allowed_case_or_refused():
    current = plan()
    covered = current.covered()
    assert all(_oracle(case) is None for case in current.cases)
    assert set(current.pairs()) == covered | set(current.refused)
    assert not covered & set(current.refused)


def test_every_value_runs_in_some_case():
    """No value is refused everywhere (a topology needing an option `TOPOLOGY_OPTIONS` lacks, say)."""
    held = {(axis, case[axis]) for case in plan().cases for axis in range(len(NAMES))}
    missing = [f"{axis}={value}" for i, axis in enumerate(NAMES) for j, (value, _) in enumerate(AXES[axis])
               if (i, j) not in held]
    assert not missing


def test_the_axes_hold_every_builtin_component():
    labels = {axis: [value for value, _ in AXES[axis]] for axis in NAMES}
    assert set(labels["algorithm"]) == set(algorithms.ALGORITHMS.declared()) and len(labels["algorithm"]) >= 24
    assert labels["topology"] == list(topologies.NAMES)
    assert set(labels["weights"]) == {"default", *topologies.SCHEMES}
    assert set(labels["partition"]) == set(_builtin_partitions())
    assert set(labels["compressor"]) == {"none", *network_settings.COMPRESSORS.names()}
    assert set(labels["attack"]) == {"off", *ATTACKS.declared()}
    assert set(labels["aggregator"]) == set(AGGREGATORS.declared())


# ------------------------------------------------------------------------------------------- the generator
def _toy_oracle(case: covering.Case) -> list[frozenset[int]] | None:
    """Rules of a toy space: forbidden pairs, a value needing another axis's value, one needing a change from the
    base, and a rule of three values."""
    problems = []
    if case[0] == 1 and case[1] == 2:
        problems.append(frozenset({0, 1}))
    if case[2] == 2 and case[3] != 1:  # needs axis 3 at 1
        problems.append(frozenset({2, 3}))
    if case[4] == 1 and case[0] == 3:
        problems.append(frozenset({0, 4}))
    if case[1] == 1 and case[0] == 0:  # refused in the base case: its home changes axis 0
        problems.append(frozenset({1}))
    if (case[0], case[1], case[2]) == (2, 1, 1):  # three values: each pair of them is allowed elsewhere
        problems.append(frozenset({0, 1, 2}))
    return problems or None


def test_the_generator_covers_exactly_the_pairs_some_allowed_case_holds():
    sizes = (4, 3, 3, 2, 3)
    result = covering.cover(sizes, _toy_oracle)
    every = list(itertools.product(*map(range, sizes)))
    allowed_pairs = {pair for case in every if _toy_oracle(case) is None for pair in covering.pairs_of(case)}
    assert all(_toy_oracle(case) is None for case in result.cases)
    assert result.covered() == allowed_pairs
    assert set(result.refused) == set(result.pairs()) - allowed_pairs == {(0, 1, 1, 2), (0, 3, 4, 1), (2, 2, 3, 0),
                                                                          (0, 0, 1, 1)}
    assert all(_toy_oracle(case) is not None for case in result.refused.values())
    assert len(result.cases) <= 16  # 12 = 4 x 3 at the least
    again = covering.cover(sizes, _toy_oracle)
    assert (again.cases, again.refused) == (result.cases, result.refused)  # deterministic


# ------------------------------------------------------------------------------------------- the refusals
def _refused_configs() -> list[tuple[str, Config]]:
    """(pair, the config it was refused in) of every refused pair."""
    return [(pair_label(pair), config_of(case)) for pair, case in plan().refused.items()]


@pytest.mark.parametrize("defect", FORMER_DEFECTS)
def test_a_former_defect_is_refused_by_the_table_before_the_run(defect, tmp_path):
    """Each combination the run used to refuse only once built: refused by the table (so by `dfl.validate`, before
    torch loads) in one line naming its fields, by `dfl.run` the same way before any work, and left out of the
    covering set as a refused pair."""
    examples, names = FORMER_DEFECTS[defect]
    for i, changes in enumerate(examples):
        config = Config(**{**BASE, **changes})
        message = combinations.refusal(config)
        assert message is not None and "\n" not in message, changes
        assert names <= named_fields(message), message
        with pytest.raises(ConfigError) as refused:
            dfl.validate(config)
        assert str(refused.value) == message
        with pytest.raises(ConfigError) as refused:
            dfl.run(config, out=tmp_path / f"run{i}")
        assert str(refused.value) == message and not (tmp_path / f"run{i}").exists()
    refused_pairs = {pair_label(pair) for pair in plan().refused}
    if defect in ("uniform-irregular", "fastest-directed"):
        assert {f"topology={changes['topology']} x weights={changes['weights']}" for changes in examples} <= \
            refused_pairs


def test_every_refused_pair_is_one_line_of_validate_naming_a_field_it_sets():
    for what, config in _refused_configs():
        with pytest.raises(ConfigError) as refused:
            dfl.validate(config)
        message = str(refused.value)
        assert message and "\n" not in message and "Traceback" not in message, what
        changed = {key for key, value in config.to_dict().items() if value != BASE.get(key, getattr(DEFAULTS, key))}
        assert named_fields(message) & (changed | {"algorithm"}), f"{what}: {message}"


NO_TORCH = """
import json, sys
import dfl
from dfl.config import Config
from dfl.errors import ConfigError
refused = 0
for values in json.load(sys.stdin):
    try:
        dfl.validate(Config(**values))
    except ConfigError:
        refused += 1
print(json.dumps({"refused": refused, "torch": "torch" in sys.modules}))
"""


def test_the_refusals_come_before_torch_loads():
    configs = [config.to_dict() for _, config in _refused_configs()]
    proc = subprocess.run([sys.executable, "-c", NO_TORCH], input=json.dumps(configs), capture_output=True, text=True,
                          cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"refused": len(configs), "torch": False}


def test_a_refused_pair_is_refused_by_run_before_any_work(tmp_path):
    """The first refused pair of each two axes, run: the same line as validate's, and no run directory made."""
    firsts = {}
    for (a, v, b, w), case in plan().refused.items():
        firsts.setdefault((a, b), (pair_label((a, v, b, w)), config_of(case)))
    for i, (what, config) in enumerate(firsts.values()):
        out = tmp_path / f"r{i}"
        with pytest.raises(ConfigError) as refused:
            dfl.run(config, out=out)
        assert str(refused.value) == refusal(config), what
        assert not out.exists(), what


# ------------------------------------------------------------------------------------------- samples
def sample(cases: list[covering.Case], axes: list[str], size: int) -> list[covering.Case]:
    """`size` cases holding between them the values of `axes` that are not the base's, the first axes first.

    Greedy: the next case holds the first value not yet held (in `axes` order), and among those cases the one holding
    the most values not yet held, the rarer ones (in `cases`) counting more; the first such case on ties.
    """
    index = [NAMES.index(axis) for axis in axes]
    held = [{(a, case[a]) for a in index if case[a]} for case in cases]
    rarity = {value: 1 / sum(value in h for h in held) for h in held for value in h}
    order = sorted(rarity, key=lambda value: (index.index(value[0]), value[1]))
    chosen: list[int] = []
    seen: set[tuple[int, int]] = set()
    while len(chosen) < size:
        wanted = next((value for value in order if value not in seen), None)
        best = max((i for i in range(len(cases)) if i not in chosen and (wanted is None or wanted in held[i])),
                   key=lambda i: sum(rarity[value] for value in held[i] - seen))
        chosen.append(best)
        seen |= held[best]
    return [cases[i] for i in chosen]


# the axes a process boundary or a checkpoint could get wrong: what crosses between processes, the state kept
STATEFUL = ["mode", "attack", "participation", "compressor", "dp", "optimizer", "aggregator", "link_failure",
            "offline", "stragglers", "weights", "client_chunk", "personal_eval"]
# fp32 only: under precision = bf16 a sum taken in another order (gossip and server sums across processes) can round a
# bf16 activation the other way, so worlds agree to bf16's precision, not to the 1e-5 compared here
# (docs/concepts/vectorized-clients.md#clients-on-processes)
WORLD_SAMPLE = sample([c for c in CASES if refusal(config_of(c), world=2) is None and config_of(c).precision == "fp32"],
                      STATEFUL, 6)
WORLD_REFUSED = next(c for c in CASES if refusal(config_of(c), world=2) is not None)
RESUME_SAMPLE = sample(CASES, STATEFUL, 5)


@pytest.mark.slow
def test_a_sample_in_a_world_of_two_processes_equals_one_process(tmp_path):
    """Each sampled case run by two gloo processes equals one process; a case the rules refuse in a world of two is
    refused by the run with the table's line for a world of two."""
    configs = {label(case): config_of(case) for case in [*WORLD_SAMPLE, WORLD_REFUSED]}
    refused = assert_worlds_of_two_equal_one(tmp_path, configs)
    assert list(refused) == [label(WORLD_REFUSED)]
    message = refused[label(WORLD_REFUSED)]
    assert message == refusal(config_of(WORLD_REFUSED), world=2) and "\n" not in message, message


KILLED = r"""
import json, os, signal, sys
import dfl
from dfl.config import Config

class Kill:
    def on_round_end(self, round, metrics):
        if round == 2:  # round 2 recorded in metrics.jsonl, before its checkpoint: the last checkpoint is round 1's
            os.kill(os.getpid(), signal.SIGKILL)

for config, out in zip(sys.argv[1::2], sys.argv[2::2]):
    pid = os.fork()
    if pid == 0:
        signal.alarm(120)  # a hung child dies instead of outliving the test
        dfl.run(Config.from_toml(config), out=out, callbacks=[Kill()])
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"out": out, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}), flush=True)
"""


def resumable(case: covering.Case) -> Config:
    """The case run 3 rounds, evaluated (and checkpointed) after each."""
    return config_of(case).replace(rounds=3, eval_every=1)


@pytest.mark.slow
def test_a_sample_killed_after_a_round_and_resumed_equals_the_uninterrupted_run(tmp_path):
    args = []
    for i, case in enumerate(RESUME_SAMPLE):
        (tmp_path / f"config{i}.toml").write_text(resumable(case).to_toml())
        args += [str(tmp_path / f"config{i}.toml"), str(tmp_path / f"killed{i}")]
    proc = subprocess.run([sys.executable, "-c", KILLED, *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=240, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ended = {json.loads(line)["out"]: json.loads(line)["signal"] for line in proc.stdout.splitlines()}
    for i, case in enumerate(RESUME_SAMPLE):
        what, run, config = label(case), tmp_path / f"killed{i}", resumable(case)
        assert ended[str(run)] == signal.SIGKILL, f"{what} was not killed: {proc.stderr[-3000:]}"
        assert json.loads((run / "summary.json").read_text())["status"] == "running", what
        assert len(read_metrics(run)) == 2, what  # metrics.jsonl is ahead of the checkpoint (round 1)
        resumed = dfl.run(config, out=run, resume=True)
        full = dfl.run(config, out=tmp_path / f"full{i}")
        assert resumed.summary["resumed_from_round"] == 1, what
        assert_completed_and_finite(resumed, what)
        assert torch.equal(resumed.params, full.params), what
        for got in (resumed.history, read_metrics(run)):
            assert len(got) == len(full.history) == 3, what
            for g, w in zip(got, full.history):
                assert {k: v for k, v in g.items() if k not in TIMING} == \
                    {k: v for k, v in w.items() if k not in TIMING}, f"{what} round {w['round']}"

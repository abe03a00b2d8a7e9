"""Sweep case axes (`[cases.AXIS.NAME]`): named bundles of Config fields, their product with [vary], run names, the
spec's round trip through sweep.toml, the refusals, and a sweep file with cases run and resumed by `dfl sweep`."""

from __future__ import annotations

import pytest

from dfl.cli import main
from dfl.files import tomllib
from dfl.workflows.sweep import Sweep, SweepError, load_sweep, read_entries

BASE = {"dataset": "mnist1d", "dataset_options": {"num_samples": 400}, "clients": 8, "model": "logreg", "rounds": 2,
        "eval_every": 1, "batch_size": 16, "progress": False, "device": "cpu", "train_eval_samples": 50}
CASES = {
    "method": {"fedavg": {"algorithm": "fedavg", "participation": 0.5, "local_steps": 2},
               "dpsgd": {"algorithm": "dpsgd", "local_steps": 1}},
    "split": {"dir": {"partition": "dirichlet", "alpha": 0.6},
              "path2": {"partition": "pathological", "partition_options.classes_per_client": 2}},
}


def spec(**tables):
    return {"sweep": {"name": "cases"}, "base": dict(BASE), "cases": CASES, "vary": {"seed": [0, 1]}, **tables}


def test_runs_are_the_product_of_the_case_axes_and_vary_named_after_the_cases():
    planned = Sweep.from_dict(spec()).plan()
    assert [p.name for p in planned[:3]] == ["method=fedavg,split=dir,seed=0", "method=fedavg,split=dir,seed=1",
                                             "method=fedavg,split=path2,seed=0"]
    assert len(planned) == 2 * 2 * 2
    by_name = {p.name: p for p in planned}
    run = by_name["method=dpsgd,split=path2,seed=1"]
    assert run.overrides == {"method": "dpsgd", "split": "path2", "seed": 1}
    config = run.config
    assert (config.algorithm, config.local_steps, config.participation, config.seed) == ("dpsgd", 1, None, 1)
    assert (config.partition, config.partition_options, config.alpha) == ("pathological", {"classes_per_client": 2},
                                                                          None)
    fedavg = by_name["method=fedavg,split=dir,seed=0"].config
    assert (fedavg.participation, fedavg.alpha, fedavg.clients) == (0.5, 0.6, 8)


def test_spec_round_trips_through_its_toml():
    sweep = Sweep.from_dict(spec())
    again = Sweep.from_dict(tomllib.loads(sweep.to_toml()))
    assert again.to_dict() == sweep.to_dict() and [p.name for p in again.plan()] == [p.name for p in sweep.plan()]


@pytest.mark.parametrize("change, message", [
    ({"cases": {"algorithm": {"a": {"lr": 0.1}}}}, r"\[cases.algorithm\]: algorithm is a Config field"),
    ({"cases": {"method": {}}}, r"\[cases.method\] must hold at least one case"),
    ({"cases": {"method": {"a": 3}}}, r"\[cases.method.a\] must be a table of Config fields"),
    ({"cases": {"method": {"a": {"lerning_rate": 0.1}}}},
     r"\[cases.method.a\]: unknown Config field\(s\) 'lerning_rate'"),
    ({"cases": {"method": {"a": {"rounds": 3}}}}, r"field rounds in both \[base\] and \[cases.method.a\]"),
    ({"cases": {"method": {"a": {"seed": 3}}}}, r"field seed in both \[vary\] and \[cases.method.a\]"),
    ({"cases": {"m": {"a": {"lr": 0.1}}, "n": {"b": {"lr": 0.2}}}}, r"field lr set by both case axes \[cases.m\] "
                                                                     r"and \[cases.n\]"),
    ({"cases": {"method": {"a": {"name": "x"}}}}, r"'name' cannot be set in a case"),
])
def test_bad_cases_are_refused_in_one_line(change, message):
    with pytest.raises(SweepError, match=message):
        Sweep.from_dict(spec(**change))


def test_a_case_combination_that_does_not_validate_names_the_run():
    bad = {"method": {"dpsgd": {"algorithm": "dpsgd", "local_steps": 1, "local_epochs": 2}}}
    with pytest.raises(SweepError, match="runs? method=dpsgd,split=dir,seed=0[ :].*local_epochs"):
        Sweep.from_dict(spec(cases={**CASES, **bad})).plan()


@pytest.mark.slow
def test_dfl_sweep_runs_a_file_with_cases_and_skips_them_on_a_rerun(tmp_path, capsys):
    path = tmp_path / "cases.toml"
    sweep = Sweep.from_dict(spec(vary={"seed": [0]}))
    path.write_text(sweep.to_toml())
    assert len(load_sweep(path).plan()) == 4
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--no-report"]) == 0
    assert {e["status"] for e in read_entries(out)} == {"completed"}
    assert (out / "runs" / "method=dpsgd,split=path2,seed=0" / "config.toml").exists()
    took = {e["name"]: e["seconds"] for e in read_entries(out)}
    assert main(["sweep", str(out / "sweep.toml"), "--out", str(out), "--no-report"]) == 0  # resumes from its copy
    assert {e["action"] for e in read_entries(out)} == {"skipped"}
    assert {e["name"]: e["seconds"] for e in read_entries(out)} == took  # a skipped run keeps the time it took

"""dfl.threads: the `threads` option ("auto" or N) and the OpenMP wait dfl sets before torch loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import dfl
from dfl import threads
from dfl.errors import ConfigError
from tests.helpers import run_script


@pytest.mark.parametrize("value", ["auto", 1, 2, 64])
def test_good_values_pass(value):
    threads.check(value)
    assert threads.count(value) >= 1


@pytest.mark.parametrize("value", [0, -1, True, False, 1.5, "2", "two", "AUTO", None, [2]])
def test_bad_values_are_refused_in_one_line(value):
    with pytest.raises(ConfigError, match=r'^threads must be "auto" or an integer in \[1, 1024\] .*got') as info:
        threads.check(value)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="threads must be"):
        dfl.validate(dfl.Config(threads=value))


def test_auto_is_omp_num_threads_else_the_cores_shared_among_local_ranks(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads.count() == 8 and threads.count(3) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # a torchrun rank of three on this machine
    assert threads.count() == 2 and threads.count(5) == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what torchrun sets when it starts several ranks
    assert threads.count() == 1 and threads.count(4) == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")  # not a count: ignored
    assert threads.count() == 2
    assert threads.share(3) == 2 and threads.share(100) == 1 and threads.share(0) == 8


def python(code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter (the OpenMP variables of this one removed, `env` added); its last
    stdout line is JSON."""
    clean = {k: v for k, v in os.environ.items() if k not in (*threads.WAIT_VARIABLES, *threads.COUNT_VARIABLES)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


REPORT = ("import json, os, sys; print(json.dumps({'spin': os.environ.get('GOMP_SPINCOUNT'), "
          "'policy': os.environ.get('OMP_WAIT_POLICY'), 'torch': 'torch' in sys.modules}))")


def test_import_dfl_bounds_the_spin_before_torch_loads_and_keeps_the_users_choice():
    got = python("import dfl; " + REPORT)
    assert got == {**got, "spin": str(threads.SPIN_COUNT), "policy": None, "torch": False}
    assert python("import dfl; " + REPORT, GOMP_SPINCOUNT="5")["spin"] == "5"
    got = python("import dfl; " + REPORT, OMP_WAIT_POLICY="PASSIVE")
    assert (got["spin"], got["policy"]) == (None, "PASSIVE")
    # `python -m dfl` and the console script import dfl through dfl.cli, before any command loads torch
    assert python("import dfl.cli; " + REPORT)["spin"] == str(threads.SPIN_COUNT)


RUN = ("class Record:\n"
       "    def on_round_end(self, round, metrics):\n"
       "        seen.append(torch.get_num_threads())\n"
       "        return False\n"
       "seen = []\n"
       "def run(n):\n"
       "    seen.clear()\n"
       "    dfl.run(dfl.Config(rounds=1, clients=2, model='logreg', dataset_options={'num_samples': 200}, "
       "local_steps=1, eval_every=1, progress=False, threads=n), callbacks=[Record()])\n"
       "    return seen[0]\n")


@pytest.mark.slow
def test_run_keeps_the_callers_thread_count_and_gives_torch_its_count_back():
    code = ("import json, torch, dfl\nfrom dfl import threads\n" + RUN
            + "default = threads.torch_default_threads()\nchosen = 1 if default > 1 else 2\n"
              "torch.set_num_threads(chosen)  # a benchmark asking for its own count\n"
              "got = {'default': default, 'chosen': chosen, 'share': threads.share(1)}\n"
              "got['auto'] = run('auto'); got['after_auto'] = torch.get_num_threads()\n"
              "got['three'] = run(3); got['after_three'] = torch.get_num_threads()\n"
              "torch.set_num_threads(default)  # nobody chose: auto is the cores' share\n"
              "got['untouched'] = run('auto'); got['after_untouched'] = torch.get_num_threads()\n"
              "print(json.dumps(got))")
    got = python(code, GOMP_SPINCOUNT="1000")
    assert (got["auto"], got["after_auto"]) == (got["chosen"], got["chosen"]), got
    assert (got["three"], got["after_three"]) == (3, got["chosen"]), got
    assert (got["untouched"], got["after_untouched"]) == (got["share"], got["default"]), got
    # OMP_NUM_THREADS is the caller's choice too (torchrun's 1, a sweep worker's share)
    got = python("import json, torch, dfl\n" + RUN + "print(json.dumps({'auto': run('auto'), 'after': "
                 "torch.get_num_threads()}))", OMP_NUM_THREADS="1")
    assert (got["auto"], got["after"]) == (1, 1), got


@pytest.mark.slow
def test_torch_before_dfl_warns_only_on_a_busy_machine_and_says_how_to_silence_it():
    code = ("import torch, dfl, json, warnings\nfrom dfl import threads\n" + RUN
            + "threads.load_average = lambda: {load}\n"
              "with warnings.catch_warnings(record=True) as seen_warnings:\n"
              "    warnings.simplefilter('always')\n    run(2)\n    run(2)\n"
              "print(json.dumps([str(w.message) for w in seen_warnings if w.category is threads.SpinWarning]))")
    def python_list(load: float, **env: str) -> list:
        clean = {k: v for k, v in os.environ.items() if k not in threads.WAIT_VARIABLES}
        proc = subprocess.run([sys.executable, "-c", code.replace("{load}", str(load))], capture_output=True,
                              text=True, timeout=120, check=True, env={**clean, **env})
        return json.loads(proc.stdout.strip().splitlines()[-1])

    busy = python_list(float(os.cpu_count() or 1) + 4)
    assert len(busy) == 1 and "import dfl before torch" in busy[0], busy  # once per process
    assert "filterwarnings('ignore', category=dfl.threads.SpinWarning)" in busy[0]
    assert python_list(0.0) == []  # idle: the spin costs nothing, nothing to say
    assert python_list(99.0, GOMP_SPINCOUNT="1000") == []  # the user bounded the spin


def test_busy_is_the_load_plus_the_runs_threads_above_the_cpus(monkeypatch):
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    cases = [(0.2, 4, False), (0.9, 4, False), (1.0, 4, True), (1.0, 2, False), (3.0, 2, True), (None, 64, False)]
    for load, n, expected in cases:
        monkeypatch.setattr(threads, "load_average", lambda load=load: load)
        assert threads.busy(n) is expected, (load, n)


def test_torchs_default_is_its_environment_else_the_physical_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_physical_cores", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    assert threads.torch_default_threads() == 2  # cpuinfo's cores, not the hyperthreads
    monkeypatch.setattr(threads, "_physical_cores", lambda: 0)
    assert threads.torch_default_threads() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.torch_default_threads() == 3
    monkeypatch.setenv("MKL_NUM_THREADS", "5")  # torch reads MKL's after OMP's
    assert threads.torch_default_threads() == 5


@pytest.mark.slow
def test_apply_before_torch_loads_sets_the_environment_it_reads():
    got = python("import dfl, json, os; from dfl import threads; n = threads.apply(1); import torch; "
                 "print(json.dumps({'n': n, 'omp': os.environ['OMP_NUM_THREADS'], 'torch': torch.get_num_threads()}))")
    assert got == {**got, "n": 1, "omp": "1", "torch": 1}


def test_cli_refuses_bad_threads_before_loading_torch():
    code = ("import contextlib, io, json, sys; from dfl.cli import main; err = io.StringIO()\n"
            "with contextlib.redirect_stderr(err):\n    rc = main(['run', '--threads', '{v}'])\n"
            "print(json.dumps({{'rc': rc, 'err': err.getvalue(), 'torch': 'torch' in sys.modules}}))")
    for value in ("0", "two", "-3"):
        got = python(code.format(v=value))
        assert got["rc"] == 2 and not got["torch"], got
        assert got["err"].startswith("dfl run: error: threads must be") and got["err"].count("\n") == 1


@pytest.mark.slow
def test_threads_and_conv_layouts_benchmarks_run_at_toy_size(tmp_path):
    out = run_script("threads.py", "--loads", "0", "--settings", "today", "auto", "threads:1", "--workloads",
                     "main", "--rounds", "1", "--repeats", "1", "--markdown", str(tmp_path / "t.md"))
    row = next(line for line in out.splitlines() if line.startswith("| main | 0 × torch |"))
    assert row.count("×") >= 5  # each setting's ratio to the best, auto / best, auto / today
    assert "auto / today" in (tmp_path / "t.md").read_text()
    out = run_script("conv_layouts.py", "--clients", "2", "--repeats", "1")
    assert "| conv 32→32, k 3 |" in out and "| NHWC grouped convolutions" in out

"""The guard of tests/cwd_guard.py: a test runs in its own temporary folder, and one that writes into the folder
pytest was started from fails, named (an inner pytest session, started in a folder of its own)."""

from __future__ import annotations

import os
from pathlib import Path

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import os
from pathlib import Path


def test_relative_paths_land_in_its_own_folder(tmp_path):
    assert Path.cwd() == tmp_path
    Path("runs").mkdir()
    (Path("runs") / "metrics.jsonl").write_text("{}")


def test_writes_where_pytest_started(request):
    Path(request.config.invocation_params.dir, "runs", "a-run").mkdir(parents=True)


def test_after_the_writer():
    pass
'''


def test_a_test_that_writes_where_pytest_started_fails(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "tests.cwd_guard", "-p", "no:cacheprovider", "-q", "-o", "addopts=")
    result.assert_outcomes(passed=3, errors=1)  # the writer fails in its teardown; the others pass
    result.stdout.fnmatch_lines(["*test_writes_where_pytest_started* changed the folder pytest was started in*"
                                 "added runs, runs?a-run*"])
    assert (pytester.path / "runs" / "a-run").is_dir()
    result.stdout.fnmatch_lines(["*the tests changed the folder pytest was started in*added runs*"])


def test_a_test_starts_in_its_tmp_path(tmp_path):
    assert Path(os.getcwd()) == tmp_path

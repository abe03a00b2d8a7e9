"""No file that dfl did not write is replaced or deleted: run, sweep and report directories carry the marker
dfl-directory.json; `--out` into a folder dfl did not make (or onto a file) is refused with one line, with or without
`--overwrite`, before torch loads; `--overwrite` deletes only dfl's files; directories from before markers are
adopted (dfl.directories)."""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dfl
from dfl.cli import main
from dfl.config import Config
from dfl.directories import (
    KINDS,
    MARKER,
    RUN_FILES,
    NewDirectory,
    check_output_directory,
    claim_directory,
    directory_kind,
    make_new_directory,
    read_marker,
    remove_written,
)
from dfl.errors import OutputPathError, RunDirectoryExists

TINY = dict(dataset="mnist1d", dataset_options={"num_samples": 400}, clients=4, model="mlp",
            model_options={"hidden": [8]}, rounds=2, eval_every=1, local_steps=1, batch_size=16, progress=False,
            device="cpu", train_eval_samples=50, checkpoint_every=1)
FLAGS = ["--dataset", "mnist1d", "--dataset-options", "num_samples=400", "--clients", "4", "--model", "mlp",
         "--model-options", "hidden=[8]", "--rounds", "2", "--local-steps", "1", "--batch-size", "16",
         "--no-progress", "--train-eval-samples", "50"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("made") / "run"
    dfl.run(Config(**TINY), out=out)
    return out


@pytest.fixture
def run_dir(finished_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def user_folder(path: Path) -> dict[str, str]:
    """A folder of the user's, holding files named as dfl names its own; returns name -> sha256 of every file."""
    (path / "plots").mkdir(parents=True)
    for name, data in {"notes.txt": b"mine", "params.pt": b"my weights", "summary.json": b'{"mine": 1}',
                       "sweep.json": b'{"runs": []}', "report.md": b"# Report: mine", "plots/a.png": b"png"}.items():
        (path / name).write_bytes(data)
    return hashes(path)


def hashes(path: Path) -> dict[str, str]:
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def refused(argv: list[str], capsys, *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


# ---------------------------------------------------------------------------------------------- the marker
def test_a_run_directory_carries_the_marker(finished_run):
    marker = json.loads((finished_run / MARKER).read_text())
    assert marker["kind"] == "run" and marker["dfl_version"]
    assert datetime.datetime.fromisoformat(marker["created"]).tzinfo is not None
    assert marker["written_by_dfl"] == list(KINDS["run"].files)
    assert directory_kind(finished_run) == "run"


# ---------------------------------------------------------------------------------------------- a user's folder
def test_a_folder_dfl_did_not_make_is_never_written(tmp_path, capsys, finished_run):
    mine = tmp_path / "mine"
    before = user_folder(mine)
    spec = tmp_path / "s.toml"
    spec.write_text("[base]\nrounds = 1\nclients = 4\nprogress = false\n[vary]\nseed = [0]\n")
    commands = [
        ["run", *FLAGS, "--out", str(mine)],
        ["run", *FLAGS, "--out", str(mine), "--overwrite"],  # would replace the user's params.pt
        ["sweep", str(spec), "--out", str(mine), "--no-report"],  # would replace the user's sweep.json
        ["sweep", str(spec), "--out", str(mine), "--dry-run"],
        ["compare-topologies", "--out", str(mine), "--dry-run"],
        ["report", str(finished_run), "--out", str(mine)],
    ]
    for argv in commands:
        refused(argv, capsys, f"{mine} is a folder that dfl did not make", "choose another --out")
    assert hashes(mine) == before


@pytest.mark.parametrize("command", [["run", "--overwrite"], ["sweep", "{spec}"], ["compare-topologies"],
                                     ["spectral-study"]])
def test_out_is_refused_before_torch_loads(tmp_path, command):
    mine = tmp_path / "mine"
    user_folder(mine)
    spec = tmp_path / "s.toml"
    spec.write_text("[base]\nrounds = 1\n[vary]\nseed = [0, 1]\n")
    argv = [a.format(spec=spec) for a in command] + ["--out", str(mine)]
    code = f"import sys; from dfl.cli import main; rc = main({argv!r}); print(rc, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert "dfl did not make" in out.stderr


@pytest.mark.parametrize("argv, words", [
    (["run", "--out", "{file}"], "is a file, not a directory"),
    (["run", "--out", "{file}/run"], "is a file, not a directory"),
    (["sweep", "{spec}", "--out", "{file}", "--no-report"], "is a file, not a directory"),
    (["report", "{run}", "--out", "{run}/summary.json"], "is a file, not a directory"),
    (["report", "{run}", "--out", "{run}"], "is a run directory, not a report directory"),
    (["landscape", "{run}", "--out", "{run}", "--points", "3"], "is a directory: give the path of the image file"),
    (["landscape", "{run}", "--out", "{file}/x.png", "--points", "3"], "is a file, not a directory"),
    (["landscape", "{run}", "--out", "{file}", "--points", "3"], "is an existing file that dfl did not write"),
    (["topology", "ring", "--clients", "8", "--plot", "{file}"], "is an existing file that dfl did not write"),
    (["sweep", "{spec}", "--out", "{run}", "--no-report"], "is a run directory, not a sweep directory"),
    (["run", "--out", "{sweep}"], "is a sweep directory, not a run directory"),
])
def test_an_out_that_is_a_file_or_another_kind_is_refused(tmp_path, capsys, run_dir, argv, words):
    (tmp_path / "file.png").write_bytes(b"my picture")
    (tmp_path / "s.toml").write_text("[base]\nrounds = 1\n[vary]\nseed = [0]\n")
    sweep = claim_directory(tmp_path / "sweep", "sweep")
    paths = {"file": tmp_path / "file.png", "spec": tmp_path / "s.toml", "run": run_dir, "sweep": sweep}
    before = hashes(tmp_path)
    refused([a.format(**paths) for a in argv], capsys, words)
    assert hashes(tmp_path) == before


def test_a_marker_dfl_cannot_read_is_refused(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    for content, words in [(b"\xff\xfe", "is UTF-16 text"), (b"[]", "holds a list"), (b'{"kind": "mine"}', "kind")]:
        (tmp_path / "d" / MARKER).write_bytes(content)
        refused(["run", "--out", str(tmp_path / "d")], capsys, "dfl cannot tell whether it made", words)


# ---------------------------------------------------------------------------------------------- --overwrite
def test_overwrite_deletes_only_what_dfl_wrote(run_dir, capsys):
    (run_dir / "notes.txt").write_text("mine")
    (run_dir / "plots").mkdir()
    (run_dir / "plots" / "mine.png").write_bytes(b"png")
    (run_dir / "plots" / "landscape.png").write_bytes(b"dfl's")
    (run_dir / ".metrics.jsonl.abc123").write_text("a temporary of a killed write")
    kept = {k: v for k, v in hashes(run_dir).items() if k in ("notes.txt", "plots/mine.png")}
    removed = {p.relative_to(run_dir).as_posix() for p in remove_written(run_dir, "run")}
    shards = {"checkpoint.shards/round-000002/.metadata", "checkpoint.shards/round-000002/__0_0.distcp"}
    # one process: no params.shards/ (a multi-process run's final parameters), no error.log
    plain = {n for n in RUN_FILES if "*" not in n and n != "error.log" and not n.startswith("params.shards/")}
    assert removed == {*plain, *shards, "plots/landscape.png", ".metrics.jsonl.abc123"}
    assert not (run_dir / "checkpoint.shards").exists()  # its emptied folders go too
    assert {k: v for k, v in hashes(run_dir).items()} == {**kept, MARKER: hashes(run_dir)[MARKER]}
    assert main(["run", *FLAGS, "--out", str(run_dir), "--overwrite"]) == 0
    assert {k: v for k, v in hashes(run_dir).items() if k in kept} == kept


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(st.sampled_from([*RUN_FILES, "landscape.json", "plots/landscape.png", "notes.txt",
                                              "data.csv", "plots/mine.png", ".params.pt.x1", "tensorboard/x",
                                              "runs/a/config.toml", "report.md", "sweep.json"]),
                             st.binary(max_size=20), max_size=8),
       marked=st.booleans())
def test_the_rule_never_touches_a_users_file(tmp_path_factory, files, marked):
    """Whatever a folder holds: without the marker, any file in it (but the temporaries of an atomic write) gets
    it refused, with or without overwrite; with the marker, overwrite deletes dfl's files and no other byte."""
    folder = tmp_path_factory.mktemp("f")
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    if marked:
        (folder / MARKER).write_text(json.dumps({"kind": "run"}))
    written = {*RUN_FILES, "landscape.json", "plots/landscape.png", ".params.pt.x1"}
    users = {k: v for k, v in hashes(folder).items() if k in files and k not in written}
    visible = [name for name in files if name != ".params.pt.x1"]
    for overwrite in (False, True):
        try:
            check_output_directory(folder, "run", overwrite=overwrite)
        except RunDirectoryExists:
            assert marked and visible and not overwrite
            continue
        except OutputPathError:
            assert not marked and visible
            continue
        assert marked or not visible
        if overwrite:
            remove_written(folder, "run")
            assert not any((folder / name).exists() for name in written)
    assert {k: v for k, v in hashes(folder).items() if k in users} == users


# ---------------------------------------------------------------------------------------------- earlier versions
def test_a_run_directory_from_before_markers_is_adopted(run_dir, capsys):
    (run_dir / MARKER).unlink()
    assert directory_kind(run_dir) == "run"
    refused(["run", *FLAGS, "--out", str(run_dir)], capsys, "already exists", "--resume")
    assert main(["run", "--resume", str(run_dir), "--rounds", "3"]) == 0  # resuming an old run keeps working
    assert json.loads((run_dir / MARKER).read_text())["kind"] == "run"
    (run_dir / MARKER).unlink()
    assert main(["run", *FLAGS, "--out", str(run_dir), "--overwrite"]) == 0
    assert (run_dir / MARKER).is_file()


def test_sweep_and_report_directories_from_before_markers_are_recognised(tmp_path, run_dir, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.toml").write_text("[sweep]\nname = \"s\"\n[base]\nrounds = 1\n[vary]\nseed = [0]\n")
    (sweep / "sweep.json").write_text('{"runs": [{"name": "seed=0", "dir": "runs/seed=0"}]}')
    (sweep / "runs" / "seed=0").mkdir(parents=True)
    (sweep / "runs" / "seed=0" / "error.log").write_text("a run that failed before it started")
    assert check_output_directory(sweep, "sweep") == "legacy"
    assert check_output_directory(sweep / "runs" / "seed=0", "run", overwrite=True, adopt_own_files=True) == "legacy"
    assert main(["report", str(run_dir)]) == 0
    report = run_dir / "report"
    assert json.loads((report / MARKER).read_text())["kind"] == "report"
    (report / MARKER).unlink()
    assert directory_kind(report) == "report"
    assert main(["report", str(run_dir)]) == 0  # the old report directory is rewritten
    capsys.readouterr()


def test_the_default_landscape_plot_of_a_run_is_dfls_and_rewritten(run_dir, tmp_path, capsys):
    small = ["--points", "3", "--samples", "20", "--hessian-iters", "0"]
    assert main(["landscape", str(run_dir), *small]) == 0
    assert main(["landscape", str(run_dir), *small, "--out", str(tmp_path / "l.png")]) == 0
    assert main(["landscape", str(run_dir), *small, "--out", str(tmp_path / "l.png")]) == 0  # dfl's own PNG
    capsys.readouterr()


def test_report_names_each_unreadable_file_of_a_run_in_one_line(run_dir, tmp_path, capsys):
    """Unreadable files: a metrics.jsonl with a bad row, a config.toml that is not UTF-8. The run is listed
    (not counted) in the report, and stderr names the file, the line and what is wrong."""
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"round": "x"}\n')
    rows = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert main(["report", str(run_dir), "--out", str(tmp_path / "a")]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning == (f"dfl report: warning: metrics file {run_dir / 'metrics.jsonl'}: line {rows} has round = 'x'; "
                       "every record needs an integer round >= 0; the run is left out of the tables")
    (run_dir / "config.toml").write_bytes(b'algorithm = "dfedsam\xff"\n')
    assert main(["report", str(run_dir), "--out", str(tmp_path / "b"), "--spectral"]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"dfl report: warning: config file {run_dir / 'config.toml'}: is not UTF-8 text: byte "
                              "0xff at line 1, column 21")
    assert "config.toml unreadable" in (tmp_path / "b" / "report.md").read_text()


def test_config_toml_holds_every_resolved_default_and_reruns_the_same_run(tmp_path):
    """config.toml writes in what the run resolved (DFedSAM-MGS's rho, momentum and Q, one local epoch, alpha 0.3; a
    registered algorithm's options), and `dfl run RUN/config.toml` gives the same metrics for the same seed; a resume
    and a sweep rerun still see the same run."""
    base = dict(clients=4, rounds=2, model="logreg", eval_every=1, progress=False, device="cpu",
                dataset_options={"num_samples": 400})
    first = tmp_path / "first"
    dfl.run(Config(**base), out=first)
    stored = Config.from_toml(first / "config.toml")
    assert (stored.rho, stored.momentum, stored.gossip_steps, stored.local_epochs, stored.alpha) == (
        0.01, 0.9, 4, 1, 0.3)
    assert stored.asam_eta is None  # plain SAM reads no eta: a default the checks would refuse stays unset
    again = tmp_path / "again"
    assert main(["run", str(first / "config.toml"), "--out", str(again)]) == 0
    def metrics(run):
        return [{k: v for k, v in json.loads(line).items() if "second" not in k}
                for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert metrics(again) == metrics(first)
    assert main(["run", "--resume", str(first), "--rounds", "3"]) == 0  # the resolved file resumes the run
    kgt = Config.from_toml(_run(tmp_path / "kgt", algorithm="kgt", **base) / "config.toml")
    assert kgt.algorithm_options == {"outer_lr": 1.0} and kgt.momentum is None  # K-GT reads no momentum


def _run(out: Path, **values) -> Path:
    dfl.run(Config(**values), out=out)
    return out


# ---------------------------------------------------------------------------------------------- without --out
def test_new_directories_are_numbered_within_a_second_and_marked(tmp_path):
    now = datetime.datetime(2026, 11, 28, 9, 5, 7)
    made = [make_new_directory("run", "dfedsam-mgs", tmp_path / "runs", now=now) for _ in range(3)]
    assert [path.name for path in made] == ["dfedsam-mgs-20261128-090507", "dfedsam-mgs-20261128-090507-2",
                                            "dfedsam-mgs-20261128-090507-3"]
    assert all(read_marker(path)["kind"] == "run" for path in made)
    assert read_marker(made[0])["dfl_version"] == dfl.__version__
    (tmp_path / "runs" / "odd-20261128-090507").write_text("a file of the user's")  # taken: the next number
    assert make_new_directory("sweep", "odd", tmp_path / "runs", now=now).name == "odd-20261128-090507-2"
    assert (tmp_path / "runs" / "odd-20261128-090507").read_text() == "a file of the user's"
    assert make_new_directory("run", "my algo/../x", tmp_path / "runs", now=now).name == "my-algo-..-x-20261128-090507"
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputPathError, match="is a file"):
        make_new_directory("run", "a", tmp_path / "file")


def test_a_new_directory_left_unused_is_removed_and_nothing_else(tmp_path):
    new = NewDirectory("a", tmp_path / "runs")
    path = new.make("run")
    new.remove_if_unused()
    assert not path.exists() and new.path is None and not (tmp_path / "runs").exists()  # it made runs/ too
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine.txt").write_text("")
    new.make("run")
    new.remove_if_unused()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["mine.txt"]
    path = new.make("run")
    (path / "summary.json").write_text("{}")
    new.remove_if_unused()
    assert (path / "summary.json").exists() and (path / MARKER).exists()

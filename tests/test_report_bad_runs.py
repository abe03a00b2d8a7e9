"""`dfl report`, `dfl run --resume` and a sweep's report over run directories whose files are broken.

Each broken file gives one line naming the file and what is wrong (the field and the value, in `Config.from_toml`'s
words for a config.toml); a killed run's metrics so far are reported; a directory that holds no run is refused in one
line; no file that is read is changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dfl.cli import main
from dfl.cli.sweep import _report as sweep_report
from dfl.config import Config
from dfl.report import ReportError, load_run, write_report
from tests.test_report import M, table, write_run


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes (what the report must leave as it is)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_run(tmp_path: Path, accs=(0.4, 0.5, 0.6)) -> Path:
    config = Config(name="r", algorithm="dfedavg", topology="ring", clients=M, rounds=15)
    return write_run(tmp_path / "run", config, list(accs), 0.7, 1e-3)


def two_runs(tmp_path: Path) -> Path:
    """A sweep-like folder of a good run and a second run (the one a test breaks), other seed."""
    root = tmp_path / "runs"
    for seed, accs in ((0, [0.4, 0.5]), (1, [0.3, 0.45])):
        config = Config(name=f"s{seed}", seed=seed, algorithm="dfedavg", topology="ring", clients=M, rounds=10)
        write_run(root / f"seed{seed}", config, accs, 0.6, 1e-3)
    return root


def set_key(path: Path, key: str, value: str) -> None:
    """Write `key = value` (TOML text) into config file `path`: over the key's line, or first when it has none."""
    lines = path.read_text().splitlines()
    index = next((i for i, line in enumerate(lines) if line.startswith(f"{key} =")), None)
    if index is None:
        lines.insert(0, f"{key} = {value}")
    else:
        lines[index] = f"{key} = {value}"
    path.write_text("\n".join(lines) + "\n")


# (how config.toml is broken, what the warning says after "config file PATH: ")
BROKEN_CONFIGS = {
    "a word for an integer": (("rounds", '"ten"'), "rounds must be an integer >= 1, got 'ten'"),
    "a list for a number": (("rho", "[1]"), "rho must be a finite number >= 0, got list [1]"),
    "out of range": (("rounds", "-3"), "rounds must be >= 1, got -3"),
    "an unknown key": (("bogus_key", "3"), "unknown config field 'bogus_key'"),
    "not TOML": (None, "is not valid TOML"),
}


@pytest.mark.parametrize("case", BROKEN_CONFIGS)
def test_a_config_that_makes_no_config_is_one_line_naming_file_and_field(tmp_path, capsys, case):
    root = two_runs(tmp_path)
    broken = root / "seed1" / "config.toml"
    edit, expected = BROKEN_CONFIGS[case]
    if edit is None:
        broken.write_text("this is [not toml\n")
    else:
        set_key(broken, *edit)
    before = snapshot(root)
    assert main(["report", str(root), "--out", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line]
    assert len(warnings) == 1, captured.err
    assert warnings[0].startswith(f"dfl report: warning: config file {broken}: ")
    assert expected in warnings[0] and warnings[0].endswith("; the run is left out of the tables")
    md = (tmp_path / "report" / "report.md").read_text()
    assert table(md, "Final test accuracy")["dfedavg"] == {"ring": "50.00"}  # the good run alone
    note = table(md, "Runs not completed")["seed1"]["note"]
    assert expected.split(",")[0] in note
    assert snapshot(root) == before  # nothing read is changed


def test_every_wrong_key_of_a_config_in_one_line(tmp_path):
    run = one_run(tmp_path)
    set_key(run / "config.toml", "rounds", '"ten"')
    set_key(run / "config.toml", "rho", "[1]")
    with pytest.warns(UserWarning) as caught:
        record = load_run(run)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "rounds must be an integer" in message and "rho must be a finite number" in message
    assert record.metrics == [] and "config.toml is not a valid config (" in record.problems[0]


def test_a_single_run_with_a_bad_config_is_reported_as_left_out(tmp_path, capsys):
    run = one_run(tmp_path)
    set_key(run / "config.toml", "rounds", '"ten"')
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rounds must be an integer >= 1, got 'ten'" in err
    md = (tmp_path / "report" / "report.md").read_text()
    assert "1 run(s), none in the tables yet (Runs not completed says why)." in md
    assert table(md, "Runs not completed")["run"]["status"] == "completed"


def test_a_killed_runs_truncated_last_line_is_skipped_with_a_warning(tmp_path, capsys):
    run = one_run(tmp_path)
    metrics = run / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-40])  # the last record cut mid-write, no newline
    before = snapshot(run)
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"dfl report: warning: metrics file {metrics}: line 3 is not valid JSON" in err
    assert "skipped, the report uses the 2 record(s) before it" in err
    md = (tmp_path / "report" / "report.md").read_text()
    assert table(md, "Final test accuracy")["dfedavg"] == {"ring": "50.00"}  # round 10's record: the last whole one
    assert snapshot(run) == before


def test_a_bad_line_before_the_last_still_leaves_the_run_out(tmp_path):
    run = one_run(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:30]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"line 2 is not valid JSON.*the run is left out of the tables"):
        record = load_run(run)
    assert record.metrics == []


def test_a_run_without_summary_is_reported_with_its_status_unknown(tmp_path, capsys):
    run = one_run(tmp_path)
    (run / "summary.json").unlink()
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err
    assert err == f"dfl report: warning: summary file {run / 'summary.json'}: does not exist; its status is unknown\n"
    md = (tmp_path / "report" / "report.md").read_text()
    assert table(md, "Final test accuracy")["dfedavg"] == {"ring": "60.00 †"}
    assert table(md, "Runs not completed")["run"]["status"] == "unknown"


def test_a_run_without_config_is_refused_in_one_line(tmp_path, capsys):
    run = one_run(tmp_path)
    (run / "config.toml").unlink()
    before = snapshot(run)
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert err == (f"dfl report: error: path {run} holds a run's files but no config.toml, so its setting is unknown "
                   "(a run directory holds config.toml, summary.json and metrics.jsonl): nothing to report\n")
    assert snapshot(run) == before and not (tmp_path / "report").exists()


def test_a_run_without_config_under_a_folder_is_left_out_with_a_warning(tmp_path):
    root = two_runs(tmp_path)
    (root / "seed1" / "config.toml").unlink()
    with pytest.warns(UserWarning, match=r"seed1 holds a run's files but no config.toml.*left out of the report"):
        files = write_report(root, tmp_path / "report")
    assert table(files["report.md"].read_text(), "Final test accuracy")["dfedavg"] == {"ring": "50.00"}


@pytest.mark.parametrize("layout", ["empty", "a file", "someone's folder"])
def test_a_directory_that_is_no_run_is_one_line(tmp_path, capsys, layout):
    path = tmp_path / "x"
    if layout == "a file":
        path.write_text("notes\n")
    else:
        path.mkdir()
        if layout == "someone's folder":
            (path / "notes.txt").write_text("mine\n")
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dfl report: error: ")
    assert ("no run directories under" in err) != (layout == "a file")
    with pytest.raises(ReportError):
        write_report(path, tmp_path / "report")


@pytest.mark.parametrize("case", ["a word for an integer", "a list for a number", "an unknown key", "not TOML"])
def test_resume_with_a_config_that_makes_no_config_is_one_line(tmp_path, capsys, case):
    run = one_run(tmp_path)
    (run / "checkpoint.pt").write_bytes(b"the config is read before the checkpoint")
    edit, expected = BROKEN_CONFIGS[case]
    if edit is None:
        (run / "config.toml").write_text("this is [not toml\n")
    else:
        set_key(run / "config.toml", *edit)
    before = snapshot(run)
    assert main(["run", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dfl run: error: config file {run / 'config.toml'}: ")
    assert expected in err
    assert snapshot(run) == before


def test_a_sweeps_report_warns_about_each_broken_run(tmp_path, capsys):
    root = two_runs(tmp_path)
    set_key(root / "seed1" / "config.toml", "rho", "[1]")
    metrics = root / "seed0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"round": 15, "test_')
    before = snapshot(root)
    args = argparse.Namespace(no_report=False)
    assert sweep_report("sweep", root, args, False, 0) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert any(line.startswith(f"dfl sweep: warning: config file {root / 'seed1' / 'config.toml'}: rho must be")
               for line in err)
    assert any(f"metrics file {metrics}: line 3 is not valid JSON" in line for line in err)
    md = (root / "report" / "report.md").read_text()
    assert table(md, "Final test accuracy")["dfedavg"] == {"ring": "50.00"}
    assert {k: v for k, v in snapshot(root).items() if not k.startswith("report")} == before


def test_metrics_of_a_run_whose_records_carry_json_text(tmp_path):
    """The records before a cut last line are read as they are (json.dumps of each, as the run wrote them)."""
    run = one_run(tmp_path)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "{")
    with pytest.warns(UserWarning, match="line 4 is not valid JSON"):
        assert load_run(run).metrics == records


@pytest.mark.parametrize("case", ["a word for an integer", "an unknown key", "not TOML"])
def test_a_sweep_rerun_over_a_run_whose_config_makes_no_config_is_one_line(tmp_path, case):
    """A sweep run again over its directory cannot tell which run a broken config.toml holds: one line naming the file
    and the field, and what to do; the file is left as it is."""
    from dfl.errors import SweepError
    from dfl.workflows.sweep.plan import plan_run

    run = one_run(tmp_path)
    config = Config.from_toml(run / "config.toml")
    edit, expected = BROKEN_CONFIGS[case]
    if edit is None:
        (run / "config.toml").write_text("this is [not toml\n")
    else:
        set_key(run / "config.toml", *edit)
    before = snapshot(run)
    with pytest.raises(SweepError) as caught:
        plan_run(run, config)
    message = str(caught.value)
    assert message.startswith(f"run r: config file {run / 'config.toml'}: ") and expected in message
    assert message.endswith(f"dfl cannot tell which run {run} holds: repair that file, or delete that run directory "
                            "to start the run over")
    assert "\n" not in message and snapshot(run) == before

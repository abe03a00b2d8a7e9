"""A run whose stdout is not a terminal (nohup, Slurm, `> log`) prints plain progress lines; the
final table reports the mean seconds per round (and the latest, labelled as such)."""

from __future__ import annotations

import io

from dfl.engine import hooks
from dfl.engine.experiment import _final_metrics
from dfl.engine.results import format_summary


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_stdout_is_not_a_terminal():
    log = io.StringIO()
    progress = hooks.Progress("dfedsam", 40, stream=log, bar=False)
    for t in range(40):
        progress.round_done()
        if (t + 1) % 10 == 0:
            progress.evaluated({"round": t + 1, "test_acc": 0.5 + t / 100})
    lines = log.getvalue().splitlines()
    assert len(lines) == 40 // 2  # every rounds / PLAIN_LINES rounds, the last included
    assert lines[0].startswith("dfedsam: round 2/40, ") and " s/round, ETA " in lines[0]
    assert lines[-1].startswith("dfedsam: round 40/40, test accuracy 89.00% (round 40), ")
    assert "ETA" not in lines[-1]


def test_a_line_every_half_minute_on_slow_runs(monkeypatch):
    clock = iter([0.0, 31.0, 62.0, 63.0])
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: next(clock))
    log = io.StringIO()
    progress = hooks.Progress("dpsgd", 1000, stream=log, bar=False)  # every 50 rounds otherwise
    progress.round_done()  # 31 s after the start
    progress.round_done()  # 31 s later
    progress.round_done()  # 1 s later: no line
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == ["dpsgd: round 1/1000",
                                                                             "dpsgd: round 2/1000"]


def test_no_plain_lines_on_a_terminal():
    out = Terminal()
    progress = hooks.Progress("dfedavg", 4, stream=out, bar=False)
    for _ in range(4):
        progress.round_done()
    assert out.getvalue() == ""


def test_the_final_table_reports_the_mean_seconds_per_round():
    history = [{"round": 5, "test_acc": 0.5, "seconds_per_round": 1.0},
               {"round": 10, "test_acc": 0.6, "seconds_per_round": 3.0},
               {"round": 12, "test_acc": 0.7, "seconds_per_round": 0.5}]
    final = _final_metrics(history)
    assert final["seconds_per_round_mean"] == (5 * 1.0 + 5 * 3.0 + 2 * 0.5) / 12
    assert final["seconds_per_round"] == 0.5 and final["seconds_per_round_rounds"] == 2
    summary = {"algorithm": "dpsgd", "topology": "ring", "lambda": 0.5, "clients": 4, "dataset": "mnist1d",
               "model": "logreg", "rounds_completed": 12, "rounds": 12, "status": "completed", **final}
    table = format_summary(summary)
    assert "seconds per round (mean)" in table and "1.750" in table
    assert "seconds per round (last 2 rounds)" in table and "0.500" in table


def test_a_set_up_step_that_takes_long_says_so_and_a_quick_one_says_nothing():
    import time

    log = io.StringIO()
    with hooks.announced("making the data (x)", stream=log, says=(0.05, 0.1)):
        time.sleep(0.4)
    lines = log.getvalue().splitlines()
    assert lines[0] == "dfl: making the data (x) ... 0 s" and len(lines) >= 3  # at 0.05 s, 0.1 s, then every 0.1 s
    assert lines[-1].startswith("dfl: making the data (x): done in 0.")
    quiet = io.StringIO()
    with hooks.announced("building the topology", stream=quiet, says=(5.0,)):
        pass
    with hooks.announced("anything", show=False, stream=quiet, says=(0.0,)):
        time.sleep(0.05)
    assert quiet.getvalue() == ""
    on_terminal = Terminal()
    with hooks.announced("step", stream=on_terminal, says=(0.02, 0.04)):
        time.sleep(0.2)
    assert on_terminal.getvalue().startswith("\rdfl: step ... 0 s") and on_terminal.getvalue().count("\n") == 1

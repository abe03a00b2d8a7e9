"""Hooks: what a run tells the outside while it goes, and who may stop it early.

Three kinds of listeners, all driven from `dfl.engine.experiment.Experiment.record` (every evaluated round, right after
its record is written to metrics.jsonl) and run on the main process only (rank 0 under torchrun):

- loggers (`config.loggers`, `dfl.loggers`): TensorBoard, Weights & Biases, or a registered one;
- callbacks (`dfl.run(config, callbacks=[...])`): objects with `on_round_end(round, metrics) -> bool | None`;
  True stops the run after this round (checkpointed), with status "stopped". Optional `on_run_start(info)`
  (before the first round of this session) and `on_run_end(summary)` (however the run ends);
- the target accuracy (`config.target_accuracy`): `rounds_to_target`, the first evaluated round whose test_acc
  >= target, goes into summary.json (None until reached); with `stop_at_target` the run stops there.

A stop is agreed on by every process: rank 0 decides, and one all-reduce of a single number carries the
decision (0 go on, 1 the target, 2 + i callback i), so every rank leaves the loop after the same round.

`Progress` is what the run shows while it goes (`config.progress`, main process): tqdm's bar on a terminal, and
plain lines when stdout is a file (nohup, Slurm, `> log`), so a log shows the run is alive.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from dfl import loggers as loggers_
from dfl.config import Config
from dfl.errors import ArgumentError
from dfl.loggers import RunInfo

FINISHED = ("completed", "stopped")  # statuses of a run that ended as it should: a listener's error is raised
# Plain progress lines (stdout not a terminal): one every PLAIN_SECONDS, and at least every rounds / PLAIN_LINES
# rounds, so a 200-round run logs ~20 lines however fast it is, and a slow one a line every half minute.
PLAIN_SECONDS = 30.0
PLAIN_LINES = 20
# a step of a run's set-up (making the data, building the topology, ...) that takes longer than the first of these
# says so, and again after each of the next (then every last one): nothing is silent for more than a few seconds
SETUP_SAYS = (2.0, 5.0, 10.0, 20.0, 30.0)


class Callback(Protocol):
    """`on_round_end(round, metrics)` is required; `on_run_start(info)` and `on_run_end(summary)` optional."""

    def on_round_end(self, round: int, metrics: dict[str, Any]) -> bool | None:
        """Called after every evaluated round with its metrics; True stops the run after it."""
        ...


def check_callbacks(callbacks: Sequence[Any] | None) -> list[Any]:
    """The callbacks as a list; a TypeError naming the one without a callable `on_round_end`."""
    if callbacks is None:
        return []
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Sequence):
        raise ArgumentError(f"callbacks must be a list of objects with on_round_end(round, metrics), got "
                            f"{type(callbacks).__name__}")
    for i, cb in enumerate(callbacks):
        if isinstance(cb, type) or not callable(getattr(cb, "on_round_end", None)):
            raise ArgumentError(f"callbacks[{i}] ({_label(cb)}) has no on_round_end(round, metrics) method: a callback "
                                "is an object with on_round_end returning True to stop the run, or False/None")
    return list(callbacks)


def _label(obj: Any) -> str:
    return type(obj).__name__ if not isinstance(obj, type) else f"the class {obj.__name__}, not an instance"


class Hooks:
    """The listeners of one run: loggers, the target accuracy and callbacks.

    Built at set-up, before any training, on every process, so a missing logger package or a bad callback fails on
    every rank alike; only rank 0 calls them.
    """

    def __init__(self, config: Config, callbacks: Sequence[Any] | None, comm, out_dir: str | Path | None):
        self.callbacks = check_callbacks(callbacks)
        loggers = loggers_.build(list(config.loggers), out_dir)
        self.comm, self.main = comm, comm.is_main
        self.loggers = loggers if self.main else []
        self.target, self.stop_at_target = config.target_accuracy, config.stop_at_target
        self.rounds_to_target: int | None = None
        self.stopped_by: str | None = None  # why the run stops (set on every rank once agreed)
        self.stopped_at: int | None = None  # the round it stops after
        self._started: list[Any] = []  # loggers whose start ran (only those get finish)
        self._callbacks_started = False

    # ------------------------------------------------------------------------------------------ start
    def resume(self, history: list[dict[str, Any]]) -> None:
        """A resumed run keeps rounds_to_target from its history.

        One that already stopped at the target (stop_at_target still set) is finished: it trains no further
        round.
        """
        for record in history:
            self._reach(record)
        if self.stop_at_target and self.rounds_to_target is not None and history:
            self.stopped_by = self._target_reason(self.rounds_to_target)
            self.stopped_at = history[-1]["round"]

    def summary_fields(self) -> dict[str, Any]:
        """The summary.json entries.

        target_accuracy and rounds_to_target (None: not reached) when there is a target; stopped_by (why) and
        stopped_at_round once the run is to stop early.
        """
        fields: dict[str, Any] = {}
        if self.target is not None:
            fields.update(target_accuracy=self.target, rounds_to_target=self.rounds_to_target)
        if self.stopped:
            fields.update(stopped_by=self.stopped_by, stopped_at_round=self.stopped_at)
        return fields

    def start(self, info: RunInfo) -> None:
        """Start the loggers (main process only)."""
        if not self.main:
            return
        for logger in self.loggers:
            logger.start(info)
            self._started.append(logger)
        self._callbacks_started = True
        for cb in self.callbacks:
            if callable(getattr(cb, "on_run_start", None)):
                cb.on_run_start(info)

    # ------------------------------------------------------------------------------------------ rounds
    def round_end(self, record: dict[str, Any], device: torch.device) -> None:
        """After round `record["round"]` was evaluated and written.

        Log it, check the target, ask the callbacks; then agree with every process on stopping (a collective:
        every process calls it).
        """
        n = record["round"]
        reached = self._reach(record)
        code = 0
        if self.main:
            for logger in self.loggers:
                logger.log(n, record)
            if reached and self.stop_at_target:
                code = 1
            for i, cb in enumerate(self.callbacks):  # every callback sees every round, even after one said stop
                answer = cb.on_round_end(n, copy.deepcopy(record))
                if answer is not None and not isinstance(answer, (bool, np.bool_)):
                    raise ArgumentError(f"callbacks[{i}] ({_label(cb)}).on_round_end returned {answer!r}; return True "
                                        "to stop the run, False or None to go on")
                if answer and code == 0:
                    code = 2 + i
        code = int(self.comm.sum(torch.tensor([float(code)], dtype=torch.float64, device=device)).item())
        if code:
            self.stopped_at = n
            self.stopped_by = self._target_reason(n) if code == 1 else \
                f"callbacks[{code - 2}] ({self._callback_name(code - 2)}) at round {n}"

    def _reach(self, record: dict[str, Any]) -> bool:
        """Whether this record is the first to reach the target (recording rounds_to_target)."""
        acc = record.get("test_acc")
        if self.target is None or self.rounds_to_target is not None or not isinstance(acc, (int, float)):
            return False
        if acc >= self.target:  # NaN compares False
            self.rounds_to_target = record["round"]
            return True
        return False

    def _target_reason(self, n: int) -> str:
        return f"target_accuracy (test_acc >= {self.target} at round {n}; stop_at_target)"

    def _callback_name(self, i: int) -> str:
        return _label(self.callbacks[i]) if i < len(self.callbacks) else "a callback of rank 0"

    @property
    def stopped(self) -> bool:
        """Whether the target or a callback stopped the run."""
        return self.stopped_by is not None

    # ------------------------------------------------------------------------------------------ finish
    def finish(self, summary: dict[str, Any]) -> None:
        """Loggers' `finish(status, summary)` and callbacks' `on_run_end(summary)`, each once, however the run ended.

        Their errors are raised after all were called when the run itself ended well; when it failed, they are
        warnings, so that they never hide the run's own error.
        """
        status = str(summary.get("status"))
        calls = [(logger, lambda lg=logger: lg.finish(status, summary)) for logger in self._started]
        if self._callbacks_started:
            calls += [(cb, lambda cb=cb: cb.on_run_end(summary)) for cb in self.callbacks
                      if callable(getattr(cb, "on_run_end", None))]
        self._started, self._callbacks_started = [], False
        errors = []
        for listener, call in calls:
            try:
                call()
            except Exception as exc:
                errors.append(exc)
                if status not in FINISHED:
                    warnings.warn(f"{_label(listener)} failed at the end of the run: {type(exc).__name__}: {exc}",
                                  stacklevel=2)
        if errors and status in FINISHED:
            raise errors[0]


class Progress:
    """What a run shows while it goes (main process, `config.progress`).

    On a terminal, tqdm's bar on stderr; when stdout is not a terminal (a log file, nohup, a Slurm job), one plain
    line on stdout every `every` rounds (a twentieth of the run, PLAIN_LINES) or every PLAIN_SECONDS, whichever
    comes first, and after the last round's evaluation:

        dfedsam-mgs: round 40/200, test accuracy 71.25% (round 40), 0.85 s/round, ETA 2m16s

    `round_done()` after each trained round, `evaluated(record)` after each evaluation, `close()` at the end.
    """

    def __init__(self, name: str, rounds: int, start: int = 0, stream=None, bar: bool = True):
        self.name, self.rounds, self.done = name, rounds, start
        self.stream = sys.stdout if stream is None else stream
        self.plain = not _is_terminal(self.stream)
        self.every = max(1, math.ceil(rounds / PLAIN_LINES))
        self.started = self.last_line = time.perf_counter()
        self.first = start  # rounds done before this session (a resumed run): not timed here
        self.accuracy: tuple[float, int] | None = None
        self.bar = None
        if bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=rounds, initial=start, desc=name, unit="round", leave=False,
                            disable=None)  # None: no bar when stderr is not a terminal (log files, sweep workers)

    def round_done(self) -> None:
        """Count a trained round."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        now = time.perf_counter()
        if self.done < self.rounds and (self.done % self.every == 0 or now - self.last_line >= PLAIN_SECONDS):
            self._print(now)

    def evaluated(self, record: dict[str, Any]) -> None:
        """Show an evaluated round's test accuracy."""
        acc = record.get("test_acc")
        if isinstance(acc, (int, float)):
            self.accuracy = (float(acc), int(record["round"]))
            if self.bar is not None:
                self.bar.set_postfix(acc=f"{acc:.3f}", refresh=False)
        if record.get("round") == self.rounds:  # the last round is always evaluated: its line has the final accuracy
            self._print(time.perf_counter())

    def _print(self, now: float) -> None:
        if self.plain:
            self.last_line = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float) -> str:
        """The plain line: round, latest test accuracy, mean seconds per round of this session, time left."""
        timed = self.done - self.first
        per_round = (now - self.started) / timed if timed else 0.0
        parts = [f"{self.name}: round {self.done}/{self.rounds}"]
        if self.accuracy is not None:
            parts.append(f"test accuracy {self.accuracy[0]:.2%} (round {self.accuracy[1]})")
        parts.append(f"{per_round:.3g} s/round")
        if self.done < self.rounds:
            parts.append(f"ETA {_duration(per_round * (self.rounds - self.done))}")
        return ", ".join(parts)

    def close(self) -> None:
        """Close the bar, if there is one."""
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def announced(what: str, show: bool = True, stream=None, says: Sequence[float] = SETUP_SAYS) -> Iterator[None]:
    """Say on `stream` (stderr) that `what` is under way while it takes long, and when it is done.

    Nothing for a step done within `says[0]` seconds; after it, "dfl: WHAT ... 12 s" once the time reaches each of
    `says` (then every `says[-1]` seconds: a step of minutes says a line every half minute), on a terminal on one
    line that updates, and at the end how long it took. A watcher thread writes the lines, so the step itself
    (numpy, a third-party generator) needs no hooks. `show` False (progress off, a non-main process): nothing.
    """
    if not show:
        yield
        return
    stream = sys.stderr if stream is None else stream
    terminal, done, said = _is_terminal(stream), threading.Event(), []
    started = time.perf_counter()

    def watch() -> None:
        marks = iter(says)
        mark = next(marks)
        while not done.wait(max(0.0, started + mark - time.perf_counter())):
            line = f"dfl: {what} ... {time.perf_counter() - started:.0f} s"
            print(("\r" + line) if terminal else line, end="" if terminal else "\n", file=stream, flush=True)
            said.append(line)
            mark = next(marks, mark + says[-1])

    watcher = threading.Thread(target=watch, name="dfl-setup-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        if said:
            line = f"dfl: {what}: done in {time.perf_counter() - started:.1f} s"
            print(f"\r{line:<{len(said[-1])}}" if terminal else line, file=stream, flush=True)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _duration(seconds: float) -> str:
    """"42s", "2m16s", "3h05m"."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"

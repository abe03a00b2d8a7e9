"""`loggers = ["tensorboard"]`: TensorBoard event files under the run directory's `tensorboard/`.

    tensorboard --logdir runs/        # every run below, one TensorBoard run each (RUN/tensorboard)

Per evaluated round (step = the round, as in metrics.jsonl) one scalar per numeric metric, grouped into
TensorBoard sections by the metric's name: `accuracy/test_acc`, `loss/train_loss`, `communication/bytes_sent`,
`consensus/consensus_distance`, `training/lr`, ...; the per-client accuracies (`client_acc`, a list) as a
histogram `accuracy/client_acc`. At the start, the hyperparameters (the config's fields with the algorithm's
resolved defaults; HPARAMS tab, where runs under one --logdir can be compared) and config.toml (TEXT tab).

A resumed run appends to the same directory and hides the points the interrupted run logged after its
checkpoint (`purge_step`), as metrics.jsonl drops them; a fresh run (`--overwrite`) deletes old event files.
"""

from __future__ import annotations

import json
from typing import Any

from typing_extensions import override

from dfl.loggers.base import Logger, RunInfo, numeric, require

SUBDIR = "tensorboard"
# Section of a metric: the first rule whose word is in its name (else "training": lr, seconds_per_round, ...)
SECTIONS = (("acc", "accuracy"), ("loss", "loss"), ("bytes", "communication"), ("consensus", "consensus"))
# Metrics the HPARAMS tab shows next to each run's hyperparameters (their last logged value)
HPARAM_METRICS = ("test_acc", "test_loss", "train_loss", "client_acc_mean", "consensus_distance")


def tag(metric: str) -> str:
    """The TensorBoard tag of a metric: "section/metric"."""
    section = next((s for word, s in SECTIONS if word in metric), "training")
    return f"{section}/{metric}"


def hparam_values(info: RunInfo) -> dict[str, Any]:
    """The run's config and hyperparameters as TensorBoard hparams.

    The config's fields (unset ones: the algorithm's resolved value, or left out) as TensorBoard hparams,
    which take numbers, strings and bools: tables and lists become their JSON text.
    """
    values = {**info.config.to_dict(), **info.hyperparameters}
    return {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
            for k, v in values.items() if v is not None}


class TensorBoardLogger(Logger):
    """`loggers = ["tensorboard"]`: every evaluated round's metrics as TensorBoard scalars under RUN/tensorboard/."""
    needs_out_dir = True

    def __init__(self):
        require("tensorboard", "tensorboard", "pip install tensorboard  (or: pip install 'dfl[tensorboard]')")
        self.writer = None

    @override
    def start(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        assert info.out_dir is not None, "needs_out_dir: a run without a directory refuses this logger"
        log_dir = info.out_dir / SUBDIR
        events = sorted(log_dir.glob("events.out.tfevents.*")) if log_dir.is_dir() else []
        if info.start_round == 0:  # a fresh run: event files left by an overwritten run would mix in
            for path in events:
                path.unlink()
            events = []
        # resumed: points after the checkpoint (rounds > start_round) from the interrupted session are hidden
        self.writer = writer = SummaryWriter(str(log_dir), purge_step=info.start_round + 1 if events else None)
        if events:
            return  # hyperparameters and the rounds so far are in the earlier event files
        exp, ssi, sei = hparams(hparam_values(info), {tag(m): 0.0 for m in HPARAM_METRICS})
        for proto in (exp, ssi, sei):  # in the run's own directory (add_hparams would make a sub-run)
            writer.file_writer.add_summary(proto)  # type: ignore[attr-defined]  # torch types it by its first value, None
        writer.add_text("config", "```toml\n" + info.config.to_toml() + "```")
        for record in info.history:  # tensorboard enabled on resume: the rounds before it, from the history
            self.log(record["round"], record)

    @override
    def log(self, round: int, metrics: dict[str, Any]) -> None:
        writer = self.writer
        assert writer is not None, "the hooks call start() first"
        for name, value in numeric(metrics).items():
            writer.add_scalar(tag(name), value, round)
        if metrics.get("client_acc"):
            import numpy as np

            writer.add_histogram(tag("client_acc"), np.asarray(metrics["client_acc"], dtype=float), round)
        writer.flush()  # live: a running TensorBoard sees the round now, not in flush_secs

    @override
    def finish(self, status: str, summary: dict[str, Any]) -> None:
        if self.writer is None:
            return
        note = f"status: **{status}**, {summary.get('rounds_completed')}/{summary.get('rounds')} rounds"
        if summary.get("stopped_by"):
            note += f"; stopped by {summary['stopped_by']}"
        if summary.get("error"):
            note += f"; {summary['error']}"
        self.writer.add_text("status", note, summary.get("rounds_completed"))
        self.writer.close()

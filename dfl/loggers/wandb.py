"""`loggers = ["wandb"]`: Weights & Biases, when the `wandb` package is installed (`pip install wandb`).

One W&B run per session of a dfl run: project `$WANDB_PROJECT` (default "dfl"), named after the config's
`name`, with the config's fields and the algorithm's resolved hyperparameters as its config; every numeric
metric of each evaluated round is logged with step = the round (the per-client list `client_acc` is not:
its mean, std, min and max are). W&B's own settings apply, e.g. `WANDB_MODE=offline` writes the run locally
(no network, no account; `wandb sync` uploads it later). With a run directory, W&B's files go under it
(`RUN/wandb/`). A resumed run starts a new W&B run holding the rounds so far (from the history) and the new.
"""

from __future__ import annotations

import os
from typing import Any

from typing_extensions import override

from dfl.loggers.base import Logger, RunInfo, numeric, require

FINISHED = ("completed", "stopped")  # W&B exit code 0; any other status is a failed W&B run


class WandbLogger(Logger):
    """`loggers = ["wandb"]`: every evaluated round's metrics to a Weights & Biases run (`pip install wandb`)."""
    def __init__(self):
        self.wandb = require("wandb", "wandb", "pip install wandb")
        self.run = None

    @override
    def start(self, info: RunInfo) -> None:
        config = {**{k: v for k, v in info.config.to_dict().items() if v is not None}, **info.hyperparameters}
        self.run = self.wandb.init(
            project=os.environ.get("WANDB_PROJECT", "dfl"),
            name=info.config.name,
            config=config,
            dir=str(info.out_dir) if info.out_dir is not None else None,
        )
        for record in info.history:
            self.log(record["round"], record)

    @override
    def log(self, round: int, metrics: dict[str, Any]) -> None:
        assert self.run is not None, "the hooks call start() first"
        self.run.log(numeric(metrics), step=round)

    @override
    def finish(self, status: str, summary: dict[str, Any]) -> None:
        if self.run is None:
            return
        kept: dict[str, Any] = {k: summary[k] for k in (
            "rounds_completed", "best_test_acc", "rounds_to_target", "stopped_by", "error") if k in summary}
        self.run.summary.update({"status": status, **kept})
        self.run.finish(exit_code=0 if status in FINISHED else 1)

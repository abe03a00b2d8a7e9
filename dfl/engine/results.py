"""The run directory: config, metrics, summary, partition, checkpoint and final parameters.

Every file is written atomically (temporary file + rename), so a run that dies at any point leaves
complete files behind: its last good checkpoint and the metrics so far.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfl.config import Config
from dfl.errors import RunDirectoryExists  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # annotations only: the run-directory helpers load without torch (`dfl sweep` answers at once)
    import torch

    from dfl.training.clients import ParamLayout


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)  # mkstemp makes 0600 files; run directories are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        import torch  # here, not at the top: `dfl sweep` argument errors should not wait for torch

        torch.save(obj, tmp)
        os.chmod(tmp, _FILE_MODE)  # mkstemp makes 0600 files; run directories are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=_jsonable, allow_nan=True) + "\n"


def _jsonable(value: Any):
    if hasattr(value, "tolist"):  # torch tensors and numpy arrays
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


# The temporary files `atomic_write_bytes` / `atomic_torch_save` make next to RUN_FILES (`.<name>.<random>`); a
# process killed mid-write leaves one behind. They are never read, and removed when a run starts or resumes.
RUN_FILES = ("checkpoint.pt", "params.pt", "metrics.jsonl", "summary.json", "config.toml", "partition.json",
             "error.log")


def remove_stale_temporaries(directory: str | Path, names: tuple[str, ...] = RUN_FILES) -> list[Path]:
    """Delete the leftover temporary files of an atomic write of `names` in `directory`; returns them."""
    directory = Path(directory)
    removed = []
    for name in names:
        for tmp in directory.glob(f".{name}.*"):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    return removed


class RunDirectory:
    """`runs/<name>/`: config.toml, metrics.jsonl, summary.json, partition.json, checkpoint.pt, params.pt.

    A new run refuses a non-empty directory unless `overwrite` (which deletes the run files first);
    `resume=True` opens an existing run directory as it is, to continue the run in it."""

    def __init__(self, path: str | Path, overwrite: bool = False, resume: bool = False):
        self.path = Path(path)
        self._metrics: list[str] = []
        if resume:
            if overwrite:
                raise ValueError("a run directory is opened either to resume or to overwrite, not both")
            if not self.path.is_dir():
                raise FileNotFoundError(f"cannot resume: run directory {self.path} does not exist")
            remove_stale_temporaries(self.path)
            return
        if self.path.is_dir():
            remove_stale_temporaries(self.path)  # a directory holding only those counts as empty
        if self.path.exists() and any(self.path.iterdir()) and not overwrite:
            raise RunDirectoryExists(
                f"run directory {self.path} already exists and is not empty; choose another --out, pass "
                f"--overwrite to replace it, or continue it with: dfl run --resume {self.path}"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        if overwrite:
            for name in ("metrics.jsonl", "summary.json", "checkpoint.pt", "params.pt", "partition.json"):
                (self.path / name).unlink(missing_ok=True)

    def write_config(self, toml_text: str) -> None:
        atomic_write_bytes(self.path / "config.toml", toml_text.encode())

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_bytes(self.path / name, to_json(obj).encode())

    def append_metrics(self, record: dict[str, Any]) -> None:
        self._metrics.append(json.dumps(record, default=_jsonable, allow_nan=True))
        self._write_metrics()

    def write_metrics(self, records: list[dict[str, Any]]) -> None:
        """Replace metrics.jsonl by `records` (on resume: the history of the checkpoint)."""
        self._metrics = [json.dumps(record, default=_jsonable, allow_nan=True) for record in records]
        self._write_metrics()

    def _write_metrics(self) -> None:
        text = "".join(line + "\n" for line in self._metrics)
        atomic_write_bytes(self.path / "metrics.jsonl", text.encode())

    def save(self, name: str, obj: Any) -> None:
        atomic_torch_save(self.path / name, obj)

    def remove(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


SUMMARY_ROWS = (
    ("test_acc", "test accuracy (averaged model)", "{:.2%}"),
    ("best_test_acc", "best test accuracy", "{:.2%}"),
    ("test_loss", "test loss", "{:.4f}"),
    ("client_acc_mean", "client accuracy mean", "{:.2%}"),
    ("client_acc_min", "client accuracy min", "{:.2%}"),
    ("client_acc_max", "client accuracy max", "{:.2%}"),
    ("personal_acc_mean", "personal accuracy mean (local tests)", "{:.2%}"),
    ("global_acc_mean", "global accuracy mean (local tests)", "{:.2%}"),
    ("train_loss", "train loss (local)", "{:.4f}"),
    ("consensus_distance", "consensus distance", "{:.3e}"),
    ("hessian_top_eig", "top Hessian eigenvalue", "{:.4g}"),
    ("links_up", "links up (last round)", "{:.1%}"),  # dfl.network.faults: only when link faults are on
    ("spectral_gap_realised", "realised spectral gap", "{:.4g}"),
    ("steps_done_mean", "local steps done (mean)", "{:.2f}"),  # ... and when stragglers are
    ("sim_time", "simulated time (s)", "{:.6g}"),
    ("bytes_sent_total", "bytes sent (all clients)", "{}"),
    ("seconds_per_round_mean", "seconds per round (mean)", "{:.3f}"),
    ("seconds_per_round", "seconds per round (last {rounds})", "{:.3f}"),
)


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable table of a run's summary."""
    head = (
        f"{summary['algorithm']} on {summary['topology']} (λ = {summary['lambda']:.4f}), "
        f"{summary['clients']} clients, {summary['dataset']}/{summary['model']}, "
        f"{summary['rounds_completed']}/{summary['rounds']} rounds — {summary['status']}"
    )
    lines = [head]
    last = summary.get("seconds_per_round_rounds") or 1
    rows = [(key, label.format(rounds="round" if last == 1 else f"{last} rounds"), fmt)
            for key, label, fmt in SUMMARY_ROWS]
    width = max(len(label) for _, label, _ in rows)
    for key, label, fmt in rows:
        value = summary.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if key == "bytes_sent_total":
            text = human_bytes(value)
        else:
            text = fmt.format(value)
        lines.append(f"  {label:<{width}}  {text}")
    if summary.get("target_accuracy") is not None:
        reached = summary.get("rounds_to_target")
        lines.append(f"  {'rounds to ' + format(summary['target_accuracy'], '.2%'):<{width}}  "
                     + (str(reached) if reached is not None else "not reached"))
    if summary.get("stopped_by"):
        lines.append(f"  stopped by {summary['stopped_by']}")
    if summary.get("ignored_options"):
        lines.append(f"  ignored options: {', '.join(summary['ignored_options'])}")
    if summary.get("out_dir"):
        lines.append(f"  run directory: {summary['out_dir']}")
    return "\n".join(lines)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@dataclass
class Result:
    """What `dfl.run` returns: the config it ran, the metrics of every evaluated round, the final and initial
    client parameters ([m, d], rows by client id) with their layout, summary.json and the run directory."""

    config: Config
    history: list[dict[str, Any]]  # one dict per evaluated round
    params: torch.Tensor  # [m, d] final client parameters (CPU), rows by client id
    initial_params: torch.Tensor  # [m, d]
    param_names: list[str]  # flat layout: names in order (see `layout` for shapes and offsets)
    summary: dict[str, Any]
    layout: ParamLayout | None = None
    out_dir: Path | None = None
    extras: dict[str, Any] = field(default_factory=dict)

"""The run directory: config, metrics, summary, partition, checkpoint and final parameters.

Every file is written atomically (temporary file + rename), so a run that dies at any point leaves
complete files behind: its last good checkpoint and the metrics so far.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfl.config import Config
from dfl.directories import RUN_FILES, claim_directory, remove_written
from dfl.errors import FileReadError
from dfl.files import (
    FILE_MODE,
    atomic_write_bytes,
    check_input_file,
    check_output_file,
    read_jsonl,
    remove_stale_temporaries,
)

if TYPE_CHECKING:  # annotations only: the run-directory helpers load without torch (`dfl sweep` answers at once)
    import torch

    from dfl.training.clients import ParamLayout


def atomic_torch_save(path: Path, obj: Any) -> None:
    """`torch.save` to `path` atomically (a temporary file next to it, then a rename; `dfl.files`)."""
    path = check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        import torch  # here, not at the top: `dfl sweep` argument errors should not wait for torch

        torch.save(obj, tmp)
        os.chmod(tmp, FILE_MODE)  # mkstemp makes 0600 files; run directories are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_torch_file(path: str | Path, what: str = "torch file") -> Any:
    """What `torch.save` wrote to `path`, loaded safely on the CPU.

    `weights_only=True`: tensors and plain containers, nothing executable. Any failure (missing, a directory,
    truncated, random bytes, a pickle naming a forbidden global) is one `FileReadError` line naming the file, not
    torch's several-line text.
    """
    path = check_input_file(path, what)
    if path.stat().st_size == 0:
        raise FileReadError(path, "is empty (a torch file is never empty)", what)
    import torch  # here: the run-directory helpers load without torch

    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure is reported as one line naming the file
        raise FileReadError(path, f"is not a file torch.save wrote, or it is truncated ({torch_load_reason(exc)})",
                            what) from None


def torch_load_reason(exc: BaseException) -> str:
    """The informative part of a torch.load failure, on one line of at most 200 characters.

    What the weights-only unpickler objected to (torch wraps it in paragraphs of advice), else the message's first
    line.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        detail = " ".join(line for line in lines[1:] if not line.startswith("Check the documentation"))
        return f"the weights-only unpickler refused it: {detail.split('WeightsUnpickler error:')[-1].strip()}"[:200]
    # a truncated zip: torch adds advice after ". This is an internal miniz error"
    first = lines[0].split(". This is an internal miniz error")[0] if lines else ""
    return f"{type(exc).__name__}: {first}"[:200]


def to_json(obj: Any) -> str:
    """`obj` as indented JSON text (tensors, arrays and paths as plain values; NaN kept)."""
    return json.dumps(obj, indent=2, default=_jsonable, allow_nan=True) + "\n"


def _jsonable(value: Any):
    if hasattr(value, "tolist"):  # torch tensors and numpy arrays
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


class RunDirectory:
    """A run directory: --out, or a new `runs/<name>-<YYYYmmdd-HHMMSS>/` (`dfl.directories.NewDirectory`).

    config.toml, metrics.jsonl, summary.json, partition.json, checkpoint.pt, params.pt, and the marker
    `dfl-directory.json` (`dfl.directories`).

    A new run writes into a new or empty folder, or into a run directory dfl made with `overwrite` (which deletes
    the files a run writes there first, and no other file); a folder dfl did not make is refused, whatever
    `overwrite` says (`OutputPathError`). `resume=True` opens an existing run directory as it is, to continue
    the run in it (a run directory from a dfl without markers is adopted: its marker is written).
    """

    def __init__(self, path: str | Path, overwrite: bool = False, resume: bool = False):
        self.path = Path(path)
        self._metrics: list[str] = []
        if resume and overwrite:
            raise ValueError("a run directory is opened either to resume or to overwrite, not both")
        if resume and not self.path.is_dir():
            raise FileNotFoundError(f"cannot resume: run directory {self.path} does not exist")
        claim_directory(self.path, "run", overwrite=overwrite, resume=resume)
        remove_stale_temporaries(self.path, RUN_FILES)  # left by a run killed mid-write; never read
        if overwrite:
            remove_written(self.path, "run")

    def write_config(self, toml_text: str) -> None:
        """Write config.toml (atomically)."""
        atomic_write_bytes(self.path / "config.toml", toml_text.encode())

    def write_json(self, name: str, obj: Any) -> None:
        """Write `obj` as the JSON file `name` (atomically)."""
        atomic_write_bytes(self.path / name, to_json(obj).encode())

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Add an evaluated round's record to metrics.jsonl."""
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
        """`torch.save` `obj` as the file `name` (atomically)."""
        atomic_torch_save(self.path / name, obj)

    def remove(self, name: str) -> None:
        """Delete the file `name` if it is there."""
        (self.path / name).unlink(missing_ok=True)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (`path`: the file or its run directory), one per evaluated round.

    `FileReadError` naming the file and line when one is not a JSON object with an integer `round` >= 0.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return read_jsonl(path, "metrics file", check=_metrics_record_problem)


def _metrics_record_problem(record: dict[str, Any]) -> str | None:
    rnd = record.get("round")
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
        return f"has round = {rnd!r:.40}; every record needs an integer round >= 0"
    accs = record.get("client_acc")
    if accs is not None and not isinstance(accs, list):
        return f"has client_acc = {accs!r:.40}; it is the list of every client's accuracy"
    return None


SUMMARY_ROWS = (
    ("test_acc", "test accuracy (averaged model)", "{:.2%}"),
    ("best_test_acc", "best test accuracy", "{:.2%}"),
    ("test_loss", "test loss", "{:.4f}"),
    ("client_acc_mean", "client accuracy mean", "{:.2%}"),
    ("client_acc_min", "client accuracy min", "{:.2%}"),
    ("client_acc_max", "client accuracy max", "{:.2%}"),
    ("personal_acc_mean", "personal accuracy mean (local tests)", "{:.2%}"),
    ("global_acc_mean", "global accuracy mean (local tests)", "{:.2%}"),
    ("personal_train_acc_mean", "personal train accuracy mean (own data)", "{:.2%}"),
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
    lines += [f"  {label:<{width}}  {text}" for label, text in _threat_lines(summary)]
    if summary.get("target_accuracy") is not None:
        reached = summary.get("rounds_to_target")
        lines.append(f"  {'rounds to ' + format(summary['target_accuracy'], '.2%'):<{width}}  "
                     + (str(reached) if reached is not None else "not reached"))
    if summary.get("stopped_by"):
        lines.append(f"  stopped by {summary['stopped_by']}")
    if summary.get("out_dir"):
        lines.append(f"  run directory: {summary['out_dir']}")
    return "\n".join(lines)


def _threat_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) of the privacy spent and of the Byzantine clients, for the runs that have them."""
    lines = []
    dp = summary.get("dp")
    if dp:
        eps = summary.get("dp_epsilon")
        spent = "ε = ∞ (σ = 0: no privacy)" if eps is None else f"ε = {eps:.4g} at δ = {summary.get('dp_delta'):g}"
        lines.append(("differential privacy", f"{spent} after {summary.get('dp_releases')} releases per client "
                                              f"(C = {dp['clip']:g}, σ = {dp['noise']:g})"))
    if summary.get("byzantine_clients"):
        byzantine = len(summary["byzantine_clients"])
        lines.append(("Byzantine clients", f"{byzantine} of {byzantine + summary['honest_clients']} "
                                           f"(attack {summary.get('attack')}, aggregator {summary.get('aggregator')}); "
                                           "metrics over the honest ones"))
    return lines


def human_bytes(n: float) -> str:
    """`n` bytes as text in binary units (B, KiB, ..., TiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@dataclass(frozen=True)
class FinalParams:
    """The final parameters of a multi-process run as every rank wrote them (`where`: params.shards/), not yet read.

    `Result.params` calls `read` (`dfl.engine.checkpoint.read_final_params`: every row, onto the host) the first
    time it is used.
    """

    where: Path
    read: Callable[[], torch.Tensor]


@dataclass
class Result:
    """What `dfl.run` returns.

    The config it ran, the metrics of every evaluated round, the final and initial client parameters (rows
    `client_ids`) with their layout, summary.json and the run directory.

    In a single process, and on the main process of a multi-process run, `params` holds every client ([m, d], row i
    = client i). In a multi-process run with a run directory, every process wrote its own rows to params.shards/,
    and the main process's `params` reads them all back onto its host the first time it is used (nothing is held
    until then); with `gather_params = true`, or without a run directory, they were assembled there block by block
    at the end of the run. Every other process holds only its own block there (`client_ids`, the clients of its
    rows). `initial_params` is a read-only view of the common start x_0 repeated (`.clone()` it to write into it).
    """

    config: Config
    history: list[dict[str, Any]]  # one dict per evaluated round
    # [len(client_ids), d] final client parameters (CPU), row r = client client_ids[r]; read on first use when they
    # are on disk (`FinalParams`); not in repr, which would read them
    params: torch.Tensor = field(repr=False)
    initial_params: torch.Tensor  # [len(client_ids), d], a view of x_0
    param_names: list[str]  # flat layout: names in order (see `layout` for shapes and offsets)
    summary: dict[str, Any]
    layout: ParamLayout | None = None
    out_dir: Path | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    client_ids: list[int] | None = None  # the clients of the rows of params (None: all, in order)


def _params(self: Result) -> torch.Tensor:
    value = self.__dict__["params"]
    if isinstance(value, FinalParams):  # on disk: read once, on first use
        value = self.__dict__["params"] = value.read()
    return value


def _set_params(self: Result, value: torch.Tensor | FinalParams) -> None:
    self.__dict__["params"] = value


# `params` is a dataclass field (constructor, fields(), replace) whose value may stay on disk until it is used
Result.params = property(_params, _set_params)  # type: ignore[assignment]

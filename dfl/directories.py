"""The directories dfl writes into, and the rule that keeps it out of everyone else's.

Dfl writes only into a new (or empty) folder, or into a folder it made itself, and deletes only the files it wrote.

Every run, sweep and report directory carries a marker, `dfl-directory.json`, written when dfl makes (or adopts)
the directory:

    {"kind": "run", "dfl_version": "0.1.0", "created": "2025-01-31T12:00:00+00:00",
     "written_by_dfl": ["config.toml", "metrics.jsonl", ...]}

`kind` is "run", "sweep" or "report"; `written_by_dfl` lists the files dfl writes there (for the reader: what
`--overwrite` deletes is the list of `KINDS[kind].files` below, not the marker's copy). `check_output_directory`
is the rule for an `--out` directory, answered before anything is written (and, for `dfl run`, before torch
loads):

- missing, or empty (nothing but a marker and the temporaries of an interrupted atomic write): used;
- a directory whose marker says this kind: used (a run directory also needs `--overwrite` or `--resume`:
  `RunDirectoryExists`);
- a directory of this kind written by dfl before markers existed (`KINDS[kind].legacy`; e.g. a run directory:
  config.toml with dfl's fields, and summary.json, metrics.jsonl, checkpoint.pt or params.pt): adopted, as if it
  had the marker, which is written when dfl next writes there;
- anything else is refused with one line (`OutputPathError`), with or without `--overwrite`: a file, a path
  under a file, a directory of another kind, a marker that cannot be read, or a non-empty folder dfl did not
  make.

`--overwrite` (`remove_written`) deletes only the files of `KINDS[kind].files` (and the temporaries of their
atomic writes); any other file in the directory is left as it is. Torch-free.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dfl.errors import FileReadError, OutputPathError, RunDirectoryExists
from dfl.files import atomic_write_text, check_input_file, file_ancestor, read_json, read_text, read_toml

MARKER = "dfl-directory.json"

# the files of a run directory that a run writes (atomically: `.<name>.<random>` temporaries while it writes)
RUN_FILES = ("checkpoint.pt", "params.pt", "metrics.jsonl", "summary.json", "config.toml", "partition.json",
             "error.log",
             # the checkpoint's per-round shards (torch.distributed.checkpoint: its metadata and one file per rank)
             "checkpoint.shards/round-*/.metadata", "checkpoint.shards/round-*/*.distcp",
             # the final parameters of a multi-process run, every rank's own rows (the same format)
             "params.shards/.metadata", "params.shards/*.distcp")
# ... and what other commands add to it: `dfl landscape`, the TensorBoard logger
RUN_EXTRA_FILES = ("landscape.json", "plots/landscape.png", "tensorboard/events.out.tfevents.*")
SWEEP_FILES = ("sweep.toml", "sweep.json", "submitit/jobs.json")  # runs/<name>/ are run directories of their own
REPORT_FILES = ("report.md", "settings.csv", "runs.csv", "spectral.md", "spectral.csv", "plots/*.png")


@dataclass(frozen=True)
class Kind:
    """A kind of directory dfl writes.

    `files`, the paths (glob patterns, relative to the directory) dfl writes there, which `--overwrite` may delete;
    `legacy`, whether a directory without a marker is one of this kind written by a dfl from before markers; `what`, its
    name in messages.
    """

    name: str
    what: str
    files: tuple[str, ...]
    legacy: Callable[[Path], bool]


def _legacy_run(path: Path) -> bool:
    """Whether `path` is a run directory written before directories had markers.

    config.toml holding dfl's Config fields (algorithm, topology, rounds), next to one of the files a run
    writes as it goes.
    """
    if not any((path / name).is_file() for name in ("summary.json", "metrics.jsonl", "checkpoint.pt", "params.pt")):
        return False
    try:
        config = read_toml(path / "config.toml")
    except FileReadError:
        return False
    return all(key in config for key in ("algorithm", "topology", "rounds"))


def _legacy_sweep(path: Path) -> bool:
    """sweep.toml with a [vary] or [base] table, and sweep.json holding {"runs".

    [...]}; or nothing but runs/ holding nothing but run directories of dfl's (a sweep's runs without its files: no file
    of anyone else's).
    """
    if [entry.name for entry in path.iterdir()] == ["runs"] and (path / "runs").is_dir():
        runs = list((path / "runs").iterdir())
        return bool(runs) and all(directory_kind(run) == "run" for run in runs)
    try:
        spec, entries = read_toml(path / "sweep.toml"), read_json(path / "sweep.json")
    except FileReadError:
        return False
    return any(isinstance(spec.get(t), dict) for t in ("base", "vary")) and isinstance(entries.get("runs"), list)


def _legacy_report(path: Path) -> bool:
    """report.md starting with the heading dfl writes, next to runs.csv (or spectral.md and spectral.csv)."""
    for name, heading, table in (("report.md", "# Report: ", "runs.csv"),
                                 ("spectral.md", "# Spectral-gap study: ", "spectral.csv")):
        try:
            if (path / table).is_file() and read_text(path / name).startswith(heading):
                return True
        except FileReadError:
            continue
    return False


KINDS = {
    "run": Kind("run", "run directory", RUN_FILES + RUN_EXTRA_FILES, _legacy_run),
    "sweep": Kind("sweep", "sweep directory", SWEEP_FILES, _legacy_sweep),
    "report": Kind("report", "report directory", REPORT_FILES, _legacy_report),
}


# ---------------------------------------------------------------------------------------------- what a directory is
def read_marker(path: str | Path) -> dict | None:
    """The marker of directory `path` (None without one); `OutputPathError` for a marker dfl cannot read."""
    marker = Path(path) / MARKER
    if not marker.exists() and not marker.is_symlink():
        return None
    try:
        content = read_json(marker, "marker")
    except FileReadError as exc:
        raise OutputPathError(f"{exc}; dfl cannot tell whether it made {path}: choose another --out") from None
    if content.get("kind") not in KINDS:
        raise OutputPathError(f"marker {marker}: kind {content.get('kind')!r} is none of {', '.join(KINDS)}; dfl "
                              f"cannot tell whether it made {path}: choose another --out")
    return content


def directory_kind(path: str | Path) -> str | None:
    """The kind of directory dfl made at `path`, or None.

    "run", "sweep" or "report" for a directory dfl made (its marker, or a legacy directory of that kind), None
    for any other directory (or a path that is no directory).
    """
    path = Path(path)
    if not path.is_dir():
        return None
    marker = read_marker(path)
    if marker is not None:
        return marker["kind"]
    return next((name for name, kind in KINDS.items() if kind.legacy(path)), None)


def is_empty(path: str | Path) -> bool:
    """Nothing in the directory but a marker and the temporaries of atomic writes (`.<name>.<random>`)."""
    names = {Path(p).name for kind in KINDS.values() for p in kind.files} | {MARKER}
    return all(entry.name == MARKER or _is_temporary(entry.name, names) for entry in Path(path).iterdir())


def _is_temporary(name: str, names: set[str]) -> bool:
    return name.startswith(".") and any(name.startswith(f".{n}.") for n in names)


# ---------------------------------------------------------------------------------------------- the --out rule
def check_output_directory(path: str | Path, kind: str, *, option: str = "--out", overwrite: bool = False,
                           resume: bool = False, adopt_own_files: bool = False, subject: str | None = None) -> str:
    """Whether dfl may write a `kind` directory at `path` (see the module doc); nothing is written.

    Returns "new" (missing or empty), "ours" (its marker says `kind`) or "legacy" (a `kind` directory from before
    markers, or with `adopt_own_files` one that holds nothing but files named as dfl names them in a `kind` directory: a
    sweep adopts the run directories under its own runs/ that an earlier dfl left, e.g. only an error.log).

    Raises:
        OutputPathError: `path` is a file, lies under a file, is a directory of another kind or with an unreadable
            marker, or is a non-empty folder dfl did not make (whatever `overwrite` says).
        RunDirectoryExists: a run directory that holds a run, without `overwrite` or `resume`.

    `option` names the flag in the messages, `subject` the directory (default "OPTION PATH").
    """
    path = Path(path)
    spec = KINDS[kind]
    subject = subject or f"{option} {path}"
    _check_not_a_file(path, subject, option, spec.what)
    if not path.exists():
        return "new"
    marker = read_marker(path)
    found = marker["kind"] if marker is not None else None
    if found is None and not is_empty(path):
        found = directory_kind(path)
        if found is None and adopt_own_files and holds_only_written(path, kind):
            found = kind
        if found is None:
            remedy = f"choose another {option}" if not resume else "--resume continues only a run that dfl wrote"
            raise OutputPathError(
                f"{subject} is a folder that dfl did not make (no {MARKER}) and it is not empty: dfl writes "
                f"only into a new or empty folder or one it made, and never deletes files it did not write, "
                f"{'not even with --overwrite' if overwrite else 'with or without --overwrite'}; {remedy}")
        state = "legacy"
    else:
        state = "ours" if found is not None else "new"
    if found is not None and found != kind:
        raise OutputPathError(f"{subject} is a {KINDS[found].what}, not a {spec.what}: choose another {option}")
    if state == "ours" and is_empty(path):
        state = "new"
    if kind == "run" and state != "new" and not (overwrite or resume):
        raise RunDirectoryExists(
            f"run directory {path} already exists and is not empty; choose another --out, pass --overwrite to "
            f"replace it, or continue it with: dfl run --resume {path}")
    return state


def _check_not_a_file(path: Path, subject: str, option: str, what: str) -> None:
    """Refuse a `path` that is a file, a dangling symbolic link or lies under a file."""
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{subject} is a file, not a directory: choose another {option} for the {what}")
    if path.is_symlink() and not path.exists():
        raise OutputPathError(f"{subject} is a symbolic link to a missing target: choose another {option}")
    blocker = file_ancestor(path)
    if blocker is not None:
        raise OutputPathError(f"{subject}: {blocker} is a file, not a directory")


def holds_only_written(path: str | Path, kind: str) -> bool:
    """Whether every file under directory `path` is one dfl writes in a `kind` directory (or a temporary of one)."""
    path = Path(path)
    for entry in path.rglob("*"):
        if entry.is_dir() and not entry.is_symlink():
            continue
        relative = entry.relative_to(path).as_posix()
        if relative != MARKER and not _written(relative, KINDS[kind].files):
            return False
    return True


def _written(relative: str, patterns: tuple[str, ...]) -> bool:
    """Whether a relative path is one of `patterns` or an atomic write's temporary of one.

    Whether the relative path names one of `patterns` (globs such as "plots/*.png"), or a temporary file of
    an atomic write of one (".<name>.<random>" in the same folder).
    """
    folder, _, name = relative.rpartition("/")
    for pattern in patterns:
        where, _, glob = pattern.rpartition("/")
        if fnmatch.fnmatchcase(folder, where) and (fnmatch.fnmatchcase(name, glob)
                                                    or fnmatch.fnmatchcase(name, f".{glob}.*")):
            return True
    return False


def claim_directory(path: str | Path, kind: str, *, option: str = "--out", overwrite: bool = False,
                    resume: bool = False, adopt_own_files: bool = False, subject: str | None = None) -> Path:
    """Check the output directory, then create it and mark it as dfl's.

    `check_output_directory`, then make the directory (and its parents) and write its marker if it has none
    (a legacy directory is adopted). Returns the path.
    """
    path = Path(path)
    check_output_directory(path, kind, option=option, overwrite=overwrite, resume=resume,
                           adopt_own_files=adopt_own_files, subject=subject)
    path.mkdir(parents=True, exist_ok=True)
    if read_marker(path) is None:
        write_marker(path, kind)
    return path


def write_marker(path: str | Path, kind: str) -> None:
    """Write `path`/dfl-directory.json for a `kind` directory."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        dfl_version = version("dfl")
    except PackageNotFoundError:  # run from a source tree that is not installed
        dfl_version = "unknown"
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    content = {"kind": kind, "dfl_version": dfl_version, "created": created,
               "written_by_dfl": list(KINDS[kind].files)}
    atomic_write_text(Path(path) / MARKER, json.dumps(content, indent=2) + "\n")


def remove_written(path: str | Path, kind: str) -> list[Path]:
    """Delete the files dfl writes in a `kind` directory, and nothing else.

    Those are `KINDS[kind].files` and the temporaries of their atomic writes; nothing is deleted through a
    symbolic link (a link is removed, not its target). A folder of those files (e.g. plots/) is removed when that
    leaves it empty. Returns what was deleted.
    """
    path = Path(path)
    removed = []
    folders = sorted({pattern.rpartition("/")[0] for pattern in KINDS[kind].files})
    for folder in folders:  # a folder may be a glob (checkpoint.shards/round-*): each match, not through a link
        matches = [path / folder] if not folder else sorted(
            where for where in path.glob(folder) if not any(p.is_symlink() for p in _between(path, where)))
        for where in (path,) if not folder else matches:
            if not where.is_dir() or where.is_symlink():
                continue
            for entry in sorted(where.iterdir()):
                relative = entry.relative_to(path).as_posix()
                if (entry.is_symlink() or entry.is_file()) and _written(relative, KINDS[kind].files):
                    entry.unlink(missing_ok=True)
                    removed.append(entry)
            for emptied in _between(path, where)[::-1]:  # the folder, then its parents that it leaves empty
                if emptied.is_dir() and not emptied.is_symlink() and not any(emptied.iterdir()):
                    emptied.rmdir()
    return removed


def _between(root: Path, where: Path) -> list[Path]:
    """The folders from just below `root` down to `where` (e.g. checkpoint.shards, checkpoint.shards/round-2)."""
    parts = where.relative_to(root).parts
    return [root.joinpath(*parts[: i + 1]) for i in range(len(parts))]


# ---------------------------------------------------------------------------------------------- single output files
FIGURE_MARK = "dfl"  # the start of the Software (PNG) or Creator (SVG, PDF) text of every figure dfl draws
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MARK_BYTES = 1 << 16  # how much of a file's head (PNG, SVG) or tail (PDF: its Info dictionary) is searched


def figure_metadata(fmt: str) -> dict[str, str]:
    """The matplotlib `savefig(metadata=...)` that marks a figure of format `fmt` (png, svg, pdf) as dfl's.

    None for another format (its file is never recognised as dfl's, so it is never replaced).
    """
    key = {"png": "Software", "svg": "Creator", "pdf": "Creator"}.get(fmt)
    return {key: f"{FIGURE_MARK} (matplotlib)"} if key else {}


def figure_written_by_dfl(path: str | Path) -> bool:
    """Whether `path` is a figure dfl drew (`figure_metadata`).

    A PNG whose `Software` text (a tEXt chunk before the image data) starts with "dfl", an SVG whose Dublin Core creator
    is "dfl ...", or a PDF whose Info dictionary's /Creator is "dfl ...".
    """
    try:
        with open(check_input_file(path), "rb") as fh:
            head = fh.read(MARK_BYTES)
            size = fh.seek(0, 2)
            fh.seek(max(0, size - MARK_BYTES))
            tail = fh.read()
    except (FileReadError, OSError):
        return False
    mark = FIGURE_MARK.encode()
    if head.startswith(b"%PDF-"):
        return b"/Creator (" + mark in tail
    if head.lstrip().startswith(b"<?xml") and b"<svg" in head:
        creator = head.partition(b"<dc:creator>")[2].partition(b"</dc:creator>")[0]
        return b"<dc:title>" + mark in creator
    if not head.startswith(PNG_SIGNATURE):
        return False
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(head):
        length, chunk = int.from_bytes(head[pos:pos + 4], "big"), head[pos + 4:pos + 8]
        if chunk == b"IDAT":
            break
        if chunk == b"tEXt":
            key, _, value = head[pos + 8:pos + 8 + length].partition(b"\0")
            if key == b"Software" and value.startswith(mark):
                return True
        pos += 12 + length
    return False


def owned_by_directory(path: str | Path) -> bool:
    """Whether `path` is a file dfl wrote in the dfl directory it lies in.

    Whether `path` is one of the files dfl writes in a dfl directory it lies in (e.g. RUN/plots/landscape.png in
    a run directory, marked or legacy).
    """
    path = Path(path)
    for directory in list(path.parents)[:2]:
        try:
            kind = directory_kind(directory)
        except OutputPathError:
            return False
        if kind is not None:
            relative = path.relative_to(directory).as_posix()
            return any(fnmatch.fnmatchcase(relative, pattern) for pattern in KINDS[kind].files)
    return False


def check_output_plot(path: str | Path, option: str = "--out") -> Path:
    """`path` if dfl may write a plot there (nothing is written).

    Not a directory, not under a file, and either new or a file dfl wrote (a figure with dfl's mark, `figure_metadata`,
    or a plot file of a dfl directory).
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{option} {path} is a directory: give the path of the image file to write")
    blocker = file_ancestor(path)
    if blocker is not None:
        raise OutputPathError(f"{option} {path}: {blocker} is a file, not a directory")
    if (path.exists() or path.is_symlink()) and (path.is_symlink() or not (
            figure_written_by_dfl(path) or owned_by_directory(path))):
        raise OutputPathError(f"{option} {path} is an existing file that dfl did not write (dfl's figures carry "
                              f"{FIGURE_MARK} as Software or Creator in their metadata): choose another {option}, or "
                              "delete that file first")
    return path

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
atomic writes); any other file in the directory is left as it is.

Without `--out`, a command writes into a fresh directory under `runs/` of the current directory (`NewDirectory`,
`make_new_directory`): `runs/<stem>-<YYYYmmdd-HHMMSS>`, with `-2`, `-3`, ... when that name is taken (two commands
in the same second), made with an exclusive mkdir so that concurrent commands never share one. `<stem>` says what
wrote it (the run's name or algorithm, the sweep's name, `topology-<name>` for a drawing), the time is local, and
the names of one stem sort by time, so the latest is the last in `ls runs`. There is no `runs/latest` link: a link
is not portable (Windows needs a privilege for one), two commands finishing together would race to replace it,
and dfl would be replacing a file in a folder it shares with the user; each command prints the directory it
wrote, and `dfl run --resume` without a directory finds the latest interrupted run (`latest_resumable_run`).
Torch-free.
"""

from __future__ import annotations

import datetime
import fnmatch
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dfl.errors import FileReadError, OutputPathError, RunDirectoryExists
from dfl.files import atomic_write_text, check_input_file, file_ancestor, read_json, read_text, read_toml
from dfl.version import __version__ as dfl_version

MARKER = "dfl-directory.json"
RUNS = "runs"  # where a command without --out writes (relative to the current directory)
STAMP = "%Y%m%d-%H%M%S"  # the local time in a new directory's name
# a stem keeps letters, digits, '.', '_' and '-' (a run's name is already so: NAME_ALLOWED); anything else becomes '-'
_STEM_OUTSIDE = re.compile(r"[^A-Za-z0-9._-]+")
# summary.json's status of a run that did not end on its own: `dfl run --resume` continues it ("running": killed
# before it could record how it ended)
RESUMABLE_STATUSES = ("interrupted", "failed", "running")

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
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    content = {"kind": kind, "dfl_version": dfl_version, "created": created,
               "written_by_dfl": list(KINDS[kind].files)}
    atomic_write_text(Path(path) / MARKER, json.dumps(content, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- without --out
@dataclass
class NewDirectory:
    """A directory to make when the command first writes: `parent/<stem>-<YYYYmmdd-HHMMSS>[-N]` (`make`).

    What `dfl run` without --out passes to `dfl.run(out=...)`: the run makes it once its config is known to be good
    (under torchrun rank 0 makes it and the others are told its name), and removes it again when the run fails
    before writing anything there. `path` is the directory once made (None before).
    """

    stem: str
    parent: str | Path = RUNS
    path: Path | None = None
    made_parent: bool = False  # whether `make` made `parent` too (removed with the directory when left empty)

    def make(self, kind: str) -> Path:
        """Make and mark the directory (`make_new_directory`); its path, also kept in `path`."""
        self.made_parent = not Path(self.parent).exists()
        self.path = make_new_directory(kind, self.stem, self.parent)
        return self.path

    def remove_if_unused(self) -> None:
        """Remove the directory made by `make` when nothing but its marker is in it (a run that failed in set-up).

        `parent` goes too when `make` made it and nothing else is in it now.
        """
        if self.path is not None and self.path.is_dir() and not any(
                entry.name != MARKER for entry in self.path.iterdir()):
            (self.path / MARKER).unlink(missing_ok=True)
            self.path.rmdir()
            self.path = None
            if self.made_parent:
                try:
                    Path(self.parent).rmdir()  # only when empty: another command may have written there since
                except OSError:
                    pass

    def __str__(self) -> str:
        return str(self.path or Path(self.parent) / f"{safe_stem(self.stem)}-<YYYYmmdd-HHMMSS>")


def safe_stem(stem: str) -> str:
    """`stem` as a folder-name part: runs of characters other than letters, digits, '.', '_', '-' become '-'."""
    return _STEM_OUTSIDE.sub("-", stem).strip("-.") or "dfl"


def new_name(stem: str, parent: str | Path = RUNS, suffix: str = "", now: datetime.datetime | None = None):
    """The candidate paths `parent/<stem>-<time><suffix>`, then with -2, -3, ... before the suffix (endless)."""
    stamp = (now or datetime.datetime.now()).strftime(STAMP)
    base = f"{safe_stem(stem)}-{stamp}"
    return (Path(parent) / f"{base}{'' if n == 1 else f'-{n}'}{suffix}" for n in itertools.count(1))


def make_new_directory(kind: str, stem: str, parent: str | Path = RUNS, now: datetime.datetime | None = None) -> Path:
    """Make the first free `parent/<stem>-<YYYYmmdd-HHMMSS>[-N]` (an exclusive mkdir) and mark it as a `kind` one.

    `parent` is made when missing; a `parent` that is a file (or lies under one) is refused with `OutputPathError`.
    """
    parent = Path(parent)
    _check_not_a_file(parent, f"the folder {parent} of new directories", "--out", KINDS[kind].what)
    parent.mkdir(parents=True, exist_ok=True)
    for path in new_name(stem, parent, now=now):
        try:
            path.mkdir()
        except FileExistsError:  # taken (another command in the same second): the next number
            continue
        write_marker(path, kind)
        return path
    raise AssertionError("unreachable: new_name is endless")  # pragma: no cover


def reserve_new_file(stem: str, suffix: str, parent: str | Path = RUNS) -> Path:
    """Create the first free `parent/<stem>-<YYYYmmdd-HHMMSS>[-N]<suffix>` empty (exclusively) for the caller to fill.

    A drawing without --out: the caller writes the figure over the empty file it reserved (and removes it when it
    cannot).
    """
    parent = Path(parent)
    _check_not_a_file(parent, f"the folder {parent} of new files", "--out", "figure")
    parent.mkdir(parents=True, exist_ok=True)
    for path in new_name(stem, parent, suffix):
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable: new_name is endless")  # pragma: no cover


def run_directories(parent: str | Path = RUNS) -> list[Path]:
    """The run directories directly under `parent` (marked, or legacy), oldest first by their last write.

    The age of a run is its newest file among checkpoint.pt, metrics.jsonl, summary.json and the marker; a folder dfl
    cannot read is left out.
    """
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = []
    for entry in parent.iterdir():
        try:
            if entry.is_dir() and not entry.is_symlink() and directory_kind(entry) == "run":
                found.append(entry)
        except (OutputPathError, OSError):
            continue
    return sorted(found, key=lambda run: (_last_write(run), run.name))


def _last_write(run: Path) -> float:
    times = [(run / name).stat().st_mtime for name in ("checkpoint.pt", "metrics.jsonl", "summary.json", MARKER)
             if (run / name).is_file()]
    return max(times, default=0.0)


def run_state(run: Path) -> str:
    """summary.json's status of a run directory ("completed", "interrupted", ...), "no summary" or "unreadable"."""
    try:
        status = read_json(run / "summary.json", "summary").get("status")
    except FileReadError as exc:
        return "no summary" if not (run / "summary.json").exists() else f"unreadable ({str(exc)[:60]})"
    return status if isinstance(status, str) else "unreadable"


def latest_resumable_run(parent: str | Path = RUNS) -> Path:
    """The run under `parent` that `dfl run --resume` without a directory continues.

    The latest run directory (`run_directories`) that holds a checkpoint and config.toml and did not end on its own
    (summary.json says one of `RESUMABLE_STATUSES`, or there is none).

    Raises:
        OutputPathError: none is there; the message lists the runs that are (the latest few, with their status).
    """
    runs = run_directories(parent)
    for run in reversed(runs):
        if (run / "checkpoint.pt").is_file() and (run / "config.toml").is_file() and (
                run_state(run) in RESUMABLE_STATUSES or run_state(run) == "no summary"):
            return run
    if not runs:
        raise OutputPathError(f"--resume: no run directory under {parent}/ to resume: give the run's directory, "
                              "dfl run --resume DIR")
    latest = ", ".join(f"{run} ({run_state(run)}{'' if (run / 'checkpoint.pt').is_file() else ', no checkpoint'})"
                       for run in runs[::-1][:5])
    more = f" and {len(runs) - 5} older" if len(runs) > 5 else ""
    raise OutputPathError(f"--resume: no interrupted run under {parent}/ (the latest: {latest}{more}); a finished run "
                          "continues with more rounds when named: dfl run --resume DIR --rounds N")


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


FIGURE_FORMATS = (".png", ".svg", ".pdf")  # the figure files dfl writes: those whose metadata carry its mark


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
    if path.suffix.lower() not in FIGURE_FORMATS:  # a figure dfl can mark as its own (`figure_metadata`)
        raise OutputPathError(f"{option} {path}: unsupported extension {path.suffix or '(none)'!r}; use one of "
                              f"{', '.join(FIGURE_FORMATS)}")
    blocker = file_ancestor(path)
    if blocker is not None:
        raise OutputPathError(f"{option} {path}: {blocker} is a file, not a directory")
    if (path.exists() or path.is_symlink()) and (path.is_symlink() or not (
            figure_written_by_dfl(path) or owned_by_directory(path))):
        raise OutputPathError(f"{option} {path} is an existing file that dfl did not write (dfl's figures carry "
                              f"{FIGURE_MARK} as Software or Creator in their metadata): choose another {option}, or "
                              "delete that file first")
    return path

"""Files dfl reads and writes: one reader per text format, and the atomic writer of every file dfl writes.

Readers: `read_bytes`, `read_text` (UTF-8), `read_toml`, `read_json` and `read_jsonl` (one JSON object per line).
Each turns every failure into one `FileReadError` line, `<what> <path>: <reason>`, naming the file and what is
wrong with it: missing (or a broken symbolic link), a directory, a device or pipe (never opened: a FIFO would
block), no permission, empty, NUL bytes (a binary file), UTF-16 or another non-UTF-8 encoding (with the line and
column of the first bad byte), a syntax error (with its line and column), nesting too deep to parse, or the wrong
JSON type at the top (a list where an object is expected). Schemas beyond that belong to the module that owns
the file (`dfl.engine.results.read_metrics`, `dfl.workflows.sweep.read_entries`, ...), which raise the same
error class. Files of other formats are read where their format is known: torch files by
`dfl.engine.results.read_torch_file`, matrix and edge-list files by `topologies.graphs`, dataset files by their
loader in `dfl.data`.

Writers: `atomic_write_bytes` and `atomic_write_text` write a temporary file `.<name>.<random>` next to the
target, fsync it and rename it over the target, so a reader (or a run killed mid-write) never sees half a file;
`remove_stale_temporaries` deletes the temporaries a killed writer left. Both refuse, before writing anything, a
target that is a directory or whose parent is a file (`OutputPathError`, one line).

Torch-free: `dfl run`'s file checks answer before torch is imported.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dfl.errors import FileReadError, OutputPathError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "atomic_write_bytes", "atomic_write_text", "check_input_file", "check_output_file", "decode_text", "file_ancestor",
    "read_bytes", "read_json", "read_jsonl", "read_text", "read_toml", "remove_stale_temporaries",
]

_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


# ---------------------------------------------------------------------------------------------- reading
def check_input_file(path: str | Path, what: str = "file") -> Path:
    """`path` if it is a regular file dfl may open (following symbolic links); `FileReadError` otherwise.

    Missing, a broken link, under a file, a directory, a device, pipe or socket (never opened: a FIFO would block), or
    no permission to look.
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        broken = " (a symbolic link to a missing file)" if path.is_symlink() else ""
        raise FileReadError(path, f"does not exist{broken}", what) from None
    except NotADirectoryError:
        raise FileReadError(path, f"does not exist: {file_ancestor(path)} is a file, not a directory",
                            what) from None
    except OSError as exc:  # permission on a parent, a symbolic-link loop, a name too long, ...
        raise FileReadError(path, f"cannot be read: {exc.strerror or exc}", what) from None
    if stat.S_ISDIR(info.st_mode):
        raise FileReadError(path, "is a directory, not a file", what)
    if not stat.S_ISREG(info.st_mode):
        raise FileReadError(path, "is not a regular file (a device, pipe or socket)", what)
    return path


def read_bytes(path: str | Path, what: str = "file") -> bytes:
    """The bytes of the regular file `path` (`check_input_file`).

    `FileReadError` (one line naming it) when it cannot be read.
    """
    path = check_input_file(path, what)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise FileReadError(path, f"cannot be read: {exc.strerror or exc}", what) from None


def decode_text(data: bytes, path: str | Path, what: str = "file") -> str:
    """`data` as UTF-8 text (a leading byte-order mark dropped).

    `FileReadError` for UTF-16, another encoding or binary content, naming the line and column of the first bad byte.
    """
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or _looks_like_utf16(data):
        raise FileReadError(path, "is UTF-16 text; save it as UTF-8", what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start)
        raise FileReadError(path, f"is not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column "
                                  f"{column}; save it as UTF-8", what) from None
    if "\x00" in text:
        line, column = _position(data, data.index(b"\x00"))
        raise FileReadError(path, f"holds a NUL byte at line {line}, column {column}: a binary file, not text", what)
    return text


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of `path` (`read_bytes`, then `decode_text`)."""
    return decode_text(read_bytes(path, what), path, what)


def read_toml(path: str | Path, what: str = "TOML file") -> dict[str, Any]:
    """The table a TOML file holds.

    `FileReadError` for an unreadable file or a syntax error (with its line and column).
    """
    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FileReadError(path, f"is not valid TOML: {_one_line(exc)}", what) from None
    except RecursionError:
        raise FileReadError(path, "is not valid TOML: arrays or tables nested too deeply", what) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise FileReadError(path, f"is not valid TOML: {_one_line(exc)}", what) from None


def read_json(path: str | Path, what: str = "JSON file", expect: type | None = dict) -> Any:
    """The value a JSON file holds (NaN and Infinity accepted: dfl writes them).

    `FileReadError` for an unreadable, empty or invalid file, or when the value is not of type `expect` (None: any).
    """
    text = read_text(path, what)
    value = _parse_json(text, path, what)
    if expect is not None and not _is(value, expect):
        raise FileReadError(path, f"holds {_json_type(value)}, expected {_JSON_TYPES[expect]}", what)
    return value


def read_jsonl(path: str | Path, what: str = "JSON-lines file",
               check: Callable[[dict[str, Any]], str | None] | None = None) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, one per non-blank line.

    `FileReadError` naming the first line that is not a JSON object, or for which `check(record)` returns a problem (a
    phrase such as "has no round").
    """
    records = []
    for lineno, line in enumerate(read_text(path, what).splitlines(), start=1):
        if not line.strip():
            continue
        value = _parse_json(line, path, what, lineno)
        if not isinstance(value, dict):
            raise FileReadError(path, f"line {lineno} holds {_json_type(value)}, expected an object", what)
        problem = check(value) if check is not None else None
        if problem:
            raise FileReadError(path, f"line {lineno} {problem}", what)
        records.append(value)
    return records


def _parse_json(text: str, path: str | Path, what: str, lineno: int | None = None) -> Any:
    where = f"line {lineno} " if lineno is not None else ""
    if not text.strip():
        raise FileReadError(path, f"{where}is empty, expected JSON", what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"column {exc.colno}" if lineno is not None else f"line {exc.lineno}, column {exc.colno}"
        raise FileReadError(path, f"{where}is not valid JSON: {exc.msg} ({at})", what) from None
    except RecursionError:
        raise FileReadError(path, f"{where}is not valid JSON: nested too deeply", what) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise FileReadError(path, f"{where}is not valid JSON: {_one_line(exc)}", what) from None


def _is(value: Any, expect: type) -> bool:
    if expect in (int, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expect)


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _looks_like_utf16(data: bytes) -> bool:
    """UTF-16 text without a byte-order mark: ASCII in it puts a NUL in every other byte."""
    head = data[:200]
    return len(head) >= 4 and (head[1::2].count(0) >= len(head) // 2 - 1 or head[0::2].count(0) >= len(head) // 2 - 1)


def _position(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def file_ancestor(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` that is not a directory (None when every one is)."""
    for parent in path.parents:
        try:
            if parent.exists():
                return None if parent.is_dir() else parent
        except OSError:
            return None
    return None


# ---------------------------------------------------------------------------------------------- writing
def check_output_file(path: str | Path, what: str = "file") -> Path:
    """`path` if a file can be written there.

    It is not a directory and no existing ancestor is a file (those raise `OutputPathError`, before anything is
    written). Missing parent directories are fine: the writer makes them.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"cannot write {what} {path}: it is a directory; give a file path")
    blocker = file_ancestor(path)
    if blocker is not None:
        raise OutputPathError(f"cannot write {what} {path}: {blocker} is a file, not a directory")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # mkstemp makes 0600 files; run directories are meant to be shared


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically: a temporary file next to it, fsync, chmod to the umask's mode, rename."""
    path = check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of `text` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def remove_stale_temporaries(directory: str | Path, names: tuple[str, ...] | list[str]) -> list[Path]:
    """Delete the temporaries that killed atomic writes left in `directory`.

    Delete the temporaries (`.<name>.<random>`) that an atomic write of one of `names` in `directory` left
    when its process was killed; returns them. Only regular files are removed, never a symbolic link.
    """
    directory = Path(directory)
    removed = []
    for name in names:
        for tmp in directory.glob(f".{name}.*"):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    return removed

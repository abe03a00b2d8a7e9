"""Locating a dataset's official files under a user-given root, with errors that say what is expected."""

from __future__ import annotations

from pathlib import Path


def find_dir(dataset: str, root: str | Path, subdirs: tuple[str, ...], required: tuple[str, ...],
             layout: str, gz: bool = False) -> Path:
    """The first of root/<subdir> (in order) holding every file in `required` (each optionally .gz)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{dataset}: data root {str(root)!r} is not a directory. Expected layout: {layout}. "
            "Nothing is downloaded: put the official files there and pass root (config field data_root)."
        )
    tried = []
    for sub in subdirs:
        d = root / sub if sub else root
        tried.append(str(d))
        if all(find_file(d, name, gz) is not None for name in required):
            return d
    missing: list[str] = []  # report the candidate that came closest, if any holds some of the files
    for sub in subdirs:
        d = root / sub if sub else root
        absent = [n for n in required if find_file(d, n, gz) is None]
        if len(absent) < len(required) and (not missing or len(absent) < len(missing)):
            missing = absent
    detail = f" (missing there: {', '.join(missing)})" if missing else ""
    raise FileNotFoundError(
        f"{dataset}: no complete set of files under {str(root)!r}; looked in {', '.join(tried)}{detail}. "
        f"Expected layout: {layout}. Nothing is downloaded."
    )


def find_file(directory: Path, name: str, gz: bool) -> Path | None:
    """directory/name, or directory/name.gz when `gz`; the uncompressed file wins when both exist."""
    for candidate in (name, name + ".gz") if gz else (name,):
        path = directory / candidate
        if path.is_file():
            return path
    return None

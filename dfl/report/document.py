"""The skeleton every report shares.

The runs under a path loaded into settings, a Markdown file built part by part (a title, the tables, a note on runs not
completed, their list), the files written recorded by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfl.directories import check_output_directory, claim_directory
from dfl.errors import ReportError
from dfl.files import atomic_write_text
from dfl.report.runs import REPORT_DIR, RunRecord, load_runs, missing_sweep_runs
from dfl.report.settings import Setting, group_settings
from dfl.report.tables import NOT_COMPLETED_MARK, markdown_table


@dataclass
class ReportDocument:
    """A Markdown report of the runs under `path` being written into `out_dir`.

    `runs` are every run found, `settings` those with metrics grouped by setting, `missing` the runs a sweep
    under `path` lists but that have no run directory; `parts` are the Markdown sections so far (empty ones are
    left out when written) and `files` the files written, by name.
    """

    path: Path
    out_dir: Path
    runs: list[RunRecord]
    settings: list[Setting]
    missing: list[dict[str, Any]]
    parts: list[str] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path, out: str | Path | None, title: str) -> ReportDocument:
        """Load the runs under `path` and claim the report directory `out` (default PATH/report/).

        The directory must be new or empty, or a report directory dfl made (`dfl.directories`); anything else is
        refused before the runs are read. The document starts with `# {title}: {path}`.

        Raises:
            ReportError: when `path` is not a directory.
        """
        path = Path(path)
        if not path.is_dir():
            what = "does not exist" if not path.exists() else "is neither a run directory nor a directory holding " \
                "run directories"
            raise ReportError(f"path {path} {what}")
        out_dir = Path(out) if out is not None else path / REPORT_DIR
        check_output_directory(out_dir, "report")
        runs = load_runs(path, skip=[out_dir])
        settings = group_settings(runs)
        claim_directory(out_dir, "report")
        return cls(path, out_dir, runs, settings, missing_sweep_runs(path, runs), [f"# {title}: {path}\n"])

    @property
    def plot_dir(self) -> Path:
        """Where the report's plots go: OUT/plots/."""
        return self.out_dir / "plots"

    def add(self, text: str) -> None:
        """Append a Markdown section (a paragraph or a table and its heading)."""
        self.parts.append(text)

    def add_no_metrics(self) -> None:
        """The whole body of a report whose runs have no metrics yet: the count and the runs not completed."""
        self.add(f"{len(self.runs)} run(s), none in the tables yet (Runs not completed says why).\n")
        self.add_not_completed()

    def add_not_completed_mark(self) -> None:
        """Say what the mark on a cell means, when some setting includes runs that are not completed."""
        if not all(s.completed for s in self.settings):
            self.add(f"{NOT_COMPLETED_MARK} includes runs that are not completed (see Runs not completed).\n")

    def add_not_completed(self) -> None:
        """The "Runs not completed" section.

        Runs not finished or without metrics, and runs a sweep lists but that have no run directory (nothing when every
        run is complete).
        """
        body = []
        for r in self.runs:
            if not r.finished or not r.metrics:
                done = f"{r.summary.get('rounds_completed', '?')}/{r.summary.get('rounds', '?')}"
                errors = [str(r.summary["error"])] if r.summary.get("error") else []
                note = "; ".join([*r.problems, *errors])
                status = "running or interrupted" if r.status == "running" else r.status
                body.append([r.name, status, done, note or ""])
        for e in self.missing:
            body.append([str(e.get("dir")), f"{e.get('status', 'unknown')} (no run directory)", "0/?",
                         str(e.get("error") or "")])
        if body:
            self.add("## Runs not completed\n\n" + markdown_table(["run", "status", "rounds", "note"], body) + "\n")

    def add_file(self, name: str, path: Path) -> None:
        """Record a file the report wrote (a plot, a CSV file) under `name`."""
        self.files[name] = path

    def write(self, name: str) -> None:
        """Write the Markdown built so far as OUT/`name`."""
        self.files[name] = self.out_dir / name
        atomic_write_text(self.files[name], "\n".join(part for part in self.parts if part))

    def written(self) -> dict[str, Path]:
        """The files written, by name: tables first, then plots."""
        return dict(sorted(self.files.items(), key=lambda kv: kv[0].endswith(".png")))

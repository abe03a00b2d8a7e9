"""The docs' "Bad input" table (docs/reference/bad-input.md) is true: each command exits as stated with the
stated message."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from dfl.cli import main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "bad-input.md"


def table_rows() -> list[tuple[str, list[str], int]]:
    section = PAGE.read_text()
    rows = []
    for line in section.splitlines():
        match = re.match(r"\| `(dfl [^`]+)` \| (.+) \|$", line)
        if match:
            command, outcome = match.groups()
            messages = [m.replace("…", "").strip() for m in re.findall(r"`([^`]+)`", outcome)]
            code = int(re.search(r"\(exit (\d+)", outcome).group(1))
            rows.append((command, messages, code))
    return rows


def test_the_table_is_not_empty():
    assert len(table_rows()) >= 10


@pytest.mark.parametrize("command,messages,code", table_rows(), ids=[r[0] for r in table_rows()])
def test_bad_input_row(command, messages, code, capsys, tmp_path):
    argv = shlex.split(command)[1:]
    if argv[0] == "run":
        argv += ["--rounds", "1", "--out", str(tmp_path / "run"), "--no-progress"]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors (unknown options) exit from the parser
        status = exc.code
    assert status == code
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    for message in messages:
        assert message in err
    assert not (tmp_path / "run").exists()

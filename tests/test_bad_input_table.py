"""The docs' "Bad input" page (docs/reference/bad-input.md) is true: each input of it prints the message and exit
status its row shows (`docs/gen_bad_input.py` writes the rows by running the same cases), as one error line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gen_bad_input", ROOT / "docs" / "gen_bad_input.py")
gen = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gen
spec.loader.exec_module(gen)

CASES = [case for _, _, family in gen.FAMILIES for case in family] + gen.API


def rows() -> list[str]:
    return [line for line in gen.PAGE.read_text().splitlines() if line.startswith("| `")]


def test_the_page_has_a_row_per_case_and_no_other():
    assert len(rows()) == len(CASES) >= 60


@pytest.mark.parametrize("case", CASES, ids=[c.command[:60] for c in CASES])
def test_each_row_is_what_its_input_prints(case):
    assert gen.row(case) in rows()
    outcome, message, stderr = gen.run(case)
    assert message and "\n" not in message and "Traceback" not in stderr
    if case.command.startswith("dfl "):
        errors = [line for line in stderr.splitlines() if "error:" in line]
        assert len(errors) == 1, stderr

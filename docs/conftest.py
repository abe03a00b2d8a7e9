"""The executed examples of the docs (pytest-markdown-docs runs every ```python block of README.md and docs/):
each runs in a fresh temporary directory, so a run directory it writes (runs/...) lands there."""

import pytest


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

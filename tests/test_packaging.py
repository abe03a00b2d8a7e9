"""Ready to publish: the version is written once (dfl/version.py, read as dfl.__version__), and the package's
metadata, CITATION.cff and the marker of the directories dfl writes agree with it; the licence pyproject.toml declares
is the LICENSE file's."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import yaml

import dfl
from dfl.config import read_toml

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "dfl-sim"  # `dfl` on the package index is another project; the import name stays dfl


def test_the_version_is_written_once_and_read_everywhere():
    project = read_toml(ROOT / "pyproject.toml")
    assert project["project"]["name"] == DISTRIBUTION
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dfl.version.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", dfl.__version__)
    assert importlib.metadata.version(DISTRIBUTION) == dfl.__version__  # the installed metadata reads it
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["version"] == dfl.__version__


def test_the_licence_is_the_one_declared():
    project = read_toml(ROOT / "pyproject.toml")["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "the dfl developers" in text
    assert yaml.safe_load((ROOT / "CITATION.cff").read_text())["license"] == "MIT"


def test_the_changelog_keeps_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and "keepachangelog.com" in text
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert headings and headings[0] == "Unreleased", headings
    assert all(h == "Unreleased" or re.fullmatch(r"\d+\.\d+\.\d+", h) for h in headings)

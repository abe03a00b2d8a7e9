"""The executed examples of the docs (pytest-markdown-docs runs every ```python block of README.md and docs/):
each runs in a fresh temporary directory, so a run directory it writes (runs/...) lands there, and what an
example registers (a model, a dataset, a topology, ...) is forgotten after it, so examples do not leak into
each other or into later tests."""

import pytest


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _registries_restored():
    from dfl.algorithms import ALGORITHMS
    from dfl.data import DATASETS, PARTITIONS
    from dfl.loggers import LOGGERS
    from dfl.models import MODELS
    from dfl.network.compression import COMPRESSORS
    from dfl.topologies import TOPOLOGIES

    registries = (ALGORITHMS, DATASETS, PARTITIONS, LOGGERS, MODELS, COMPRESSORS, TOPOLOGIES)
    saved = [(r, dict(r._table), dict(r._sources)) for r in registries]
    yield
    for registry, table, sources in saved:
        registry._table.clear()
        registry._table.update(table)
        registry._sources.clear()
        registry._sources.update(sources)

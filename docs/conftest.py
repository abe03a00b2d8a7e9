"""The executed examples of the docs (pytest-markdown-docs runs every ```python block of README.md and docs/):
what an example registers (a model, a dataset, a topology, ...) is forgotten after it, so examples do not leak
into each other or into later tests. Each runs in a fresh temporary directory (the root conftest.py's
`tests.cwd_guard`, as every test), so a run directory it writes (runs/...) lands there."""

import pytest


@pytest.fixture(autouse=True)
def _registries_restored():
    from dfl.algorithms import ALGORITHMS
    from dfl.data import DATASETS, PARTITIONS
    from dfl.graphs import TOPOLOGIES
    from dfl.loggers import LOGGERS
    from dfl.models import MODELS
    from dfl.network.byzantine_settings import AGGREGATORS, ATTACKS
    from dfl.network.settings import COMPRESSORS

    registries = (ALGORITHMS, DATASETS, PARTITIONS, LOGGERS, MODELS, COMPRESSORS, TOPOLOGIES, ATTACKS, AGGREGATORS)
    # _lazy too: a built-in declared but not yet imported is None in _table until an example's `get` resolves it
    # (and drops it from _lazy); restoring _table alone would leave None there for every later example.
    fields = ("_table", "_sources", "_lazy", "_cards")
    saved = [(r, [dict(getattr(r, f)) for f in fields]) for r in registries]
    yield
    for registry, tables in saved:
        for field, table in zip(fields, tables):
            getattr(registry, field).clear()
            getattr(registry, field).update(table)

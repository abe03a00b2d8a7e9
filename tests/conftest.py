"""The `device` the engine tests run on: DFL_TEST_DEVICE (default "cpu"), e.g. `DFL_TEST_DEVICE=cuda pytest tests`.

Tests that pin engine correctness (vectorized = sequential reference, gossip exactness, the algorithms'
identities, precision, compile) take `device`; tests that are CPU by nature (gloo process groups, files)
do not. Asking for CUDA where there is none fails those tests (setup error), it never skips them: whoever
set DFL_TEST_DEVICE=cuda wants to know that the GPU path was not exercised.
"""

from __future__ import annotations

import os

import dfl.threads  # before torch: the OpenMP wait of dfl's rule (GOMP_SPINCOUNT) applies to the tests too

# isort: split
import pytest
import torch
from hypothesis import settings

ENV = "DFL_TEST_DEVICE"

# no example database: hypothesis would keep one in .hypothesis/ of the current directory (tests write only under
# tmp_path, tests/cwd_guard.py); the property tests are derandomized (the same examples every run) anyway
settings.register_profile("dfl", database=None)
settings.load_profile("dfl")


def share_cores_between_workers() -> None:
    """Under pytest-xdist (`-n auto`), give each worker its share of the cores.

    The share holds for the worker and the processes it starts (`dfl run`, torchrun, sweeps read OMP_NUM_THREADS
    through `threads = "auto"`), as a sweep's pool shares them between its workers (`dfl.threads.share`): two
    workers of two torch threads each on two cores spin against each other and the suite is no faster than one
    worker (measured: 628 s either way; one thread per worker: 459 s).

    Without xdist the suite runs on one thread too: the multi-process tests fork their workers (`tests.helpers.spawn`),
    and a child forked after the parent's OpenMP pool started can hang on that pool's locks (seen in
    tests/test_distributed.py run on its own, without `-n`).
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    n = dfl.threads.share(workers) if workers > 1 else 1
    os.environ.update({name: str(n) for name in dfl.threads.COUNT_VARIABLES})
    torch.set_num_threads(n)


share_cores_between_workers()


def requested_device() -> str:
    """The device the engine tests ask for: DFL_TEST_DEVICE, "cpu" when unset or blank."""
    return os.environ.get(ENV, "cpu").strip() or "cpu"


def pytest_report_header(config):
    """Say in pytest's header which device the engine tests run on and whether CUDA is there."""
    return f"dfl test device: {requested_device()} ({ENV}; cuda available: {torch.cuda.is_available()})"


@pytest.fixture
def device():
    """The device name ("cpu", "cuda", "cuda:1"), a str so it fits `Config(device=...)` as well as `.to()`.

    On CUDA the fixture turns TF32 off for matmuls and cuDNN (dfl's default precision "fp32" does the same in
    `dfl.run`, but tests that build a LocalTrainer directly would otherwise get cuDNN's TF32 convolutions),
    asks cuDNN for deterministic kernels, and restores the previous settings afterwards.
    """
    name = requested_device()
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        pytest.fail(f"{ENV}={name!r} is not a torch device: {exc}", pytrace=False)
    if dev.type not in ("cpu", "cuda"):
        pytest.fail(f"{ENV}={name!r}: dfl runs on cpu or cuda", pytrace=False)
    if dev.type == "cpu":
        yield name
        return
    if not torch.cuda.is_available():
        pytest.fail(f"{ENV}={name!r} but torch.cuda.is_available() is False (torch {torch.__version__}, "
                    f"CUDA build {torch.version.cuda}): the GPU path was NOT tested", pytrace=False)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        pytest.fail(f"{ENV}={name!r} but this machine has {torch.cuda.device_count()} GPU(s)", pytrace=False)
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.deterministic)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    try:
        yield name
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.deterministic) = saved


@pytest.fixture
def slack(device) -> float:
    """Factor on the tolerances of comparisons between two *different* fp32 computations (engine vs reference).

    1 on the CPU. On CUDA, with TF32 off (see `device`), both sides are true fp32, but cuBLAS/cuDNN pick other
    kernels and reduction orders for the batched (vmapped) and the per-client shapes, so round-off differs
    more than between CPU kernels: the bounds are 10x looser there. Comparisons of one computation with
    itself (same config twice, identities that run the same kernels) keep their tolerances.
    """
    return 1.0 if torch.device(device).type == "cpu" else 10.0

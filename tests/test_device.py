"""Device discipline without a GPU: a tensor the engine hands to a kernel or a collective is on the run's
device, in every engine path (synchronous rounds, asynchronous mode, CHOCO, link faults, checkpoint, resume,
evaluation), in a world of one and of two processes.

On a GPU a tensor made without naming its device lands on the CPU, where NCCL refuses it (or a kernel does); on
the CPU the same mistake goes unnoticed, because the run's device *is* the default one. Here the default device is
made a foreign one, `meta`, while the engine runs its phases (`strict_devices`): a tensor created without a device
now lands on meta, and the first kernel that mixes it with the run's CPU tensors fails, as does the multi-process
communicator's boundary check (`DistributedCommunicator._check` raises `DeviceMismatch` for any tensor not on its
device). The set-up (data, model) runs normally; the round loop, the evaluation, the checkpoint, the final
parameters and the resume run strictly.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dfl
from dfl.config import Config
from dfl.engine import checkpoint as ckpt
from dfl.engine.asynchronous import EMPTY, AsyncEngine
from dfl.engine.experiment import Experiment
from dfl.errors import DeviceMismatch
from tests.helpers import blob_data, init_gloo, tiny_config

pytestmark = pytest.mark.timeout(300)  # hang guard only (spawned process groups)

CLIENTS = 6
PHASES = ("train_round", "evaluate", "checkpoint", "save_params", "result")
CASES = {
    "sync-personal": dict(algorithm="dfedsam-mgs", topology="ring", gossip_steps=2, local_test_fraction=0.3),
    "async-dfedsam": dict(algorithm="dfedsam", mode="async", link_latency=0.3, stragglers=0.5),
    "async-dpsgd": dict(algorithm="dpsgd", mode="async", max_staleness=1),
    "choco-link-faults": dict(algorithm="dfedavg", compressor="random-k", compression=0.3, link_failure=0.3,
                              offline=0.1),
    "scaffold-participation": dict(algorithm="scaffold", participation=0.5),
}


@contextmanager
def strict_devices():
    """The engine's phases run with `meta` as the default device (module docstring)."""
    originals = {name: getattr(Experiment, name) for name in PHASES}
    original_restore = ckpt.restore

    def strict(fn):
        def run(*args, **kwargs):
            with torch.device("meta"):
                return fn(*args, **kwargs)
        return run

    for name, fn in originals.items():
        setattr(Experiment, name, strict(fn))
    ckpt.restore = strict(original_restore)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(Experiment, name, fn)
        ckpt.restore = original_restore


make_data = partial(blob_data, sizes=[6 + i % 3 for i in range(CLIENTS)], cyclic_test_labels=True)


def make_config(case: str, rounds: int) -> Config:
    """`tiny_config` with CASES[case], seed 2, for `rounds` rounds."""
    return tiny_config(seed=2, rounds=rounds, **CASES[case])


def interrupted_and_resumed(case: str, out: Path) -> dfl.Result:
    dfl.run(make_config(case, 2), data=make_data(), out=out)
    return dfl.run(make_config(case, 3), data=make_data(), out=out, resume=True)


# ------------------------------------------------------------------------------------------------ world of one
@pytest.mark.parametrize("case", CASES)
def test_every_engine_path_names_its_devices(tmp_path, case):
    reference = dfl.run(make_config(case, 3), data=make_data())
    with strict_devices():
        result = interrupted_and_resumed(case, tmp_path / "run")
    torch.testing.assert_close(result.params, reference.params, atol=0, rtol=0)


def test_the_strict_default_device_catches_a_tensor_made_without_its_device(tmp_path, monkeypatch):
    """A device bug put back: `message_versions` making the checkpoint's versions with torch.full(...), no device."""
    def message_versions(self):
        return torch.full((self.X.shape[0], self.versions_kept()), EMPTY, dtype=torch.long)  # the CPU on a GPU run

    from torch.distributed.checkpoint import CheckpointException

    monkeypatch.setattr(AsyncEngine, "message_versions", message_versions)
    with strict_devices(), pytest.raises((RuntimeError, NotImplementedError, CheckpointException), match="meta"):
        dfl.run(make_config("async-dfedsam", 2), data=make_data(), out=tmp_path / "run")


# ------------------------------------------------------------------------------------------------ world of two
def _worker(rank, world, rdzv, root):
    init_gloo(rank, world, rdzv)
    try:
        reports = {}
        for case in CASES:
            with strict_devices():
                try:
                    result = interrupted_and_resumed(case, Path(root) / case)
                    reports[case] = {"params": result.params.tolist(), "ids": result.client_ids}
                except Exception as exc:  # the test shows what failed where
                    reports[case] = {"error": f"{type(exc).__name__}: {exc}"}
        Path(root, f"rank{rank}.json").write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


def test_every_engine_path_names_its_devices_across_processes(tmp_path):
    references = {case: dfl.run(make_config(case, 3), data=make_data()).params for case in CASES}
    mp.start_processes(_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    for rank in range(2):
        reports = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for case, report in reports.items():
            assert "error" not in report, f"rank {rank} {case}: {report.get('error')}"
            got = torch.tensor(report["params"], dtype=torch.float32)
            np.testing.assert_allclose(got.numpy(), references[case][report["ids"]].numpy(), atol=1e-5,
                                       err_msg=f"rank {rank} {case}")


def _boundary_worker(rank, world, rdzv, root):
    from dfl.engine.distributed import DistributedCommunicator

    init_gloo(rank, world, rdzv)
    messages = []
    try:
        comm = DistributedCommunicator(4, device=torch.device("cpu"))
        X = torch.ones(2, 3)
        for name, call in (("sum", lambda: comm.sum(torch.zeros(3, device="meta"))),
                           ("mean_rows", lambda: comm.mean_rows(X.to("meta"))),
                           ("gather_rows", lambda: comm.gather_rows(X.to("meta"))),
                           ("assemble_rows", lambda: comm.assemble_rows(X.to("meta"))),
                           ("exchange_rows", lambda: comm.exchange_rows(X, torch.zeros(0, dtype=torch.long,
                                                                                       device="meta"),
                                                                        [0, 0], [0, 0], 0))):
            try:
                call()
                messages.append(f"{name}: no error")
            except DeviceMismatch as exc:
                messages.append(str(exc))
        comm.close()
        Path(root, f"rank{rank}.json").write_text(json.dumps(messages))
    finally:
        dist.destroy_process_group()


def test_the_communicator_boundary_refuses_a_tensor_on_another_device(tmp_path):
    mp.start_processes(_boundary_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    for rank in range(2):
        messages = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name, message in zip(("sum", "mean_rows", "gather_rows", "assemble_rows", "exchange_rows"), messages):
            assert message.startswith(f"{name}: a ") and "on meta was handed to the communicator, whose device is " \
                "cpu" in message, message
            assert "\n" not in message

"""Sharded checkpoints: every process writes and reads only its own rows (torch.distributed.checkpoint
with row-offset chunks), a resume reshards to any number of processes, no process gathers the client stack,
checkpoints of the single-file format before still resume, and a broken shard is one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dfl
from dfl.cli import main
from dfl.config import Config
from dfl.engine import checkpoint as ckpt
from dfl.engine.results import read_metrics
from dfl.errors import CheckpointError
from dfl.network.comm import even_blocks
from tests.helpers import blob_data, init_gloo, tiny_config

pytestmark = pytest.mark.timeout(300)  # hang guard only (spawned process groups)

CLIENTS = 7  # uneven blocks on 2 and 3 processes
TIMING = {"seconds_per_round", "bytes_moved", "bytes_moved_round"}
SHARDS_RUN = dict(seed=4, clients=CLIENTS, algorithm="scaffold", participation=0.6)


def make_data():
    """7 clients of 6 to 8 rows (seed 5)."""
    return blob_data([6 + i % 3 for i in range(CLIENTS)], cyclic_test_labels=True, seed=5)


def make_config(rounds: int, **changes) -> Config:
    """`tiny_config` with SCAFFOLD on 7 clients, 60 % participating, for `rounds` rounds."""
    return tiny_config(rounds=rounds, **{**SHARDS_RUN, **changes})


def _start_worker(rank, world, rdzv, root):
    """Three rounds in `world` processes, recording the shape of every tensor gathered to all ranks."""
    from dfl.engine.distributed import DistributedCommunicator

    init_gloo(rank, world, rdzv)
    gathered = []
    original = DistributedCommunicator.gather_rows

    def gather_rows(self, X):
        gathered.append(list(X.shape))
        return original(self, X)

    DistributedCommunicator.gather_rows = gather_rows
    try:
        dfl.run(make_config(3), data=make_data(), out=Path(root) / "run")
        Path(root, f"gathered-r{rank}.json").write_text(json.dumps(gathered))
    finally:
        DistributedCommunicator.gather_rows = original
        dist.destroy_process_group()


def _resume_worker(rank, world, rdzv, root):
    init_gloo(rank, world, rdzv)
    try:
        result = dfl.run(make_config(5), data=make_data(), out=Path(root) / "run", resume=True)
        torch.save({"params": result.params, "ids": result.client_ids, "initial": result.initial_params.clone()},
                   Path(root) / f"resumed-r{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_shards_are_written_per_rank_and_a_resume_reshards(tmp_path):
    reference = dfl.run(make_config(5), data=make_data())
    two = tmp_path / "two"
    mp.start_processes(_start_worker, args=(2, str(tmp_path / "rdzv2"), str(two)), nprocs=2, join=True,
                       start_method="fork")
    for rank in range(2):  # per-client metrics ([m] vectors) only: never a stack of models
        shapes = json.loads((two / f"gathered-r{rank}.json").read_text())
        assert shapes and all(len(s) == 1 for s in shapes), shapes
    manifest = ckpt.load(two / "run")
    assert manifest["format"] == ckpt.FORMAT and manifest["processes"] == 2 and manifest["clients"] == CLIENTS
    shards = two / "run" / manifest["shards"]
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert sorted(manifest["rows"]) == ["client_state.ci", "params"]
    one, three = tmp_path / "one", tmp_path / "three"
    for target in (one, three):
        (target / "run").parent.mkdir(parents=True)
        import shutil

        shutil.copytree(two / "run", target / "run")
    # 2 processes -> 3 processes
    mp.start_processes(_resume_worker, args=(3, str(tmp_path / "rdzv3"), str(three)), nprocs=3, join=True,
                       start_method="fork")
    for rank in range(3):
        got = torch.load(three / f"resumed-r{rank}.pt")
        assert got["ids"] == (list(range(CLIENTS)) if rank == 0 else list(even_blocks(CLIENTS, 3)[rank]))
        torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0)
        assert torch.equal(got["initial"], reference.initial_params[got["ids"]])  # x_0 per block: bit for bit
    # 2 processes -> 1 process
    resumed = dfl.run(make_config(5), data=make_data(), out=one / "run", resume=True)
    torch.testing.assert_close(resumed.params, reference.params, atol=1e-5, rtol=0)
    assert [h["round"] for h in read_metrics(one / "run")] == [1, 2, 3, 4, 5]
    saved = ckpt.read(one / "run")  # the final checkpoint, written by the one process
    torch.testing.assert_close(saved["params"], reference.params, atol=1e-5, rtol=0)


def test_a_process_reads_only_the_chunks_overlapping_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "ROW_CHUNK_BYTES", 1)  # one row per stored chunk
    dfl.run(make_config(2), data=make_data(), out=tmp_path / "run")
    manifest = ckpt.load(tmp_path / "run")
    from torch.distributed.checkpoint import planner_helpers

    reads = []
    original = planner_helpers.create_read_items_for_chunk_list

    def counting(fqn, md, chunks):
        items = original(fqn, md, chunks)
        reads.append((fqn, len(md.chunks), len(items)))
        return items

    monkeypatch.setattr(planner_helpers, "create_read_items_for_chunk_list", counting)
    rows = ckpt.read_rows(manifest, 3, 5)
    assert sorted(reads) == [("client_state.ci", CLIENTS, 2), ("params", CLIENTS, 2)]
    whole = ckpt.read(tmp_path / "run")
    torch.testing.assert_close(rows["params"], whole["params"][3:5], atol=0, rtol=0)


def test_a_checkpoint_of_the_single_file_format_still_resumes(tmp_path):
    data = make_data()
    reference = dfl.run(make_config(4), data=data)
    out = tmp_path / "run"
    dfl.run(make_config(2), data=data, out=out)
    legacy = ckpt.read(out)  # what the single-file format held: every row in checkpoint.pt
    legacy = {k: v for k, v in legacy.items() if k not in ("rows", "shards", "clients", "processes")}
    legacy["format"] = ckpt.LEGACY_FORMAT
    ckpt.remove(out)
    torch.save(legacy, out / ckpt.FILENAME)
    resumed = dfl.run(make_config(4), data=data, out=out, resume=True)
    torch.testing.assert_close(resumed.params, reference.params, atol=0, rtol=0)
    assert ckpt.load(out)["format"] == ckpt.FORMAT  # the checkpoints it writes are the sharded format


def test_a_save_killed_before_its_manifest_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    data = make_data()
    out = tmp_path / "run"
    dfl.run(make_config(2), data=data, out=out)
    from dfl.engine import results

    def killed(path, obj):
        raise KeyboardInterrupt  # the kill: after the round-3 shards, before the manifest names them

    monkeypatch.setattr(results, "atomic_torch_save", killed)
    with pytest.raises(KeyboardInterrupt):
        dfl.run(make_config(3), data=data, out=out, resume=True)
    monkeypatch.undo()
    assert ckpt.load(out)["round"] == 2 and (out / ckpt.SHARDS / "round-000003").is_dir()
    resumed = dfl.run(make_config(3), data=data, out=out, resume=True)
    assert [p.name for p in (out / ckpt.SHARDS).iterdir()] == ["round-000003"]
    torch.testing.assert_close(resumed.params, dfl.run(make_config(3), data=data).params, atol=0, rtol=0)


@pytest.mark.parametrize("damage", ["truncated shard", "no metadata"])
def test_a_broken_shard_is_one_line_naming_the_file(tmp_path, capsys, damage):
    out = tmp_path / "run"
    dfl.run(make_config(2), data=make_data(), out=out)
    shards = out / ckpt.load(out)["shards"]
    if damage == "truncated shard":
        target = shards / "__0_0.distcp"
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target = shards / ".metadata"
        target.unlink()
    with pytest.raises(CheckpointError) as info:
        dfl.run(make_config(3), data=make_data(), out=out, resume=True)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"checkpoint {target} is unreadable (")
    assert "--overwrite" in message
    (out / "config.toml").write_text(make_config(3).to_toml())
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(target) in err, err


@pytest.mark.parametrize("world", [1, 2, 3])
def test_each_block_starts_from_the_rows_of_the_whole_stack(world):
    from dfl.models import build_model
    from dfl.training.clients import common_start, initial_stack

    torch.manual_seed(0)
    model = build_model("mlp", (5,), 3, hidden=[6])
    whole = initial_stack(model, CLIENTS, torch.device("cpu"))
    for block in even_blocks(CLIENTS, world):
        part = common_start(model, len(block), torch.device("cpu"))
        assert torch.equal(part, whole[block.start:block.stop])
        assert part.clone().is_contiguous() and part.untyped_storage().nbytes() == whole[0].numel() * 4  # one row

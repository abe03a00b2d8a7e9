"""Every file dfl reads is read by one reader per format that answers a bad file with one `FileReadError` line
naming the file (dfl.files, dfl.engine.results.read_torch_file, topologies.graphs, the dataset loaders); sizes
read from a file's header are checked before anything is allocated; every writer refuses a target it must not
replace. Hypothesis feeds each reader garbage bytes and truncations of valid files (bounded example counts)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dfl.data.cifar import load_cifar10
from dfl.data.idx import IMAGES_MAGIC, LABELS_MAGIC, load_mnist, read_idx
from dfl.engine.results import read_metrics, read_torch_file
from dfl.errors import FileReadError, OutputPathError, SweepError
from dfl.files import (
    atomic_write_bytes,
    check_output_file,
    read_bytes,
    read_json,
    read_jsonl,
    read_text,
    read_toml,
)
from dfl.workflows.landscape import check_arguments
from dfl.workflows.sweep import load_sweep, read_entries
from topologies import graphs

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def one_line(exc: BaseException, path: Path) -> str:
    """The message, checked to be one line that names `path`."""
    text = str(exc)
    assert "\n" not in text, text
    assert str(path) in text, text
    return text


# ---------------------------------------------------------------------------------------------- the text readers
READERS = [
    ("text", lambda p: read_text(p, "text file")),
    ("toml", lambda p: read_toml(p, "config file")),
    ("json", lambda p: read_json(p, "summary file")),
    ("jsonl", lambda p: read_jsonl(p, "metrics file")),
]


def unusable_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Paths where no file can be read, each with the words its refusal must contain."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    os.mkfifo(tmp_path / "fifo")  # opening it would block: it must be refused without being opened
    return {
        "missing": (tmp_path / "missing.toml", "does not exist"),
        "directory": (tmp_path / "adir", "is a directory"),
        "under a file": (tmp_path / "afile" / "x.toml", "afile is a file"),
        "dangling link": (tmp_path / "dangling", "symbolic link to a missing file"),
        "link loop": (tmp_path / "loop", "cannot be read"),
        "fifo": (tmp_path / "fifo", "not a regular file"),
    }


@pytest.mark.parametrize("reader", [r for _, r in READERS], ids=[n for n, _ in READERS])
def test_every_reader_refuses_a_path_that_is_no_readable_file_in_one_line(tmp_path, reader):
    for case, (path, words) in unusable_paths(tmp_path).items():
        with pytest.raises(FileReadError) as info:
            reader(path)
        assert words in one_line(info.value, path), case


@pytest.mark.parametrize("reader", [r for _, r in READERS], ids=[n for n, _ in READERS])
def test_every_reader_names_the_encoding_problem(tmp_path, reader):
    cases = {
        "latin1.txt": ('seed = 0\nname = "café"\n'.encode("latin-1"), "not UTF-8 text: byte 0xe9 at line 2, column 12"),
        "utf16bom.txt": ("seed = 0\n".encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
        "utf16le.txt": ("seed = 0\n".encode("utf-16-le"), "is UTF-16 text"),
        "binary.txt": (b"seed\x00 = 0\n", "NUL byte at line 1, column 5"),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(FileReadError) as info:
            reader(tmp_path / name)
        assert words in one_line(info.value, tmp_path / name), name


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    (tmp_path / "c.toml").write_bytes(b"\xef\xbb\xbfseed = 3\n")
    assert read_toml(tmp_path / "c.toml") == {"seed": 3}


def test_syntax_errors_name_the_line_and_column(tmp_path):
    cases = [
        ("c.toml", "seed = 0\nrounds = = 3\n", read_toml, "is not valid TOML"),
        ("c.toml", "a = " + "[" * 5000 + "]" * 5000, read_toml, "is not valid TOML"),
        ("c.toml", "a = " + "1" * 5000, read_toml, "is not valid TOML"),
        ("s.json", '{"runs": [1, 2,]}', read_json, "is not valid JSON: Expecting value (line 1, column 16)"),
        ("s.json", "", read_json, "is empty, expected JSON"),
        ("s.json", "[" * 100000 + "]" * 100000, lambda p: read_json(p, expect=None), "nested too deeply"),
        ("s.json", "1" * 5000, lambda p: read_json(p, expect=None), "is not valid JSON"),
        ("s.json", "[1, 2]", read_json, "holds a list, expected an object"),
        ("m.jsonl", '{"round": 1}\n{"round": 2\n', read_jsonl, "line 2 is not valid JSON"),
        ("m.jsonl", '{"round": 1}\n\n[1]\n', read_jsonl, "line 3 holds a list, expected an object"),
    ]
    for name, text, reader, words in cases:
        (tmp_path / name).write_text(text)
        with pytest.raises(FileReadError) as info:
            reader(tmp_path / name)
        assert words in one_line(info.value, tmp_path / name), (name, text[:30])


def test_metrics_rows_need_an_integer_round(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for row, words in [('{"test_acc": 0.5}', "line 2 has round = None"), ('{"round": "3"}', "round = '3'"),
                       ('{"round": true}', "round = True"), ('{"round": -1}', "round = -1")]:
        path.write_text('{"round": 1, "test_acc": 0.1}\n' + row + "\n")
        with pytest.raises(FileReadError) as info:
            read_metrics(tmp_path)
        assert words in one_line(info.value, path)
    path.write_text('{"round": 1, "test_acc": NaN}\n\n{"round": 2}\n')
    assert [r["round"] for r in read_metrics(path)] == [1, 2]


def garbage_check(reader, path: Path, data: bytes) -> None:
    """`reader` on a file of `data`: a value, or a one-line FileReadError naming the file; nothing else."""
    path.write_bytes(data)
    try:
        reader(path)
    except FileReadError as exc:
        one_line(exc, path)


@FUZZ
@given(data=st.binary(max_size=300))
def test_the_readers_take_any_bytes(tmp_path, data):
    for name, reader in [*READERS, ("metrics", read_metrics)]:
        garbage_check(reader, tmp_path / f"f.{name}", data)
    garbage_check(read_entries_of_file, tmp_path / "sweep.json", data)


def read_entries_of_file(path: Path):
    """`read_entries` of the sweep directory holding `path` (a sweep.json)."""
    return read_entries(path.parent)


VALID = {
    "config.toml": 'algorithm = "dfedsam"\nrounds = 3\n[model_options]\nhidden = [16, 8]\n',
    "summary.json": json.dumps({"status": "completed", "test_acc": 0.5, "rounds_completed": 3}, indent=2),
    "metrics.jsonl": "".join(json.dumps({"round": r, "test_acc": 0.1 * r, "client_acc": [0.1, 0.2]}) + "\n"
                             for r in (1, 2, 3)),
    "sweep.json": json.dumps({"runs": [{"name": "seed=0", "dir": "runs/seed=0", "status": "completed"}]}, indent=2),
}
VALID_READERS = {"config.toml": read_toml, "summary.json": read_json, "metrics.jsonl": read_metrics,
                 "sweep.json": read_entries_of_file}


@FUZZ
@given(name=st.sampled_from(sorted(VALID)), cut=st.floats(0, 1), flip=st.integers(0, 255))
def test_truncated_and_damaged_dfl_files_give_one_line(tmp_path, name, cut, flip):
    data = VALID[name].encode()
    at = int(cut * len(data))
    for damaged in (data[:at], data[:at] + bytes([flip]) + data[at + 1:]):
        garbage_check(VALID_READERS[name], tmp_path / name, damaged)


# ---------------------------------------------------------------------------------------------- sweep files
@pytest.mark.parametrize("content, words", [
    ("garbage", "is not valid JSON"),
    ("[1, 2]", "holds a list, expected an object"),
    ('{"runs": 5}', "holds no list of runs"),
    ('{"runs": [5]}', "runs[0] is int"),
    ('{"runs": [{"name": "a"}]}', "runs[0] has dir = None"),
    ('{"runs": [{"name": "a", "dir": "/etc"}]}', "expected a path inside the sweep directory"),
    ('{"runs": [{"name": "a", "dir": "../x"}]}', "expected a path inside the sweep directory"),
])
def test_sweep_status_refuses_a_bad_sweep_json_in_one_line(tmp_path, capsys, content, words):
    from dfl.cli import main

    (tmp_path / "sweep.json").write_text(content)
    assert main(["sweep", "status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and str(tmp_path / "sweep.json") in err, err


def test_a_sweep_spec_that_is_no_text_is_named(tmp_path):
    (tmp_path / "s.toml").write_bytes("[base]\nseed = 0\n".encode("utf-16"))
    with pytest.raises(SweepError, match="sweep file .*s.toml: is UTF-16 text"):
        load_sweep(tmp_path / "s.toml")
    with pytest.raises(SweepError, match="is a directory"):
        load_sweep(tmp_path)


# ---------------------------------------------------------------------------------------------- torch files
def test_a_garbage_torch_file_is_one_line(tmp_path):
    torch.save({"params": torch.zeros(2, 3)}, tmp_path / "good.pt")
    good = (tmp_path / "good.pt").read_bytes()
    cases = {
        "random.pt": (os.urandom(100), "is not a file torch.save wrote"),
        "text.pt": (b"not a torch file", "is not a file torch.save wrote"),
        "empty.pt": (b"", "is empty"),
        "truncated.pt": (good[: len(good) // 2], "is not a file torch.save wrote, or it is truncated"),
        # a forbidden global: torch's own message runs over 5 lines
        "pickle.pt": (pickle.dumps(os.system, protocol=2), "is not a file torch.save wrote"),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(FileReadError) as info:
            read_torch_file(tmp_path / name, "parameter file")
        assert words in one_line(info.value, tmp_path / name), name
    assert "unsupported GLOBAL posix.system" in str(info.value)
    with pytest.raises(FileReadError, match="is a directory"):
        read_torch_file(tmp_path)
    assert read_torch_file(tmp_path / "good.pt")["params"].shape == (2, 3)


@FUZZ
@given(cut=st.integers(0, 2000), flip=st.integers(0, 255))
def test_any_damage_to_a_torch_file_is_one_line(tmp_path, cut, flip):
    path = tmp_path / "params.pt"
    torch.save({"params": torch.arange(12.0).view(3, 4), "param_names": ["w"]}, path)
    data = path.read_bytes()
    cut %= len(data)
    for damaged in (data[:cut], data[:cut] + bytes([flip]) + data[cut + 1:]):
        path.write_bytes(damaged)
        try:
            read_torch_file(path)
        except FileReadError as exc:
            one_line(exc, path)


# ---------------------------------------------------------------------------------------------- matrix and edge files
def refuse_matrix(path: Path, words: str) -> None:
    with pytest.raises(ValueError) as info:
        graphs.load_matrix(path)
    assert words in one_line(info.value, path)


def test_matrix_files_that_claim_more_than_they_hold_are_refused_from_the_header(tmp_path):
    mtx = tmp_path / "huge.mtx"
    mtx.write_text("%%MatrixMarket matrix coordinate real general\n1000000000 1000000000 1\n1 1 1.0\n")
    refuse_matrix(mtx, "1 entries cannot fill the 1000000000 rows")
    mtx.write_text("%%MatrixMarket matrix coordinate real general\n3 3 100000000\n1 1 1.0\n")
    refuse_matrix(mtx, "promises 3 × 3 with 100000000 entries")
    mtx.write_text("%%MatrixMarket matrix array real general\n100000 100000\n1.0\n")
    refuse_matrix(mtx, "holds at most")
    mtx.write_text("%%MatrixMarket matrix coordinate pattern general\n3 3 3\n1 2\n2 3\n3 1\n")
    refuse_matrix(mtx, "is a pattern matrix (no values)")
    mtx.write_text("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1.0 0.0\n")
    refuse_matrix(mtx, "W must be real")
    mtx.write_text("%%MatrixMarket matrix coordinate real general\n2 3 6\n")
    refuse_matrix(mtx, "must be square, got 2 × 3")
    mtx.write_text("hello\n")
    refuse_matrix(mtx, "is not a Matrix Market matrix")
    npy = tmp_path / "huge.npy"
    header = np.lib.format.header_data_from_array_1_0(np.zeros((2, 2)))
    header["shape"] = (100000, 100000)
    with open(npy, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(b"\0" * 64)
    refuse_matrix(npy, "is truncated: its header promises more data")
    np.save(tmp_path / "obj.npy", np.array([[None]], dtype=object), allow_pickle=True)
    refuse_matrix(tmp_path / "obj.npy", "could not be read as .npy")
    (tmp_path / "empty.csv").write_text("")
    refuse_matrix(tmp_path / "empty.csv", "is empty")
    (tmp_path / "blank.csv").write_text("\n\n")
    refuse_matrix(tmp_path / "blank.csv", "must be square")
    (tmp_path / "dir.npy").mkdir()
    refuse_matrix(tmp_path / "dir.npy", "is a directory")


def test_a_huge_matrix_header_allocates_nothing(tmp_path):
    """In a process limited to 1 GiB of address space, the 10^9 x 10^9 header is refused by its own message, not
    by a MemoryError (before the size checks: numpy tried to allocate 3.7 GiB for the CSR index)."""
    mtx = tmp_path / "huge.mtx"
    mtx.write_text("%%MatrixMarket matrix coordinate real general\n1000000000 1000000000 1000000000\n"
                   + "1 1 1.0\n" * 200)
    edges = tmp_path / "huge.edges"
    edges.write_text("0 1\n1 1000000000000\n")
    script = textwrap.dedent(f"""
        import resource
        from topologies import build, graphs
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        for call in (lambda: graphs.load_matrix({str(mtx)!r}), lambda: graphs.from_edge_list({str(edges)!r}),
                     lambda: graphs.from_edge_list({str(edges)!r}, n=10**9)):
            try:
                call()
            except ValueError as exc:
                print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "promises 1000000000 × 1000000000 with 1000000000 entries" in lines[0]
    assert "node id 1000000000000 makes n = 1000000000001 clients, but 2 edge(s) connect at most 3" in lines[1]
    assert "out of range for n = 1000000000" in lines[2]


def test_an_edge_list_cannot_imply_more_clients_than_it_connects(tmp_path):
    path = tmp_path / "e.txt"
    path.write_text("0 1\n1 2\n")
    with pytest.raises(ValueError, match="2 edge\\(s\\) connect at most 3 clients, not n = 16"):
        graphs.from_edge_list(path, 16)
    assert graphs.from_edge_list(path).number_of_nodes() == 3
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no edges"):
        graphs.from_edge_list(path)
    path.write_bytes("0 1\n1 2 # café\n".encode("latin-1"))
    with pytest.raises(ValueError) as info:
        graphs.from_edge_list(path)
    assert "is not UTF-8 text (byte 0xe9 at line 2, column 10); save it as UTF-8" in one_line(info.value, path)
    path.write_bytes("0 1\n".encode("utf-16"))
    with pytest.raises(ValueError, match="is UTF-16 text; save it as UTF-8"):
        graphs.from_edge_list(path)
    with pytest.raises(ValueError, match="is a directory"):
        graphs.from_edge_list(tmp_path)


def test_a_matrix_file_that_does_not_contract_is_named(tmp_path):
    from topologies import build

    path = tmp_path / "perm.mtx"  # a cyclic permutation: doubly stochastic and connected, but lambda = 1
    path.write_text("%%MatrixMarket matrix coordinate real general\n3 3 3\n1 2 1.0\n2 3 1.0\n3 1 1.0\n")
    with pytest.raises(ValueError) as info:
        build("custom", 3, matrix=str(path))
    assert "does not contract" in one_line(info.value, path)


@FUZZ
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".npy", ".csv", ".mtx"]))
def test_matrix_readers_take_any_bytes(tmp_path, data, suffix):
    for prefix in (b"", b"%%MatrixMarket matrix coordinate real general\n", np.lib.format.MAGIC_PREFIX):
        path = tmp_path / f"W{suffix}"
        path.write_bytes(prefix + data)
        try:
            graphs.load_matrix(path)
        except ValueError as exc:
            one_line(exc, path)


# ---------------------------------------------------------------------------------------------- dataset files
def idx_bytes(magic: int, shape: tuple[int, ...], data: bytes | None = None) -> bytes:
    body = bytes(int(np.prod(shape))) if data is None else data
    return magic.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in shape) + body


def write_mnist(root: Path, train: int = 5, test: int = 3, gz: bool = False) -> None:
    root.mkdir(parents=True, exist_ok=True)
    files = {"train-images-idx3-ubyte": idx_bytes(IMAGES_MAGIC, (train, 28, 28)),
             "train-labels-idx1-ubyte": idx_bytes(LABELS_MAGIC, (train,)),
             "t10k-images-idx3-ubyte": idx_bytes(IMAGES_MAGIC, (test, 28, 28)),
             "t10k-labels-idx1-ubyte": idx_bytes(LABELS_MAGIC, (test,))}
    for name, data in files.items():
        if gz:
            (root / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (root / name).write_bytes(data)


def test_an_mnist_folder_with_no_test_images_is_refused_naming_the_file(tmp_path):
    write_mnist(tmp_path / "m", test=0)
    with pytest.raises(FileReadError) as info:
        load_mnist(tmp_path / "m")
    assert "holds 0 images: the t10k split would be empty" in one_line(info.value, tmp_path / "m"
                                                                        / "t10k-images-idx3-ubyte")
    write_mnist(tmp_path / "ok", gz=True)
    assert load_mnist(tmp_path / "ok").test_x.shape == (3, 1, 28, 28)


def test_an_idx_header_claiming_more_than_the_file_holds_is_refused_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(idx_bytes(IMAGES_MAGIC, (10**9, 28, 28), b"\0" * 100))
    with pytest.raises(FileReadError, match=r"header says shape \[1000000000, 28, 28\] \(784,000,000,000 bytes"):
        read_idx(path, IMAGES_MAGIC)
    gz = tmp_path / "t10k-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(idx_bytes(IMAGES_MAGIC, (10**9, 28, 28), b"\0" * 100)))
    with pytest.raises(FileReadError, match="more than the .* of memory available"):
        read_idx(gz, IMAGES_MAGIC)
    monkeypatch.setattr("dfl.data.idx.available_memory", lambda: 1 << 60)  # claimed size allowed: read in blocks
    with pytest.raises(FileReadError, match="but the decompressed file holds 100"):
        read_idx(gz, IMAGES_MAGIC)
    gz.write_bytes(gzip.compress(idx_bytes(IMAGES_MAGIC, (3, 28, 28)))[:-10])
    with pytest.raises(FileReadError, match="cannot be read"):
        read_idx(gz, IMAGES_MAGIC)


@FUZZ
@given(data=st.binary(max_size=120), gz=st.booleans())
def test_idx_reader_takes_any_bytes(tmp_path, data, gz):
    path = tmp_path / ("x.gz" if gz else "x")
    for prefix in (b"", IMAGES_MAGIC.to_bytes(4, "big")):
        path.write_bytes(gzip.compress(prefix + data) if gz else prefix + data)
        try:
            read_idx(path, IMAGES_MAGIC)
        except FileReadError as exc:
            one_line(exc, path)


def test_a_cifar_batch_that_is_garbage_or_empty_is_one_line(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
    for i in range(1, 6):
        (d / f"data_batch_{i}").write_bytes(pickle.dumps(batch))
    (d / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((0, 3072), np.uint8), b"labels": []}))
    with pytest.raises(FileReadError) as info:
        load_cifar10(tmp_path)
    assert "holds 0 images" in one_line(info.value, d / "test_batch")
    for data, words in [(os.urandom(64), "is not a CIFAR python pickle"),
                        (pickle.dumps([1, 2]), "expected a dict"),
                        (pickle.dumps(os.system), "is not a CIFAR python pickle")]:
        (d / "test_batch").write_bytes(data)
        with pytest.raises(FileReadError) as info:
            load_cifar10(tmp_path)
        assert words in one_line(info.value, d / "test_batch")


# ---------------------------------------------------------------------------------------------- writers and sizes
def test_the_atomic_writer_refuses_a_directory_or_a_path_under_a_file(tmp_path):
    (tmp_path / "f").write_text("mine")
    with pytest.raises(OutputPathError, match="f is a file, not a directory"):
        atomic_write_bytes(tmp_path / "f" / "x.json", b"{}")
    with pytest.raises(OutputPathError, match="it is a directory"):
        check_output_file(tmp_path)
    atomic_write_bytes(tmp_path / "new" / "deeper" / "x.json", b"{}")
    assert read_bytes(tmp_path / "new" / "deeper" / "x.json") == b"{}"
    assert (tmp_path / "f").read_text() == "mine"


def test_landscape_points_are_refused_for_memory_before_any_work(tmp_path):
    with pytest.raises(ValueError) as info:
        check_arguments(tmp_path / "no-run", points=1_000_000)
    text = str(info.value)
    assert text.startswith("--points 1000000: a 1000000 × 1000000 grid needs about 232.8 TiB") and "available" in text


@pytest.mark.parametrize("empty", ["train", "test"])
def test_a_dataset_with_an_empty_split_is_refused_naming_it(empty):
    """Any loader, a user's too: an empty split is refused, naming it (an empty test split would report 0.00% accuracy
    and loss 0.0000)."""
    from dfl.data import Dataset, load_dataset, register
    from dfl.data.dataset import DATASETS

    def loader(*, n: int = 8) -> Dataset:
        sizes = {"train": n, "test": n, empty: 0}
        return Dataset("empty-split", torch.zeros(sizes["train"], 2), torch.zeros(sizes["train"], dtype=torch.long),
                       torch.zeros(sizes["test"], 2), torch.zeros(sizes["test"], dtype=torch.long), 2, (2,))

    register("empty-split", loader)
    try:
        with pytest.raises(ValueError) as info:
            load_dataset("empty-split")
    finally:
        DATASETS.unregister("empty-split")
    assert str(info.value).startswith(f"dataset 'empty-split': its {empty} split holds no samples (loaded by ")
    assert "\n" not in str(info.value)

"""Your own network: `topology = "custom"` with a W file (.npy, .csv, .mtx) or an edge list.

Each file form builds the same W as the in-memory array, through `topologies.build`, `dfl.run` (Config and
TOML) and `dfl topology show`; each bad file is a one-line error naming the file and, for a W that is not
stochastic or not symmetric, where and by how much.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

import dfl
import topologies
from dfl.cli import main
from dfl.config import Config, ConfigError

N = 6


@pytest.fixture
def ring_w() -> np.ndarray:
    """Metropolis weights of the 6-node ring: 1/3 on the diagonal and on each neighbour."""
    return topologies.build("ring", N).W


def write(path, W) -> str:
    """W written to `path` in the format its extension names; returns the path as a string."""
    suffix = path.suffix
    if suffix == ".npy":
        np.save(path, W)
    elif suffix == ".csv":
        path.write_text("\n".join(" , ".join(repr(float(x)) for x in row) for row in np.asarray(W)) + "\n")
    elif suffix == ".mtx":
        scipy.io.mmwrite(path, sp.coo_array(W))
    else:
        path.write_text(str(W))
    return str(path)


FORMATS = ("W.npy", "W.csv", "W.mtx")


@pytest.mark.parametrize("name", FORMATS)
def test_matrix_file_builds_the_same_w(tmp_path, ring_w, name):
    topo = topologies.build("custom", None, matrix=write(tmp_path / name, ring_w))
    assert topo.n == N and topo.weights == "given"
    np.testing.assert_allclose(topo.W, ring_w, atol=1e-15)
    np.testing.assert_allclose(topo.sparse(0).toarray(), ring_w, atol=1e-15)
    assert topo.second_eigenvalue() == pytest.approx(topologies.build("ring", N).second_eigenvalue())
    assert topologies.build("custom", N, matrix=tmp_path / name).n == N  # a Path works too, and a matching n


def test_mtx_stays_sparse(tmp_path, monkeypatch):
    import topologies.graphs as graphs

    W = topologies.build("ring", 3000).sparse(0)
    path = write(tmp_path / "big.mtx", W)
    loaded = graphs.load_matrix(path)
    assert sp.issparse(loaded) and loaded.nnz == W.nnz
    monkeypatch.setattr(topologies.limits, "DENSE_LIMIT", 100)  # any densification on the way would be refused
    topo = topologies.build("custom", None, matrix=path)
    assert topo.n == 3000 and (topo.sparse(0) != W).nnz == 0


def test_relative_path_resolves_against_the_current_directory(tmp_path, monkeypatch, ring_w):
    write(tmp_path / "W.npy", ring_w)
    monkeypatch.chdir(tmp_path)
    np.testing.assert_allclose(topologies.build("custom", None, matrix="W.npy").W, ring_w)


def test_symmetric_option_and_non_symmetric_matrix(tmp_path):
    # doubly stochastic, not symmetric: W[0, 1] = 0.3 but W[1, 0] = 0.2
    W = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]])
    path = write(tmp_path / "W.npy", W)
    assert topologies.build("custom", None, matrix=path).symmetric is False  # allowed without the option
    with pytest.raises(ValueError, match=r"^.*W\.npy is not symmetric: W\[0, 1\] = 0\.3 but W\[1, 0\] = 0\.2 "
                                         r"\(difference 0\.1\)$"):
        topologies.build("custom", None, matrix=path, symmetric=True)
    ring = topologies.build("ring", N).W
    assert topologies.build("custom", None, matrix=write(tmp_path / "R.npy", ring), symmetric=True).symmetric
    with pytest.raises(ValueError, match="symmetric= is True or False, and applies to matrix= only"):
        topologies.build("custom", None, path=write(tmp_path / "e.txt", "0 1\n"), symmetric=True)


def test_edge_list_alias_weighted_by_the_scheme(tmp_path):
    path = tmp_path / "graph.edgelist"
    nx.write_edgelist(nx.cycle_graph(N), path)  # networkx format: "0 1 {}" per line
    for weights in (None, "max-degree", "lazy"):
        topo = topologies.build("custom", None, weights, edges=str(path))
        expected = topologies.build("ring", N, weights)
        np.testing.assert_allclose(topo.W, expected.W, atol=1e-15)
        assert topo.weights == expected.weights
    via_path = topologies.build("custom", None, path=str(path))
    np.testing.assert_allclose(via_path.W, topologies.build("ring", N).W)
    nx.write_weighted_edgelist(nx.path_graph(4), tmp_path / "w.edgelist")  # "0 1 1" is fine too
    assert topologies.build("custom", None, edges=str(tmp_path / "w.edgelist")).n == 4
    with pytest.raises(ValueError, match="edges: edge-list file .*missing.edgelist' does not exist"):
        topologies.build("custom", None, edges=str(tmp_path / "missing.edgelist"))
    with pytest.raises(ValueError, match="edges: the path of an edge-list file .* got list"):
        topologies.build("custom", None, edges=[[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="exactly one of the options graph, path, matrix; got path, edges"):
        topologies.build("custom", None, path=str(path), edges=str(path))


def off_row(W: np.ndarray) -> np.ndarray:
    """W with row 3 summing to 0.95 (and so column 3 to 0.95 as well: the row check comes first)."""
    W = W.copy()
    W[3, 3] -= 0.05
    return W


def nan_at_1_2(W: np.ndarray) -> np.ndarray:
    W = W.copy()
    W[1, 2] = np.nan
    return W


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("bad, message", [
    (lambda W: np.ones((4, 5)) / 5, "matrix in {path} must be square, got 4 × 5"),
    (off_row, "{path} is not row-stochastic: row 3 sums to 0.95 (off by -0.05)"),
    (nan_at_1_2, "{path} has a non-finite entry at [1, 2]"),
    (lambda W: np.kron(np.eye(2), np.full((3, 3), 1 / 3)),
     "{path} is disconnected: its graph has 2 (strongly) connected components"),
])
def test_bad_matrix_file_names_the_file_and_the_amount(tmp_path, ring_w, name, bad, message):
    path = write(tmp_path / name, bad(ring_w))
    with pytest.raises(ValueError) as err:
        topologies.build("custom", None, matrix=path)
    text = str(err.value)
    assert message.format(path=path) in text and "\n" not in text


def test_column_sums_report_the_amount(tmp_path):
    W = np.eye(3)
    W[0] = [0.5, 0.5, 0.0]  # rows sum to 1, column 1 sums to 1.5
    path = write(tmp_path / "W.csv", W)
    with pytest.raises(ValueError, match=r"W\.csv is not column-stochastic: column 0 sums to 0\.5 \(off by -0\.5\)"):
        topologies.build("custom", None, matrix=path)


@pytest.mark.parametrize("name, content, message", [
    ("missing.npy", None, "matrix file '{path}' does not exist"),
    ("W.txt", "1", "matrix file '{path}': unsupported extension '.txt'; use one of .npy, .csv, .mtx"),
    ("W", "1", "unsupported extension '(none)'"),
    ("W.npy", "not a numpy file", "matrix file '{path}' is not a .npy file (it does not start with numpy's magic"),
    ("W.csv", "1, 0\n0, x\n", "matrix file '{path}' could not be read as .csv:"),
    ("W.csv", "1, 0\n0\n", "matrix file '{path}' could not be read as .csv:"),
    ("W.mtx", "garbage", "matrix file '{path}' is not a Matrix Market matrix: its first line must be"),
    ("W.csv", "0.5, 0.5\n", "matrix in {path} must be square, got 1 × 2"),
])
def test_unreadable_matrix_file_is_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as err:
        topologies.build("custom", None, matrix=str(path))
    text = str(err.value)
    assert message.format(path=path) in text and "\n" not in text


def test_matrix_file_and_weights_or_wrong_n(tmp_path, ring_w):
    path = write(tmp_path / "W.npy", ring_w)
    with pytest.raises(ValueError, match="leave weights"):
        topologies.build("custom", None, "metropolis", matrix=path)
    with pytest.raises(ValueError, match=r"n = 8 does not match the .*W\.npy of shape \(6, 6\)"):
        topologies.build("custom", 8, matrix=path)


def small_config(**changes) -> Config:
    base = dict(topology="custom", clients=N, rounds=1, model="logreg", local_steps=1, batch_size=8,
                progress=False, device="cpu", dataset_options={"num_samples": 400})
    return Config(**{**base, **changes})


def spy_build(monkeypatch) -> list:
    built = []
    real = topologies.build

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(topologies, "build", spy)
    return built


@pytest.mark.parametrize("name", FORMATS)
def test_run_with_a_matrix_file(tmp_path, monkeypatch, ring_w, name):
    path = write(tmp_path / name, ring_w)
    built = spy_build(monkeypatch)
    result = dfl.run(small_config(topology_options={"matrix": path}))
    assert built[-1].name == "custom"
    np.testing.assert_allclose(built[-1].W, ring_w, atol=1e-15)
    assert result.summary["topology"] == "custom" and result.summary["weights"] == "given"


def test_run_with_an_edge_list(tmp_path, monkeypatch):
    path = tmp_path / "graph.edgelist"
    nx.write_edgelist(nx.cycle_graph(N), path)
    built = spy_build(monkeypatch)
    dfl.run(small_config(topology_options={"edges": str(path)}, weights="max-degree"))
    np.testing.assert_allclose(built[-1].W, topologies.build("ring", N, "max-degree").W, atol=1e-15)


def test_run_with_a_bad_matrix_file_is_a_config_error(tmp_path, ring_w):
    path = write(tmp_path / "W.npy", off_row(ring_w))
    with pytest.raises(ConfigError, match=r"topology: .*W\.npy is not row-stochastic: row 3 sums to 0\.95 "
                                          r"\(off by -0\.05\)"):
        dfl.run(small_config(topology_options={"matrix": path}))


def test_toml_and_cli_reach_build_with_a_relative_path(tmp_path, monkeypatch, ring_w):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "W.npy", ring_w)
    (tmp_path / "run.toml").write_text('topology = "custom"\n\n[topology_options]\nmatrix = "W.npy"\n')
    config = Config.from_toml(tmp_path / "run.toml")
    assert config.topology_options == {"matrix": "W.npy"}
    from dfl.engine import setup
    np.testing.assert_allclose(setup.build_topology(config, N).W, ring_w)

    from dfl.cli.run import key_value

    assert key_value("matrix=W.npy") == ("matrix", "W.npy")  # a bare file name stays a string
    assert key_value("matrix=data/W.npy") == ("matrix", "data/W.npy")
    assert key_value("edges=graph.edgelist") == ("edges", "graph.edgelist")


def test_topology_show_custom(tmp_path, capsys, ring_w):
    path = write(tmp_path / "W.npy", ring_w)
    assert main(["topology", "show", "custom", "--matrix", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["topology", "n", "weights"]
    assert out[2].split()[:3] == ["custom", "6", "given"] and len(out) == 3
    assert main(["topology", "custom", "--matrix", path, "--json"]) == 0  # 'show' is optional
    import json

    row = json.loads(capsys.readouterr().out)[0]
    assert row["lambda"] == pytest.approx(topologies.build("ring", N).second_eigenvalue())
    edges = tmp_path / "graph.edgelist"
    nx.write_edgelist(nx.cycle_graph(N), edges)
    assert main(["topology", "show", "custom", "--edges", str(edges), "--weights", "max-degree"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:3] == ["custom", "6", "max-degree"]
    assert main(["topology", "show", "ring", "--clients", "8"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["show", "custom", "--matrix", "{tmp}/missing.npy"], "matrix file '{tmp}/missing.npy' does not exist"),
    (["show", "custom", "--matrix", "{tmp}/bad.npy"], "{tmp}/bad.npy is not row-stochastic: row 3 sums to 0.95"),
    (["show", "custom", "--matrix", "{tmp}/W.txt"], "unsupported extension '.txt'"),
    (["show"], "'dfl topology show' needs a topology name"),
    (["ring", "custom"], "unexpected argument 'custom' after 'ring'"),
])
def test_topology_show_bad_input(tmp_path, capsys, ring_w, argv, message):
    write(tmp_path / "bad.npy", off_row(ring_w))
    (tmp_path / "W.txt").write_text("1")
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["topology", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dfl topology: error: ") and message.format(tmp=tmp_path) in captured.err
    assert captured.err.count("\n") == 1


def test_a_graph_object_in_the_options_is_refused_naming_the_field():
    with pytest.raises(dfl.ConfigError, match="topology_options.graph must be a TOML value"):
        dfl.validate(dfl.Config(topology="custom", topology_options={"graph": nx.cycle_graph(4)}, clients=4))

"""Flatness: top Hessian eigenvalue by power iteration on HVPs, filter-normalised loss landscape,
`hessian_every` in the runner and `dfl landscape`."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

import dfl
from dfl.cli import main
from dfl.config import Config, ConfigError
from dfl.engine import checkpoint as ckpt
from dfl.engine.validation import validate
from dfl.models import build_model
from dfl.network.comm import LocalCommunicator
from dfl.report import write_report
from dfl.training.clients import ParamLayout
from dfl.training.flatness import (
    filter_normalized_direction,
    hessian_top_eigenvalue,
    loss_hvp,
    loss_landscape,
    top_eigenvalue,
)

TINY = dict(dataset="mnist1d", dataset_options={"num_samples": 400}, clients=4, model="mlp",
            model_options={"hidden": [16]}, rounds=4, eval_every=2, local_steps=2, batch_size=16, progress=False,
            device="cpu", train_eval_samples=50)


def quadratic(eigenvalues, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
    A = Q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ Q.T
    return lambda p: 0.5 * p @ A @ p


@pytest.mark.parametrize("eigenvalues, top", [
    ([5.0, 3.0, 2.0, 1.0, 0.5, 0.0, -1.0], 5.0),
    ([0.2, 0.1, -4.0, -1.0], -4.0),  # the largest magnitude, with its sign
])
def test_top_eigenvalue_of_a_quadratic_with_known_spectrum(eigenvalues, top):
    f = quadratic(eigenvalues)
    p = torch.randn(len(eigenvalues), dtype=torch.float64)  # the Hessian of a quadratic is A everywhere
    got = top_eigenvalue(loss_hvp(f, p), p.numel(), iters=200, tol=1e-12, dtype=torch.float64)
    assert got == pytest.approx(top, rel=1e-6)


def test_model_hessian_matches_the_dense_hessian_and_chunking_does_not_matter():
    torch.manual_seed(0)
    model = build_model("mlp", (6,), 3, hidden=[4])
    layout = ParamLayout.of(model)
    p = layout.flatten(model).double()
    model = model.double()
    x, y = torch.randn(30, 6, dtype=torch.float64), torch.randint(0, 3, (30,))
    dense = torch.func.hessian(lambda r: F.cross_entropy(functional_call(model, layout.views(r), (x,)), y))(p)
    top = torch.linalg.eigvalsh(dense)
    want = float(top[top.abs().argmax()])
    for batch_size in (30, 7):
        got = hessian_top_eigenvalue(model, layout, p, x, y, iters=500, tol=1e-12, batch_size=batch_size)
        assert got == pytest.approx(want, rel=1e-5)


def test_filter_normalised_directions_match_each_filter_norm_and_skip_1d_parameters():
    model = build_model("cnn1d", (1, 40), 10)
    layout = ParamLayout.of(model)
    p = layout.flatten(model)
    d = filter_normalized_direction(layout, p, torch.Generator().manual_seed(1))
    for (name, dv), pv in zip(layout.views(d).items(), layout.views(p).values()):
        if pv.dim() < 2:
            assert torch.count_nonzero(dv) == 0, name
        else:
            torch.testing.assert_close(dv.flatten(1).norm(dim=1), pv.flatten(1).norm(dim=1), rtol=1e-5, atol=1e-6)


def test_landscape_centre_is_the_unperturbed_loss_and_grid_is_consistent():
    torch.manual_seed(0)
    model = build_model("mlp", (6,), 3, hidden=[8])
    layout = ParamLayout.of(model)
    p = layout.flatten(model)
    x, y = torch.randn(50, 6), torch.randint(0, 3, (50,))
    surface = loss_landscape(model, layout, p, x, y, span=0.5, points=5, batch_size=16, chunk=7)
    loss = torch.tensor(surface["loss"])
    assert loss.shape == (5, 5) and surface["alphas"][0] == pytest.approx(-0.5)
    want = F.cross_entropy(model(x), y).item()
    assert surface["centre_loss"] == pytest.approx(want, rel=1e-5)
    assert loss[2, 2].item() == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="points"):
        loss_landscape(model, layout, p, x, y, points=2)
    with pytest.raises(ValueError, match="span"):
        loss_landscape(model, layout, p, x, y, span=0)


def test_landscape_grid_points_are_the_loss_along_the_seeded_directions():
    torch.manual_seed(1)
    model = build_model("cnn1d", (1, 40), 4)
    layout = ParamLayout.of(model)
    p = layout.flatten(model)
    x, y = torch.randn(20, 1, 40), torch.randint(0, 4, (20,))
    surface = loss_landscape(model, layout, p, x, y, span=0.3, points=3, seed=5, batch_size=8, chunk=2)
    g = torch.Generator().manual_seed(5)
    d1, d2 = filter_normalized_direction(layout, p, g), filter_normalized_direction(layout, p, g)
    for i, j in [(0, 2), (2, 1), (1, 0)]:  # loss[i][j] is at a = alphas[i], b = betas[j]
        row = p + surface["alphas"][i] * d1 + surface["betas"][j] * d2
        want = F.cross_entropy(functional_call(model, layout.views(row), (x,)), y).item()
        assert surface["loss"][i][j] == pytest.approx(want, rel=1e-5)
    assert surface["loss"][0][2] != pytest.approx(surface["loss"][2][0], rel=1e-3)  # a and b are not swapped
    with pytest.raises(ValueError, match="chunk"):
        loss_landscape(model, layout, p, x, y, chunk=0)


def test_hessian_every_records_the_metric_in_history_summary_and_report(tmp_path):
    result = dfl.run(Config(**TINY, hessian_every=3, hessian_samples=100, hessian_iters=5), out=tmp_path / "r")
    rounds = {h["round"]: h for h in result.history}
    assert sorted(rounds) == [2, 3, 4]  # evaluations at 2 and 4, the Hessian at 3 and at the last round
    assert "hessian_top_eig" not in rounds[2] and math.isfinite(rounds[3]["hessian_top_eig"])
    assert result.summary["hessian_top_eig"] == rounds[4]["hessian_top_eig"]
    report = write_report(tmp_path / "r")
    assert "Top Hessian eigenvalue" in report["report.md"].read_text()
    plain = dfl.run(Config(**TINY))
    assert all("hessian_top_eig" not in h for h in plain.history)
    with pytest.raises(ConfigError, match="hessian_samples"):
        validate(Config(hessian_samples=0))


def test_dfl_landscape_writes_a_plot_and_json(tmp_path, capsys):
    run_dir = tmp_path / "run"
    dfl.run(Config(**TINY), out=run_dir)
    assert main(["landscape", str(run_dir), "--points", "5", "--samples", "100", "--hessian-iters", "3"]) == 0
    png = run_dir / "plots" / "landscape.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    saved = json.loads((run_dir / "landscape.json").read_text())
    assert len(saved["loss"]) == 5 and saved["params_from"] == "params.pt"
    assert math.isfinite(saved["hessian_top_eig"])
    assert "wrote" in capsys.readouterr().out
    # a multi-process run's final parameters: every rank's rows in params.shards/ (here written by one process)
    params = torch.load(run_dir / "params.pt")["params"]
    (run_dir / "params.pt").unlink()
    ckpt.save_final_params(params, LocalCommunicator(params.shape[0]), run_dir)
    assert main(["landscape", str(run_dir), "--points", "3", "--samples", "50", "--hessian-iters", "0"]) == 0
    assert json.loads((run_dir / "landscape.json").read_text())["params_from"] == "params.shards"
    # a run without final parameters (killed before the end) falls back to its checkpoint
    ckpt.remove_final_params(run_dir)
    assert main(["landscape", str(run_dir), "--points", "3", "--samples", "50", "--hessian-iters", "0",
                 "--split", "test", "--out", str(tmp_path / "l.png")]) == 0
    assert (tmp_path / "l.png").stat().st_size > 0


@pytest.mark.parametrize("args, message", [
    (["--points", "2"], "--points"),
    (["--span", "0"], "--span"),
    (["--split", "val"], "--split must be one of train, test"),
    (["--samples", "0"], "--samples"),
])
def test_dfl_landscape_errors(tmp_path, capsys, args, message):
    run_dir = tmp_path / "run"
    dfl.run(Config(**{**TINY, "rounds": 1}), out=run_dir)
    assert main(["landscape", str(run_dir), *args]) == 2
    assert message in capsys.readouterr().err


def test_dfl_landscape_needs_a_run_directory_with_parameters(tmp_path, capsys):
    assert main(["landscape", str(tmp_path / "missing")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.toml").write_text(Config(**TINY).to_toml())
    assert main(["landscape", str(tmp_path / "r")]) == 2
    assert "neither params.pt, params.shards/ nor checkpoint.pt" in capsys.readouterr().err


def test_dfl_landscape_device_override_and_bad_parameter_files(tmp_path, capsys):
    run_dir = tmp_path / "run"
    dfl.run(Config(**{**TINY, "rounds": 1}), out=run_dir)
    small = ["--points", "3", "--samples", "20", "--hessian-iters", "0"]
    (run_dir / "config.toml").write_text(Config(**{**TINY, "rounds": 1, "device": "cuda"}).to_toml())
    if not torch.cuda.is_available():  # a GPU run looked at on a CPU machine
        assert main(["landscape", str(run_dir), *small]) == 2
        assert "--device" in capsys.readouterr().err
    assert main(["landscape", str(run_dir), *small, "--device", "cpu"]) == 0
    assert main(["landscape", str(run_dir), *small, "--device", "tpu"]) == 2
    assert "--device: device must be one of" in capsys.readouterr().err
    # parameters of another model than the one config.toml builds
    (run_dir / "config.toml").write_text(Config(**{**TINY, "model_options": {"hidden": [8]}}).to_toml())
    assert main(["landscape", str(run_dir), *small]) == 2
    assert "do not match the layout of mlp" in capsys.readouterr().err
    (run_dir / "params.pt").write_bytes(b"not a torch file")
    assert main(["landscape", str(run_dir), *small]) == 2
    err = capsys.readouterr().err  # one line naming the file, not torch's paragraphs
    assert f"parameter file {run_dir / 'params.pt'}: is not a file torch.save wrote" in err and err.count("\n") == 1

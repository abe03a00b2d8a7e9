"""`compile = true`: the torch.compile'd per-client gradient gives the eager engine's numbers."""

from __future__ import annotations

import shutil

import pytest
import torch

import dfl
from dfl.cli import build_parser
from dfl.cli.run import config_from_args
from dfl.config import Config, ConfigError
from dfl.engine.validation import validate
from dfl.training import local
from dfl.training.local import require_cpp_compiler

HAVE_COMPILER = any(shutil.which(c) for c in ("g++", "clang++", "c++"))
needs_compiler = pytest.mark.skipif(not HAVE_COMPILER, reason="torch.compile on CPU needs a C++ compiler")

BASE = dict(dataset_options={"num_samples": 600}, clients=6, rounds=2, batch_size=16, eval_every=1,
            progress=False, partition="dirichlet", alpha=0.3)


def test_compile_is_a_boolean_flag():
    with pytest.raises(ConfigError, match="compile must be true or false, got 'yes'"):
        validate(Config(compile="yes"))
    with pytest.raises(ConfigError, match="progress must be true or false"):
        validate(Config(progress=1))
    assert config_from_args(build_parser().parse_args(["run", "--compile"])).compile is True
    assert config_from_args(build_parser().parse_args(["run", "--no-compile"])).compile is False


@needs_compiler
@pytest.mark.parametrize("extra", [
    # unequal Dirichlet sizes in epoch mode: the number of active clients changes within a round, and
    # client_chunk = 4 of 6 leaves a short last chunk, so the compiled gradient meets several client counts
    dict(algorithm="dfedsam-mgs", local_epochs=1, client_chunk=4, model="cnn1d"),
    dict(algorithm="fedsam", sam="asam", participation=0.5, local_steps=3, model="mlp"),
])
@pytest.mark.slow
def test_compiled_run_matches_the_eager_run(extra, device, slack):
    from torch._dynamo.utils import counters

    eager = dfl.run(Config(**BASE, **extra, device=device))
    torch._dynamo.reset()
    counters.clear()
    compiled = dfl.run(Config(**BASE, **extra, compile=True, device=device))
    assert counters["stats"]["unique_graphs"] >= 1  # the gradient really went through dynamo
    torch.testing.assert_close(compiled.params, eager.params, rtol=0, atol=1e-5 * slack)
    for a, b in zip(compiled.history, eager.history):
        assert a["round"] == b["round"]
        assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1e-3)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)


def test_compile_without_a_cpp_compiler_fails_at_start(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ValueError, match="compile = true on CPU needs a C[+][+] compiler"):
        require_cpp_compiler()
    with pytest.raises(ValueError, match="needs a C[+][+] compiler"):
        dfl.run(Config(**BASE, local_steps=1, model="mlp", compile=True, device="cpu"))


def test_compiled_calls_use_a_few_fixed_client_counts():
    assert local.compiled_sizes(50) == [50, 32, 16, 8, 4, 2]  # at most COMPILED_SIZES graphs, below dynamo's limit
    assert local.compiled_sizes(4) == [4, 2, 1] and local.compiled_sizes(1) == [1]
    assert [local.padded_size(a, 50) for a in (50, 49, 33, 32, 17, 3, 1)] == [50, 50, 50, 32, 32, 4, 2]


@pytest.mark.parametrize(("clients", "chunk", "even"), [(100, 64, 50), (101, 64, 51), (7, 4, 4), (6, 4, 3),
                                                        (6, 6, 6), (5, 0, 5)])
def test_compile_splits_the_clients_into_calls_of_equal_size(clients, chunk, even):
    data = dfl.data.FederatedData.build("mnist1d", clients, "iid", seed=0, dataset_options={"num_samples": 600})
    model = dfl.models.build_model("logreg", tuple(data.input_shape), data.num_classes)
    layout = local.ParamLayout.of(model)
    config = Config(**{**BASE, "clients": clients}, client_chunk=chunk, model="logreg")
    assert local.LocalTrainer(model, layout, data, list(range(clients)), config.replace(compile=True)).chunk == even
    eager = local.LocalTrainer(model, layout, data, list(range(clients)), config)
    assert eager.chunk == (chunk or clients)  # eager runs keep the chunk asked for


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    dict(algorithm="dfedsam", local_steps=2, clients=7, client_chunk=4),  # SAM + a short last chunk (4 + 3)
    dict(algorithm="dfedsam-mgs", local_epochs=1, clients=6, partition="dirichlet", alpha=0.3),  # clients drop out
])
def test_the_compiled_gradient_compiles_once_per_client_count(extra):
    """The SAM point is written in the rows' layout (it compiled a second graph: "stride mismatch"), and a short
    last chunk is padded (it added a dynamic recompile): SAM in steps mode compiles one graph; clients that finish
    their epochs at different steps pad up to at most COMPILED_SIZES counts, each compiled once."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    config = Config(**{**BASE, **extra}, model="logreg", compile=True)
    result = dfl.run(config)
    graphs = counters["stats"]["unique_graphs"]
    if "local_steps" in extra:
        assert graphs == 1, dict(counters["stats"])
    else:
        assert 1 <= graphs <= len(local.compiled_sizes(result.summary["client_chunk"])), dict(counters["stats"])
    torch._dynamo.reset()

"""Your own model: `dfl.run(config, model=...)`, "module:factory" specs in the CLI and TOML,
`@dfl.models.register`, dropout with per-client randomness, the BatchNorm decision, and every bad input failing
before training with a one-line error naming the model."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid

import pytest
import torch
from torch import nn

import dfl
from dfl.cli import main
from dfl.config import Config, ConfigError
from dfl.data import FederatedData
from dfl.engine.validation import validate
from dfl.models import MODELS, ModelError, build_model, model_options, register
from dfl.models.simple import MLP
from dfl.registry import RegistryError
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.evaluate import client_accuracies, evaluate_row
from dfl.training.local import LocalRule, LocalTrainer

TINY = dict(dataset="synthetic", clients=4, partition="iid", rounds=2, eval_every=1, local_steps=1, batch_size=8,
            train_eval_samples=50, progress=False, device="cpu", client_chunk=0, algorithm="dfedavg")


def mlp8(input_shape, num_classes):
    """The built-in mlp with hidden=[8], as a factory of one's own."""
    return MLP(input_shape, num_classes, (8,))


class Dropout(nn.Module):
    """linear -> dropout -> linear."""

    def __init__(self, input_shape, num_classes, *, p=0.5):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(input_shape[-1], 16), nn.Dropout(p), nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc2(self.drop(self.fc1(x).relu()))


def same_data(clients: int = 2):
    """Every client holds the same samples: without randomness their local training is identical."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    return FederatedData.from_arrays(train=[(x, y)] * clients, test=(x, y), num_classes=3)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory with a uniquely named module file; sys.path and sys.modules restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"mymodels_{uuid.uuid4().hex[:8]}"

    def write(source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    yield write
    sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def builtin():
    return dfl.run(Config(**TINY, model="mlp", model_options={"hidden": [8]}))


# ---------------------------------------------------------------------------------------------- equivalence
def test_factory_equals_the_builtin_and_is_recorded_as_module_factory(builtin):
    own = dfl.run(Config(**TINY), model=mlp8)
    assert own.config.model == "tests.test_custom_models:mlp8"  # imports back: configs, sweeps, resume rebuild it
    assert torch.equal(own.initial_params, builtin.initial_params)
    assert torch.equal(own.params, builtin.params)
    assert [h["test_acc"] for h in own.history] == [h["test_acc"] for h in builtin.history]


def test_an_instance_is_every_clients_start_and_is_not_changed(tmp_path):
    torch.manual_seed(123)
    module = MLP((60,), 10, (8,)).eval()
    before = ParamLayout.of(module).flatten(module).clone()
    first = dfl.run(Config(**TINY), model=module, out=tmp_path / "a")
    assert first.config.model == "dfl.models.simple.MLP (instance)"
    assert all(torch.equal(row, before) for row in first.initial_params)
    assert torch.equal(ParamLayout.of(module).flatten(module), before) and not module.training
    # a config cannot rebuild an instance: resuming from the CLI says so; from Python with the module it resumes
    assert main(["run", "--resume", str(tmp_path / "a"), "--rounds", "3"]) == 2
    resumed = dfl.run(first.config.replace(rounds=3), out=tmp_path / "a", resume=True, model=module)
    assert resumed.history[-1]["round"] == 3


def test_import_spec_from_the_cli_and_toml_with_resume(workdir, tmp_path, capsys):
    module = workdir("""
        from torch import nn

        def small(input_shape, num_classes, *, width=8):
            return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1], width), nn.ReLU(),
                                 nn.Linear(width, num_classes))
    """)
    flags = ["--dataset", "synthetic", "--clients", "4", "--partition", "iid", "--rounds", "2", "--eval-every", "1",
             "--local-steps", "1", "--no-progress", "--device", "cpu"]
    assert main(["run", "--model", f"{module}:small", "--model-options", "width=4", "--out", "cli", *flags]) == 0
    saved = Config.from_toml(tmp_path / "cli" / "config.toml")
    assert saved.model == f"{module}:small" and saved.model_options == {"width": 4}
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["model"] == f"{module}:small"
    assert model_options(f"{module}:small") == {"width": 8}
    assert main(["run", "--resume", "cli", "--rounds", "3"]) == 0
    (tmp_path / "run.toml").write_text(f'model = "{module}:small"\nmodel_options = {{ width = 4 }}\n')
    assert main(["run", "run.toml", "--out", "toml", *flags, "--rounds", "3"]) == 0
    capsys.readouterr()
    assert torch.equal(torch.load(tmp_path / "toml" / "params.pt")["params"],
                       torch.load(tmp_path / "cli" / "params.pt")["params"])


def test_registered_model_runs_by_name_and_is_listed(capsys, builtin):
    @register("tiny-test-mlp")
    def tiny(input_shape, num_classes, *, hidden=8):
        """A tiny registered MLP."""
        return MLP(input_shape, num_classes, (hidden,))

    try:
        assert model_options("tiny-test-mlp") == {"hidden": 8}
        result = dfl.run(Config(**TINY, model="tiny-test-mlp", model_options={"hidden": 8}))
        assert torch.equal(result.params, builtin.params)
        with pytest.raises(RegistryError, match="'tiny-test-mlp' is registered twice: by .*tiny and by .*mlp8"):
            register("tiny-test-mlp", mlp8)
        assert main(["list", "models", "--json"]) == 0
        entry = json.loads(capsys.readouterr().out)["models"][-1]
        assert entry == {"name": "tiny-test-mlp", "description": "A tiny registered MLP.", "options": {"hidden": 8}}
    finally:
        MODELS.unregister("tiny-test-mlp")
    with pytest.raises(ModelError, match="may not contain ':'"):
        register("a:b", mlp8)
    with pytest.raises(ModelError, match="must be a factory f\\(input_shape, num_classes"):
        register("one-arg", lambda shape: None)


# ---------------------------------------------------------------------------------------------- dropout
def _train(p: float, seed: int = 0):
    data = same_data()
    torch.manual_seed(0)
    model = Dropout((6,), 3, p=p)
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, data, [0, 1], Config(seed=seed, batch_size=0, local_steps=3, client_chunk=0))
    return trainer.train(initial_stack(model, 2, torch.device("cpu")), 0, 0.1, LocalRule()).Y


def test_dropout_draws_differ_across_clients_and_are_reproducible():
    Y = _train(0.5)
    assert not torch.equal(Y[0], Y[1])  # same data, same start: only the dropout masks differ
    assert torch.equal(_train(0.5), Y)  # the same seed gives the same masks
    assert not torch.equal(_train(0.5, seed=1), Y)
    Y0 = _train(0.0)
    assert torch.equal(Y0[0], Y0[1])  # without dropout the two clients train identically


def test_dropout_runs_are_reproducible_resume_exactly_and_evaluate_without_dropout(tmp_path):
    config = Config(**{**TINY, "rounds": 3})
    whole = dfl.run(config, model=Dropout)
    assert whole.config.model == "tests.test_custom_models:Dropout"
    dfl.run(config.replace(rounds=2), model=Dropout, out=tmp_path / "r")
    # rebuilt from the recorded "module:factory" string; dropout draws are seeded per round, so resume is exact
    resumed = dfl.run(config.replace(model="tests.test_custom_models:Dropout"), out=tmp_path / "r", resume=True)
    assert torch.equal(resumed.params, whole.params)
    model = Dropout((60,), 10).train()
    layout = ParamLayout.of(model)
    data = FederatedData.build("synthetic", 4, "iid", seed=0)
    first = evaluate_row(model, layout, whole.params[0], data.test_x, data.test_y, 64)
    assert evaluate_row(model, layout, whole.params[0], data.test_x, data.test_y, 64) == first
    accs = client_accuracies(model, layout, whole.params, data.test_x, data.test_y, 64, 0)
    assert torch.equal(accs, client_accuracies(model, layout, whole.params, data.test_x, data.test_y, 64, 0))
    assert model.training and model.drop.training  # evaluation restores the mode it found


# ---------------------------------------------------------------------------------------------- buffers
class Normed(nn.Module):
    def __init__(self, input_shape, num_classes, *, track=True):
        super().__init__()
        self.fc, self.norm = nn.Linear(input_shape[-1], num_classes), nn.BatchNorm1d(num_classes,
                                                                                   track_running_stats=track)

    def forward(self, x):
        return self.norm(self.fc(x))


class Scaled(nn.Module):
    """A constant buffer (shared by every client) is fine; one that the forward updates is not."""

    def __init__(self, input_shape, num_classes, *, update=False):
        super().__init__()
        self.fc, self.update = nn.Linear(input_shape[-1], num_classes), update
        self.register_buffer("scale", torch.full((num_classes,), 2.0))

    def forward(self, x):
        if self.update:
            self.scale.mul_(1.0)  # an in-place write to a buffer
            self.scale += 1
        return self.fc(x) * self.scale


def test_batchnorm_with_running_stats_is_rejected_before_training_and_alternatives_run(tmp_path):
    with pytest.raises(ModelError, match=r"BatchNorm1d 'norm' keeps running statistics.*use GroupNorm, or "
                                         r"track_running_stats=False"):
        dfl.run(Config(**TINY), model=Normed, out=tmp_path / "bn")
    assert not (tmp_path / "bn").exists()
    result = dfl.run(Config(**TINY, model_options={"track": False}), model=Normed)
    assert result.history[-1]["round"] == 2
    assert dfl.run(Config(**TINY), model=Scaled).history[-1]["round"] == 2
    with pytest.raises(ModelError, match="'tests.test_custom_models:Scaled' fails in a vmapped gradient"):
        dfl.run(Config(**TINY, model_options={"update": True}), model=Scaled)


# ---------------------------------------------------------------------------------------------- bad input
class ItemModel(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(input_shape[-1], num_classes)

    def forward(self, x):
        return self.fc(x) * x.abs().max().item()


class Branchy(ItemModel):
    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


class InPlaceInput(ItemModel):
    def forward(self, x):
        return self.fc(x.mul_(2))


class NoisyEval(ItemModel):
    def forward(self, x):
        return self.fc(x + 0.01 * torch.randn_like(x))


class Frozen(ItemModel):
    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.fc.bias.requires_grad_(False)


@pytest.mark.parametrize("model,message", [
    (ItemModel, r"'tests.test_custom_models:ItemModel' fails in a vmapped gradient \(training\) at "
                r".*test_custom_models.py:\d+ \(`return self.fc\(x\) \* x.abs\(\).max\(\).item\(\)`\): "
                r"RuntimeError: vmap: It looks like you're either \(1\) calling .item\(\)"),
    (Branchy, r"fails in a vmapped gradient \(training\) at .*\(`if x.sum\(\) > 0:`\)"),
    (InPlaceInput, r"writes to its input in place .*which would change the dataset during evaluation"),
    (NoisyEval, r"fails in a vmapped forward in eval mode .*randomness error mode"),
    (Frozen, r"parameter 'fc.bias' has requires_grad=False"),
    (lambda shape, classes: nn.Linear(shape[-1], 3), r"must return logits of shape \[batch, num_classes\] = "
                                                     r"\[2, 10\]; got \[2, 3\]"),
    (lambda shape, classes: nn.Linear(shape[-1], classes).double(), r"parameter 'weight' is torch.float64"),
    (lambda shape, classes: nn.Flatten(), r"has no parameters"),
    (lambda shape, classes: torch.zeros(classes), r"must return an nn.Module; its factory returned Tensor"),
    (lambda shape: nn.Linear(shape[-1], 10), r"must be a factory f\(input_shape, num_classes, \*, option=default"),
    (lambda shape, classes: nn.Linear(shape, classes), r"failed when called as f\(\(60,\), 10\): TypeError"),
    (42, r"model= must be an nn.Module, a factory"),
])
def test_bad_models_fail_at_set_up_naming_the_model(tmp_path, model, message):
    with pytest.raises(ModelError, match=message):
        dfl.run(Config(**TINY), model=model, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("spec,message", [
    ("no_such_module_q7:f", r"model 'no_such_module_q7:f': cannot import module 'no_such_module_q7' \(from the "
                            r"working directory .*\): ModuleNotFoundError: No module named 'no_such_module_q7'"),
    ("math:nosuch", r"module 'math' has no attribute 'nosuch'"),
    ("math:pi", r"'math:pi' is a float, not a factory"),
    ("math:sqrt", r"model 'math:sqrt' must be a factory f\(input_shape, num_classes, \*, option=default, \.\.\.\) "
                  r"-> nn.Module; sqrt\(x, /\) cannot be called so"),
    ("resnet50", r"model must be one of logreg, mlp, .*, or \"package.module:factory\" for your own .*got 'resnet50'"),
    ("mpl", r"did you mean 'mlp'"),
])
def test_bad_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        validate(Config(model=spec))


def test_broken_module_and_instance_attribute_are_named(workdir):
    module = workdir("import torch\nraise RuntimeError('oops at import')\n")
    with pytest.raises(ConfigError, match=rf"cannot import module '{module}'.*RuntimeError: oops at import"):
        validate(Config(model=f"{module}:f"))
    sys.modules.pop(module, None)
    module = workdir("from torch import nn\nnet = nn.Linear(60, 10)\n")
    with pytest.raises(ConfigError, match=r"is an nn.Module instance; name a factory"):
        validate(Config(model=f"{module}:net"))


def test_other_misuse():
    with pytest.raises(ConfigError, match=r"got a Linear \(pass an nn.Module or a factory as dfl.run"):
        validate(Config(model=nn.Linear(2, 2)))
    with pytest.raises(ModelError, match=r"model_options \{'p': 0.1\} apply to a factory"):
        dfl.run(Config(**TINY, model_options={"p": 0.1}), model=Dropout((60,), 10))
    with pytest.raises(ModelError, match=r"unknown option\(s\) \['width'\] for model .*allowed: \['p'\]"):
        dfl.run(Config(**TINY, model_options={"width": 3}), model=Dropout)
    with pytest.raises(ModelError, match=r"is a Python object that was passed to dfl.run"):
        build_model("mymodule.Net (instance)", (60,), 10)

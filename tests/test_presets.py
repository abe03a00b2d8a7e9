"""The paper presets in launch/configs/: every file parses, names what it reproduces, expands into valid Configs
whose partitions work at the real dataset sizes and whose models build; and presets run end to end (tiny CIFAR
fixtures in the official pickle format, shrunk by overrides)."""

from __future__ import annotations

import json
import pickle
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

import dfl
from dfl.cli import main
from dfl.config import Config
from dfl.data import FederatedData
from dfl.data.partitioners import partition
from dfl.engine.setup import build_data
from dfl.engine.validation import unread_fields, validate
from dfl.models import build_model, num_params
from dfl.workflows.sweep import Sweep

CONFIGS = Path(__file__).resolve().parents[1] / "launch" / "configs"
PRESETS = sorted(CONFIGS.glob("*.toml"))
# (input shape, classes, train samples per class) of the datasets the presets use
DATASETS = {"cifar10": ((3, 32, 32), 10, 5000), "cifar100": ((3, 32, 32), 100, 500)}
# Models above this many parameters are swapped for logreg in the CPU smoke runs (their build is tested apart).
SMOKE_MAX_PARAMS = 1_000_000


def is_sweep(path: Path) -> bool:
    return "base" in tomllib.loads(path.read_text())


# A preset leaves data_root to the user (--data-root); validation needs an existing directory there (nothing is read)
DATA_ROOT = tempfile.gettempdir()


def preset_configs(path: Path) -> list[tuple[str, Config]]:
    """(run name, validated Config) of every run a preset describes, with data_root given as its header says."""
    if is_sweep(path):
        spec = tomllib.loads(path.read_text())
        spec["base"]["data_root"] = DATA_ROOT
        return Sweep.from_dict(spec, where=str(path)).runs()
    return [(path.stem, validate(Config.from_toml(path).replace(data_root=DATA_ROOT)))]


ALL_RUNS = [(p, name, c) for p in PRESETS for name, c in preset_configs(p)]


def test_presets_exist_for_every_paper():
    stems = {p.stem.split("-")[0] for p in PRESETS}
    assert {"dfedsam", "fedsam", "domo", "fedgloss"} <= stems
    assert (CONFIGS / "README.md").is_file()
    readme = (CONFIGS / "README.md").read_text()
    missing = [p.name for p in PRESETS if p.name not in readme]
    assert not missing, f"launch/configs/README.md does not list {missing}"


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_parses_and_says_what_it_reproduces(path):
    text = path.read_text()
    spec = tomllib.loads(text)
    assert text.startswith("# Reproduces: "), f"{path.name} must open with a '# Reproduces:' comment"
    if is_sweep(path):
        assert "data_root" not in spec["base"] and "data_root" not in spec["vary"], "data_root is the user's"
        assert set(spec) <= {"sweep", "base", "vary"}
        assert spec["sweep"]["name"] == path.stem, "the sweep name should be the file name (default --out)"
        assert spec["vary"], "a sweep preset varies something"
    else:
        assert "data_root" not in spec, "data_root is the user's (--data-root)"
        assert spec["name"] == path.stem


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_expands_to_valid_configs(path):
    runs = preset_configs(path)
    assert runs
    for name, config in runs:
        assert config.dataset in DATASETS, f"{name}: a paper preset on {config.dataset}?"
        assert unread_fields(config) == [], f"{name} sets {unread_fields(config)}, which its run does not read"


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_partitions_work_at_full_dataset_size(path, monkeypatch):
    """build_data's option handling (alpha vs partition) and the partitioner on the real label counts, without
    loading any image: FederatedData.build is replaced by a probe that partitions balanced labels."""
    seen = {}

    def probe(dataset, num_clients, method, *, seed, root, dataset_options, partition_options):
        _, classes, per_class = DATASETS[dataset]
        key = (dataset, num_clients, method, seed, json.dumps(partition_options, sort_keys=True))
        if key not in seen:
            labels = np.repeat(np.arange(classes), per_class)
            parts = partition(labels, num_clients, method, seed=seed, **partition_options)
            sizes = np.array([len(p) for p in parts])
            assert sizes.min() >= 1 and sizes.sum() <= labels.size
            seen[key] = sizes
        return seen[key]

    monkeypatch.setattr(FederatedData, "build", staticmethod(probe))
    for _, config in preset_configs(path):
        build_data(config)
    assert seen


def test_preset_models_build_for_their_datasets():
    import torch

    built = {}
    for _, name, config in ALL_RUNS:
        shape, classes, _ = DATASETS[config.dataset]
        key = (config.model, json.dumps(config.model_options, sort_keys=True), shape, classes)
        if key not in built:
            torch.manual_seed(0)
            model = build_model(config.model, shape, classes, **config.model_options)
            out = model(torch.zeros(2, *shape))
            assert out.shape == (2, classes), name
            built[key] = num_params(model)
    assert {k[0] for k in built} >= {"vgg11", "resnet18", "cnn"}


# ------------------------------------------------------------------------------------------------ end to end
def write_batch(path: Path, n: int, label_key: bytes, num_classes: int, seed: int) -> None:
    """One CIFAR "python version" pickle with balanced labels (the official format: uint8 [n, 3072], a list)."""
    rng = np.random.default_rng(seed)
    batch = {b"batch_label": b"fixture", label_key: [i % num_classes for i in range(n)],
             b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"filenames": [b"x.png"] * n}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(batch, protocol=2))


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    for i in range(1, 6):  # 5 x 20 = 100 train images, 10 per class
        write_batch(root / "cifar-10-batches-py" / f"data_batch_{i}", 20, b"labels", 10, i)
    write_batch(root / "cifar-10-batches-py" / "test_batch", 20, b"labels", 10, 9)
    write_batch(root / "cifar-100-python" / "train", 200, b"fine_labels", 100, 1)
    write_batch(root / "cifar-100-python" / "test", 100, b"fine_labels", 100, 2)
    return root


TINY = dict(clients=10, rounds=2, local_epochs=None, local_steps=2, batch_size=4, eval_every=1,
            train_eval_samples=8, eval_batch_size=64, checkpoint_every=0, client_chunk=0, progress=False)


def shrink(config: Config, root: Path) -> Config:
    """The preset's algorithm, topology, partition and hyperparameters on the tiny fixture; big models become
    logreg (their construction is tested above)."""
    changes = dict(TINY, data_root=str(root), device="cpu")
    if config.rho_ramp_rounds:
        changes["rho_ramp_rounds"] = 2  # the ramp is exercised within the 2 rounds
    if config.topology_options.get("k", 0) >= TINY["clients"]:  # random-pull's 10 peers need 11 clients
        changes["topology_options"] = {**config.topology_options, "k": TINY["clients"] - 1}
    shape, classes, _ = DATASETS[config.dataset]
    if num_params(build_model(config.model, shape, classes, **config.model_options)) > SMOKE_MAX_PARAMS:
        changes.update(model="logreg", model_options={})
    return validate(config.replace(**changes))


def smoke_cases():
    """Per preset, one run for each algorithm and for each topology it uses, plus its last run."""
    cases = []
    for path in PRESETS:
        runs = preset_configs(path)
        picked, keys = [], set()
        for name, config in runs:
            for key in (("algorithm", config.algorithm), ("topology", config.topology)):
                if key not in keys:
                    keys.add(key)
                    if name not in picked:
                        picked.append(name)
        if runs[-1][0] not in picked:
            picked.append(runs[-1][0])
        cases.append((path, picked))
    return cases


@pytest.mark.parametrize("path,names", smoke_cases(), ids=lambda v: v.name if isinstance(v, Path) else "")
@pytest.mark.slow
def test_preset_runs_end_to_end_on_tiny_cifar(path, names, cifar_root):
    configs = dict(preset_configs(path))
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ignored hyperparameters of some algorithms in a sweep
            result = dfl.run(shrink(configs[name], cifar_root))
        last = result.history[-1]
        assert last["round"] == 2 and np.isfinite(last["test_loss"]), name
        assert result.params.shape[0] == 10


@pytest.mark.slow
def test_single_run_preset_through_dfl_run(cifar_root, tmp_path):
    """`dfl run launch/configs/fedgloss-cifar10.toml --data-root DIR` as the header says, shrunk by flags."""
    out = tmp_path / "run"
    code = main(["run", str(CONFIGS / "fedgloss-cifar10.toml"), "--data-root", str(cifar_root), "--out", str(out),
                 "--clients", "20", "--rounds", "3", "--rho-ramp-rounds", "2", "--eval-every", "1",
                 "--train-eval-samples", "8", "--device", "cpu", "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    stored = Config.from_toml(out / "config.toml")
    assert (stored.algorithm, stored.participation, stored.alpha) == ("fedgloss", 0.05, 0.05)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines][-1] == 3


def test_sweep_preset_through_dfl_sweep(cifar_root, tmp_path):
    """`dfl sweep` on the DOMO preset with data_root and tiny sizes added to [base] (as its header says to; VGG-11
    becomes logreg), each [vary] list cut to its first two values."""
    spec = tomllib.loads((CONFIGS / "domo-cifar10.toml").read_text())
    spec["base"].update({k: v for k, v in TINY.items() if v is not None and k != "progress"},
                        data_root=str(cifar_root), device="cpu", clients=4, model="logreg")
    spec["base"].pop("local_epochs")
    spec["base"]["progress"] = False
    spec["vary"] = {k: v[:2] for k, v in spec["vary"].items()}
    spec["vary"]["seed"] = spec["vary"]["seed"][:1]
    path = tmp_path / "domo-tiny.toml"
    path.write_text(tomli_w.dumps(spec))
    out = tmp_path / "sweep"
    assert main(["sweep", str(path), "--out", str(out), "--no-report"]) == 0
    entries = json.loads((out / "sweep.json").read_text())["runs"]
    assert len(entries) == 4 and {e["status"] for e in entries} == {"completed"}
    assert entries[0]["name"] == "partition_options=similarity=0.05,algorithm=fedavg,seed=0"

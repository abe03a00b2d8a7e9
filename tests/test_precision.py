"""`precision`: bf16 autocast in the clients' forward/backward (fp32 state and gossip), TF32 only on CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dfl
from dfl.config import Config, ConfigError
from dfl.data import FederatedData
from dfl.engine.validation import validate
from dfl.models import build_model
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.local import LocalTrainer


class ConvolutionDtypes(TorchDispatchMode):
    """The dtypes of every convolution's output computed inside it (below vmap and autograd: the vmapped and the
    batched gradient alike)."""

    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten.convolution:
            self.dtypes.add(out.dtype)
        return out

BASE = dict(dataset_options={"num_samples": 600}, clients=4, rounds=2, local_steps=2, batch_size=16,
            eval_every=1, progress=False)


def trainer_and_batch(precision: str, device: str):
    data = FederatedData.build("mnist1d", 4, "iid", seed=0, dataset_options={"num_samples": 600}).to(device)
    torch.manual_seed(0)
    model = build_model("cnn1d", tuple(data.input_shape), data.num_classes).to(device)
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, data, [0, 1, 2, 3], Config(**BASE, precision=precision))
    X = initial_stack(model, 4, device)
    return model, trainer, X, trainer.schedule(0).batch(0)


def test_bf16_runs_the_client_forward_in_bfloat16_and_keeps_fp32_gradients(device):
    seen = []
    grads = {}
    for precision in ("fp32", "bf16"):
        model, trainer, X, batch = trainer_and_batch(precision, device)
        with ConvolutionDtypes() as convolutions:
            grads[precision], loss = trainer.gradient(X, batch)
        seen += [(precision, dtype) for dtype in convolutions.dtypes]
        assert grads[precision].dtype == torch.float32 and loss.dtype == torch.float32
    assert set(seen) == {("fp32", torch.float32), ("bf16", torch.bfloat16)}
    error = (grads["bf16"] - grads["fp32"]).norm(dim=1) / grads["fp32"].norm(dim=1)
    assert (error > 1e-4).all() and (error < 0.1).all()  # bf16 rounding, not a different gradient


def test_bf16_run_trains_close_to_fp32_with_fp32_parameters(device):
    fp32 = dfl.run(Config(**BASE, device=device))
    bf16 = dfl.run(Config(**BASE, precision="bf16", device=device))
    assert bf16.params.dtype == torch.float32
    assert not torch.equal(bf16.params, fp32.params)
    assert (bf16.params - fp32.params).abs().max() < 1e-2
    assert bf16.history[-1]["test_acc"] == pytest.approx(fp32.history[-1]["test_acc"], abs=0.05)


def test_precision_errors():
    with pytest.raises(ConfigError, match="precision must be one of fp32, bf16, tf32; got 'fp16'"):
        validate(Config(precision="fp16"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="precision = tf32 needs a CUDA device"):
            dfl.run(Config(**BASE, precision="tf32", device="cpu"))


def test_bf16_on_a_cpu_without_bf16_instructions_warns_once_per_run(monkeypatch):
    from dfl.training import precision

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with pytest.warns(RuntimeWarning, match=r"without bf16 instructions.*~40× slower.*fp32") as caught:
        trainer_and_batch("bf16", "cpu")
    assert sum("bf16 instructions" in str(w.message) for w in caught) == 1
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not precision.warn_if_slow_bf16("bf16", "cpu")
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert not precision.warn_if_slow_bf16("fp32", "cpu") and not precision.warn_if_slow_bf16("bf16", "cuda")


def test_bf16_detection_reads_torch_capability_and_cpu_flags(monkeypatch):
    from dfl.training import precision

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "fma"})
    assert not precision.cpu_has_bf16()
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert precision.cpu_has_bf16()
    monkeypatch.setattr(precision, "cpu_flags", lambda: set())
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AMX")
    assert precision.cpu_has_bf16()


# ---------------------------------------------------------------------------------------------- TF32 and cuDNN settings
# torch keeps a legacy TF32 state (set_float32_matmul_precision, cudnn.allow_tf32) beside the per-backend one
# (fp32_precision attributes) and refuses a mix of the two: torch 2.9-2.11 at every cuBLAS call, torch 2.13 (this CPU
# build) when a legacy getter is read. These getters are the check here: each raises on a mix.
def legacy_getters() -> tuple:
    return (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32)


def per_backend() -> tuple:
    from dfl.models import kernels

    return tuple(b.fp32_precision for b in kernels._matmul_backends()) + tuple(
        op.fp32_precision for op in kernels._cudnn_ops())


@pytest.fixture
def settings_restored():
    """Whatever a test does to PyTorch's process-wide settings is undone (legacy and per-backend, cuDNN flags)."""
    from dfl.models import kernels

    saved = kernels.snapshot()
    yield
    kernels.restore(saved)


def user_state(name: str) -> None:
    """A caller's TF32 state before dfl runs: fresh, the legacy API, or the per-backend API alone."""
    if name == "legacy high":
        torch.set_float32_matmul_precision("high")
    elif name == "legacy cudnn off":
        torch.backends.cudnn.allow_tf32 = False
    elif name == "per-backend tf32":  # on a fresh process already a mix for the legacy getter: comes back as is
        torch.backends.cuda.matmul.fp32_precision = "tf32"


needs_per_backend_api = pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                                           reason="this torch has only the legacy TF32 API")


@needs_per_backend_api
@pytest.mark.parametrize("before", ["fresh", "legacy high", "legacy cudnn off", "per-backend tf32"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "tf32"])
@pytest.mark.parametrize("kernels_mode", ["deterministic", "fast"])
def test_run_settings_keep_legacy_and_per_backend_tf32_in_agreement(settings_restored, before, precision,
                                                                    kernels_mode):
    from dfl.models import kernels

    user_state(before)
    caller = (per_backend(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    with kernels.run_settings(precision, kernels_mode):
        tf32 = precision == "tf32"
        assert legacy_getters() == ("high" if tf32 else "highest", tf32, tf32)  # no mix: none of them raises
        expected = "tf32" if tf32 else "ieee"
        assert torch.backends.cuda.matmul.fp32_precision == expected
        assert torch.backends.cudnn.conv.fp32_precision == expected
        assert torch.backends.cudnn.deterministic == (kernels_mode == "deterministic")
        assert torch.backends.cudnn.benchmark == (kernels_mode == "fast")
        with kernels.ieee_matmuls():  # gossip's IEEE products inside a tf32 run: still no mix
            assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32
        assert legacy_getters() == ("high" if tf32 else "highest", tf32, tf32)
    assert (per_backend(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == caller
    if before != "per-backend tf32":  # a caller's consistent state comes back consistent, legacy values included
        legacy_getters()


@needs_per_backend_api
def test_gossip_ieee_products_after_a_users_legacy_high_are_no_mix(settings_restored):
    from dfl.network import gossip

    torch.set_float32_matmul_precision("high")  # a user's TF32 matmuls, the legacy way
    seen = []
    with gossip.ieee_fp32(torch.device("cuda")):  # what exact_matmul does on a GPU
        seen.append(legacy_getters()[:2])
    assert seen == [("highest", False)]
    assert legacy_getters()[:2] == ("high", True) and torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.equal(gossip.exact_matmul(torch.eye(3), torch.ones(3, 2)), torch.ones(3, 2))


def test_a_run_sets_its_settings_while_it_runs_and_puts_the_callers_back(settings_restored):
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.benchmark = True
    seen = []

    class Look:
        def on_round_end(self, round, metrics):
            seen.append((legacy_getters(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark))

    for kernels_mode in ("deterministic", "fast"):
        seen.clear()
        dfl.run(Config(**BASE, kernels=kernels_mode), callbacks=[Look()])
        deterministic = kernels_mode == "deterministic"
        assert seen and all(s == (("highest", False, False), deterministic, not deterministic) for s in seen), seen
        assert legacy_getters()[:2] == ("high", True) and torch.backends.cudnn.benchmark


def test_kernels_is_a_fixed_choice():
    with pytest.raises(ConfigError, match="kernels must be one of deterministic, fast; got 'exact'"):
        validate(Config(kernels="exact"))

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

"""dfl.models: shapes, vmap == loop (forward and gradients), unfold == native, init, errors, counts."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from dfl.models import MODELS, build_model, model_options, num_params, param_layout
from dfl.models.layers import Conv1d, Conv2d

# (name, natural input shape, classes, options) -- small enough for fast tests
CASES = [
    ("logreg", (1, 28, 28), 10, {}),
    ("mlp", (40,), 10, {"hidden": (16, 8)}),
    ("cnn1d", (1, 40), 10, {}),
    ("cnn", (1, 28, 28), 62, {}),
    ("cnn", (3, 32, 32), 10, {}),
    ("resnet20", (3, 32, 32), 10, {}),
    ("resnet18", (3, 32, 32), 100, {}),
    ("vgg11", (3, 32, 32), 10, {}),
]
CONV_MODELS = {"cnn1d", "cnn", "resnet18", "resnet20", "vgg11"}
# (name, classes) of CASES whose loop over clients takes over ~5 s on 2 cores
SLOW_TO_LOOP = {("cnn", 62), ("resnet20", 10), ("resnet18", 100), ("vgg11", 10)}


def _impls(name):
    return ("unfold", "native", "auto") if name in CONV_MODELS else (None,)


def _build(name, shape, k, opts, impl, seed=0):
    torch.manual_seed(seed)
    extra = {} if impl is None else {"conv_impl": impl}
    return build_model(name, shape, k, **opts, **extra)


def _client_params(model, m, seed=1):
    """m distinct parameter sets: the init plus per-client noise, as views of one [m, d] tensor."""
    g = torch.Generator().manual_seed(seed)
    row = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat = row + 0.05 * torch.randn(m, row.numel(), generator=g)
    return {n: flat[:, o : o + c].view(m, *s) for n, s, c, o in param_layout(model)}


def _close(a, b, tol=1e-5):
    """|a - b| <= tol * max(1, max|b|) elementwise-max (relative for large gradients)."""
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


def test_model_names():
    assert MODELS.names() == ("logreg", "mlp", "cnn1d", "cnn", "resnet18", "resnet20", "vgg11")


@pytest.mark.parametrize("name,shape,k,opts", CASES)
def test_output_shape_and_no_buffers(name, shape, k, opts):
    model = _build(name, shape, k, opts, None)
    assert model(torch.randn(3, *shape)).shape == (3, k)
    assert list(model.buffers()) == []
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())


def test_cnn1d_accepts_signals_without_channel_axis():
    a = _build("cnn1d", (40,), 10, {}, None)
    b = _build("cnn1d", (1, 40), 10, {}, None)
    x = torch.randn(4, 40)
    torch.testing.assert_close(a(x), b(x.unsqueeze(1)))


@pytest.mark.parametrize("name,shape,k,opts", [
    pytest.param(*case, marks=pytest.mark.slow) if (case[0], case[2]) in SLOW_TO_LOOP else case for case in CASES])
def test_vmap_equals_loop_forward_and_grad(name, shape, k, opts):
    m, batch = (2, 2) if name in ("resnet18", "vgg11") else (3, 4)
    torch.manual_seed(2)
    x = torch.randn(m, batch, *shape)
    y = torch.randint(0, k, (m, batch))
    for impl in _impls(name):
        model = _build(name, shape, k, opts, impl)
        params = _client_params(model, m)

        def loss_fn(p, x, y, model=model):
            return F.cross_entropy(functional_call(model, p, (x,)), y)

        # Gradients in float64: a deep ReLU net's gradient jumps where a pre-activation sits within fp32 rounding
        # of 0 (resnet20 here: 2e-4 from a 1e-7 relative change of the input), so fp32 vmap and loop may round to
        # different sides of a kink on some CPUs; in float64 the identity is checked to rounding, kernel-independent.
        params64, x64 = {n: t.double() for n, t in params.items()}, x.double()
        with warnings.catch_warnings():  # a missing vmap batching rule falls back to a slow loop: fail
            warnings.filterwarnings("error", message=".*batching rule.*")
            out = vmap(lambda p, x, model=model: functional_call(model, p, (x,)))(params, x)
            grads = vmap(grad(loss_fn))(params, x, y)
            grads64 = vmap(grad(loss_fn))(params64, x64, y)
        assert all(g.dtype == torch.float32 and g.shape == params[n].shape for n, g in grads.items())
        for i in range(m):
            p_i = {n: t[i] for n, t in params.items()}
            assert _close(out[i], functional_call(model, p_i, (x[i],))), (name, impl)
            leaves = {n: t[i].clone().requires_grad_() for n, t in params64.items()}
            ref = torch.autograd.grad(loss_fn(leaves, x64[i], y[i]), list(leaves.values()))
            for n, g_ref in zip(leaves, ref):
                assert _close(grads64[n][i], g_ref, tol=1e-10), (name, impl, n)


def test_vmap_over_shared_inputs_for_evaluation():
    model = _build("cnn", (1, 28, 28), 10, {}, "unfold")
    params = _client_params(model, 3)
    x = torch.randn(5, 1, 28, 28)
    out = vmap(lambda p, x: functional_call(model, p, (x,)), in_dims=(0, None))(params, x)
    for i in range(3):
        assert _close(out[i], functional_call(model, {n: t[i] for n, t in params.items()}, (x,)))


@pytest.mark.parametrize("name,shape,k,opts", [c for c in CASES if c[0] in CONV_MODELS])
def test_unfold_equals_native(name, shape, k, opts):
    a = _build(name, shape, k, opts, "unfold")
    b = _build(name, shape, k, opts, "native")
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)  # conv_impl does not change the init
    x = torch.randn(2, *shape)
    assert _close(a(x), b(x))
    y = torch.randint(0, k, (2,))
    ga = torch.autograd.grad(F.cross_entropy(a(x), y), list(a.parameters()))
    gb = torch.autograd.grad(F.cross_entropy(b(x), y), list(b.parameters()))
    assert all(_close(u, v) for u, v in zip(ga, gb))


@pytest.mark.parametrize("cls,shape", [(Conv1d, (2, 3, 11)), (Conv2d, (2, 3, 9, 10))])
@pytest.mark.parametrize("kernel,stride,padding,bias", [(3, 1, 0, True), (3, 2, 1, False), (5, 1, 2, True),
                                                        (1, 2, 0, False), (4, 3, 1, True)])
def test_conv_layers_match_torch(cls, shape, kernel, stride, padding, bias):
    torch.manual_seed(0)
    conv = cls(3, 5, kernel, stride, padding, bias, conv_impl="unfold")
    ref = (torch.nn.Conv1d if cls is Conv1d else torch.nn.Conv2d)(3, 5, kernel, stride, padding, bias=bias)
    ref.load_state_dict(conv.state_dict())
    x = torch.randn(shape)
    assert _close(conv(x), ref(x))


def test_conv_init_matches_torch_default():
    """Same seed -> the same init as torch.nn.Conv2d (the default PyTorch initialization)."""
    torch.manual_seed(3)
    ours = Conv2d(4, 6, 3)
    torch.manual_seed(3)
    ref = torch.nn.Conv2d(4, 6, 3)
    assert torch.equal(ours.weight, ref.weight) and torch.equal(ours.bias, ref.bias)


@pytest.mark.parametrize("name,shape,k,opts", CASES[:5])
def test_init_is_deterministic_given_seed(name, shape, k, opts):
    a, b, c = (_build(name, shape, k, opts, None, seed=s) for s in (7, 7, 8))
    flat = [torch.cat([p.reshape(-1) for p in mdl.parameters()]) for mdl in (a, b, c)]
    assert torch.equal(flat[0], flat[1]) and not torch.equal(flat[0], flat[2])


def test_num_params_and_layout():
    # McMahan et al.'s CNN: 5*5*32+32 + 5*5*32*64+64 + 3136*512+512 + 512*10+10 = 1,663,370 (as in the paper)
    assert num_params(build_model("cnn", (1, 28, 28), 10)) == 1_663_370
    # cnn1d on MNIST-1D: (5*32+32) + (3*32*32+32) + (1280*10+10)
    assert num_params(build_model("cnn1d", (1, 40), 10)) == 192 + 3104 + 12810
    mlp = build_model("mlp", (40,), 10, hidden=[200, 200])
    assert num_params(mlp) == (40 * 200 + 200) + (200 * 200 + 200) + (200 * 10 + 10)
    model = build_model("cnn", (3, 32, 32), 10)
    layout = param_layout(model)
    assert [n for n, *_ in layout] == [n for n, _ in model.named_parameters()]
    assert layout[0] == ("conv1.weight", (64, 3, 5, 5), 4800, 0)
    assert all(o2 == o1 + c1 for (_, _, c1, o1), (_, _, _, o2) in zip(layout, layout[1:]))
    assert layout[-1][3] + layout[-1][2] == num_params(model)


def test_resnet_groups_option():
    model = build_model("resnet20", (3, 32, 32), 10, groups=8)
    assert all(m.num_groups == 8 for m in model.modules() if isinstance(m, torch.nn.GroupNorm))
    with pytest.raises(ValueError, match="groups must divide"):
        build_model("resnet20", (3, 32, 32), 10, groups=3)
    with pytest.raises(ValueError, match="groups must be a positive int"):
        build_model("resnet18", (3, 32, 32), 10, groups=0)


def test_cnn_variants():
    assert build_model("cnn", (1, 28, 28), 10).conv1.out_channels == 32  # auto -> mcmahan
    assert build_model("cnn", (3, 32, 32), 10).conv1.out_channels == 64  # auto -> cifar
    assert build_model("cnn", (3, 32, 32), 10, variant="mcmahan").conv1.out_channels == 32
    assert num_params(build_model("cnn", (3, 32, 32), 10, variant="cifar")) == (
        5 * 5 * 3 * 64 + 64 + 5 * 5 * 64 * 64 + 64 + 1600 * 384 + 384 + 384 * 192 + 192 + 192 * 10 + 10)


@pytest.mark.parametrize("call,match", [
    (lambda: build_model("resnet50", (3, 32, 32), 10), r"model must be one of logreg, mlp"),
    (lambda: build_model("mlp", (40,), 10, width=3), r"option\(s\) \['width'\].*allowed: \['hidden'\]"),
    (lambda: build_model("logreg", (40,), 10, conv_impl="unfold"), r"unknown option.*allowed: none"),
    (lambda: build_model("cnn1d", (1, 40), 10, conv_impl="fft"), r"conv_impl must be one of \('auto'"),
    (lambda: build_model("cnn", (1, 28, 28), 10, variant="lenet"), r"variant must be one of"),
    (lambda: build_model("mlp", (40,), 10, hidden=(10, -1)), r"hidden\[i\] must be a positive int"),
    (lambda: build_model("mlp", (40,), 10, hidden="200"), r"hidden must be a sequence"),
    (lambda: build_model("cnn1d", (3, 32, 32), 10), r"'cnn1d' expects a 1-D signal"),
    (lambda: build_model("cnn", (1, 40), 10), r"'cnn' expects images"),
    (lambda: build_model("resnet18", (784,), 10), r"'resnet18' expects images"),
    (lambda: build_model("vgg11", (3, 16, 16), 10), r"at least 32x32"),
    (lambda: build_model("cnn", (3, 12, 12), 10), r"at least 16x16"),
    (lambda: build_model("mlp", (0, 3), 10), r"input_shape must be"),
    (lambda: build_model("mlp", (2.5,), 10), r"input_shape must be"),
    (lambda: build_model("mlp", 40, 10), r"input_shape must be"),
    (lambda: build_model("mlp", (40,), 1), r"num_classes must be an int >= 2"),
    (lambda: model_options("nope"), r"model must be one of"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_auto_conv_impl_is_native_and_unfold_is_not(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "conv1d", lambda *a, **k: calls.append("conv1d") or torch.zeros(1))
    monkeypatch.setattr(F, "conv2d", lambda *a, **k: calls.append("conv2d") or torch.zeros(1))
    Conv1d(1, 2, 3, conv_impl="auto")(torch.randn(1, 1, 8))
    Conv2d(1, 2, 3, conv_impl="auto")(torch.randn(1, 1, 8, 8))
    Conv1d(1, 2, 3, conv_impl="unfold")(torch.randn(1, 1, 8))
    Conv2d(1, 2, 3, conv_impl="unfold")(torch.randn(1, 1, 8, 8))
    assert calls == ["conv1d", "conv2d"]

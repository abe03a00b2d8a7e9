"""The cnn1d convolutions of a vectorized step, laid out five ways: which formulation a round should use.

Under `vmap`, a convolution with per-client weights becomes one grouped convolution (groups = clients, the clients'
channels side by side, oneDNN's NCW layout): what the engine runs today. The alternatives timed here, each on the
same values, forward and backward (weight and input gradients) for `--clients` clients of batch `--batch`:

  grouped            F.conv1d with groups = clients, NCW (today's engine)
  grouped NHWC       the same grouped convolution as F.conv2d on channels-last tensors (oneDNN's NHWC kernels)
  per-client loop    one dense F.conv1d per client (what a per-client simulator such as pfl runs)
  im2col + bmm       the k shifted slices stacked, one batched matmul over the clients (`conv_impl = "unfold"`)

and the whole vmapped gradient of the cnn1d loss (two convolutions, ReLU, the linear head, cross-entropy), four ways:
today's conv1d; conv2d on contiguous inputs; conv2d with the input laid out clients-innermost, so that vmap's
grouped convolution sees channels-last tensors all the way (the layout propagates through ReLU and the second
convolution); and an `autograd.Function` whose vmap rule runs forward and backward as NHWC grouped convolutions
(a batched formulation outside vmap's own convolution rule). Times are medians of `--repeats` calls after two
warm-up calls; gradients are compared with today's.

    python benchmarks/conv_layouts.py --threads 1
    python benchmarks/conv_layouts.py --threads 2 --clients 10
"""

from __future__ import annotations

import argparse
import time

import dfl  # noqa: F401 (first: dfl's OpenMP settings apply before torch loads)

# isort: split
import torch
import torch.nn.functional as F
from torch.func import grad_and_value, vmap


def median_ms(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return 1e3 * sorted(times)[repeats // 2]


LAYOUTS = ("grouped", "grouped NHWC", "per-client loop", "im2col + bmm")


def layer_ms(c: int, o: int, k: int, p: int, m: int, batch: int, length: int, repeats: int) -> list[float]:
    """Forward + backward of one convolution (c -> o channels, kernel k, padding p) for m clients, each layout."""
    xg = torch.randn(batch, m * c, length, requires_grad=True)
    wg = torch.randn(m * o, c, k, requires_grad=True)
    x4 = xg.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last).requires_grad_()
    w4 = wg.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last).requires_grad_()
    xs = [xg.detach()[:, i * c:(i + 1) * c].clone().requires_grad_() for i in range(m)]
    ws = [wg.detach()[i * o:(i + 1) * o].clone().requires_grad_() for i in range(m)]
    xb = torch.stack(xs).detach().requires_grad_()
    wb = torch.stack(ws).detach().reshape(m, o, c * k).requires_grad_()

    def backward(y):
        y.backward(torch.ones_like(y))

    def im2col():
        xp = F.pad(xb, (p, p)).transpose(2, 3)  # [m, B, L + 2p, C]
        cols = torch.stack([xp[:, :, j:j + length] for j in range(k)], -1).reshape(m, batch * length, c * k)
        backward(cols @ wb.transpose(1, 2))

    fns = (lambda: backward(F.conv1d(xg, wg, None, 1, p, 1, m)),
           lambda: backward(F.conv2d(x4, w4, None, 1, (0, p), 1, m)),
           lambda: [backward(F.conv1d(x, w, None, 1, p)) for x, w in zip(xs, ws)],
           im2col)
    return [median_ms(fn, repeats) for fn in fns]


def layers(m: int, batch: int, length: int, repeats: int) -> list[str]:
    rows = ["| layer (forward + backward), ms | " + " | ".join(LAYOUTS) + " |", "|---|" + "---:|" * len(LAYOUTS)]
    for c, o, k, p in ((1, 32, 5, 2), (32, 32, 3, 1)):  # cnn1d's conv1 and conv2
        times = layer_ms(c, o, k, p, m, batch, length, repeats)
        rows.append(f"| conv {c}→{o}, k {k} | " + " | ".join(f"{t:.1f}" for t in times) + " |")
    return rows


def _nhwc(t: torch.Tensor, bdim: int | None) -> tuple[torch.Tensor, int]:
    """Batched [m, B, C, L] (batch dim `bdim`) -> [B, m*C, 1, L] channels-last: vmap's grouped layout, NHWC."""
    t = t.movedim(bdim, 0) if bdim is not None else t
    m, b, c, length = t.shape
    return t.permute(1, 0, 2, 3).reshape(b, m * c, 1, length).contiguous(memory_format=torch.channels_last), m


def _from_nhwc(y: torch.Tensor, m: int) -> torch.Tensor:
    """[B, m*O, 1, L] channels-last -> batched [m, B, O, L] (a view: physically [B, L, m, O])."""
    b, mo, _, length = y.shape
    return y.view(b, m, mo // m, length).permute(1, 0, 2, 3)


class _ConvBackward(torch.autograd.Function):
    """conv1d's backward as its own function, so that under vmap it too runs as one NHWC grouped convolution."""

    @staticmethod
    def forward(grad, x, weight, padding, need_x):
        return tuple(torch.ops.aten.convolution_backward(grad, x, weight, [weight.shape[0]], [1], [padding], [1],
                                                         False, [0], 1, [need_x, True, True]))

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("no double backward")

    @staticmethod
    def vmap(info, in_dims, grad, x, weight, padding, need_x):
        g4, m = _nhwc(grad, in_dims[0])
        x4, _ = _nhwc(x, in_dims[1])
        w = weight.movedim(in_dims[2], 0)
        _, o, c, k = w.shape
        w4 = w.reshape(m * o, c, 1, k).contiguous(memory_format=torch.channels_last)
        gx, gw, gb = torch.ops.aten.convolution_backward(g4, x4, w4, [m * o], [1, 1], [0, padding], [1, 1], False,
                                                         [0, 0], m, [need_x, True, True])
        return (_from_nhwc(gx, m) if need_x else None, gw.reshape(m, o, c, k), gb.reshape(m, o)), (0, 0, 0)


class _ConvNHWC(torch.autograd.Function):
    """F.conv1d (stride 1, bias) whose vmap rule runs the clients' grouped convolution in NHWC and leaves the
    output in that layout (a permuted view), so the next convolution needs no copy."""

    @staticmethod
    def forward(x, weight, bias, padding):
        return F.conv1d(x, weight, bias, 1, padding)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, _, padding = inputs
        ctx.save_for_backward(x, weight)
        ctx.padding = padding

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        gx, gw, gb = _ConvBackward.apply(grad, x, weight, ctx.padding, ctx.needs_input_grad[0])
        return gx, gw, gb, None

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, padding):
        x4, m = _nhwc(x, in_dims[0])
        w = weight.movedim(in_dims[1], 0)
        _, o, c, k = w.shape
        y = F.conv2d(x4, w.reshape(m * o, c, 1, k), bias.movedim(in_dims[2], 0).reshape(m * o), 1, (0, padding), 1, m)
        return _from_nhwc(y, m), 0


def step(m: int, batch: int, length: int, repeats: int) -> list[str]:
    def loss(conv, params, x, y):
        w1, b1, w2, b2, wf, bf = params
        # contiguous(): the second activation leaves the NHWC view (if any) before ReLU, so ReLU's backward and
        # the head see one layout (mixed layouts made ReLU's backward 3x slower)
        h = conv(conv(x, w1, b1, 2).relu(), w2, b2, 1).contiguous().relu()
        logits = h.flatten(1) @ wf.t() + bf
        return -torch.log_softmax(logits, 1).gather(1, y.unsqueeze(1)).mean()

    def conv1d(x, w, b, p):
        return F.conv1d(x, w, b, 1, p)

    def conv2d(x, w, b, p):  # x: [B, C, L] or already [B, C, 1, L]
        return F.conv2d(x if x.dim() == 4 else x.unsqueeze(2), w.unsqueeze(2), b, 1, (0, p))

    torch.manual_seed(0)
    params = [torch.randn(m, 32, 1, 5) * 0.3, torch.randn(m, 32) * 0.1, torch.randn(m, 32, 32, 3) * 0.1,
              torch.randn(m, 32) * 0.1, torch.randn(m, 10, 32 * length) * 0.03, torch.randn(m, 10) * 0.1]
    x, y = torch.randn(m, batch, 1, length), torch.randint(0, 10, (m, batch))
    inner = x.permute(1, 2, 3, 0).contiguous().permute(3, 0, 1, 2)  # the same values, clients innermost
    cases = {"conv1d (today)": (conv1d, x), "conv2d": (conv2d, x), "conv2d, input clients-innermost": (conv2d, inner),
             "NHWC grouped convolutions (autograd.Function with a vmap rule)": (_ConvNHWC.apply, x)}
    ref = None
    rows = ["| the vmapped gradient of cnn1d's loss | ms per call | max abs gradient difference to today |",
            "|---|---:|---:|"]
    for name, (conv, xx) in cases.items():
        fn = vmap(grad_and_value(lambda p, a, b, conv=conv: loss(conv, p, a, b)))
        grads, _ = fn(params, xx, y)
        ref = ref or grads
        diff = max(float((a - b).abs().max()) for a, b in zip(grads, ref))
        rows.append(f"| {name} | {median_ms(lambda fn=fn, xx=xx: fn(params, xx, y), repeats):.1f} | {diff:.1e} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=40, help="signal length (MNIST-1D: 40)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.clients} clients × batch {args.batch}, length {args.length}, {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}\n")
    print("\n".join(layers(args.clients, args.batch, args.length, args.repeats)) + "\n")
    print("\n".join(step(args.clients, args.batch, args.length, args.repeats)))


if __name__ == "__main__":
    main()

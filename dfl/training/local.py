"""Vectorized local training: per-client gradients, SAM/ASAM, clipping, weight decay, momentum or Adam.

All rules act row by row on the `[m, d]` stack: norms, clipping and SAM perturbations are per client,
never across the stack. One `vmap(grad)` call computes the minibatch gradients of a chunk of clients
(`client_chunk`, "auto" = measured by `plan_chunk`, see `dfl.training.memory`), differentiating per-parameter tensors
(`ParamLayout.split`) and joining the gradients with one `cat` (optionally through `torch.compile`,
`Config.compile`, and under bf16 autocast, `Config.precision`).

One local step for client i with minibatch ξ (docs/reference/update-rules.md#sam-and-asam, torch.optim.SGD semantics):
    g  = ∇f_i(y; ξ)                              plain, or
    g  = ∇f_i(y + ε; ξ),  ε = ρ g₀/(‖g₀‖ + ε₀)    SAM (g₀ = ∇f_i(y; ξ), same ξ; step taken from y)
    ε  = ρ T²g₀/‖T g₀‖,   T = |y| + η_a           ASAM (T on tensors named "weight", 1 elsewhere)
    g  ← g + μ (y − a)                            a proximal term μ/2 ‖y − a‖² of the loss (FedProx; `Proximal`)
    g  ← transform(g)                             algorithm-specific correction (SCAFFOLD, FedCM, ...)
    g  ← g · min(1, c/‖g‖)                        per-client clipping (c = clip_grad_norm)
    g  ← g + λ y                                  weight decay
    b  ← μ b + g;   y ← y − η b                   heavy-ball momentum (μ = 0: SGD)
    y  ← y ⊙ m                                   sparse training (a per-client mask m, DisPFL): after every step
With `optimizer = "adam"` / `"adamw"` the last two lines are torch's Adam/AdamW step instead (`dfl.training.adam`): the
SAM ascent still uses the plain gradient g₀, and Adam's moments are fed the gradient at the perturbed point.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, grad_and_value, vmap

from dfl.config import LOCAL_OPTIMIZERS, Config
from dfl.data.sampler import Batch, RoundSchedule
from dfl.errors import ConfigError
from dfl.training import memory
from dfl.training.adam import AdamState
from dfl.training.batched import batched_forward_of, batched_grad_and_value
from dfl.training.clients import ParamLayout
from dfl.training.precision import warn_if_slow_bf16
from dfl.training.privacy import ClientPrivacy

SAM_EPS = 1e-12

# transform(g, y, rows) -> g: a correction of the clients' descent direction (rows = local client ids).
Transform = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Proximal:
    """A proximal term μ/2 ‖y − a‖² added to every training client's loss: each step's gradient gains μ (y − a).

    It enters where the loss gradient does (after the SAM gradient, before the transform, clipping, weight decay
    and momentum or Adam) and is applied parameter by parameter on SGD's fast path, so μ = 0 changes no bit.

    Attributes:
        mu: μ ≥ 0.
        anchor: a, `[d]` (the same for every client, e.g. FedProx's global model x_t) or `[m_local, d]` (one per row).
    """

    mu: float
    anchor: torch.Tensor

    def rows(self, where: slice | torch.Tensor) -> torch.Tensor:
        """The anchor of the stack's rows `where`: [d] for a shared anchor, else those rows."""
        return self.anchor if self.anchor.dim() == 1 else self.anchor[where]


@dataclass(frozen=True)
class LocalRule:
    """How a client takes a local step: the SAM variant and radius, momentum or Adam, weight decay, clipping."""

    rho: float = 0.0  # SAM radius; 0 = plain gradient
    sam: str = "sam"  # "sam" or "asam"
    asam_eta: float = 0.2
    asam_form: str = "kwon"  # ASAM's T: "kwon" (|w| + asam_eta on weights, 1 on biases) or "dp-fedsam" (|w|)
    momentum: float = 0.0
    weight_decay: float = 0.0  # SGD and Adam: L2 added to the gradient; AdamW: decoupled decay
    clip_grad_norm: float = 0.0  # 0 = off
    optimizer: str = "sgd"  # "sgd" (with `momentum`), "adam" or "adamw"
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8

    def __post_init__(self):
        if self.optimizer not in LOCAL_OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {', '.join(LOCAL_OPTIMIZERS)}; got {self.optimizer!r}")
        if self.optimizer != "sgd" and self.momentum > 0:
            raise ConfigError(f"momentum = {self.momentum} is SGD's heavy ball; {self.optimizer} has its own first "
                              "moment (adam_betas[0])")


@dataclass
class LocalResult:
    """The clients after one round of local training (`LocalTrainer.train`)."""

    Y: torch.Tensor  # [m, d] parameters after local training
    momentum: torch.Tensor | None  # [m, d] final momentum buffers (None when μ = 0)
    loss: torch.Tensor  # [m] mean minibatch loss of each client over its steps
    steps: torch.Tensor  # [m] steps each client took
    adam: AdamState | None = None  # the clients' Adam state after the round (optimizer "adam"/"adamw")


class LocalTrainer:
    """Trains a block of clients (rows of X) for one round, vectorized over clients."""

    def __init__(self, model, layout: ParamLayout, data, client_ids: list[int], config: Config):
        self.layout = layout
        self.data = data
        self.client_ids = list(client_ids)
        self.seed = config.seed
        self.batch_size = config.batch_size
        self.mode, self.amount = config.epochs_or_steps
        # "auto": measured on the first batch (`plan_chunk`); 0: all clients in one call; N: N clients per call
        self.client_chunk = config.client_chunk
        self.chunk: int | None = None if isinstance(config.client_chunk, str) else (config.client_chunk or max(
            1, len(self.client_ids)))  # a string is "auto" (`Config.validate`)
        self.memory_estimate: dict | None = None
        # optional (round, client ids) -> max local steps per client, e.g. stragglers stopped by a deadline
        # (`dfl.network.faults.Stragglers.cap`); None = every client takes all its steps
        self.step_cap: Callable[[int | np.ndarray, list[int]], np.ndarray] | None = None
        # ASAM's T (asam_form "kwon") adds η on the parameters named "weight": the [d] mask, and its per-parameter views
        self.weight_mask = layout.mask(lambda name: "weight" in name).to(data.train_x.device)
        self.weight_masks = layout.split(self.weight_mask)
        # client-level differential privacy (dp_clip > 0; else None): every `train` releases clipped, noised updates
        self.privacy: ClientPrivacy | None = ClientPrivacy.of(config, self.client_ids)

        device_type, bf16 = data.train_x.device.type, config.precision == "bf16"
        warn_if_slow_bf16(config.precision, device_type)  # emulated bf16 is ~40× slower than fp32

        def loss(params, x, y, w):  # params: one tensor per parameter (`ParamLayout.split`), not views of a row
            with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
                logits = functional_call(model, layout.named(params), (x,))
            # the loss itself in fp32. Cross-entropy as log_softmax + gather (class dim 1, as F.cross_entropy): the
            # same kernels and bitwise the same values and gradients, but F.cross_entropy under vmap decomposes
            # into many small kernels (nll_loss's batching rule), ~0.5 ms a call at logreg × 300
            losses = -torch.log_softmax(logits.float(), dim=1).gather(1, y.unsqueeze(1)).squeeze(1)
            return (losses * w).sum() / w.sum()

        # randomness="different": a model's random ops (dropout) draw independently for every client; models
        # without any (all built-ins) compute exactly what they would without it
        self._grad = self._eager_grad = vmap(grad_and_value(loss), randomness="different")
        # a built-in model's batched forward: the same gradients from one backward of the clients' summed losses,
        # without vmap (`dfl.training.batched`); torch.compile keeps compiling the vmapped gradient
        forward = batched_forward_of(model)
        self.batched = forward is not None and not config.compile
        if forward is not None and self.batched:
            self._grad = self._eager_grad = batched_grad_and_value(forward, layout, device_type, bf16)
        self.compiled = bool(config.compile)
        if self.compiled:
            if device_type == "cpu":
                require_cpp_compiler()
            elif device_type == "cuda":
                require_triton(data.train_x.device)
            # dynamic=False and a few fixed client counts (`compiled_sizes`: each call padded up to one): one graph
            # per count, compiled once, however the clients are chunked; every call's rows in one layout (row
            # views of an [a, d] stack, the SAM point too), so no stride guard fails either
            self._grad = torch.compile(self._grad, dynamic=False)
        if self.chunk is not None:
            self.chunk = self._even_chunk(self.chunk)

    def schedule(self, round_index: int | np.ndarray, rows: torch.Tensor | None = None) -> RoundSchedule:
        """Round `round_index`'s batches for the local clients (or only the local rows `rows`).

        An array gives every client its own round (the asynchronous mode, `dfl.engine.asynchronous`: each client
        at its own update).
        """
        ids = self.client_ids if rows is None else [self.client_ids[r] for r in rows.tolist()]
        first = int(np.min(round_index))  # a round, or the earliest of the clients' rounds
        torch.manual_seed(dropout_seed(self.seed, first, ids[0] if ids else 0))
        cap = None if self.step_cap is None else self.step_cap(round_index, ids)
        return RoundSchedule(self.data, ids, round_index, self.seed, self.batch_size, self.mode, self.amount, cap)

    # ---------------------------------------------------------------- clients per vectorized call
    def plan_chunk(self, X: torch.Tensor, held_bytes: int | None = None) -> int:
        """Measure a gradient call's memory and resolve `client_chunk`.

        The call is measured on round 0's first batch (`dfl.training.memory`); "auto" becomes the largest chunk that
        fits and is fast; an explicit chunk is kept (a warning says when the estimate puts it above memory). Raises
        ConfigError with the estimate when not even one client fits. held_bytes: the per-client stacks this process
        holds (`dfl.training.memory.held_bytes`; None: X alone).
        """
        m = X.shape[0]
        probe = min(4, m)
        batch = self.schedule(0, torch.arange(probe)).batch(0)
        rows = batch.rows.to(X.device)

        def call(k: int):
            part = batch.slice(0, k)
            return self._eager_grad(self.layout.split(X[rows[:k]]), part.x, part.y, part.weight)

        fixed, per_client = memory.measure_footprint(call, len(rows), X.device) if len(rows) else (0, 1)
        auto, estimate = memory.choose_chunk(
            m, fixed, per_client, X.shape[1] * X.element_size(), memory.available_bytes(X.device), X.device,
            held_bytes)
        chunk = auto if self.client_chunk == "auto" or self.chunk is None else self.chunk
        # only an explicit chunk can exceed it; one above this process's clients (a torchrun world's block) calls them
        # all at once, which memory_limit (at most m) allows when they fit
        if min(chunk, m) > estimate["memory_limit"]:
            warnings.warn(f"client_chunk = {chunk} may not fit in memory: the estimate allows "
                          f"{estimate['memory_limit']} clients per call ({estimate})", stacklevel=2)
        estimate["chunk"] = self.chunk = chunk = self._even_chunk(chunk)
        self.memory_estimate = estimate
        return chunk

    def _even_chunk(self, chunk: int) -> int:
        """The chunk a run uses: `chunk` (eager), or compiled the one that makes ⌈m/chunk⌉ calls of equal size.

        Equal up to one client, so that the last call, padded to the chunk, costs at most one client more (100 clients
        by 64: two calls of 50, not 64 + 36 padded to 64).
        """
        if not self.compiled:
            return chunk
        m = max(1, len(self.client_ids))
        chunk = max(1, min(chunk, m))
        return -(-m // -(-m // chunk))

    # ---------------------------------------------------------------- gradients of a batch
    def gradient(self, Xb: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client minibatch gradients and losses at the rows Xb = X[batch.rows]: ([a, d], [a])."""
        chunk = self.chunk if self.chunk is not None else self.plan_chunk(Xb)
        a = Xb.shape[0]
        grads = torch.empty_like(Xb)
        losses = torch.empty(a, dtype=Xb.dtype, device=Xb.device)
        for s in range(0, a, chunk):
            e = min(s + chunk, a)
            g, losses[s:e] = self._rows_grad(Xb[s:e], batch.slice(s, e))
            self.layout.join(g, out=grads[s:e])
        return grads, losses

    def _rows_grad(self, rows: torch.Tensor, batch: Batch) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Per-parameter gradients and losses of the [a, d] rows (row views: the layout of every call).

        Compiled, the call is padded to the next of `compiled_sizes` by repeating the last client (its rows and
        batch); the padding's results are dropped. Each client's gradient depends on its own row and batch only.
        """
        a = rows.shape[0]
        size = padded_size(a, self.chunk) if self.compiled and self.chunk else a
        if size != a:
            rows, batch = _pad_rows(rows, size), Batch(batch.rows, *(_pad_rows(t, size) for t in (
                batch.x, batch.y, batch.weight)))
        g, loss = self._grad(self.layout.split(rows), batch.x, batch.y, batch.weight)
        if size != a:
            g, loss = tuple(q[:a] for q in g), loss[:a]
        return g, loss

    def sam_gradient(self, Xb: torch.Tensor, batch: Batch, rule: LocalRule) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient at the SAM/ASAM point of the same minibatch, and the loss at Xb.

        Args:
            Xb: [a, d] rows of the clients in `batch`.
            batch: their minibatch ξ.
            rule: ρ and the SAM variant (`sam_point`); ρ = 0 gives the plain gradient.

        Returns:
            (∇f(y + ε; ξ) [a, d], f(y; ξ) [a]).
        """
        g, loss = self.gradient(Xb, batch)
        if rule.rho == 0:
            return g, loss
        (point,) = sam_point((Xb,), (g,), rule, (self.weight_mask,))
        return self.gradient(point, batch)[0], loss

    def _sgd_step(self, Yb: torch.Tensor, b: torch.Tensor | None, batch: Batch, rule: LocalRule, lr: float,
                  proximal: tuple[float, torch.Tensor] | None = None):
        """One SGD step, parameter by parameter, of the rows Yb.

        One step of SGD (SAM, clipping, weight decay, heavy-ball momentum; `rule.optimizer == "sgd"`, `rule.sam
        == "sam"`) for the rows Yb with momentum rows b, both updated in place; returns the losses [a] at Yb.
        `proximal`: (μ, the anchor of these rows, [d] or [a, d]) adds μ (y − anchor) to the gradient.

        The same arithmetic as `sam_gradient` + `descent_direction`, element by element, but parameter by parameter
        on the gradients' own tensors and `ParamLayout.split` views of Yb and b: no `cat` joining the gradients into
        [a, d] rows (two per SAM step), no [a, d] temporaries for the update. Only the per-client norms (SAM,
        clipping) sum in another order: the norm of the per-parameter norms.
        """
        ys = self.layout.split(Yb)
        grads, loss = self._rows_grad(Yb, batch)
        g: Sequence[torch.Tensor] = grads
        if rule.rho > 0:  # the gradient at the SAM point y + ρ g/(‖g‖+ε₀), parameter by parameter, written into
            point = torch.empty_like(Yb)  # [a, d] rows: the same layout as Yb's (one compiled graph for both calls)
            sam_point(ys, g, rule, self.weight_masks, out=self.layout.split(point))
            g = self._rows_grad(point, batch)[0]
        if proximal is not None:  # + μ (y − a); a [*shape] part of a shared anchor broadcasts over the rows
            mu, anchor = proximal
            g = [q.add(y - a, alpha=mu) for q, y, a in zip(g, ys, self.layout.split(anchor))]
        if rule.clip_grad_norm > 0:
            factor = (rule.clip_grad_norm / (row_norms(g) + 1e-6)).clamp(max=1.0)
            g = [q * per_row(factor, q) for q in g]
        if rule.weight_decay > 0:
            g = [q + rule.weight_decay * y for q, y in zip(g, ys)]
        if b is not None:  # b ← μ b + g in place (the same two roundings as μ·b + g), and the step is along b
            bs = self.layout.split(b)
            for bp, q in zip(bs, g):
                bp.mul_(rule.momentum).add_(q)
            g = bs
        for y, q in zip(ys, g):  # y ← y − η g (in place: Yb's rows)
            y.sub_(q, alpha=lr)
        return loss

    # ---------------------------------------------------------------- one round of local steps
    def train(  # over 50 lines: eight arguments and the round's pseudo-code in the docstring
        self,
        X: torch.Tensor,
        round_index: int | np.ndarray,
        lr: float,
        rule: LocalRule,
        momentum: torch.Tensor | None = None,
        transform: Transform | None = None,
        rows: torch.Tensor | None = None,
        adam: AdamState | None = None,
        proximal: Proximal | None = None,
        mask: torch.Tensor | None = None,
    ) -> LocalResult:
        """K local steps of `rule` from X (not modified), as in the papers' pseudo-code.

            for k = 0 .. K−1, for every client i (a chunk of clients per vectorized call):
                g ← ∇f_i(sam_point(y_i); ξ_{i,k})        (the plain gradient when ρ = 0)
                g ← g + μ (y_i − a_i)                     (a proximal term of the loss, if any)
                g ← transform(g)                          (an algorithm's correction, if any)
                y_i ← y_i − η · direction(g)              (clipping, weight decay, momentum or Adam)
                y_i ← y_i ⊙ m_i                           (with a mask: sparse training)
            y_i ← x_i + clip_C(y_i − x_i) + σC ξ_i           (with differential privacy, `privacy`: the release)

        Args:
            X: [m, d] the local clients' models at the start of the round.
            round_index: the round (an array: every client at its own round, the asynchronous mode).
            lr: the step size η.
            rule: the local rule (SAM radius and variant, momentum, weight decay, clipping, optimizer).
            momentum: [m, d] momentum buffers kept across rounds by some algorithms; None starts them at 0.
            transform: the algorithm's correction of the descent direction (SCAFFOLD, FedCM, ...), or None.
            rows: local row ids of the clients that train (e.g. the round's sampled clients); None = every row.
                The other rows, buffers, Adam state and losses are left as they are / 0.
            adam: the clients' kept Adam state (Adam/AdamW rules), updated in place; None = fresh moments.
            proximal: a proximal term μ/2 ‖y − a‖² of every client's loss (FedProx), or None.
            mask: [m, d] bool (or 0/1) per-client masks: each trained row is multiplied by its mask after every
                step, as DisPFL's code does to the parameters after each optimizer step. Gradients, clipping's norm,
                weight decay and the momentum buffer stay dense; masked coordinates start and stay at 0 (start from
                a masked X). None: no mask.

        Returns:
            The models, momentum buffers and Adam state after the round, each client's mean loss and step count.
        """
        chunk = self.chunk if self.chunk is not None else self.plan_chunk(X)
        schedule = self.schedule(round_index, rows)
        state = _RoundState.start(X, rows, rule, momentum, adam, mask)
        # SGD with SAM, clipping, weight decay and momentum runs parameter by parameter (`_sgd_step`): no [a, d] join
        # of the gradients and no [a, d] temporaries; ASAM, Adam and transforms act on the joined rows
        by_parameter = transform is None and rule.optimizer == "sgd" and (rule.rho == 0 or rule.sam == "sam")
        for k in range(schedule.steps):
            batch = schedule.batch(k)
            # Chunk by chunk, not step by step over the whole stack: every temporary (gradients, SAM points,
            # momentum updates) is [chunk, d], so a large stack never allocates (and page-faults) [m, d]
            # temporaries per step — on CPU that churn cost more than the arithmetic at 1,000 mlp clients.
            for part, at in state.chunks(batch, chunk):
                if by_parameter:
                    loss = self._sgd_step_at(state, at, part, rule, lr, proximal)
                else:
                    loss = self._rows_step_at(state, at, part, rule, lr, transform, proximal)
                state.loss_sum[at.where] += loss.detach()
        state.release(X, self.privacy, schedule.client_ids, round_index)  # with DP: the updates clipped and noised
        return state.result(schedule)

    def _sgd_step_at(self, state: _RoundState, at: _Rows, part: Batch, rule: LocalRule, lr: float,
                     proximal: Proximal | None) -> torch.Tensor:
        """One `_sgd_step` of the rows `at` of the round's stack (views updated in place, or copies written back)."""
        Yb, b = state.Y[at.where], state.momentum_at(at)
        term = None if proximal is None else (proximal.mu, proximal.rows(at.where))
        loss = self._sgd_step(Yb, b, part, rule, lr, term)
        if state.mask is not None:
            Yb.mul_(state.mask[at.where])
        if not at.is_view:
            state.Y[at.where] = Yb
            if b is not None and state.buf is not None:
                state.buf[at.where] = b
        return loss

    def _rows_step_at(self, state: _RoundState, at: _Rows, part: Batch, rule: LocalRule, lr: float,
                      transform: Transform | None, proximal: Proximal | None) -> torch.Tensor:
        """One step on joined [a, d] rows: SAM/ASAM gradient, proximal term, transform, `descent_direction`."""
        Yb, b = state.Y[at.where], state.momentum_at(at)
        g, loss = self.sam_gradient(Yb, part, rule)
        if proximal is not None:
            g = g.add(Yb - proximal.rows(at.where), alpha=proximal.mu)
        if transform is not None:
            g = transform(g, Yb, at.ids)
        step = descent_direction(g, Yb, rule, b, state.adam, at.where)
        if at.is_view:
            if b is not None:
                b.copy_(step)
            Yb.sub_(step, alpha=lr)
            if state.mask is not None:
                Yb.mul_(state.mask[at.where])
        else:
            if state.buf is not None:
                state.buf[at.where] = step
            stepped = Yb - lr * step
            state.Y[at.where] = stepped if state.mask is None else stepped.mul_(state.mask[at.where])
        return loss


@dataclass(frozen=True)
class _Rows:
    """Where a chunk of a batch sits in the round's stack.

    Attributes:
        where: how to index the stack: a slice (the batch covers every row in order, so `Y[where]` is a view
            updated in place) or the local row ids (`Y[where]` is a copy, written back).
        ids: the local row ids, always a tensor (what a transform is given).
    """

    where: slice | torch.Tensor
    ids: torch.Tensor

    @property
    def is_view(self) -> bool:
        """Whether `Y[where]` is a view of the stack (a slice) rather than a copy."""
        return isinstance(self.where, slice)


@dataclass
class _RoundState:
    """The stacks one round of `LocalTrainer.train` updates: the models Y, momentum, Adam state and summed losses.

    Attributes:
        Y: [m, d] the models (a copy of X).
        buf: [m, d] momentum buffers (None when μ = 0).
        adam: the clients' Adam state (Adam/AdamW), else None.
        loss_sum: [m] each client's summed minibatch losses.
        index: the local row of each schedule row.
        everyone: whether every row trains, in order (schedule row r is local row r).
        mask: [m, d] per-client masks applied after every step (sparse training), or None.
    """

    Y: torch.Tensor
    buf: torch.Tensor | None
    adam: AdamState | None
    loss_sum: torch.Tensor
    index: torch.Tensor
    everyone: bool
    mask: torch.Tensor | None = None

    @classmethod
    def start(cls, X: torch.Tensor, rows: torch.Tensor | None, rule: LocalRule, momentum: torch.Tensor | None,
              adam: AdamState | None, mask: torch.Tensor | None = None) -> _RoundState:
        """The state at the round's start: Y = X, momentum as kept (or 0), Adam state as kept (or fresh)."""
        m = X.shape[0]
        everyone = rows is None or _all_rows(rows, m)
        index = torch.arange(m, device=X.device) if rows is None or everyone else rows.to(X.device)
        buf = None
        if rule.momentum > 0:
            buf = torch.zeros_like(X) if momentum is None else momentum.clone()
        if rule.optimizer != "sgd" and adam is None:
            adam = AdamState.zeros(X)
        loss_sum = torch.zeros(m, device=X.device, dtype=X.dtype)
        if mask is not None and mask.shape != X.shape:
            raise ValueError(f"mask must have the shape of X, {tuple(X.shape)}; got {tuple(mask.shape)}")
        return cls(X.clone(), buf, adam, loss_sum, index, everyone, mask)

    def chunks(self, batch: Batch, chunk: int) -> Iterator[tuple[Batch, _Rows]]:
        """The batch's clients `chunk` at a time: each part of the batch and where its rows sit in the stack."""
        n = batch.rows.numel()
        contiguous = self.everyone and n == self.Y.shape[0]
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            part = batch.slice(s, e)
            ids = self.index[part.rows]
            yield part, _Rows(slice(s, e) if contiguous else ids, ids)

    def release(self, X: torch.Tensor, privacy: ClientPrivacy | None, clients: Sequence[int] | np.ndarray,
                round_index: int | np.ndarray) -> None:
        """Replace the trained rows of Y by their releases (`ClientPrivacy.release`; `clients`: their global ids).

        Nothing without differential privacy (`privacy` None; the asynchronous mode, whose `round_index` is an
        array, refuses it).
        """
        if privacy is None:
            return
        if self.everyone:
            privacy.release(self.Y, X, clients, int(round_index))
        else:
            self.Y[self.index] = privacy.release(self.Y[self.index], X[self.index], clients, int(round_index))

    def momentum_at(self, at: _Rows) -> torch.Tensor | None:
        """The momentum rows `at` (None without momentum)."""
        return None if self.buf is None else self.buf[at.where]

    def result(self, schedule: RoundSchedule) -> LocalResult:
        """The round's `LocalResult`: each client's mean loss over the steps it took."""
        steps = torch.zeros(self.Y.shape[0], dtype=torch.long, device=self.Y.device)
        steps[self.index] = schedule.steps_per_client.to(self.Y.device)
        return LocalResult(Y=self.Y, momentum=self.buf, loss=self.loss_sum / steps.clamp_min(1), steps=steps,
                           adam=self.adam)


def sam_point(y: Sequence[torch.Tensor], g: Sequence[torch.Tensor], rule: LocalRule,
              weight_mask: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
    r"""The SAM or ASAM point y + ε of every client row, the one place either is computed.

    SAM (Foret et al. 2021) and ASAM (Kwon et al. 2021), per client row, with ε₀ = `SAM_EPS`:

        ε = ρ g/(‖g‖ + ε₀)                  sam
        ε = ρ T²g/(‖T g‖ + ε₀)              asam, T = |y| + η_a on weights, 1 elsewhere    (asam_form "kwon")
                                                  T = |y| on every parameter                (asam_form "dp-fedsam")

    "dp-fedsam" is the DP-FedSAM code's adaptive SAM: it scales biases too and adds no η. The rows come as parts
    of the [a, d] stack: one part (the joined rows) or one per parameter (`ParamLayout.split`); the norms are
    over the whole row either way (for several parts, the norm of the per-part norms).

    Args:
        y: the clients' parameters, parts [a, ...] of the [a, d] rows.
        g: the gradients at y, parts shaped as y's.
        rule: ρ (`rho`), the variant (`sam`), η_a (`asam_eta`) and T's form (`asam_form`).
        weight_mask: one bool mask per part, broadcastable to it: True on the coordinates of "weight" tensors.
        out: parts to write y + ε into (SAM), e.g. `ParamLayout.split` views of an [a, d] stack; None: new tensors.

    Returns:
        The parts of y + ε (`out`'s when given).
    """
    if rule.sam == "sam":  # y + ρ g/(‖g‖+ε₀) in one pass over each part (no separate ε tensor)
        scale = rule.rho / (row_norms(g) + SAM_EPS)
        if out is not None:
            return [torch.addcmul(p, q, per_row(scale, q), out=o) for p, q, o in zip(y, g, out)]
        return [torch.addcmul(p, q, per_row(scale, q)) for p, q in zip(y, g)]
    if out is not None:
        raise ValueError("sam_point writes into `out` for SAM only")
    if rule.asam_form == "dp-fedsam":
        T = [p.abs() for p in y]
    else:
        T = [torch.where(mask, p.abs() + rule.asam_eta, torch.ones_like(p)) for p, mask in zip(y, weight_mask)]
    Tg = [t * q for t, q in zip(T, g)]
    norm = row_norms(Tg) + SAM_EPS
    return [p + rule.rho * t * tq / per_row(norm, tq) for p, t, tq in zip(y, T, Tg)]


# Client counts a compiled gradient is called with: the chunk and the powers of two below it, at most this many in all
# (below dynamo's recompile limit of 8 graphs per function), so a count that varies (clients that finished their
# epochs, a sampled subset) pads up to one of them and never compiles more than this many graphs.
COMPILED_SIZES = 6


def compiled_sizes(chunk: int) -> list[int]:
    """The client counts of the compiled gradient's calls for a run whose chunk is `chunk`, largest first."""
    powers = [2**k for k in range(chunk.bit_length() - 1, -1, -1) if 2**k < chunk]
    return ([chunk] + powers)[:COMPILED_SIZES]


def padded_size(a: int, chunk: int) -> int:
    """The smallest of `compiled_sizes(chunk)` that holds `a` clients (a <= chunk)."""
    return min(size for size in compiled_sizes(chunk) if size >= a) if a < chunk else a


def _pad_rows(t: torch.Tensor, size: int) -> torch.Tensor:
    """The rows of t followed by copies of its last row, `size` rows in all (a contiguous [size, ...] tensor)."""
    return torch.cat([t, t[-1:].expand(size - t.shape[0], *t.shape[1:])])


def dropout_seed(seed: int, round_index: int, first_client: int) -> int:
    """The seed of torch's global generator for a round's local training (dropout's draws).

    Dropout draws from it (vmap randomness "different"). It is a function of (seed, round, the block's first client
    id), so draws are reproducible, the same after a resume, and different on every process. They do depend on how
    clients are grouped into vectorized calls (client_chunk) and on the device.
    """
    return int(np.random.SeedSequence([seed, round_index, first_client, 0xD80]).generate_state(1, np.uint64)[0])


def require_cpp_compiler() -> None:
    """torch.compile (inductor) builds C++ kernels on CPU: fail at start, not after the first round."""
    candidates = [os.environ.get("CXX"), "g++", "clang++", "c++"]
    if not any(c and shutil.which(c) for c in candidates):
        raise ConfigError("compile = true on CPU needs a C++ compiler (g++ or clang++ on PATH, or $CXX); "
                          "install one or set compile = false")


TRITON_MIN_CAPABILITY = (7, 0)  # Triton's GPU code generation starts at Volta


def require_triton(device: torch.device) -> None:
    """torch.compile (inductor) generates Triton kernels on CUDA.

    Triton must import, the GPU must be one Triton compiles for, and a C compiler must be there (Triton builds a
    small C launcher per kernel): fail at start, not after the first round.
    """
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        raise ValueError("compile = true on CUDA needs Triton (pip install triton, the version your torch names); "
                         "install it or set compile = false")
    capability = tuple(torch.cuda.get_device_capability(device))
    if capability < TRITON_MIN_CAPABILITY:
        raise ValueError(f"compile = true needs a GPU of compute capability >= {TRITON_MIN_CAPABILITY[0]}."
                         f"{TRITON_MIN_CAPABILITY[1]} for Triton; {device} has {capability[0]}.{capability[1]}: set "
                         "compile = false")
    candidates = [os.environ.get("CC"), "cc", "gcc", "clang"]
    if not any(c and shutil.which(c) for c in candidates):
        raise ValueError("compile = true on CUDA needs a C compiler for Triton's kernel launchers (cc, gcc or clang on "
                         "PATH, or $CC); install one or set compile = false")


def descent_direction(g: torch.Tensor, y: torch.Tensor, rule: LocalRule, buf: torch.Tensor | None,
                      adam: AdamState | None = None, rows: slice | torch.Tensor | None = None):
    """Clip per row, then SGD.

    Add weight decay, apply heavy-ball momentum, return b; or Adam/AdamW: the step of `adam`'s clients `rows`
    (updated). The step is y − η·(the returned direction).
    """
    if rule.clip_grad_norm > 0:
        norm = g.norm(dim=1, keepdim=True)
        g = g * (rule.clip_grad_norm / (norm + 1e-6)).clamp(max=1.0)
    if rule.optimizer != "sgd":
        if adam is None:
            raise ConfigError(f"optimizer = {rule.optimizer} needs the clients' Adam state (`AdamState`); this "
                              "algorithm keeps none: use optimizer = sgd")
        return adam.direction(g, y, rule, slice(None) if rows is None else rows)
    if rule.weight_decay > 0:
        g = g + rule.weight_decay * y
    if buf is not None:
        g = rule.momentum * buf + g
    return g


def row_norms(parts) -> torch.Tensor:
    """[a, 1].

    The norm of each row of the [a, d] stack whose parameters are `parts` ([a, *shape] each), as the norm of the
    per-parameter norms (no joined [a, d] tensor).
    """
    a = parts[0].shape[0]
    if len(parts) == 1:
        return parts[0].reshape(a, -1).norm(dim=1, keepdim=True)
    return torch.stack([p.reshape(a, -1).norm(dim=1) for p in parts], dim=1).norm(dim=1, keepdim=True)


def per_row(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """An [a, 1] per-row factor shaped to broadcast over a parameter's [a, *shape] tensor."""
    return v.view(v.shape[0], *([1] * (like.dim() - 1)))


def _all_rows(rows: torch.Tensor, m: int) -> bool:
    """Whether local row ids `rows` are 0..m-1 in order (every client trains, e.g. full participation)."""
    return rows.numel() == m and torch.equal(rows, torch.arange(m, device=rows.device, dtype=rows.dtype))

"""DisPFL (`dfl.algorithms.dispfl`) against independent references: per-layer densities (ERK's closed form), the
anneal schedule's endpoints, prune-and-regrow as a per-client loop (each tensor keeps its active count, ties to the
lower index), whole runs as a plain per-client loop of torch.optim.SGD with the weights re-masked after every step and
the count-normalised average over the random-pull neighbours, and the bytes of the sparse messages. All-ones masks
reduce it to DFedAvg (local training, then X <- W Y). Resume is bit-identical with the masks in the checkpoint, a gloo
world of two equals one process, and what does not apply is refused in one line before torch loads."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dfl
from dfl.algorithms.builtin import BUILTINS
from dfl.algorithms.dispfl import (
    INIT,
    REGROW,
    SHARED_INIT,
    Block,
    _first,
    active_counts,
    anneal_rate,
    mask_seed,
    prune_and_regrow,
)
from dfl.config import Config, ConfigError
from dfl.data import FederatedData
from dfl.engine import checkpoint as ckpt
from dfl.models import build_model
from dfl.training.clients import ParamLayout
from dfl.training.local import LocalRule, LocalTrainer
from tests.helpers import (
    assert_histories_close,
    assert_same_history,
    assert_world_size_invariant,
    blob_data,
    interrupted,
    local_data,
    small_data,
    small_mlp,
    tiny_config,
)
from topologies.schedules import draw_peers

pytestmark = pytest.mark.timeout(300)  # hang guard only (spawned process groups)

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = [8]
K = 3  # random-pull peers


def config_of(**changes) -> Config:
    """8 clients (`small_data`), an 8-unit MLP, random-pull with 3 peers, 3 rounds of 2 local steps of batch 4."""
    values = dict(algorithm="dispfl", clients=8, model="mlp", model_options={"hidden": HIDDEN}, rounds=3,
                  batch_size=4, local_steps=2, lr=0.1, lr_decay=0.9, eval_every=1, progress=False,
                  topology="random-pull", topology_options={"k": K}, train_eval_samples=0)
    values.update(changes)
    return Config(**values)


# ------------------------------------------------------------------------------------ per-layer densities
def closed_form_counts(shapes, density):
    """ERK's allocation from its closed form: the dense set D grows by the highest-score tensors while some ε p_l > 1,
    ε = (density N − N_D) / Σ_{l∉D} p_l N_l, and a sparse tensor keeps int(ε p_l N_l)."""
    sizes = [int(np.prod(s)) for s in shapes]
    scores = [sum(s) / n for s, n in zip(shapes, sizes)]
    dense: set[int] = set()
    while True:
        sparse = [i for i in range(len(shapes)) if i not in dense]
        eps = (density * sum(sizes) - sum(sizes[i] for i in dense)) / sum(scores[i] * sizes[i] for i in sparse)
        top = max(scores[i] for i in sparse)
        if eps * top <= 1:
            return [sizes[i] if i in dense else int(eps * scores[i] * sizes[i]) for i in range(len(shapes))], dense
        dense |= {i for i in sparse if scores[i] == top}


@pytest.mark.parametrize("shapes", [
    [(32, 1, 5), (32,), (32, 32, 3), (32,), (10, 1280), (10,)],  # dfl's cnn1d on MNIST-1D
    [(64, 3, 3, 3), (64,), (128, 64, 3, 3), (128,), (10, 512), (10,)],
    [(8, 5), (8,), (3, 8), (3,)],  # tiny: ERK leaves even the biases sparse
])
@pytest.mark.parametrize("density", [0.1, 0.5, 0.8])
def test_erk_allocation_is_the_closed_form_and_reaches_the_target(shapes, density):
    want, dense = closed_form_counts(shapes, density)
    got = active_counts(shapes, density, "erk")
    sizes = [int(np.prod(s)) for s in shapes]
    assert [abs(g - w) <= 1 for g, w in zip(got, want)] == [True] * len(shapes), (got, want)  # float truncation
    assert all(got[i] == sizes[i] for i in dense)
    assert abs(sum(got) - density * sum(sizes)) <= len(shapes)  # one truncation per tensor at most


def test_cnn1d_at_half_density_keeps_biases_and_the_first_convolution_dense():
    shapes = [(32, 1, 5), (32,), (32, 32, 3), (32,), (10, 1280), (10,)]
    counts = active_counts(shapes, 0.5)
    assert counts[0] == 160 and counts[1] == 32 and counts[3] == 32 and counts[5] == 10  # dense
    assert 0 < counts[2] < 3072 and 0 < counts[4] < 12800


def test_uniform_allocation_and_full_density():
    shapes = [(6, 5), (6,), (3, 6), (3,)]
    assert active_counts(shapes, 0.5, "uniform") == [15, 3, 9, 1]  # biases too, as the code's uniform
    assert active_counts(shapes, 1.0, "erk") == active_counts(shapes, 1.0, "uniform") == [30, 6, 18, 3]
    assert active_counts(shapes, 0.5, "erk", power=0.0) == active_counts(shapes, 0.5, "uniform")  # p_l = 1 for all


def test_anneal_schedule_endpoints():
    assert anneal_rate(0.5, 0, 100) == 0.5  # α_0 = a
    assert anneal_rate(0.5, 50, 100) == pytest.approx(0.25)  # half way: a/2
    assert anneal_rate(0.5, 100, 100) == 0.0  # α_T = 0, just after the last round
    assert anneal_rate(0.5, 99, 100) > 0  # the last round still updates
    assert anneal_rate(0.5, 130, 100) == 0.0  # a run longer than anneal_rounds keeps its masks
    rates = [anneal_rate(0.3, t, 20) for t in range(21)]
    assert all(a > b for a, b in zip(rates, rates[1:]))


# ------------------------------------------------------------------------------------------ prune and regrow
def reference_prune_and_regrow(mask: np.ndarray, weights: np.ndarray, scores: np.ndarray, blocks, rate):
    """One client at a time, one tensor at a time: drop the ⌈rate·n⌉ active of smallest |w|, grow as many inactive
    (the dropped included) of largest score; ties to the lower index."""
    out = mask.copy()
    for i in range(mask.shape[0]):
        for offset, size, active in blocks:
            m = out[i, offset:offset + size]
            on = np.flatnonzero(m)
            if active in (0, size):
                continue
            k = math.ceil(rate * len(on))
            w, s = np.abs(weights[i, offset:offset + size][on]), scores[i, offset:offset + size]
            m[on[np.argsort(w, kind="stable")[:k]]] = False
            off = np.flatnonzero(~m)
            m[off[np.argsort(-s[off], kind="stable")[:k]]] = True
    return out


@pytest.mark.parametrize("rate", [0.5, 0.13, 1.0])
def test_prune_and_regrow_equals_a_per_client_loop_and_keeps_each_tensors_count(rate):
    g = torch.Generator().manual_seed(3)
    layout = [(0, 12, 5), (12, 7, 7), (19, 30, 9), (49, 4, 1)]  # (offset, size, active); the second is dense
    d, a = 53, 6
    keys = torch.rand(a, d, generator=g)
    mask = torch.zeros(a, d, dtype=torch.bool)
    for offset, size, active in layout:
        top = torch.argsort(keys[:, offset:offset + size], dim=1)[:, :active] + offset
        mask.scatter_(1, top, True)
    weights = (torch.randn(a, d, generator=g) * 4).round() / 4 * mask  # many ties in |w|
    scores = (torch.rand(a, d, generator=g) * 3).floor()  # many ties in the scores, zeros too
    blocks = [Block(*b) for b in layout]
    got = prune_and_regrow(mask, weights, scores, blocks, rate)
    want = reference_prune_and_regrow(mask.numpy(), weights.numpy(), scores.numpy(), layout, rate)
    np.testing.assert_array_equal(got.numpy(), want)
    for offset, size, active in layout:
        assert (got[:, offset:offset + size].sum(1) == active).all()
    assert not torch.equal(got, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_selection_is_a_stable_sorts_first_k(dtype, device):
    """Packed keys and top-k (float32) choose what a stable sort's first k would: ties, ±0 and ±inf included."""
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        x = ((torch.randn(5, 301, generator=g) * 3).round() / 2).to(dtype)
        x[0, :10], x[1, :10], x[3, ::7] = math.inf, -math.inf, -0.0
        for keys in (x.to(device), x.to(device)[:, ::2]):
            for descending in (False, True):
                k = int(torch.randint(1, keys.shape[1], (1,), generator=g))
                want = torch.sort(keys.cpu(), dim=1, descending=descending, stable=True).indices[:, :k]
                got = _first(keys, k, descending).cpu()
                assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)


# --------------------------------------------------------------------------------- whole runs, a plain loop
def reference_run(config: Config, data: FederatedData, x0: torch.Tensor):
    """DisPFL as a plain loop over clients: (masks, models, bytes per round) after config.rounds rounds."""
    hp = {**BUILTINS["dispfl"].card.defaults(), **config.algorithm_options}
    momentum = config.momentum or 0.0
    m, T, k = config.clients, config.rounds, config.topology_options["k"]
    torch.manual_seed(config.seed)
    model = build_model("mlp", data.input_shape, data.num_classes, hidden=HIDDEN)
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, data, list(range(m)), config)  # for its minibatch schedule only
    shapes = [tuple(s) for s in layout.shapes]
    if hp["density_allocation"] == "uniform":
        counts = [int(hp["density"] * int(np.prod(s))) for s in shapes]
    else:
        counts, _ = closed_form_counts(shapes, hp["density"])
    assert counts == active_counts(shapes, hp["density"], hp["density_allocation"])  # no truncation boundary here
    blocks = list(zip(layout.offsets, layout.numels, counts))
    d = layout.dim

    def draw(seed):
        return torch.rand(d, generator=torch.Generator().manual_seed(seed)).numpy()

    masks = np.zeros((m, d), dtype=bool)
    for i in range(m):  # client i's draw (or the one shared draw): the `count` largest keys of each tensor
        keys = draw(mask_seed(config.seed, SHARED_INIT) if hp["initial_masks"] == "same"
                    else mask_seed(config.seed, INIT, i))
        for offset, size, active in blocks:
            masks[i, offset + np.argsort(-keys[offset:offset + size], kind="stable")[:active]] = True
    X = x0.numpy() * masks
    sparse_bits = sum(size for _, size, active in blocks if 0 < active < size)
    changed = np.zeros(m, dtype=bool)
    sent = []
    for t in range(T):
        lr = config.lr * config.lr_decay**t
        schedule = trainer.schedule(t)
        Y = np.zeros_like(X)
        scores = np.zeros_like(X)
        for i in range(m):
            net = copy.deepcopy(model)
            layout.load_into(net, torch.from_numpy(X[i]))
            per_param = [torch.from_numpy(v.reshape(-1)) for v in _split(masks[i], layout)]
            opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=config.weight_decay)
            B = schedule.batch_size
            for step in range(int(schedule.steps_per_client[i])):
                x, y = _batch(data, schedule, i, step, B)
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                if config.clip_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(net.parameters(), config.clip_grad_norm)
                opt.step()
                with torch.no_grad():  # the code: param.data *= mask after every optimizer step
                    for p, keep in zip(net.parameters(), per_param):
                        p.mul_(keep.view_as(p).to(p.dtype))
            Y[i] = layout.flatten(net).numpy()
            if hp["regrowth"] == "gradient":  # |∇f_i| at the trained model on the round's first minibatch
                x, y = _batch(data, schedule, i, 0, B)
                net.zero_grad()
                F.cross_entropy(net(x), y).backward()
                scores[i] = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).abs().numpy()
            else:
                scores[i] = draw(mask_seed(config.seed, REGROW, i, t))
        rate = hp["anneal_factor"] / 2 * (1 + math.cos(math.pi * t / T))
        new = reference_prune_and_regrow(masks, Y, scores, blocks, rate)
        # the bytes: each client's active weights to each puller, plus its mask bits when it changed
        peers = draw_peers(m, k, 0, t)
        pulls = np.bincount(peers.ravel(), minlength=m)
        sent.append(int(sum(pulls[j] * (sum(counts) * 4 + changed[j] * math.ceil(sparse_bits / 8))
                            for j in range(m))))
        # the count-normalised average over i and the k peers i pulled, each y_j on the mask it trained with
        X = np.zeros_like(Y)
        for i in range(m):
            group = [i, *peers[i]]
            count = masks[group].sum(axis=0)
            total = (Y[group] * masks[group]).sum(axis=0)
            X[i] = np.where(count > 0, total / np.maximum(count, 1), 0.0) * new[i]
        changed = (new != masks).any(axis=1)
        masks = new
    return masks, X, sent


def _split(row: np.ndarray, layout: ParamLayout):
    return [row[o:o + n] for o, n in zip(layout.offsets, layout.numels)]


def _batch(data, schedule, i, step, B):
    idx = schedule.index[i, step * B:(step + 1) * B]
    keep = schedule.weight[i, step * B:(step + 1) * B] > 0
    return data.train_x[idx[keep]], data.train_y[idx[keep]]


CASES = {
    "random regrowth": {},
    "gradient regrowth": dict(algorithm_options={"regrowth": "gradient"}),
    "momentum, weight decay, clipping, uniform": dict(momentum=0.5, weight_decay=5e-3, clip_grad_norm=0.5,
                                                     algorithm_options={"density_allocation": "uniform",
                                                                        "anneal_factor": 0.8}),
    "same initial masks, epochs": dict(local_steps=None, local_epochs=1, algorithm_options={"initial_masks": "same"}),
}


@pytest.mark.parametrize("case", CASES)
def test_a_run_equals_a_plain_per_client_reference(tmp_path, case):
    config = config_of(**CASES[case])
    data = small_data()
    result = dfl.run(config, data=data, out=tmp_path)
    masks, X, sent = reference_run(config, data, result.initial_params.clone())
    saved = ckpt.read(tmp_path)["client_state"]
    np.testing.assert_array_equal(saved["mask"].numpy(), masks)
    np.testing.assert_allclose(result.params.numpy(), X, rtol=1e-5, atol=1e-6)
    assert [h["bytes_sent"] for h in result.history] == sent
    assert (result.params.numpy()[~masks] == 0).all()  # every model lives on its mask


def test_static_masks_stay_the_initial_ones_and_are_never_sent(tmp_path):
    """anneal_factor = 0 (the code's --static): the masks never change, so no message carries one; `same` gives every
    client one mask, `different` each its own."""
    data = small_data()
    for initial in ("same", "different"):
        config = config_of(algorithm_options={"initial_masks": initial, "anneal_factor": 0.0})
        result = dfl.run(config, data=data, out=tmp_path / initial)
        masks = ckpt.read(tmp_path / initial)["client_state"]["mask"]
        assert bool((masks == masks[:1]).all()) == (initial == "same")
        values = sum(active_counts([tuple(s) for s in ParamLayout.of(build_model(
            "mlp", data.input_shape, 3, hidden=HIDDEN)).shapes], 0.5)) * 4
        assert all(h["bytes_sent"] == values * 8 * K for h in result.history)  # 8 clients pull K messages each


def test_all_ones_masks_reduce_to_dfedavg(device):
    """density = 1: every tensor is dense, nothing is pruned, (4) is X <- W Y: DFedAvg (local steps, then gossip);
    with momentum it is DFedAvgM. Messages are whole models, so the bytes are DFedAvg's."""
    data = small_data()
    for algorithm, momentum in (("dfedavg", None), ("dfedavgm", 0.9)):
        base = dict(device=device, momentum=momentum)
        want = dfl.run(config_of(algorithm=algorithm, **base), data=data)
        got = dfl.run(config_of(**base, algorithm_options={"density": 1.0}), data=data)
        torch.testing.assert_close(got.params, want.params, rtol=1e-5, atol=1e-6)
        assert [h["bytes_sent"] for h in got.history] == [h["bytes_sent"] for h in want.history]
        assert_histories_close([{k: v for k, v in h.items() if k != "momentum"} for h in got.history],
                               [{k: v for k, v in h.items() if k != "momentum"} for h in want.history], algorithm)


def test_the_mask_hook_of_local_training(device):
    """All-ones masks change nothing, bit for bit; a mask keeps its zeros through every step (SGD with momentum and
    weight decay, and the joined-rows path of Adam)."""
    data = local_data().to(device)
    model = small_mlp().to(device)
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, data, list(range(4)), tiny_config(batch_size=3, local_steps=3))
    X = layout.flatten(model).repeat(4, 1)
    for rule in (LocalRule(momentum=0.9, weight_decay=1e-2), LocalRule(optimizer="adam")):
        plain = trainer.train(X, 0, 0.1, rule)
        ones = trainer.train(X, 0, 0.1, rule, mask=torch.ones_like(X, dtype=torch.bool))
        assert torch.equal(plain.Y, ones.Y)
        mask = torch.rand(X.shape, generator=torch.Generator().manual_seed(0)).to(device) < 0.5
        sparse = trainer.train(X * mask, 0, 0.1, rule, mask=mask)
        assert (sparse.Y[~mask] == 0).all() and (sparse.Y[mask] != (X * mask)[mask]).any()


@pytest.mark.parametrize("regrowth", ["random", "gradient"])
def test_no_host_sync_per_local_step(regrowth):
    """The mask hook adds nothing per step; a round reads back the finiteness check's count and the round's bytes."""
    from benchmarks.host_syncs import per_local_step

    config = Config(algorithm="dispfl", clients=8, model="mlp", model_options={"hidden": [16]}, dataset="mnist1d",
                    dataset_options={"num_samples": 600}, batch_size=8, eval_every=1, seed=0, train_eval_samples=50,
                    topology="random-pull", topology_options={"k": 2}, algorithm_options={"regrowth": regrowth})
    counts = per_local_step(config)
    assert counts["syncs_per_local_step"] == 0 and counts["uploads_per_local_step"] == 0, counts
    assert counts["rounds"][0]["syncs"] == 2, counts


# ------------------------------------------------------------------------------------- bytes and evaluation
def test_personalized_evaluation_and_the_bytes_of_sparse_messages():
    config = config_of(local_test_fraction=0.25, rounds=2)
    result = dfl.run(config, data=small_data(n=16))
    last = result.history[-1]
    assert {"personal_acc_mean", "global_acc_mean"} <= set(last)
    dense = dfl.run(config.replace(algorithm="dfedavg"), data=small_data(n=16))
    # half the weights (ERK at 0.5) plus one bit per sparse coordinate: well under the dense models' bytes
    assert result.history[0]["bytes_sent"] < 0.55 * dense.history[0]["bytes_sent"]


# ------------------------------------------------------------------------------------------ resume, worlds
RESUME_DATA = dict(sizes=(6, 7, 8, 6, 7, 8), shift=1.0)


class StopAfter:
    """A callback that stops the run after `round` (its checkpoint is written): an interruption that keeps `rounds`."""

    def __init__(self, round: int):
        self.round = round

    def on_round_end(self, round: int, metrics) -> bool:
        return round >= self.round


@pytest.mark.parametrize("options", [{"regrowth": "gradient"}, {"anneal_rounds": 6}])
def test_resume_is_bit_identical_with_the_masks_in_the_checkpoint(tmp_path, options):
    """Stopped after round 3 of 6 and resumed (the anneal over the run's rounds), or run for 3 rounds and extended
    to 6 (a fixed anneal_rounds): the uninterrupted run's metrics, parameters and masks, bit for bit."""
    data = blob_data(**RESUME_DATA)
    config = tiny_config(algorithm="dispfl", rounds=6, topology="random-pull", topology_options={"k": 2},
                         algorithm_options=options)
    full = dfl.run(config, data=data, out=tmp_path / "full")
    if "anneal_rounds" in options:
        resumed = interrupted(config, 3, tmp_path / "part", data)
    else:
        assert dfl.run(config, data=data, out=tmp_path / "part", callbacks=[StopAfter(3)]).history[-1]["round"] == 3
        resumed = dfl.run(config, data=data, out=tmp_path / "part", resume=True)
    assert resumed.summary["resumed_from_round"] == 3
    torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
    assert_same_history(resumed.history, full.history, "dispfl")
    a, b = ckpt.read(tmp_path / "part")["client_state"], ckpt.read(tmp_path / "full")["client_state"]
    assert a["mask"].dtype == torch.bool and torch.equal(a["mask"], b["mask"])
    assert torch.equal(a["mask_changed"], b["mask_changed"])


def test_resuming_with_other_rounds_is_refused_while_the_masks_anneal(tmp_path):
    data = blob_data(**RESUME_DATA)
    config = tiny_config(algorithm="dispfl", rounds=2, topology="random-pull", topology_options={"k": 2})
    dfl.run(config, data=data, out=tmp_path / "run")
    with pytest.raises(ConfigError, match="anneal_factor anneals the masks' updates over the run's rounds = 2, .* "
                                          "set algorithm_options.anneal_rounds"):
        dfl.run(config.replace(rounds=4), data=data, out=tmp_path / "run", resume=True)
    static = config.replace(algorithm_options={"anneal_factor": 0.0})
    dfl.run(static, data=data, out=tmp_path / "static")
    assert dfl.run(static.replace(rounds=3), data=data, out=tmp_path / "static", resume=True).history[-1]["round"] == 3


@pytest.mark.slow
def test_a_world_of_two_equals_one_process(tmp_path):
    config = tiny_config(algorithm="dispfl", topology="random-pull", topology_options={"k": 2}, dist_timeout=30.0)
    assert_world_size_invariant(tmp_path, config, blob_data(**RESUME_DATA), world=2)


# ------------------------------------------------------------------------------------------------- refusals
REFUSALS = {
    "dp_clip": (dict(dp_clip=1.0), "dp_clip = 1 does not apply to dispfl: its masks are chosen from the trained"),
    "byzantine": (dict(byzantine=1, attack="sign-flip"), "byzantine = 1 does not apply to dispfl"),
    "aggregator": (dict(aggregator="median"), "aggregator = median does not apply to dispfl"),
    "compressor": (dict(compressor="top-k"), "compressor = top-k does not apply to dispfl: it "
                                                              "already sends only its masked weights"),
    "push-sum": (dict(weights="column-stochastic"), r"weights = column-stochastic \(push-sum\) does not apply to "
                                                    "dispfl"),
    "adam": (dict(local_optimizer="adam"), "local_optimizer = adam is not defined for dispfl"),
    "async": (dict(mode="async"), "mode = async runs"),
    "density": (dict(algorithm_options={"density": 0.0}), r"algorithm_options.density .* must be in \(0, 1\]"),
    "anneal": (dict(algorithm_options={"anneal_factor": 1.5}), r"anneal_factor .* must be in \[0, 1\]"),
    "anneal rounds": (dict(algorithm_options={"anneal_rounds": -1}), "anneal_rounds .* must be >= 0"),
    "regrowth": (dict(algorithm_options={"regrowth": "magnitude"}), "regrowth must be one of random, gradient"),
    "allocation": (dict(algorithm_options={"density_allocation": "ER"}), "density_allocation must be one of erk"),
    "unknown": (dict(algorithm_options={"sparsity": 0.5}), "unknown key 'sparsity' for algorithm 'dispfl'"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_does_not_apply_is_refused_in_one_line(case):
    changes, message = REFUSALS[case]
    with pytest.raises(ConfigError, match=message) as info:
        dfl.validate(Config(algorithm="dispfl", topology="random-pull", topology_options={"k": 3}, **changes))
    assert "\n" not in str(info.value)


def test_the_refusals_answer_before_torch_loads():
    script = f"""
import sys, dfl
from dfl.errors import ConfigError
for changes, _ in {list(REFUSALS.values())!r}:
    try:
        dfl.validate(dfl.Config(algorithm="dispfl", topology="random-pull", topology_options={{"k": 3}}, **changes))
        raise SystemExit("accepted: " + repr(changes))
    except ConfigError:
        pass
print("torch" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"

"""What an evaluation costs: the averaged model evaluated once in all (each process its share of the test batches,
the sums added), the mean of the rows computed once, and a per-client test subset by default (`client_eval_samples`).
"""

from __future__ import annotations

import pytest
import torch

import dfl
from dfl.config import Config
from dfl.engine import experiment
from dfl.models import build_model
from dfl.training import evaluate
from dfl.training.clients import ParamLayout
from tests.helpers import blob_data, tiny_config


class Share:
    """A communicator seen from rank `rank` of `world_size`, whose sum returns this rank's part (added by the test)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def sum(self, value):
        return value


@pytest.mark.parametrize("n,batch", [(1000, 128), (7, 3), (5, 8), (1024, 256)])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_each_process_takes_whole_batches_and_together_they_take_each_once(n, batch, world):
    shares = [evaluate.batch_share(n, batch, Share(r, world)) for r in range(world)]
    assert shares[0][0] == 0 and shares[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))  # contiguous, no overlap, nothing left out
    assert all(first % batch == 0 for first, _ in shares)  # the batches one process would evaluate
    assert evaluate.batch_share(n, batch, Share(0, 1)) == evaluate.batch_share(n, batch) == (0, n)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_averaged_model_is_evaluated_once_in_all_and_gives_the_one_process_numbers(world, monkeypatch):
    torch.manual_seed(0)
    model = build_model("mlp", (5,), 3)
    layout = ParamLayout.of(model)
    row = layout.flatten(model)
    x, y = torch.randn(103, 5), torch.randint(0, 3, (103,))
    seen = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda inputs: seen.append(inputs.shape[0]) or forward(inputs))
    whole = evaluate.evaluate_row(model, layout, row, x, y, 16)
    assert sum(seen) == 103
    seen.clear()
    parts = [evaluate.evaluate_row(model, layout, row, x, y, 16, Share(r, world)) for r in range(world)]
    assert sum(seen) == 103  # every sample once over all the processes, not once per process
    assert sum(p[0] for p in parts) == pytest.approx(whole[0], abs=1e-12)
    assert sum(p[1] for p in parts) == pytest.approx(whole[1], rel=1e-12)


def test_an_evaluation_computes_the_mean_of_the_rows_once(monkeypatch):
    from dfl.network.comm import LocalCommunicator

    calls = []
    original = LocalCommunicator.mean_rows
    monkeypatch.setattr(LocalCommunicator, "mean_rows", lambda self, X: calls.append(1) or original(self, X))
    rounds = dfl.run(tiny_config(rounds=3, eval_every=1)).history
    assert len(rounds) == 3 and len(calls) == 3, calls  # one x̄ per evaluation (consensus distance included)


def test_client_accuracy_uses_2000_test_samples_by_default_and_the_whole_small_test_set_as_before():
    assert Config().client_eval_samples == 2000 == Config().train_eval_samples
    data = blob_data([10, 12, 9, 11, 10, 8], test_size=2500, seed=1)
    run = dfl.run(tiny_config(rounds=1), data=data)
    accuracies = run.history[-1]["client_acc"]
    assert all(abs(a * 2000 - round(a * 2000)) < 1e-3 for a in accuracies)  # counts out of 2,000 samples
    whole = dfl.run(tiny_config(rounds=1, client_eval_samples=0), data=data)
    for key in set(run.history[-1]) - {"client_acc", "client_acc_mean", "client_acc_std", "client_acc_min",
                                       "client_acc_max", "seconds_per_round"}:
        assert run.history[-1][key] == whole.history[-1][key], key  # only the per-client accuracies change
    small = blob_data([10, 12, 9, 11, 10, 8], test_size=300, seed=1)  # <= 2,000: the whole test set, as before
    assert dfl.run(tiny_config(rounds=1), data=small).history == [
        {**h, "seconds_per_round": pytest.approx(h["seconds_per_round"], abs=1e9)}
        for h in dfl.run(tiny_config(rounds=1, client_eval_samples=0), data=small).history]


def test_the_warning_for_a_whole_test_set_names_the_default(monkeypatch):
    monkeypatch.setattr(experiment, "CLIENT_EVAL_WARN_PASSES", 10)
    with pytest.warns(UserWarning, match=r"client_eval_samples \(the default: 2000\)"):
        dfl.run(tiny_config(rounds=1, client_eval_samples=0))

"""FedProx's Synthetic(alpha, beta) benchmark (Li et al. 2020, after Shamir et al.), naturally federated.

Client k (following the FedProx generator `generate_synthetic`):
    u_k ~ N(0, alpha),  B_k ~ N(0, beta)                     (alpha, beta used as std, as in FedProx's code)
    W_k ~ N(u_k, 1) in R^{60x10},  b_k ~ N(u_k, 1) in R^10  (the same mean u_k for W and b)
    v_k ~ N(B_k, 1) in R^60,  x ~ N(v_k, Sigma),  Sigma = diag(j^{-1.2}), j = 1..60
    y = argmax softmax(W_k^T x + b_k)
    n_k = floor(LogNormal(size_log_mean, size_log_sigma)) + min_samples   (FedProx: LogNormal(4, 2) + 50)
Each client's samples are split into train/test (FedProx keeps 90%/10%); the train parts, in client
order, are the pooled train set and their index ranges are the natural split; the test parts are pooled.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfl.data.checks import check_float, check_int
from dfl.data.types import Dataset, DataShape
from dfl.errors import DataError
from dfl.specs import Spec, param

DIM, CLASSES = 60, 10
# sizes are drawn (from the seed, as the loader draws them) only up to this many samples in all at the minimum
# size: beyond it the minimum alone is far more than any machine holds, and the bound is the answer
DRAW_LIMIT = 2**31
MAX_CLIENT_SAMPLES = 2**40  # a drawn client size above this is a typo in size_log_mean / size_log_sigma
SIGMA_SQRT = np.arange(1, DIM + 1, dtype=np.float64) ** (-1.2 / 2)  # Σ^{1/2} = diag(j^{-0.6}), j = 1..60


@dataclass(frozen=True)
class SyntheticOptions(Spec):
    """The options of dataset synthetic."""

    alpha: float = param(1.0, "the spread α of the clients' models (std of u_k, the mean of W_k and b_k)",
                         interval="[0, inf)")
    beta: float = param(1.0, "the spread β of the clients' inputs (std of B_k, the mean of v_k)", interval="[0, inf)")
    num_clients: int = param(30, "the clients the data is generated for (the natural split; unset: the run's clients)",
                             interval="[1, inf)")
    size_log_mean: float = param(4.0, "the mean of the log-normal client sizes n_k = ⌊LogNormal(μ, σ)⌋ + min_samples")
    size_log_sigma: float = param(2.0, "the log-normal σ of the client sizes", interval="[0, inf)")
    min_samples: int = param(50, "the samples added to every drawn client size", interval="[2, inf)")
    test_fraction: float = param(0.1, "the share of each client's samples held out for the pooled test set",
                                 interval="(0, 1)")
    seed: int = param(0, "the seed of the generator, which fixes the data", interval="[0, inf)")


def synthetic_options(
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 30,
    size_log_mean: float = 4.0,
    size_log_sigma: float = 2.0,
    min_samples: int = 50,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> dict:
    """The options of `load_synthetic` (its signature is this one; `SyntheticOptions` describes them), checked.

    Returns:
        The options as the loader uses them (ints and floats).

    Raises:
        DataError: naming the option out of range, or a test set that would be empty.
    """
    options = {
        "alpha": check_float("alpha", alpha, 0.0, open_low=False),
        "beta": check_float("beta", beta, 0.0, open_low=False),
        "num_clients": check_int("num_clients", num_clients, 1),
        "size_log_mean": check_float("size_log_mean", size_log_mean, -np.inf),
        "size_log_sigma": check_float("size_log_sigma", size_log_sigma, 0.0, open_low=False),
        "min_samples": check_int("min_samples", min_samples, 2),
        "test_fraction": check_float("test_fraction", test_fraction, 0.0, 1.0),
        "seed": check_int("seed", seed, 0),
    }
    if synthetic_shape(options).test == 0:  # sizes that overflow are refused here too, not in the generator
        raise DataError(f"test_fraction={options['test_fraction']} gives an empty test set; raise it or min_samples")
    return options


def _sizes(rng: np.random.Generator, options: dict) -> np.ndarray:
    """n_k = floor(LogNormal(size_log_mean, size_log_sigma)) + min_samples, the first draws of the loader's rng."""
    draws = rng.lognormal(options["size_log_mean"], options["size_log_sigma"], options["num_clients"])
    largest = float(draws.max())
    if not np.isfinite(largest) or largest > MAX_CLIENT_SAMPLES:
        raise DataError(f"size_log_mean = {options['size_log_mean']:g} and size_log_sigma = "
                        f"{options['size_log_sigma']:g} draw a client of {largest:.3g} samples (LogNormal sizes); "
                        f"keep them near FedProx's 4 and 2")
    return draws.astype(np.int64) + options["min_samples"]


def _split(size: int, test_fraction: float) -> tuple[int, int]:
    """(train, test) samples of a client of `size`: test_fraction of them tested, at least one trained."""
    n_test = int(size * test_fraction)
    n_train = size - n_test
    return (1, size - 1) if n_train < 1 else (n_train, n_test)


def synthetic_shape(options: dict) -> DataShape:
    """Train and test samples of `options`.

    The client sizes the loader will draw (from the seed), or, past `DRAW_LIMIT` samples at the minimum size, that
    minimum (a lower bound).
    """
    clients, least = options["num_clients"], options["min_samples"]
    if clients * least > DRAW_LIMIT:
        test = int(least * options["test_fraction"])
        return DataShape(clients * (least - test), clients * test, (DIM,), CLASSES)
    sizes = _sizes(np.random.default_rng(options["seed"]), options)
    n_test = (sizes * options["test_fraction"]).astype(np.int64)
    n_train = np.where(sizes - n_test < 1, 1, sizes - n_test)
    return DataShape(int(n_train.sum()), int((sizes - n_train).sum()), (DIM,), CLASSES)


def load_synthetic(**options: Any) -> Dataset:
    """Synthetic(α, β): FedProx's naturally federated softmax-regression benchmark (embedded).

    Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated optimization in heterogeneous networks", MLSys
    2020 (after Shamir et al.). Client k draws u_k ~ N(0, α²), B_k ~ N(0, β²), a model W_k, b_k ~ N(u_k, 1), inputs
    x ~ N(v_k, Σ) with v_k ~ N(B_k, 1), Σ = diag(j^−1.2), and labels y = argmax(W_kᵀx + b_k): α sets how much the
    clients' models differ, β how much their data do. Its clients are the `natural` partition's split.

    Returns:
        The pooled train and test sets, and each client's train rows as the natural split.
    """
    import torch  # here: the module is imported when a config is checked, before torch is needed

    checked = synthetic_options(**options)
    rng = np.random.default_rng(checked["seed"])
    sizes = _sizes(rng, checked)
    u = rng.normal(0.0, checked["alpha"], checked["num_clients"])
    B = rng.normal(0.0, checked["beta"], checked["num_clients"])
    parts = [_client(rng, u[k], B[k], int(sizes[k]), checked["test_fraction"]) for k in range(checked["num_clients"])]
    n_train = np.array([len(part[1]) for part in parts], dtype=np.int64)
    starts = np.cumsum(n_train) - n_train
    return Dataset(
        name="synthetic",
        train_x=torch.tensor(np.concatenate([p[0] for p in parts]), dtype=torch.float32),
        train_y=torch.tensor(np.concatenate([p[1] for p in parts]), dtype=torch.int64),
        test_x=torch.tensor(np.concatenate([p[2] for p in parts]), dtype=torch.float32),
        test_y=torch.tensor(np.concatenate([p[3] for p in parts]), dtype=torch.int64),
        num_classes=CLASSES,
        input_shape=(DIM,),
        natural_split=[np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts.tolist(), n_train.tolist())],
        options=checked,
    )


load_synthetic.__signature__ = inspect.signature(synthetic_options).replace(  # type: ignore[attr-defined]
    return_annotation="Dataset")  # one description of the options: registry cards read the loader's signature
# its Args section is generated from the spec, the one place each option is described
load_synthetic.__doc__ = inspect.cleandoc(load_synthetic.__doc__ or "") + "\n\n" + SyntheticOptions.docstring_args()


def _client(rng: np.random.Generator, u: float, B: float, size: int,
            test_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Client k's (train x, train y, test x, test y), drawn in the FedProx generator's order (module doc)."""
    v = rng.normal(B, 1.0, DIM)
    W = rng.normal(u, 1.0, (DIM, CLASSES))
    b = rng.normal(u, 1.0, CLASSES)
    x = v + SIGMA_SQRT * rng.standard_normal((size, DIM))
    y = np.argmax(x @ W + b, axis=1)  # argmax of softmax = argmax of the logits
    n_train, _ = _split(size, test_fraction)  # every client keeps a train sample
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]

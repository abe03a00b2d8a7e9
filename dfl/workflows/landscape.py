"""The loss surface around a run's final averaged model, and its top Hessian eigenvalue (`dfl landscape`).

Rebuilds the run's data and model from its `config.toml` (as `dfl run` does), averages the client rows of
`params.pt` (or of `checkpoint.pt` for a run that has not finished), and evaluates the loss on a grid along two
filter-normalised random directions (`dfl.training.flatness`). Writes `RUN_DIR/plots/landscape.png` and
`RUN_DIR/landscape.json`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from dfl.config import Config
from dfl.engine.results import atomic_write_bytes, to_json
from dfl.engine.setup import build_data, resolve_device
from dfl.engine.validation import validate
from dfl.models import build_model
from dfl.report import plots
from dfl.training.clients import ParamLayout
from dfl.training.flatness import hessian_top_eigenvalue, loss_landscape

SPLITS = ("train", "test")


def landscape(run_dir: str | Path, *, points: int = 21, span: float = 1.0, samples: int = 2000, split: str = "train",
              seed: int = 0, hessian_iters: int = 20, device: str | None = None, out: str | Path | None = None):
    """The loss L(θ + a·d1 + b·d2) of the run's averaged model θ on a `points` × `points` grid over
    [-span, span]², along two filter-normalised random directions d1, d2 (Li et al. 2018), and λ_max of the
    Hessian at θ (`hessian_iters` power-iteration steps; 0 = skip). Writes the plot (`out`, default
    RUN_DIR/plots/landscape.png) and RUN_DIR/landscape.json; returns (result, png path, json path)."""
    args = SimpleNamespace(points=points, span=span, samples=samples, split=split, seed=seed,
                           hessian_iters=hessian_iters, device=device, out=out)

    run_dir = Path(run_dir)
    if args.points < 3:
        raise ValueError(f"--points must be >= 3, got {args.points}")
    if not args.span > 0:
        raise ValueError(f"--span must be > 0, got {args.span}")
    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    if args.hessian_iters < 0:
        raise ValueError(f"--hessian-iters must be >= 0, got {args.hessian_iters}")
    if args.split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}; got {args.split!r}")
    if not (run_dir / "config.toml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory: {run_dir / 'config.toml'} does not exist")
    config = validate(Config.from_toml(run_dir / "config.toml"))
    params, names, source = _final_params(run_dir)
    if args.device is not None:
        try:
            config = validate(config.replace(device=args.device))
        except ValueError as exc:
            raise ValueError(f"--device: {exc}") from None

    model, layout, x, y = _model_and_samples(config, args, params.shape[1], names)
    centre = params.mean(dim=0).to(x.device)
    result = loss_landscape(model, layout, centre, x, y, span=args.span, points=args.points, seed=args.seed,
                            batch_size=config.eval_batch_size)
    hessian = None
    if args.hessian_iters:
        hessian = hessian_top_eigenvalue(model, layout, centre, x, y, iters=args.hessian_iters,
                                         batch_size=config.eval_batch_size, seed=args.seed)
    flat = [v for row in result["loss"] for v in row]
    result.update(run_dir=str(run_dir), params_from=source, split=args.split, samples=int(x.shape[0]),
                  seed=args.seed, span=args.span, points=args.points, hessian_top_eig=hessian,
                  hessian_iters=args.hessian_iters, min_loss=min(flat), max_loss=max(flat),
                  directions="two N(0, I) directions, filter-normalised (Li et al. 2018); 1-D parameters fixed")
    png = Path(args.out) if args.out else run_dir / "plots" / "landscape.png"
    title = f"{config.algorithm} on {config.topology}: {args.split} loss around the averaged model"
    plots.landscape(result["alphas"], result["betas"], result["loss"], png,
                    title=title + ("" if hessian is None else f" (λ_max(H) = {hessian:.4g})"))
    path = run_dir / "landscape.json"
    atomic_write_bytes(path, to_json(result).encode())
    return result, png, path


def _final_params(run_dir: Path) -> tuple[torch.Tensor, list[str] | None, str]:
    for name in ("params.pt", "checkpoint.pt"):
        path = run_dir / name
        if path.is_file():
            try:
                if name == "checkpoint.pt":  # the manifest; the rows are in its shards (dfl.engine.checkpoint)
                    from dfl.engine import checkpoint

                    saved = checkpoint.read(run_dir)
                else:
                    saved = torch.load(path, map_location="cpu", weights_only=True)
                params = saved["params"]
            except Exception as exc:  # a truncated or foreign file: say which one
                raise ValueError(f"cannot read the parameters from {path}: {type(exc).__name__}: {exc}") from None
            if not isinstance(params, torch.Tensor) or params.dim() != 2:
                raise ValueError(f"{path} holds no [clients, dim] parameter tensor under 'params'")
            return params, saved.get("param_names"), name
    raise FileNotFoundError(f"{run_dir} has neither params.pt nor checkpoint.pt: the run has not saved parameters")


def _model_and_samples(config, args, dim: int, names: list[str] | None):

    try:
        device = resolve_device(config.device)
    except ValueError as exc:  # e.g. a GPU run looked at on a machine without one
        raise ValueError(f"{exc} (or pass --device)") from None
    data = build_data(config).to(device)
    model = build_model(config.model, tuple(data.input_shape), data.num_classes, **config.model_options)
    model = model.to(data.train_x.device)
    layout = ParamLayout.of(model)
    if layout.dim != dim or (names is not None and list(names) != list(layout.names)):
        raise ValueError(f"the saved parameters ({dim} entries) do not match the layout of {config.model} built "
                         f"from config.toml ({layout.dim} entries)")
    x, y = (data.train_x, data.train_y) if args.split == "train" else (data.test_x, data.test_y)
    k = min(args.samples, x.shape[0])
    index = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(args.seed))[:k].to(x.device)
    return model, layout, x[index], y[index]

"""The loss surface around a run's final averaged model, and its top Hessian eigenvalue (`dfl landscape`).

Rebuilds the run's data and model from its `config.toml` (as `dfl run` does), averages the client rows of
`params.pt` (`params.shards/`: a multi-process run's, each rank's rows; `checkpoint.pt` for a run that has not
finished), and evaluates the loss on a grid along two
filter-normalised random directions (`dfl.training.flatness`). Writes `RUN_DIR/plots/landscape.png` and
`RUN_DIR/landscape.json`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from dfl.config import Config
from dfl.directories import check_output_plot, directory_kind
from dfl.errors import OutputPathError
from dfl.files import atomic_write_bytes, read_toml
from dfl.sysmem import available_memory, human_bytes

if TYPE_CHECKING:
    import torch

SPLITS = ("train", "test")
# memory per grid point, measured loosely: the loss and accuracy grids as float64 tensors, then as Python lists
# of floats (landscape.json's values), their JSON text and the plot's arrays
BYTES_PER_POINT = 256


def check_arguments(run_dir: str | Path, *, points: int = 21, span: float = 1.0, samples: int = 2000,
                    split: str = "train", hessian_iters: int = 20, out: str | Path | None = None) -> Path:
    """Every check of `landscape`'s arguments that needs no torch (so `dfl landscape` refuses them at once).

    The ranges, a grid that fits in memory, a run directory of dfl's with saved parameters, and an `out` that
    dfl may write (`dfl.directories.check_output_plot`). Returns the plot's path.
    """
    run_dir = Path(run_dir)
    if isinstance(points, bool) or not isinstance(points, int) or points < 3:
        raise ValueError(f"--points must be an integer >= 3, got {points!r}")
    if not span > 0:
        raise ValueError(f"--span must be > 0, got {span}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"--samples must be an integer >= 1, got {samples!r}")
    if isinstance(hessian_iters, bool) or not isinstance(hessian_iters, int) or hessian_iters < 0:
        raise ValueError(f"--hessian-iters must be an integer >= 0, got {hessian_iters!r}")
    if split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}; got {split!r}")
    need, free = points * points * BYTES_PER_POINT, available_memory()
    if need > free:
        fits = max(3, int((free / BYTES_PER_POINT) ** 0.5))
        raise ValueError(f"--points {points}: a {points} × {points} grid needs about {human_bytes(need)} "
                         f"({BYTES_PER_POINT} bytes per point), but {human_bytes(free)} of memory are available; use "
                         f"--points {fits} or fewer")
    if not (run_dir / "config.toml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory: {run_dir / 'config.toml'} does not exist")
    read_toml(run_dir / "config.toml", "config file")  # unreadable bytes or syntax: one line naming the file
    if not any((run_dir / name).exists() for name in PARAM_FILES):
        raise FileNotFoundError(f"{run_dir} has neither params.pt, params.shards/ nor checkpoint.pt: the run has not "
                                "saved parameters")
    if directory_kind(run_dir) != "run":  # landscape.json is written into it
        raise OutputPathError(f"{run_dir} is not a run directory that dfl wrote (no dfl-directory.json, and its "
                              "config.toml is not a dfl config): dfl landscape writes landscape.json into it")
    return check_output_plot(Path(out) if out is not None else run_dir / "plots" / "landscape.png")


# the final parameters (one file, or every rank's rows of a multi-process run), else the last checkpoint's
PARAM_FILES = ("params.pt", "params.shards", "checkpoint.pt")


def landscape(run_dir: str | Path, *, points: int = 21, span: float = 1.0, samples: int = 2000, split: str = "train",
              seed: int = 0, hessian_iters: int = 20, device: str | None = None, out: str | Path | None = None):
    """The loss surface around a run's final averaged model θ, and the top Hessian eigenvalue there.

    The loss L(θ + a·d1 + b·d2) on a `points` × `points` grid over [-span, span]², along two filter-normalised random
    directions d1, d2 (Li et al. 2018), and λ_max of the Hessian at θ (`hessian_iters` power-iteration steps; 0 = skip).
    Writes the plot (`out`, default RUN_DIR/plots/landscape.png) and RUN_DIR/landscape.json; returns (result, png path,
    json path). The arguments are checked first, without torch (`check_arguments`).
    """
    png = check_arguments(run_dir, points=points, span=span, samples=samples, split=split,
                          hessian_iters=hessian_iters, out=out)
    from dfl.engine.results import to_json
    from dfl.engine.validation import validate
    from dfl.report import plots
    from dfl.training.flatness import hessian_top_eigenvalue, loss_landscape

    args = SimpleNamespace(points=points, span=span, samples=samples, split=split, seed=seed,
                           hessian_iters=hessian_iters, device=device, out=out)
    run_dir = Path(run_dir)
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
    title = f"{config.algorithm} on {config.topology}: {args.split} loss around the averaged model"
    plots.landscape(result["alphas"], result["betas"], result["loss"], png,
                    title=title + ("" if hessian is None else f" (λ_max(H) = {hessian:.4g})"))
    path = run_dir / "landscape.json"
    atomic_write_bytes(path, to_json(result).encode())
    return result, png, path


def _final_params(run_dir: Path) -> tuple[torch.Tensor, list[str] | None, str]:
    import torch

    from dfl.engine.results import read_torch_file

    for name in PARAM_FILES:
        path = run_dir / name
        if path.exists():
            if name == "checkpoint.pt":  # the manifest; the rows are in its shards (dfl.engine.checkpoint)
                from dfl.engine import checkpoint

                try:
                    saved = checkpoint.read(run_dir)
                except Exception as exc:  # a truncated or foreign checkpoint: say which one
                    raise ValueError(f"cannot read the parameters from {path}: {exc}") from None
            elif name == "params.shards":  # every rank's rows (dfl.engine.checkpoint.save_final_params)
                from dfl.engine import checkpoint

                try:
                    saved = checkpoint.read_final_params(run_dir)
                except Exception as exc:  # an interrupted write: say which directory
                    raise ValueError(f"cannot read the parameters from {path}: {exc}") from None
            else:
                saved = read_torch_file(path, "parameter file")
            params = saved.get("params") if isinstance(saved, dict) else None
            if not isinstance(params, torch.Tensor) or params.dim() != 2 or not params.is_floating_point():
                raise ValueError(f"parameter file {path}: holds no [clients, dim] parameter tensor under 'params'")
            names = saved.get("param_names")
            if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
                raise ValueError(f"parameter file {path}: 'param_names' is not a list of names")
            return params, names, name
    raise FileNotFoundError(f"{run_dir} has neither params.pt, params.shards/ nor checkpoint.pt: the run has not saved "
                            "parameters")


def _model_and_samples(config: Config, args, dim: int, names: list[str] | None):
    import torch

    from dfl.engine.setup import build_data, resolve_device
    from dfl.models import build_model
    from dfl.training.clients import ParamLayout

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

"""`dfl landscape RUN_DIR`: the loss surface around a run's final averaged model (`dfl.workflows.landscape`)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> None:
    """Add the `landscape` subcommand to the `dfl` parser."""
    p = subparsers.add_parser(
        "landscape",
        help="2-D loss landscape and top Hessian eigenvalue of a run's final averaged model",
        description="Loss of the averaged model θ on θ + a·d1 + b·d2 (filter-normalised random directions d1, d2; "
        "Li et al. 2018) over a grid, plus λ_max of the Hessian. Writes RUN_DIR/plots/landscape.png and "
        "RUN_DIR/landscape.json.",
    )
    p.add_argument("run_dir", help="a run directory written by dfl run (config.toml + params.pt, params.shards/ or "
                   "checkpoint.pt)")
    p.add_argument("--points", type=int, default=21, help="grid points per axis, >= 3 (default 21)")
    p.add_argument("--span", type=float, default=1.0, help="the grid covers [-span, span]² (default 1)")
    p.add_argument("--samples", type=int, default=2000, help="samples of the split to evaluate on (default 2000)")
    p.add_argument("--split", default="train", help="train or test (default train)")
    p.add_argument("--seed", type=int, default=0, help="seed of the directions and the sample (default 0)")
    p.add_argument("--hessian-iters", type=int, default=20, help="power-iteration steps; 0 = skip (default 20)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: the run's config device), e.g. to look at "
                   "a run trained on a GPU from a machine without one")
    p.add_argument("--out", help="PNG path (default RUN_DIR/plots/landscape.png)")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """`dfl landscape RUN_DIR`: compute the loss surface, save its plot and print where it went; the exit status."""
    from dfl.workflows.landscape import landscape

    try:
        result, png, path = landscape(args.run_dir, points=args.points, span=args.span, samples=args.samples,
                                      split=args.split, seed=args.seed, hessian_iters=args.hessian_iters,
                                      device=args.device, out=args.out)
    except (ValueError, FileNotFoundError) as exc:  # dfl's refusals: ValueError subclasses (dfl.errors)
        print(f"dfl landscape: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a plot or landscape.json that cannot be written (permissions, a full disk)
        print(f"dfl landscape: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    hessian = result["hessian_top_eig"]
    extra = "" if hessian is None else f", top Hessian eigenvalue {hessian:.4g}"
    print(f"loss at the averaged model {result['centre_loss']:.4f} ({args.split}, {result['samples']} samples)"
          f"{extra}; grid {args.points}×{args.points} over ±{args.span}: loss {result['min_loss']:.4f} .. "
          f"{result['max_loss']:.4f}\nwrote {png} and {path}")
    return 0

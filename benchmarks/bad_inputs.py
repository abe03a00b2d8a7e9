"""Hundreds of bad inputs, run once as a new user would type them: every flag of `dfl run` with values of the wrong
type, out of range, huge, tiny and misspelled; option tables; TOML config files; `dfl topology` and the preset
studies; the Python API. Each must end in one of

- a refusal: exit status 2 and one line "dfl ...: error: ..." on stderr (warnings aside), before torch loads for
  everything that needs no data (the seconds are reported);
- a run that ends as it should: exit 0 (completed), or 1 with status diverged;

never a traceback, a hang (`--timeout` seconds), several lines of error, or a changed file of the user's (a file
in the working directory is hashed before and after). Accepted runs are tiny: the cases' flags come after
`--rounds 1 --clients 4 --model logreg --dataset-options num_samples=400`, so a bad flag wins over them.

    python benchmarks/bad_inputs.py                      # every case, 2 at a time; a report on stdout
    python benchmarks/bad_inputs.py --family run --out benchmarks/results/bad_inputs.md

The report lists the failures first, then a table of every case: family, input, outcome, seconds, message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dfl.config import options

TINY = ["--rounds", "1", "--clients", "4", "--model", "logreg", "--dataset-options", "num_samples=400",
        "--local-steps", "1", "--train-eval-samples", "0", "--no-progress", "--device", "cpu"]
INTS = ["0", "-1", "1.5", "abc", "", "1e3", "2147483648", "9223372036854775808", "100000000000000000000",
        "-9223372036854775809", "1000000000"]
FLOATS = ["-1", "0", "nan", "inf", "-inf", "1e309", "abc", "1e30", "1e-320", "-0"]
WORDS = ["X", "", " ", "none", "None", "ring", "../x", "a" * 300]
TABLES = {
    "topology_options": ["x=1", "=1", "x", "degree=-1", "k=0", "p=2", "shape=(3,3)", "matrix=missing.npy",
                         "periodic=yes", "seed=-1", "seed=100000000000000000000", "symmetric=1"],
    "dataset_options": ["num_samples=0", "num_samples=1000000000", "num_samples=100000000000000000000",
                        "test_fraction=1", "test_fraction=nan", "root=/r", "seed=-5", "num_samples=abc",
                        "num_samples=[1]", "x=1"],
    "partition_options": ["alpha=0.1", "seed=3", "sigma=-1", "sigma=nan", "classes_per_client=0",
                          "min_size=100000", "x=1", "similarity=2"],
    "model_options": ["hidden=0", "hidden=(0,)", "hidden=abc", "hidden=(100000000,)", "conv_impl=x", "width=3",
                      "groups=3"],
    "algorithm_options": ["clip=0.5", "rho=0.05", "x=1"],
}
# combinations of fields that are wrong together
COMBOS = [
    "--topology grid --clients 17", "--topology hypercube --clients 12", "--topology random-k",
    "--topology random-regular", "--topology random-regular --topology-options degree=3 --clients 5",
    "--topology erdos-renyi --topology-options p=0.0", "--topology star --weights uniform", "--topology custom",
    "--topology custom --topology-options matrix=W.npy edges=g.txt", "--topology full --clients 100000",
    "--clients 1000000000", "--clients 5000", "--dataset synthetic --dataset-options size_log_sigma=1000",
    "--dataset synthetic --dataset-options size_log_mean=1000", "--dataset synthetic --clients 100000000",
    "--dataset synthetic --partition natural --dataset-options num_clients=3",
    "--dataset cifar10", "--dataset cifar10 --data-root /no/such/dir", "--data-root . --dataset mnist1d",
    "--data-root data --dataset-options root=/elsewhere", "--alpha 0.5 --partition-options alpha=0.1",
    "--partition iid --alpha 0.5", "--partition similarity", "--partition natural",
    "--lr-schedule step", "--lr-schedule cosine --lr-min 1", "--lr-milestones 10", "--warmup-rounds 5",
    "--local-epochs 1 --local-steps 1", "--client-chunk 5", "--local-optimizer adam --momentum 0.9",
    "--adam-eps 1e-6", "--local-optimizer adam --adam-betas 1 1", "--algorithm scaffold --local-optimizer adam",
    "--stop-at-target", "--target-accuracy 80", "--participation 0.5", "--rho-schedule linear",
    "--rho-ramp-rounds 5", "--link-failure 0.5 --link-failure-burst 1.5", "--link-failure 0.2 --algorithm fedavg",
    "--offline 0.2 --topology exponential", "--stragglers 0.5 --round-deadline 1",
    "--compressor top-k --compression 2", "--compressor qsgd --compression 1", "--compression 0.5",
    "--compressor top-k --algorithm fedavg", "--compressor qsgd --topology random-k --topology-options k=2",
    "--mode async", "--mode async --algorithm fedavg", "--mode async --algorithm dfedavg --compressor top-k",
    "--link-latency 1", "--precision tf32", "--device cuda:x", "--device gpu", "--model resnet50",
    "--model nosuch_module:net", "--model math:sqrt", "--model cnn1d --dataset digits", "--model vgg11",
    "--log tensorbord", "--log tensorboard --log tensorboard", "--name ../x", "--name .hidden",
    "--algorithm DFedSAM", "--topology Ring", "--dataset MNIST1D", "--partition Dirichlet", "--model LogReg",
    "--batch-size 100000000", "--hessian-every 1 --hessian-samples 1000000000", "--eval-batch-size 1000000000",
    "--client-eval-samples 1000000000", "--lr 1e30 --lr-decay 1 --rounds 3 --eval-every 1", "--rounds 1000000000",
    "--eval-every 1000000000", "--checkpoint-every 1000000000", "--seed 18446744073709551616",
    "--topology hierarchical", "--topology hierarchical --topology-options groups=3",
    "--topology hierarchical --topology-options groups=2 inner=rng",
    "--topology hierarchical --clients 1000000000 --topology-options groups=10",
    "--topology hierarchical --topology-options groups=2 inner_options=5",
    "--topology random-pull --weights metropolis", "--topology random-pull --link-failure 0.1",
    "--topology one-peer --topology-options graph=x", "--topology one-peer --clients 1000000000",
    "--topology one-peer --topology-options graph=star graph_options={centre=99}",
    "--topology exponential --topology-options exponent_base=1", "--topology star --topology-options centre=-1",
    "--topology directed-ring --offline 0.2", "--weights sample-count", "--weights column-stochastic",
    "--weights sample-count --topology-options sizes=[1,2]", "--algorithm kgt --algorithm-options outer_lr=0",
    "--algorithm dsgt --local-optimizer adam", "--algorithm KGT", "--threads 0", "--threads two",
    "--topology base-graph --weights metropolis", "--topology base-graph --topology-options k=0",
    "--topology base-graph --compressor top-k", "--topology d-equistatic",
    "--topology d-equistatic --topology-options M=3 epsilon=0.5", "--topology d-equistatic --topology-options M=1",
    "--topology d-equistatic --topology-options M=3 --link-failure 0.1",
    "--topology od-equidyn --topology-options eta=2", "--topology matcha --topology-options budget=0",
    "--topology matcha --aggregator median", "--topology matcha --clients 100000",
]
SNIPPETS = {  # the Python API: each must raise a dfl error (one line), as the CLI does
    "run a str": "dfl.run('not a config')",
    "run data=str": "dfl.run(dfl.Config(rounds=1), data='garbage')",
    "run out=int": "dfl.run(dfl.Config(rounds=1), out=5)",
    "run callbacks=str": "dfl.run(dfl.Config(rounds=1, clients=2, model='logreg'), callbacks='x')",
    "validate a list": "dfl.validate([1, 2])",
    "Config(data_root=5)": "dfl.validate(dfl.Config(data_root=5))",
    "Config(clients='4')": "dfl.validate(dfl.Config(clients='4'))",
    "Config(topology=['ring'])": "dfl.validate(dfl.Config(topology=['ring']))",
    "Config(clients=10**20)": "dfl.validate(dfl.Config(clients=10**20))",
    "Config(clients=10**5000)": "dfl.validate(dfl.Config(clients=10**5000))",
    "Config(lr=float('nan'))": "dfl.validate(dfl.Config(lr=float('nan')))",
    "Config(dataset_options=5)": "dfl.validate(dfl.Config(dataset_options=5))",
    "from_dict(list)": "dfl.Config.from_dict([1, 2])",
    "from_dict(unknown)": "dfl.Config.from_dict({'rnds': 3})",
    "from_toml(missing)": "dfl.Config.from_toml('missing.toml')",
    "from_toml(dir)": "dfl.Config.from_toml('.')",
    "topologies.build huge": "import topologies; topologies.build('ring', 10**12)",
    "topologies.build n=str": "import topologies; topologies.build('ring', 'x')",
    "topologies.build unknown": "import topologies; topologies.build('rng', 8)",
    "FederatedData.from_arrays junk": "from dfl.data import FederatedData; FederatedData.from_arrays('x', 'y')",
    "load_dataset huge": "from dfl.data import load_dataset; load_dataset('mnist1d', num_samples=10**20)",
    "build_model junk": "from dfl.models import build_model; build_model('mlp', 'x', 10)",
}
TOML_FILES = {
    "binary": b"\x00\x01\x02\xff", "utf16": "rounds = 3\n".encode("utf-16"), "latin1": "name = 'é'\n".encode("latin-1"),
    "bom": b"\xef\xbb\xbfrounds = 1\n", "syntax": b"rounds = \n", "deep": b"a = " + b"[" * 3000 + b"]" * 3000,
    "list-topology": b'topology = ["ring"]\n', "table-number": b"lr = {a = 1}\n", "several": b"clients = 0\nlr = -1\n"
    b"rnds = 3\n", "matrix-top-level": b'topology = "custom"\nmatrix = "W.npy"\n', "degree-top-level": b"degree = 4\n",
    "huge-int": b"clients = 9223372036854775807\n", "float-int": b"rounds = 2.0\n", "empty": b"",
    "unknown-only": b"hello = 1\n", "nested-options": b"[dataset_options]\nnum_samples = 1000000000\n",
}


@dataclass
class Case:
    family: str
    label: str
    argv: list[str] | None = None  # `dfl ...` arguments; None: a Python snippet
    code: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)


def cases() -> list[Case]:
    out: list[Case] = []
    for opt in options():
        flag = "--" + opt.name.replace("_", "-")
        if opt.name == "loggers":
            values = ["tensorbord", "", "wandb,wandb", "x" * 300]
        elif opt.type == "bool":
            continue
        elif opt.type.startswith("dict"):
            values = TABLES.get(opt.name, ["x=1"])
        elif opt.type.startswith("list"):
            values = ["a", "-1", "1e30", "1 1", "5 3"] if "int" in opt.type else ["a", "1 1", "0.9", "nan nan"]
        elif opt.type.startswith("int"):
            values = INTS
        elif opt.type.startswith("float"):
            values = FLOATS
        else:
            values = WORDS + [c.upper() for c in opt.choices or ()][:2]
        for value in values:
            out.append(Case("run flags", f"{flag} {value!r}", ["run", *TINY, flag, *value.split(" ")]))
    out += [Case("run combinations", combo, ["run", *TINY, *shlex.split(combo)]) for combo in COMBOS]
    for name, content in TOML_FILES.items():
        out.append(Case("config files", name, ["run", "c.toml", *TINY], files={"c.toml": content}))
    out += [Case("config files", "missing", ["run", "missing.toml"]), Case("config files", "directory", ["run", "."])]
    for args in ["ring --clients 1000000000", "ring --clients 100000000000000000000", "Ring --clients 8",
                 "grid --clients 17", "hypercube --clients 12", "random-k --clients 8", "random-k --clients 8 --k 9",
                 "erdos-renyi --clients 8 --p 2", "custom", "custom --matrix missing.npy", "compare --clients 0",
                 "compare --clients 16 --topologies rng", "ring --clients 8 --gossip-steps 0",
                 "ring --clients 8 --eps 2", "show", "show nosuch", "ring --clients 8 --options x=1",
                 "ring --clients -3", "full --clients 1000000", "star --clients 8 --weights uniform",
                 "hierarchical --clients 12 --groups 5", "hierarchical --clients 1000000000 --groups 7",
                 "one-peer --clients 1000000000", "random-pull --clients 8 --k 2 --weights metropolis",
                 "exponential --clients 8 --exponent-base 1", "star --clients 8 --centre 9", "draw ring --clients 8",
                 "draw ring --clients 8 --out x.txt", "ring --clients 8 --steps 3",
                 "base-graph --clients 8 --weights lazy", "d-equistatic --clients 8", "matcha --clients 8 --budget 2",
                 "ring --clients 8 --params 0", "ring --clients 8 --start-eps 2"]:
        out.append(Case("dfl topology", args, ["topology", *args.split()]))
    for args in ["compare-topologies --algorithms fedavg", "compare-topologies --algorithms DFedSAM",
                 "compare-topologies --topologies rng", "compare-topologies --seeds 0",
                 "compare-topologies --set clients=0", "compare-topologies --set rounds=-1",
                 "compare-topologies --set nosuch=1", "spectral-study --algorithm fedavg",
                 "spectral-study --algorithm scaffold", "spectral-study --clients 1000000000",
                 "spectral-study --clients 0", "spectral-study --gossip-steps 0",
                 "spectral-study --algorithm dfedsam --gossip-steps 2", "spectral-study --topologies Ring"]:
        out.append(Case("preset studies", args, [*args.split(), "--dry-run", "--out", "study"]))
    out += [Case("Python API", label, code=code) for label, code in SNIPPETS.items()]
    return out


@dataclass
class Outcome:
    case: Case
    kind: str  # refused, completed, diverged, FAILED
    status: int | None
    seconds: float
    message: str
    problem: str = ""


API = """
import sys, dfl
try:
    {code}
except Exception as exc:
    mod = type(exc).__module__
    ok = mod.startswith(("dfl.", "topologies.")) or type(exc).__name__ == "ConfigError"
    print(f"{{'dfl' if ok else 'OTHER'}} {{type(exc).__name__}}: {{exc}}", file=sys.stderr)
    sys.exit(2 if ok else 3)
print("no error", file=sys.stderr)
"""


def run_case(case: Case, timeout: float) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        mine = Path(tmp) / "mine.txt"
        mine.write_text("the user's own file\n")
        for name, content in case.files.items():
            (Path(tmp) / name).write_bytes(content)
        before = hashlib.sha256(mine.read_bytes()).hexdigest()
        command = ([sys.executable, "-m", "dfl.cli", *case.argv] if case.argv is not None
                   else [sys.executable, "-c", API.format(code=case.code)])
        if case.argv is not None and case.argv[0] == "run":
            command += ["--out", str(Path(tmp) / "out")]
        tic = time.perf_counter()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=tmp,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        except subprocess.TimeoutExpired:
            return Outcome(case, "FAILED", None, timeout, "", f"no answer within {timeout:g} s (a hang?)")
        seconds = time.perf_counter() - tic
        changed = hashlib.sha256(mine.read_bytes()).hexdigest() != before
    errors = [line for line in proc.stderr.splitlines() if line.strip() and ": warning: " not in line
              and "Warning" not in line and not line.startswith("  warnings.warn")]
    message = errors[0] if errors else ""
    problem = ""
    if "Traceback" in proc.stderr:
        problem = "a traceback"
    elif changed:
        problem = "a file of the user's changed"
    elif proc.returncode == 3 or message.startswith("OTHER"):
        problem = "not a dfl error"
    elif proc.returncode not in (0, 1, 2):
        problem = f"exit status {proc.returncode}"
    elif proc.returncode == 2 and len(errors) != 1 and not message.startswith("usage:"):
        problem = f"{len(errors)} lines of error"
    elif proc.returncode == 1 and "diverged" not in proc.stderr:
        problem = "exit 1 without divergence"
    elif case.code is not None and proc.returncode == 0:
        problem = "the Python API accepted it"
    kind = "FAILED" if problem else {0: "completed", 1: "diverged", 2: "refused"}[proc.returncode]
    if message.startswith("usage:") and len(errors) > 1:
        message = errors[-1]  # argparse: usage, then the error
    return Outcome(case, kind, proc.returncode, seconds, message, problem)


def report(outcomes: list[Outcome]) -> str:
    failed = [o for o in outcomes if o.kind == "FAILED"]
    refused = [o for o in outcomes if o.kind == "refused"]
    lines = [f"# Bad inputs: {len(outcomes)} cases, {len(failed)} failed\n",
             f"- refused with one line: {len(refused)}; completed: {sum(o.kind == 'completed' for o in outcomes)}; "
             f"diverged: {sum(o.kind == 'diverged' for o in outcomes)}",
             f"- refusals: median {_median([o.seconds for o in refused]):.2f} s, slowest "
             f"{max((o.seconds for o in refused), default=0):.2f} s (process start included)\n"]
    if failed:
        lines += ["## Failures\n", "| family | input | problem | first line |", "|---|---|---|---|"]
        lines += [f"| {o.case.family} | `{_cell(o.case.label)}` | {o.problem} | {_cell(o.message)} |" for o in failed]
        lines.append("")
    lines += ["## Every case\n", "| family | input | outcome | s | message |", "|---|---|---|---|---|"]
    lines += [f"| {o.case.family} | `{_cell(o.case.label)}` | {o.kind} | {o.seconds:.2f} | {_cell(o.message)} |"
              for o in outcomes]
    return "\n".join(lines) + "\n"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")[:220]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", help="only the cases of families whose name contains this")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a case counts as a hang")
    p.add_argument("--out", help="write the report here (Markdown) as well")
    p.add_argument("--json", help="write every outcome here")
    args = p.parse_args(argv)
    todo = [c for c in cases() if args.family is None or args.family in c.family]
    with ThreadPoolExecutor(args.parallel) as pool:
        outcomes = list(pool.map(lambda c: run_case(c, args.timeout), todo))
    text = report(outcomes)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps([{"family": o.case.family, "input": o.case.label, "kind": o.kind,
                                                "status": o.status, "seconds": round(o.seconds, 3),
                                                "message": o.message, "problem": o.problem} for o in outcomes],
                                               indent=1))
    return 1 if any(o.kind == "FAILED" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

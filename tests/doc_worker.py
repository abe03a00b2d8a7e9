"""One Python process that runs the pages' `dfl` commands for tests/test_docs.py, one after the other.

A page's script (bash) defines `dfl` as a shell function that writes the command to the fifo REQUEST (the page's log
folder, the working directory, the command's number, then its words, each ending in NUL, a newline at the end) and
reads its exit status from the fifo REPLY; this process runs it with the console script's own entry point,
`dfl.cli.main(argv)`, in that directory, its output into LOG/N.out and LOG/N.err (which the function prints). Every
command runs as written; only the process is shared (one per test worker), so torch and the generated datasets load
once instead of once per command (a few-round `dfl run` costs ~4 s of start-up alone on 2 cores).

    python tests/doc_worker.py REQUEST REPLY
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path


def serve(request: str, reply: str) -> None:
    """Answer requests until an empty one (the script's end) or end of file."""
    from dfl.cli import main

    while True:
        with open(request, "rb") as fifo:
            line = fifo.readline()
        if not line.strip():
            return
        log, cwd, number, *argv = line.rstrip(b"\n").decode().split("\0")[:-1]  # each word ends in NUL
        os.chdir(cwd)
        with open(Path(log) / f"{number}.out", "w") as out, open(Path(log) / f"{number}.err", "w") as err, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse's refusals and --help
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            except BaseException:  # noqa: BLE001 (a traceback is the command's failure, reported as such)
                traceback.print_exc()
                status = 1
        with open(reply, "w") as fifo:
            fifo.write(f"{int(status or 0)}\n")


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])

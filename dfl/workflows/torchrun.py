"""`dfl torchrun`: a single-node torchrun of `dfl run` whose refusals read as one line.

torchrun's elastic agent raises `ChildFailedError` whenever a worker exits with a status other than 0, and Python
prints it: after dfl's one-line refusal (`dfl run: error: ...`, printed by every rank) come ~40 lines of the agent's
log, traceback and failure table. No worker can prevent that (the agent is the workers' parent; it reports any
non-zero exit), and exiting 0 would hide the refusal from scripts. So the launcher runs torchrun as a child
(`python -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=N -m dfl.cli run ...`), passes its
output through as it comes, and once a rank has printed a `dfl run: error:` line (and no rank a Python traceback:
a crash keeps torchrun's report, whose "Root Cause" names the rank), drops the rest of torchrun's own output, keeping
only the first copy of each dfl line. The exit status is the failing rank's (`exitcode` under "Root Cause": 2 for a
refusal, 1 for a diverged run), else torchrun's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import BinaryIO

REFUSAL = b"dfl run: error: "  # the one-line errors of `dfl run` (dfl.cli.run.main)
OWN_LINE = b"dfl run: "  # any line of dfl's own (errors, interruptions) kept after a refusal, once each
TRACEBACK = b"Traceback (most recent call last):"
ROOT_CAUSE_EXIT = re.compile(rb"Root Cause.*?exitcode\s*:\s*(-?\d+)", re.S)


def torchrun_command(nproc: int, run_args: Sequence[str]) -> list[str]:
    """The torchrun command line: this interpreter's torchrun, one node, `nproc` ranks of `dfl run run_args`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc_per_node={nproc}", "-m", "dfl.cli", "run", *run_args]


class RefusalFilter:
    """What of torchrun's stderr the user sees (module doc): `feed` bytes as they come, write what it returns."""

    def __init__(self) -> None:
        self.refused = False  # a rank printed a refusal; torchrun's own output is dropped from there on
        self.crashed = False  # a rank printed a Python traceback: torchrun's report stays
        self._line = b""  # the current line so far
        self._dropped = b""  # torchrun's output after the refusal (its failure table has the exit code)
        self._shown: set[bytes] = set()

    def feed(self, chunk: bytes) -> bytes:
        """The part of `chunk` to show (progress bars' partial lines included, as they come)."""
        shown = bytearray()
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end + 1]
            start += len(piece)
            self._line += piece
            if not self.refused:
                shown += piece
            if end < 0:
                break
            line, self._line = self._line, b""
            shown += self._complete(line)
        return bytes(shown)

    def _complete(self, line: bytes) -> bytes:
        """Bookkeeping of a whole line; what to show of it beyond what `feed` passed through already."""
        text = line.rstrip(b"\r\n")
        if text.startswith(TRACEBACK):
            self.crashed = True
        if not self.refused:
            if text.startswith(REFUSAL) and not self.crashed:
                self.refused = True
            if text.startswith(OWN_LINE):
                self._shown.add(text)
            return b""
        self._dropped += line
        if text.startswith(OWN_LINE) and text not in self._shown:
            self._shown.add(text)
            return line
        return b""

    def exit_code(self, returncode: int) -> int:
        """The launcher's status: after a refusal, the root-cause rank's exit code (128 + N for signal N)."""
        if not self.refused or returncode == 0:
            return returncode
        found = ROOT_CAUSE_EXIT.search(self._dropped)
        if found is None:
            return returncode
        code = int(found.group(1))
        return 128 - code if code < 0 else code


def launch(nproc: int, run_args: Sequence[str], stderr: BinaryIO | None = None) -> int:
    """Run `dfl run run_args` on `nproc` ranks of this machine under torchrun; the exit status.

    Each rank gets one torch thread unless OMP_NUM_THREADS says otherwise (gloo workers share the CPU). Ctrl-C
    reaches torchrun and its ranks (one process group); the launcher waits for them to stop.
    """
    out = stderr if stderr is not None else sys.stderr.buffer
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(torchrun_command(nproc, run_args), stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # torchrun and the ranks get it and stop
    filtered = RefusalFilter()
    try:
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            shown = filtered.feed(chunk)
            if shown:
                out.write(shown)
                out.flush()
        returncode = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    return filtered.exit_code(returncode)


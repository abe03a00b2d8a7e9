"""How the local pool's worker processes stop together.

The stop signals turned into `SweepInterrupted`, a worker that dies with the sweep (Linux `PR_SET_PDEATHSIG`), and
SIGTERM-then-SIGKILL for the workers still running.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from dfl.errors import SweepInterrupted

STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
STOP_GRACE_SECONDS = 10.0  # SIGTERM'd workers that have not exited by then get SIGKILL


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise `SweepInterrupted`.

    Only the first signal raises; later ones are ignored while the workers are being stopped. Handlers are set in
    the main thread only (elsewhere Python cannot set them).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if received:  # already stopping the workers: let that finish
            return
        received.append(signum)
        raise SweepInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when this process dies.

    Linux `PR_SET_PDEATHSIG`, which survives exec; None where that is not available.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: nothing but the call after fork
    except (OSError, AttributeError):  # pragma: no cover
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the sweep died before the call above: nobody would stop this worker
            os._exit(1)

    return preexec


def stop_workers(procs: list[subprocess.Popen], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM every worker still running, wait up to `grace` seconds in all, then SIGKILL the rest; reaps all."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


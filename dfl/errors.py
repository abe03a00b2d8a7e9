"""Every error dfl raises on purpose, in one leaf module: any layer may import it, it imports nothing of dfl.

Each message is one line that names the field, file or run at fault and what would be accepted instead.
"""

from __future__ import annotations

import signal
from pathlib import Path

__all__ = [
    "ArgumentError", "CheckpointError", "ConfigError", "DataError", "DeviceMismatch", "DivergenceError",
    "FileReadError", "ModelError", "NoCheckpoint", "OutputPathError", "PeerFailure", "RegistryError", "ReportError",
    "RunDirectoryExists", "RunInterrupted", "SweepError", "SweepInterrupted",
]


def one_line(text: object) -> str:
    r"""`text` on one line: a line break inside user text (a key, a file name, a value) shows as \n."""
    return str(text).replace("\r", "\\r").replace("\n", "\\n")


class OneLine(Exception):
    """An error whose message is one line whatever it quotes (a mixin of the classes below)."""

    def __init__(self, message: object = "", *args: object):
        super().__init__(one_line(message), *args)


class ConfigError(OneLine, ValueError):
    """A configuration value is invalid; the message names the field and the allowed values.

    A config with several wrong fields gives one error listing them all (one line, "; " between them); `problems` holds
    each message.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = [one_line(p) for p in problems] if problems else [str(self)]


class ArgumentError(ConfigError, TypeError):
    """An argument of the Python API of the wrong type (`dfl.run("a string")`, `dfl.run(config, data=[...])`).

    A ConfigError that is also the TypeError Python users expect; the message names the argument and its type.
    """


class DataError(OneLine, ValueError):
    """Data that cannot be used; the message names the dataset, option or array.

    For example a partition that leaves a client empty, arrays of the wrong shape, labels out of range or an empty
    test set; the message also says what is allowed.
    """


class RegistryError(OneLine, ValueError):
    """A registration clash or a plug-in that cannot be loaded (the message names the name and the source)."""


class ModelError(OneLine, ValueError):
    """A model that cannot be built or trained by the engine; the message names the model spec."""


class DivergenceError(RuntimeError):
    """The run diverged (NaN/inf, or a training loss far above a uniform guess's); the message names the round."""


class RunInterrupted(KeyboardInterrupt):
    """A signal asked the run to stop (`dfl run` raises it on SIGTERM and SIGHUP; Ctrl-C is KeyboardInterrupt)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class PeerFailure(RuntimeError):
    """This process stopped because another process of the run failed."""


class DeviceMismatch(RuntimeError):
    """A tensor handed to a communicator is not on the communicator's device.

    An engine bug that NCCL would turn into a crash, and gloo would hide behind a copy; the message names the
    operation, the tensor's device and the communicator's.
    """


class RunDirectoryExists(FileExistsError):
    """The run directory already holds a run (use --overwrite, --resume or another --out)."""


class NoCheckpoint(FileNotFoundError):
    """`--resume` on a directory without a checkpoint."""


RESTART_HINT = "delete the run directory, or start the run again with --overwrite instead of --resume"


class CheckpointError(ValueError):
    """`checkpoint.pt` exists but cannot be resumed (truncated, corrupt, or not a complete dfl checkpoint).

    `path` is the file, `reason` what is wrong with it; the message is one line and says what to do.
    """

    def __init__(self, path: str | Path, reason: str, hint: str = RESTART_HINT):
        self.path, self.reason = Path(path), reason
        super().__init__(f"checkpoint {self.path} is unreadable ({reason}); {hint}")


class ReportError(ValueError):
    """Nothing to report on, or a bad report option; the message names the argument and the allowed values."""


class SweepError(ValueError):
    """A sweep spec or sweep directory is invalid; the message names the table, field or run."""


class SweepInterrupted(KeyboardInterrupt):
    """The sweep was stopped by a signal, its workers already stopped.

    The sweep got SIGINT, SIGTERM or SIGHUP; its workers have been stopped by the time this propagates out of
    `run_sweep`. `exit_code` is 128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
    """

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.stopped = 0  # worker processes stopped (set by the parallel runner)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        """128 + the signal number: the exit status of a process killed by that signal."""
        return 128 + self.signum


class LauncherError(SweepError):
    """A sweep launcher cannot be used as asked.

    A bad Slurm option (the message names the flag or key and the allowed values), submitit missing, or a submission the
    scheduler refused. Raised before anything is submitted, except for a refused submission (the sweep directory records
    what was submitted before it).
    """


# ---------------------------------------------------------------------------------------------- files and directories
class FileReadError(ValueError):
    """A file dfl reads is missing, unreadable or not what it should be.

    For example: not a regular file, not UTF-8, bad syntax, the wrong shape, truncated, a header claiming more than
    the file holds. `path` is the file, `what` says what it was read as (e.g. "sweep file"), `reason` what is wrong;
    the message is one line: `<what> <path>: <reason>`.
    """

    def __init__(self, path: str | Path, reason: str, what: str = "file"):
        self.path, self.reason, self.what = Path(path), reason, what
        super().__init__(f"{what} {self.path}: {reason}")


class OutputPathError(ValueError):
    """A path dfl was asked to write to cannot be used without touching what is not dfl's.

    An existing folder dfl did not make (no `dfl-directory.json`), a directory of another kind, an existing file where a
    directory is expected (or a directory where a file is), or a path under a file. Raised before anything is written;
    the message is one line naming the path and what to do.
    """

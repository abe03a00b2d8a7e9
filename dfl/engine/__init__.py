"""Running an experiment.

`validation.validate` (every check before any work), `runner.run` (the round loop, the run directory), the set-up
(`setup`), one run between its phases (`experiment`), the multi-process communicator (`distributed`), the
asynchronous mode (`asynchronous`), checkpoints (`checkpoint`), run-directory files (`results`) and live metrics and
callbacks (`hooks`).
"""

from dfl.lazy import submodules

__getattr__ = submodules(__name__)

"""Many runs and what is made from them.

Sweeps over a grid (`sweep`), the ready-made ones (`presets`; `reproduce`: a paper's table as one sweep) and the loss
landscape of a finished run (`landscape`). Reports and plots are `dfl.report`.
"""

from dfl.lazy import submodules

__getattr__ = submodules(__name__)

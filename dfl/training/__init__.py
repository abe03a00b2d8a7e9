"""Local training of every client at once.

The client stack (`clients`), the vectorized local steps (`local`: SGD, SAM/ASAM, momentum, clipping; `adam`; `batched`:
the built-in models' gradients without vmap), evaluation of the stack (`evaluate`, `flatness`) and the memory planner
that chooses how many clients one vectorized call trains (`memory`).
"""

from dfl.lazy import submodules

__getattr__ = submodules(__name__)

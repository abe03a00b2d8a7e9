"""The version of dfl, written here only.

The package's metadata (pyproject.toml's dynamic version), `dfl.__version__`, the marker of every directory dfl writes
and CITATION.cff (kept equal by a test) read it. Torch-free, imports nothing.
"""

__version__ = "0.1.0"

"""Size limits of the topologies package, read at call time (`monkeypatch.setattr(topologies.limits, ...)`
changes them for a test)."""

DENSE_LIMIT = 20_000  # largest n for which matrix(step) / W build a dense [n, n] float64 array (3.2 GB)
DENSE_SPECTRAL_LIMIT = 2048  # largest n for the exact dense eigensolvers (O(n^3))
FULL_SPARSE_LIMIT = 2048  # largest n for which the complete topology's sparse() stores its n^2 entries

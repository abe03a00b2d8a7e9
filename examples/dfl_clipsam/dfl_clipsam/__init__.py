"""dfl-clipsam: an example dfl plug-in adding the algorithm "dfedsam-clip" (`dfl_clipsam.algorithm.ClipSAM`)."""

from dfl_clipsam.algorithm import ClipSAM

__all__ = ["ClipSAM"]

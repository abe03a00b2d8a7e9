"""`TopologyError`: what the topologies package raises for bad input.

It is a ValueError, as before it had a class of its own. The package imports nothing of dfl, so dfl turns it into
its own errors where it calls in (`dfl.graphs`: a ConfigError naming the topology).
"""

from __future__ import annotations


class TopologyError(ValueError):
    r"""A topology that cannot be built as asked.

    The message names the argument or option and what is allowed, on one line (a line break in a quoted file name
    or value shows as \n, a carriage return as \r).
    """

    def __init__(self, message: object = "", *args: object):
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"), *args)

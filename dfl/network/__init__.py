"""How clients exchange models.

Communicators (`comm`), exact gossip W^Q X (`gossip`), unreliable links, offline clients and stragglers (`faults`),
compressed gossip (`compression`, `choco`), Byzantine clients and robust aggregation (`byzantine`, `robust`), the
network a run trains over, which joins them and builds the run's gossip (`run_network`), and the event clocks of the
asynchronous mode (`async_events`).
"""

from dfl.lazy import submodules

__getattr__ = submodules(__name__)

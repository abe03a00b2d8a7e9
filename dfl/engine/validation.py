"""`validate(config)`: everything a run checks before any work, in one place above the components.

`Config.validate()` checks each field on its own (the config layer knows no component). Here each component
checks the options it owns, where it is registered (`dfl.algorithms`, `dfl.topologies`, `dfl.data`,
`dfl.models`, `dfl.loggers`, `dfl.threads`, `dfl.network.faults`, `dfl.network.choco`,
`dfl.engine.asynchronous`), and the rules that join components are written once, below. Every check raises
`ConfigError` naming the field and the allowed values.
"""

from __future__ import annotations

from dfl import algorithms, data, loggers, models, threads, topologies
from dfl.config import Config
from dfl.engine import asynchronous
from dfl.errors import ConfigError
from dfl.network import choco, faults


def validate(config: Config) -> Config:
    """Check `config` as a run would, before any work; return it (so `config = validate(config)` reads well)."""
    config.validate()
    algorithms.check_config(config)
    topologies.check_config(config, push_sum=algorithms.algorithm_class(config.algorithm).push_sum)
    data.check_config(config)
    models.check_config(config)
    loggers.check_config(config)
    threads.check_config(config)  # "auto" or N >= 1 (dfl.threads: no torch, so the CLI checks it before torch loads)
    centralized = algorithms.is_centralized(config.algorithm)
    faults.check_config(config, centralized)  # link_failure, offline, bursts, stragglers, round_deadline
    choco.check_config(config, centralized)  # compressor, compression, consensus_lr
    asynchronous.check_config(config, centralized)  # mode, link_latency, link_bandwidth, max_staleness
    if config.mode == "async" and config.compressor != "none":
        raise ConfigError(f"compressor = {config.compressor} is not modelled in mode = async (CHOCO's public "
                          "copies need every neighbour to see every message in order); use mode = sync")
    return config

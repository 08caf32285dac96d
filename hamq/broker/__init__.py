"""The broker node: processors, topic/offset/subscription managers, registration.

- config.py         BrokerConfig from TOML plus overrides, validated field by field
- node.py           BrokerNode: store, server, embedded nameserver, background services
- context.py        what processors share
- roles.py          the role (starting, master, slave): one value, its table of moves
- replicas.py       controller mode: identity, heartbeats, the controllers' role changes
- topics.py, offsets.py, subscriptions.py   the managers and their JSON files (state_file.py)
- clients.py        producer and consumer groups, orderly consumers' queue locks
- long_polling.py   pulls that wait for messages
- registration.py   registering with nameservers, telling groups of member changes
- processors/       send, pull, clients and offsets, administration
"""

from hamq.broker.config import BrokerConfig, ConfigError, build_config, load_config
from hamq.broker.node import BrokerNode, BrokerStatistics

__all__ = [
    "BrokerConfig",
    "BrokerNode",
    "BrokerStatistics",
    "ConfigError",
    "build_config",
    "load_config",
]

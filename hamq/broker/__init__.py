"""The broker node: processors, topic/offset/subscription managers, registration.

- config.py         BrokerConfig from TOML plus overrides, validated field by field
- live_config.py    a running broker's configuration: shown, and changed where it may be
- node.py           BrokerNode: store, server, embedded nameserver, background services
- context.py        what processors share
- roles.py          the role (starting, master, slave): one value, its table of moves, and
                    every answer that depends on it (the store and HA service read it)
- replicas.py       controller mode: identity, heartbeats, the controllers' role changes
- slave_sync.py     a slave's 10-second copy of its master's metadata
- topics.py, offsets.py, subscriptions.py   the managers and their JSON files (state_file.py)
- clients.py        producer and consumer groups, orderly consumers' queue locks
- client_calls.py   requests the broker sends its consumers for operators
- long_polling.py   pulls that wait for messages
- registration.py   registering with nameservers, telling groups of member changes
- transactions.py   transactional messages: half messages, END_TRANSACTION, the check-back
- stats.py          what the broker counts; metrics.py: its Prometheus metrics
- processors/       send, pull, clients and offsets, administration, END_TRANSACTION
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

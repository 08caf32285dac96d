"""The stateless name service: route table, processors, housekeeping.

Several nameservers run side by side and never talk to each other; every broker
registers with each one. Importable alone, and embedded by ``hamq broker`` when no
nameserver address is given (docs/ARCHITECTURE.md#nameservers-and-registration).

- route_table.py  pure state: topics, brokers, clusters, live brokers
- processors.py   REGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC, ... (docs/PROTOCOL.md)
- service.py      NameServer: the server, housekeeping, configuration
- metrics.py      its metrics (``hamq_nameserver_*``), read at scrape time
"""

from nameserver.route_table import RouteTable
from nameserver.service import DEFAULT_PORT, NameServer, NameServerConfig

__all__ = ["DEFAULT_PORT", "NameServer", "NameServerConfig", "RouteTable"]

"""Prometheus metrics: a registry per server, served over HTTP by a Trio task.

- server.py  MetricsServer (``GET /metrics`` on a port of its own), its registry, Snapshot
"""

from hamq.metrics.server import MetricsServer, Snapshot, new_registry

__all__ = ["MetricsServer", "Snapshot", "new_registry"]

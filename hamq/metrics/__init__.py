"""Prometheus metrics: a registry per server, served over HTTP by a Trio task."""

from hamq.metrics.server import MetricsServer, Snapshot, new_registry

__all__ = ["MetricsServer", "Snapshot", "new_registry"]

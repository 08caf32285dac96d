"""A nameserver's metrics (``hamq_nameserver_*``), read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from nameserver.service import NameServer


class NameServerCollector:
    """A prometheus-client collector over one nameserver."""

    def __init__(self, server: NameServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        stats = self.server.statistics()
        yield GaugeMetricFamily(
            "hamq_nameserver_brokers", "Brokers registered and alive", stats.brokers
        )
        yield GaugeMetricFamily("hamq_nameserver_topics", "Topics routed", stats.topics)
        yield GaugeMetricFamily("hamq_nameserver_clusters", "Clusters known", stats.clusters)
        yield CounterMetricFamily(
            "hamq_nameserver_brokers_expired",
            "Brokers dropped for not registering within their timeout",
            stats.brokers_expired,
        )

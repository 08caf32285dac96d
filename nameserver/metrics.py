"""A nameserver's metrics (``hamq_nameserver_*``), read at scrape time: its route
table, and what hostile peers met (connections refused over max_connections, failed
TLS handshakes, ACL refusals by reason; an embedded controller's requests are checked
by the nameserver's ACL, so they count here)."""

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
        server = self.server.server.statistics()
        yield CounterMetricFamily(
            "hamq_nameserver_connections_refused",
            "Connections closed at accept for being over max_connections",
            server.connections_refused,
        )
        yield CounterMetricFamily(
            "hamq_nameserver_tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            server.tls_handshake_failures,
        )
        acl = self.server.acl
        refused = CounterMetricFamily(
            "hamq_nameserver_acl_refused",
            "Requests the ACL refused (NO_PERMISSION), by reason",
            labels=["reason"],
        )
        for reason, count in sorted(acl.statistics().refused_by_reason.items() if acl else ()):
            refused.add_metric([reason], count)
        yield refused

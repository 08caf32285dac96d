"""A broker's metrics, built at scrape time from its counters and statistics.

Every family is named ``hamq_broker_*`` (README: "Metrics" lists them with their
meaning). Counters come from hamq/broker/stats.py; the rest is read when scraped:
consumer lag from the committed offsets and the consume queues, replication from the
HA service, the store's offsets, the transaction check's completed passes (tests wait
on them: hamq/broker/transactions.py, "Observed"), the gRPC endpoint's connections,
calls and push consumers' renewals (when it is served), and what hostile peers met
(``_defenses``: the listeners' refused connections and failed TLS handshakes, the HA
port's refused peers, the ACL's refusals by reason) from those services' statistics. The store's
disk use is a walk of its files: it is measured every DISK_WALK_S in a worker thread
by ``measure_disk`` (a task the broker runs), never on the Trio thread while a scrape
waits.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from hamq.broker.offsets import TOPIC_GROUP_SEPARATOR
from hamq.broker.stats import LATENCY_BUCKETS_S

if TYPE_CHECKING:
    from hamq.broker.node import BrokerNode

#: how often the store's disk use is measured again (a walk of its files)
DISK_WALK_S = 10.0


def disk_use(directory: Path) -> tuple[int, int]:
    """(bytes reserved: the files' sizes, bytes really on disk: their blocks) under
    ``directory``; files that vanish during the walk are skipped."""
    reserved = used = 0
    pending = [directory]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    stat = entry.stat(follow_symlinks=False)
                    reserved += stat.st_size
                    used += stat.st_blocks * 512
            except OSError:
                continue
    return reserved, used


def _counted(name: str, text: str, label: str, counts: Mapping[str, int]) -> Metric:
    """A counter family with one sample per key of ``counts``."""
    family = CounterMetricFamily(name, text, labels=[label])
    for key, count in sorted(counts.items()):
        family.add_metric([key], count)
    return family


class BrokerCollector:
    """A prometheus-client collector over one broker (``registry.register(...)``)."""

    def __init__(self, node: BrokerNode) -> None:
        self.node = node
        #: (reserved, used) bytes of the store's files, as last measured
        self.disk: tuple[int, int] = (0, 0)

    async def measure_disk(self) -> None:
        """Measure the store's disk use now and every DISK_WALK_S (run as a task)."""
        directory = self.node.store.config.store_dir
        while True:
            self.disk = await trio.to_thread.run_sync(disk_use, directory)
            await trio.sleep(DISK_WALK_S)

    def collect(self) -> Iterator[Metric]:
        yield from self._identity()
        yield from self._traffic()
        yield from self._consumers()
        yield from self._transactions()
        yield from self._replication()
        yield from self._store()
        yield from self._grpc()
        yield from self._defenses()

    def _identity(self) -> Iterator[Metric]:
        node, ctx = self.node, self.node.ctx
        info = GaugeMetricFamily(
            "hamq_broker_info",
            "This broker: cluster, broker group, id and role now (value 1)",
            labels=["cluster", "broker_name", "broker_id", "role", "address"],
        )
        info.add_metric(
            [
                node.config.cluster_name,
                node.config.broker_name,
                str(ctx.roles.broker_id),
                ctx.roles.broker_role.value,
                ctx.address,
            ],
            1,
        )
        yield info
        yield GaugeMetricFamily(
            "hamq_broker_master",
            "1 while this broker is its group's master",
            value=ctx.roles.is_master,
        )
        yield GaugeMetricFamily(
            "hamq_broker_epoch",
            "The last epoch in this broker's epoch file",
            node.epochs.last_epoch,
        )

    def _traffic(self) -> Iterator[Metric]:
        ctx = self.node.ctx
        stats = ctx.stats
        names = (
            ("messages_in", "Messages stored, by topic"),
            ("bytes_in", "Bytes stored (whole records), by topic"),
            ("messages_out", "Messages delivered to pulls, by topic"),
            ("bytes_out", "Bytes delivered to pulls (whole records), by topic"),
        )
        families = {
            name: CounterMetricFamily(f"hamq_broker_{name}", text, labels=["topic"])
            for name, text in names
        }
        for topic, counters in sorted(stats.topics.items()):
            for name, family in families.items():
                family.add_metric([topic], getattr(counters, name))
        yield from families.values()
        remoting = self.node.server.statistics()
        yield CounterMetricFamily(
            "hamq_broker_requests_received",
            "Requests received on the remoting port",
            remoting.requests_received,
        )
        yield CounterMetricFamily(
            "hamq_broker_request_groups",
            "Groups the received requests were handled in (the complete frames of a read)",
            remoting.request_groups,
        )
        latency = HistogramMetricFamily(
            "hamq_broker_send_latency_seconds",
            "Time from a send's arrival to its answer, by SendStatus (stored sends)",
            labels=["status"],
        )
        bounds = [f"{b:g}" for b in LATENCY_BUCKETS_S] + ["+Inf"]
        for status, histogram in sorted(stats.sends.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, histogram.counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric([status], buckets, sum_value=histogram.sum_s)
        yield latency
        yield _counted(
            "hamq_broker_sends_refused",
            "Sends refused with nothing stored, by response code",
            "code",
            stats.sends_refused,
        )
        yield _counted(
            "hamq_broker_pull_requests",
            "Pull requests, by outcome (a response code, or HELD for a long poll)",
            "outcome",
            stats.pulls,
        )
        yield _counted(
            "hamq_broker_damaged_records_skipped",
            "Damaged records (not decoding, or a bad body CRC) pulls passed over, by topic",
            "topic",
            stats.damaged_skipped,
        )
        holds = ctx.pull_holds
        yield GaugeMetricFamily(
            "hamq_broker_held_pulls",
            "Pulls held now (long polling)",
            value=holds.held if holds is not None else 0,
        )

    def _consumers(self) -> Iterator[Metric]:
        ctx = self.node.ctx
        store = ctx.store
        lag = GaugeMetricFamily(
            "hamq_broker_consumer_lag_messages",
            "Messages in this broker's queues past a group's committed offsets, by group and topic",
            labels=["group", "topic"],
        )
        for key, queues in sorted(ctx.offsets.table.items()):
            topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
            behind = 0
            for queue_id, offset in queues.items():
                behind += max(0, store.max_offset_in_queue(topic, queue_id) - max(offset, 0))
            lag.add_metric([group, topic], behind)
        yield lag
        yield GaugeMetricFamily(
            "hamq_broker_consumer_groups", "Consumer groups online", len(ctx.consumers.groups)
        )
        yield GaugeMetricFamily(
            "hamq_broker_topics", "Topics this broker has", len(ctx.topics.table)
        )

    def _transactions(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "hamq_broker_transaction_check_passes",
            "Passes of the transaction check-back loop completed (on a master)",
            self.node.transactions.check_passes,
        )

    def _replication(self) -> Iterator[Metric]:
        node = self.node
        slaves = GaugeMetricFamily(
            "hamq_broker_replication_lag_bytes",
            "How far each slave's acknowledged offset is behind this master's log, by the"
            " slave's broker id (unknown: a classic slave the nameservers do not name; the"
            " furthest behind of those)",
            labels=["broker_id"],
        )
        in_sync = 1 if node.ctx.roles.is_master else 0
        master = node.ctx.roles.master_ha_statistics()
        if master is not None:
            lags: dict[str, int] = {}
            for slave in master.slaves:
                in_sync += slave.in_sync
                if slave.broker_id < 0:
                    lags["unknown"] = max(lags.get("unknown", 0), slave.lag_bytes)
                    continue
                # one series per slave across its reconnections: of two connections of
                # one broker (the old one not dropped yet), the one further on counts
                label = str(slave.broker_id)
                lags[label] = min(lags.get(label, slave.lag_bytes), slave.lag_bytes)
            for label, lag in sorted(lags.items()):
                slaves.add_metric([label], lag)
        yield slaves
        yield GaugeMetricFamily(
            "hamq_broker_in_sync_replicas",
            "On a master: itself and the slaves in sync with it (0 on a slave)",
            in_sync,
        )
        if node.replicas is not None:
            view = node.replicas.applied
            yield GaugeMetricFamily(
                "hamq_broker_sync_state_set_size",
                "Members of the group's SyncStateSet, as the controllers last said",
                len(view.sync_state_set) if view is not None else 0,
            )
            yield GaugeMetricFamily(
                "hamq_broker_master_epoch",
                "The group's master epoch, as the controllers last said",
                view.master_epoch if view is not None else 0,
            )

    def _store(self) -> Iterator[Metric]:
        store = self.node.store
        stats = store.statistics()
        offsets = GaugeMetricFamily(
            "hamq_broker_commitlog_offset",
            "CommitLog offsets: min (oldest kept), max (end), flushed, dispatched",
            labels=["which"],
        )
        for which, value in (
            ("min", stats.commitlog_min_offset),
            ("max", stats.commitlog_max_offset),
            ("flushed", stats.flushed_offset),
            ("dispatched", stats.dispatched_offset),
        ):
            offsets.add_metric([which], value)
        yield offsets
        timers = GaugeMetricFamily(
            "hamq_broker_timer_messages",
            "Timer messages: waiting for their time, delivered (since this broker became master)",
            labels=["state"],
        )
        timers.add_metric(["waiting"], stats.timers_waiting)
        timers.add_metric(["delivered"], stats.timers_delivered)
        yield timers
        disk = GaugeMetricFamily(
            "hamq_broker_store_disk_bytes",
            "The store's files: reserved (their sizes) and used (blocks on disk)",
            labels=["kind"],
        )
        disk.add_metric(["reserved"], self.disk[0])
        disk.add_metric(["used"], self.disk[1])
        yield disk

    def _grpc(self) -> Iterator[Metric]:
        """The gRPC endpoint's (RocketMQ 5 clients), when it is served."""
        endpoint, server = self.node.grpc, self.node.grpc_server
        if endpoint is None or server is None:
            return
        served = server.statistics()
        yield GaugeMetricFamily(
            "hamq_broker_grpc_connections", "gRPC connections open now", value=served.connections
        )
        yield CounterMetricFamily(
            "hamq_broker_grpc_calls", "gRPC calls received (HTTP/2 streams)", served.calls
        )
        yield GaugeMetricFamily(
            "hamq_broker_grpc_calls_open", "gRPC calls not answered yet", value=served.calls_open
        )
        yield CounterMetricFamily(
            "hamq_broker_grpc_protocol_errors",
            "gRPC connections ended by an HTTP/2 protocol error of the peer's",
            served.protocol_errors,
        )
        renewals = endpoint.renewals.statistics()
        yield GaugeMetricFamily(
            "hamq_broker_grpc_push_leases",
            "Messages push consumers hold now, kept invisible by renewals",
            value=renewals.leases,
        )
        yield _counted(
            "hamq_broker_grpc_renewals",
            "Renewals of what push consumers hold, by outcome",
            "outcome",
            {"renewed": renewals.renewed, "failed": renewals.failed},
        )
        yield _counted(
            "hamq_broker_grpc_transaction_checks",
            "Transaction check-backs for gRPC producers: sent on a Telemetry stream, or dropped",
            "outcome",
            {"sent": endpoint.checks_sent, "dropped": endpoint.checks_dropped},
        )

    def _defenses(self) -> Iterator[Metric]:
        node = self.node
        remoting = node.server.statistics()
        refused = {"remoting": remoting.connections_refused}
        handshakes = {"remoting": remoting.tls_handshake_failures}
        if node.grpc_server is not None:
            grpc = node.grpc_server.statistics()
            refused["grpc"] = grpc.connections_refused
            handshakes["grpc"] = grpc.tls_handshake_failures
        ha_refused = 0
        if node.ha_service is not None:
            ha = node.ha_service.statistics()
            refused["ha"] = ha.connections_refused
            handshakes["ha"] = ha.tls_handshake_failures
            ha_refused = ha.refused_peers
        yield _counted(
            "hamq_broker_connections_refused",
            "Connections closed at accept for being over max_connections, by listener",
            "listener",
            refused,
        )
        yield _counted(
            "hamq_broker_tls_handshake_failures",
            "TLS handshakes that failed or timed out, by listener",
            "listener",
            handshakes,
        )
        yield CounterMetricFamily(
            "hamq_broker_ha_peers_refused",
            "Peers refused on the HA port: not proved members of this broker group",
            ha_refused,
        )
        yield _counted(
            "hamq_broker_acl_refused",
            "Requests the ACL refused (NO_PERMISSION), by reason",
            "reason",
            node.acl.statistics().refused_by_reason if node.acl is not None else {},
        )

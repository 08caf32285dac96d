"""A controller's metrics (``hamq_controller_*``), read at scrape time.

The replicated state is applied by pysyncobj's thread: the groups are copied in one
step (``dict(...)``, atomic under the GIL) before they are read. ACL refusals are a
standalone controller's (``acl_file``); an embedded one's requests are checked, and
counted, by its nameserver.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from hamq.controller.service import Controller


def _raft_port(controller: Controller) -> Iterator[Metric]:
    """The Raft transport's counters (raft_transport.py)."""
    stats = controller.raft.transport_statistics()
    yield GaugeMetricFamily(
        "hamq_controller_raft_peers_connected",
        "Other controllers this one has an authenticated Raft connection with",
        value=stats.connected if stats else 0,
    )
    closed = CounterMetricFamily(
        "hamq_controller_raft_unauthenticated_closed",
        "Raft connections closed before they authenticated, by reason: refused (bytes that "
        "are not the protocol, another secret), auth_timeout, evicted (too many waiting)",
        labels=["reason"],
    )
    lost = CounterMetricFamily(
        "hamq_controller_raft_links_lost",
        "Raft connections given up, by reason: dead (nothing read for a while), "
        "connect_timeout (a dial that did not connect in time)",
        labels=["reason"],
    )
    if stats is not None:
        closed.add_metric(["refused"], stats.refused)
        closed.add_metric(["auth_timeout"], stats.auth_timeouts)
        closed.add_metric(["evicted"], stats.evicted)
        lost.add_metric(["dead"], stats.dead)
        lost.add_metric(["connect_timeout"], stats.connect_timeouts)
    yield closed
    yield lost
    yield CounterMetricFamily(
        "hamq_controller_raft_accept_errors",
        "accept() failures on the Raft port (out of descriptors: accepting pauses)",
        value=stats.accept_errors if stats else 0,
    )


class ControllerCollector:
    """A prometheus-client collector over one controller."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def collect(self) -> Iterator[Metric]:
        controller = self.controller
        yield GaugeMetricFamily(
            "hamq_controller_leader",
            "1 while this controller is the Raft leader (the one that elects masters)",
            value=controller.raft.is_leader(),
        )
        yield CounterMetricFamily(
            "hamq_controller_elections",
            "Master elections this controller made as leader",
            value=controller.elections,
        )
        yield GaugeMetricFamily(
            "hamq_controller_live_brokers",
            "Brokers heartbeating to this controller",
            value=len(controller.live.brokers),
        )
        yield from _raft_port(controller)
        refused = CounterMetricFamily(
            "hamq_controller_acl_refused",
            "Requests the ACL refused (NO_PERMISSION), by reason",
            labels=["reason"],
        )
        acl = controller.acl
        for reason, count in sorted(acl.statistics().refused_by_reason.items() if acl else ()):
            refused.add_metric([reason], count)
        yield refused
        labels = ["cluster", "broker_name"]
        families = {
            "master_id": GaugeMetricFamily(
                "hamq_controller_master_id", "Each group's master id (-1: none)", labels=labels
            ),
            "master_epoch": GaugeMetricFamily(
                "hamq_controller_master_epoch", "Each group's master epoch", labels=labels
            ),
            "sync_state_set_size": GaugeMetricFamily(
                "hamq_controller_sync_state_set_size",
                "Members of each group's SyncStateSet",
                labels=labels,
            ),
            "members": GaugeMetricFamily(
                "hamq_controller_members", "Brokers registered in each group", labels=labels
            ),
        }
        groups = dict(controller.raft.state.groups)
        for name, group in sorted(groups.items()):
            values = {
                "master_id": -1 if group.master_id is None else group.master_id,
                "master_epoch": group.master_epoch,
                "sync_state_set_size": len(group.sync_state_set),
                "members": len(group.members),
            }
            for key, family in families.items():
                family.add_metric([group.cluster, name], values[key])
        yield from families.values()

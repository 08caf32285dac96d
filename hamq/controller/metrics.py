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

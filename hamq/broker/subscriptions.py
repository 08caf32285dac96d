"""Subscription groups: per consumer group settings (retries, whether it may consume).

Persisted as ``config/subscriptionGroup.json``. A group is created on first use when
``auto_create_subscription_group`` is on (RocketMQ's default), with 16 retries.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from hamq.broker.state_file import StateFile
from hamq.protocol import RequestError, ResponseCode
from hamq.protocol.bodies import SubscriptionGroupConfig, SubscriptionGroupWrapper
from hamq.protocol.message import group_error


def check_group(group: str) -> None:
    """RequestError(INVALID_PARAMETER) naming what is wrong with a group name."""
    problem = group_error(group)
    if problem is not None:
        raise RequestError(ResponseCode.INVALID_PARAMETER, problem)


class SubscriptionGroupManager(StateFile[SubscriptionGroupWrapper]):
    def __init__(self, path: Path, *, auto_create: bool = True) -> None:
        super().__init__(path, SubscriptionGroupWrapper)
        self.auto_create = auto_create
        self.table: dict[str, SubscriptionGroupConfig] = {}

    def restore(self, saved: SubscriptionGroupWrapper | None) -> None:
        if saved is not None:
            self.table = dict(saved.subscription_group_table)

    def replace_all(self, wrapper: SubscriptionGroupWrapper) -> None:
        """A slave takes its master's subscription groups."""
        table = dict(wrapper.subscription_group_table)
        if table != self.table:
            self.table = table
            self.mark_dirty()

    def snapshot(self) -> SubscriptionGroupWrapper:
        return SubscriptionGroupWrapper({k: attrs.evolve(v) for k, v in self.table.items()})

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's settings; created with defaults if auto-creation is on (and the
        name is valid: RequestError INVALID_PARAMETER otherwise)."""
        config = self.table.get(group)
        if config is None and self.auto_create:
            check_group(group)
            config = self.table[group] = SubscriptionGroupConfig(group)
            self.mark_dirty()
        return config

    def update(self, config: SubscriptionGroupConfig) -> None:
        self.table[config.group_name] = config
        self.mark_dirty()

"""Topic configuration: every topic this broker serves, and its queue counts.

Persisted as ``config/topics.json`` (RocketMQ's TopicConfigSerializeWrapper). The data
version changes with every change, and every change calls the ``on_change``
listeners (the registration service re-registers with the nameservers at once).
System topics exist from the start: TBW102 (the template auto-created topics copy;
inheritable while auto-creation is on), SCHEDULE_TOPIC_XXXX (one queue per delay
level), and the transactions' RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC and
TRANS_CHECK_MAX_TIME_TOPIC (one queue each; hamq/broker/transactions.py), and
rmq_sys_wheel_timer (timer messages wait in queue 0, hamq/store/timer.py). Retry
(``%RETRY%group``) and dead-letter (``%DLQ%group``) topics are created when first
needed, with one queue.

``max_topics`` caps how many topics the broker holds (each costs consume-queue files
and route entries): creating one more — auto-created on a send, retry and dead-letter
topics, UPDATE_AND_CREATE_TOPIC — is refused with TopicLimitError, whose remark names
the limit. The built-in system topics do not count; changing a topic always works; a
slave takes its master's table whole, and a table loaded from disk is kept even if it
holds more (a warning says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import attrs

from hamq.broker.state_file import StateFile
from hamq.protocol import RequestError, ResponseCode
from hamq.protocol.bodies import (
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    DataVersion,
    TopicConfig,
    TopicConfigSerializeWrapper,
)
from hamq.protocol.message import (
    DEFAULT_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    topic_error,
)

log = logging.getLogger(__name__)

#: how many topics a broker holds at most unless configured otherwise (max_topics)
DEFAULT_MAX_TOPICS = 10_000


class TopicLimitError(RequestError, ValueError):
    """A new topic would exceed ``max_topics`` (SYSTEM_ERROR; the remark names the limit)."""

    def __init__(self, topic: str, limit: int) -> None:
        super().__init__(
            ResponseCode.SYSTEM_ERROR,
            f"topic[{topic}] cannot be created: this broker holds {limit} topics, its "
            f"max_topics; delete unused topics or raise max_topics in the broker's config",
        )


class TopicConfigManager(StateFile[TopicConfigSerializeWrapper]):
    def __init__(
        self,
        path: Path,
        clock: Callable[[], int],
        *,
        default_queue_nums: int = 8,
        auto_create: bool = True,
        delay_levels: int = 18,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        super().__init__(path, TopicConfigSerializeWrapper)
        self._clock = clock
        self.max_topics = max_topics
        self.table: dict[str, TopicConfig] = {}
        self.data_version = DataVersion(0, clock(), 0)
        self.on_change: list[Callable[[], None]] = []
        self._system = {
            DEFAULT_TOPIC: TopicConfig(
                DEFAULT_TOPIC,
                default_queue_nums,
                default_queue_nums,
                PERM_READ | PERM_WRITE | (PERM_INHERIT if auto_create else 0),
            ),
            SCHEDULE_TOPIC: TopicConfig(SCHEDULE_TOPIC, delay_levels, delay_levels),
            TIMER_TOPIC: TopicConfig(TIMER_TOPIC, 1, 1),
            **{
                topic: TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE)
                for topic in (TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC)
            },
        }

    def restore(self, saved: TopicConfigSerializeWrapper | None) -> None:
        if saved is not None:
            self.table = dict(saved.topic_config_table)
            self.data_version = saved.data_version
        for name, config in self._system.items():
            if self.table.get(name) != config:
                self.table[name] = config
                self._changed()
        if self.count > self.max_topics:
            log.warning(
                "%s holds %d topics, more than max_topics %d: no topic can be created "
                "until some are deleted",
                self.path,
                self.count,
                self.max_topics,
            )

    @property
    def count(self) -> int:
        """Topics that count against ``max_topics`` (all but the built-in system ones)."""
        return len(self.table) - sum(1 for name in self._system if name in self.table)

    def replace_all(self, wrapper: TopicConfigSerializeWrapper) -> bool:
        """A slave takes its master's topic table (system topics stay its own); True if
        anything changed (the change listeners then run once)."""
        table = {k: v for k, v in wrapper.topic_config_table.items() if k not in self._system}
        table.update(self._system)
        if table == self.table:
            return False
        self.table = table
        self._changed()
        return True

    def snapshot(self) -> TopicConfigSerializeWrapper:
        return TopicConfigSerializeWrapper(
            {name: attrs.evolve(c) for name, c in self.table.items()}, self.data_version
        )

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def update(self, config: TopicConfig) -> None:
        """Create or change a topic (UPDATE_AND_CREATE_TOPIC); ValueError for a bad name,
        TopicLimitError (a ValueError too) for one topic too many."""
        problem = topic_error(config.topic_name)
        if problem is not None:
            raise ValueError(problem)
        existing = self.table.get(config.topic_name)
        if existing == config:
            return
        new = existing is None and config.topic_name not in self._system
        if new and self.count >= self.max_topics:
            raise TopicLimitError(config.topic_name, self.max_topics)
        log.info(
            "topic %s: %s", "changed" if config.topic_name in self.table else "created", config
        )
        self.table[config.topic_name] = config
        self._changed()

    def delete(self, topic: str) -> bool:
        if topic in self._system or self.table.pop(topic, None) is None:
            return False
        log.info("topic %s deleted", topic)
        self._changed()
        return True

    def create_from_default(
        self, topic: str, default_topic: str, queue_nums: int, topic_sys_flag: int = 0
    ) -> TopicConfig | None:
        """Auto-create ``topic`` like ``default_topic`` (RocketMQ's send-path rule): only
        if the template is inheritable; queues = min(requested, template's)."""
        template = self.table.get(default_topic)
        if template is None or not template.perm & PERM_INHERIT:
            return None
        queues = max(1, min(queue_nums, template.write_queue_nums))
        config = TopicConfig(
            topic, queues, queues, template.perm & ~PERM_INHERIT, topic_sys_flag=topic_sys_flag
        )
        self.update(config)
        return config

    def ensure(
        self, topic: str, queue_nums: int = 1, perm: int = PERM_READ | PERM_WRITE
    ) -> TopicConfig:
        """The topic, created with ``queue_nums`` queues if missing (retry and DLQ topics)."""
        config = self.table.get(topic)
        if config is None:
            config = TopicConfig(topic, queue_nums, queue_nums, perm)
            self.update(config)
        return config

    def _changed(self) -> None:
        self.data_version = self.data_version.next(self._clock())
        self.mark_dirty()
        for listener in self.on_change:
            listener()

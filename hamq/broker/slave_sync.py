"""A slave copies its master's metadata every ``metadata_sync_interval_s`` (10 s).

From the master's remoting address (the nameservers' registration answer): all topic
configs (GET_ALL_TOPIC_CONFIG), consumer offsets (GET_ALL_CONSUMER_OFFSET), delay
offsets (GET_ALL_DELAY_OFFSET) and subscription groups
(GET_ALL_SUBSCRIPTIONGROUP_CONFIG); each is persisted as the slave's own file. Offsets
are merged, never moved back (offsets.py). A round that fails is logged and the next
one tries again; one failing table does not stop the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from hamq.broker.context import BrokerContext
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import (
    ConsumerOffsetSerializeWrapper,
    SubscriptionGroupWrapper,
    TopicConfigSerializeWrapper,
    decode_body,
)
from hamq.remoting import RemotingClient, RemotingError
from hamq.store import StoreError
from hamq.store.schedule import decode_delay_offsets

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0


@attrs.frozen
class SyncStatistics:
    master_address: str | None
    rounds: int
    last_round_ok: bool
    last_error: str | None


class SlaveSync:
    def __init__(
        self,
        ctx: BrokerContext,
        client: RemotingClient,
        master_address: Callable[[], str | None],
        on_synced: Callable[[], None],
    ) -> None:
        self.ctx = ctx
        self.client = client
        self._master_address = master_address
        self._on_synced = on_synced
        self.rounds = 0
        self.last_round_ok = False
        self.last_error: str | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.ctx.config.metadata_sync_interval_s)
            await self.sync_once()

    async def _fetch(self, addr: str, code: RequestCode) -> bytes:
        response = await self.client.invoke(addr, RemotingCommand.request(code), REQUEST_TIMEOUT_S)
        if response.code != ResponseCode.SUCCESS:
            raise RequestError(response.code, response.remark or "refused")
        return response.body

    async def sync_once(self) -> bool:
        """One round; True if every table came."""
        addr = self._master_address()
        if addr is None:
            self.rounds += 1
            self.last_round_ok, self.last_error = False, "the master's address is not known yet"
            return False
        errors = []
        steps = (
            (RequestCode.GET_ALL_TOPIC_CONFIG, self._topics),
            (RequestCode.GET_ALL_CONSUMER_OFFSET, self._offsets),
            (RequestCode.GET_ALL_DELAY_OFFSET, self._delay_offsets),
            (RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self._groups),
        )
        for code, apply in steps:
            try:
                body = await self._fetch(addr, code)
                if self._master_address() != addr:
                    # the role changed meanwhile (controller mode): not this master's to copy
                    errors.append(f"{code.name}: {addr} is no longer this broker's master")
                    break
                await apply(body)
            except (RemotingError, RequestError, ValueError, OSError, StoreError) as exc:
                errors.append(f"{code.name}: {exc}")
        # counted when done: a status read mid-round shows the last finished round
        self.rounds += 1
        self.last_round_ok = not errors
        self.last_error = "; ".join(errors) or None
        if errors:
            log.warning("metadata sync from master %s: %s", addr, self.last_error)
        self._on_synced()
        return not errors

    async def _topics(self, body: bytes) -> None:
        self.ctx.topics.replace_all(decode_body(TopicConfigSerializeWrapper, body))

    async def _offsets(self, body: bytes) -> None:
        self.ctx.offsets.merge_newer(decode_body(ConsumerOffsetSerializeWrapper, body))

    async def _delay_offsets(self, body: bytes) -> None:
        await self.ctx.store.replace_delay_offsets(decode_delay_offsets(body))

    async def _groups(self, body: bytes) -> None:
        self.ctx.subscriptions.replace_all(decode_body(SubscriptionGroupWrapper, body))

    def statistics(self) -> SyncStatistics:
        return SyncStatistics(
            self._master_address(), self.rounds, self.last_round_ok, self.last_error
        )

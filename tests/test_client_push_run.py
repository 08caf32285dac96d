"""A push consumer's run (hamq/client/push_run.py) lives from its start to its stop:
what it held is gone once the consumer stops, and a consumer started again begins a
new run where the last one committed. Against a real broker on loopback (in this
process, tests/support/backends.py); every test runs on Trio, asyncio and uvloop."""

from __future__ import annotations

from pathlib import Path

import pytest

from hamq.client import ClientError, ConsumeResult, Message, MessageExt, Producer, PushConsumer
from tests.support.backends import broker_thread
from tests.support.timing import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_a_stopped_consumer_holds_nothing_and_a_new_run_goes_on_where_it_stopped(
    tmp_path: Path,
) -> None:
    async with broker_thread(tmp_path) as broker:
        ns = broker.namesrv
        await broker.create_topic("Runs", 2)
        bodies: list[bytes] = []

        def handle(messages: list[MessageExt]) -> ConsumeResult:
            bodies.extend(m.body for m in messages)
            return ConsumeResult.SUCCESS

        consumer = PushConsumer("RG", ns, consume_from="FIRST_OFFSET")
        consumer.subscribe("Runs")
        assert consumer.assigned == []
        with pytest.raises(ClientError, match="not running"):
            _ = consumer.client_id
        async with Producer("PG", ns) as producer:
            for i in range(6):
                await producer.send(Message("Runs", f"first {i}"))
            async with consumer.consuming(handle):
                first_id = consumer.client_id
                assert {q.topic for q in consumer.assigned} == {"Runs", "%RETRY%RG"}
                await wait_for(
                    lambda: sum(consumer.consume_offsets("Runs").values()) == 6,
                    20,
                    what="the first run's messages handled",
                )
                assert len(bodies) == 6
                with pytest.raises(ClientError, match="subscribe before"):
                    consumer.subscribe("Other")
            # the run is gone with everything it held; the counters stay
            stopped = consumer.statistics()
            assert (stopped.client_id, stopped.queues, stopped.offsets) == ("", (), {})
            assert consumer.assigned == [] and consumer.consume_offsets("Runs") == {}
            with pytest.raises(ClientError, match="not running"):
                _ = consumer.client_id
            assert stopped.consumed == 6
            for i in range(3):
                await producer.send(Message("Runs", f"second {i}"))
            async with consumer.consuming(handle):
                assert consumer.client_id != first_id  # a new client instance
                await wait_for(
                    lambda: sum(consumer.consume_offsets("Runs").values()) == 9,
                    20,
                    what="the second run's messages handled",
                )
        # the second run started at the offsets the first committed when it stopped
        assert sorted(bodies) == sorted(
            [f"first {i}".encode() for i in range(6)] + [f"second {i}".encode() for i in range(3)]
        )
        assert consumer.statistics().consumed == 9

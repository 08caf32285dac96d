"""Tag expressions (``a || b``, ``*``): what parses, and a malformed one refused naming it
by the parser, by a consumer's ``subscribe`` and by the broker (a pull's subscription,
a heartbeat's), which then registers nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hamq.client import (
    InvalidArgumentError,
    PushConsumer,
)
from hamq.protocol import RemotingCommand, RequestCode, ResponseCode
from hamq.protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
from hamq.protocol.headers import PULL_FLAG_SUBSCRIPTION, PullMessageRequestHeader
from hamq.protocol.message import parse_tags
from hamq.remoting import RemotingClient
from tests.support.brokers import (
    running_broker,
)


@pytest.mark.parametrize(
    ("expression", "tags"),
    [
        ("*", None),
        ("", None),
        (" * ", None),
        ("a", {"a"}),
        ("a || b", {"a", "b"}),
        ("  a||b ||c ", {"a", "b", "c"}),
    ],
)
def test_valid_tag_expressions(expression: str, tags: set[str] | None) -> None:
    assert parse_tags(expression) == (None if tags is None else frozenset(tags))


BAD_EXPRESSIONS = ["a ||", "|| a", "a || || b", "||", "a ||  ", "a || *"]


@pytest.mark.parametrize("expression", BAD_EXPRESSIONS)
def test_malformed_tag_expressions_are_refused(expression: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(expression))):
        parse_tags(expression)
    consumer = PushConsumer("G", "127.0.0.1:9876")
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(expression))):
        consumer.subscribe("T", expression)
    assert consumer.subscriptions == {}


@pytest.mark.slow
async def test_the_broker_refuses_malformed_subscriptions(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as node, RemotingClient() as client:
        for expression in BAD_EXPRESSIONS:
            pull = PullMessageRequestHeader(
                consumer_group="G",
                topic="TBW102",
                queue_id=0,
                queue_offset=0,
                max_msg_nums=1,
                sys_flag=PULL_FLAG_SUBSCRIPTION,
                commit_offset=0,
                suspend_timeout_millis=0,
                sub_version=0,
                subscription=expression,
                expression_type="TAG",
            )
            answer = await client.invoke(
                node.address, RemotingCommand.request(RequestCode.PULL_MESSAGE, pull), 5
            )
            assert answer.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, answer
            assert repr(expression) in (answer.remark or "")

            heartbeat = HeartbeatData(
                "c1",
                consumer_data_set=[
                    ConsumerData("G", subscription_data_set=[SubscriptionData("T", expression)])
                ],
            )
            request = RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(heartbeat))
            answer = await client.invoke(node.address, request, 5)
            assert answer.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, answer
            assert repr(expression) in (answer.remark or "")
        assert not node.ctx.consumers.client_ids("G")  # nothing was registered
        good = HeartbeatData(
            "c1",
            consumer_data_set=[
                ConsumerData("G", subscription_data_set=[SubscriptionData("T", "a || b")])
            ],
        )
        request = RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(good))
        assert (await client.invoke(node.address, request, 5)).code == ResponseCode.SUCCESS

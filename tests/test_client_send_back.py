"""What a push consumer sends back when no broker takes a failed message: the retry
message (``retry_message``, RocketMQ's fallback) and the topic a retried message shows
(``original_topic``). Pure functions, tested with values (hamq/client/send_back.py);
the send-back over the wire is tested with real brokers in tests/test_client.py."""

from __future__ import annotations

import pytest

from hamq.client.message import MessageExt
from hamq.client.send_back import RETRY_BASE_DELAY_LEVEL, original_topic, retry_message
from hamq.protocol.message import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
)


def pulled(topic: str = "Orders", reconsume_times: int = 0, **properties: str) -> MessageExt:
    return MessageExt(
        topic=topic,
        queue_id=1,
        queue_offset=7,
        physical_offset=4096,
        flag=3,
        sys_flag=0,
        born_timestamp=1,
        born_host="127.0.0.1:5000",
        store_timestamp=2,
        store_host="127.0.0.1:10911",
        reconsume_times=reconsume_times,
        prepared_transaction_offset=0,
        body=b"payload",
        properties={PROPERTY_UNIQ_KEY: "U1", **properties},
        offset_msg_id="7F00000100002A9F0000000000001000",
    )


def test_a_retry_goes_to_the_groups_retry_topic_as_a_new_message() -> None:
    message = pulled(
        **{PROPERTY_TAGS: "a", PROPERTY_KEYS: "k1 k2", PROPERTY_DELAY: "4", "own": "x"}
    )
    retry = retry_message(message, "G", -1, delay_level=0)
    assert retry.topic == "%RETRY%G"
    assert (retry.body, retry.flag, retry.tags, retry.keys) == (b"payload", 3, "a", ("k1", "k2"))
    # the broker's choice (0) is level 3 + reconsume times; the old delay is not kept
    assert retry.delay_level == RETRY_BASE_DELAY_LEVEL
    assert retry.wait_store_msg_ok
    properties = retry.properties
    assert properties[PROPERTY_RETRY_TOPIC] == "Orders"
    assert properties[PROPERTY_ORIGIN_MESSAGE_ID] == "U1"
    assert properties[PROPERTY_RECONSUME_TIME] == "1"
    assert properties["own"] == "x"
    assert PROPERTY_MAX_RECONSUME_TIMES not in properties  # -1: the broker's default
    for gone in (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_DELAY):
        assert gone not in properties  # (fields of the new message, not properties)


@pytest.mark.parametrize(
    ("reconsume_times", "delay_level", "level"),
    [(0, 0, 3), (5, 0, 8), (5, 2, 2)],
)
def test_the_delay_grows_with_each_attempt_unless_one_is_given(
    reconsume_times: int, delay_level: int, level: int
) -> None:
    retry = retry_message(pulled(reconsume_times=reconsume_times), "G", 16, delay_level)
    assert retry.delay_level == level
    assert retry.properties[PROPERTY_RECONSUME_TIME] == str(reconsume_times + 1)
    assert retry.properties[PROPERTY_MAX_RECONSUME_TIMES] == "16"


@pytest.mark.parametrize(("most", "reconsume"), [(3, "4"), (-1, "1")])
def test_to_the_dlq_its_reconsume_times_are_past_the_maximum(most: int, reconsume: str) -> None:
    retry = retry_message(pulled(reconsume_times=1), "G", most, delay_level=-1)
    assert retry.delay_level == 0
    assert retry.properties[PROPERTY_RECONSUME_TIME] == reconsume
    assert retry.properties[PROPERTY_MAX_RECONSUME_TIMES] == str(max(most, 0))


def test_a_retried_message_keeps_its_first_origin_and_topic() -> None:
    again = pulled(
        "%RETRY%G",
        reconsume_times=2,
        **{
            PROPERTY_RETRY_TOPIC: "Orders",
            PROPERTY_ORIGIN_MESSAGE_ID: "FIRST",
            PROPERTY_WAIT: "false",
            PROPERTY_TRANSACTION_PREPARED: "true",
        },
    )
    retry = retry_message(again, "G", -1, delay_level=0)
    assert retry.properties[PROPERTY_RETRY_TOPIC] == "Orders"
    assert retry.properties[PROPERTY_ORIGIN_MESSAGE_ID] == "FIRST"
    assert PROPERTY_TRANSACTION_PREPARED not in retry.properties
    assert not retry.wait_store_msg_ok
    assert retry.delay_level == RETRY_BASE_DELAY_LEVEL + 2


def test_a_message_from_the_retry_topic_shows_its_original_topic() -> None:
    again = pulled("%RETRY%G", **{PROPERTY_RETRY_TOPIC: "Orders"})
    assert original_topic(again).topic == "Orders"
    assert original_topic(again).body == again.body
    assert again.topic == "%RETRY%G"  # (a copy: the message itself is not changed)
    plain = pulled("Orders", **{PROPERTY_RETRY_TOPIC: "Other"})
    assert original_topic(plain) is plain  # only a retry topic's messages are shown so

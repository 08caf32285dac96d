"""The values admin calls return (hamq/client/admin_views.py), built from answers as
a server sends them and printed with ``to_json``: queues in order, lag never below 0,
names in camelCase beside names kept as they are, bodies cut short when asked. Pure
values: no server. (A broker's runtime values and the HA status' epochs are in
tests/test_admin_tools.py, next to the commands that print them.)"""

from __future__ import annotations

from typing import Any

import pytest

from hamq.client.admin_views import (
    BrokerConfigView,
    ConsumerProgress,
    Election,
    EpochTable,
    FoundMessage,
    GroupConnection,
    GroupSummary,
    Member,
    QueueProgress,
    QueueStats,
    ResetResult,
    epochs_from_cache,
    json_name,
    queue_order,
    setting_name,
)
from hamq.client.message import MessageExt
from hamq.protocol.bodies import (
    ConsumeFromWhere,
    ConsumeType,
    EpochEntryBody,
    EpochEntryCache,
    MessageModel,
    MessageQueue,
    SubscriptionData,
)


def field_names(value: Any) -> list[str]:
    """Every key of ``value``'s objects, at every depth."""
    if isinstance(value, list):
        return [name for v in value for name in field_names(v)]
    if isinstance(value, dict):
        return [k for k, v in value.items() for k in (k, *field_names(v))]
    return []


def test_progress_adds_up_lag_and_never_counts_a_consumer_ahead() -> None:
    ahead = QueueProgress(MessageQueue("T", "b", 1), 5, 9, 0)
    behind = QueueProgress(MessageQueue("T", "a", 0), 10, 4, 1700)
    progress = ConsumerProgress("G", (behind, ahead), 2.5)
    assert (ahead.lag, behind.lag, progress.total_lag) == (0, 6, 6)
    assert progress.last_timestamp_ms == 1700
    assert progress.to_json() == {
        "group": "G",
        "queues": [
            {
                "topic": "T",
                "brokerName": "a",
                "queueId": 0,
                "brokerOffset": 10,
                "consumerOffset": 4,
                "lag": 6,
                "inFlight": 0,
                "lastTimestamp": 1700,
            },
            ahead.to_json(),
        ],
        "totalLag": 6,
        "consumeTps": 2.5,
    }
    assert ConsumerProgress("G", ()).last_timestamp_ms == 0


def test_a_reset_lists_its_queues_in_order() -> None:
    queues = [MessageQueue("T", "b", 0), MessageQueue("T", "a", 2), MessageQueue("T", "a", 1)]
    result = ResetResult("G", "T", -1, {q: i for i, q in enumerate(queues)}, 3)
    listed = result.to_json()["queues"]
    assert [(q["brokerName"], q["queueId"], q["offset"]) for q in listed] == [
        ("a", 1, 2),
        ("a", 2, 1),
        ("b", 0, 0),
    ]
    assert sorted(queues, key=queue_order) == [queues[2], queues[1], queues[0]]
    assert result.to_json()["notifiedClients"] == 3


def test_queue_stats_count_the_messages_a_queue_holds() -> None:
    stats = QueueStats(MessageQueue("T", "a", 0), 3, 10, 99)
    assert stats.messages == 7
    assert stats.to_json()["messages"] == 7
    assert stats.to_json()["lastUpdateTimestamp"] == 99


def test_a_group_prints_its_enums_by_name_or_none() -> None:
    member = Member("c1", "127.0.0.1:5000", "JAVA", 401, ("b1:1", "b2:1"))
    connection = GroupConnection(
        "G",
        (member,),
        {"T": SubscriptionData("T", "a || b", sub_version=7)},
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
    )
    printed = connection.to_json()
    assert printed["consumeType"] == "CONSUME_PASSIVELY"
    assert printed["members"] == [member.to_json()]
    assert printed["subscriptions"] == [{"topic": "T", "expression": "a || b", "subVersion": 7}]
    summary = GroupSummary("G", 0, None, None, (), 0, 0.0).to_json()
    assert (summary["consumeType"], summary["messageModel"]) == (None, None)


def found(body: bytes) -> FoundMessage:
    message = MessageExt(
        topic="T",
        queue_id=0,
        queue_offset=1,
        physical_offset=2,
        flag=0,
        sys_flag=0,
        born_timestamp=3,
        born_host="127.0.0.1:5000",
        store_timestamp=4,
        store_host="127.0.0.1:10911",
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=body,
        properties={"b": "2", "a": "1"},
        offset_msg_id="OFFSET",
    )
    return FoundMessage("broker-a", message)


@pytest.mark.parametrize(
    ("limit", "shown", "truncated"), [(None, "héllo", False), (2, "hé", True), (99, "héllo", False)]
)
def test_a_found_message_body_is_cut_short_only_when_asked(
    limit: int | None, shown: str, truncated: bool
) -> None:
    printed = found("héllo".encode()).to_json(body_limit=limit)
    assert (printed["body"], printed["bodyTruncated"]) == (shown, truncated)
    assert printed["bodySize"] == len("héllo".encode())
    assert list(printed["properties"]) == ["a", "b"]  # names as they are, sorted


def test_a_broken_body_is_shown_with_replacement_characters() -> None:
    assert found(b"\xff ok").to_json()["body"] == "\ufffd ok"


def test_broker_config_reads_its_version_as_json_when_it_is() -> None:
    view = BrokerConfigView("b:1", '{"counter":3}', {"b": "2", "a": "1"}, ("a",))
    assert view.version_json == {"counter": 3}
    assert view.to_json() == {
        "address": "b:1",
        "version": {"counter": 3},
        "config": {"a": "1", "b": "2"},
        "liveKeys": ["a"],
    }
    assert BrokerConfigView("b:1", "not json", {}, ()).version_json == "not json"
    assert view.to_json({"a": 1})["config"] == {"a": 1}  # typed values when given


@pytest.mark.parametrize(
    ("name", "camel", "snake"),
    [
        ("commitlog_max_offset", "commitlogMaxOffset", "commitlog_max_offset"),
        ("slaveReadEnable", "slaveReadEnable", "slave_read_enable"),
        ("max_2_size", "max2Size", "max2_size"),  # (a digit joins the word before it)
        ("plain", "plain", "plain"),
    ],
)
def test_field_names_in_camel_case_and_settings_in_snake_case(
    name: str, camel: str, snake: str
) -> None:
    assert json_name(name) == camel
    assert setting_name(camel) == snake


def test_epochs_end_where_the_next_begins_and_print_in_camel_case() -> None:
    cache = EpochEntryCache(
        "C", "broker-a", 1, [EpochEntryBody(1, 0, 100), EpochEntryBody(2, 100, 250)], 250
    )
    table = epochs_from_cache(cache)
    assert table == EpochTable("broker-a", 1, None, ((1, 0, 100), (2, 100, 250)), 250)
    printed = table.to_json()
    assert printed["epochs"][1] == {"epoch": 2, "startOffset": 100, "endOffset": 250}
    election = Election("ctl:1", "broker-a", 2, "b:2", 3, (1, 2), 4, elected=False)
    for value in (printed, election.to_json()):
        assert all(json_name(name) == name for name in field_names(value))
    assert election.to_json()["elected"] is False

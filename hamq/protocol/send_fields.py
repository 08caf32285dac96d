"""The send's ext fields: SEND_MESSAGE_V2's one-letter keys, and the converter-free
codec of a send's request and response headers (the hot path).

SEND_MESSAGE (10) carries SendMessageRequestHeader under RocketMQ's camelCase keys;
SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) carry the same fields under the
one-letter keys of ``SEND_V2_KEYS`` (RocketMQ's SendMessageRequestHeaderV2). The header
classes themselves are headers.py's.

Every send decodes a request header and encodes a response header. ``decode_send_header``
/ ``send_v2_fields`` / ``send_response_fields`` / ``decode_send_response`` do it without
the converter for the usual shapes. Invariant: each gives what the converter gives for the
same input; anything unusual (a missing or malformed field, a number the fast checks do
not take) goes through the converter, so errors read exactly the same (HeaderError naming
every bad field).
"""

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hamq.protocol.converter import decode_header
from hamq.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader

T = TypeVar("T")


#: SEND_MESSAGE_V2's one-letter keys -> SEND_MESSAGE's keys (docs/PROTOCOL.md#sending).
SEND_V2_KEYS: Mapping[str, str] = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "bname",
}
_SEND_V1_KEYS = {full: short for short, full in SEND_V2_KEYS.items()}


def from_v2_fields(fields: Mapping[str, T]) -> dict[str, T]:
    """SEND_MESSAGE_V2 ext fields renamed to SEND_MESSAGE's keys (others kept)."""
    return {SEND_V2_KEYS.get(key, key): value for key, value in fields.items()}


def to_v2_fields(fields: Mapping[str, T]) -> dict[str, T]:
    """SEND_MESSAGE ext fields renamed to SEND_MESSAGE_V2's one-letter keys."""
    return {_SEND_V1_KEYS.get(key, key): value for key, value in fields.items()}


# ---------------------------------------------------------------- the hot path


def _int(value: object) -> int:
    if type(value) is int:
        if -(2**63) <= value < 2**63:
            return value
    elif type(value) is str and len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    raise ValueError(value)


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _str(value: object) -> str:
    if type(value) is str:
        return value
    raise ValueError(value)


def _opt_str(value: object) -> str | None:
    return None if value is None else _str(value)


_BOOLS: dict[object, bool] = {
    "true": True,
    "false": False,
    "1": True,
    "0": False,
    True: True,
    False: False,
}


#: the optional booleans' texts (k, m) that ``_usual_v2`` takes, absence included
_OPTIONAL_BOOLS = (None, "true", "false")


def _opt_bool(value: object) -> bool | None:
    return None if value is None else _BOOLS[value]


#: SEND_MESSAGE_V2's numbers as its usual senders write them, "|"-joined in the order
#: e (queue id: -1 lets the broker choose), d, f, g, h, j: decimals of at most 18 digits
#: (what ``_int`` takes). An absent or non-text field cannot match: it formats as "None"
#: or as no digits, and a "|" within one makes a part too many.
_USUAL_V2_NUMBERS = re.compile(r"(?:-1|\d{1,18})(?:\|\d{1,18}){5}", re.ASCII)


def decode_send_header(fields: Mapping[str, object], *, v2: bool) -> SendMessageRequestHeader:
    """SEND_MESSAGE (``v2`` False) or SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE ext fields as
    a header; HeaderError names every bad field."""
    get = fields.get
    if v2:
        header = _usual_v2(get)
        if header is not None:
            return header
    try:
        if v2:
            return SendMessageRequestHeader(
                producer_group=_str(get("a")),
                topic=_str(get("b")),
                default_topic=_str(get("c")),
                default_topic_queue_nums=_int(get("d")),
                queue_id=_queue_id(get("e")),
                sys_flag=_int(get("f")),
                born_timestamp=_int(get("g")),
                flag=_int(get("h")),
                properties=_opt_str(get("i")),
                reconsume_times=_opt_int(get("j")),
                unit_mode=_opt_bool(get("k")),
                batch=_opt_bool(get("m")),
                max_reconsume_times=_opt_int(get("l")),
                broker_name=_opt_str(get("n")),
            )
        return SendMessageRequestHeader(
            producer_group=_str(get("producerGroup")),
            topic=_str(get("topic")),
            default_topic=_str(get("defaultTopic")),
            default_topic_queue_nums=_int(get("defaultTopicQueueNums")),
            queue_id=_queue_id(get("queueId")),
            sys_flag=_int(get("sysFlag")),
            born_timestamp=_int(get("bornTimestamp")),
            flag=_int(get("flag")),
            properties=_opt_str(get("properties")),
            reconsume_times=_opt_int(get("reconsumeTimes")),
            unit_mode=_opt_bool(get("unitMode")),
            batch=_opt_bool(get("batch")),
            max_reconsume_times=_opt_int(get("maxReconsumeTimes")),
            broker_name=_opt_str(get("bname")),
        )
    except (ValueError, KeyError, TypeError):
        return decode_header(SendMessageRequestHeader, from_v2_fields(fields) if v2 else fields)


def _usual_v2(get: Callable[[str], Any]) -> SendMessageRequestHeader | None:
    """SEND_MESSAGE_V2's fields as every producer sends them (a to h, and i, j, k, m, n or
    not), checked in one pass; None for anything else (``decode_send_header`` then
    checks each field and names what is wrong)."""
    e, d, f, g, h, j = get("e"), get("d"), get("f"), get("g"), get("h"), get("j")
    if not _USUAL_V2_NUMBERS.fullmatch(f"{e}|{d}|{f}|{g}|{h}|{0 if j is None else j}"):
        return None
    a, b, c, i, k, m, n = get("a"), get("b"), get("c"), get("i"), get("k"), get("m"), get("n")
    if not (
        type(a) is type(b) is type(c) is str
        and (i is None or type(i) is str)
        and (n is None or type(n) is str)
        and k in _OPTIONAL_BOOLS  # (a tuple: compared, never hashed)
        and m in _OPTIONAL_BOOLS
        and get("l") is None
    ):
        return None
    return SendMessageRequestHeader(
        a,
        b,
        c,
        int(d),
        int(e),
        int(f),
        int(g),
        int(h),
        i,
        None if j is None else int(j),
        None if k is None else k == "true",
        None if m is None else m == "true",
        None,
        n,
    )


def _queue_id(value: object) -> int:
    return -1 if value == "-1" else _int(value)


def send_v2_fields(header: SendMessageRequestHeader) -> dict[str, str]:
    """The SEND_MESSAGE_V2 ext fields of ``header`` (what ``to_v2_fields(encode_header())``
    gives)."""
    fields = {
        "a": header.producer_group,
        "b": header.topic,
        "c": header.default_topic,
        "d": str(header.default_topic_queue_nums),
        "e": str(header.queue_id),
        "f": str(header.sys_flag),
        "g": str(header.born_timestamp),
        "h": str(header.flag),
    }
    # (one test each, no loop: a producer encodes one of these per send)
    if header.properties is not None:
        fields["i"] = header.properties
    if header.reconsume_times is not None:
        fields["j"] = str(header.reconsume_times)
    if header.unit_mode is not None:
        fields["k"] = "true" if header.unit_mode else "false"
    if header.max_reconsume_times is not None:
        fields["l"] = str(header.max_reconsume_times)
    if header.batch is not None:
        fields["m"] = "true" if header.batch else "false"
    if header.broker_name is not None:
        fields["n"] = header.broker_name
    return fields


def send_response_fields(header: SendMessageResponseHeader) -> dict[str, str]:
    """The ext fields of a send's answer (what ``encode_header`` gives)."""
    return send_answer_fields(
        header.msg_id,
        header.queue_id,
        header.queue_offset,
        header.transaction_id,
        header.batch_uniq_id,
        header.msg_region,
        header.trace_on,
    )


def send_answer_fields(
    msg_id: str,
    queue_id: int,
    queue_offset: int,
    transaction_id: str | None = None,
    batch_uniq_id: str | None = None,
    msg_region: str | None = None,
    trace_on: str | None = None,
) -> dict[str, str]:
    """``send_response_fields`` from the header's values, without a header object in
    between (a broker answers every stored send so); one test per optional field."""
    fields = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)}
    if transaction_id is not None:
        fields["transactionId"] = transaction_id
    if batch_uniq_id is not None:
        fields["batchUniqId"] = batch_uniq_id
    if msg_region is not None:
        fields["MSG_REGION"] = msg_region
    if trace_on is not None:
        fields["TRACE_ON"] = trace_on
    return fields


def decode_send_response(fields: Mapping[str, object]) -> SendMessageResponseHeader:
    """A send's answer as a header; HeaderError names every bad field."""
    get = fields.get
    try:
        return SendMessageResponseHeader(
            _str(get("msgId")),
            _int(get("queueId")),
            _int(get("queueOffset")),
            _opt_str(get("transactionId")),
            _opt_str(get("batchUniqId")),
            _opt_str(get("MSG_REGION")),
            _opt_str(get("TRACE_ON")),
        )
    except (ValueError, KeyError, TypeError):
        return decode_header(SendMessageResponseHeader, fields)

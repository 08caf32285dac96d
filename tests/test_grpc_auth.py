"""hamq/broker/grpc/auth.py: RocketMQ 5's MQv2-HMAC-SHA1 signature, as the official
Python client makes it (rocketmq/v5/util/signature.py: HMAC-SHA1 of x-mq-date-time,
lower-case hex)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from hamq.acl import Credentials, parse_acl
from hamq.broker.grpc.auth import AuthError, parse, verify

TABLE = parse_acl(
    """
accounts:
  - accessKey: rocketmq2
    secretKey: 12345678
    admin: true
""",
    "test",
)


def signed(access_key: str, secret_key: str, date_time: str = "20261128T080000Z") -> dict[str, str]:
    signature = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    return {
        "x-mq-date-time": date_time,
        "authorization": f"MQv2-HMAC-SHA1 Credential={access_key}, "
        f"SignedHeaders=x-mq-date-time, Signature={signature}",
    }


def test_a_good_signature_gives_the_accounts_credentials() -> None:
    assert verify(signed("rocketmq2", "12345678"), TABLE) == Credentials("rocketmq2", "12345678")


def test_an_old_date_is_not_refused() -> None:
    # (the clock is not checked: a client whose clock is off still gets in)
    metadata = signed("rocketmq2", "12345678", "19990101T000000Z")
    assert verify(metadata, TABLE) is not None


def test_an_unsigned_call_is_left_to_the_guard() -> None:
    assert verify({"x-mq-client-id": "c"}, TABLE) is None
    # (the official client without credentials signs with an empty Credential)
    empty = signed("", "")
    assert verify(empty, TABLE) is None


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        (signed("rocketmq2", "wrong"), "signature check failed"),
        (signed("nobody", "12345678"), "no account"),
        ({"authorization": "Basic abc"}, "is not MQv2-HMAC-SHA1"),
        ({"authorization": "MQv2-HMAC-SHA1 Credential"}, "is not key=value"),
        ({"authorization": "MQv2-HMAC-SHA1 Credential=rocketmq2"}, "lacks"),
        (
            {k: v for k, v in signed("rocketmq2", "12345678").items() if k == "authorization"},
            "needs x-mq-date-time",
        ),
    ],
)
def test_bad_signatures_are_refused_by_name(metadata: dict[str, str], words: str) -> None:
    with pytest.raises(AuthError, match=words):
        verify(metadata, TABLE)


def test_parse_reads_the_fields_in_any_order() -> None:
    value = "MQv2-HMAC-SHA1 Signature=ab12, SignedHeaders=x-mq-date-time, Credential=ak"
    assert parse(value) == ("ak", "ab12")

"""``host:port`` parsing."""

from __future__ import annotations

import pytest

from hamq.remoting import format_address, parse_address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:10911", ("127.0.0.1", 10911)),
        ("localhost:9876", ("localhost", 9876)),
        ("[::1]:9876", ("::1", 9876)),
        (" 127.0.0.1:1 ", ("127.0.0.1", 1)),
    ],
)
def test_parse(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected host:port"),
        ("127.0.0.1", "expected host:port"),
        (":9876", "expected host:port"),
        ("127.0.0.1:0", "port '0' is not in 1..65535"),
        ("127.0.0.1:70000", "port '70000' is not in 1..65535"),
        ("127.0.0.1:http", "port 'http' is not in 1..65535"),
        ("::1:9876", "write an IPv6 host in brackets"),
    ],
)
def test_bad_addresses_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_address(text)


def test_format_brackets_ipv6() -> None:
    assert format_address("::1", 9876) == "[::1]:9876"
    assert format_address("127.0.0.1", 9876) == "127.0.0.1:9876"

"""Remote-address whitelists of RocketMQ's ACL 1.0 (RemoteAddressStrategyFactory).

A pattern is one of::

    (empty)                     matches nothing
    *   *.*.*.*   *:*:*:*:*:*:*:*   matches every address
    192.168.0.1   ::1           one address (IPv6 in any spelling)
    192.168.0.1,192.168.0.2     a list of addresses
    192.168.1.{1,2,3}           a list, the last part in braces
    192.168.1.*   10.*.*.*      IPv4 parts: a number, * (0-255) or a range n-m
    192.168.1.1-100

RocketMQ allows ``*`` and ranges in the trailing parts only; hamq takes them in any part
(a superset). IPv6 addresses can be listed but not ranged. An address seen as an
IPv4-mapped IPv6 address (``::ffff:10.0.0.1``) is matched as its IPv4 address.

Pure: parsing raises ValueError naming the pattern and what is wrong.
"""

from __future__ import annotations

import ipaddress

import attrs

from hamq.remoting.address import IPAddress, ip_of

_ALL = frozenset({"*", "*.*.*.*", "*:*:*:*:*:*:*:*"})

Address = IPAddress


@attrs.frozen
class AddressPattern:
    """A parsed whitelist entry; ``text`` is how it was written."""

    text: str
    everything: bool = False
    #: exact addresses
    addresses: frozenset[Address] = frozenset()
    #: IPv4 patterns: per part, the inclusive range it allows
    ranges: tuple[tuple[tuple[int, int], ...], ...] = ()

    def matches(self, address: Address | None) -> bool:
        if self.everything:
            return True
        if address is None:
            return False
        if address in self.addresses:
            return True
        if isinstance(address, ipaddress.IPv4Address):
            parts = address.packed
            return any(
                all(low <= part <= high for part, (low, high) in zip(parts, ranges, strict=True))
                for ranges in self.ranges
            )
        return False


NOTHING = AddressPattern("")


def _one_address(text: str, pattern: str) -> Address:
    found = ip_of(text.strip())
    if found is None:
        raise ValueError(f"whitelist {pattern!r}: {text.strip()!r} is not an IP address")
    return found


def _ipv4_part(part: str, pattern: str) -> tuple[int, int]:
    part = part.strip()
    if part == "*":
        return (0, 255)
    low_text, dash, high_text = part.partition("-")
    try:
        low = int(low_text)
        high = int(high_text) if dash else low
    except ValueError:
        raise ValueError(
            f"whitelist {pattern!r}: {part!r} is not a number, * or a range n-m"
        ) from None
    if not 0 <= low <= high <= 255:
        raise ValueError(f"whitelist {pattern!r}: {part!r} is not within 0-255 (low to high)")
    return (low, high)


def parse_pattern(text: str | None) -> AddressPattern:
    """One whitelist entry; ValueError naming the entry and the problem."""
    pattern = (text or "").strip()
    if not pattern:
        return NOTHING
    if pattern in _ALL:
        return AddressPattern(pattern, everything=True)
    if pattern.endswith("}"):
        head, brace, listed = pattern[:-1].rpartition("{")
        if not brace or not listed.strip():
            raise ValueError(f"whitelist {pattern!r}: braces must close a list like 10.0.0.{{1,2}}")
        items = [head + item.strip() for item in listed.split(",") if item.strip()]
        return AddressPattern(pattern, addresses=frozenset(_one_address(i, pattern) for i in items))
    if "," in pattern:
        items = [item for item in pattern.split(",") if item.strip()]
        return AddressPattern(pattern, addresses=frozenset(_one_address(i, pattern) for i in items))
    if "*" in pattern or "-" in pattern:
        if ":" in pattern:
            raise ValueError(
                f"whitelist {pattern!r}: IPv6 ranges are not supported; list the addresses"
            )
        parts = pattern.split(".")
        if len(parts) != 4:
            raise ValueError(f"whitelist {pattern!r}: an IPv4 pattern has 4 parts")
        ranges = tuple(_ipv4_part(part, pattern) for part in parts)
        return AddressPattern(pattern, ranges=(ranges,))
    return AddressPattern(pattern, addresses=frozenset({_one_address(pattern, pattern)}))

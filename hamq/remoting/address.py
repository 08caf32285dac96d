"""``host:port`` addresses as RocketMQ writes them (``127.0.0.1:10911``, ``[::1]:9876``)."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_address(addr: str) -> tuple[str, int]:
    """(host, port) of ``host:port``; ValueError names what is wrong."""
    if not isinstance(addr, str) or not addr.strip():
        raise ValueError(f"bad address {addr!r}: expected host:port")
    text = addr.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"bad address {addr!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"bad address {addr!r}: write an IPv6 host in brackets, [::1]:9876")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad address {addr!r}: port {port_text!r} is not in 1..65535")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    """The ``host:port`` text of an address, IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_address(_instance: object, _attribute: object, value: str) -> None:
    """attrs validator: ``value`` is ``host:port`` (ValueError names it otherwise)."""
    parse_address(value)


def check_addresses(_instance: object, _attribute: object, value: tuple[str, ...]) -> None:
    """attrs validator: every item is ``host:port``."""
    for addr in value:
        parse_address(addr)


def ip_of(address: str) -> IPAddress | None:
    """The IP address of ``host:port`` or of a bare host (an IPv4-mapped IPv6 address as
    IPv4, an IPv6 zone dropped); None if it holds no IP address (a host name)."""
    text = address.strip()
    try:
        host = parse_address(text)[0]
    except ValueError:
        host = text.strip("[]")
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip

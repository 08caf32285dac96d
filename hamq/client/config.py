"""ClientConfig: what every client of hamq is configured with, checked when made.

``ClientConfig`` is frozen: a client takes it at construction and keeps it.
``client_config`` makes one from the arguments a client takes (``namesrv`` and
keyword options), or takes a ClientConfig given as ``namesrv`` with the options
applied over it. Every bad value raises InvalidArgumentError naming it: nameserver
addresses (``"a:9876;b:9876"``, Java's form, or a sequence; none at all is refused),
intervals and time outs (positive), an ACL account (both keys or neither).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from attrs import validators as v

from hamq.acl import Credentials, credentials_from
from hamq.client.errors import InvalidArgumentError
from hamq.protocol import SerializeType
from hamq.remoting import RemotingConfig, parse_address


def _namesrv_addrs(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"a:9876;b:9876"`` (Java's form) or a sequence of addresses."""
    items = value.split(";") if isinstance(value, str) else list(value)
    return tuple(a.strip() for a in items if a and a.strip())


def _check_addrs(_instance: object, _attribute: object, value: tuple[str, ...]) -> None:
    if not value:
        raise InvalidArgumentError("no nameserver address given (namesrv)")
    for addr in value:
        try:
            parse_address(addr)
        except ValueError as exc:
            raise InvalidArgumentError(f"nameserver address {addr!r}: {exc}") from None


@attrs.frozen
class ClientConfig:
    namesrv_addrs: tuple[str, ...] = attrs.field(converter=_namesrv_addrs, validator=_check_addrs)
    #: this client's address as brokers see it: in client ids and message ids (IPv4)
    client_ip: str = "127.0.0.1"
    #: None: the process id and a nanosecond stamp, unique per client (Java 5)
    instance_name: str | None = None
    poll_name_server_interval_s: float = attrs.field(default=30.0, validator=v.gt(0))
    heartbeat_broker_interval_s: float = attrs.field(default=30.0, validator=v.gt(0))
    #: how long a request to a nameserver or broker may take (RocketMQ: 3 s)
    request_timeout_s: float = attrs.field(default=3.0, validator=v.gt(0))
    serialize_type: SerializeType = SerializeType.MSGPACK
    remoting: RemotingConfig = attrs.field(factory=RemotingConfig)
    #: an ACL account (RocketMQ's SessionCredentials): every request is signed with it
    access_key: str | None = None
    secret_key: str | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        try:
            credentials_from(self.access_key, self.secret_key)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None

    @property
    def credentials(self) -> Credentials | None:
        """What requests are signed with (access_key and secret_key), if anything."""
        return credentials_from(self.access_key, self.secret_key)


def client_config(namesrv: str | Sequence[str] | ClientConfig, **options: Any) -> ClientConfig:
    if isinstance(namesrv, ClientConfig):
        return attrs.evolve(namesrv, **options) if options else namesrv
    try:
        return ClientConfig(namesrv, **options)
    except TypeError as exc:
        raise InvalidArgumentError(str(exc)) from None

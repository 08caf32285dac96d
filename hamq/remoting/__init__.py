"""I/O around hamq.protocol: connections, the processor table, server and client.

Connections and the client are written against AnyIO, so the client runs on Trio or
asyncio; the servers (server.py, tls.py's listeners) are Trio's, wrapped as AnyIO
streams (trio_stream.py).

- connection.py   one stream, both directions: dispatch, invoke, backpressure
- dispatch.py     Dispatcher: request code -> processor (inline or async)
- server.py       RemotingServer, and the Acceptor every listener uses (connection cap, TLS)
- client.py       RemotingClient: a connection per address, many requests in flight
- loop.py         the running loop's primitives for the hot path, looked up once
- trio_stream.py  Trio's streams as AnyIO byte streams
- tls.py          TLS contexts from PEM files, bounded handshakes
- address.py      ``host:port`` parsing and formatting (IPv6 in brackets)
- config.py       RemotingConfig
- errors.py       RemotingError and its kinds
"""

from hamq.remoting.address import (
    check_address,
    check_addresses,
    format_address,
    parse_address,
)
from hamq.remoting.client import RemotingClient
from hamq.remoting.config import RemotingConfig
from hamq.remoting.connection import Connection, ConnectionStatistics
from hamq.remoting.dispatch import AsyncProcessor, Dispatcher, InlineProcessor
from hamq.remoting.errors import (
    RemotingConnectError,
    RemotingConnectionClosed,
    RemotingError,
    RemotingFrameTooLarge,
    RemotingTimeoutError,
)
from hamq.remoting.responder import Responder
from hamq.remoting.server import RemotingServer, ServerStatistics

__all__ = [
    "AsyncProcessor",
    "Connection",
    "ConnectionStatistics",
    "Dispatcher",
    "InlineProcessor",
    "RemotingClient",
    "RemotingConfig",
    "RemotingConnectError",
    "RemotingConnectionClosed",
    "RemotingError",
    "RemotingFrameTooLarge",
    "RemotingServer",
    "RemotingTimeoutError",
    "Responder",
    "ServerStatistics",
    "check_address",
    "check_addresses",
    "format_address",
    "parse_address",
]

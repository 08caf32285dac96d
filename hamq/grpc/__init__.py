"""gRPC over HTTP/2 on Trio: the server the broker's RocketMQ 5 endpoint runs on.

- server.py   GrpcServer: the listener (Acceptor: connection cap, TLS with ALPN h2), one
              HTTP/2 connection per peer (h2, sans-IO), one task per stream (none for a
              method answered by callback), the gRPC message framing, deadlines,
              trailers, limits
- hpack_codec.py  the HPACK decoder and encoder h2 uses for these connections
- status.py   gRPC status codes and GrpcError

It knows no RocketMQ: a table of methods (path -> Method) says what each call runs.
"""

from hamq.grpc.server import Call, GrpcConfig, GrpcServer, GrpcStatistics, Method, MethodKind
from hamq.grpc.status import GrpcError, Status

__all__ = [
    "Call",
    "GrpcConfig",
    "GrpcError",
    "GrpcServer",
    "GrpcStatistics",
    "Method",
    "MethodKind",
    "Status",
]

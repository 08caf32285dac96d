"""RocketMQ 5's gRPC endpoint on a broker (the MessagingService a 5.x client speaks).

- service.py  GrpcEndpoint: the RPCs, each mapped onto the broker's remoting processors
- channel.py  LocalChannel: a gRPC client's requests through the processor table
- convert.py  v2 messages <-> properties, answer codes -> the v2 Code
- auth.py     the MQv2-HMAC-SHA1 signature, checked against the ACL's accounts
- routes.py   GrpcRoutes: a topic's broker groups and their masters' gRPC endpoints
"""

from hamq.broker.grpc.routes import GrpcRoutes
from hamq.broker.grpc.service import GrpcEndpoint

__all__ = ["GrpcEndpoint", "GrpcRoutes"]

"""RocketMQ 5's gRPC messages (apache.rocketmq.v2, rocketmq-apis) as protobuf classes.

definition.proto and service.proto are hamq's, written from the wire's facts (package,
names, field numbers, types, streaming kinds) so that they are wire-identical to
RocketMQ's; ``make protos`` generates the *_pb2.py / *_pb2.pyi modules beside them,
which are committed and not edited by hand (tests/test_grpc_protos.py checks they match).
"""

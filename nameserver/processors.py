"""The nameserver's request processors: RocketMQ's codes and shapes
(docs/PROTOCOL.md#nameserver-requests).

QUERY_DATA_VERSION tells a broker whether to register again: this nameserver does not
know it (it restarted) or has another version of its topic table.

All are inline (they answer at once from the route table). Time comes from the
service's clock, so housekeeping can be tested in virtual time. Who may call them (an
ACL) is decided before they run, by the dispatcher's guard (service.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import (
    DataVersion,
    RegisterBrokerBody,
    TopicList,
    decode_body,
    encode_body,
)
from hamq.protocol.headers import (
    BrokerHeartbeatRequestHeader,
    DeleteTopicRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from hamq.remoting import Connection, Dispatcher
from nameserver.route_table import DEFAULT_BROKER_TIMEOUT_MS, RouteTable


class NameServerProcessors:
    def __init__(
        self,
        table: RouteTable,
        clock: Callable[[], int],
        broker_timeout_ms: int = DEFAULT_BROKER_TIMEOUT_MS,
    ) -> None:
        self.table = table
        self._clock = clock
        self._broker_timeout_ms = broker_timeout_ms

    def install(self, dispatcher: Dispatcher, *, heartbeat: bool = True) -> None:
        dispatcher.register(RequestCode.REGISTER_BROKER, self.register_broker)
        dispatcher.register(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
        dispatcher.register(RequestCode.QUERY_DATA_VERSION, self.query_data_version)
        if heartbeat:  # (with an embedded controller, the nameserver routes 904 itself)
            dispatcher.register(RequestCode.BROKER_HEARTBEAT, self.broker_heartbeat)
        dispatcher.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.route)
        dispatcher.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.cluster_info)
        dispatcher.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.topic_list)
        dispatcher.register(RequestCode.GET_TOPICS_BY_CLUSTER, self.topics_by_cluster)
        dispatcher.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic)

    def register_broker(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(RegisterBrokerRequestHeader)
        if header.compressed:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                "compressed broker registrations are not supported; register uncompressed",
            )
        if header.body_crc32 and zlib.crc32(request.body) & 0x7FFFFFFF != header.body_crc32:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        body = (
            decode_body(RegisterBrokerBody, request.body) if request.body else RegisterBrokerBody()
        )
        wrapper = body.topic_config_serialize_wrapper
        result = self.table.register_broker(
            cluster=header.cluster_name,
            broker_name=header.broker_name,
            broker_id=header.broker_id,
            addr=header.broker_addr,
            ha_server_addr=header.ha_server_addr,
            topics=wrapper.topic_config_table,
            data_version=wrapper.data_version,
            now_ms=self._clock(),
            timeout_ms=header.heartbeat_timeout_millis or self._broker_timeout_ms,
            connection=conn,
        )
        return request.response_to(
            header=RegisterBrokerResponseHeader(
                ha_server_addr=result.ha_server_addr, master_addr=result.master_addr
            )
        )

    def query_data_version(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Whether the broker must register again (RocketMQ's rule): it is not known
        here, or its topic table's version differs from the one it registered; one that
        need not counts as heard from."""
        header = request.header(QueryDataVersionRequestHeader)
        asked = decode_body(DataVersion, request.body) if request.body else DataVersion()
        known = self.table.data_version_of(header.broker_addr)
        changed = known is None or known != asked
        if not changed:
            self.table.heartbeat(header.broker_addr, self._clock())
        body = encode_body(known) if known is not None else b""
        return request.response_to(header=QueryDataVersionResponseHeader(changed), body=body)

    def unregister_broker(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(UnregisterBrokerRequestHeader)
        self.table.unregister_broker(
            broker_name=header.broker_name, addr=header.broker_addr, broker_id=header.broker_id
        )
        return request.response_to()

    def broker_heartbeat(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(BrokerHeartbeatRequestHeader)
        self.table.heartbeat(header.broker_addr, self._clock(), header.heartbeat_timeout_mills)
        return request.response_to()

    def route(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetRouteInfoRequestHeader)
        route = self.table.route(header.topic) or self.table.retry_route(header.topic)
        if route is None:
            return request.response_to(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {header.topic}",
            )
        return request.response_to(body=encode_body(route))

    def cluster_info(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response_to(body=encode_body(self.table.cluster_info()))

    def topic_list(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return request.response_to(body=encode_body(TopicList(self.table.topic_names())))

    def topics_by_cluster(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(GetTopicsByClusterRequestHeader)
        topics = self.table.topics_of_cluster(header.cluster)
        return request.response_to(body=encode_body(TopicList(topics)))

    def delete_topic(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = request.header(DeleteTopicRequestHeader)
        self.table.delete_topic(header.topic)
        return request.response_to()

"""GrpcEndpoint: RocketMQ 5's ``apache.rocketmq.v2.MessagingService`` on a broker.

RocketMQ runs this "proxy" inside the broker in its local mode; so does hamq. Every
call that acts (send, receive, ack, change of invisible time, dead-lettering, the end of
a transaction, heartbeats) becomes the remoting request a 4.x client would send and is
dispatched, in process, through the broker's own processor table (channel.py); so the
ACL, SEND_OK's durability, pop's checkpoints and the transactions are the remoting
ones. What the endpoint adds is the mapping (convert.py) and what the proxy itself
answers:

- QueryRoute: the topic's queues on this broker group, each with the endpoint of the
  group's master now (routes.py); an unknown topic is created as a send would create
  it (``auto_create_topic_enable``), else TOPIC_NOT_FOUND.
- Telemetry: the client's Settings are answered with the broker's (a backoff policy, the
  body limit, FIFO for an orderly group, metrics off); the stream then carries the
  broker's transaction check-backs to the producer (never waiting on a client that does
  not read: a check that cannot go now is asked again at the next check pass).
- QueryAssignment: one assignment per broker group, queue -1 (a push consumer pops from
  every queue).
- ReceiveMessage: a POP_MESSAGE over every queue, long polling up to the call's
  deadline less a margin; the stream carries a status, the messages, and the time of
  delivery, as RocketMQ's proxy writes it.

Results travel in each answer's ``status`` (the v2 Code), as the clients expect; gRPC's
own status is OK unless the call itself was bad (UNIMPLEMENTED for an unknown method).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

import trio

from hamq.acl import AclGuard, Credentials, sign
from hamq.broker.context import BrokerContext
from hamq.broker.grpc.auth import AuthError, verify
from hamq.broker.grpc.channel import LocalChannel, OnAnswer
from hamq.broker.grpc.convert import (
    Refused,
    code_of,
    delivered,
    duration,
    millis,
    outgoing,
    status,
    timestamp,
)
from hamq.broker.grpc.renewal import AUTO_RENEW_INVISIBLE_MS, Renewals
from hamq.broker.grpc.routes import GrpcRoutes
from hamq.grpc import Call, Method, MethodKind
from hamq.protocol import RemotingCommand, RequestCode, RequestError, ResponseCode
from hamq.protocol.bodies import (
    PERM_READ,
    PERM_WRITE,
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    HeartbeatData,
    MessageModel,
    ProducerData,
    SubscriptionData,
    encode_body,
)
from hamq.protocol.headers import (
    ChangeInvisibleTimeResponseHeader,
    CheckTransactionStateRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UnregisterClientRequestHeader,
)
from hamq.protocol.message import (
    DEFAULT_TOPIC,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_ROLLBACK,
    encode_properties,
    group_error,
    parse_offset_msg_id,
    topic_error,
)
from hamq.protocol.pop import (
    MAX_POP_MESSAGES,
    PROPERTY_RECEIPT_HANDLE,
    ReceiptHandle,
    ReceiptHandleError,
    ack_header,
    change_invisible_header,
    changed_handle,
    pop_retry_topic,
    read_popped,
)
from hamq.protocol.record import decode_message, decode_messages
from hamq.protocol.v2 import definition_pb2 as pb
from hamq.protocol.v2 import service_pb2 as spb
from hamq.remoting import Connection, Dispatcher, RemotingError

log = logging.getLogger(__name__)

SERVICE = "/apache.rocketmq.v2.MessagingService/"
#: what a receive leaves of the call's deadline for its answer to travel back
RECEIVE_MARGIN_S = 1.0
#: a receive's long polling when neither the call nor the client says
DEFAULT_POLL_S = 20.0
#: the largest body a client may send (RocketMQ's maxMessageSize default: 4 MiB)
MAX_BODY_BYTES = 4 * 1024 * 1024
#: the retry policy answered to producers (RocketMQ's proxy: 3 attempts, 10 ms .. 1 s)
PRODUCER_ATTEMPTS = 3
#: what a consumer waits before a message comes back (RocketMQ's delay levels 3..18)
CONSUMER_BACKOFF_S = (
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip

#: gRPC's path -> (kind, request type, the endpoint's method name)
_RPCS: dict[str, tuple[MethodKind, Any, str]] = {
    "QueryRoute": (MethodKind.UNARY, spb.QueryRouteRequest, "query_route"),
    "Heartbeat": (MethodKind.UNARY, spb.HeartbeatRequest, "heartbeat"),
    "SendMessage": (MethodKind.UNARY_CALLBACK, spb.SendMessageRequest, "send_message"),
    "QueryAssignment": (MethodKind.UNARY, spb.QueryAssignmentRequest, "query_assignment"),
    "ReceiveMessage": (
        MethodKind.SERVER_STREAMING,
        spb.ReceiveMessageRequest,
        "receive_message",
    ),
    "AckMessage": (MethodKind.UNARY_CALLBACK, spb.AckMessageRequest, "ack_message"),
    "ForwardMessageToDeadLetterQueue": (
        MethodKind.UNARY,
        spb.ForwardMessageToDeadLetterQueueRequest,
        "forward_to_dead_letter_queue",
    ),
    "EndTransaction": (MethodKind.UNARY, spb.EndTransactionRequest, "end_transaction"),
    "Telemetry": (MethodKind.BIDI, spb.TelemetryCommand, "telemetry"),
    "NotifyClientTermination": (
        MethodKind.UNARY,
        spb.NotifyClientTerminationRequest,
        "notify_client_termination",
    ),
    "ChangeInvisibleDuration": (
        MethodKind.UNARY,
        spb.ChangeInvisibleDurationRequest,
        "change_invisible_duration",
    ),
}


def transaction_id(offset_msg_id: str, queue_offset: int) -> str:
    """The transaction id a gRPC client is given for a half message: where it is."""
    return f"{offset_msg_id}:{queue_offset}"


def parse_transaction_id(text: str) -> tuple[int, int]:
    """(commit-log offset, queue offset) of a transaction id; Refused if malformed."""
    msg_id, _, queue = text.partition(":")
    try:
        _host, offset = parse_offset_msg_id(msg_id)
        if not queue.isdigit():
            raise ValueError(queue)
    except ValueError:
        raise Refused(
            pb.INVALID_TRANSACTION_ID, f"transaction id {text[:80]!r} is not hamq's"
        ) from None
    return offset, int(queue)


def _refuse(_request: RemotingCommand) -> bool:
    """(the endpoint's own channel: nobody to ask back)"""
    return False


class _Entries:
    """The entries of a call's answer (one per message sent, or per handle acked), each
    set when its request is answered; ``finish`` has them all once the last is set."""

    __slots__ = ("_entries", "_finish", "_missing")

    def __init__(self, count: int, finish: Callable[[list[Any]], None]) -> None:
        self._entries: list[Any] = [None] * count
        self._missing = count
        self._finish = finish

    def set(self, index: int, entry: Any) -> None:
        self._entries[index] = entry
        self._missing -= 1
        if not self._missing:
            self._finish(self._entries)


def _overall(entries: list[Any]) -> pb.Status:
    """An answer's status: its entries' if they share one, else MULTIPLE_RESULTS."""
    codes = {entry.status.code for entry in entries}
    return entries[0].status if len(codes) == 1 else status(pb.MULTIPLE_RESULTS)


class _Client:
    """What the endpoint knows of one client connection."""

    def __init__(self, channel: LocalChannel) -> None:
        self.channel = channel
        self.settings: pb.Settings | None = None
        self.telemetry: Call | None = None
        self.client_id = ""


class GrpcEndpoint:
    def __init__(
        self,
        ctx: BrokerContext,
        dispatcher: Dispatcher,
        *,
        acl: AclGuard | None,
        routes: GrpcRoutes,
        connection_closed: Callable[[Connection], None],
    ) -> None:
        self.ctx = ctx
        self._dispatcher = dispatcher
        self._acl = acl
        self.routes = routes
        self._connection_closed = connection_closed
        self._nursery: trio.Nursery | None = None
        #: the endpoint's own requests (renewals), each signed with its account
        self._own: LocalChannel | None = None
        #: what push consumers hold, kept invisible while they work on it
        self.renewals = Renewals(self._submit_own)
        #: check-backs written to Telemetry streams, and those no stream could take
        self.checks_sent = 0
        self.checks_dropped = 0

    def methods(self) -> dict[str, Method]:
        return {
            SERVICE + name: Method(kind, request_type, getattr(self, attribute))
            for name, (kind, request_type, attribute) in _RPCS.items()
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hosts the tasks the channels' requests spawn (async processors), and the
        renewals."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._own = LocalChannel("the gRPC endpoint", self._dispatcher, nursery, _refuse)
            await nursery.start(self.renewals.run)
            task_status.started()
            await trio.sleep_forever()

    def connection_ended(self, attributes: dict[str, Any]) -> None:
        """The gRPC server's hook: a client connection closed."""
        client = attributes.get("client")
        if isinstance(client, _Client):
            client.channel.close("gRPC connection closed")
            self.renewals.forget(client.channel)

    # ------------------------------------------------------------------ plumbing
    def _client(self, call: Call) -> _Client:
        attributes = call.connection_attributes
        client = attributes.get("client")
        if client is None:
            assert self._nursery is not None
            holder: list[_Client] = []
            channel = LocalChannel(
                call.peer,
                self._dispatcher,
                self._nursery,
                lambda request: self._to_client(holder[0], request),
            )
            channel.add_close_listener(self._connection_closed)
            client = attributes["client"] = _Client(channel)
            holder.append(client)
        client.client_id = call.metadata.get("x-mq-client-id", client.client_id)
        return client

    async def _ask(self, call: Call, request: RemotingCommand) -> RemotingCommand:
        """Dispatch ``request`` for the caller: signed with its verified credentials
        (the ACL guard then checks it as a remoting request), answered by the broker."""
        channel = self._channel(call, request)
        try:
            return await channel.request(request)
        except RemotingError as exc:  # (the client terminated meanwhile)
            raise Refused(pb.INTERNAL_SERVER_ERROR, str(exc)) from None

    def _submit(self, call: Call, request: RemotingCommand, on_answer: OnAnswer) -> None:
        """``_ask`` with the answer handed to ``on_answer`` (None: the client's
        connection closed first)."""
        try:
            self._channel(call, request).submit(request, on_answer, call.at_read_end)
        except RemotingError as exc:
            raise Refused(pb.INTERNAL_SERVER_ERROR, str(exc)) from None

    def _channel(self, call: Call, request: RemotingCommand) -> LocalChannel:
        """The caller's channel, ``request`` signed with its verified credentials;
        Refused UNAUTHORIZED if they do not verify."""
        credentials = self._credentials(call)
        if credentials is not None:
            sign(request, credentials)
        return self._client(call).channel

    def _credentials(self, call: Call) -> Credentials | None:
        """The account the call is signed by (None: unsigned, or no ACL); Refused
        UNAUTHORIZED if its signature does not verify."""
        if self._acl is None:
            return None
        try:
            return verify(call.metadata, self._acl.table)
        except AuthError as exc:
            raise Refused(pb.UNAUTHORIZED, str(exc)) from None

    def _submit_own(
        self, request: RemotingCommand, credentials: Credentials | None, on_answer: OnAnswer
    ) -> None:
        """The endpoint's own request, signed with ``credentials``."""
        if credentials is not None:
            sign(request, credentials)
        if self._own is None or self._own.closed:
            on_answer(None)
            return
        self._own.submit(request, on_answer)

    @staticmethod
    def _refusal(response: RemotingCommand) -> pb.Status:
        return status(code_of(response.code), response.remark or "")

    # ------------------------------------------------------------------ routes
    async def query_route(self, request: spb.QueryRouteRequest, call: Call) -> Any:
        try:
            self._client(call)
            queues = await self._queues(request.topic.name, call)
        except Refused as exc:
            return spb.QueryRouteResponse(status=status(exc.code, exc.message))
        return spb.QueryRouteResponse(status=status(pb.OK), message_queues=queues)

    async def _queues(self, topic: str, call: Call) -> list[pb.MessageQueue]:
        problem = topic_error(topic)
        if problem is not None:
            raise Refused(pb.ILLEGAL_TOPIC, problem)
        config = self.ctx.topics.get(topic)
        if config is None and self.ctx.config.auto_create_topic_enable and self.ctx.roles.is_master:
            try:
                config = self.ctx.topics.create_from_default(
                    topic, DEFAULT_TOPIC, self.ctx.config.default_topic_queue_nums
                )
            except RequestError as exc:  # (max_topics reached)
                raise Refused(code_of(exc.code), str(exc)) from None
        groups = await self.routes.topic(topic)  # (every group the nameservers know too)
        if not groups:
            if config is None:
                raise Refused(pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            raise Refused(
                pb.INTERNAL_SERVER_ERROR, f"no master of topic {topic}'s brokers serves gRPC now"
            )
        kinds = [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION]
        queues = []
        for group in groups:
            host, port = group.endpoint
            broker = pb.Broker(
                name=group.broker_name,
                id=0,
                endpoints=pb.Endpoints(
                    scheme=pb.IPv4 if host[:1].isdigit() else pb.DOMAIN_NAME,
                    addresses=[pb.Address(host=host, port=port)],
                ),
            )
            for queue_id in range(max(group.read_queue_nums, group.write_queue_nums)):
                readable = queue_id < group.read_queue_nums and group.perm & PERM_READ
                writable = queue_id < group.write_queue_nums and group.perm & PERM_WRITE
                permission = (
                    pb.READ_WRITE
                    if readable and writable
                    else pb.READ
                    if readable
                    else pb.WRITE
                    if writable
                    else pb.NONE
                )
                queues.append(
                    pb.MessageQueue(
                        topic=pb.Resource(name=topic),
                        id=queue_id,
                        permission=permission,
                        broker=broker,
                        accept_message_types=kinds,
                    )
                )
        return queues

    async def query_assignment(self, request: spb.QueryAssignmentRequest, call: Call) -> Any:
        try:
            self._client(call)
            queues = await self._queues(request.topic.name, call)
        except Refused as exc:
            return spb.QueryAssignmentResponse(status=status(exc.code, exc.message))
        assignments = []
        for queue in queues:
            if queue.id == 0:  # (one a broker group: it pops every queue of its own)
                whole = pb.MessageQueue()
                whole.CopyFrom(queue)
                whole.id = -1
                whole.permission = pb.READ_WRITE
                assignments.append(pb.Assignment(message_queue=whole))
        return spb.QueryAssignmentResponse(status=status(pb.OK), assignments=assignments)

    # ------------------------------------------------------------------ clients
    async def heartbeat(self, request: spb.HeartbeatRequest, call: Call) -> Any:
        client = self._client(call)
        if not client.client_id:
            return spb.HeartbeatResponse(
                status=status(pb.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
            )
        group = request.group.name if request.HasField("group") else None
        try:
            response = await self._ask(call, self._heartbeat(client, request.client_type, group))
        except Refused as exc:
            return spb.HeartbeatResponse(status=status(exc.code, exc.message))
        if response.code != ResponseCode.SUCCESS:
            return spb.HeartbeatResponse(status=self._refusal(response))
        return spb.HeartbeatResponse(status=status(pb.OK))

    def _heartbeat(self, client: _Client, kind: int, group: str | None) -> RemotingCommand:
        """HEART_BEAT for a producer (its group: each topic it publishes to, as
        RocketMQ's proxy names them, so that check-backs find it) or a consumer."""
        data = HeartbeatData(client_id=client.client_id)
        settings = client.settings
        if kind == pb.PRODUCER:
            topics = settings.publishing.topics if settings is not None else []
            data.producer_data_set = [ProducerData(t.name) for t in topics]
        elif group:
            subscriptions = settings.subscription.subscriptions if settings is not None else []
            data.consumer_data_set = [
                ConsumerData(
                    group_name=group,
                    consume_type=ConsumeType.CONSUME_POP,
                    message_model=MessageModel.CLUSTERING,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                    subscription_data_set=[
                        SubscriptionData(topic=s.topic.name, sub_string=s.expression.expression)
                        for s in subscriptions
                    ],
                )
            ]
        return RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(data))

    async def notify_client_termination(
        self, request: spb.NotifyClientTerminationRequest, call: Call
    ) -> Any:
        client = self._client(call)
        header = UnregisterClientRequestHeader(
            client_id=client.client_id,
            producer_group=None,
            consumer_group=request.group.name if request.HasField("group") else None,
        )
        try:
            await self._ask(call, RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, header))
        except Refused as exc:
            return spb.NotifyClientTerminationResponse(status=status(exc.code, exc.message))
        client.channel.close("the client terminated")
        call.connection_attributes.pop("client", None)
        return spb.NotifyClientTerminationResponse(status=status(pb.OK))

    async def telemetry(self, _request: None, call: Call) -> None:
        client = self._client(call)
        client.telemetry = call
        while (command := await call.receive()) is not None:
            kind = command.WhichOneof("command")
            if kind == "settings":
                client.settings = command.settings
                answer = self._settings(command.settings)
                await call.send(spb.TelemetryCommand(status=status(pb.OK), settings=answer))
                if command.settings.client_type == pb.PRODUCER and client.client_id:
                    try:  # (registered at once: check-backs find it before its heartbeat)
                        await self._ask(call, self._heartbeat(client, pb.PRODUCER, None))
                    except Refused as exc:
                        log.info("gRPC: producer %s not registered: %s", client.client_id, exc)
            # (thread stack traces and verify results answer commands hamq never sends)

    def _settings(self, given: pb.Settings) -> pb.Settings:
        """The broker's answer to a client's Settings."""
        answer = pb.Settings()
        answer.CopyFrom(given)
        answer.metric.CopyFrom(pb.Metric(on=False))
        if given.client_type == pb.PRODUCER:
            answer.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=PRODUCER_ATTEMPTS,
                    exponential_backoff=pb.ExponentialBackoff(
                        initial=duration(10), max=duration(1000), multiplier=2.0
                    ),
                )
            )
            answer.publishing.max_body_size = MAX_BODY_BYTES
            answer.publishing.validate_message_type = True
        else:
            group = given.subscription.group.name
            config = self.ctx.subscriptions.table.get(group)
            retries = config.retry_max_times if config is not None else 16
            policy = pb.RetryPolicy(max_attempts=retries + 1)
            if config is not None and config.consume_message_orderly:
                policy.exponential_backoff.CopyFrom(
                    pb.ExponentialBackoff(
                        initial=duration(1000), max=duration(60_000), multiplier=2.0
                    )
                )
            else:
                policy.customized_backoff.next.extend(
                    duration(s * 1000) for s in CONSUMER_BACKOFF_S
                )
            answer.backoff_policy.CopyFrom(policy)
            answer.subscription.fifo = bool(config is not None and config.consume_message_orderly)
            answer.subscription.receive_batch_size = MAX_POP_MESSAGES
            if not given.subscription.HasField("long_polling_timeout"):
                answer.subscription.long_polling_timeout.CopyFrom(
                    duration(int(DEFAULT_POLL_S * 1000))
                )
        return answer

    def _to_client(self, client: _Client, request: RemotingCommand) -> bool:
        """What the broker asks of a client, on its Telemetry stream; False if it cannot
        go now (no stream, or one the client does not read)."""
        if request.code != RequestCode.CHECK_TRANSACTION_STATE:
            return True  # (consumer-change notices: pop consumers do not rebalance)
        telemetry = client.telemetry
        if telemetry is None or not telemetry.active:
            self.checks_dropped += 1
            return False
        header = request.header(CheckTransactionStateRequestHeader)
        half = decode_message(request.body)
        message = delivered(half, 0)
        message.system_properties.ClearField("invisible_duration")
        message.system_properties.ClearField("delivery_attempt")
        command = spb.TelemetryCommand(
            recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
                message=message,
                transaction_id=transaction_id(
                    header.offset_msg_id or "", header.tran_state_table_offset
                ),
            )
        )
        if telemetry.try_send(command):
            self.checks_sent += 1
            return True
        self.checks_dropped += 1
        return False

    # ------------------------------------------------------------------ sending
    def send_message(self, request: spb.SendMessageRequest, call: Call) -> None:
        """(answered by callback: each message is a SEND_MESSAGE, the answer goes once
        each has its entry)"""
        if not request.messages:
            call.answer(
                spb.SendMessageResponse(status=status(pb.BAD_REQUEST, "no message to send"))
            )
            return
        entries = _Entries(
            len(request.messages),
            lambda done: call.answer(spb.SendMessageResponse(status=_overall(done), entries=done)),
        )
        for index, message in enumerate(request.messages):

            def sent(
                response: RemotingCommand | None, index: int = index, message: Any = message
            ) -> None:
                entries.set(index, self._send_entry(message, response))

            try:
                self._submit(call, self._send_command(message), sent)
            except Refused as exc:
                entries.set(index, self._send_refused(message, exc))

    @staticmethod
    def _send_refused(message: pb.Message, exc: Refused) -> spb.SendResultEntry:
        return spb.SendResultEntry(
            status=status(exc.code, exc.message), message_id=message.system_properties.message_id
        )

    def _send_entry(
        self, message: pb.Message, response: RemotingCommand | None
    ) -> spb.SendResultEntry:
        message_id = message.system_properties.message_id
        if response is None:
            return self._send_refused(
                message, Refused(pb.INTERNAL_SERVER_ERROR, "the client's connection closed")
            )
        if response.code != ResponseCode.SUCCESS:
            return spb.SendResultEntry(status=self._refusal(response), message_id=message_id)
        answer = response.header(SendMessageResponseHeader)
        entry = spb.SendResultEntry(
            status=status(pb.OK), message_id=message_id, offset=answer.queue_offset
        )
        if message.system_properties.message_type == pb.TRANSACTION:
            entry.transaction_id = transaction_id(answer.msg_id, answer.queue_offset)
        return entry

    def _send_command(self, message: pb.Message) -> RemotingCommand:
        topic = message.topic.name
        problem = topic_error(topic)
        if problem is not None:
            raise Refused(pb.ILLEGAL_TOPIC, problem)
        properties, sys_flag = outgoing(message, MAX_BODY_BYTES)
        queue_id = -1  # (the send processor picks one)
        group = message.system_properties.message_group
        config = self.ctx.topics.get(topic)
        if group and config is not None:
            queue_id = zlib.crc32(group.encode()) % config.write_queue_nums
        born = message.system_properties.born_timestamp
        header = SendMessageRequestHeader(
            producer_group=topic,
            topic=topic,
            default_topic=DEFAULT_TOPIC,
            default_topic_queue_nums=self.ctx.config.default_topic_queue_nums,
            queue_id=queue_id,
            sys_flag=sys_flag,
            born_timestamp=born.seconds * 1000 + born.nanos // 1_000_000
            or time.time_ns() // 1_000_000,
            flag=0,
            properties=encode_properties(properties),
            reconsume_times=0,
        )
        return RemotingCommand.request(RequestCode.SEND_MESSAGE, header, body=message.body)

    async def end_transaction(self, request: spb.EndTransactionRequest, call: Call) -> Any:
        resolutions = {
            pb.COMMIT: SYSFLAG_TRANSACTION_COMMIT,
            pb.ROLLBACK: SYSFLAG_TRANSACTION_ROLLBACK,
        }
        try:
            if request.resolution not in resolutions:
                raise Refused(pb.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
            offset, queue_offset = parse_transaction_id(request.transaction_id)
            header = EndTransactionRequestHeader(
                producer_group=request.topic.name,
                tran_state_table_offset=queue_offset,
                commit_log_offset=offset,
                commit_or_rollback=resolutions[request.resolution],
                msg_id=request.message_id,
                topic=request.topic.name,
                from_transaction_check=request.source == pb.SOURCE_SERVER_CHECK,
                transaction_id=request.message_id,
            )
            response = await self._ask(
                call, RemotingCommand.request(RequestCode.END_TRANSACTION, header)
            )
        except Refused as exc:
            return spb.EndTransactionResponse(status=status(exc.code, exc.message))
        if response.code != ResponseCode.SUCCESS:
            return spb.EndTransactionResponse(status=self._refusal(response))
        return spb.EndTransactionResponse(status=status(pb.OK))

    # ------------------------------------------------------------------ receiving
    async def receive_message(self, request: spb.ReceiveMessageRequest, call: Call) -> None:
        group, topic = request.group.name, request.message_queue.topic.name
        try:
            header = self._pop_header(request, group, topic, call)
            response = await self._ask(
                call, RemotingCommand.request(RequestCode.POP_MESSAGE, header)
            )
        except Refused as exc:
            await call.send(spb.ReceiveMessageResponse(status=status(exc.code, exc.message)))
            return
        if response.code != ResponseCode.SUCCESS:
            await call.send(spb.ReceiveMessageResponse(status=self._refusal(response)))
            return
        answer = response.header(PopMessageResponseHeader)
        messages = decode_messages(response.body)
        read_popped(answer, messages, self.ctx.config.broker_name, topic)
        if request.auto_renew and not request.HasField("invisible_duration"):
            self._renew(messages, call, group, topic)
        if not messages:
            await call.send(spb.ReceiveMessageResponse(status=status(pb.MESSAGE_NOT_FOUND)))
            return
        await call.send(spb.ReceiveMessageResponse(status=status(pb.OK)))
        for message in messages:
            await call.send(
                spb.ReceiveMessageResponse(message=delivered(message, answer.invisible_time))
            )
        now = time.time_ns() // 1_000_000
        await call.send(spb.ReceiveMessageResponse(delivery_timestamp=timestamp(now)))

    def _renew(self, messages: list[Any], call: Call, group: str, topic: str) -> None:
        """Track what a push consumer was given (renewal.py)."""
        channel = self._client(call).channel
        credentials = self._credentials(call)
        for message in messages:
            text = message.properties[PROPERTY_RECEIPT_HANDLE]
            handle = ReceiptHandle.parse(text)
            self.renewals.track(
                text,
                handle,
                owner=channel,
                credentials=credentials,
                group=group,
                topic=self._handle_topic(handle, group, topic),
            )

    def _pop_header(
        self, request: spb.ReceiveMessageRequest, group: str, topic: str, call: Call
    ) -> PopMessageRequestHeader:
        for problem, code in (
            (group_error(group), pb.ILLEGAL_CONSUMER_GROUP),
            (topic_error(topic), pb.ILLEGAL_TOPIC),
        ):
            if problem is not None:
                raise Refused(code, problem)
        batch = request.batch_size or 1
        if not 1 <= batch <= MAX_POP_MESSAGES:
            raise Refused(pb.BAD_REQUEST, f"batch_size {batch} is not in 1..{MAX_POP_MESSAGES}")
        if request.HasField("invisible_duration"):
            invisible_ms = millis(request.invisible_duration)
        elif request.auto_renew:  # (a push consumer: acks or nacks what it was given)
            invisible_ms = AUTO_RENEW_INVISIBLE_MS
        else:
            raise Refused(pb.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required")
        poll_s = (
            millis(request.long_polling_timeout) / 1000
            if request.HasField("long_polling_timeout")
            else DEFAULT_POLL_S
        )
        poll_s = max(0.0, min(poll_s, call.remaining_s - RECEIVE_MARGIN_S))
        expression = request.filter_expression
        if expression.type == pb.SQL:
            raise Refused(pb.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported here")
        config = self.ctx.subscriptions.table.get(group)
        fifo = bool(config is not None and config.consume_message_orderly)
        return PopMessageRequestHeader(
            consumer_group=group,
            topic=topic,
            queue_id=-1,
            max_msg_nums=batch,
            invisible_time=invisible_ms,
            poll_time=int(poll_s * 1000),
            born_time=time.time_ns() // 1_000_000,
            init_mode=0,  # (a new group starts at the queue's first message, as hamq's own)
            exp_type="TAG",
            exp=expression.expression or "*",
            order=fifo,
            attempt_id=request.attempt_id if request.HasField("attempt_id") else None,
        )

    def ack_message(self, request: spb.AckMessageRequest, call: Call) -> None:
        """(answered by callback, as send_message: an ACK_MESSAGE per entry)"""
        if not request.entries:
            call.answer(spb.AckMessageResponse(status=status(pb.BAD_REQUEST, "no entry to ack")))
            return
        group, topic = request.group.name, request.topic.name
        results = _Entries(
            len(request.entries),
            lambda done: call.answer(spb.AckMessageResponse(status=_overall(done), entries=done)),
        )
        for index, entry in enumerate(request.entries):

            def acked(result: pb.Status, index: int = index, entry: Any = entry) -> None:
                results.set(
                    index,
                    spb.AckMessageResultEntry(
                        message_id=entry.message_id,
                        receipt_handle=entry.receipt_handle,
                        status=result,
                    ),
                )

            def by(text: str, acked: Callable[[pb.Status], None] = acked) -> None:
                try:
                    handle = self._handle(text)
                    ack = self._ack(group, self._handle_topic(handle, group, topic), handle)
                    self._submit(call, ack, lambda response: acked(self._ack_status(response)))
                except Refused as exc:
                    acked(status(exc.code, exc.message))

            # (a push consumer's message: by its current handle, renewals.py)
            self.renewals.use(entry.receipt_handle, by)

    def _ack_status(self, response: RemotingCommand | None) -> pb.Status:
        if response is None:
            return status(pb.INTERNAL_SERVER_ERROR, "the client's connection closed")
        if response.code == ResponseCode.SUCCESS:
            return status(pb.OK)
        return self._handle_refusal(response)

    @staticmethod
    def _handle(text: str) -> ReceiptHandle:
        try:
            return ReceiptHandle.parse(text)
        except ReceiptHandleError as exc:
            raise Refused(pb.INVALID_RECEIPT_HANDLE, str(exc)) from None

    @staticmethod
    def _ack(group: str, topic: str, handle: ReceiptHandle) -> RemotingCommand:
        """ACK_MESSAGE of the message ``handle`` names, in ``topic`` (its real one)."""
        return RemotingCommand.request(RequestCode.ACK_MESSAGE, ack_header(group, topic, handle))

    @staticmethod
    def _handle_topic(handle: ReceiptHandle, group: str, topic: str) -> str:
        """The topic the handle's message is in: the one asked, or its pop retry topic."""
        return topic if handle.kind == "0" else pop_retry_topic(group, topic)

    def _handle_refusal(self, response: RemotingCommand) -> pb.Status:
        """A refused ack or change: a handle no longer in flight is INVALID_RECEIPT_HANDLE."""
        if response.code in (ResponseCode.NO_MESSAGE, ResponseCode.MESSAGE_ILLEGAL):
            return status(pb.INVALID_RECEIPT_HANDLE, response.remark or "")
        return self._refusal(response)

    async def change_invisible_duration(
        self, request: spb.ChangeInvisibleDurationRequest, call: Call
    ) -> Any:
        group, topic = request.group.name, request.topic.name
        text = await self.renewals.current(request.receipt_handle)
        try:
            handle = self._handle(text)
            header = change_invisible_header(
                group,
                self._handle_topic(handle, group, topic),
                handle,
                millis(request.invisible_duration),
            )
            response = await self._ask(
                call, RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header)
            )
        except Refused as exc:
            return spb.ChangeInvisibleDurationResponse(status=status(exc.code, exc.message))
        if response.code != ResponseCode.SUCCESS:
            return spb.ChangeInvisibleDurationResponse(status=self._handle_refusal(response))
        answer = response.header(ChangeInvisibleTimeResponseHeader)
        return spb.ChangeInvisibleDurationResponse(
            status=status(pb.OK), receipt_handle=str(changed_handle(handle, answer))
        )

    async def forward_to_dead_letter_queue(
        self, request: spb.ForwardMessageToDeadLetterQueueRequest, call: Call
    ) -> Any:
        """The message goes to the group's DLQ (a send-back past every retry), then is
        acked, as RocketMQ's proxy does it."""
        group, topic = request.group.name, request.topic.name
        text = await self.renewals.current(request.receipt_handle)
        try:
            handle = self._handle(text)
            real_topic = self._handle_topic(handle, group, topic)
            queue = self.ctx.store.consume_queue(real_topic, handle.queue_id)
            entry = queue.entry(handle.offset) if queue is not None else None
            if entry is None:
                raise Refused(pb.INVALID_RECEIPT_HANDLE, "the message is no longer stored")
            header = ConsumerSendMsgBackRequestHeader(
                offset=entry[0],
                group=group,
                delay_level=-1,
                origin_msg_id=request.message_id,
                origin_topic=topic,
                max_reconsume_times=request.max_delivery_attempts or None,
            )
            response = await self._ask(
                call, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header)
            )
            if response.code != ResponseCode.SUCCESS:
                return spb.ForwardMessageToDeadLetterQueueResponse(status=self._refusal(response))
            await self._ask(call, self._ack(group, real_topic, handle))
        except Refused as exc:
            return spb.ForwardMessageToDeadLetterQueueResponse(status=status(exc.code, exc.message))
        return spb.ForwardMessageToDeadLetterQueueResponse(status=status(pb.OK))

"""hamq's client: producers, consumers and administration, Trio-native.

- producer.py       Producer: send, send_oneway, send_async, send_batch, ordered sends
- consumer.py       PullConsumer, and the pull/offset requests both consumers make
- push_consumer.py  PushConsumer: a consumer group member with rebalancing
- admin.py          AdminClient: topics, routes, clusters
- instance.py       what they share: nameservers, routes, heartbeats
- route_cache.py    routes to queues (pure); rebalance.py: queue allocation (pure)
- message.py        Message, SendResult, PullResult, ConsumeResult ...
- blocking.py       the same, for code that is not async (a Trio thread behind it)

For code that is not async, ``hamq.client.blocking`` offers the same classes.
"""

from hamq.client.admin import AdminClient, QueueStatus
from hamq.client.consumer import PullConsumer
from hamq.client.errors import (
    BrokerError,
    ClientError,
    InvalidArgumentError,
    NameServerUnavailableError,
    NoRouteError,
    SendError,
)
from hamq.client.instance import ClientConfig
from hamq.client.message import (
    ConsumeResult,
    Message,
    MessageExt,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from hamq.client.producer import Producer, hash_selector
from hamq.client.push_consumer import ConsumeFrom, PushConsumer, PushConsumerStatistics
from hamq.protocol.bodies import MessageQueue

__all__ = [
    "AdminClient",
    "BrokerError",
    "ClientConfig",
    "ClientError",
    "ConsumeFrom",
    "ConsumeResult",
    "InvalidArgumentError",
    "Message",
    "MessageExt",
    "MessageQueue",
    "NameServerUnavailableError",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerStatistics",
    "QueueStatus",
    "SendError",
    "SendResult",
    "SendStatus",
    "hash_selector",
]

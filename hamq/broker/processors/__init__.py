"""Request processors of the broker, one module per family of request codes.

- send.py         SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, CONSUMER_SEND_MSG_BACK
- pull.py         PULL_MESSAGE, with long polling
- clients.py      heartbeats, consumer lists, queue locks, offsets; 222/223 for operators
- transaction.py  END_TRANSACTION
- admin.py        topics, the tables a slave copies, messages by key or id, statistics
"""

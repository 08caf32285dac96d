"""The records a pull returns undecoded, for clients that read them themselves.

``PullConsumer.caller.pull(..., decode=False)`` leaves a FOUND answer's records as the
broker sent them, back to back in ``PullResult.raw`` (docs/PROTOCOL.md#pulling,
docs/PROTOCOL.md#commitlog-record): a reader that turns many records into columns at
once (hamq.spark) walks them by their fixed start (``RECORD_HEAD``: TOTALSIZE MAGIC
BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG, 40 bytes), reads fields at
their offsets, and hands anything irregular to ``read_record``, which names what is
wrong in a ``MessageFormatError``.

Nothing is defined here: these are the record format's own names (hamq.protocol.record,
and hamq.protocol.message for the names inside a record) and the client's compression
bits (hamq.client.message), in one public place.
"""

from hamq.client.message import COMPRESSION_TYPE_MASK, COMPRESSION_ZLIB
from hamq.protocol.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6,
    MessageFormatError,
    decode_properties,
    offset_msg_id,
    unpack_host,
)
from hamq.protocol.record import MAGIC_V1, MAGIC_V2, RECORD_HEAD, RecordInfo, read_record

__all__ = [
    "COMPRESSION_TYPE_MASK",
    "COMPRESSION_ZLIB",
    "MAGIC_V1",
    "MAGIC_V2",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_KEYS",
    "PROPERTY_SEPARATOR",
    "PROPERTY_TAGS",
    "PROPERTY_UNIQ_KEY",
    "RECORD_HEAD",
    "SYSFLAG_BORNHOST_V6",
    "SYSFLAG_COMPRESSED",
    "SYSFLAG_STOREHOST_V6",
    "MessageFormatError",
    "RecordInfo",
    "decode_properties",
    "offset_msg_id",
    "read_record",
    "unpack_host",
]

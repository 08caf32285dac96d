"""Secret: a text that never shows itself (an ACL secret key, a broker group's HA secret).

One type for every secret a configuration holds, in the bottom layer so that acl/, ha/
and the broker's configuration share it. ``str()``, ``repr()`` and formatting give
``******`` (an empty secret, which means "none", stays empty), so a configuration
holding one can be printed, logged or served (GET_BROKER_CONFIG) safely. Not a ``str``
subclass: a ``str`` gives its text away to concatenation, ``json.dumps`` and ``join``;
this one only to ``reveal()`` and ``encode()``, which are easy to find. Deliberately
not an attrs class either: code that walks attrs fields (the broker's live
configuration) must see a leaf, not a field to print.
"""

from __future__ import annotations

import hmac


class Secret:
    """A secret text: ``reveal()`` is the text, ``encode()`` its bytes (key material,
    for an HMAC); everything else shows ``MASK``. Equal, in constant time, to a Secret
    or a str of the same text."""

    __slots__ = ("_text",)
    _text: str

    MASK = "******"

    def __init__(self, text: str | Secret) -> None:
        if isinstance(text, Secret):
            text = text.reveal()
        if not isinstance(text, str):
            raise TypeError(f"a secret is a string, not {type(text).__name__}")
        self._text = text

    def reveal(self) -> str:
        return self._text

    def encode(self, encoding: str = "utf-8") -> bytes:
        return self._text.encode(encoding)

    def __bool__(self) -> bool:
        return bool(self._text)

    def __str__(self) -> str:
        return self.MASK if self._text else ""

    def __repr__(self) -> str:
        return f"Secret({str(self)!r})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Secret):
            other = other._text
        if not isinstance(other, str):
            return NotImplemented
        return hmac.compare_digest(self._text.encode(), other.encode())

    def __hash__(self) -> int:
        return hash(self._text)

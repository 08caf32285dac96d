"""Permissions of RocketMQ's ACL 1.0 (acl/common/Permission.java): the bits and their words.

    DENY 1   nothing, whatever else is set
    ANY  2   (needed side only) PUB or SUB will do
    PUB  4   send to a topic
    SUB  8   consume a topic; for a group: be a member of it (pull, offsets, heartbeat)

In a plain_acl.yml the words are ``PUB``, ``SUB``, ``PUB|SUB`` (or ``SUB|PUB``) and
``DENY``; anything else is refused with the words allowed (RocketMQ reads an unknown
word as DENY without saying so).
"""

from __future__ import annotations

import enum


class Perm(enum.IntFlag):
    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_WORDS = {
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
    "DENY": Perm.DENY,
}
ALLOWED_WORDS = "PUB, SUB, PUB|SUB or DENY"


def parse_perm(text: str) -> Perm:
    """``text`` as a permission; ValueError naming the allowed words."""
    perm = _WORDS.get(text.strip().replace(" ", ""))
    if perm is None:
        raise ValueError(f"permission {text!r} is not one of {ALLOWED_WORDS}")
    return perm


def allows(owned: Perm, needed: Perm) -> bool:
    """Whether ``owned`` grants ``needed`` (Permission.checkPermission)."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


def perm_text(perm: Perm) -> str:
    """``PUB``, ``SUB``, ``PUB|SUB`` or ``DENY``, for messages."""
    if perm & Perm.DENY:
        return "DENY"
    words = [name for name, bit in (("PUB", Perm.PUB), ("SUB", Perm.SUB)) if perm & bit]
    return "|".join(words) or "ANY"

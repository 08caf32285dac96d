"""RocketMQ 5's request signature over gRPC: the ``authorization`` header.

A signed call carries ``x-mq-date-time`` (``20231010T101010Z``) and::

    authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                   Signature=<hex HMAC-SHA1 of the date-time, keyed by the secret key>

``verify`` checks it against the ACL's accounts and returns the account's credentials;
the endpoint then signs the remoting request it makes with them, so the ACL guard
decides the rights exactly as for a remoting client (hamq/acl). The date is not checked
against the clock: a client whose clock is off is not refused (RocketMQ's proxy does
not either). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac

from hamq.acl import AclTable, Credentials

SCHEME = "MQv2-HMAC-SHA1"
DATE_TIME = "x-mq-date-time"


class AuthError(Exception):
    """A signature that is malformed, of an unknown account, or wrong."""


def parse(value: str) -> tuple[str, str]:
    """(access key, signature) of an ``authorization`` value; AuthError if malformed."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise AuthError(f"authorization is not {SCHEME} (got {scheme[:40]!r})")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, field = part.strip().partition("=")
        if not sep:
            raise AuthError(f"authorization field {part.strip()[:40]!r} is not key=value")
        fields[key] = field.strip()
    access_key, signature = fields.get("Credential", ""), fields.get("Signature", "")
    if not access_key or not signature:
        raise AuthError("authorization lacks Credential or Signature")
    return access_key.split("/", 1)[0], signature


def _anonymous(value: str) -> bool:
    """A client without credentials still sends the header, its Credential empty (the
    official Python client, 5.1.2): an unsigned call."""
    return "Credential=," in value.replace(" ", "") or value.rstrip().endswith("Credential=")


def sign(secret_key: str, date_time: str) -> str:
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def verify(metadata: dict[str, str], table: AclTable) -> Credentials | None:
    """The credentials of a signed call; None for an unsigned one, or one whose
    Credential is empty (the ACL guard then decides by its whitelist); AuthError for a
    bad signature."""
    value = metadata.get("authorization")
    if value is None or _anonymous(value):
        return None
    access_key, signature = parse(value)
    account = table.accounts.get(access_key)
    if account is None:
        raise AuthError(f"no account for AccessKey {access_key[:40]!r}")
    date_time = metadata.get(DATE_TIME)
    if not date_time:
        raise AuthError(f"a signed call needs {DATE_TIME}")
    expected = sign(account.secret_key, date_time)
    if not hmac.compare_digest(expected, signature.lower()):
        raise AuthError(f"signature check failed for AccessKey {access_key}")
    return Credentials(access_key, account.secret_key)

"""The account table, read from a plain_acl.yml (RocketMQ ACL 1.0's file format).

::

    globalWhiteRemoteAddresses:      # requests from these pass unchecked
      - 10.10.103.*
    accounts:
      - accessKey: RocketMQ          # more than 6 characters, unique
        secretKey: 12345678          # more than 6 characters
        whiteRemoteAddress:          # requests naming this key from here pass unchecked
        admin: false                 # may use the admin codes (create topic, register ...)
        defaultTopicPerm: DENY       # for topics not listed below (absent: DENY)
        defaultGroupPerm: SUB        # for groups not listed below (absent: DENY)
        topicPerms:
          - topicA=DENY
          - topicB=PUB|SUB
        groupPerms:
          - groupA=SUB

Every scalar is read as text (YAML's BaseLoader): ``secretKey: 012345678`` is that text,
not a number. RocketMQ's own ``dataVersion`` key is allowed and ignored; any other
unknown key is an error. An empty file is an error too (it is what a half-written file
looks like), so a reload never mistakes one for "no accounts".

Pure but for ``load_acl_file``, which reads the file. Errors are ``AclFileError``, one
line naming the file, the place in it and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from hamq.acl.addresses import NOTHING, AddressPattern, parse_pattern
from hamq.acl.permission import Perm, parse_perm

#: RocketMQ's AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH: longer than this
KEY_MIN_LENGTH = 6

_TOP_KEYS = ("globalWhiteRemoteAddresses", "accounts", "dataVersion")
_ACCOUNT_KEYS = (
    "accessKey",
    "secretKey",
    "whiteRemoteAddress",
    "admin",
    "defaultTopicPerm",
    "defaultGroupPerm",
    "topicPerms",
    "groupPerms",
)
_BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


class AclFileError(ValueError):
    """An ACL file that cannot be used; the text names the file and the problem."""


@attrs.frozen
class Account:
    access_key: str
    secret_key: str = attrs.field(repr=False)
    white_remote_address: AddressPattern = NOTHING
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: Mapping[str, Perm] = attrs.field(factory=dict)
    group_perms: Mapping[str, Perm] = attrs.field(factory=dict)

    def topic_perm(self, topic: str) -> Perm:
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> Perm:
        return self.group_perms.get(group, self.default_group_perm)

    @property
    def lists_resources(self) -> bool:
        return bool(self.topic_perms or self.group_perms)


@attrs.frozen
class AclTable:
    global_white: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = attrs.field(factory=dict)


class _Problem(ValueError):
    """A problem at a place in the document (the caller adds the file's name)."""


def _text(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Problem(
            f"{where} must be text, not a {'list' if isinstance(value, list) else 'map'}"
        )
    return value.strip()


def _list(value: object, where: str) -> list[str]:
    """A YAML list of scalars (an empty value is an empty list)."""
    if value is None or value == "":
        return []
    if not isinstance(value, list):
        raise _Problem(f"{where} must be a list")
    return [_text(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _pattern(text: str, where: str) -> AddressPattern:
    try:
        return parse_pattern(text)
    except ValueError as exc:
        raise _Problem(f"{where}: {exc}") from None


def _perm(text: str, where: str, default: Perm) -> Perm:
    if not text:
        return default
    try:
        return parse_perm(text)
    except ValueError as exc:
        raise _Problem(f"{where}: {exc}") from None


def _resource_perms(value: object, where: str) -> dict[str, Perm]:
    perms: dict[str, Perm] = {}
    for i, item in enumerate(_list(value, where)):
        name, equals, perm = item.partition("=")
        if not equals or not name.strip() or not perm.strip() or "=" in perm:
            raise _Problem(f"{where}[{i}] {item!r} is not name=PERM (for example topicA=SUB)")
        perms[name.strip()] = _perm(perm, f"{where}[{i}]", Perm.DENY)
    return perms


def _boolean(value: object, where: str) -> bool:
    text = _text(value, where).lower()
    if not text:
        return False
    if text not in _BOOLEANS:
        raise _Problem(f"{where} must be true or false, not {text!r}")
    return _BOOLEANS[text]


def _key(value: object, where: str) -> str:
    text = _text(value, where)
    if not text:
        raise _Problem(f"{where} is missing")
    if len(text) <= KEY_MIN_LENGTH:
        raise _Problem(f"{where} must be longer than {KEY_MIN_LENGTH} characters (RocketMQ's rule)")
    return text


def _account(raw: object, where: str) -> Account:
    if not isinstance(raw, dict):
        raise _Problem(f"{where} must be a map of accessKey, secretKey, ...")
    unknown = sorted(set(raw) - set(_ACCOUNT_KEYS))
    if unknown:
        raise _Problem(f"{where}: unknown key(s) {', '.join(unknown)}")
    access_key = _key(raw.get("accessKey"), f"{where}.accessKey")
    where = f"{where} (accessKey {access_key})"
    return Account(
        access_key=access_key,
        secret_key=_key(raw.get("secretKey"), f"{where}.secretKey"),
        white_remote_address=_pattern(
            _text(raw.get("whiteRemoteAddress"), f"{where}.whiteRemoteAddress"),
            f"{where}.whiteRemoteAddress",
        ),
        admin=_boolean(raw.get("admin"), f"{where}.admin"),
        default_topic_perm=_perm(
            _text(raw.get("defaultTopicPerm"), f"{where}.defaultTopicPerm"),
            f"{where}.defaultTopicPerm",
            Perm.DENY,
        ),
        default_group_perm=_perm(
            _text(raw.get("defaultGroupPerm"), f"{where}.defaultGroupPerm"),
            f"{where}.defaultGroupPerm",
            Perm.DENY,
        ),
        topic_perms=_resource_perms(raw.get("topicPerms"), f"{where}.topicPerms"),
        group_perms=_resource_perms(raw.get("groupPerms"), f"{where}.groupPerms"),
    )


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what and where."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"not valid YAML: {problem} (line {mark.line + 1}, column {mark.column + 1})"
    return f"not valid YAML: {problem}"


def _table(document: Any) -> AclTable:
    if document is None or document == "":
        raise _Problem("is empty (no accounts, no globalWhiteRemoteAddresses)")
    if not isinstance(document, dict):
        raise _Problem("must be a map with globalWhiteRemoteAddresses and accounts")
    unknown = sorted(set(document) - set(_TOP_KEYS))
    if unknown:
        raise _Problem(
            f"unknown key(s) {', '.join(unknown)}; only globalWhiteRemoteAddresses and accounts"
        )
    white = tuple(
        _pattern(text, f"globalWhiteRemoteAddresses[{i}]")
        for i, text in enumerate(
            _list(document.get("globalWhiteRemoteAddresses"), "globalWhiteRemoteAddresses")
        )
        if text
    )
    raw_accounts = document.get("accounts")
    if raw_accounts is None or raw_accounts == "":
        raw_accounts = []
    if not isinstance(raw_accounts, list):
        raise _Problem("accounts must be a list")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        account = _account(raw, f"accounts[{i}]")
        if account.access_key in accounts:
            raise _Problem(f"accounts[{i}]: accessKey {account.access_key} is listed twice")
        accounts[account.access_key] = account
    return AclTable(white, accounts)


def parse_acl(text: str, source: str) -> AclTable:
    """The table in ``text`` (a plain_acl.yml's content); ``source`` names it in errors."""
    try:
        document = yaml.load(text, Loader=yaml.BaseLoader)  # every scalar a str
    except yaml.YAMLError as exc:
        raise AclFileError(f"{source}: {_yaml_problem(exc)}") from None
    try:
        return _table(document)
    except _Problem as exc:
        raise AclFileError(f"{source}: {exc}") from None


def load_acl_file(path: Path) -> AclTable:
    """Read and parse ``path``; AclFileError if it cannot be read or used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AclFileError(f"ACL file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AclFileError(f"ACL file {path}: cannot read it ({reason})") from None
    return parse_acl(text, f"ACL file {path}")

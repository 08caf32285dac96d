"""ACL test material: the accounts every ACL test starts from, and writing an ACL file
as an editor saves it (a new inode, so a reload sees it)."""

from __future__ import annotations

import os
from pathlib import Path

from hamq.acl import Credentials

BROKER = Credentials("hamq-broker", "broker-secret")
ADMIN = Credentials("admin-key", "admin-secret")
APP = Credentials("app-key1", "app-secret")
#: the accounts every test starts from: the broker's own (admin), an operator, and an
#: application that may send to and consume Demo as group G, nothing else
ACCOUNTS = """\
globalWhiteRemoteAddresses: {white}
accounts:
  - accessKey: hamq-broker
    secretKey: broker-secret
    admin: true
  - accessKey: admin-key
    secretKey: admin-secret
    admin: true
  - accessKey: app-key1
    secretKey: app-secret
    whiteRemoteAddress: {app_white}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Demo=PUB|SUB
{extra_topics}    groupPerms:
      - G=SUB
"""


def acl_text(white: str = "[]", app_white: str = "", extra_topics: tuple[str, ...] = ()) -> str:
    extra = "".join(f"      - {item}\n" for item in extra_topics)
    return ACCOUNTS.format(white=white, app_white=app_white, extra_topics=extra)


def write_acl(path: Path, text: str) -> Path:
    """Write ``text`` whole under a new inode (as editors save), so a reload sees it."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    os.replace(temp, path)
    return path

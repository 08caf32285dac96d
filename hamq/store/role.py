"""The broker's role as the store and the HA service read it: they keep no copy.

In a broker, hamq/broker/roles.py owns the role and is the ``RoleReader`` it hands to
the store (``MessageStore.use_role``) and the HA service (``HAService.use_role``): the
store takes puts and runs the delayed-message scheduler only while ``is_master``, the
HA service serves slaves only while ``serves_slaves``. A store outside a broker (tests,
benchmarks, tools) reads a ``ConfiguredRole``: its configured role, changed only by
whoever holds it.
"""

from __future__ import annotations

from typing import Protocol

import attrs


class RoleReader(Protocol):
    @property
    def is_master(self) -> bool:
        """Does this broker take sends (and deliver delayed messages) now?"""

    @property
    def serves_slaves(self) -> bool:
        """Does this broker's HA service serve slaves now?"""


@attrs.define
class ConfiguredRole:
    """A role set by its holder, not by a broker (a store on its own)."""

    is_master: bool

    @property
    def serves_slaves(self) -> bool:
        return self.is_master

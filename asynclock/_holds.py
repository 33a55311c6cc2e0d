"""Who holds what in one client: the table re-entry and the read-write rules read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._lease import Lease
    from .abc import LockRef

__all__ = ["Holds"]


class Holds:
    """Each lock (as held for re-entry) → owner → its lease; the reads each owner joined to its
    write hold; and each multi-lock (its names) → owner → its lease."""

    __slots__ = ("_joined", "_leases", "multis")

    def __init__(self) -> None:
        self._leases: dict[LockRef, dict[str, Lease]] = {}
        # (read-write lock name, owner) -> read acquisitions joined to that owner's write hold
        self._joined: dict[tuple[str, str], int] = {}
        #: (a multi-lock's names, owner) -> its MultiLease, while held (for re-entry and release)
        self.multis: dict[tuple[tuple[str, ...], str], Any] = {}

    def get(self, key: LockRef, owner: str) -> Lease | None:
        """The lease ``owner`` holds of ``key``, if any (it may have been lost meanwhile)."""
        owners = self._leases.get(key)
        return None if owners is None else owners.get(owner)

    def add(self, lease: Lease) -> None:
        self._leases.setdefault(lease._key, {})[lease.owner] = lease

    def remove(self, lease: Lease) -> None:
        """``lease`` is held no more (released, lost, abandoned): forget it, and the reads joined to it."""
        key = lease._key
        if key.kind == "write":
            self._joined.pop((lease.name, lease.owner), None)
        owners = self._leases.get(key)
        if owners is not None and owners.get(lease.owner) is lease:
            del owners[lease.owner]
            if not owners:
                del self._leases[key]

    def joined(self, name: str, owner: str) -> int:
        """How many reads of the read-write lock ``name`` ``owner`` joined to its write hold."""
        return self._joined.get((name, owner), 0)

    def join(self, name: str, owner: str) -> None:
        self._joined[name, owner] = self._joined.get((name, owner), 0) + 1

    def unjoin(self, name: str, owner: str) -> None:
        left = self._joined[name, owner] - 1
        if left:
            self._joined[name, owner] = left
        else:
            del self._joined[name, owner]

"""The lock recipes on etcd: key layout and ordering rules, without I/O.

Every primitive is a queue of *contender keys* under a directory (a key
prefix), each attached to the client's lease and ordered by its create
revision (etcd's global, ever-growing revision counter at the key's
creation). A contender is created by a transaction that puts it only if it
does not exist (``create_revision == 0``), so sending that request again
after an unknown outcome finds the key instead of making a second one.
A waiter reads, in one transaction, that its key still exists and what
blocks it (:attr:`Contender.blocker`), and watches only that for deletion.

The plain lock is exactly the Mutex of etcd's Go client
(``client/v3/concurrency``), which ``etcdctl lock`` uses too:

* the lock ``name`` has the Mutex prefix ``<base>/<escaped name>`` (its
  :func:`Layout.lock_key`), and the contender of a client is
  ``<prefix>/<lease id in lowercase hex>``;
* it is created by ``Txn(If(create_revision(key) == 0),
  Then(Put(key, "", lease), Get(prefix/, first by create revision)),
  Else(Get(key), Get(prefix/, first by create revision)))``: the owner is the
  key with the lowest create revision, so an uncontended lock takes one
  round trip;
* a waiter waits for the deletion of the key with the largest create
  revision below its own (``Get(prefix/, last by create revision,
  max_create_revision = mine - 1)``), reads again, and so on;
* release deletes the key.

So ``etcdctl lock <lock key>`` and Go's ``concurrency.NewMutex(session,
"<lock key>")`` queue on the same keys as asynclock. The Mutex keys a
contender by its lease: one key per client and name. asynclock's owners are
tasks, so the tasks of one client take turns for that key in the client
(the backend's local queue), and each turn creates the key anew (a new
create revision, so a new fencing token, and a place at the end of etcd's
queue, behind the other clients that queued meanwhile).

An election is etcd's ``concurrency.Election`` (``etcdctl elect`` uses it):
the Mutex's rules on the prefix ``<base>/%election/<escaped name>``
(:func:`Layout.election_key`), the candidate's key
``<prefix>/<lease id in hex>`` holding its identity (Go's proposal) from
its creation on. The candidate with the lowest create revision leads; the
others wait for the deletion of the one just before them, as for the Mutex.
So ``etcdctl elect <election key> <proposal>`` and Go's
``concurrency.NewElection(session, "<election key>")`` campaign in the same
line as asynclock's candidates, and each sees the other's identity.

The read-write lock follows the RWMutex of etcd's Go recipes
(``client/v3/experimental/recipes``): under ``<base>/%rw/<escaped name>/``,
readers are ``read/<key>`` and writers ``write/<key>``; a writer waits for
the last key of any kind created before it, a reader for the last writer
created before it. So a waiting writer keeps later readers out.

The semaphore is Curator's InterProcessSemaphoreV2 on etcd (there is none in
etcd's Go client): under ``<base>/%semaphore/<escaped name>/``, a contender
first takes the mutex ``locks/`` (the Mutex rule, with a key per
acquisition), then puts its ``leases/<key>`` and holds once at most
``permits`` leases were created up to its own; the one waiter that holds the
mutex watches the ``leases/`` range for deletions (no herd), and lets the
mutex go once it holds. A lease key holds ``asynclock permits=<N>``, the
permits its client asked for: a contender that holds the mutex, before it
puts its lease key, reads the first one, and refuses (ValueError) a number
that differs; every lease key was checked that way under the mutex, so the
first speaks for them all.

Fencing token: the create revision of the key that holds. Revisions are
etcd's, persisted with its data; they grow with every write of the whole
cluster and never go back (across restarts and leader changes), and a new
holder's key was created after its predecessor's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from ._replies import KeyValue, RangeResult
from ._wire import ASCEND, DESCEND, SORT_CREATE, Compare, Op, delete_request, prefix_end, txn_request

__all__ = ["Contender", "Layout", "candidate", "escape_name", "unescape_name"]

#: Directories under the base for the read-write locks and the semaphores. A
#: ``%`` followed by letters that are not hex digits is never made by
#: :func:`escape_name`, so no lock name can be one of them.
RW_DIR = "%rw"
SEM_DIR = "%semaphore"
ELECTION_DIR = "%election"
RESERVED = (RW_DIR, SEM_DIR, ELECTION_DIR)


def _unsafe(char: str) -> bool:
    code = ord(char)
    # "/" would nest one lock's prefix in another's (the Mutex takes every key
    # under its prefix as a contender); control characters make keys unreadable
    return char in "%/" or code < 0x20 or code == 0x7F


def escape_name(name: str) -> str:
    """``name`` as one path segment of a key: ``%``, ``/`` and control
    characters percent-encoded (their UTF-8 bytes); distinct names give distinct segments."""
    if name.isprintable() and "%" not in name and "/" not in name:
        return name  # (a printable name has no control character: nothing to encode)
    return "".join(f"%{ord(c):02X}" if _unsafe(c) else c for c in name)


def unescape_name(segment: str) -> str:
    """The lock name of a key segment made by :func:`escape_name`."""
    from urllib.parse import unquote

    return unquote(segment, errors="strict")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a client's locks live: ``base`` is ``[<URL path>/]<prefix>``."""

    base: str

    def lock_key(self, name: str) -> str:
        """The Mutex prefix of the plain lock ``name``: what ``etcdctl lock`` is given."""
        return f"{self.base}/{escape_name(name)}"

    def rw_key(self, name: str) -> str:
        return f"{self.base}/{RW_DIR}/{escape_name(name)}"

    def semaphore_key(self, name: str) -> str:
        return f"{self.base}/{SEM_DIR}/{escape_name(name)}"

    def election_key(self, name: str) -> str:
        """The Election prefix of the election ``name``: what ``etcdctl elect`` is given."""
        return f"{self.base}/{ELECTION_DIR}/{escape_name(name)}"

    @property
    def root(self) -> bytes:
        """The prefix of every key of this layout."""
        return f"{self.base}/".encode()


#: Given the answer to the blocker request: whether the contender holds, and
#: otherwise the key (or range: key, range_end) whose deletion to wait for.
Decide = Callable[[RangeResult], tuple[bool, tuple[bytes, bytes] | None]]


@dataclass(frozen=True, slots=True)
class Contender:
    """One contender key of a queue, under one lease, and the rules it waits by."""

    #: the queue: every key under it takes part
    dir: bytes
    #: our key
    key: bytes
    #: the lease the key is attached to
    lease: int
    #: the request that finds what blocks a contender whose create revision is the argument
    blocker: Callable[[int], Op]
    #: whether a contender holds, given the blocker's answer, or what it waits for
    decide: Decide
    #: whether the creating transaction also reads the queue's first key (the
    #: Mutex does: an uncontended lock is then one round trip)
    reads_owner: bool = False
    #: what our key holds (an election candidate's identity; a lock's key is empty)
    value: bytes = b""
    #: the creating transaction (:meth:`creating`), encoded once
    create: bytes = field(init=False, repr=False)
    #: the request that deletes our key, encoded once
    remove: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "create", txn_request(*self.creating()))
        object.__setattr__(self, "remove", delete_request(self.key))

    def creating(self) -> tuple[list[Compare], list[Op], list[Op]]:
        """The transaction that puts our key unless it exists; either way it reads it
        (and the first contender, for the Mutex)."""
        absent = Compare(self.key, target=1, result=0, value=0)  # create_revision == 0
        owner = [self.first()] if self.reads_owner else []
        return [absent], [Op.put(self.key, self.value, lease=self.lease), *owner], [Op.range(self.key), *owner]

    def first(self) -> Op:
        """The queue's first contender (lowest create revision)."""
        return Op.range(self.dir, prefix_end(self.dir), limit=1, sort_order=ASCEND, sort_target=SORT_CREATE)


def last_before(directory: bytes) -> Callable[[int], Op]:
    """The blocker of the Mutex rule: the last key of ``directory`` created before ours."""
    end = prefix_end(directory)

    def blocker(revision: int) -> Op:
        return Op.range(
            directory,
            end,
            limit=1,
            sort_order=DESCEND,
            sort_target=SORT_CREATE,
            max_create_revision=revision - 1,
        )

    return blocker


def _wait_for_it(answer: RangeResult) -> tuple[bool, tuple[bytes, bytes] | None]:
    """Holds when nothing blocks; otherwise waits for the deletion of the key found."""
    if not answer.kvs:
        return True, None
    return False, (answer.kvs[0].key, b"")


@lru_cache(maxsize=1024)
def mutex(lock_key: str, lease: int) -> Contender:
    """The contender of etcd's ``concurrency.Mutex`` for the client with ``lease`` (the
    same for every turn of the client's tasks at that lock: made once)."""
    directory = f"{lock_key}/".encode()
    key = directory + f"{lease:x}".encode()
    return Contender(directory, key, lease, last_before(directory), _wait_for_it, reads_owner=True)


def candidate(election_key: str, lease: int, identity: str) -> Contender:
    """A candidate of etcd's ``concurrency.Election`` for the client with ``lease``: the
    Mutex's key and rules, the key holding ``identity``."""
    directory = f"{election_key}/".encode()
    key = directory + f"{lease:x}".encode()
    return Contender(
        directory, key, lease, last_before(directory), _wait_for_it, reads_owner=True, value=identity.encode()
    )


def _unique(lease: int, serial: int) -> str:
    return f"{lease:x}_{serial}"


def writer(rw_key: str, lease: int, serial: int) -> Contender:
    """A writer of the read-write lock: waits for the last key of any kind before it."""
    directory = f"{rw_key}/".encode()
    key = directory + f"write/{_unique(lease, serial)}".encode()
    return Contender(directory, key, lease, last_before(directory), _wait_for_it)


def reader(rw_key: str, lease: int, serial: int) -> Contender:
    """A reader of the read-write lock: waits for the last writer before it."""
    directory = f"{rw_key}/".encode()
    key = directory + f"read/{_unique(lease, serial)}".encode()
    return Contender(directory, key, lease, last_before(directory + b"write"), _wait_for_it)


def semaphore_mutex(sem_key: str, lease: int, serial: int) -> Contender:
    """The semaphore's mutex (the Mutex rule, one key per acquisition)."""
    directory = f"{sem_key}/locks/".encode()
    key = directory + _unique(lease, serial).encode()
    return Contender(directory, key, lease, last_before(directory), _wait_for_it, reads_owner=True)


#: What a semaphore's lease key holds before the number of permits its client asked for.
_PERMITS = b"asynclock permits="


def permits_of(value: bytes) -> int | None:
    """The permits a semaphore's lease key records, or None (one that records none)."""
    if not value.startswith(_PERMITS):
        return None
    try:
        return int(value[len(_PERMITS) :])
    except ValueError:
        return None


def semaphore_lease(sem_key: str, lease: int, serial: int, permits: int) -> Contender:
    """A semaphore lease: holds once at most ``permits`` leases were created up to it; its
    key records ``permits``."""
    directory = f"{sem_key}/leases/".encode()
    key = directory + _unique(lease, serial).encode()
    end = prefix_end(directory)

    def blocker(revision: int) -> Op:
        return Op.range(directory, end, count_only=True, max_create_revision=revision)

    def decide(answer: RangeResult) -> tuple[bool, tuple[bytes, bytes] | None]:
        if answer.count <= permits:
            return True, None
        return False, (directory, end)

    return Contender(directory, key, lease, blocker, decide, value=_PERMITS + str(permits).encode())


def rw_holders(contenders: list[KeyValue], rw_key: str) -> list[KeyValue]:
    """Who holds a read-write lock: the first key if a writer, else the readers before the first writer."""
    writers = f"{rw_key}/write".encode()
    holders: list[KeyValue] = []
    for kv in contenders:
        if kv.key.startswith(writers):
            return holders or [kv]
        holders.append(kv)
    return holders

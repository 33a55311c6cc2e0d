"""The exception tree.

::

    LockError
     ├── LockTimeout          (also TimeoutError)   acquire ran out of time
     ├── LockLost                                   a held lease expired, was taken, or
     │    │                                         could not be renewed before its deadline
     │    └── StaleToken                            a fenced write refused: a newer holder wrote
     │                                              first, or the lease was known lost
     ├── NotHeld                                    release by someone who holds nothing
     ├── BackendUnavailable   (also ConnectionError) the server could not be reached in time
     └── ConfigurationError                         what no retry can fix: authentication or
                                                    permission refused, no such database,
                                                    a TLS certificate refused

Bad arguments raise ``ValueError`` / ``TypeError`` before any I/O.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable
from typing import TypeVar

from ._values import LossReason
from .abc import Backend, Located


class LockError(Exception):
    """Base class of every error asynclock raises on purpose.

    Catch it to handle every lock failure at one place::

        try:
            async with locks.lock("report"):
                await build_report()
        except asynclock.LockError as exc:
            log.warning("report skipped: %s", exc)
    """


class LockTimeout(LockError, TimeoutError):
    """``acquire(timeout=...)`` ran out of time before the lock became free.

    Also a ``TimeoutError``. ``name`` is the lock's name and ``timeout`` the
    seconds it waited. ``timeout=0`` raises it at once when the lock is taken::

        try:
            lease = await lock.acquire(timeout=0)
        except asynclock.LockTimeout:
            return "busy, try later"
    """

    def __init__(self, name: str, timeout: float | None) -> None:
        super().__init__(f"timed out after {timeout}s waiting for lock {name!r}")
        self.name = name
        self.timeout = timeout


class LockLost(LockError):
    """A held lease expired, was taken, or could not be renewed before its deadline.

    Raised from the ``async with`` block whose body was cancelled because of
    the loss (and by a re-entry of a lease known to be lost). ``name`` is the
    lock's name, ``reason`` says what happened and ``loss`` says it in a word
    (a :class:`LossReason`)::

        try:
            async with locks.lock("report"):
                await build_report()
        except asynclock.LockLost as lost:
            log.warning("stopped: %s (%s)", lost.reason, lost.loss)
    """

    def __init__(self, name: str, reason: str, loss: LossReason | None = None) -> None:
        super().__init__(f"lock {name!r} lost: {reason}")
        self.name = name
        self.reason = reason
        #: why, in a word (None when not known)
        self.loss = loss


class StaleToken(LockLost):
    """A fenced write refused: a newer holder of the lock already wrote to the
    resource, or the writer's lease was already known to be lost.

    Raised by :mod:`asynclock.fencing` (``RedisFence.call``,
    ``PostgresFence.advance``) instead of running the write. ``resource`` is
    what the fence guards (also ``name``), ``token`` the refused token and
    ``mark`` the highest token that wrote to the resource (None when the
    lease was known lost and nothing was asked of the store). Being a
    :class:`LockLost`, it ends the work of a holder that lost its lock::

        try:
            await fence.call(lease, "SET", "report:today", body)
        except StaleToken as stale:
            log.warning("not written: %s", stale.reason)
    """

    def __init__(self, resource: str, token: int, mark: int | None = None, reason: str | None = None) -> None:
        if reason is None:
            reason = f"a newer holder (token {mark}) already wrote to it"
        LockError.__init__(self, f"stale token {token} for {resource!r}: {reason}")
        self.name = resource
        self.resource = resource
        self.reason = reason
        self.loss = LossReason.TAKEN_OR_EXPIRED if mark is not None else None
        self.token = token
        self.mark = mark

    def __reduce__(self) -> tuple[type[StaleToken], tuple[str, int, int | None, str]]:
        return (type(self), (self.resource, self.token, self.mark, self.reason))


class NotHeld(LockError):
    """A release by an owner that does not hold the lock (never acquired, already
    released, or the lease was lost); nothing changes on the server then.

    Raised by ``lock.release()`` and ``lease.release()``. ``name`` is the lock's name.
    """

    def __init__(self, name: str, detail: str = "the current owner does not hold it") -> None:
        super().__init__(f"lock {name!r} not held: {detail}")
        self.name = name


class BackendUnavailable(LockError, ConnectionError):
    """The lock server could not be reached, or did not answer, within the operation's time.

    Also a ``ConnectionError``. The message names the server's address and
    the cause ("connection refused", "name not resolved", "timed out after
    2.0 s"). Raised by ``acquire`` (after retrying for its timeout, or for a
    ttl when it has none), ``release`` and ``info``; a server that refuses
    the connection outright gives up after ``connect_timeout``.
    """

    #: Set by a backend when no connection could be made at all (refused,
    #: name not resolved, connect timed out): its ``connect_timeout``, after
    #: which a caller that keeps retrying gives up instead of after a ttl.
    connect_timeout: float | None = None
    #: False when the backend already retried for as long as retrying can help
    #: (a wait whose server stayed silent): the caller gives up at once.
    retryable: bool = True


class ConfigurationError(LockError):
    """What no retry can fix: the server refused this client's configuration.

    Authentication or permission refused, a database index out of range, a
    ZooKeeper chroot or ACL refusal, a TLS certificate error. Raised at once
    from the first operation that meets it (an ``acquire`` that would wait
    forever too); a waiter never retries it. The message names the server's
    address (never a password) and quotes the server's own words.
    """


E = TypeVar("E", bound=BaseException)


def shown_as(public: type[LockError]) -> Callable[[type[E]], type[E]]:
    """Class decorator for a backend's own exception, a subclass of the public class ``public``
    (which is what callers catch): it shows itself as ``asynclock.<public>`` in reprs and
    tracebacks, so that no message names a private module's class."""

    def reduce(self: BaseException) -> tuple[object, ...]:
        # (pickled as the public class: the name it shows is the public class's)
        return public, self.args, self.__dict__ or None

    def present(cls: type[E]) -> type[E]:
        cls.__module__ = "asynclock"
        cls.__name__ = cls.__qualname__ = public.__name__
        cls.__reduce__ = reduce  # type: ignore[assignment,method-assign]
        return cls

    return present


def server_of(backend: Backend) -> str:
    """How messages name ``backend``'s server: its ``where``, or ``"the <scheme> server"``."""
    return backend.where if isinstance(backend, Located) else f"the {backend.scheme} server"


def unavailable(exc: BaseException, where: str = "the lock server") -> LockError:
    """``exc`` as a caller sees it: a ConfigurationError or BackendUnavailable as it is, anything else
    (a timeout, a socket error, another error of the server's) as BackendUnavailable, in words,
    naming ``where`` (the server, e.g. ``"Redis at 10.0.0.5:6379"``) when the error does not."""
    if isinstance(exc, (BackendUnavailable, ConfigurationError)):
        return exc
    if isinstance(exc, LockError):
        return BackendUnavailable(str(exc) or f"{where} did not answer")
    if isinstance(exc, TimeoutError):
        said = str(exc)
        return BackendUnavailable(f"{where} did not answer in time" + (f": {said}" if said else ""))
    return BackendUnavailable(f"{where}: {plain(exc)}")


#: A class name's words: ``ConnectionLoss`` → ``connection loss``.
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def plain(exc: BaseException) -> str:
    """What ``exc`` says went wrong, in words fit for a message: never its class or its repr.

    An error with a message gives its message; a socket's error says its cause
    (``"connection refused"``, ``"name not resolved"``, ``"timed out"``); one with
    no message says what its kind means (a client library's ``ConnectionLoss()``:
    ``"connection loss"``).
    """
    if isinstance(exc, socket.gaierror):
        return "name not resolved"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (asyncio.IncompleteReadError, EOFError)):
        return "the connection closed before the answer came"
    said = str(exc)
    if isinstance(exc, TimeoutError):
        return said or "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    if said and not isinstance(exc, KeyError):
        return said
    words = _CAMEL.sub(" ", type(exc).__name__.lstrip("_")).lower()
    return words.removesuffix(" error") or "an error"

"""The exception tree.

::

    LockError
     ├── LockTimeout          (also TimeoutError)   acquire ran out of time
     ├── LockLost                                   a held lease expired, was taken, or
     │                                              could not be renewed before its deadline
     ├── NotHeld                                    release by someone who holds nothing
     ├── BackendUnavailable   (also ConnectionError) the server could not be reached in time
     └── ConfigurationError                         what no retry can fix: authentication or
                                                    permission refused, no such database,
                                                    a TLS certificate refused

Bad arguments raise ``ValueError`` / ``TypeError`` before any I/O.
"""

from __future__ import annotations

from ._values import LossReason


class LockError(Exception):
    """Base class of every error asynclock raises on purpose."""


class LockTimeout(LockError, TimeoutError):
    """``acquire`` ran out of time before the lock became free."""

    def __init__(self, name: str, timeout: float | None) -> None:
        super().__init__(f"timed out after {timeout}s waiting for lock {name!r}")
        self.name = name
        self.timeout = timeout


class LockLost(LockError):
    """A held lease expired, was taken, or could not be renewed before its deadline.

    Raised from the ``async with`` block whose body was cancelled because of the loss.
    """

    def __init__(self, name: str, reason: str, loss: LossReason | None = None) -> None:
        super().__init__(f"lock {name!r} lost: {reason}")
        self.name = name
        self.reason = reason
        #: why, in a word (None when not known)
        self.loss = loss


class NotHeld(LockError):
    """Release (or re-entry) by an owner that does not hold the lock."""

    def __init__(self, name: str, detail: str = "the current owner does not hold it") -> None:
        super().__init__(f"lock {name!r} not held: {detail}")
        self.name = name


class BackendUnavailable(LockError, ConnectionError):
    """The lock server could not be reached within the operation's time."""

    #: Set by a backend when no connection could be made at all (refused,
    #: name not resolved, connect timed out): its ``connect_timeout``, after
    #: which a caller that keeps retrying gives up instead of after a ttl.
    connect_timeout: float | None = None


class ConfigurationError(LockError):
    """What no retry can fix: the server refused this client's configuration.

    Authentication or permission refused, a database index out of range, a
    ZooKeeper chroot or ACL refusal, a TLS certificate error. Raised at once
    from the first operation that meets it (an ``acquire`` that would wait
    forever too); a waiter never retries it. The message names the server's
    address (never a password) and quotes the server's own words.
    """


def unavailable(exc: BaseException) -> LockError:
    """``exc`` as a caller sees it: a ConfigurationError or BackendUnavailable as it is, anything else
    (a timeout, a socket error) as BackendUnavailable."""
    if isinstance(exc, (BackendUnavailable, ConfigurationError)):
        return exc
    return BackendUnavailable(f"lock server did not answer in time: {exc!r}")

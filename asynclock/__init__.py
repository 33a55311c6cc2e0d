"""asynclock: asyncio-native distributed locks that cancel the holder when the lease is lost."""

from ._client import Locks as Locks
from ._connect import connect as connect
from ._election import Election as Election
from ._election import Term as Term
from ._errors import BackendUnavailable as BackendUnavailable
from ._errors import ConfigurationError as ConfigurationError
from ._errors import LockError as LockError
from ._errors import LockLost as LockLost
from ._errors import LockTimeout as LockTimeout
from ._errors import NotHeld as NotHeld
from ._lease import Lease as Lease
from ._lock import Lock as Lock
from ._lock import ReadLock as ReadLock
from ._lock import RWLock as RWLock
from ._lock import Semaphore as Semaphore
from ._lock import WriteLock as WriteLock
from ._multi import MultiLease as MultiLease
from ._multi import MultiLock as MultiLock
from ._singleton import JobRun as JobRun
from ._singleton import Singleton as Singleton
from ._values import Health as Health
from ._values import Leader as Leader
from ._values import LockEvent as LockEvent
from ._values import LockInfo as LockInfo
from ._values import LossReason as LossReason

__version__ = "0.1.0"


def _present_as_public() -> None:
    """Public classes say they are ``asynclock.X`` (in reprs, tracebacks and docs), not the private module."""
    for name in __all__:
        value = globals()[name]
        if isinstance(value, type) and value.__module__.startswith("asynclock._"):
            value.__module__ = __name__


__all__ = [
    "BackendUnavailable",
    "ConfigurationError",
    "Election",
    "Health",
    "JobRun",
    "Leader",
    "Lease",
    "Lock",
    "LockError",
    "LockEvent",
    "LockInfo",
    "LockLost",
    "LockTimeout",
    "Locks",
    "LossReason",
    "MultiLease",
    "MultiLock",
    "NotHeld",
    "RWLock",
    "ReadLock",
    "Semaphore",
    "Singleton",
    "Term",
    "WriteLock",
    "__version__",
    "connect",
]

_present_as_public()

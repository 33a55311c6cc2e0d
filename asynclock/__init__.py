"""asynclock: asyncio-native distributed locks that cancel the holder when the lease is lost."""

from ._connect import connect as connect
from ._errors import BackendUnavailable as BackendUnavailable
from ._errors import ConfigurationError as ConfigurationError
from ._errors import LockError as LockError
from ._errors import LockLost as LockLost
from ._errors import LockTimeout as LockTimeout
from ._errors import NotHeld as NotHeld
from ._lease import Lease as Lease
from ._locks import Lock as Lock
from ._locks import Locks as Locks
from ._locks import ReadLock as ReadLock
from ._locks import RWLock as RWLock
from ._locks import Semaphore as Semaphore
from ._locks import WriteLock as WriteLock
from ._values import LockEvent as LockEvent
from ._values import LockInfo as LockInfo

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "ConfigurationError",
    "Lease",
    "Lock",
    "LockError",
    "LockEvent",
    "LockInfo",
    "LockLost",
    "LockTimeout",
    "Locks",
    "NotHeld",
    "RWLock",
    "ReadLock",
    "Semaphore",
    "WriteLock",
    "__version__",
    "connect",
]

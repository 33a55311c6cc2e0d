"""asyncpg's errors translated into asynclock's, in one place (the backend's edge).

What the server refuses for good (a password, a role or database that does
not exist, permission denied on the fence table or its schema, an unknown
server setting, a TLS certificate) becomes ConfigurationError, quoting the
server; a server that cannot be reached, BackendUnavailable naming the
address and why; any other server error, LockError. No message names a
password, and the original error is kept as ``__cause__``. One translate
function (:meth:`Translation.translate`) does it, entered around requests by
the backends' shared edge (``Translation.edge``, a ``MapErrors``).
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Sequence

import asyncpg

from ..._errors import BackendUnavailable, ConfigurationError, LockError, plain
from ..._options import mask_text
from .._edge import MapErrors

__all__ = ["CLIENT_ERRORS", "EDGE_ERRORS", "Translation"]

#: Everything asyncpg (and the socket under it) raises.
CLIENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
#: What the edge hands to ``translate``: the client's errors, and the AttributeError asyncpg
#: raises when the connection is ended between a statement's prepare and its run
#: (``translate`` passes any other AttributeError through unchanged).
EDGE_ERRORS: tuple[type[BaseException], ...] = (*CLIENT_ERRORS, AttributeError)

#: Server errors that no retry fixes: the server refused this client's configuration.
_REFUSED: tuple[type[BaseException], ...] = (
    asyncpg.InvalidAuthorizationSpecificationError,  # 28000: no such role, pg_hba.conf; 28P01: password
    asyncpg.InvalidCatalogNameError,  # 3D000: no such database
    asyncpg.InsufficientPrivilegeError,  # 42501: permission denied (the fence table, its schema)
    asyncpg.InvalidSchemaNameError,  # 3F000: table= names a schema that does not exist
    asyncpg.UndefinedObjectError,  # 42704: e.g. an unknown server setting in the URL
    asyncpg.CantChangeRuntimeParamError,  # 55P02: a server setting that cannot be set per session
    asyncpg.InvalidParameterValueError,  # 22023: a bad value for a server setting
)

#: Errors that say the server or the connection to it is gone or not there yet.
_UNREACHABLE: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    OSError,
    TimeoutError,
)


def _cause(exc: BaseException) -> str:
    """Why a request or a connection attempt failed, in a few words."""
    if isinstance(exc, socket.gaierror):
        return "name not resolved"
    if isinstance(exc, ConnectionRefusedError) or (
        # (asyncio's "Multiple exceptions" of a name with several addresses)
        isinstance(exc, OSError) and exc.errno is None and f"[Errno {errno.ECONNREFUSED}]" in str(exc)
    ):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return plain(exc)


def _hint(exc: BaseException, table: str) -> str:
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return (
            f" (this role needs SELECT, INSERT, UPDATE and DELETE on the fence table {table} and on"
            f" {table}_queue (elections: on {table}_leaders too), USAGE and UPDATE on the sequence"
            f" {table}_token (PostgreSQL 15+), and CREATE on their schema while they do not exist;"
            " table= chooses another name)"
        )
    return ""


def _closed_under(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside a method of an asyncpg connection that is closed now."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if str(frame.f_globals.get("__name__", "")).startswith("asyncpg."):  # (only asyncpg's frames are read)
            conn = frame.f_locals.get("self")
            if isinstance(conn, asyncpg.Connection) and conn.is_closed():
                return True
        tb = tb.tb_next
    return False


class Translation:
    """The backend's translate function and what its messages name; ``edge`` enters it around requests.

    One instance per backend. Messages name the server's address and never a password.
    """

    __slots__ = ("address", "edge", "secrets", "table")

    def __init__(self, address: str = "?", secrets: Sequence[str] = (), table: str = "") -> None:
        self.address = address
        self.secrets = tuple(secrets)
        self.table = table
        #: ``with``/``async with`` around a request: its client errors raised translated.
        self.edge = MapErrors(self.translate, EDGE_ERRORS)

    def translate(self, exc: BaseException) -> BaseException:
        """``exc`` as asynclock raises it (the caller keeps the original as ``__cause__``)."""
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, AttributeError):
            # asyncpg, when the connection is ended (the client closing, a dead
            # server) after a statement was prepared and before it ran
            return self.unavailable("the session was closed during a request") if _closed_under(exc) else exc
        where = f"PostgreSQL at {self.address}"
        if isinstance(exc, _REFUSED):
            return ConfigurationError(self.mask(f"{where} refused: {exc}{_hint(exc, self.table)}"))
        if isinstance(exc, ssl.SSLCertVerificationError):
            return ConfigurationError(self.mask(f"{where}: TLS certificate refused: {exc.verify_message or exc}"))
        if isinstance(exc, asyncpg.ClientConfigurationError):
            return ConfigurationError(self.mask(f"bad connection settings for {where}: {exc}"))
        if isinstance(exc, _UNREACHABLE):
            return BackendUnavailable(self.mask(f"{where}: {_cause(exc)}"))
        if isinstance(exc, asyncpg.PostgresError):
            return LockError(self.mask(f"{where}: {plain(exc)}"))
        return exc

    def unavailable(self, what: str) -> BackendUnavailable:
        """A BackendUnavailable that says where, and ``what`` happened."""
        return BackendUnavailable(f"PostgreSQL at {self.address}: {what}")

    def mask(self, text: str) -> str:
        return mask_text(text, self.secrets)

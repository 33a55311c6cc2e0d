"""asyncmy's errors translated into asynclock's, in one place (the backend's edge).

What the server refuses for good (a password, a user, a database this user
may not use, a privilege on the fence table it lacks, an authentication
method the client cannot do) becomes ConfigurationError, quoting the server;
a server that cannot be reached, or a connection that closed (the session
killed, the server restarted), BackendUnavailable naming the address and
why; any other server error, LockError. No message names a password, and the
original error is kept as ``__cause__``.
"""

from __future__ import annotations

import errno
import re
import ssl
from collections.abc import Sequence

from asyncmy import errors as my

from ..._errors import BackendUnavailable, ConfigurationError, LockError
from ..._options import mask_text
from .._edge import MapErrors

__all__ = ["CLIENT_ERRORS", "CONNECTION_LOST", "Translation", "code"]

#: Everything asyncmy (and the socket under it) raises.
CLIENT_ERRORS: tuple[type[BaseException], ...] = (my.MySQLError, OSError, TimeoutError)

#: Server errors that no retry fixes: the server refused this client's configuration.
_REFUSED = frozenset(
    {
        1044,  # access denied to the database (also: it does not exist, for a user that may not see it)
        1045,  # access denied (user or password)
        1049,  # unknown database
        1142,  # a command denied on a table (the fence table)
        1143,  # a command denied on a column
        1227,  # a privilege needed for this operation
        1251,  # the client cannot do the server's authentication method
        1698,  # access denied (an authentication plugin refused)
        1820,  # the password must be changed first
        1862,  # the password has expired
        2059,  # an authentication plugin the client cannot load
        3118,  # the account is locked
        4151,  # the account is locked (MariaDB)
    }
)
#: Client and server errors that say the server, or the connection to it, is gone or not there yet.
_UNREACHABLE = frozenset(
    {
        1040,  # too many connections
        1053,  # the server is shutting down
        1077,  # normal shutdown
        1152,  # aborted connection
        1158,  # error reading communication packets
        1159,  # read timeout
        1160,  # error writing communication packets
        1161,  # write timeout
        1927,  # the connection was killed (MariaDB)
        2002,  # cannot connect through the socket
        2003,  # cannot connect (refused, unresolved)
        2005,  # unknown host
        2006,  # the server has gone away
        2013,  # lost the connection during a query
        2055,  # lost the connection
    }
)
#: The client errors asyncmy raises when a connection it had closed (or lost): the session is gone.
CONNECTION_LOST = frozenset({2006, 2013, 2055, 1927, 1053, 1077, 1152, 1158, 1159, 1160, 1161})


def code(exc: BaseException) -> int | None:
    """The MySQL error number of an asyncmy error (None: not one, or without a number)."""
    if isinstance(exc, my.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return int(exc.args[0])
    return None


def _message(exc: BaseException) -> str:
    if isinstance(exc, my.MySQLError) and len(exc.args) >= 2:
        return str(exc.args[1])
    return str(exc) or type(exc).__name__


def _cause(exc: BaseException) -> str:
    """Why a request or a connection attempt failed, in a few words."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    text = _message(exc)
    if re.search(r"\[Errno -[23]\]|Name or service not known|nodename nor servname", text):
        return "name not resolved"
    if f"[Errno {errno.ECONNREFUSED}]" in text or "Connect call failed" in text:
        return "connection refused"
    if "timed out" in text.lower() or "TimeoutError" in text:
        return "timed out"
    if code(exc) in (2006, 2013, 2055):
        return "the connection closed (the session was ended or the server went away)"
    return text


def _hint(number: int | None, table: str) -> str:
    if number in (1142, 1143, 1227):
        return (
            f" (this user needs SELECT, INSERT and UPDATE on the fence table {table}, and CREATE on its"
            " database while the table does not exist; table= chooses another name)"
        )
    return ""


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
        self.edge = MapErrors(self.translate, CLIENT_ERRORS)

    def translate(self, exc: BaseException) -> BaseException:
        """``exc`` as asynclock raises it (the caller keeps the original as ``__cause__``)."""
        if isinstance(exc, LockError):
            return exc
        where = f"MySQL at {self.address}"
        number = code(exc)
        if number in _REFUSED:
            return ConfigurationError(
                self.mask(f"{where} refused: ({number}) {_message(exc)}{_hint(number, self.table)}")
            )
        if isinstance(exc, ssl.SSLCertVerificationError):
            return ConfigurationError(self.mask(f"{where}: TLS certificate refused: {exc.verify_message or exc}"))
        if (
            number in _UNREACHABLE
            or isinstance(exc, (my.InterfaceError, OSError, TimeoutError))
            or (isinstance(exc, my.OperationalError) and number is None)
        ):
            return self.unavailable(_cause(exc))
        if isinstance(exc, my.MySQLError):
            return LockError(self.mask(f"{where}: ({number}) {_message(exc)}"))
        return exc

    def unavailable(self, what: str) -> BackendUnavailable:
        """A BackendUnavailable that says where, and ``what`` happened."""
        return BackendUnavailable(self.mask(f"MySQL at {self.address}: {what}"))

    def mask(self, text: str) -> str:
        return mask_text(text, self.secrets)

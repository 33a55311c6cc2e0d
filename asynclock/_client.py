"""Locks: the client. It makes the handles and owns the :class:`~asynclock._core.Core`
they share (the backend, the one LeaseKeeper, the one WakeHub, the holds);
what happens to a lease outside an acquire is the core's work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from ._break import break_lock
from ._closing import close
from ._core import CLIENT_CLOSED, CLIENT_CLOSING, Core
from ._election import Election
from ._errors import BackendUnavailable, LockError, plain, server_of, unavailable
from ._events import EventCallback
from ._lock import Lock, RWLock, Semaphore
from ._multi import MultiLock
from ._options import DEFAULT_CONNECT_TIMEOUT, seconds
from ._singleton import Singleton, make_singleton
from ._timing import REQUEST_WINDOW
from ._validate import check_max_hold, check_name, check_names, check_ttl
from ._values import Health, LockInfo
from .abc import Backend, LockRef

__all__ = ["EventCallback", "Locks"]

#: The lock whose state ``health()`` reads (a read: nothing is taken or changed).
_PROBE = "asynclock-health"

P = ParamSpec("P")
R = TypeVar("R")


class Locks:
    """A client of one lock service: the factory of ``Lock`` handles.

    Made by :func:`asynclock.connect`. Use it as an async context manager (or
    call :meth:`aclose`); leaving it releases every lease it still holds, stops
    its watchdog and listener, and closes what it opened. Every call on a
    closed client raises ``RuntimeError("client is closed")``.

    Example::

        async with asynclock.connect("redis://localhost:6379/0") as locks:
            async with locks.lock("orders:42") as lease:
                ...
    """

    def __init__(
        self,
        backend: Backend,
        *,
        ttl: float = 30.0,
        on_event: EventCallback | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self._core = Core(backend, check_ttl(ttl), on_event, close)
        self._connect_timeout = seconds(connect_timeout, "connect_timeout")

    def __repr__(self) -> str:
        return f"<Locks {self._core.backend.scheme} client={self.client_id}>"

    @property
    def client_id(self) -> str:
        """This client's id: the start of every hold id it makes, as ``info().owner`` and events show."""
        return self._core.client_id

    @property
    def backend(self) -> Any:
        """The backend (for tests and tools)."""
        return self._core.backend

    @property
    def ttl(self) -> float:
        """The default lease time of this client's locks, in seconds."""
        return self._core.ttl

    @property
    def guarantees(self) -> frozenset[str]:
        """What the backend guarantees as configured, in words: ``"fencing"``, ``"fifo"``, ``"reentrant"``,
        ``"notifications"``, ``"survives_failover"``, ``"session"``, ``"interop"`` (what each means, and the
        table of every backend: "Testing and guarantees" in the documentation). No I/O."""
        return frozenset(getattr(self._core.backend, "guarantees", ()))

    def lock(self, name: str, *, ttl: float | None = None, fair: bool = False, max_hold: float | None = None) -> Lock:
        """A handle on the lock ``name``; cheap, no I/O.

        ``fair=True`` makes it FIFO: waiters get it in the order their acquire
        reached the server, a new acquire (even ``timeout=0``) never jumps the
        queue, and a release wakes only the next in line. A fair and a plain
        lock of the same name are different locks on backends whose plain lock
        is not FIFO already.

        ``max_hold`` (seconds, default None) caps one hold however well it
        renews: a hold that lasts that long loses its lease (the body is
        cancelled and its ``async with`` raises :class:`LockLost` with
        ``reason="max_hold"``) and the lock is released. It is the guard
        against a body that wedges (a stuck call) and would keep the lock for
        as long as its task lives.

        Raises TypeError / ValueError for a bad name, ttl or max_hold, and
        NotImplementedError when the backend has no fair lock.
        """
        self._core.check_open()
        if not isinstance(fair, bool):
            raise TypeError(f"fair must be a bool, not {type(fair).__name__}")
        ref = LockRef("fair" if fair else "lock", check_name(name))
        return Lock(self._core, ref, self._core.check_ttl(ttl), max_hold=check_max_hold(max_hold))

    def rw_lock(self, name: str, *, ttl: float | None = None, max_hold: float | None = None) -> RWLock:
        """A read-write lock: ``.read`` may be held by many tasks at once, ``.write`` by one.

        A waiting writer keeps new readers out, so a stream of readers cannot
        starve it. The holder of ``.write`` may also take ``.read`` (it joins
        the write hold); taking ``.write`` while holding only ``.read`` raises
        :class:`LockError` instead of deadlocking. ``max_hold`` caps each hold
        of either side, as for :meth:`lock`. Cheap, no I/O.
        """
        self._core.check_open()
        return RWLock(self._core, check_name(name), self._core.check_ttl(ttl), check_max_hold(max_hold))

    def semaphore(
        self, name: str, *, permits: int, ttl: float | None = None, max_hold: float | None = None
    ) -> Semaphore:
        """A semaphore: at most ``permits`` tasks, across every client, hold it at once.

        Each holder has its own lease (watchdog, fencing token, loss →
        cancellation); a holder that dies gives its permit back when its lease
        runs out. Every client of a name must use the same ``permits``: an
        acquire that asks with another number than the current users' raises
        ValueError. ``max_hold`` caps each holder's hold, as for :meth:`lock`.
        Cheap, no I/O.
        """
        self._core.check_open()
        if isinstance(permits, bool) or not isinstance(permits, int):
            raise TypeError(f"permits must be an int, not {type(permits).__name__}")
        if not 1 <= permits <= 100_000:
            raise ValueError(f"permits must be between 1 and 100000, got {permits}")
        return Semaphore(self._core, check_name(name), self._core.check_ttl(ttl), permits, check_max_hold(max_hold))

    def multi(self, names: Iterable[str], *, ttl: float | None = None, max_hold: float | None = None) -> MultiLock:
        """The plain locks ``names`` taken together, all or none, in sorted order, under one lease
        whose loss (of any part) cancels the body and releases the rest; a repeated name counts
        once. ``ttl`` and ``max_hold`` (of the whole) as for :meth:`lock`. Cheap, no I/O; TypeError /
        ValueError for one string, a bad name or no name. See :class:`~asynclock.MultiLock`."""
        self._core.check_open()
        return MultiLock(self._core, check_names(names), self._core.check_ttl(ttl), check_max_hold(max_hold))

    def election(self, name: str, *, identity: str | None = None, ttl: float | None = None) -> Election:
        """A leader election among every client that names it; cheap, no I/O.

        ``identity`` is what ``leader()``, ``observe()`` and ``asynclock
        inspect`` show for this candidate (default: ``host:pid:task`` of the
        task that enters ``leadership()``); ``ttl`` the lease time of a
        term. Raises NotImplementedError when the backend has no elections,
        TypeError / ValueError for a bad name, identity or ttl.
        """
        self._core.check_open()
        return Election(self._core, check_name(name), identity, self._core.check_ttl(ttl))

    def singleton(
        self, name: str, *, at_most: float, at_least: float = 0.0, ttl: float | None = None
    ) -> Callable[[Callable[P, Awaitable[R]]], Singleton[P, R]]:
        """A decorator: the async function runs on one replica at a time, at most once per ``at_least`` seconds.

        Calling the decorated function runs it here, unless another replica
        runs it or started it less than ``at_least`` seconds ago (it returns
        None then); ``at_most`` cancels a run that lasts longer. The job holds
        the lock ``name`` (``locks.lock(name)`` is that lock). See
        :class:`~asynclock.Singleton`. Raises TypeError / ValueError for bad
        arguments (``at_least`` above ``at_most`` too), before any I/O.

        Example::

            @locks.singleton("nightly-report", at_most=600, at_least=60)
            async def nightly_report() -> None: ...
        """
        self._core.check_open()
        return make_singleton(self._core, lambda: self.lock(name, ttl=ttl), at_most, at_least)

    async def check(self, name: str, token: int) -> bool:
        """Whether ``token`` is the fencing token of the hold the server has now on the plain lock ``name``.

        One read. False when the lock is free, never used, or held by a hold
        with another token (an older holder's token is never current again).
        A downstream service that is sent a token can call it before acting
        on the sender's behalf; the fences of :mod:`asynclock.fencing` make
        the same judgement inside the store's own write.

        Raises TypeError / ValueError for a bad name or token before any I/O,
        :class:`BackendUnavailable` when the server cannot be read, and
        NotImplementedError on a backend without fencing tokens (Redlock).

        Example::

            if not await locks.check("orders:42", token):
                raise PermissionError("that lease is over")
        """
        self._core.check_open()
        ref = LockRef("lock", check_name(name))
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"token must be an int, not {type(token).__name__}")
        no_tokens = f"{self._core.backend.scheme}:// gives no fencing tokens to check"
        declared = getattr(self._core.backend, "guarantees", None)
        if declared is not None and "fencing" not in declared:
            raise NotImplementedError(no_tokens)
        info = await Lock(self._core, ref, self._core.ttl).info()
        if info.owner is not None and info.token is None and declared is None:
            raise NotImplementedError(no_tokens)  # (with tokens declared, a holder without one is a foreign client's)
        return info.owner is not None and info.token == token

    async def break_lock(self, name: str, *, owner: str | None = None) -> LockInfo | None:
        """Force-release the plain lock ``name``, whoever holds it: the way out of a stuck lock.

        The lock goes to the next waiter, with a larger fencing token. The
        holder finds out at its next renewal at the latest (sooner where the
        backend can tell it, at once for this client's own hold) and its
        ``async with`` body is cancelled with :class:`LockLost`; until then
        only fencing tokens protect the data. Each break is logged at WARNING,
        naming the holder. ``owner`` (as ``info().owner`` shows it) breaks
        only that hold. Returns the :class:`LockInfo` of the hold it broke;
        None if nobody (or not ``owner``) held it, or the holder let go
        meanwhile. How each backend breaks a lock: the operations page.

        Example::

            broken = await locks.break_lock("nightly-report")
        """
        return await break_lock(self._core, name, owner)

    async def __aenter__(self) -> Locks:
        try:
            await self._reach()
        except BaseException:
            # A block that was never entered is never left: close what the start opened.
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def open(self) -> Locks:
        """Connect now (what entering ``async with`` does): returns the client once the server answered.

        Raises :class:`BackendUnavailable` when no server could be reached
        within the connect timeout, :class:`ConfigurationError` when the server
        refuses this client's configuration (its credentials, say). A client
        that is used without being opened connects on its first use (and
        then waits out a server that is away, as every later request does).
        """
        await self._reach()
        return self

    async def _reach(self) -> None:
        """Start the client and make one round trip, within the connect timeout: a server that is
        not there, or refuses this client, is told now rather than at the first acquire."""
        core = self._core
        # (a backend bounds its own connecting by the connect timeout, and says more of why
        # it failed than this bound can: it gets a request window more to say it)
        bound = self._connect_timeout + REQUEST_WINDOW
        try:
            async with asyncio.timeout(bound):
                await core.start()
                await core.backend.info(LockRef("lock", _PROBE))
        except TimeoutError:
            raise BackendUnavailable(f"{server_of(core.backend)} did not answer within {bound:g} s") from None
        except (LockError, OSError) as exc:
            error = unavailable(exc, server_of(core.backend))
            if error is exc:
                raise
            raise error from exc

    async def health(self) -> Health:
        """How this client is doing, for readiness and liveness probes; never raises.

        One round trip to the backend (connecting first, on a client not used
        yet), bounded by the connect timeout: ``ok`` and its ``latency``, or
        the ``error``; and ``held`` and ``at_risk``, the leases this client
        holds and those of them whose last renewal failed.

        Example::

            health = await locks.health()
            status = 200 if health.ok else 503
        """
        core = self._core
        keeper = core.keeper
        leases = keeper.holds() if keeper is not None else []
        held, at_risk = len(leases), sum(lease.at_risk for lease in leases)
        if core.closed or core.closing:
            return Health(False, None, held, at_risk, CLIENT_CLOSED if core.closed else CLIENT_CLOSING)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await core.start()
                await core.backend.info(LockRef("lock", _PROBE))
        except TimeoutError:
            error = f"{server_of(core.backend)} did not answer within {self._connect_timeout:g} s"
            return Health(False, None, held, at_risk, error)
        except Exception as exc:  # noqa: BLE001 (a probe never raises: what went wrong is its answer)
            return Health(False, None, held, at_risk, plain(exc))
        return Health(True, loop.time() - started, held, at_risk, None)

    async def aclose(self, drain: float | None = None) -> None:
        """Release every held lease, stop the watchdog and listeners, close connections.

        Without ``drain`` the bodies running under this client's leases are
        cancelled at once (their ``async with`` raises :class:`LockLost`) and
        acquires still waiting raise :class:`BackendUnavailable`. With
        ``drain=S`` (seconds) the client first stops taking work: new acquires
        and acquires waiting in a queue raise ``RuntimeError("client is
        closing")``, while bodies already running get up to ``S`` seconds to
        finish; those still running then are cancelled (``LockLost`` with
        ``reason="closing"``). Then every hold is released, each lock handed to
        its next waiter, a leader's term to the next candidate.

        A client never closed is closed this way (without a drain) when its
        event loop shuts down, as ``asyncio.run`` ends, and logs what it
        released; a process killed outright leaves its holds to expire.

        Example (a worker's SIGTERM)::

            loop.add_signal_handler(signal.SIGTERM, stop.set)
            await stop.wait()
            await locks.aclose(drain=10)
        """
        if drain is not None:
            drain = seconds(drain, "drain", allow_zero=True)
        await self._core.close(drain)

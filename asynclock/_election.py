"""Leader election: ``locks.election(name)``, built on the lease machinery.

A candidate is a hold of ``LockRef("election", name, identity=...)``, taken by
the acquisition engine like any lock: the server queues candidates in the
order they asked (the backend's election is FIFO), the watchdog renews the
leader's hold, a loss cancels the body of ``async with election.leadership()``
and raises ``LockLost`` from it, a cancelled candidacy leaves nothing behind,
and a task that ends while it leads gives leadership up at once (abandoned).
What only an election has: the identity kept with the hold, ``leader()`` and
``observe()`` (the backend's :class:`~asynclock.abc.Elects` capability), and
``resign()``, which ends a term on purpose: the body is cancelled and the
``async with`` ends without an exception.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import cast

import anyio

from ._core import Core
from ._errors import BackendUnavailable, ConfigurationError, LockError, LockLost, NotHeld, server_of, unavailable
from ._lease import Lease
from ._lock import Lock
from ._owner import current_owner
from ._release import release_by_identity
from ._timing import Backoff, request_window
from ._validate import check_timeout
from ._values import Leader, LockInfo, LossReason
from .abc import Elects, LeaderWatch, LockRef, unsupported

logger = logging.getLogger("asynclock")

__all__ = ["Election", "Term", "check_identity", "default_identity"]

#: Longest identity accepted, in characters.
MAX_IDENTITY_LENGTH = 1024


def check_identity(identity: object) -> str:
    """A candidate's identity: a non-empty str of at most 1024 characters of valid unicode."""
    if not isinstance(identity, str):
        raise TypeError(f"identity must be str, not {type(identity).__name__}")
    if not identity:
        raise ValueError("identity must not be empty")
    if len(identity) > MAX_IDENTITY_LENGTH:
        raise ValueError(f"identity is {len(identity)} characters long; the limit is {MAX_IDENTITY_LENGTH}")
    try:
        identity.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"identity is not valid unicode text: {exc}") from None
    return identity


def default_identity() -> str:
    """``host:pid:task`` of the running task: who leads, in words an operator can follow."""
    task = asyncio.current_task()
    return f"{socket.gethostname()}:{os.getpid()}:{task.get_name() if task is not None else '-'}"


class Term:
    """One term of leadership: what ``async with election.leadership() as term`` gives.

    ``token`` is the term's fencing token (strictly greater than every earlier
    term's of that election: pass it to what the leader writes to),
    ``identity`` the leader's identity, ``since`` the wall-clock time
    (``time.time()``) at which this candidate became leader. ``lease`` is the
    hold behind it (``lease.lost``, ``lease.remaining``,
    ``await lease.wait_at_risk()``).
    """

    __slots__ = ("identity", "lease", "name", "since", "token")

    def __init__(self, name: str, identity: str, lease: Lease) -> None:
        self.name = name
        self.identity = identity
        self.lease = lease
        self.token = lease.token
        self.since = time.time()

    def __repr__(self) -> str:
        state = "lost" if self.lease.lost else "leading"
        return f"<Term {self.name!r} identity={self.identity!r} token={self.token} {state}>"

    @property
    def lost(self) -> bool:
        """Whether leadership was lost (the body is cancelled then)."""
        return self.lease.lost


class Election:
    """A leader election; made by ``locks.election(name, identity=...)``, no I/O.

    Candidates wait in line, in the order they asked: ``async with
    election.leadership() as term`` returns once this candidate leads, and
    only one candidate of the name leads at a time. Leading is holding a
    lease: if it is lost (the process stalls past its ttl, the session
    expires) the body is cancelled and :class:`LockLost` is raised from the
    ``async with``. ``await election.resign()`` ends the term on purpose and
    lets the next candidate lead. Anybody, candidate or not, can ask who leads
    (``await election.leader()``) or follow every change
    (``async for leader in election.observe()``).

    Example::

        election = locks.election("scheduler", identity="replica-7")
        async with election.leadership() as term:
            await run_scheduler(fencing_token=term.token)

    Raises NotImplementedError (when made) on a backend without elections.
    """

    __slots__ = ("_core", "_identity", "_ref", "_resigned", "_terms", "name", "ttl")

    def __init__(self, core: Core, name: str, identity: str | None, ttl: float) -> None:
        backend = core.backend
        backend.check_kind("election")  # (a backend without elections may say why)
        if not isinstance(backend, Elects):
            raise unsupported(backend.scheme, "election", "see the docs' backends table for those that have it")
        self._core = core
        self.name = name
        self.ttl = ttl
        self._identity = None if identity is None else check_identity(identity)
        self._ref = LockRef("election", name)
        # terms entered through this handle and not left yet, by lease (re-entry shares one)
        self._terms: dict[Lease, Term] = {}
        # hold ids of terms being resigned: their bodies end without LockLost
        self._resigned: set[str] = set()

    def __repr__(self) -> str:
        return f"<Election {self.name!r} identity={self._identity!r} ttl={self.ttl}>"

    @property
    def identity(self) -> str | None:
        """The identity given to ``locks.election`` (None: each candidate task's ``host:pid:task``)."""
        return self._identity

    @property
    def key(self) -> str:
        """The backend's own name for the election (znode path, key), for other tools."""
        return self._core.backend.lock_key(self._ref)

    @property
    def leading(self) -> bool:
        """Whether the current task leads through this handle, as far as this client knows."""
        me = current_owner()
        return any(lease.owner == me and lease._held and not lease.lost for lease in self._terms)

    def leadership(self, *, timeout: float | None = None) -> AbstractAsyncContextManager[Term]:
        """Wait until this candidate leads; use with ``async with``, which gives the :class:`Term`.

        ``timeout`` (seconds; None waits for ever) raises :class:`LockTimeout`
        when it runs out first, and the candidate leaves the line. Inside, the
        body is cancelled and ``LockLost`` raised from the ``async with`` if
        leadership is lost; after ``resign()`` the ``async with`` ends without
        an exception. The same task entering again while it leads re-enters
        the same term.
        """
        return _Leadership(self, check_timeout(timeout))

    async def resign(self) -> None:
        """End this candidate's term and let the next candidate lead.

        Called inside the body of ``async with election.leadership()``, it
        does not return: the body is cancelled there, its ``finally`` blocks
        run while it still leads, and leaving the ``async with`` (which raises
        nothing) hands leadership over. Called from another task, it ends
        every term entered through this handle: the release is sent at once
        and those bodies are cancelled (their ``finally`` blocks then run
        after leadership has passed, as after ``lease.release()`` from
        another task), and their ``async with`` raise nothing either.
        Leadership passes as soon as the server has the release (one
        hand-over: the next candidate is woken by the server, not by a timer).

        Raises :class:`NotHeld` when this handle leads nowhere,
        :class:`LockLost` when the term had been lost already, and
        :class:`BackendUnavailable` when the release could not be confirmed
        (the term is over all the same: its hold is no longer renewed and
        expires by itself).
        """
        core = self._core
        core.check_open()
        me = current_owner()
        held = [lease for lease in self._terms if lease._held]
        targets = [lease for lease in held if lease.owner == me] or held
        if not targets:
            raise NotHeld(self.name, "this candidate does not lead")
        inside = False
        for lease in targets:
            scopes = list(lease._bodies())
            if lease._check_deadline() or lease.lost:
                raise LockLost(self.name, lease.lost_reason or "lost", lease._loss)
            self._resigned.add(lease._hold)
            if lease.owner == me and scopes:
                # This very body: it ends here, and its async with releases the hold once it has unwound.
                inside = True
                for scope in scopes:
                    scope.cancel()
                continue
            try:
                await core.release(lease)
            except NotHeld as exc:
                self._resigned.discard(lease._hold)
                loss = lease._loss or LossReason.TAKEN_OR_EXPIRED
                raise LockLost(self.name, lease.lost_reason or "lost before it was resigned", loss) from exc
            finally:
                for scope in scopes:
                    scope.cancel()  # whatever the release answered, this body no longer leads
        if inside:
            await anyio.lowlevel.checkpoint()  # the body ends here (the cancellation above lands)

    async def leader(self) -> Leader | None:
        """Who leads now: a :class:`Leader` (identity, token, since), or None; one read.

        Raises :class:`BackendUnavailable` when the server did not answer in a
        request window (a third of the ttl, at most a second).
        """
        core = self._core
        await core.start()
        backend = cast(Elects, core.backend)
        try:
            async with asyncio.timeout(request_window(core.backend.lease_time(self.ttl))):
                try:
                    return await backend.leader(self._ref)
                except ConfigurationError:
                    raise
                except (LockError, OSError):
                    return await backend.leader(self._ref)  # read-only: one retry on a fresh connection
        except (LockError, OSError, TimeoutError) as exc:
            raise unavailable(exc, server_of(core.backend)) from exc

    def observe(self) -> AsyncIterator[Leader | None]:
        """Every change of leader, as it happens: ``async for leader in election.observe():``.

        Yields the current leader first (None while nobody leads), then the
        new one after each change: a resign, a loss (a leader whose process
        died is seen gone when the server drops its hold), a first candidate.
        A hand-over to a candidate in line (a resign, a drained close) is one
        change, with no None between the two leaders.
        No polling and no candidacy needed. Where the backend reports every
        change (memory://, etcd's watch while it lasts) every term is seen;
        where it reports only that something changed (ZooKeeper's watches,
        Redis's messages, PostgreSQL's notifications), terms that begin and end
        between two looks are not. The iteration ends when the client is
        closed, and raises :class:`BackendUnavailable` when the server stays
        unreachable for a ttl. Leaving the loop early leaves nothing running.
        """
        return _LeaderChanges(self)

    async def info(self) -> LockInfo:
        """What the server says about the election: the leader's identity as ``owner``, its token, the waiters."""
        candidacy = _Candidacy(self, None)
        info = await candidacy.info()
        leader = await self.leader()
        if leader is None:
            return LockInfo(info.name, info.key, None, 0, None, info.waiters, None)
        holder = leader.identity
        return LockInfo(info.name, info.key, holder, 1, info.ttl, info.waiters, leader.token, (holder,))


class _Candidacy(Lock):
    """The hold behind a candidate: a lock of kind ``election`` that carries the candidate's identity."""

    __slots__ = ("_election",)

    def __init__(self, election: Election, identity: str | None) -> None:
        # One hold per task whatever the identity: a task leads once.
        ref = LockRef("election", election.name, identity=identity)
        super().__init__(election._core, ref, election.ttl, key=election._ref)
        self._election = election

    async def _resigned_exit(self, lease: Lease) -> None:
        """Leaving a body whose term was resigned: give the whole term back now (if resign() has not)."""
        if not lease._held or lease.lost:
            return
        core = self._core
        try:
            await core.release(lease)
        except NotHeld:
            pass  # lost while the body unwound: the term is over either way
        except BackendUnavailable as err:
            # Nobody renews it any more: it expires by itself.
            logger.warning("release of election %r failed, it will expire by itself: %s", self.name, err)
            core.spawn(release_by_identity(core.backend, lease, raise_errors=False, quiet=True))

    def __repr__(self) -> str:
        return f"<Candidacy {self.name!r} identity={self._ref.identity!r}>"

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        owner = current_owner()
        stack = self._scopes[owner]
        lease, scope = stack[-1]
        resigned = self._election._resigned
        if lease._hold not in resigned:
            return await super().__aexit__(exc_type, exc, tb)
        stack.pop()
        if not stack:
            del self._scopes[owner]
        lease._remove_body(scope)
        self._core.body_ended()
        # resign() cancelled this body on purpose: the block ends quietly
        # (an exception of the body's own still propagates).
        swallowed = bool(scope.__exit__(exc_type, exc, tb))
        try:
            await self._resigned_exit(lease)
        finally:
            if not lease._bodies():
                resigned.discard(lease._hold)
        return swallowed


class _Leadership:
    """``async with election.leadership() as term``: waits until this candidate leads."""

    __slots__ = ("_candidacy", "_election", "_timeout")

    def __init__(self, election: Election, timeout: float | None) -> None:
        self._election = election
        self._timeout = timeout
        self._candidacy: list[_Candidacy] = []  # one per entry (the same object may be entered again)

    async def __aenter__(self) -> Term:
        election = self._election
        candidacy = _Candidacy(election, election._identity or default_identity())
        lease = await candidacy.acquire(timeout=self._timeout)
        candidacy._enter_body(lease)
        self._candidacy.append(candidacy)
        term = election._terms.get(lease)
        if term is None:
            identity = candidacy._ref.identity
            assert identity is not None
            term = election._terms[lease] = Term(election.name, identity, lease)
        return term

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        candidacy = self._candidacy.pop()
        owner = current_owner()
        lease = candidacy._scopes[owner][-1][0]
        try:
            return await candidacy.__aexit__(exc_type, exc, tb)
        finally:
            if not lease._bodies() and not (lease._held and not lease.lost):
                self._election._terms.pop(lease, None)


class _LeaderChanges:
    """The iterator ``election.observe()`` returns; each step is one wait in the caller's task."""

    __slots__ = ("_backoff", "_election", "_ended", "_last", "_watch")

    def __init__(self, election: Election) -> None:
        self._election = election
        self._watch: LeaderWatch | None = None
        self._last: object = _NOTHING
        self._ended = False
        self._backoff = Backoff()

    def __aiter__(self) -> _LeaderChanges:
        return self

    async def __anext__(self) -> Leader | None:
        election = self._election
        core = election._core
        if self._ended or core.closed:
            self._end()
            raise StopAsyncIteration
        await core.start()
        if self._watch is None:
            self._watch = cast(Elects, core.backend).observe(election._ref)
        watch = self._watch
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        patience = core.backend.lease_time(election.ttl)
        while True:
            wait = core.waiting()
            try:
                with wait:
                    leader = await watch.next()
            except asyncio.CancelledError:
                if wait.closed and wait.task.uncancel() == 0:
                    self._end()  # the client was closed: the iteration is over
                    raise StopAsyncIteration from None
                raise
            except ConfigurationError:
                self._end()
                raise
            except (LockError, OSError) as exc:
                now = loop.time()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= patience:
                    self._end()
                    raise unavailable(exc, server_of(core.backend)) from exc
                await asyncio.sleep(self._backoff.next())
                continue
            failing_since = None
            self._backoff.reset()
            if leader != self._last:
                self._last = leader
                return leader

    async def aclose(self) -> None:
        """Stop observing (also what leaving ``async for`` early amounts to: nothing is left running)."""
        self._end()

    def _end(self) -> None:
        self._ended = True
        if self._watch is not None:
            self._watch.close()
            self._watch = None


_NOTHING = object()
